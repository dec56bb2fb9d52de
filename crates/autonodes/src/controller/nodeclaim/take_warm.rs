//! Warm: a claim whose type keeps warm VMs, and whose properties a warm VM can serve
//! (core `warm::servable`), takes a ready one instead of making a VM ([`serve`]): the VM
//! becomes the claim's (its labels, a merge patch conditional on the version the claim
//! saw, so no two claims take one VM), and the claim writes its binding, which the VM's
//! agent reads to join. Once the Node joined, [`release`] deletes the binding and the VM's
//! own credential.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;

use super::join::{claim_join, render_reason};
use super::provisioning::{Provisioning, Step};
use super::status::{JOINED, PROVISIONED};
use crate::controller::context::now;
use crate::controller::error::Error;
use crate::remote::api::{HostApi, TenantApi};
use autonodes_api::kubevirt::ObservedVm;
use autonodes_api::{
    NodeType, WarmBinding, LABEL_NODECLAIM_UID, LABEL_WARM_NODEPOOL, LABEL_WARM_NODETYPE,
};
use autonodes_core::warm;

/// What [`serve`] did.
pub(super) enum Served {
    /// No warm VM serves the claim: make a VM as usual.
    Cold,
    /// The claim's VM is this warm VM (taken now or before).
    Warm(Arc<ObservedVm>),
    /// The claim took a warm VM, but its binding cannot be written yet.
    Stop(Step),
}

/// Serves the claim from a warm VM of its type, if one is ready (or the claim took one
/// before and its status did not say so yet).
pub(super) async fn serve<H: HostApi, T: TenantApi>(
    p: &mut Provisioning<'_, H, T>,
) -> Result<Served, Error> {
    let Some(host) = p.host.warm() else {
        return Ok(Served::Cold);
    };
    let uid = p.claim.uid().unwrap_or_default();
    let claim_ns = p.claim.namespace().unwrap_or_default();
    let installation = p.ctx.config.installation.clone();
    let labels = warm::taken_labels(&p.claim.name_any(), &claim_ns, &uid, &installation);
    let ns = p.vm_ns.clone();
    let type_name = p.node_type.name.clone();
    // A warm VM this claim took before (its status not written since) stays its VM, even if
    // the type keeps no warm VMs any more.
    let mut vm = host.taken_by(&ns, &uid).await?;
    if vm.is_none() {
        let type_label = autonodes_core::names::label_value(&type_name);
        'groups: for (key, pool_uid) in groups(p) {
            for candidate in p.ctx.warm.ready(&key, now()) {
                let Some(seen) = host.cached_vm(&ns, &candidate) else {
                    continue;
                };
                // Still warm, of this type and group, taken by no claim.
                let takeable = |vm: &ObservedVm| {
                    let l = vm.labels();
                    !l.contains_key(LABEL_NODECLAIM_UID)
                        && l.get(LABEL_WARM_NODETYPE) == Some(&type_label)
                        && l.get(LABEL_WARM_NODEPOOL) == pool_uid.as_ref()
                        && vm.metadata.deletion_timestamp.is_none()
                };
                if !takeable(&seen) {
                    continue;
                }
                if let Some(taken) = host.take(&ns, &seen, &labels, takeable).await? {
                    p.ctx.warm.taken(&key, &type_name, &candidate);
                    p.ctx
                        .metrics
                        .warm_bindings
                        .with_label_values(&[&type_name])
                        .inc();
                    // The type makes a new warm VM; for a pool's, once the pool has seen
                    // its claim take it (the namespace's room may leave none to refill).
                    if pool_uid.is_none() {
                        let _ = p
                            .ctx
                            .wakes
                            .types
                            .unbounded_send(ObjectRef::<NodeType>::new(&type_name));
                    }
                    tracing::info!(nodeclaim = %p.claim.name_any(), namespace = %claim_ns, vm = %format!("{ns}/{candidate}"), "took a warm VirtualMachine");
                    p.ctx
                        .events
                        .record(
                            p.claim,
                            EventType::Normal,
                            "WarmVirtualMachineTaken",
                            "Launch",
                            format!("serving the claim with warm VirtualMachine {ns}/{candidate}"),
                        )
                        .await;
                    vm = Some(Arc::new(taken));
                    break 'groups;
                }
            }
        }
    }
    let Some(vm) = vm else {
        return Ok(Served::Cold);
    };
    // From here on the VM is the claim's.
    let name = vm.name_any();
    p.vm_name = name.clone();
    p.status.new.vm_name = Some(name);
    if p.status.new.warm.is_none() {
        p.status.new.warm = Some(WarmBinding {
            bound_at: Time(now()),
            written: false,
            released: false,
        });
    }
    Ok(match bind(p).await? {
        Some(step) => Served::Stop(step),
        None => Served::Warm(vm),
    })
}

/// The groups of warm VMs that may serve the claim, each as its index key and the pool UID
/// its VMs are labelled with: first its pool's own (the pool keeps warm VMs of the claim's
/// type, in the claim's namespace, booted with what the claim asks for), then its type's
/// (the type keeps some, and they are booted with what the claim asks for).
fn groups<H: HostApi, T: TenantApi>(p: &Provisioning<'_, H, T>) -> Vec<(String, Option<String>)> {
    let type_name = &p.node_type.name;
    let mut out = Vec::new();
    let pool_uid = p
        .claim
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "NodePool" && o.controller == Some(true))
        .map(|o| o.uid.clone());
    if let Some(uid) = pool_uid {
        let want = p.ctx.warm.pool_want(&uid).filter(|w| {
            Some(w.namespace.as_str()) == p.claim.metadata.namespace.as_deref()
                && w.node_type.as_deref() == Some(type_name.as_str())
        });
        if let Some(want) = want {
            let pt = warm::pool::pool_type(p.node_type, &want.spec);
            match warm::servable(&pt, None, p.claim) {
                Ok(()) => {
                    let label = autonodes_core::names::label_value(&uid);
                    out.push((warm::pool::group_key(type_name, &label), Some(label)));
                }
                Err(why) => {
                    tracing::debug!(nodeclaim = %p.claim.name_any(), %why, "not served by its pool's warm VMs")
                }
            }
        }
    }
    if p.node_type.warm_replicas > 0 {
        match warm::servable(p.node_type, None, p.claim) {
            Ok(()) => out.push((type_name.clone(), None)),
            Err(why) => {
                tracing::debug!(nodeclaim = %p.claim.name_any(), %why, "not served by its type's warm VMs")
            }
        }
    }
    out
}

/// Until it is done: labels the taken warm VM's user data and DataVolumes as the claim's,
/// and writes its binding. `Some(step)` when the join cannot be given yet.
pub(super) async fn bind<H: HostApi, T: TenantApi>(
    p: &mut Provisioning<'_, H, T>,
) -> Result<Option<Step>, Error> {
    if p.status.new.warm.as_ref().is_none_or(|w| w.written) {
        return Ok(None);
    }
    let uid = p.claim.uid().unwrap_or_default();
    let claim_ns = p.claim.namespace().unwrap_or_default();
    let installation = p.ctx.config.installation.clone();
    let labels = warm::taken_labels(&p.claim.name_any(), &claim_ns, &uid, &installation);
    let (ns, name) = (p.vm_ns.clone(), p.vm_name.clone());
    match p.host.warm() {
        Some(host) => host.relabel_parts(&ns, &name, &labels).await?,
        None => return Ok(None),
    }
    let join = match claim_join(p).await? {
        Ok((j, _)) => j,
        Err(step) => return Ok(Some(step)),
    };
    let mut t = p.node_type.clone();
    t.vm_namespace = ns.clone();
    let binding = match warm::binding(&t, None, p.claim, &name, &join, &installation) {
        Ok(b) => b,
        Err(e) => {
            p.status
                .set(PROVISIONED, false, render_reason(&e), e.to_string());
            return Ok(Some(Step::Stop(Action::requeue(Duration::from_secs(60)))));
        }
    };
    let binding_labels = warm::credential_labels(&p.node_type.name, &name, &installation);
    if let Some(host) = p.host.warm() {
        host.write_binding(&ns, &name, &binding, &binding_labels)
            .await?;
    }
    if let Some(w) = p.status.new.warm.as_mut() {
        w.written = true;
    }
    Ok(None)
}

/// Once the claim's Node joined: deletes the binding (it holds the bootstrap token) and the
/// warm VM's own credential, so the VM can read nothing on the host any more.
pub(super) async fn release<H: HostApi, T: TenantApi>(
    p: &mut Provisioning<'_, H, T>,
) -> Result<(), Error> {
    let pending = p.status.new.warm.as_ref().is_some_and(|w| !w.released);
    if !pending || !p.status.is_true(JOINED) {
        return Ok(());
    }
    let Some(host) = p.host.warm() else {
        return Ok(());
    };
    host.delete_credential(&p.vm_ns, &p.vm_name).await?;
    if let Some(w) = p.status.new.warm.as_mut() {
        w.released = true;
    }
    tracing::info!(nodeclaim = %p.claim.name_any(), vm = %format!("{}/{}", p.vm_ns, p.vm_name), "warm VM joined: its binding and credential are deleted");
    Ok(())
}

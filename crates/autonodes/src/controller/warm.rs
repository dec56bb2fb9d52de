//! Warm VMs of a node type: the NodeType controller calls [`reconcile`] for each usable
//! type; it keeps `spec.warm.replicas` warm VMs on the type's host (core [`warm::plan`]),
//! makes each one's own credential, user data and VM, removes the ones that are not wanted,
//! drifted, silent or about to expire (credential first, then the VM), removes credentials
//! whose VM is gone, and says what it found for the type's status. Claims take warm VMs
//! from the [`WarmIndex`] it fills (`nodeclaim::warm`).

use std::time::Duration;

use kube::api::DynamicObject;
use kube::ResourceExt;

use crate::controller::context::{now, Context};
use crate::controller::error::Error;
use crate::remote::clients::Remote;
use crate::remote::warm::WarmHost;
use autonodes_api::reasons::TypeReason;
use autonodes_api::{
    NodeProvider, NodeType, NodeTypeWarm, LABEL_INSTALLATION, LABEL_NODECLAIM_UID,
    LABEL_WARM_DEFINITION, LABEL_WARM_NODETYPE,
};
use autonodes_core::catalogue::PreparedType;
use autonodes_core::userdata::warm::{render_warm_user_data, WarmUserDataInput};
use autonodes_core::warm::{self, WarmVm};

/// Condition of a NodeType that keeps warm VMs: True when all are ready.
pub const WARM_READY: &str = "WarmReady";

/// What was made for a warm VM that does not exist is removed once it is older than this
/// (a warm VM's credential and user data are made before the VM, within a reconcile).
const ORPHAN_CREDENTIAL_AGE: Duration = Duration::from_secs(30);

/// What [`reconcile`] found for the type's status.
pub struct WarmOutcome {
    /// `status.warm` (absent for a type that keeps none and has none).
    pub status: Option<NodeTypeWarm>,
    /// The `WarmReady` condition: status, reason, message.
    pub condition: Option<(bool, TypeReason, String)>,
    /// When to look again.
    pub requeue: Option<Duration>,
    /// The host's caches are not live yet: nothing is known (the status stays as it was).
    pub unknown: bool,
}

impl WarmOutcome {
    fn none() -> Self {
        WarmOutcome {
            status: None,
            condition: None,
            requeue: None,
            unknown: false,
        }
    }
}

/// The warm VMs of type `t` (its VMs labelled with the type, not taken by a claim) as the
/// host's caches show them, with their heartbeats.
fn observed(remote: &Remote, t: &PreparedType, installation: &str) -> Option<Vec<WarmVm>> {
    let cache = remote.host_cache()?;
    let type_label = autonodes_core::names::label_value(&t.name);
    let installation = autonodes_core::names::label_value(installation);
    let vms = cache.vms.filter(|vm| {
        let l = vm.labels();
        vm.metadata.namespace.as_deref() == Some(t.vm_namespace.as_str())
            && l.get(LABEL_WARM_NODETYPE) == Some(&type_label)
            && l.get(LABEL_INSTALLATION) == Some(&installation)
            && !l.contains_key(LABEL_NODECLAIM_UID)
    })?;
    Some(
        vms.iter()
            .map(|vm| {
                let name = vm.name_any();
                let vmi = cache.vmis.get(Some(&t.vm_namespace), &name).flatten();
                let running_since = vmi
                    .as_ref()
                    .filter(|i| i.phase() == Some("Running"))
                    .and_then(|i| i.metadata.creation_timestamp.as_ref().map(|t| t.0));
                WarmVm {
                    created: vm
                        .metadata
                        .creation_timestamp
                        .as_ref()
                        .map_or_else(now, |t| t.0),
                    definition: vm.labels().get(LABEL_WARM_DEFINITION).cloned(),
                    running_since,
                    heartbeat: None,
                    deleting: vm.metadata.deletion_timestamp.is_some(),
                    name,
                }
            })
            .collect(),
    )
}

/// Keeps the warm VMs of type `t` (provider `provider`, `claimed` claims). A type that
/// keeps none and never had any (`had_warm`: its status shows warm VMs) costs nothing: no
/// host is looked at.
pub async fn reconcile(
    ctx: &Context,
    t: &PreparedType,
    provider: Option<&NodeProvider>,
    claimed: i64,
    had_warm: bool,
) -> WarmOutcome {
    if t.warm_replicas == 0 && !had_warm {
        return WarmOutcome::none();
    }
    let installation = ctx.config.installation.as_str();
    let remote = match ctx.clients.host(&t.host_cluster).await {
        Ok(r) => r,
        Err(e) if t.warm_replicas > 0 => {
            return WarmOutcome {
                status: None,
                condition: Some((false, TypeReason::WarmUnavailable, e.to_string())),
                requeue: Some(Duration::from_secs(15)),
                unknown: false,
            }
        }
        Err(_) => return WarmOutcome::none(),
    };
    let Some(mut vms) = observed(&remote, t, installation) else {
        // The host's caches are not live yet: look again soon.
        return WarmOutcome {
            status: None,
            condition: None,
            requeue: (t.warm_replicas > 0).then_some(Duration::from_secs(5)),
            unknown: true,
        };
    };
    let problem = warm::type_problem(t);
    if t.warm_replicas == 0 && vms.is_empty() {
        ctx.warm.set(&t.name, Vec::new());
        return WarmOutcome::none();
    }
    let host = WarmHost::new(ctx, &remote);
    let ns = t.vm_namespace.as_str();
    let type_label = autonodes_core::names::label_value(&t.name);
    match reconcile_on(
        ctx,
        t,
        provider,
        claimed,
        &host,
        &remote,
        &mut vms,
        problem.as_deref(),
    )
    .await
    {
        Ok(outcome) => outcome,
        Err(e) => {
            tracing::warn!(nodetype = %t.name, namespace = %ns, label = %type_label, error = %e, "keeping warm VMs failed");
            WarmOutcome {
                status: None,
                condition: Some((false, TypeReason::WarmUnavailable, e.to_string())),
                requeue: Some(Duration::from_secs(10)),
                unknown: false,
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn reconcile_on(
    ctx: &Context,
    t: &PreparedType,
    provider: Option<&NodeProvider>,
    claimed: i64,
    host: &WarmHost<'_>,
    remote: &Remote,
    vms: &mut [WarmVm],
    problem: Option<&str>,
) -> Result<WarmOutcome, Error> {
    let ns = t.vm_namespace.as_str();
    let type_label = autonodes_core::names::label_value(&t.name);
    let heartbeats = host.heartbeats(ns, &type_label).await?;
    for vm in vms.iter_mut() {
        vm.heartbeat = heartbeats.get(&vm.name).copied().flatten();
    }
    let at = now();
    let replicas = if problem.is_some() {
        0
    } else {
        t.warm_replicas
    };
    let room = t.max_capacity.map(|m| m - claimed);
    let plan = warm::plan(replicas, room, &t.definition, vms, at);
    for (name, why) in &plan.remove {
        remove(host, ns, name).await?;
        tracing::info!(nodetype = %t.name, vm = %format!("{ns}/{name}"), why = why.as_str(), "removing a warm VM");
    }
    // Credentials whose VM is gone (a removal or creation cut short).
    let live: std::collections::BTreeSet<&str> = vms.iter().map(|v| v.name.as_str()).collect();
    let taken = |vm: &str| {
        remote
            .host_cache()
            .and_then(|c| c.vms.get(Some(ns), vm))
            .flatten()
            .is_some()
    };
    for (vm, made) in host.made_for(ns, &type_label).await? {
        let old = made.is_some_and(|m| {
            Duration::try_from(at.duration_since(m)).unwrap_or_default() > ORPHAN_CREDENTIAL_AGE
        });
        if old && !live.contains(vm.as_str()) && !taken(&vm) {
            host.delete_credential(ns, &vm).await?;
            host.host().delete_user_data(ns, &vm).await?;
            host.delete_data_volumes(ns, &vm).await?;
            tracing::info!(nodetype = %t.name, vm = %format!("{ns}/{vm}"), "removed what was left of a warm VM that is gone");
        }
    }
    let mut made = 0;
    for _ in 0..plan.create {
        create(ctx, t, provider, host, remote).await?;
        made += 1;
    }
    let removed: Vec<&str> = plan.remove.iter().map(|(n, _)| n.as_str()).collect();
    let kept: Vec<WarmVm> = vms
        .iter()
        .filter(|v| !v.deleting && !removed.contains(&v.name.as_str()))
        .cloned()
        .collect();
    ctx.warm.set(&t.name, kept.clone());
    let current = kept.len() as i64;
    let status = NodeTypeWarm {
        replicas: plan.wanted,
        current,
        ready: plan.ready,
        cost: current * t.cost,
        bound: ctx.warm.bound(&t.name),
    };
    let m = &ctx.metrics;
    for (state, value) in [("ready", plan.ready), ("starting", current - plan.ready)] {
        m.warm_vms
            .with_label_values(&[&t.name, &t.provider, state])
            .set(value);
    }
    let server = guest_server(provider, remote);
    let condition = match (problem, plan.not_reporting) {
        (Some(p), _) => (false, TypeReason::WarmUnavailable, p.to_string()),
        (None, n) if n > 0 => (
            false,
            TypeReason::WarmNotReporting,
            format!(
                "{n} warm VM(s) ran for {}s without reporting to the host API server at {server}; they are replaced, and claims are served cold meanwhile. The VMs must reach that address (NodeProvider spec.kubeVirt.guestApiServer)",
                warm::REPORT_WITHIN.as_secs()
            ),
        ),
        (None, _) if plan.ready >= plan.wanted => (
            true,
            TypeReason::WarmReady,
            format!("{} warm VM(s) ready", plan.ready),
        ),
        (None, _) => (
            false,
            TypeReason::WarmStarting,
            format!(
                "{} of {} warm VM(s) ready; the others are booting (their agents report to {server})",
                plan.ready, plan.wanted
            ),
        ),
    };
    let settled = condition.0 && made == 0 && plan.remove.is_empty();
    Ok(WarmOutcome {
        status: (replicas > 0 || current > 0).then_some(status),
        condition: Some(condition),
        requeue: Some(if settled {
            Duration::from_secs(10)
        } else {
            Duration::from_secs(2)
        }),
        unknown: false,
    })
}

/// The host API server as the provider's VMs reach it.
fn guest_server(provider: Option<&NodeProvider>, remote: &Remote) -> String {
    provider
        .and_then(|p| p.spec.kube_virt.guest_api_server.clone())
        .unwrap_or_else(|| remote.server.clone())
}

/// Removes a warm VM: its credential first (its agent can read nothing more), then the VM,
/// its user-data Secret and its DataVolumes.
async fn remove(host: &WarmHost<'_>, ns: &str, vm: &str) -> Result<(), Error> {
    host.delete_credential(ns, vm).await?;
    let remote_host = host.host();
    remote_host.delete_vm(ns, vm, None).await?;
    remote_host.delete_user_data(ns, vm).await?;
    host.delete_data_volumes(ns, vm).await?;
    Ok(())
}

/// Makes one warm VM of `t`: its credential, its user data (with the credential's token),
/// the golden volumes it clones, and the VM.
async fn create(
    ctx: &Context,
    t: &PreparedType,
    provider: Option<&NodeProvider>,
    host: &WarmHost<'_>,
    remote: &Remote,
) -> Result<(), Error> {
    let ns = t.vm_namespace.as_str();
    let installation = ctx.config.installation.as_str();
    let suffix: String = crate::random::bytes::<5>()
        .map_err(|e| Error::Internal(format!("no random bytes: {e}")))?
        .iter()
        .map(|b| char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[usize::from(*b) % 36]))
        .collect();
    let name = warm::vm_name(&t.short_name, &suffix);
    let labels = warm::credential_labels(&t.name, &name, installation);
    let token = host.make_credential(ns, &name, &labels).await?;
    let server = guest_server(provider, remote);
    let ca = remote
        .ca_pem
        .as_deref()
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .ok_or_else(|| {
            Error::Internal(format!(
                "the kubeconfig of host cluster {} has no certificate-authority-data: warm VMs could not verify it",
                t.host_cluster
            ))
        })?;
    let properties = &t.properties;
    let ssh_keys = autonodes_core::node_config::ssh_keys(properties);
    let user_data = render_warm_user_data(&WarmUserDataInput {
        vm_name: &name,
        server: &server,
        host_ca_pem: &ca,
        token: &token,
        namespace: ns,
        binding: &warm::binding_name(&name),
        lease: &warm::credential_name(&name),
        user_cloud_config: autonodes_core::node_config::user_cloud_config(properties),
        ssh_keys: &ssh_keys,
    })
    .map_err(|e| Error::Internal(format!("warm VM user data for {}: {e}", t.name)))?;
    let objects = warm::render_vm(t, &name, user_data, installation)
        .map_err(|e| Error::Internal(format!("warm VM of {}: {e}", t.name)))?;
    host.create_user_data(ns, &objects.secret).await?;
    let remote_host = host.host();
    for golden in &t.golden {
        remote_host
            .ensure_golden_volume(golden, &t.provider)
            .await?;
    }
    let vm: DynamicObject = serde_json::from_value(objects.vm)
        .map_err(|e| Error::Internal(format!("rendered warm VM is not an object: {e}")))?;
    host.create_vm(ns, &vm).await?;
    tracing::info!(nodetype = %t.name, vm = %format!("{ns}/{name}"), "created a warm VM");
    Ok(())
}

/// Removes the warm VMs (and their credentials) of types that are gone: the host's VMs
/// labelled with a warm type no NodeType has. Called by the orphan sweep.
pub async fn sweep_gone_types(ctx: &Context, types: &[std::sync::Arc<NodeType>]) -> usize {
    let known: std::collections::BTreeSet<String> = types
        .iter()
        .map(|t| autonodes_core::names::label_value(&t.name_any()))
        .collect();
    let installation = autonodes_core::names::label_value(&ctx.config.installation);
    let mut removed = 0;
    let hosts = ctx.clients.cached().await;
    for remote in hosts
        .iter()
        .filter(|r| matches!(r.key, crate::remote::clients::ClusterKey::Host(_)))
    {
        let Some(cache) = remote.host_cache() else {
            continue;
        };
        let Some(orphans) = cache.vms.filter(|vm| {
            let l = vm.labels();
            l.get(LABEL_INSTALLATION) == Some(&installation)
                && !l.contains_key(LABEL_NODECLAIM_UID)
                && l.get(LABEL_WARM_NODETYPE)
                    .is_some_and(|t| !known.contains(t))
                && vm.metadata.deletion_timestamp.is_none()
        }) else {
            continue;
        };
        let host = WarmHost::new(ctx, remote);
        for vm in orphans {
            let ns = vm.namespace().unwrap_or_default();
            let name = vm.name_any();
            match remove(&host, &ns, &name).await {
                Ok(()) => {
                    removed += 1;
                    tracing::info!(vm = %format!("{ns}/{name}"), "removed a warm VM whose node type is gone");
                }
                Err(e) => {
                    tracing::warn!(vm = %format!("{ns}/{name}"), error = %e, "removing a warm VM whose node type is gone failed")
                }
            }
        }
    }
    removed
}

//! Terminate: cordon and drain the Node, delete the VM and wait until it is gone, then the
//! Node, the user-data Secret, the DataVolumes and the tokens; the finalizer is released
//! only once all of it is gone. Also removes what a Failed claim left.

use std::collections::HashSet;

use autonodes_core::pool::do_not_disrupt::pod_holds_node;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;

use super::context::ClaimContext;
use super::provisioning::{elapsed_since, uid};
use super::status::StatusWriter;
use super::status::READY;
use super::tokens::delete_tokens;
use crate::controller::context::now;
use crate::controller::error::Error;
use crate::remote::api::{HostApi, TenantApi};
use crate::remote::clients::ClientError;
use autonodes_api::reasons::ClaimReason;
use autonodes_api::{NodeClaim, NodeClaimPhase};

/// Progress of removing a claim's remote objects.
pub(super) enum Removal {
    /// Everything is gone.
    Done,
    /// Still waiting (the reason says for what).
    Waiting(String),
    /// The VM is kept halted for debugging (`autonodes.io/keep-failed-until`) for this
    /// long; the message says until when.
    Kept(String, std::time::Duration),
}

/// Removes everything the claim has in other clusters, in this order: drain the Node
/// (with `drain`, and only while its VM runs and is not being deleted: once the VM goes, the
/// pods have gone with it and each wake-up while it is deleted would list them again), delete
/// the VM and wait until it is gone, then delete the Node (deleting it earlier would let a
/// still-running kubelet register it again), the user-data Secret, the DataVolumes and the
/// bootstrap tokens.
///
/// The tenant cannot hold this up: once the claim has been going for `--drain-timeout`
/// (deleted, or Failed), a tenant whose kubeconfig is refused or whose API server errors is
/// skipped with a Warning Event (`TenantCleanupSkipped`): the VM is deleted without a
/// drain, and the Node and token left in the tenant are the tenant's (the token expires).
pub(super) async fn remove_remote_objects(
    claim: &NodeClaim,
    ctx: &ClaimContext,
    drain: bool,
) -> Result<Removal, Error> {
    let status = claim.status.clone().unwrap_or_default();
    let Some(vm_name) = status.vm_name.clone() else {
        return Ok(Removal::Done);
    };
    let uid = uid(claim)?;
    let ns = claim.namespace().unwrap_or_default();
    let node_name = status.node_name.clone().unwrap_or_else(|| vm_name.clone());
    let tenant_grace_over =
        going_since(claim).is_some_and(|since| elapsed_since(since) > ctx.config.drain_timeout);

    // The tenant. A vCluster whose kubeconfig Secret is gone has been deleted with its
    // nodes: nothing is left there to clean.
    let tenant_remote = match ctx
        .clients
        .tenant(&ns, &claim.spec.v_cluster_ref.name)
        .await
    {
        Ok(t) => Some(t),
        Err(ClientError::SecretNotFound { .. }) => {
            tracing::info!(nodeclaim = %claim.name_any(), "tenant kubeconfig Secret is gone; skipping tenant cleanup");
            None
        }
        Err(e) if tenant_grace_over => {
            skip_tenant(claim, ctx, &e.into()).await;
            None
        }
        Err(e) => return Err(e.into()),
    };
    let tenant = tenant_remote.as_deref().map(|r| ctx.tenant(r));
    let host_cluster = status.host_cluster.clone().unwrap_or_default();
    let host_remote = ctx.clients.host(&host_cluster).await?;
    let host = ctx.host(&host_remote);
    let vm_ns = status.vm_namespace.clone().unwrap_or_default();
    let names = RemoteNames {
        uid,
        vm_ns,
        vm_name,
        node_name,
    };
    remove_from(
        claim,
        ctx,
        drain,
        tenant_grace_over,
        &names,
        &host,
        tenant.as_ref(),
    )
    .await
}

/// The names of a claim's remote objects.
pub(super) struct RemoteNames {
    /// The claim's UID (its objects' label).
    pub uid: String,
    /// The VM's namespace on the host.
    pub vm_ns: String,
    /// The VM's name.
    pub vm_name: String,
    /// The Node's name in the tenant.
    pub node_name: String,
}

/// [`remove_remote_objects`] on the host and (unless skipped) the tenant.
pub(super) async fn remove_from(
    claim: &NodeClaim,
    ctx: &ClaimContext,
    drain: bool,
    tenant_grace_over: bool,
    names: &RemoteNames,
    host: &impl HostApi,
    tenant: Option<&impl TenantApi>,
) -> Result<Removal, Error> {
    let RemoteNames {
        uid,
        vm_ns,
        vm_name,
        node_name,
    } = names;
    let provider_id = format!("kubevirt://{vm_name}");
    let our_node = |n: &Node| {
        n.spec.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(provider_id.as_str())
    };

    // The host: drain, delete the VM and wait until it is gone, then its Secret and
    // DataVolumes.
    // A VM of that name labelled with another claim's UID is not this claim's: left alone.
    let vm = host
        .vm(vm_ns, vm_name)
        .await?
        .filter(|vm| autonodes_core::template::names::labelled_for_claim(vm.labels(), uid));
    if let Some(vm) = vm {
        if vm.metadata.deletion_timestamp.is_none() {
            if let (Some(tenant), true) = (tenant, drain) {
                let drained = async {
                    match tenant.node(node_name).await? {
                        Some(node) if our_node(&node) => {
                            let since = claim.metadata.deletion_timestamp.as_ref();
                            let since = since.map_or_else(now, |t| t.0);
                            drain_node(claim, ctx, tenant, &node, since).await
                        }
                        _ => Ok(None),
                    }
                }
                .await;
                match drained {
                    Ok(Some(waiting)) => return Ok(Removal::Waiting(waiting)),
                    Ok(None) => {}
                    Err(e) if tenant_grace_over && e.is_tenant_error() => {
                        skip_tenant(claim, ctx, &e).await
                    }
                    Err(e) => return Err(e),
                }
            }
            if let Some(until) = kept_until(claim) {
                return keep(claim, ctx, names, &vm, host, tenant, until).await;
            }
            host.delete_vm(vm_ns, vm_name, vm.metadata.uid.clone())
                .await?;
            ctx.event(
                claim,
                EventType::Normal,
                "VirtualMachineDeleting",
                "Delete",
                format!("deleting VirtualMachine {vm_ns}/{vm_name}"),
            )
            .await;
        }
        return Ok(Removal::Waiting(format!(
            "VirtualMachine {vm_ns}/{vm_name} is being deleted"
        )));
    }
    host.delete_user_data(vm_ns, vm_name, Some(uid)).await?;
    host.delete_data_volumes(vm_ns, uid).await?;
    // A warm VM's binding and credential, unless they went when its Node joined.
    let warm = claim.status.as_ref().and_then(|s| s.warm.as_ref());
    if warm.is_some_and(|w| !w.released) {
        host.release_warm(vm_ns, vm_name).await?;
    }

    // The tenant again: the Node (its VM is gone, nothing re-registers it) and the tokens.
    if let Some(tenant) = tenant {
        let cleaned = async {
            delete_node(claim, ctx, tenant, names, "").await?;
            delete_tokens(tenant, uid).await.map(|_| ())
        }
        .await;
        match cleaned {
            Ok(()) => {}
            Err(e) if tenant_grace_over && e.is_tenant_error() => skip_tenant(claim, ctx, &e).await,
            Err(e) => return Err(e),
        }
    }
    Ok(Removal::Done)
}

/// Until when a deleted claim's VM is kept halted, if that is still ahead.
fn kept_until(claim: &NodeClaim) -> Option<k8s_openapi::jiff::Timestamp> {
    claim.metadata.deletion_timestamp.as_ref()?;
    let now = now();
    autonodes_core::pool::repair::keep_until(claim, now).filter(|t| *t > now)
}

/// Keeps the claim's drained VM for debugging until `until`: halts it (it keeps its disks
/// and labels), and once it is stopped removes its Node from the tenant (no kubelet runs to
/// register it again).
async fn keep(
    claim: &NodeClaim,
    ctx: &ClaimContext,
    names: &RemoteNames,
    vm: &autonodes_api::kubevirt::ObservedVm,
    host: &impl HostApi,
    tenant: Option<&impl TenantApi>,
    until: k8s_openapi::jiff::Timestamp,
) -> Result<Removal, Error> {
    let RemoteNames { vm_ns, vm_name, .. } = names;
    if vm.status.printable_status.as_deref() != Some("Stopped") {
        host.halt_vm(vm_ns, vm_name).await?;
        if vm.status.printable_status.as_deref() != Some("Stopping") {
            ctx.event(
                claim,
                EventType::Normal,
                "VirtualMachineKept",
                "Delete",
                format!("halting VirtualMachine {vm_ns}/{vm_name} and keeping it for debugging until {until}"),
            )
            .await;
        }
        return Ok(Removal::Waiting(format!(
            "halting VirtualMachine {vm_ns}/{vm_name} to keep it for debugging until {until}"
        )));
    }
    if let Some(tenant) = tenant {
        delete_node(claim, ctx, tenant, names, ": its VM is halted").await?;
    }
    let left = until.as_millisecond() - now().as_millisecond();
    Ok(Removal::Kept(
        format!("VirtualMachine {vm_ns}/{vm_name} is halted and kept for debugging until {until}"),
        std::time::Duration::from_millis(u64::try_from(left).unwrap_or(0)),
    ))
}

/// Deletes the claim's Node from the tenant if it is there and has the claim's VM's provider
/// ID (a Node of that name from another machine is left alone), with a `NodeDeleted` Event
/// whose message ends with `why`.
async fn delete_node(
    claim: &NodeClaim,
    ctx: &ClaimContext,
    tenant: &impl TenantApi,
    names: &RemoteNames,
    why: &str,
) -> Result<(), Error> {
    let node_name = &names.node_name;
    let provider_id = format!("kubevirt://{}", names.vm_name);
    let Some(node) = tenant.node(node_name).await? else {
        return Ok(());
    };
    let ours =
        node.spec.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(provider_id.as_str());
    if ours && tenant.delete_node(node_name).await? {
        ctx.event(
            claim,
            EventType::Normal,
            "NodeDeleted",
            "Delete",
            format!("deleted Node {node_name} from the tenant{why}"),
        )
        .await
    }
    Ok(())
}

/// Since when the claim has been going: its deletion, else (a Failed claim) when its
/// `Ready` condition last changed.
fn going_since(claim: &NodeClaim) -> Option<k8s_openapi::jiff::Timestamp> {
    if let Some(t) = &claim.metadata.deletion_timestamp {
        return Some(t.0);
    }
    let status = claim.status.as_ref()?;
    (status.phase == Some(NodeClaimPhase::Failed))
        .then(|| autonodes_api::conditions::get(&status.conditions, READY))
        .flatten()
        .map(|c| c.last_transition_time.0)
}

/// Records that the tenant's part of the cleanup is skipped: the tenant kept failing
/// (`e`, shown by its coarse reason only) for longer than `--drain-timeout`.
async fn skip_tenant(claim: &NodeClaim, ctx: &ClaimContext, e: &Error) {
    let reason = e.cluster_reason().map_or("an error", ClaimReason::as_str);
    tracing::warn!(nodeclaim = %claim.name_any(), namespace = %claim.namespace().unwrap_or_default(), %reason, error = %e, "the tenant blocks the cleanup; going on without it");
    ctx.event(
        claim,
        EventType::Warning,
        "TenantCleanupSkipped",
        "Delete",
        format!(
            "the tenant cluster kept failing ({reason}) for more than {}s: the VM is removed without a drain; its Node and bootstrap token are left in the tenant (the token expires)",
            ctx.config.drain_timeout.as_secs()
        ),
    )
    .await;
}

/// Cordons the Node and evicts its pods (DaemonSet and mirror pods stay, and pods marked
/// do-not-disrupt until the drain times out), the drain counted from `since` (the claim's
/// deletion, or its power-off). Returns what it waits for, or None when the Node is
/// drained (or the drain timed out).
pub(super) async fn drain_node(
    claim: &NodeClaim,
    ctx: &ClaimContext,
    tenant: &impl TenantApi,
    node: &Node,
    since: k8s_openapi::jiff::Timestamp,
) -> Result<Option<String>, Error> {
    let name = node.name_any();
    if !node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
    {
        tenant.cordon(&name).await?;
        ctx.event(
            claim,
            EventType::Normal,
            "NodeCordoned",
            "Delete",
            format!("cordoned Node {name}"),
        )
        .await;
    }
    let on_node = tenant.pods_on(&name).await?;
    let evictable: Vec<&Pod> = on_node.iter().filter(|p| evictable(p)).collect();
    if evictable.is_empty() {
        return Ok(None);
    }
    // Pods marked do-not-disrupt are not evicted: they hold the drain until they finish or
    // the drain times out (the pool's `terminationGracePeriod`, else `--drain-timeout`).
    let (held, evictable): (Vec<&Pod>, Vec<&Pod>) = evictable
        .into_iter()
        .partition(|p| pod_holds_node(p, now()));
    let held_note = if held.is_empty() {
        String::new()
    } else {
        format!(", {} of them marked do-not-disrupt", held.len())
    };
    let left = held.len() + evictable.len();
    let limit = drain_limit(claim, ctx);
    if elapsed_since(since) > limit.wait {
        let why = if limit.capped {
            " (the most any drain waits, --max-drain-duration; the pool's terminationGracePeriod is longer or Never)"
        } else {
            ""
        };
        ctx.event(
            claim,
            EventType::Warning,
            "DrainTimeout",
            "Delete",
            format!(
                "{left} pod(s) still on Node {name}{held_note} after {}s{why}; going on anyway",
                limit.wait.as_secs()
            ),
        )
        .await;
        return Ok(None);
    }
    evict_all(tenant, &evictable).await?;
    let never = if limit.never {
        format!(
            " (terminationGracePeriod Never: at most {}s, --max-drain-duration)",
            limit.wait.as_secs()
        )
    } else {
        String::new()
    };
    Ok(Some(format!(
        "draining Node {name}: {left} pod(s) left{held_note}{never}"
    )))
}

/// Evicts the pods not already on their way out.
async fn evict_all(tenant: &impl TenantApi, pods: &[&Pod]) -> Result<(), Error> {
    for p in pods {
        if p.metadata.deletion_timestamp.is_none() {
            tenant.evict(p).await?;
        }
    }
    Ok(())
}

/// How long a claim's drain may take.
struct DrainLimit {
    /// The wait.
    wait: std::time::Duration,
    /// Whether `--max-drain-duration` cut a longer one.
    capped: bool,
    /// Whether the pool's `terminationGracePeriod` is `Never`.
    never: bool,
}

/// How long the claim's drain may take: its pool's `terminationGracePeriod`, else the
/// controller's `--drain-timeout`; never longer than `--max-drain-duration`.
fn drain_limit(claim: &NodeClaim, ctx: &ClaimContext) -> DrainLimit {
    let wanted = drain_timeout(claim, ctx);
    let max = ctx.config.max_drain_duration;
    DrainLimit {
        wait: wanted.map_or(max, |w| w.min(max)),
        capped: wanted.is_none_or(|w| w > max),
        never: wanted.is_none(),
    }
}

/// How long the claim's drain wants to take: its pool's `terminationGracePeriod` (`None`
/// for `Never`), else the controller's `--drain-timeout`.
fn drain_timeout(claim: &NodeClaim, ctx: &ClaimContext) -> Option<std::time::Duration> {
    let pool = claim
        .labels()
        .get(autonodes_api::LABEL_NODEPOOL)
        .and_then(|name| {
            let key = ObjectRef::new(name).within(&claim.namespace().unwrap_or_default());
            ctx.reflectors.pools.store().get(&key)
        });
    match pool.and_then(|p| p.spec.termination_grace_period) {
        Some(grace) => grace.after(),
        None => Some(ctx.config.drain_timeout),
    }
}

/// True for a pod a drain evicts: not a DaemonSet's or a mirror pod, and not finished.
fn evictable(p: &Pod) -> bool {
    let daemon = p.owner_references().iter().any(|o| o.kind == "DaemonSet");
    let mirror = p.annotations().contains_key("kubernetes.io/config.mirror");
    let done = matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    );
    !daemon && !mirror && !done
}

/// Removes everything the claim has in other clusters; `Ok` releases the finalizer.
pub(super) async fn cleanup(claim: &NodeClaim, ctx: &ClaimContext) -> Result<Action, Error> {
    if let Some(uid) = claim.uid() {
        if ctx.scheduling.lock().await.released.contains(&uid) {
            // Cleaned up already; this run saw a cached copy from before the finalizer was
            // released (a remote watch woke the claim meanwhile). Counting or deleting again
            // would be wrong; Ok lets the finalizer helper release the finalizer if it holds.
            return Ok(Action::await_change());
        }
    }
    let mut w = StatusWriter::new(claim, ctx);
    w.new.phase = Some(NodeClaimPhase::Terminating);
    let result = remove_remote_objects(claim, ctx, true).await;
    match result {
        Ok(Removal::Done) => {}
        Ok(Removal::Waiting(why)) => {
            w.set(READY, false, ClaimReason::Terminating, why.clone());
            w.write().await?;
            // An error keeps the finalizer (Ok would release it).
            return Err(Error::Waiting(why));
        }
        Ok(Removal::Kept(why, wait)) => {
            w.set(READY, false, ClaimReason::KeptForDebugging, why.clone());
            w.write().await?;
            return Err(Error::Kept { message: why, wait });
        }
        Err(e) => {
            let reason = e.cluster_reason().unwrap_or(ClaimReason::CleanupFailed);
            w.set(
                READY,
                false,
                reason,
                format!("cannot remove the claim's objects yet: {e}"),
            );
            tracing::warn!(nodeclaim = %claim.name_any(), namespace = %claim.namespace().unwrap_or_default(), %reason, error = %e, "cleanup blocked; the finalizer stays");
            w.write().await?;
            // An error keeps the finalizer: kube-runtime's finalizer helper releases it on
            // Ok, and the VM, Secret or token this step guards may still exist.
            return Err(Error::CleanupBlocked {
                reason: reason.as_str(),
                message: e.to_string(),
            });
        }
    }
    let uid = uid(claim)?;
    {
        let mut r = ctx.scheduling.lock().await;
        ctx.ledger(|l| l.release(&uid));
        r.released.insert(uid.clone());
        // Now and then, forget releases whose claims the store no longer holds.
        if r.released.len() % 256 == 0 {
            let live: HashSet<String> = ctx
                .claims()
                .state()
                .iter()
                .filter_map(|c| c.uid())
                .collect();
            r.released.retain(|u| live.contains(u));
        }
    }
    ctx.forget_written(&uid);
    if claim.status.as_ref().and_then(|s| s.phase) != Some(NodeClaimPhase::Failed) {
        let [ns, pool, node_type] = crate::metrics::claim_labels(claim);
        ctx.metrics
            .nodeclaims_terminated
            .with_label_values(&[&ns, &pool, &node_type, "deleted"])
            .inc();
    }
    ctx.wake_pending_claims();
    if let Some(t) = claim.status.as_ref().and_then(|s| s.type_ref.as_ref()) {
        let _ = ctx.wakes.types.unbounded_send(ObjectRef::new(t));
    }
    tracing::info!(nodeclaim = %claim.name_any(), namespace = %claim.namespace().unwrap_or_default(), "claim cleaned up");
    Ok(Action::await_change())
}

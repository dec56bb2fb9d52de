//! Power: `spec.power: Off` stops a claim's node and keeps it; `On` (or no value) starts it
//! again. `status.power` says where the VM stands.
//!
//! Powering off runs instead of the stages ([`power_off`]): the Node is cordoned and
//! drained as for a deletion (the drain counted from the power-off), then the VM is halted
//! (`runStrategy: Halted`: KubeVirt removes its instance, its disks stay), and the claim says
//! `Ready=False`, reason `PoweredOff`, phase `PoweredOff`, `status.power: Off`. The Node, the
//! claim's capacity and its address are kept; the ledger stops counting its VM as taking host
//! room once it is `Off`.
//!
//! Powering on runs before the launch stage ([`power_on`]). A VM that has stopped starts
//! only once the tenant no longer reports its Node `Ready`: the kubelet stopped with the
//! VM, but the Node says `Ready=True` until the tenant's node lifecycle controller marks it
//! `Unknown` (after its grace period, 40 s by default), and a `kubeadm join` from a fresh
//! disk refuses a Node that is Ready. Then the user-data Secret is written
//! again with a fresh bootstrap token (a VM whose root disk is ephemeral, a container disk,
//! boots from a fresh disk and joins again; one with a persistent disk keeps its kubelet's
//! credentials and ignores it), the VM's `runStrategy` goes back to `Always`, the Node is
//! uncordoned, and the claim says `Provisioned=False` (`Booting`, the launch timeout counted
//! from there) and `status.power: Starting` until its Node is Ready again, when it is `On`
//! and the token is deleted.

use std::time::Duration;

use kube::runtime::controller::Action;
use kube::ResourceExt;

use super::context::ClaimContext;
use super::join::{claim_join, render_reason};
use super::launch::render_for;
use super::provisioning::{uid, Provisioning, Step};
use super::status::{PROVISIONED, READY};
use super::terminate::drain_node;
use super::tokens::delete_tokens;
use crate::controller::context::now;
use crate::controller::error::Error;
use crate::remote::api::{HostApi, TenantApi};
use autonodes_api::reasons::ClaimReason;
use autonodes_api::PowerState;
use autonodes_core::node_health::node_ready;

/// How soon a claim being powered off is looked at again.
const STOPPING_RECHECK: Duration = Duration::from_secs(3);
/// How soon a claim powered on is looked at again while its Node still says Ready.
const STALE_READY_RECHECK: Duration = Duration::from_secs(5);

/// Powers the claim's node off, one step a reconcile: drain its Node, halt its VM, then
/// wait until the VM's instance is gone.
pub(super) async fn power_off<H: HostApi, T: TenantApi>(
    p: &mut Provisioning<'_, H, T>,
    ctx: &ClaimContext,
) -> Result<Step, Error> {
    let (vm_ns, vm_name) = (p.vm_ns.clone(), p.vm_name.clone());
    // The drain is counted from when powering off began.
    let since = match p.status.reason(READY) {
        Some(ClaimReason::PoweringOff) => p.status.since(READY).unwrap_or_else(now),
        _ => now(),
    };
    let stopped = p.status.new.power == Some(PowerState::Off);
    if !stopped {
        if let Some(name) = p.status.new.node_name.clone() {
            if let Some(node) = p.tenant().node(&name).await? {
                if let Some(waiting) = drain_node(p.claim, ctx, p.tenant(), &node, since).await? {
                    return Ok(stopping(p, format!("powering off: {waiting}")));
                }
            }
        }
        // Drained (or never joined): the VM stops, its disks stay.
        p.host().halt_vm(&vm_ns, &vm_name).await?;
    }
    if p.host().vmi(&vm_ns, &vm_name).await?.is_some() {
        return Ok(stopping(
            p,
            format!("powering off: VirtualMachine {vm_ns}/{vm_name} is stopping"),
        ));
    }
    p.status.new.power = Some(PowerState::Off);
    if !stopped {
        tracing::info!(nodeclaim = %p.claim.name_any(), vm = %format!("{vm_ns}/{vm_name}"), "powered off");
        // The VM's host room is free now (its instance is gone): claims waiting for room
        // look again at once, counting this claim as parked.
        let mut seen = p.claim.clone();
        seen.status = Some(p.status.new.clone());
        ctx.ledger(|l| l.observe(&seen));
        ctx.wake_pending_claims();
        if let Some(t) = p.status.new.type_ref.clone() {
            let _ = ctx
                .wakes
                .types
                .unbounded_send(kube::runtime::reflector::ObjectRef::new(&t));
        }
    }
    let node = p
        .status
        .new
        .node_name
        .as_deref()
        .map(|n| format!("Node {n} is cordoned and kept, "))
        .unwrap_or_default();
    p.status.set(
        READY,
        false,
        ClaimReason::PoweredOff,
        format!(
            "powered off (spec.power: Off): {node}VirtualMachine {vm_ns}/{vm_name} is stopped with its disks"
        ),
    );
    Ok(Step::Stop(Action::await_change()))
}

/// `status.power: Stopping`, `Ready=False` (`PoweringOff`) with `message`.
fn stopping<H: HostApi, T: TenantApi>(p: &mut Provisioning<'_, H, T>, message: String) -> Step {
    p.status.new.power = Some(PowerState::Stopping);
    p.status
        .set(READY, false, ClaimReason::PoweringOff, message);
    Step::Stop(Action::requeue(STOPPING_RECHECK))
}

/// Powers the claim's node on again when it was powered off (or on its way off): its user
/// data gets a fresh token, the VM starts, its Node is uncordoned. Nothing for a claim that
/// is on; the step to stop at when the tenant gives no join (its condition says why).
pub(super) async fn power_on<H: HostApi, T: TenantApi>(
    p: &mut Provisioning<'_, H, T>,
) -> Result<Option<Step>, Error> {
    if !matches!(
        p.status.new.power,
        Some(PowerState::Off | PowerState::Stopping)
    ) {
        return Ok(None);
    }
    let (vm_ns, vm_name) = (p.vm_ns.clone(), p.vm_name.clone());
    if let Some(step) = wait_for_stale_ready(p).await? {
        return Ok(Some(step));
    }
    let (join, _) = match claim_join(p).await? {
        Ok(j) => j,
        Err(step) => return Ok(Some(step)),
    };
    let installation = p.ctx.config.installation.clone();
    match render_for(p.claim, p.node_type, &vm_name, &vm_ns, &join, &installation) {
        // A Secret of that name that is not this claim's is left alone (`false`).
        Ok(rendered) => {
            p.host()
                .create_user_data(&vm_ns, &rendered.secret, true)
                .await?;
        }
        Err(e) => {
            p.status
                .set(PROVISIONED, false, render_reason(&e), e.to_string());
            return Ok(Some(Step::Stop(Action::requeue(Duration::from_secs(60)))));
        }
    }
    p.host().start_vm(&vm_ns, &vm_name).await?;
    if let Some(name) = p.status.new.node_name.clone() {
        if p.tenant().node(&name).await?.is_some() {
            p.tenant().uncordon(&name).await?;
        }
    }
    tracing::info!(nodeclaim = %p.claim.name_any(), vm = %format!("{vm_ns}/{vm_name}"), "powering on");
    p.status.new.power = Some(PowerState::Starting);
    // The launch timeout counts from here.
    p.status.set(
        PROVISIONED,
        false,
        ClaimReason::Booting,
        format!("powering on: VirtualMachine {vm_ns}/{vm_name} starts again"),
    );
    Ok(None)
}

/// The step to stop at while the VM has stopped but the tenant still reports its Node
/// `Ready` (the last word of the kubelet that stopped with it); `None` once it does not, or
/// while the VM still runs (powered on again before it stopped: nothing joins anew).
async fn wait_for_stale_ready<H: HostApi, T: TenantApi>(
    p: &mut Provisioning<'_, H, T>,
) -> Result<Option<Step>, Error> {
    let Some(name) = p.status.new.node_name.clone() else {
        return Ok(None);
    };
    if p.host().vmi(&p.vm_ns, &p.vm_name).await?.is_some() {
        return Ok(None);
    }
    match p.tenant().node(&name).await? {
        Some(node) if node_ready(&node) => {
            p.status.set(
                READY,
                false,
                ClaimReason::PoweredOff,
                format!(
                    "powering on once the tenant no longer reports Node {name} Ready: its kubelet stopped with the VM, and a node joining again from a fresh disk is refused while the Node says Ready (the tenant's node lifecycle controller marks it Unknown after its grace period, 40 s by default)"
                ),
            );
            Ok(Some(Step::Stop(Action::requeue(STALE_READY_RECHECK))))
        }
        _ => Ok(None),
    }
}

/// Records that the VM runs: `On`, or `Migrating` while it is live-migrated; a VM powered
/// on again stays `Starting` until its Node is Ready.
pub(super) fn running<H: HostApi, T: TenantApi>(p: &mut Provisioning<'_, H, T>, migrating: bool) {
    let power = &mut p.status.new.power;
    *power = match (*power, migrating) {
        (_, true) => Some(PowerState::Migrating),
        (Some(PowerState::Starting), false) => Some(PowerState::Starting),
        _ => Some(PowerState::On),
    };
}

/// A VM powered on again whose Node is Ready: `On`, and the token its boot may have joined
/// with has done its job.
pub(super) async fn ready<H: HostApi, T: TenantApi>(
    p: &mut Provisioning<'_, H, T>,
) -> Result<(), Error> {
    if p.status.new.power == Some(PowerState::Starting) {
        delete_tokens(p.tenant(), &uid(p.claim)?).await?;
        p.status.new.power = Some(PowerState::On);
    }
    Ok(())
}

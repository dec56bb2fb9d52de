//! Drift: the claim's node type (or its provider) changed since the claim was scheduled —
//! the type's `definitionHash` is no longer the one the claim recorded
//! (`status.nodeTypeHash`) — or its node's kubelet is of another minor release than the
//! tenant (a vCluster upgrade). The claim gets `Drifted=True` (reason `NodeTypeChanged` or
//! `KubernetesVersionChanged`, a Normal Event; a changed type wins); a pool rolls drifted
//! claims by surge within its budgets (`spec.disruption.kubernetesVersionDrift: Disabled`
//! leaves the version's alone). A node whose kubelet is of another minor release from the
//! start (before the claim was first initialized: a baked kubelet, a pinned download URL)
//! gets reason `KubeletVersionMismatch` instead, and stays so: a replacement would come up
//! the same, so its pool holds its version roll (`VersionDriftHeld`). The condition goes
//! when neither holds any more.

use super::provisioning::Provisioning;
use super::status::{DRIFTED, INITIALIZED};
use crate::controller::error::Error;
use crate::remote::api::{HostApi, TenantApi};
use autonodes_api::reasons::ClaimReason;
use autonodes_core::kubeversion::version_drift;

/// Sets or clears `Drifted` on the claim's status as this reconcile changes it.
pub(super) fn drift<H: HostApi, T: TenantApi>(p: &mut Provisioning<'_, H, T>) {
    let current = &p.node_type.definition;
    match p.status.new.node_type_hash.as_deref() {
        // Claims scheduled before autonodes recorded the hash: what runs now is the
        // reference from here on.
        None => p.status.new.node_type_hash = Some(current.clone()),
        // The version's drift is decided once the node is known ([`version`]).
        Some(recorded) if recorded == current => {
            if p.status.reason(DRIFTED) == Some(ClaimReason::NodeTypeChanged) {
                p.status.remove(DRIFTED);
            }
        }
        Some(recorded) => {
            let message = format!(
                "node type {} changed since the claim was scheduled (definition {recorded}, now {current})",
                p.node_type.name
            );
            p.status
                .set(DRIFTED, true, ClaimReason::NodeTypeChanged, message);
        }
    }
}

/// Sets or clears `Drifted` (`KubernetesVersionChanged`) from the claim's Node: its
/// kubelet's minor release against the tenant's. A changed node type (set by [`drift`])
/// is left as it is; a tenant whose version cannot be read changes nothing.
pub(super) async fn version<H: HostApi, T: TenantApi>(
    p: &mut Provisioning<'_, H, T>,
) -> Result<(), Error> {
    if p.status.reason(DRIFTED) == Some(ClaimReason::NodeTypeChanged) {
        return Ok(());
    }
    let Some(kubelet) = p
        .node
        .as_ref()
        .and_then(|n| n.status.as_ref())
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.kubelet_version.clone())
    else {
        return Ok(());
    };
    let Ok(tenant) = p.tenant().join_info().await?.version else {
        return Ok(());
    };
    match version_drift(&kubelet, tenant) {
        Some(message) => {
            // A node drifted before it was first initialized came up so: a replacement
            // would come up the same, and pools hold their version roll for it.
            let reason = if p.status.reason(DRIFTED) == Some(ClaimReason::KubeletVersionMismatch)
                || !p.status.was_true(INITIALIZED)
            {
                ClaimReason::KubeletVersionMismatch
            } else {
                ClaimReason::KubernetesVersionChanged
            };
            p.status.set(DRIFTED, true, reason, message)
        }
        None => {
            if p.status
                .reason(DRIFTED)
                .is_some_and(ClaimReason::is_version_drift)
            {
                p.status.remove(DRIFTED);
            }
        }
    }
    Ok(())
}

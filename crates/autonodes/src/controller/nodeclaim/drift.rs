//! Drift: the claim's node type (or its provider) changed since the claim was scheduled —
//! the type's `definitionHash` is no longer the one the claim recorded
//! (`status.nodeTypeHash`). The claim gets `Drifted=True` (reason `NodeTypeChanged`, a
//! Normal Event); a pool rolls drifted claims by surge within its budgets. The condition
//! goes when the type is back to what the claim was made from.

use super::provisioning::Provisioning;
use super::status::DRIFTED;
use crate::remote::api::{HostApi, TenantApi};
use autonodes_api::reasons::ClaimReason;

/// Sets or clears `Drifted` on the claim's status as this reconcile changes it.
pub(super) fn drift<H: HostApi, T: TenantApi>(p: &mut Provisioning<'_, H, T>) {
    let current = &p.node_type.definition;
    match p.status.new.node_type_hash.as_deref() {
        // Claims scheduled before autonodes recorded the hash: what runs now is the
        // reference from here on.
        None => p.status.new.node_type_hash = Some(current.clone()),
        Some(recorded) if recorded == current => p.status.remove(DRIFTED),
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

//! The mirror's state beside the shared [`Context`], and the names its files share.

use std::sync::Arc;

use autonodes_core::capi::ClaimNames;
use autonodes_core::pool::ANNOTATION_DELETE_FIRST;
use kube::runtime::reflector::Store;

use crate::controller::context::Context;
use autonodes_api::capi::{Machine, MachinePool};
use autonodes_api::reasons::ClaimCondition;

/// Field manager of the mirror's writes (distinct from the other controllers', so
/// server-side apply never drops what they own).
pub(crate) const FIELD_MANAGER: &str = "autonodes-capi";

/// The field manager of the mirror's status writes: apart from [`FIELD_MANAGER`], because
/// API servers before 1.22 keep one set of fields per manager for an object and its status
/// alike, so a status write under the same name would take the object's applied fields
/// (its scale-from-zero annotations) out of the set, and one the mirror later drops (a
/// taint the pool no longer has) would stay.
pub(crate) const STATUS_FIELD_MANAGER: &str = "autonodes-capi-status";

/// What the mirror reads on NodeClaims, as the claim and pool controllers name it.
pub(crate) const CLAIM_NAMES: ClaimNames = ClaimNames {
    delete_first: ANNOTATION_DELETE_FIRST,
    ready: ClaimCondition::Ready.as_str(),
    provisioned: ClaimCondition::Provisioned.as_str(),
};

/// Shared state of the mirror.
pub(crate) struct CapiContext {
    /// The controllers' shared context.
    pub ctx: Arc<Context>,
    /// Every MachinePool.
    pub machine_pools: Store<MachinePool>,
    /// Every Machine.
    pub machines: Store<Machine>,
}

//! Every decision of the `capi.autonodes.io` mirror (issue 7), pure: no I/O. The controller
//! (`controller::capi`) reads a NodePool, its MachinePool, Machines and NodeClaims, asks
//! this module what they should be, and writes the difference.
//!
//! - the pool: whether it is mirrored ([`pool_mirror`]), its `Autoscaling` condition
//!   ([`mirrored_condition`], [`set_autoscaling`], [`clear_autoscaling`]);
//! - replicas, both ways: [`bounds_problem`], [`sync_replicas`], [`node_pool_write`];
//! - the MachinePool: [`desired_machine_pool`] (with the scale-from-zero annotations of
//!   [`scale_from_zero`]), [`needs_update`], [`machine_pool_status`];
//! - the Machines: [`plan_machines`] (which to create, update or delete, and the status each
//!   shows, [`machine_status`]), and which claims get or lose the delete-first mark
//!   ([`delete_first_marks`], [`claims_to_unmark`]).
//!
//! ## Two-way replicas: who wrote last
//!
//! `spec.replicas` of the NodePool and of its MachinePool are kept equal in both
//! directions. Each object carries the annotation `capi.autonodes.io/synced-replicas`: the
//! value the mirror last agreed on *for that object*. The mirror writes it atomically with
//! every replica value it writes, so a value differing from its own marker was written by
//! someone else (`kubectl scale npool`, HPA, the autoscaler's PUT on `/scale`) after the
//! last sync. On each reconcile ([`sync_replicas`]):
//! - equal values: nothing to pass on (markers are brought up to date);
//! - only one object changed: its value is copied to the other;
//! - both changed: if the MachinePool's marker equals the NodePool's value, the NodePool's
//!   change had already been passed on and the MachinePool's is newer — it wins; likewise
//!   the other way round; a genuinely concurrent change (neither was passed on) is won by
//!   the NodePool, the object of record (the autoscaler reads the size back with GET
//!   `/scale` on its next loop and decides again).
//!
//! The object to change is written first (value and marker in one conditional write), the
//! other object's marker second ([`node_pool_write`]), each conditional on the
//! resourceVersion read, so a crash or a conflict between the two writes is resolved by the
//! same rule on the next reconcile and the two objects never fight.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;

use autonodes_api::capi::CAPI_GROUP;
use autonodes_api::conditions::{self, status_of};
use autonodes_api::reasons::{PoolCondition, PoolReason};
use autonodes_api::{Autoscaling, NodePool};

mod machine_pool;
mod machines;
mod ownership;
mod replicas;

pub use machine_pool::*;
pub use machines::*;
pub use ownership::*;
pub use replicas::*;

/// NodePool condition: whether the pool is mirrored for the cluster-autoscaler.
pub const AUTOSCALING: &str = PoolCondition::Autoscaling.as_str();
/// Reason of `Autoscaling=False` for bad `spec.autoscaling` bounds.
pub const REASON_INVALID_BOUNDS: &str = PoolReason::InvalidAutoscalingBounds.as_str();
/// Reason of `Autoscaling=False` for a pool without `spec.replicas`.
pub const REASON_REPLICAS_REQUIRED: &str = PoolReason::ReplicasRequired.as_str();
/// Reason of `Autoscaling=True`.
pub const REASON_MIRRORED: &str = PoolReason::MachinePoolMirrored.as_str();

/// What becomes of a NodePool's mirror.
#[derive(Clone, Debug, PartialEq)]
pub enum PoolMirror<'a> {
    /// The NodePool is being deleted: its mirror goes.
    Deleting,
    /// No `spec.autoscaling`: the mirror goes, and so does the `Autoscaling` condition.
    NotAutoscaled,
    /// `spec.autoscaling` without `spec.replicas`: the mirror goes; the condition says why.
    ReplicasRequired(AutoscalingCondition),
    /// Mirrored, with these bounds (valid or not) and replicas.
    Mirrored {
        /// `spec.autoscaling`.
        autoscaling: &'a Autoscaling,
        /// `spec.replicas`.
        replicas: i32,
    },
}

impl PoolMirror<'_> {
    /// Whether the pool has a mirror.
    pub fn is_mirrored(&self) -> bool {
        matches!(self, PoolMirror::Mirrored { .. })
    }
}

/// Whether and how `pool` is mirrored.
pub fn pool_mirror(pool: &NodePool) -> PoolMirror<'_> {
    if pool.metadata.deletion_timestamp.is_some() {
        return PoolMirror::Deleting;
    }
    let Some(autoscaling) = pool.spec.autoscaling.as_ref() else {
        return PoolMirror::NotAutoscaled;
    };
    let Some(replicas) = pool.spec.replicas else {
        return PoolMirror::ReplicasRequired(AutoscalingCondition {
            ok: false,
            reason: REASON_REPLICAS_REQUIRED,
            message: "spec.autoscaling needs spec.replicas (set it, e.g. to minReplicas): the cluster-autoscaler drives a pool through its replicas, and a pool without them grows by itself".into(),
        });
    };
    PoolMirror::Mirrored {
        autoscaling,
        replicas,
    }
}

/// The pool's `Autoscaling` condition, to be set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AutoscalingCondition {
    /// Its status: True when mirrored with valid bounds.
    pub ok: bool,
    /// Its reason.
    pub reason: &'static str,
    /// Its message.
    pub message: String,
}

/// The `Autoscaling` condition of the mirrored pool `name`: False with the problem of its
/// bounds (`bounds`, from [`bounds_problem`]), else True naming the bounds.
pub fn mirrored_condition(
    name: &str,
    autoscaling: &Autoscaling,
    bounds: Option<String>,
) -> AutoscalingCondition {
    match bounds {
        Some(problem) => AutoscalingCondition {
            ok: false,
            reason: REASON_INVALID_BOUNDS,
            message: problem,
        },
        None => AutoscalingCondition {
            ok: true,
            reason: REASON_MIRRORED,
            message: format!(
                "mirrored as MachinePool {CAPI_GROUP}/{name} for the cluster-autoscaler (min {}, max {})",
                autoscaling.min_replicas, autoscaling.max_replicas
            ),
        },
    }
}

/// A change of a pool's conditions.
#[derive(Clone, Debug, PartialEq)]
pub struct ConditionChange {
    /// The pool's whole new list of conditions.
    pub conditions: Vec<Condition>,
    /// Whether the `Autoscaling` condition is new or changed its status or reason (worth an
    /// Event).
    pub transition: bool,
}

/// The pool's conditions `old` with `Autoscaling` set to `condition` (observed at
/// `generation`, at `now`); `None` when that changes nothing.
pub fn set_autoscaling(
    old: &[Condition],
    condition: &AutoscalingCondition,
    generation: Option<i64>,
    now: Timestamp,
) -> Option<ConditionChange> {
    let status = status_of(condition.ok);
    let before = conditions::get(old, AUTOSCALING);
    let transition = before.is_none_or(|b| b.status != status || b.reason != condition.reason);
    let mut new = old.to_vec();
    let changed = conditions::set(
        &mut new,
        AUTOSCALING,
        status,
        condition.reason,
        condition.message.clone(),
        generation,
        now,
    );
    changed.then_some(ConditionChange {
        conditions: new,
        transition,
    })
}

/// The pool's conditions `old` without `Autoscaling`; `None` when it has none.
pub fn clear_autoscaling(old: &[Condition]) -> Option<Vec<Condition>> {
    conditions::get(old, AUTOSCALING)?;
    Some(
        old.iter()
            .filter(|c| c.type_ != AUTOSCALING)
            .cloned()
            .collect(),
    )
}

#[cfg(test)]
mod tests;

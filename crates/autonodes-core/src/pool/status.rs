//! The status a pool reports: its live claims as this reconcile leaves them (the planned
//! deletions gone, the planned claims made), the node types, resources and cost they stand
//! for, and the `Ready` and `LimitReached` conditions; and which condition changes are
//! problems worth a Warning Event.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;

use crate::catalogue::Catalogue;
use crate::resources;
use autonodes_api::conditions::{self, status_of, TRUE};
use autonodes_api::reasons::{PoolCondition, PoolReason};
use autonodes_api::{
    NodeClaim, NodeClaimPhase, NodePool, NodePoolResources, NodePoolStatus, RegistrationStatus,
};

use super::pack::Amount;
use super::plan::is_live;
use super::plan::PoolPlan;
use super::plan::Verdict;
use super::{selector, template_hash, LABEL_TEMPLATE_HASH};

/// `VClusterConfig` of a pool made from a vCluster's configuration: False with the
/// `problem` when there is one (the configuration cannot be read, or this pool's entry
/// cannot be mapped), else True.
pub fn import_verdict(problem: Option<&str>) -> Verdict {
    match problem {
        Some(p) => Verdict::new(false, PoolReason::InvalidVClusterConfig, p),
        None => Verdict::new(
            true,
            PoolReason::Imported,
            "the pool is as the vCluster's configuration says",
        ),
    }
}

/// `Ready` of a static pool from its claims: rolling while any claim is from an older
/// template, else ready when exactly `desired` claims are all Available, else scaling.
fn static_ready(desired: i32, replicas: i32, ready: i32, outdated: usize) -> Verdict {
    if outdated > 0 {
        Verdict::new(
            false,
            PoolReason::RollingUpdate,
            format!("{outdated} claim(s) from an older template are being replaced"),
        )
    } else if ready == desired && replicas == desired {
        Verdict::new(
            true,
            PoolReason::AllReplicasReady,
            format!("{desired} of {desired} nodes Ready"),
        )
    } else if replicas > desired {
        Verdict::new(
            false,
            PoolReason::ScalingDown,
            format!("{replicas} claims, {desired} wanted"),
        )
    } else {
        Verdict::new(
            false,
            PoolReason::ScalingUp,
            format!("{ready} of {desired} nodes Ready"),
        )
    }
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// The status of `pool` once `plan` is carried out on its `claims` (the claims it deletes
/// no longer count, each claim it creates counts as one not yet Available): replicas, ready
/// replicas, selector, node types, resources and cost of the live claims (from
/// `catalogue`), pending pods, and the conditions (`plan`'s, else worked out from the
/// claims), set at `now`.
pub fn pool_status(
    pool: &NodePool,
    claims: &[Arc<NodeClaim>],
    plan: &PoolPlan,
    catalogue: &Catalogue,
    now: Timestamp,
) -> NodePoolStatus {
    let old = pool.status.clone().unwrap_or_default();
    let mut new = old.clone();
    let deleted: BTreeSet<&str> = plan.delete.iter().map(|(n, _)| n.as_str()).collect();
    let live: Vec<&NodeClaim> = claims
        .iter()
        .map(|c| &**c)
        .filter(|c| is_live(c) && !deleted.contains(c.metadata.name.as_deref().unwrap_or("")))
        .collect();
    let nodes = live.len() + plan.create.len();
    new.replicas = count(nodes);
    new.ready_replicas = count(
        live.iter()
            .filter(|c| c.status.as_ref().and_then(|s| s.phase) == Some(NodeClaimPhase::Available))
            .count(),
    );
    new.selector = Some(selector(pool.metadata.name.as_deref().unwrap_or_default()));
    let types: BTreeSet<String> = live
        .iter()
        .filter_map(|c| c.status.as_ref().and_then(|s| s.type_ref.clone()))
        .collect();
    new.node_type = (!types.is_empty()).then(|| types.into_iter().collect::<Vec<_>>().join(","));
    let mut used = Amount::default();
    let mut cost = 0i64;
    for s in live.iter().filter_map(|c| c.status.as_ref()) {
        cost += s.cost.unwrap_or(0);
        if let Some(t) = s.type_ref.as_ref().and_then(|t| catalogue.get(t)) {
            used = used.plus(&Amount::of_node(&t.amounts));
        }
    }
    new.resources = Some(NodePoolResources {
        nodes: i64::try_from(nodes).unwrap_or(i64::MAX),
        cpu: Some(Quantity(resources::format_cpu(used.cpu))),
        memory: Some(Quantity(resources::format_memory(used.memory))),
        extended: used
            .extended
            .iter()
            .map(|(name, milli)| (name.clone(), Quantity(resources::format_cpu(*milli))))
            .collect(),
    });
    new.cost = Some(cost);
    new.pending_pods = plan.pending_pods;
    let hash = template_hash(&pool.spec);
    let ready = plan.ready.clone().unwrap_or_else(|| {
        let outdated = live
            .iter()
            .filter(|c| {
                c.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(LABEL_TEMPLATE_HASH))
                    != Some(&hash)
                    || c.status.as_ref().is_some_and(|s| {
                        super::plan::drifted(
                            &s.conditions,
                            super::plan::rolls_version_drift_now(
                                &pool.spec,
                                plan.version_drift_held.as_ref(),
                            ),
                        )
                    })
            })
            .count();
        static_ready(
            pool.spec.replicas.unwrap_or(0),
            new.replicas,
            new.ready_replicas,
            outdated,
        )
    });
    let limit = plan.limit.clone().unwrap_or_else(|| {
        Verdict::new(
            false,
            PoolReason::WithinLimits,
            "the pool is within its limits",
        )
    });
    let generation = pool.metadata.generation;
    let imported = plan
        .imported
        .clone()
        .map(|v| (PoolCondition::VClusterConfig, v));
    let repair = plan.repair.clone().map(|v| (PoolCondition::NodeRepair, v));
    let registration = plan.registration.as_ref().map(|(status, verdict)| {
        new.registration = (*status != RegistrationStatus::default()).then(|| status.clone());
        (PoolCondition::NodeRegistrationHealthy, verdict.clone())
    });
    new.warm = plan.warm.0.clone();
    let warm = plan.warm.1.clone().map(|v| (PoolCondition::WarmReady, v));
    if warm.is_none() {
        new.conditions
            .retain(|c| c.type_ != PoolCondition::WarmReady.as_str());
    }
    let held = plan
        .version_drift_held
        .clone()
        .map(|v| (PoolCondition::VersionDriftHeld, v));
    if held.is_none() {
        new.conditions
            .retain(|c| c.type_ != PoolCondition::VersionDriftHeld.as_str());
    }
    let host_held = plan
        .host_maintenance_held
        .clone()
        .map(|v| (PoolCondition::HostMaintenanceHeld, v));
    if host_held.is_none() {
        new.conditions
            .retain(|c| c.type_ != PoolCondition::HostMaintenanceHeld.as_str());
    }
    for (type_, v) in [
        (PoolCondition::Ready, ready),
        (PoolCondition::LimitReached, limit),
    ]
    .into_iter()
    .chain(imported)
    .chain(repair)
    .chain(registration)
    .chain(warm)
    .chain(held)
    .chain(host_held)
    {
        conditions::set(
            &mut new.conditions,
            type_,
            status_of(v.status),
            v.reason,
            v.message,
            generation,
            now,
        );
    }
    new.observed_generation = generation;
    new
}

/// The conditions of `new` that became a problem since `old` (status or reason changed):
/// see [`is_problem`]. Each gets a Warning Event, once per reason (the pool controller's
/// `report_changes` decides the same; the unit tests read it here).
#[cfg(test)]
pub fn new_problems<'s>(old: &NodePoolStatus, new: &'s NodePoolStatus) -> Vec<&'s Condition> {
    new.conditions
        .iter()
        .filter(|c| {
            let before = conditions::get(&old.conditions, &c.type_);
            !before.is_some_and(|b| b.status == c.status && b.reason == c.reason)
        })
        .filter(|c| is_problem(c))
        .collect()
}

/// True for a pool condition a user must look at: `Ready` not True for a reason that is not
/// progress, and `LimitReached=True`.
pub fn is_problem(c: &Condition) -> bool {
    match PoolCondition::parse(&c.type_) {
        Some(PoolCondition::Ready) => {
            c.status != TRUE && !PoolReason::parse(&c.reason).is_some_and(PoolReason::is_progress)
        }
        Some(PoolCondition::LimitReached) => c.status == TRUE,
        // Repair turned off is the user's choice, not a problem.
        Some(PoolCondition::NodeRepair) => {
            c.status != TRUE && c.reason != PoolReason::RepairDisabled.as_str()
        }
        Some(PoolCondition::VClusterConfig) | Some(PoolCondition::NodeRegistrationHealthy) => {
            c.status != TRUE
        }
        // A held roll needs the user to change the nodes' kubelet.
        Some(PoolCondition::VersionDriftHeld) => c.status == TRUE,
        // A host's drain waits on these nodes until a budget allows their replacement.
        Some(PoolCondition::HostMaintenanceHeld) => c.status == TRUE,
        // Warm VMs booting are on their way.
        Some(PoolCondition::WarmReady) => {
            c.status != TRUE && c.reason != PoolReason::WarmStarting.as_str()
        }
        _ => false,
    }
}

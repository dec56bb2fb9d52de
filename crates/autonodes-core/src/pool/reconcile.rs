//! One reconcile of a NodePool as data: what the controller observed ([`Observed`]) → what
//! to do ([`PoolPlan`]): the claims to delete and why, the claims to create (spec with
//! type and capacity, the claim replaced), the `autonodes.io/empty-since` marks to set or
//! clear, the pool's conditions and when to look again. The status to write follows from
//! the plan ([`super::status::pool_status`]).
//!
//! Every pool first deletes Failed claims and rolls outdated ones ([`super::plan`]); a
//! static pool is scaled to `replicas`; a dynamic pool then plans for the tenant's pending
//! pods and empty nodes ([`super::dynamic`]), counting the claims just planned.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::catalogue::Catalogue;
use crate::scheduling::ClaimRequest;
use autonodes_api::reasons::PoolReason;
use autonodes_api::{
    DisruptionReason, NodeClaim, NodeClaimSpec, NodePool, NodePoolSpec, RegistrationStatus,
    ResourceList,
};

use super::do_not_disrupt;
use super::dynamic::{self, DynamicInput, Tenant};
use super::limits::{Bound, ClaimRoom};
use super::plan::Verdict;
use super::plan::{
    claim_views, is_live, plan_claims, rolls_version_drift_now, version_drift_hold, Allowance,
};
use super::plan::{DeleteReason, NewClaim, PoolPlan};
use super::{
    budget::{allowed_disruptions, scale_down_pace},
    claim_object, expire_after, template_hash, template_spec, LABEL_TEMPLATE_HASH,
};

/// When a pool with nothing under way is looked at again.
pub(crate) const IDLE_RECHECK: Duration = Duration::from_secs(60);
/// When a static pool that created or deleted claims is looked at again.
pub(crate) const BUSY_RECHECK: Duration = Duration::from_secs(5);
/// When a pool whose template or tenant cannot be used is looked at again.
pub(crate) const PROBLEM_RECHECK: Duration = Duration::from_secs(30);
/// When a dynamic pool whose tenant did not answer is looked at again.
pub(crate) const UNREACHABLE_RECHECK: Duration = Duration::from_secs(15);

/// What the controller observed for one reconcile of a pool.
#[derive(Clone, Copy, Debug)]
pub struct Observed<'a> {
    /// The pool.
    pub pool: &'a NodePool,
    /// The pool's claims: the claim store's, with this process's writes it does not show
    /// yet ([`super::expectations`]).
    pub claims: &'a [Arc<NodeClaim>],
    /// Why the pool cannot be worked on at all ([`template_problem`], a static pool's
    /// tenant that cannot be reached): its claims are left as they are.
    pub problem: Option<&'a Verdict>,
    /// A dynamic pool's tenant, or why it could not be observed (`None` for a static pool,
    /// or when `problem` is set).
    pub tenant: Option<Result<Tenant<'a>, &'a Verdict>>,
    /// The node types.
    pub catalogue: &'a Catalogue,
    /// How long a node may stay not Ready before it is repaired, when neither the pool nor
    /// its provider lists conditions of their own (`None`: then never).
    pub repair_after: Option<Duration>,
    /// The `spec.repair` of the pool's provider (the pool's own takes precedence, field by
    /// field).
    pub provider_repair: Option<&'a autonodes_api::Repair>,
    /// How a dynamic pool batches bursts of pending pods.
    pub batch: super::dynamic::Batch,
    /// How many claims the pool may create now ([`super::limits::claim_room`]).
    pub room: &'a ClaimRoom,
    /// The pool's registration health as last written (`status.registration`; the status
    /// is written with the pool's resourceVersion, so a stale copy's plan is retried).
    pub registration: Option<&'a RegistrationStatus>,
    /// The time of the observation.
    pub now: Timestamp,
}

/// Why the pool's template cannot be used: its provider does not exist
/// (`provider_exists` says), or its requirements, labels or kubelet arguments cannot be
/// used.
pub fn template_problem(
    spec: &NodePoolSpec,
    provider_exists: impl FnOnce(&str) -> bool,
) -> Option<Verdict> {
    if let Some(p) = &spec.provider_ref {
        if !provider_exists(p) {
            return Some(Verdict::problem(
                PoolReason::ProviderNotFound,
                format!("NodeProvider {p} does not exist"),
            ));
        }
    }
    if let Some(problem) = super::disruption_problem(spec) {
        return Some(Verdict::problem(PoolReason::InvalidDisruption, problem));
    }
    let template = template_spec(spec);
    if let Err(e) = ClaimRequest::new(&template, None) {
        return Some(Verdict::problem(PoolReason::InvalidTemplate, e.to_string()));
    }
    if let Err(e) = crate::node_config::node_labels(
        &Default::default(),
        None,
        &template.labels,
        &BTreeMap::new(),
    ) {
        return Some(Verdict::problem(PoolReason::InvalidTemplate, e.to_string()));
    }
    if let Err(e) = crate::kubelet_args::checked(&template.kubelet_args) {
        return Some(Verdict::problem(PoolReason::InvalidTemplate, e.to_string()));
    }
    None
}

/// The claim that replaces `old`: its capacity, and its type when only its age (not the
/// template) makes it outdated — a changed template chooses anew.
fn replacement(template: &NodeClaimSpec, hash: &str, old: Option<&NodeClaim>) -> NodeClaimSpec {
    let (desired_capacity, type_ref) = match old {
        Some(o) => (
            o.spec.desired_capacity.clone(),
            (o.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_TEMPLATE_HASH))
                .map(String::as_str)
                == Some(hash))
            .then(|| o.spec.type_ref.clone())
            .flatten(),
        ),
        None => (ResourceList::new(), None),
    };
    NodeClaimSpec {
        desired_capacity,
        type_ref,
        ..template.clone()
    }
}

/// Plans one reconcile of a pool from what was observed.
pub fn plan_pool(observed: &Observed) -> PoolPlan {
    if let Some(problem) = observed.problem {
        return PoolPlan {
            ready: Some(problem.clone()),
            requeue: PROBLEM_RECHECK,
            ..PoolPlan::default()
        };
    }
    let spec = &observed.pool.spec;
    let template = template_spec(spec);
    let hash = template_hash(spec);
    // Failed claims are counted before anything is planned: one that makes the pool back
    // off holds back its own replacement.
    let registration =
        super::registration::assess(observed.registration, observed.claims, observed.now);
    let backoff_room = ClaimRoom {
        create: 0,
        bound: Bound::Backoff,
    };
    let room = match registration.backing_off {
        Some(_) => &backoff_room,
        None => observed.room,
    };
    let repair_policy = super::repair::policy(
        spec.repair.as_ref(),
        observed.provider_repair,
        observed.repair_after,
    );
    let repair = super::repair::assess(observed.claims, &repair_policy, observed.now);
    // A node that came up drifted from the tenant's version holds the version roll.
    let version_drift_held = super::rolls_version_drift(spec)
        .then(|| version_drift_hold(observed.claims))
        .flatten();
    let mut views = claim_views(
        observed.claims,
        &hash,
        expire_after(spec),
        rolls_version_drift_now(spec, version_drift_held.as_ref()),
        observed.now.as_millisecond(),
    );
    // do-not-disrupt: a static pool sees only its claims' marks (it does not watch the
    // tenant); a dynamic pool also its Nodes' and pods'.
    let (nodes, pods) = match &observed.tenant {
        Some(Ok(t)) => (t.nodes, t.pods),
        _ => (&[][..], &[][..]),
    };
    let protected = do_not_disrupt::protected(
        observed.claims.iter().map(|c| &**c),
        nodes,
        pods,
        observed.now,
    );
    for v in &mut views {
        v.repair = repair.due.contains(&v.name);
        v.held = protected.contains(&v.name);
    }
    let desired = spec.replicas.map(|r| usize::try_from(r).unwrap_or(0));
    let nodes = observed.claims.iter().filter(|c| is_live(c)).count();
    let allowed = Allowance {
        disrupt: allowed_disruptions(spec, nodes, observed.now, Some(DisruptionReason::Drifted)),
        expire: allowed_disruptions(spec, nodes, observed.now, None),
        scale_down: scale_down_pace(spec, nodes, observed.now),
        host_maintenance: allowed_disruptions(
            spec,
            nodes,
            observed.now,
            Some(DisruptionReason::HostMaintenance),
        ),
        create: room.create,
    };
    let planned = plan_claims(&views, desired, allowed);
    let host_maintenance_held = (!planned.host_maintenance_held.is_empty()).then(|| {
        Verdict::new(
            true,
            PoolReason::BudgetExhausted,
            format!(
                "claims {} must leave a host node being drained and cannot live-migrate; the pool's disruption budgets for HostMaintenance allow {} node(s) disrupted at once now, so their replacement waits (the host's drain waits on these nodes)",
                planned.host_maintenance_held.join(", "),
                allowed.host_maintenance
            ),
        )
    });
    let find = |name: &str| {
        observed
            .claims
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(name))
    };
    let mut short = planned.short;
    let mut out = PoolPlan {
        delete: planned
            .delete
            .into_iter()
            .filter(|(name, _)| find(name).is_some())
            .collect(),
        create: planned
            .create
            .into_iter()
            .map(|replaces| NewClaim {
                spec: replacement(
                    &template,
                    &hash,
                    replaces.as_deref().and_then(find).map(|c| &**c),
                ),
                replaces,
                pods: Vec::new(),
            })
            .collect(),
        requeue: IDLE_RECHECK,
        ..PoolPlan::default()
    };
    match (spec.replicas, &observed.tenant) {
        (Some(_), _) => {
            if !out.create.is_empty() || !out.delete.is_empty() {
                out.requeue = BUSY_RECHECK;
            }
        }
        (None, None) => {}
        (None, Some(Err(problem))) => {
            out.ready = Some((*problem).clone());
            out.requeue = UNREACHABLE_RECHECK;
        }
        (None, Some(Ok(tenant))) => {
            // The claims planned above count as in flight: their room takes pending pods.
            let mut mine: Vec<Arc<NodeClaim>> = observed.claims.to_vec();
            mine.extend(out.create.iter().enumerate().map(|(i, c)| {
                let name = format!("+{i}");
                Arc::new(claim_object(
                    observed.pool,
                    &name,
                    c.spec.clone(),
                    c.replaces.as_deref(),
                ))
            }));
            let deleted_now: BTreeSet<String> = out.delete.iter().map(|(n, _)| n.clone()).collect();
            let d = dynamic::plan(&DynamicInput {
                name: observed.pool.metadata.name.as_deref().unwrap_or_default(),
                spec,
                template: &template,
                mine: &mine,
                deleted_now: &deleted_now,
                tenant: *tenant,
                catalogue: observed.catalogue,
                batch: observed.batch,
                now: observed.now,
            });
            let left = room.create.saturating_sub(out.create.len());
            let cut = d.create.len() > left;
            short += d.create.len().saturating_sub(left);
            out.create.extend(d.create.into_iter().take(left));
            // A claim gives way to a larger one only together with that one's creation.
            out.delete.extend(
                d.delete
                    .into_iter()
                    .filter(|(_, why)| !(cut && *why == DeleteReason::Outgrown)),
            );
            out.empty_since = d.empty_since;
            out.underutilized_since = d.underutilized_since;
            out.ready = Some(d.ready);
            out.limit = Some(d.limit);
            out.pending_pods = Some(d.pending_pods);
            out.requeue = d.requeue;
        }
    }
    if short > 0 {
        // More wanted than one reconcile may create: a bound of the namespace says so,
        // the batch only looks again soon.
        if let Some(v) = room.verdict(short) {
            out.limit = Some(v);
        }
        // Backing off, the pool looks again when the back-off ends (below).
        if registration.backing_off.is_none() {
            out.requeue = out.requeue.min(BUSY_RECHECK);
        }
    }
    if let Some(left) = registration.backing_off {
        out.requeue = out.requeue.min(left + Duration::from_millis(100));
    }
    out.registration = Some((registration.status, registration.verdict));
    // A hold of a duration that ends: the claim it protected may be disrupted then.
    if let Some(until) = protected.until {
        let left = until.as_millisecond() - observed.now.as_millisecond();
        let left = Duration::from_millis(u64::try_from(left).unwrap_or(0)) + Duration::from_secs(1);
        out.requeue = out.requeue.min(left);
    }
    out.version_drift_held = version_drift_held;
    out.host_maintenance_held = host_maintenance_held;
    out.repair = Some(repair.verdict());
    out.restart = repair.restart.clone();
    if let Some(keep) = repair_policy.keep_failed_for {
        out.keep = super::repair::kept(observed.claims, &out.delete, keep, observed.now);
    }
    if let Some(next) = repair.next_check {
        out.requeue = out.requeue.min(next);
    }
    out
}

#[cfg(test)]
pub(crate) mod tests;

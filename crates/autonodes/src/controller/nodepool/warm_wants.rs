//! A pool's warm VMs (`spec.warm`): how many it keeps and of which type, within its
//! namespace's room (core `warm::pool::plan_pool`), published in the
//! [`WarmIndex`](crate::controller::index::warm_vms::WarmIndex) for the NodeType controller that
//! keeps them; and the pool's `status.warm` and `WarmReady` condition from what was kept.

use autonodes_api::{NodePool, NodePoolWarm};
use autonodes_core::access::quota_admits;
use autonodes_core::catalogue::Catalogue;
use autonodes_core::pool::limits::NamespaceClaims;
use autonodes_core::pool::plan::{is_live, Verdict};
use autonodes_core::quota::{self, nodes_limit, Usage};
use autonodes_core::warm::pool::{self as pool_warm, namespace_room, plan_pool, PoolWarmPlan};
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;

use super::observe::Claims;
use crate::controller::context::{now, Context};
use crate::controller::index::warm_vms::PoolWant;

/// What the pool's status says of its warm VMs.
pub(super) struct PoolWarmState {
    /// `status.warm` (absent for a pool that keeps none and has none).
    pub status: Option<NodePoolWarm>,
    /// The `WarmReady` condition (absent: removed).
    pub condition: Option<Verdict>,
}

/// Plans the pool's warm VMs, publishes the plan for the NodeType controller (waking the
/// types it concerns when it changed), and says what the pool's status shows of them.
/// `problem`: why the pool cannot be worked on (it then keeps none).
pub(super) fn reconcile(
    ctx: &Context,
    pool: &NodePool,
    uid: &str,
    catalogue: &Catalogue,
    claims: &Claims,
    problem: Option<&Verdict>,
) -> PoolWarmState {
    let ns = pool.namespace().unwrap_or_default();
    let before = ctx.index.warm.pool_want(uid);
    let asked = pool_warm::replicas(&pool.spec);
    if asked == 0 && before.is_none() {
        return PoolWarmState {
            status: None,
            condition: None,
        };
    }
    let plan = match problem {
        Some(p) => PoolWarmPlan {
            asked,
            unavailable: (asked > 0)
                .then(|| format!("the pool cannot be worked on: {}", p.message)),
            ..PoolWarmPlan::default()
        },
        None => plan(ctx, pool, uid, before.as_ref(), catalogue, claims),
    };
    let want = PoolWant {
        namespace: ns.clone(),
        name: pool.name_any(),
        node_type: plan.node_type.clone(),
        replicas: plan.wanted,
        spec: pool.spec.clone(),
    };
    let key = want
        .node_type
        .as_deref()
        .map(|t| pool_warm::group_key(t, &autonodes_core::names::label_value(uid)));
    let short = key
        .as_deref()
        .is_some_and(|k| ctx.index.warm.counts(k, now()).current < want.replicas);
    if before.as_ref() != Some(&want) || short {
        // The types that keep (or kept) the pool's warm VMs look again (also to refill what
        // the pool's claims took).
        for t in [
            before.as_ref().and_then(|b| b.node_type.clone()),
            want.node_type.clone(),
        ]
        .into_iter()
        .flatten()
        {
            let _ = ctx.wakes.types.unbounded_send(ObjectRef::new(&t));
        }
        ctx.index.warm.want(uid, want);
    }
    state(ctx, uid, &plan, before.and_then(|b| b.node_type))
}

/// The pool's warm VMs as its namespace leaves room for them (`before`: what the pool asked
/// for last, whose warm VMs its claims may be about to take).
fn plan(
    ctx: &Context,
    pool: &NodePool,
    uid: &str,
    before: Option<&PoolWant>,
    catalogue: &Catalogue,
    claims: &Claims,
) -> PoolWarmPlan {
    let ns = pool.namespace().unwrap_or_default();
    let quotas = crate::controller::catalogue::prepared_quotas(ctx);
    // A claim of the pool that has no VM yet is about to take one of the pool's warm VMs
    // (which then becomes it): it is counted only beyond them, so its warm VM is not removed
    // to make room for it first.
    let label = autonodes_core::names::label_value(uid);
    let warm_now: i64 = before.and_then(|w| w.node_type.as_deref()).map_or(0, |t| {
        ctx.index
            .warm
            .counts(&pool_warm::group_key(t, &label), now())
            .current
    });
    let unlaunched = claims
        .mine
        .iter()
        .filter(|c| is_live(c) && autonodes_core::warm::about_to_launch(c))
        .count();
    let taking = unlaunched.min(usize::try_from(warm_now).unwrap_or(0));
    let live = claims
        .mine
        .iter()
        .chain(&claims.others)
        .filter(|c| autonodes_core::pool::limits::holds_a_place(c))
        .count()
        .saturating_sub(taking);
    let others = ctx.index.warm.namespace_warm(&ns, uid);
    let room = namespace_room(
        &NamespaceClaims {
            namespace: &ns,
            live,
            max: ctx.config.max_claims_per_namespace,
            quota_nodes: nodes_limit(&quotas, &ns),
            quota_missing: quota_admits(ctx.config.require_quota, &quotas, &ns).is_err(),
        },
        others.values().sum(),
    );
    let claimed = crate::controller::catalogue::claimed_counts(ctx);
    let all = crate::controller::catalogue::catalogue(ctx);
    let mut counts = ctx.ledger(|l| l.namespace_counts(&ns).clone());
    for (t, n) in &others {
        *counts.entry(t.clone()).or_default() += n;
    }
    plan_pool(&pool.spec, catalogue, &claimed, &room, |t, k| {
        let mut counts = counts.clone();
        *counts.entry(t.name.clone()).or_default() += k;
        let used = Usage::of_counts(&counts, |n| all.named(n));
        quota::admits(&quotas, &ns, &used, t)
    })
}

/// The status and condition of the pool's warm VMs (`before_type`: the type they were of),
/// from what the type's controller kept (core `warm::pool::pool_status`).
fn state(
    ctx: &Context,
    uid: &str,
    plan: &PoolWarmPlan,
    before_type: Option<String>,
) -> PoolWarmState {
    let at = now();
    let label = autonodes_core::names::label_value(uid);
    let counts = |t: &str| ctx.index.warm.counts(&pool_warm::group_key(t, &label), at);
    let here = plan.node_type.as_deref().map(counts).unwrap_or_default();
    // Warm VMs still kept on a type the pool left (being removed).
    let left = before_type
        .filter(|b| plan.node_type.as_deref() != Some(b.as_str()))
        .map(|b| counts(&b).current)
        .unwrap_or(0);
    let (status, condition) = pool_warm::pool_status(plan, here, left);
    if plan.asked == 0 && status.is_none() {
        ctx.index.warm.forget_pool(uid);
    }
    PoolWarmState {
        status,
        condition: condition.map(|(ok, reason, message)| Verdict::new(ok, reason, message)),
    }
}

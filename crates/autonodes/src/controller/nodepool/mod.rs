//! NodePool controller: keeps a pool's NodeClaims alive.
//!
//! - **Static pools** (`spec.replicas`): exactly N live claims from the pool's claim
//!   template. Scale-down removes the least valuable claims first (not yet Available, then
//!   newest) with at most as many Ready nodes draining at once as the disruption budgets
//!   allow (`autonodes_core::pool::budget`); Failed claims are
//!   deleted and replaced; claims made from an older template (or older than
//!   `disruption.expireAfter`) are rolled by surge: a replacement is created first and the
//!   old claim is deleted once the replacement is Available.
//! - **Dynamic pools** (no `replicas`): the tenant's unschedulable pods that a node of the
//!   pool would accept are packed first-fit-decreasing onto the free room of the tenant's
//!   existing and in-flight nodes, then onto new claims of the cheapest accepting node type,
//!   never beyond `spec.limits`. Nodes without non-DaemonSet pods for
//!   `disruption.consolidateAfter` are removed.
//!
//! Observe → plan → act. Every decision is pure and lives in [`autonodes_core::pool`]
//! ([`plan_pool`]: the claims to delete and create, the empty-since marks, the
//! conditions; [`pool_status`](autonodes_core::pool::status::pool_status): the status).
//! This module observes (`observe.rs`: the pool's claims from the shared claim store, with
//! the claims this process created, deleted or marked that the store does not show yet —
//! no LIST per reconcile, and never a second claim for one the store has not shown; the
//! tenant's pods and nodes, `tenant.rs`), asks the core, then writes what it planned
//! (`act.rs`).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use autonodes_core::pool::reconcile::{plan_pool, Observed};
use futures::channel::mpsc::{self};
use kube::runtime::controller::{Action, Config as RunConfig};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::Controller;
use kube::{Resource, ResourceExt};
use tokio::sync::Mutex;

use crate::controller::context::{now, Context};
use crate::controller::error::Error;
use autonodes_api::NodePool;

pub(crate) mod context;

mod act;
mod observe;
mod tenant;
pub(crate) mod tenant_cache;
pub(crate) mod wakeups;
mod warm_wants;

use crate::controller::reconciler::{self, Reconciler};
use context::PoolContext;

/// Runs the NodePool controller until `shutdown` resolves: a change of a pool's claims and
/// the tenant pod, node and DaemonSet watches of dynamic pools wake it, coalesced
/// ([`wakeups`]).
pub(crate) async fn run(
    ctx: Arc<Context>,
    reflectors: &crate::controller::reflectors::Reflectors,
    wakeups: mpsc::UnboundedReceiver<ObjectRef<NodePool>>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + Clone + 'static,
) {
    let wake = ctx.wakes.pools.clone();
    let pctx = Arc::new(PoolContext {
        ctx,
        pools: reflectors.pools.store(),
        wake,
        watches: Mutex::new(HashMap::new()),
        gauges: std::sync::Mutex::new(BTreeSet::new()),
    });
    let controller =
        Controller::for_shared_stream(reflectors.pools.applied(), reflectors.pools.store())
            .reconcile_on(wakeups::coalesced(
                reflectors.claims.touched_objects(),
                wakeups,
            ))
            // Shorter than the coalescing window, so the pools' wakes cannot hold it off.
            .with_config(RunConfig::default().debounce(Duration::from_millis(100)))
            .graceful_shutdown_on(shutdown);
    reconciler::run(controller, pctx).await;
}

impl Reconciler for PoolContext {
    type Object = NodePool;
    const NAME: &'static str = "nodepool";
    const DOING: &'static str = "reconciling NodePool";

    fn context(&self) -> &Context {
        &self.ctx
    }

    async fn reconcile(&self, pool: Arc<NodePool>) -> Result<Action, Error> {
        reconcile_pool(&pool, self).await
    }
}

async fn reconcile_pool(pool: &NodePool, pctx: &PoolContext) -> Result<Action, Error> {
    let ctx = &pctx.ctx;
    if !ctx.shards.acts_for(&pool.namespace().unwrap_or_default()) {
        // Another replica acts for the namespace (this one is woken when it gains it).
        tenant::forget_unused_watches(pctx).await;
        return Ok(Action::await_change());
    }
    if pool.meta().deletion_timestamp.is_some() {
        // The garbage collector removes the owned claims; their finalizers drain the nodes.
        tenant::forget_unused_watches(pctx).await;
        return Ok(Action::await_change());
    }
    ctx.wait_synced().await;
    let ns = pool.namespace().unwrap_or_default();
    let name = pool.name_any();
    let uid = pool
        .uid()
        .ok_or_else(|| Error::Missing(format!("NodePool {name}"), "metadata.uid"))?;

    // Observe (the claims last: the tenant may take a while to answer).
    let problem = observe::problem(ctx, pool).await;
    let tenant = match (&problem, pool.spec.replicas) {
        (None, None) => Some(observe::tenant(pctx, pool).await),
        _ => None,
    };
    // Only the types whose provider serves the pool's namespace.
    let catalogue = super::access::catalogue_for(ctx, &ns).await;
    let claims = observe::claims(ctx, &ns, &uid);
    let room = observe::room(ctx, &ns, &claims);
    let pools = pctx
        .pools
        .state_filter(|p| p.metadata.namespace.as_deref() == Some(ns.as_str()));

    // The repair defaults of the provider the pool names.
    let provider = pool.spec.provider_ref.as_deref().and_then(|p| {
        ctx.providers()
            .get(&kube::runtime::reflector::ObjectRef::new(p))
    });

    // Plan.
    let mut plan = plan_pool(&Observed {
        pool,
        claims: &claims.mine,
        problem: problem.as_ref(),
        tenant: tenant
            .as_ref()
            .map(|t| t.as_ref().map(|t| t.view(&claims.others, &pools))),
        catalogue: &catalogue,
        repair_after: ctx.config.node_repair_after,
        provider_repair: provider.as_ref().and_then(|p| p.spec.repair.as_ref()),
        batch: ctx.config.batch,
        room: &room,
        // Written with the pool's resourceVersion: a stale copy's write conflicts and the
        // pool is planned again on the current one, so no failure is lost or counted twice.
        registration: pool.status.as_ref().and_then(|s| s.registration.as_ref()),
        now: now(),
    });

    if let Some(vcluster) = pool.labels().get(autonodes_core::vcluster::LABEL_VCLUSTER) {
        let problem = ctx.index.import_problems.lock().ok().and_then(|p| {
            p.get(&format!("{ns}/{vcluster}"))
                .and_then(|m| m.get(&name))
                .cloned()
        });
        plan.imported = Some(autonodes_core::pool::status::import_verdict(
            problem.as_deref(),
        ));
    }

    // The pool's own warm VMs (the NodeType controller keeps them).
    let warm = warm_wants::reconcile(ctx, pool, &uid, &catalogue, &claims, problem.as_ref());
    plan.warm = (warm.status, warm.condition);

    // Act.
    act::carry_out(pctx, pool, &claims.mine, &plan).await?;
    act::write_status(pctx, pool, &claims.mine, &plan, &catalogue).await?;
    Ok(Action::requeue(plan.requeue))
}

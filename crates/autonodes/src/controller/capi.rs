//! The `capi.autonodes.io` mirror (issue 7): every NodePool with `spec.autoscaling` is
//! served as a Cluster-API-shaped [`MachinePool`] of the same name and namespace, and each
//! of its NodeClaims as a [`Machine`] of the claim's name, so the stock cluster-autoscaler's
//! `clusterapi` provider (started with `CAPI_GROUP=capi.autonodes.io`) drives the pool.
//!
//! What the mirror keeps:
//! - MachinePool annotations `<group>/cluster-api-autoscaler-node-group-{min,max}-size`
//!   from `spec.autoscaling`, only while the bounds are valid (`0 ≤ min`, `max − min ≥ 1`):
//!   the provider hides *every* node group when one carries a bad value. Bad bounds give the
//!   NodePool condition `Autoscaling=False` (reason `InvalidAutoscalingBounds`) and an Event.
//! - scale-from-zero annotations `capacity.cluster-autoscaler.kubernetes.io/*` from the node
//!   type a new claim of the pool would get (resources less `overhead.kubeReserved`, the
//!   labels and taints its node carries);
//! - `spec.providerIDList` = the providerIDs of the pool's joined nodes; status replicas;
//! - one Machine per claim (`spec.providerID`, `status.nodeRef` once joined,
//!   `status.failureMessage` for a Failed claim); a Machine's `<group>/delete-machine`
//!   annotation is copied onto its claim as `autonodes.io/delete-first`, which the NodePool
//!   controller removes first on scale-down — copied *before* any replica change is passed
//!   on, so the pool controller sees both together;
//! - `spec.replicas` of the NodePool and its MachinePool equal in both directions, the
//!   last writer winning (the rule and the order of the two writes:
//!   [`autonodes_core::capi`]).
//!
//! Every decision is made in [`autonodes_core::capi`]; this module reads the objects, asks
//! it, and writes what it decided.
//!
//! Removing `spec.autoscaling` (or `spec.replicas`) or deleting the NodePool deletes the
//! MachinePool and its Machines explicitly (a sweep handles pools that are gone), so no
//! garbage collector is needed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use autonodes_core::capi::{self, MachineWrite, NodePoolWrite, PoolMirror, ReplicaSource};
use autonodes_core::pool::{pack::MAX_PODS_PER_NODE, template_spec, ANNOTATION_DELETE_FIRST};
use futures::channel::mpsc;
use futures::StreamExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Config as RunConfig};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::Controller;
use kube::{Resource, ResourceExt};

use super::lenient;
use super::reflectors::Touched;
use crate::controller::context::Context;
use crate::controller::error::Error;
use autonodes_api::capi::*;
use autonodes_api::{NodeClaim, NodePool, NodeType};

pub(crate) mod context;

mod removal;
mod write;

use crate::controller::reconciler::{self, Reconciler};
use context::FIELD_MANAGER;
use context::{CapiContext, CLAIM_NAMES};

use removal::{remove_mirror, sweep_loop};
use write::{
    clear_condition, conflict_or, delete_machine, set_condition, write_mark,
    write_node_pool_replicas, write_status,
};

/// [`capi::owner_named`] of any object (the watches map Machines and claims to their pool).
fn owner_named<K: Resource>(obj: &K, kind: &str) -> Option<String> {
    capi::owner_named(obj.meta(), kind)
}

/// Runs the mirror until `shutdown` resolves. It is woken by its NodePools, their
/// MachinePools, Machines and NodeClaims, and NodeType changes (capacity annotations);
/// a sweep removes the mirrors of NodePools that are gone.
pub(crate) async fn run(
    ctx: Arc<Context>,
    reflectors: &crate::controller::reflectors::Reflectors,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + Clone + 'static,
) {
    let (sweep_tx, sweep_rx) = mpsc::unbounded::<String>();
    let pools = reflectors.pools.store();
    let deleted_tx = sweep_tx.clone();
    let deleted_pools = reflectors.pools.touched().filter_map(move |t| {
        if let Touched::Deleted(p) = t {
            let _ = deleted_tx.unbounded_send(p.namespace().unwrap_or_default());
        }
        futures::future::ready(None::<Arc<NodePool>>)
    });

    let cctx = Arc::new(CapiContext {
        ctx,
        machine_pools: reflectors.machine_pools.store(),
        machines: reflectors.machines.store(),
    });
    let sweeper = tokio::spawn(sweep_loop(cctx.clone(), sweep_rx));

    let autoscaled = {
        let pools = pools.clone();
        move || {
            pools
                .state()
                .into_iter()
                .filter(|p| p.spec.autoscaling.is_some())
                .map(|p| ObjectRef::from_obj(&*p))
                .collect::<Vec<_>>()
        }
    };
    // The pool store is the trigger of the NodePool controller too, and kube-runtime's
    // readiness future wakes only one of several waiters: start once it has listed.
    reflectors.pools.wait_synced().await;
    let controller = Controller::for_shared_stream(
        futures::stream::select(reflectors.pools.applied(), deleted_pools),
        pools,
    )
    .watches_shared_stream(
        reflectors.machine_pools.touched_objects(),
        |mp: Arc<MachinePool>| {
            Some(ObjectRef::new(&mp.name_any()).within(&mp.namespace().unwrap_or_default()))
        },
    )
    .watches_shared_stream(reflectors.machines.touched_objects(), |m: Arc<Machine>| {
        let ns = m.namespace().unwrap_or_default();
        owner_named(&*m, "MachinePool").map(|p| ObjectRef::new(&p).within(&ns))
    })
    .watches_shared_stream(reflectors.claims.touched_objects(), |c: Arc<NodeClaim>| {
        let ns = c.namespace().unwrap_or_default();
        owner_named(&*c, "NodePool").map(|p| ObjectRef::new(&p).within(&ns))
    })
    .watches_shared_stream(
        reflectors.types.touched_objects(),
        move |_t: Arc<NodeType>| autoscaled(),
    )
    .with_config(RunConfig::default().debounce(Duration::from_millis(200)))
    .graceful_shutdown_on(shutdown);
    reconciler::run(controller, cctx).await;
    drop(sweep_tx);
    sweeper.abort();
}

impl Reconciler for CapiContext {
    type Object = NodePool;
    const NAME: &'static str = "machinepool";
    const DOING: &'static str = "mirroring NodePool as MachinePool";

    fn context(&self) -> &Context {
        &self.ctx
    }

    async fn reconcile(&self, pool: Arc<NodePool>) -> Result<Action, Error> {
        reconcile_pool(&pool, self).await
    }
}

async fn reconcile_pool(pool: &NodePool, cctx: &CapiContext) -> Result<Action, Error> {
    let ctx = &cctx.ctx;
    if !ctx.shards.acts_for(&pool.namespace().unwrap_or_default()) {
        // Another replica acts for the namespace: look again in a while.
        return Ok(Action::requeue(crate::controller::shards::NOT_OURS_RETRY));
    }
    ctx.wait_synced().await;
    let ns = pool.namespace().unwrap_or_default();
    let name = pool.name_any();
    let (autoscaling, np_replicas) = match capi::pool_mirror(pool) {
        PoolMirror::Mirrored {
            autoscaling,
            replicas,
        } => (autoscaling, replicas),
        PoolMirror::Deleting => {
            remove_mirror(cctx, &ns, &name).await?;
            return Ok(Action::await_change());
        }
        PoolMirror::NotAutoscaled => {
            remove_mirror(cctx, &ns, &name).await?;
            clear_condition(ctx, pool).await?;
            return Ok(Action::await_change());
        }
        PoolMirror::ReplicasRequired(condition) => {
            remove_mirror(cctx, &ns, &name).await?;
            set_condition(ctx, pool, condition).await?;
            return Ok(Action::await_change());
        }
    };
    let bounds = capi::bounds_problem(autoscaling);
    let uid = pool
        .uid()
        .ok_or_else(|| Error::Missing(format!("NodePool {name}"), "metadata.uid"))?;

    // Read the MachinePool before the Machines: the autoscaler marks a Machine before it
    // lowers the replicas, so a lowered value read here comes with its mark below.
    let mp_api: Api<MachinePool> = Api::namespaced(ctx.client.clone(), &ns);
    let claims_api: Api<NodeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let existing = mp_api
        .get_opt(&name)
        .await
        .map_err(Error::kube(format!("reading MachinePool {ns}/{name}")))?;
    let machines: Vec<Machine> = lenient::list(
        &ctx.client,
        &ns,
        &ListParams::default().labels(&capi::machine_selector(&name)),
    )
    .await
    .map_err(Error::kube(format!("listing Machines of {ns}/{name}")))?;
    let claims: Vec<NodeClaim> = lenient::list::<NodeClaim>(
        &ctx.client,
        &ns,
        &ListParams::default().labels(&capi::claim_selector(&name)),
    )
    .await
    .map_err(Error::kube(format!("listing NodeClaims of {ns}/{name}")))?
    .into_iter()
    .filter(|c| capi::owned_by(&c.metadata, "NodePool", &uid))
    .collect();

    // 1. The autoscaler's choice of node, onto the claims, before any replica change.
    for mark in capi::delete_first_marks(&claims, &machines, &CLAIM_NAMES) {
        if write_mark(&claims_api, &ns, &mark).await? {
            // The pool controller reads the claim store, which may show the mark only after
            // the replica change below: it counts the mark from now on.
            if let Some(c) = claims.iter().find(|c| c.name_any() == mark.claim) {
                ctx.expect_claims(|e, at| {
                    e.annotated(c, ANNOTATION_DELETE_FIRST, mark.value.as_deref(), at)
                });
            }
            tracing::info!(nodepool = %name, namespace = %ns, claim = %mark.claim, marked = mark.value.is_some(), "delete-machine mirrored onto the claim");
        }
    }

    // 2. Replicas, both ways.
    let np_marker = capi::parse_marker(&pool.metadata);
    let sync = capi::sync_replicas(
        np_replicas,
        np_marker,
        existing.as_ref().and_then(|m| m.spec.replicas),
        existing
            .as_ref()
            .and_then(|m| capi::parse_marker(&m.metadata)),
    );
    let np_write = capi::node_pool_write(np_replicas, np_marker, sync);
    let pools_api: Api<NodePool> = Api::namespaced(ctx.client.clone(), &ns);
    let mut pool_rv = pool.resource_version();
    if np_write == NodePoolWrite::Scale {
        pool_rv =
            write_node_pool_replicas(&pools_api, &ns, &name, pool_rv, sync.target, true).await?;
        tracing::info!(nodepool = %name, namespace = %ns, from = np_replicas, to = sync.target, source = ?sync.source, "NodePool replicas set from its MachinePool");
        ctx.event(
            pool,
            EventType::Normal,
            "ScaledByMachinePool",
            "Scale",
            format!(
                "spec.replicas {np_replicas} → {} from MachinePool {CAPI_GROUP}/{name}",
                sync.target
            ),
        )
        .await;
    }
    if sync.source == ReplicaSource::ConflictNodePoolWins {
        ctx.event(
            pool,
            EventType::Warning,
            "ReplicasConflict",
            "Scale",
            format!(
                "NodePool and MachinePool replicas changed at once; the NodePool's {} wins",
                sync.target
            ),
        )
        .await;
    }

    // 3. The MachinePool.
    let desired = capi::desired_machine_pool(
        pool,
        &uid,
        &claims,
        bounds.is_none(),
        sync.target,
        scale_from_zero(ctx, pool),
    );
    let mp = match &existing {
        Some(mp) if !capi::needs_update(mp, &desired) => mp.clone(),
        _ => {
            let body = capi::machine_pool_body(&desired, existing.as_ref())
                .map_err(|e| Error::Internal(format!("serializing MachinePool: {e}")))?;
            let mp = mp_api
                .patch(
                    &name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&body),
                )
                .await
                .map_err(|e| conflict_or(e, format!("applying MachinePool {ns}/{name}")))?;
            if existing.is_none() {
                tracing::info!(nodepool = %name, namespace = %ns, replicas = sync.target, "MachinePool created");
            }
            mp
        }
    };
    if np_write == NodePoolWrite::Mark {
        pool_rv =
            write_node_pool_replicas(&pools_api, &ns, &name, pool_rv, sync.target, false).await?;
        if sync.source == ReplicaSource::NodePool && existing.is_some() {
            tracing::info!(nodepool = %name, namespace = %ns, replicas = sync.target, "MachinePool replicas set from its NodePool");
        }
    }

    // 4. Machines.
    let mp_uid = mp
        .uid()
        .ok_or_else(|| Error::Missing(format!("MachinePool {name}"), "metadata.uid"))?;
    sync_machines(ctx, pool, &mp_uid, &claims, &machines).await?;

    // 5. Status of the MachinePool.
    let status =
        capi::machine_pool_status(&mp, &claims, sync.target, crate::controller::context::now());
    if mp.status.as_ref() != Some(&status) {
        write_status(&mp_api, &mp, &status).await?;
    }

    // 6. The NodePool's condition.
    let mut fresh = pool.clone();
    fresh.metadata.resource_version = pool_rv;
    set_condition(
        ctx,
        &fresh,
        capi::mirrored_condition(&name, autoscaling, bounds),
    )
    .await?;
    Ok(Action::requeue(Duration::from_secs(60)))
}

/// The scale-from-zero annotations of the pool ([`capi::scale_from_zero`]): from the
/// catalogue, the claims per node type (the ledger) and the NodeTypes'
/// `spec.overhead`.
fn scale_from_zero(ctx: &Context, pool: &NodePool) -> BTreeMap<String, String> {
    let catalogue = super::catalogue::catalogue(ctx);
    let claimed = super::catalogue::claimed_counts(ctx);
    capi::scale_from_zero(
        &catalogue,
        &template_spec(&pool.spec),
        &claimed,
        |t| {
            ctx.types()
                .get(&ObjectRef::new(t))
                .and_then(|nt| nt.spec.overhead.clone())
        },
        MAX_PODS_PER_NODE,
    )
}

/// Creates, updates and deletes the Machines of a pool as [`capi::plan_machines`] decides,
/// and writes the status of each.
async fn sync_machines(
    ctx: &Context,
    pool: &NodePool,
    mp_uid: &str,
    claims: &[NodeClaim],
    machines: &[Machine],
) -> Result<(), Error> {
    let ns = pool.namespace().unwrap_or_default();
    let pool_name = pool.name_any();
    let api: Api<Machine> = Api::namespaced(ctx.client.clone(), &ns);
    let plan = capi::plan_machines(pool, mp_uid, claims, machines, &CLAIM_NAMES);
    for name in &plan.delete {
        if delete_machine(&api, &ns, name).await? {
            tracing::info!(nodepool = %pool_name, namespace = %ns, machine = %name, "Machine of a removed claim deleted");
        }
    }
    for planned in &plan.machines {
        let name = &planned.name;
        let applied;
        let machine = match &planned.write {
            MachineWrite::Keep(m) => *m,
            MachineWrite::Create(body) | MachineWrite::Update(body) => {
                applied = api
                    .patch(
                        name,
                        &PatchParams::apply(FIELD_MANAGER).force(),
                        &Patch::Apply(body),
                    )
                    .await
                    .map_err(|e| conflict_or(e, format!("applying Machine {ns}/{name}")))?;
                if matches!(planned.write, MachineWrite::Create(_)) {
                    tracing::info!(nodepool = %pool_name, namespace = %ns, machine = %name, "Machine created");
                }
                &applied
            }
        };
        if machine.status.as_ref() != Some(&planned.status) {
            write_status(&api, machine, &planned.status).await?;
        }
    }
    Ok(())
}

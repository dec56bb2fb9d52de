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
//!   on, so the pool controller sees both together.
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
//! other object's marker second, each conditional on the resourceVersion read, so a crash
//! or a conflict between the two writes is resolved by the same rule on the next reconcile
//! and the two objects never fight.
//!
//! Removing `spec.autoscaling` (or `spec.replicas`) or deleting the NodePool deletes the
//! MachinePool and its Machines explicitly (a sweep handles pools that are gone), so no
//! garbage collector is needed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use autonodes_core::pool::{pack::MAX_PODS_PER_NODE, template_spec, ANNOTATION_DELETE_FIRST};

use crate::names::label_value;
use futures::channel::mpsc;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ObjectReference, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Config as RunConfig};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, Controller, WatchStreamExt};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::lenient::{self, Lenient};
use super::{Context, Error};
use crate::api::capi::*;
use crate::api::{
    Autoscaling, NodeClaim, NodeClaimPhase, NodeClaimSpec, NodePool, NodeType, LABEL_MANAGED_BY,
    LABEL_NODECLAIM, LABEL_NODEPOOL, MANAGED_BY,
};
use crate::conditions::{self, status_of};
use crate::resources::{self, ResourceAmounts};
use crate::scheduling::{self, ClaimRequest, PreparedType};

/// The name of the controlling owner of kind `kind` (owner references hold full names;
/// labels may hold shortened ones).
fn owner_named<K: Resource>(obj: &K, kind: &str) -> Option<String> {
    obj.meta()
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == kind && o.controller == Some(true))
        .map(|o| o.name.clone())
}

/// Field manager of the mirror's writes (distinct from the other controllers', so
/// server-side apply never drops what they own).
pub const FIELD_MANAGER: &str = "autonodes-capi";
/// NodePool condition: whether the pool is mirrored for the cluster-autoscaler.
pub const AUTOSCALING: &str = "Autoscaling";
/// Reason of `Autoscaling=False` for bad `spec.autoscaling` bounds.
pub const REASON_INVALID_BOUNDS: &str = "InvalidAutoscalingBounds";
/// Reason of `Autoscaling=False` for a pool without `spec.replicas`.
pub const REASON_REPLICAS_REQUIRED: &str = "ReplicasRequired";
/// Reason of `Autoscaling=True`.
pub const REASON_MIRRORED: &str = "MachinePoolMirrored";

// ---------------------------------------------------------------------------------------
// Pure parts
// ---------------------------------------------------------------------------------------

/// Why `spec.autoscaling` cannot be handed to the cluster-autoscaler, if it cannot: the
/// provider needs `0 ≤ min ≤ max` and refuses groups with `max − min < 1`.
pub fn bounds_problem(a: &Autoscaling) -> Option<String> {
    if a.min_replicas < 0 || a.max_replicas < 0 {
        return Some(format!(
            "spec.autoscaling: minReplicas {} and maxReplicas {} must not be negative",
            a.min_replicas, a.max_replicas
        ));
    }
    if a.max_replicas < a.min_replicas {
        return Some(format!(
            "spec.autoscaling: maxReplicas {} is below minReplicas {}",
            a.max_replicas, a.min_replicas
        ));
    }
    if a.max_replicas - a.min_replicas < 1 {
        return Some(format!(
            "spec.autoscaling: maxReplicas {} must exceed minReplicas {} by at least 1 (the cluster-autoscaler ignores a group that cannot scale)",
            a.max_replicas, a.min_replicas
        ));
    }
    None
}

/// Which object's replica value wins a sync.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplicaSource {
    /// Both already agree.
    Agreed,
    /// The NodePool's value goes to the MachinePool (also: the MachinePool is new).
    NodePool,
    /// The MachinePool's value goes to the NodePool.
    MachinePool,
    /// Both changed concurrently; the NodePool wins.
    ConflictNodePoolWins,
}

/// The outcome of [`sync_replicas`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaSync {
    /// The value both objects get.
    pub target: i32,
    /// Whose value it is.
    pub source: ReplicaSource,
}

/// Decides the replicas of a NodePool (`np`, with its marker `np_synced`) and its
/// MachinePool (`mp`, `mp_synced`; `None` when there is no MachinePool yet). See the
/// module documentation for the rule.
pub fn sync_replicas(
    np: i32,
    np_synced: Option<i32>,
    mp: Option<i32>,
    mp_synced: Option<i32>,
) -> ReplicaSync {
    let Some(mp) = mp else {
        return ReplicaSync {
            target: np,
            source: ReplicaSource::NodePool,
        };
    };
    if mp == np {
        return ReplicaSync {
            target: np,
            source: ReplicaSource::Agreed,
        };
    }
    let np_changed = np_synced != Some(np);
    let mp_changed = mp_synced != Some(mp);
    let (target, source) = match (np_changed, mp_changed) {
        (false, true) => (mp, ReplicaSource::MachinePool),
        (true, false) | (false, false) => (np, ReplicaSource::NodePool),
        (true, true) if mp_synced == Some(np) => (mp, ReplicaSource::MachinePool),
        (true, true) if np_synced == Some(mp) => (np, ReplicaSource::NodePool),
        (true, true) => (np, ReplicaSource::ConflictNodePoolWins),
    };
    ReplicaSync { target, source }
}

/// A taint as the provider's `taints` annotation writes it: `key=value:Effect`, or
/// `key:Effect` without a value.
pub fn format_taint(t: &Taint) -> String {
    match t.value.as_deref().filter(|v| !v.is_empty()) {
        Some(v) => format!("{}={v}:{}", t.key, t.effect),
        None => format!("{}:{}", t.key, t.effect),
    }
}

/// The scale-from-zero annotations of a pool whose new claims get node type `t`:
/// allocatable cpu and memory (resources less `reserved`), `maxPods`, GPUs (the first
/// extended resource whose name contains `gpu`), and the labels and taints (without
/// startup taints, which go once the node is ready) a node of the pool carries.
pub fn capacity_annotations(
    t: &PreparedType,
    reserved: &ResourceAmounts,
    template: &NodeClaimSpec,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let cpu = (t.amounts.cpu_millis() - reserved.cpu_millis()).max(0);
    let memory = (t.amounts.memory_bytes() - reserved.memory_bytes()).max(0);
    out.insert(CAPACITY_CPU.to_string(), resources::format_cpu(cpu));
    out.insert(
        CAPACITY_MEMORY.to_string(),
        resources::format_memory(memory),
    );
    out.insert(CAPACITY_MAX_PODS.to_string(), MAX_PODS_PER_NODE.to_string());
    if let Some((name, milli)) = t.amounts.extended().find(|(n, _)| n.contains("gpu")) {
        let count = (milli - reserved.milli(name)).max(0) / 1000;
        out.insert(CAPACITY_GPU_COUNT.to_string(), count.to_string());
        out.insert(CAPACITY_GPU_TYPE.to_string(), name.to_string());
    }
    let properties = scheduling::node_properties(t, None, template);
    if let Ok(labels) =
        scheduling::node_labels(&properties, None, &template.labels, &BTreeMap::new())
    {
        let text: Vec<String> = labels
            .all()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        out.insert(CAPACITY_LABELS.to_string(), text.join(","));
    }
    if let Ok(taints) = scheduling::node_taints(t, None, template) {
        if !taints.taints.is_empty() {
            let text: Vec<String> = taints.taints.iter().map(format_taint).collect();
            out.insert(CAPACITY_TAINTS.to_string(), text.join(","));
        }
    }
    out
}

/// Every annotation key the mirror may set on a MachinePool (those it does not set this
/// time are removed).
const OWNED_POOL_ANNOTATIONS: &[&str] = &[
    ANNOTATION_MIN_SIZE,
    ANNOTATION_MAX_SIZE,
    ANNOTATION_SYNCED_REPLICAS,
    CAPACITY_CPU,
    CAPACITY_MEMORY,
    CAPACITY_MAX_PODS,
    CAPACITY_GPU_COUNT,
    CAPACITY_GPU_TYPE,
    CAPACITY_LABELS,
    CAPACITY_TAINTS,
];

/// The Cluster API phase of a Machine for its claim.
pub fn machine_phase(claim: &NodeClaim) -> &'static str {
    if claim.metadata.deletion_timestamp.is_some() {
        return "Deleting";
    }
    match claim.status.as_ref().and_then(|s| s.phase) {
        None | Some(NodeClaimPhase::Pending) => "Pending",
        Some(NodeClaimPhase::Provisioning) => "Provisioning",
        Some(NodeClaimPhase::Joining) => "Provisioned",
        Some(NodeClaimPhase::Available) => "Running",
        Some(NodeClaimPhase::Failed) => "Failed",
        Some(NodeClaimPhase::Terminating) => "Deleting",
    }
}

/// The Machine status mirroring `claim`.
pub fn machine_status(claim: &NodeClaim) -> MachineStatus {
    let s = claim.status.clone().unwrap_or_default();
    let failed = s.phase == Some(NodeClaimPhase::Failed);
    let failure = failed
        .then(|| {
            conditions::get(&s.conditions, super::nodeclaim::READY)
                .filter(|c| c.status != conditions::TRUE)
                .or_else(|| s.conditions.iter().find(|c| c.status != conditions::TRUE))
                .map(|c| (c.reason.clone(), c.message.clone()))
        })
        .flatten();
    MachineStatus {
        phase: Some(machine_phase(claim).to_string()),
        node_ref: s.node_name.as_ref().map(|n| ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(n.clone()),
            ..ObjectReference::default()
        }),
        bootstrap_ready: s.vm_name.is_some(),
        infrastructure_ready: conditions::is_true(&s.conditions, super::nodeclaim::PROVISIONED),
        failure_reason: failure.as_ref().map(|f| f.0.clone()),
        failure_message: failure
            .map(|f| f.1)
            .or_else(|| failed.then(|| "the NodeClaim Failed".to_string())),
    }
}

fn is_live(c: &NodeClaim) -> bool {
    c.metadata.deletion_timestamp.is_none()
        && c.status.as_ref().and_then(|s| s.phase) != Some(NodeClaimPhase::Failed)
}

fn is_available(c: &NodeClaim) -> bool {
    is_live(c) && c.status.as_ref().and_then(|s| s.phase) == Some(NodeClaimPhase::Available)
}

/// The providerIDs of the claims' joined nodes (live claims only), sorted.
pub fn provider_id_list(claims: &[NodeClaim]) -> Vec<String> {
    let mut ids: Vec<String> = claims
        .iter()
        .filter(|c| is_live(c))
        .filter_map(|c| {
            let s = c.status.as_ref()?;
            s.node_name.as_ref()?;
            s.provider_id.clone()
        })
        .collect();
    ids.sort();
    ids
}

fn parse_marker(meta: &kube::api::ObjectMeta) -> Option<i32> {
    meta.annotations
        .as_ref()?
        .get(ANNOTATION_SYNCED_REPLICAS)?
        .parse()
        .ok()
}

// ---------------------------------------------------------------------------------------
// The controller
// ---------------------------------------------------------------------------------------

/// Shared state of the mirror.
pub struct CapiContext {
    /// The controllers' shared context.
    pub ctx: Arc<Context>,
    /// Every NodePool (the mirror's own reflector).
    pub pools: Store<NodePool>,
    /// Every MachinePool.
    pub machine_pools: Store<MachinePool>,
    /// Every Machine.
    pub machines: Store<Machine>,
}

/// Runs the mirror until `shutdown` resolves. It is woken by its NodePools, their
/// MachinePools, Machines and NodeClaims, and NodeType changes (capacity annotations);
/// a sweep removes the mirrors of NodePools that are gone.
pub async fn run(
    ctx: Arc<Context>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + Clone + 'static,
) {
    let client = ctx.client.clone();
    let (sweep_tx, sweep_rx) = mpsc::unbounded::<String>();

    let pool_writer = reflector::store::Writer::<NodePool>::default();
    let pools = pool_writer.as_reader();
    let deleted_tx = sweep_tx.clone();
    // NodePools are reported by the pool controller's watch; MachinePools here.
    let pool_stream = lenient::reflect(&client, pool_writer, None)
        .inspect_ok(move |event| {
            if let watcher::Event::Delete(p) = event {
                let _ = deleted_tx.unbounded_send(p.namespace().unwrap_or_default());
            }
        })
        .applied_objects();

    let mp_writer = reflector::store::Writer::<MachinePool>::default();
    let machine_pools = mp_writer.as_reader();
    let mp_stream =
        lenient::reflect(&client, mp_writer, Some(ctx.reports.clone())).touched_objects();
    let m_writer = reflector::store::Writer::<Machine>::default();
    let machines = m_writer.as_reader();
    let m_stream = lenient::reflect(&client, m_writer, None).touched_objects();

    let cctx = Arc::new(CapiContext {
        ctx,
        pools: pools.clone(),
        machine_pools,
        machines,
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
    Controller::for_stream(pool_stream, pools)
        .watches_stream(mp_stream, |mp: MachinePool| {
            Some(ObjectRef::new(&mp.name_any()).within(&mp.namespace().unwrap_or_default()))
        })
        .watches_stream(m_stream, |m: Machine| {
            let ns = m.namespace().unwrap_or_default();
            owner_named(&m, "MachinePool").map(|p| ObjectRef::new(&p).within(&ns))
        })
        .watches(
            lenient::api_all::<NodeClaim>(&client),
            super::watch_config(),
            |c: Lenient<NodeClaim>| {
                let ns = c.namespace().unwrap_or_default();
                owner_named(&c, "NodePool").map(|p| ObjectRef::new(&p).within(&ns))
            },
        )
        .watches(
            lenient::api_all::<NodeType>(&client),
            super::watch_config(),
            move |_t: Lenient<NodeType>| autoscaled(),
        )
        .with_config(RunConfig::default().debounce(Duration::from_millis(200)))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, cctx)
        .for_each(super::log_run_error)
        .await;
    drop(sweep_tx);
    sweeper.abort();
}

/// Reconciles the mirror of one NodePool.
pub async fn reconcile(pool: Arc<NodePool>, cctx: Arc<CapiContext>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = reconcile_pool(&pool, &cctx).await;
    cctx.ctx
        .metrics
        .observe_reconcile("machinepool", started, &result);
    result
}

/// Logs the error; the pool is retried with backoff.
pub fn error_policy(pool: Arc<NodePool>, error: &Error, _cctx: Arc<CapiContext>) -> Action {
    if error.is_conflict() {
        tracing::debug!(%error, "stale read; mirroring the pool again");
    } else {
        tracing::warn!(
            nodepool = %pool.name_any(),
            namespace = %pool.namespace().unwrap_or_default(),
            %error,
            "mirroring NodePool as MachinePool failed"
        );
    }
    super::error_requeue(error)
}

/// Parameters of the mirror's merge patches (its own field manager).
fn merge_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    }
}

fn conflict_or(e: kube::Error, context: String) -> Error {
    match e {
        kube::Error::Api(s) if s.code == 409 => Error::Conflict(context),
        source => Error::Kube { context, source },
    }
}

async fn reconcile_pool(pool: &NodePool, cctx: &CapiContext) -> Result<Action, Error> {
    let ctx = &cctx.ctx;
    ctx.wait_synced().await;
    let ns = pool.namespace().unwrap_or_default();
    let name = pool.name_any();
    if pool.meta().deletion_timestamp.is_some() {
        remove_mirror(cctx, &ns, &name).await?;
        return Ok(Action::await_change());
    }
    let Some(autoscaling) = pool.spec.autoscaling.clone() else {
        remove_mirror(cctx, &ns, &name).await?;
        clear_condition(ctx, pool).await?;
        return Ok(Action::await_change());
    };
    let Some(np_replicas) = pool.spec.replicas else {
        remove_mirror(cctx, &ns, &name).await?;
        set_condition(
            ctx,
            pool,
            false,
            REASON_REPLICAS_REQUIRED,
            "spec.autoscaling needs spec.replicas (set it, e.g. to minReplicas): the cluster-autoscaler drives a pool through its replicas, and a pool without them grows by itself".into(),
        )
        .await?;
        return Ok(Action::await_change());
    };
    let bounds = bounds_problem(&autoscaling);
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
        &ListParams::default().labels(&format!("{LABEL_POOL_NAME}={}", label_value(&name))),
    )
    .await
    .map_err(Error::kube(format!("listing Machines of {ns}/{name}")))?;
    let claims: Vec<NodeClaim> = lenient::list::<NodeClaim>(
        &ctx.client,
        &ns,
        &ListParams::default().labels(&format!("{LABEL_NODEPOOL}={}", label_value(&name))),
    )
    .await
    .map_err(Error::kube(format!("listing NodeClaims of {ns}/{name}")))?
    .into_iter()
    .filter(|c| {
        c.owner_references()
            .iter()
            .any(|o| o.kind == "NodePool" && o.uid == uid)
    })
    .collect();

    // 1. The autoscaler's choice of node, onto the claims, before any replica change.
    for claim in &claims {
        let Some(machine) = machines.iter().find(|m| m.name_any() == claim.name_any()) else {
            continue;
        };
        let want = machine.annotations().get(ANNOTATION_DELETE_MACHINE);
        let have = claim.annotations().get(ANNOTATION_DELETE_FIRST);
        if want != have {
            let value = want.map_or(serde_json::Value::Null, |v| json!(v));
            let patch = json!({"metadata": {"annotations": {ANNOTATION_DELETE_FIRST: value}}});
            match claims_api
                .patch(
                    &claim.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
            {
                Ok(_) => {
                    tracing::info!(nodepool = %name, namespace = %ns, claim = %claim.name_any(), marked = want.is_some(), "delete-machine mirrored onto the claim");
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    return Err(Error::Kube {
                        context: format!("marking NodeClaim {ns}/{}", claim.name_any()),
                        source: e,
                    })
                }
            }
        }
    }

    // 2. Replicas, both ways.
    let sync = sync_replicas(
        np_replicas,
        parse_marker(&pool.metadata),
        existing.as_ref().and_then(|m| m.spec.replicas),
        existing.as_ref().and_then(|m| parse_marker(&m.metadata)),
    );
    let pools_api: Api<NodePool> = Api::namespaced(ctx.client.clone(), &ns);
    let mut pool_rv = pool.resource_version();
    let np_marker_ok = parse_marker(&pool.metadata) == Some(sync.target);
    if sync.target != np_replicas {
        let patch = json!({
            "metadata": {"resourceVersion": pool_rv,
                         "annotations": {ANNOTATION_SYNCED_REPLICAS: sync.target.to_string()}},
            "spec": {"replicas": sync.target},
        });
        let p = pools_api
            .patch(&name, &merge_params(), &Patch::Merge(&patch))
            .await
            .map_err(|e| conflict_or(e, format!("scaling NodePool {ns}/{name}")))?;
        pool_rv = p.resource_version();
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
    let desired = desired_machine_pool(cctx, pool, &uid, &claims, bounds.is_none(), sync.target);
    let mp = match &existing {
        Some(mp) if !needs_update(mp, &desired) => mp.clone(),
        _ => {
            let mut body = serde_json::to_value(&desired)
                .map_err(|e| Error::Internal(format!("serializing MachinePool: {e}")))?;
            if let Some(mp) = &existing {
                body["metadata"]["resourceVersion"] = json!(mp.resource_version());
            }
            if let Some(o) = body.as_object_mut() {
                o.remove("status");
            }
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
    if !np_marker_ok && sync.target == np_replicas {
        let patch = json!({
            "metadata": {"resourceVersion": pool_rv,
                         "annotations": {ANNOTATION_SYNCED_REPLICAS: sync.target.to_string()}},
        });
        let p = pools_api
            .patch(&name, &merge_params(), &Patch::Merge(&patch))
            .await
            .map_err(|e| conflict_or(e, format!("marking NodePool {ns}/{name}")))?;
        pool_rv = p.resource_version();
        if sync.source == ReplicaSource::NodePool && existing.is_some() {
            tracing::info!(nodepool = %name, namespace = %ns, replicas = sync.target, "MachinePool replicas set from its NodePool");
        }
    }

    // 4. Machines.
    let mp_uid = mp
        .uid()
        .ok_or_else(|| Error::Missing(format!("MachinePool {name}"), "metadata.uid"))?;
    sync_machines(cctx, pool, &mp_uid, &claims, &machines).await?;

    // 5. Status of the MachinePool.
    let status = machine_pool_status(&mp, &claims, sync.target);
    if mp.status.as_ref() != Some(&status) {
        let patch = json!({
            "apiVersion": MachinePool::api_version(&()),
            "kind": "MachinePool",
            "metadata": {"resourceVersion": mp.resource_version()},
            "status": status,
        });
        mp_api
            .patch_status(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
            .map_err(|e| conflict_or(e, format!("writing status of MachinePool {ns}/{name}")))?;
    }

    // 6. The NodePool's condition.
    let mut fresh = pool.clone();
    fresh.metadata.resource_version = pool_rv;
    match bounds {
        Some(problem) => {
            set_condition(ctx, &fresh, false, REASON_INVALID_BOUNDS, problem).await?;
        }
        None => {
            set_condition(
                ctx,
                &fresh,
                true,
                REASON_MIRRORED,
                format!(
                    "mirrored as MachinePool {CAPI_GROUP}/{name} for the cluster-autoscaler (min {}, max {})",
                    autoscaling.min_replicas, autoscaling.max_replicas
                ),
            )
            .await?;
        }
    }
    Ok(Action::requeue(Duration::from_secs(60)))
}

fn desired_machine_pool(
    cctx: &CapiContext,
    pool: &NodePool,
    pool_uid: &str,
    claims: &[NodeClaim],
    bounds_ok: bool,
    replicas: i32,
) -> MachinePool {
    let name = pool.name_any();
    let cluster = pool.spec.v_cluster_ref.name.clone();
    let mut annotations = BTreeMap::new();
    if let (true, Some(a)) = (bounds_ok, pool.spec.autoscaling.as_ref()) {
        annotations.insert(ANNOTATION_MIN_SIZE.to_string(), a.min_replicas.to_string());
        annotations.insert(ANNOTATION_MAX_SIZE.to_string(), a.max_replicas.to_string());
    }
    annotations.insert(ANNOTATION_SYNCED_REPLICAS.to_string(), replicas.to_string());
    annotations.extend(scale_from_zero(&cctx.ctx, pool));
    let labels = BTreeMap::from([
        (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
        (LABEL_NODEPOOL.to_string(), label_value(&name)),
        (LABEL_CLUSTER_NAME.to_string(), label_value(&cluster)),
    ]);
    let mut mp = MachinePool::new(
        &name,
        MachinePoolSpec {
            cluster_name: cluster.clone(),
            replicas: Some(replicas),
            template: MachineTemplateSpec {
                metadata: MachineTemplateMetadata {
                    labels: BTreeMap::from([
                        (LABEL_POOL_NAME.to_string(), label_value(&name)),
                        (LABEL_CLUSTER_NAME.to_string(), label_value(&cluster)),
                    ]),
                    annotations: BTreeMap::new(),
                },
                spec: MachineTemplateMachineSpec {
                    cluster_name: cluster,
                    bootstrap: Bootstrap::default(),
                    version: None,
                },
            },
            provider_id_list: provider_id_list(claims),
        },
    );
    mp.metadata.namespace = pool.namespace();
    mp.metadata.labels = Some(labels);
    mp.metadata.annotations = Some(annotations);
    mp.metadata.owner_references = Some(vec![OwnerReference {
        api_version: NodePool::api_version(&()).into_owned(),
        kind: NodePool::kind(&()).into_owned(),
        name,
        uid: pool_uid.to_string(),
        controller: Some(true),
        block_owner_deletion: None,
    }]);
    mp
}

/// Whether `existing` lacks anything of `desired` (labels, the mirror's annotations,
/// owner, spec).
fn needs_update(existing: &MachinePool, desired: &MachinePool) -> bool {
    let have_labels = existing.metadata.labels.clone().unwrap_or_default();
    let labels_ok = desired
        .metadata
        .labels
        .iter()
        .flatten()
        .all(|(k, v)| have_labels.get(k) == Some(v));
    let have = existing.metadata.annotations.clone().unwrap_or_default();
    let want = desired.metadata.annotations.clone().unwrap_or_default();
    let annotations_ok = OWNED_POOL_ANNOTATIONS
        .iter()
        .all(|k| have.get(*k) == want.get(*k));
    let owner_ok = desired
        .metadata
        .owner_references
        .iter()
        .flatten()
        .all(|o| existing.owner_references().iter().any(|e| e.uid == o.uid));
    !(labels_ok && annotations_ok && owner_ok && existing.spec == desired.spec)
}

/// The scale-from-zero annotations for the node type a new claim of the pool would get
/// now (the cheapest fitting type with capacity, else the cheapest fitting type); none when
/// no type fits.
fn scale_from_zero(ctx: &Context, pool: &NodePool) -> BTreeMap<String, String> {
    let template = template_spec(&pool.spec);
    let Ok(request) = ClaimRequest::new(&template, None) else {
        return BTreeMap::new();
    };
    let catalogue = super::nodeclaim::catalogue(ctx);
    let claimed = match ctx.scheduling.try_lock() {
        Ok(r) => super::nodeclaim::claimed_counts(ctx, &r),
        Err(_) => BTreeMap::new(),
    };
    let chosen = scheduling::choose(&catalogue, &request, &claimed)
        .or_else(|_| scheduling::choose(&catalogue, &request, &BTreeMap::new()));
    let Ok(t) = chosen else {
        return BTreeMap::new();
    };
    let reserved = ctx
        .types
        .get(&ObjectRef::new(&t.name))
        .and_then(|nt| nt.spec.overhead.clone())
        .and_then(|o| ResourceAmounts::from_list(&o.kube_reserved).ok())
        .unwrap_or_default();
    capacity_annotations(t, &reserved, &template)
}

fn machine_pool_status(mp: &MachinePool, claims: &[NodeClaim], desired: i32) -> MachinePoolStatus {
    let live = claims.iter().filter(|c| is_live(c)).count();
    let ready = claims.iter().filter(|c| is_available(c)).count();
    let live = i32::try_from(live).unwrap_or(i32::MAX);
    let ready = i32::try_from(ready).unwrap_or(i32::MAX);
    let mut node_refs: Vec<ObjectReference> = claims
        .iter()
        .filter(|c| is_live(c))
        .filter_map(|c| c.status.as_ref()?.node_name.clone())
        .map(|n| ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(n),
            ..ObjectReference::default()
        })
        .collect();
    node_refs.sort_by(|a, b| a.name.cmp(&b.name));
    let phase = if live < desired || ready < live.min(desired) {
        "ScalingUp"
    } else if live > desired {
        "ScalingDown"
    } else {
        "Running"
    };
    let old = mp.status.clone().unwrap_or_default();
    let mut conditions_list: Vec<Condition> = old.conditions.clone();
    let ok = ready == desired && live == desired;
    conditions::set(
        &mut conditions_list,
        "Ready",
        status_of(ok),
        if ok { "AllMachinesReady" } else { phase },
        format!("{ready} of {desired} machines Ready, {live} live"),
        mp.metadata.generation,
        super::now(),
    );
    MachinePoolStatus {
        observed_generation: mp.metadata.generation,
        replicas: live,
        ready_replicas: ready,
        available_replicas: ready,
        unavailable_replicas: (live - ready).max(0),
        selector: Some(format!("{LABEL_POOL_NAME}={}", label_value(&mp.name_any()))),
        phase: Some(phase.to_string()),
        node_refs,
        conditions: conditions_list,
    }
}

/// Creates, updates and deletes the Machines of a pool: one per claim (of any phase).
async fn sync_machines(
    cctx: &CapiContext,
    pool: &NodePool,
    mp_uid: &str,
    claims: &[NodeClaim],
    machines: &[Machine],
) -> Result<(), Error> {
    let ctx = &cctx.ctx;
    let ns = pool.namespace().unwrap_or_default();
    let pool_name = pool.name_any();
    let cluster = pool.spec.v_cluster_ref.name.clone();
    let api: Api<Machine> = Api::namespaced(ctx.client.clone(), &ns);
    let names: BTreeSet<String> = claims.iter().map(|c| c.name_any()).collect();
    for m in machines.iter().filter(|m| !names.contains(&m.name_any())) {
        match api.delete(&m.name_any(), &DeleteParams::background()).await {
            Ok(_) => {
                tracing::info!(nodepool = %pool_name, namespace = %ns, machine = %m.name_any(), "Machine of a removed claim deleted")
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                return Err(Error::Kube {
                    context: format!("deleting Machine {ns}/{}", m.name_any()),
                    source: e,
                })
            }
        }
    }
    for claim in claims {
        let name = claim.name_any();
        let existing = machines.iter().find(|m| m.name_any() == name);
        let s = claim.status.clone().unwrap_or_default();
        let spec = MachineSpec {
            cluster_name: cluster.clone(),
            bootstrap: Bootstrap {
                data_secret_name: s.vm_name.as_ref().map(|vm| format!("{vm}-userdata")),
            },
            provider_id: s.provider_id.clone(),
            version: claim.spec.kubernetes_version.clone(),
        };
        let labels = BTreeMap::from([
            (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
            (LABEL_POOL_NAME.to_string(), label_value(&pool_name)),
            (LABEL_CLUSTER_NAME.to_string(), label_value(&cluster)),
            (LABEL_NODEPOOL.to_string(), label_value(&pool_name)),
            (LABEL_NODECLAIM.to_string(), label_value(&name)),
        ]);
        let owner = OwnerReference {
            api_version: MachinePool::api_version(&()).into_owned(),
            kind: "MachinePool".into(),
            name: pool_name.clone(),
            uid: mp_uid.to_string(),
            controller: Some(true),
            block_owner_deletion: None,
        };
        let current = existing.is_some_and(|m| {
            m.spec == spec
                && labels.iter().all(|(k, v)| m.labels().get(k) == Some(v))
                && m.owner_references().iter().any(|o| o.uid == mp_uid)
        });
        let machine = if current {
            existing.cloned()
        } else if claim.metadata.deletion_timestamp.is_some() && existing.is_none() {
            // A claim on its way out gets no new Machine.
            None
        } else {
            let mut body = json!({
                "apiVersion": Machine::api_version(&()),
                "kind": "Machine",
                "metadata": {"name": name, "namespace": ns, "labels": labels,
                             "ownerReferences": [owner]},
                "spec": spec,
            });
            if let Some(m) = existing {
                body["metadata"]["resourceVersion"] = json!(m.resource_version());
            }
            let m = api
                .patch(
                    &name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&body),
                )
                .await
                .map_err(|e| conflict_or(e, format!("applying Machine {ns}/{name}")))?;
            if existing.is_none() {
                tracing::info!(nodepool = %pool_name, namespace = %ns, machine = %name, "Machine created");
            }
            Some(m)
        };
        let Some(machine) = machine else { continue };
        let status = machine_status(claim);
        if machine.status.as_ref() != Some(&status) {
            let patch = json!({
                "apiVersion": Machine::api_version(&()),
                "kind": "Machine",
                "metadata": {"resourceVersion": machine.resource_version()},
                "status": status,
            });
            api.patch_status(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
            .map_err(|e| conflict_or(e, format!("writing status of Machine {ns}/{name}")))?;
        }
    }
    Ok(())
}

/// Deletes the MachinePool `name` and its Machines in `ns` (when the stores show any) and
/// clears the claims' delete-first marks.
async fn remove_mirror(cctx: &CapiContext, ns: &str, name: &str) -> Result<(), Error> {
    let has_pool = cctx
        .machine_pools
        .get(&ObjectRef::new(name).within(ns))
        .is_some();
    let has_machines = cctx.machines.state().iter().any(|m| {
        m.namespace().as_deref() == Some(ns)
            && m.labels().get(LABEL_POOL_NAME) == Some(&label_value(name))
    });
    if !has_pool && !has_machines {
        return Ok(());
    }
    delete_mirror(&cctx.ctx, ns, name).await?;
    let claims_api: Api<NodeClaim> = Api::namespaced(cctx.ctx.client.clone(), ns);
    for c in cctx.ctx.claims.state().iter().filter(|c| {
        c.namespace().as_deref() == Some(ns)
            && c.labels().get(LABEL_NODEPOOL) == Some(&label_value(name))
            && c.annotations().contains_key(ANNOTATION_DELETE_FIRST)
    }) {
        let patch = json!({"metadata": {"annotations": {ANNOTATION_DELETE_FIRST: null}}});
        match claims_api
            .patch(
                &c.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                return Err(Error::Kube {
                    context: format!("unmarking NodeClaim {ns}/{}", c.name_any()),
                    source: e,
                })
            }
        }
    }
    Ok(())
}

/// Deletes the Machines labelled for pool `name` and the MachinePool `name` in `ns`.
async fn delete_mirror(ctx: &Context, ns: &str, name: &str) -> Result<(), Error> {
    let m_api: Api<Machine> = Api::namespaced(ctx.client.clone(), ns);
    let mp_api: Api<MachinePool> = Api::namespaced(ctx.client.clone(), ns);
    let machines: Vec<Machine> = lenient::list(
        &ctx.client,
        ns,
        &ListParams::default().labels(&format!("{LABEL_POOL_NAME}={}", label_value(name))),
    )
    .await
    .map_err(Error::kube(format!("listing Machines of {ns}/{name}")))?;
    for m in machines {
        match m_api
            .delete(&m.name_any(), &DeleteParams::background())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                return Err(Error::Kube {
                    context: format!("deleting Machine {ns}/{}", m.name_any()),
                    source: e,
                })
            }
        }
    }
    match mp_api.delete(name, &DeleteParams::background()).await {
        Ok(_) => {
            tracing::info!(nodepool = %name, namespace = %ns, "MachinePool and its Machines deleted");
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(Error::Kube {
            context: format!("deleting MachinePool {ns}/{name}"),
            source: e,
        }),
    }
}

/// Removes the mirrors whose NodePool is gone (or no longer mirrored): on every NodePool
/// deletion (for its namespace) and every 30 seconds (for the namespaces that hold
/// MachinePools or Machines).
async fn sweep_loop(cctx: Arc<CapiContext>, mut rx: mpsc::UnboundedReceiver<String>) {
    let mut tick = tokio::time::interval(Duration::from_secs(30));
    loop {
        let namespaces: BTreeSet<String> = tokio::select! {
            ns = rx.next() => match ns {
                Some(ns) => BTreeSet::from([ns]),
                None => return,
            },
            _ = tick.tick() => cctx
                .machine_pools
                .state()
                .iter()
                .filter_map(|m| m.namespace())
                .chain(cctx.machines.state().iter().filter_map(|m| m.namespace()))
                .collect(),
        };
        for ns in namespaces {
            if let Err(e) = sweep_namespace(&cctx.ctx, &ns).await {
                tracing::warn!(namespace = %ns, error = %e, "sweeping MachinePools of deleted NodePools failed");
            }
        }
    }
}

async fn sweep_namespace(ctx: &Context, ns: &str) -> Result<(), Error> {
    // Listed by metadata: an undecodable mirror is still a mirror.
    let mp_api: Api<MachinePool> = Api::namespaced(ctx.client.clone(), ns);
    let m_api: Api<Machine> = Api::namespaced(ctx.client.clone(), ns);
    let mut names: BTreeSet<String> = mp_api
        .list_metadata(&ListParams::default())
        .await
        .map_err(Error::kube(format!("listing MachinePools in {ns}")))?
        .items
        .iter()
        .map(|m| m.name_any())
        .collect();
    names.extend(
        m_api
            .list_metadata(&ListParams::default())
            .await
            .map_err(Error::kube(format!("listing Machines in {ns}")))?
            .items
            .iter()
            .filter_map(|m| m.labels().get(LABEL_POOL_NAME).cloned()),
    );
    for name in names {
        let pool = match lenient::get::<NodePool>(&ctx.client, ns, &name)
            .await
            .map_err(Error::kube(format!("reading NodePool {ns}/{name}")))?
        {
            // Its own watch reports it; its mirror stays until it can be read.
            Some(Lenient::Invalid(_)) => continue,
            Some(Lenient::Valid(p)) => Some(p),
            None => None,
        };
        let mirrored = pool.is_some_and(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.spec.autoscaling.is_some()
                && p.spec.replicas.is_some()
        });
        if !mirrored {
            delete_mirror(ctx, ns, &name).await?;
        }
    }
    Ok(())
}

/// Sets the pool's `Autoscaling` condition (and records an Event when it turns False or
/// its reason changes), conditional on the pool's resourceVersion.
async fn set_condition(
    ctx: &Context,
    pool: &NodePool,
    ok: bool,
    reason: &str,
    message: String,
) -> Result<(), Error> {
    let old = pool
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    let before = conditions::get(&old, AUTOSCALING).cloned();
    let mut new = old.clone();
    let changed = conditions::set(
        &mut new,
        AUTOSCALING,
        status_of(ok),
        reason,
        message.clone(),
        pool.metadata.generation,
        super::now(),
    );
    if !changed {
        return Ok(());
    }
    write_conditions(ctx, pool, &new).await?;
    let transition = before.is_none_or(|b| b.status != status_of(ok) || b.reason != reason);
    if transition {
        let type_ = if ok {
            EventType::Normal
        } else {
            EventType::Warning
        };
        tracing::info!(nodepool = %pool.name_any(), namespace = %pool.namespace().unwrap_or_default(), %reason, %message, "autoscaling condition");
        ctx.event(pool, type_, reason, AUTOSCALING, message).await;
    }
    Ok(())
}

/// Removes the `Autoscaling` condition from a pool that is no longer autoscaled.
async fn clear_condition(ctx: &Context, pool: &NodePool) -> Result<(), Error> {
    let old = pool
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    if conditions::get(&old, AUTOSCALING).is_none() {
        return Ok(());
    }
    let new: Vec<Condition> = old.into_iter().filter(|c| c.type_ != AUTOSCALING).collect();
    write_conditions(ctx, pool, &new).await
}

async fn write_conditions(ctx: &Context, pool: &NodePool, list: &[Condition]) -> Result<(), Error> {
    let ns = pool.namespace().unwrap_or_default();
    let name = pool.name_any();
    let api: Api<NodePool> = Api::namespaced(ctx.client.clone(), &ns);
    // A merge patch replaces the whole list; the resourceVersion makes it conditional, so
    // a condition another controller set in the meantime is never lost.
    let patch = json!({
        "metadata": {"resourceVersion": pool.resource_version()},
        "status": {"conditions": list},
    });
    api.patch_status(&name, &merge_params(), &Patch::Merge(&patch))
        .await
        .map_err(|e| conflict_or(e, format!("writing conditions of NodePool {ns}/{name}")))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{NodeTypeSpec, Overhead};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    #[test]
    fn bounds_that_would_hide_or_disable_the_group_are_refused() {
        let b = |min, max| Autoscaling {
            min_replicas: min,
            max_replicas: max,
        };
        assert_eq!(bounds_problem(&b(0, 5)), None);
        assert_eq!(bounds_problem(&b(2, 3)), None);
        assert!(bounds_problem(&b(3, 2)).is_some_and(|m| m.contains("below")));
        assert!(bounds_problem(&b(2, 2)).is_some_and(|m| m.contains("at least 1")));
        assert!(bounds_problem(&b(-1, 2)).is_some_and(|m| m.contains("negative")));
    }

    #[test]
    fn a_change_on_either_side_is_copied_to_the_other() {
        // kubectl scale npool 3 → 5.
        let s = sync_replicas(5, Some(3), Some(3), Some(3));
        assert_eq!((s.target, s.source), (5, ReplicaSource::NodePool));
        // The autoscaler's PUT on /scale 3 → 4.
        let s = sync_replicas(3, Some(3), Some(4), Some(3));
        assert_eq!((s.target, s.source), (4, ReplicaSource::MachinePool));
        // A new MachinePool takes the NodePool's value.
        let s = sync_replicas(2, None, None, None);
        assert_eq!((s.target, s.source), (2, ReplicaSource::NodePool));
        // Equal values: nothing to pass on.
        let s = sync_replicas(4, Some(3), Some(4), Some(3));
        assert_eq!((s.target, s.source), (4, ReplicaSource::Agreed));
    }

    #[test]
    fn the_later_write_wins_when_the_earlier_one_was_already_passed_on() {
        // NodePool 3 → 5 was copied to the MachinePool (marker 5), then the autoscaler set
        // 6 before the NodePool's marker was written: the autoscaler's 6 is newer.
        let s = sync_replicas(5, Some(3), Some(6), Some(5));
        assert_eq!((s.target, s.source), (6, ReplicaSource::MachinePool));
        // The autoscaler's 1 was copied to the NodePool (marker 1), then someone scaled
        // the NodePool to 7 before the MachinePool's marker was written: 7 is newer.
        let s = sync_replicas(7, Some(1), Some(1), Some(0));
        assert_eq!((s.target, s.source), (7, ReplicaSource::NodePool));
        // Truly concurrent changes: the NodePool wins.
        let s = sync_replicas(5, Some(3), Some(4), Some(3));
        assert_eq!(
            (s.target, s.source),
            (5, ReplicaSource::ConflictNodePoolWins)
        );
    }

    #[test]
    fn a_sync_is_stable_once_both_sides_carry_the_target() {
        for (np, nps, mp, mps) in [
            (5, Some(3), Some(3), Some(3)),
            (3, Some(3), Some(4), Some(3)),
            (5, Some(2), Some(4), Some(3)),
        ] {
            let s = sync_replicas(np, nps, mp, mps);
            let again = sync_replicas(s.target, Some(s.target), Some(s.target), Some(s.target));
            assert_eq!(again.source, ReplicaSource::Agreed);
            assert_eq!(again.target, s.target);
        }
    }

    #[test]
    fn taints_are_written_as_the_provider_parses_them() {
        let t = |k: &str, v: Option<&str>, e: &str| Taint {
            key: k.into(),
            value: v.map(Into::into),
            effect: e.into(),
            ..Taint::default()
        };
        assert_eq!(
            format_taint(&t("dedicated", Some("gpu"), "NoSchedule")),
            "dedicated=gpu:NoSchedule"
        );
        assert_eq!(
            format_taint(&t("spot", None, "NoExecute")),
            "spot:NoExecute"
        );
        assert_eq!(
            format_taint(&t("spot", Some(""), "NoExecute")),
            "spot:NoExecute"
        );
    }

    #[test]
    fn scale_from_zero_annotations_are_the_type_resources_less_kube_reserved() {
        let spec: NodeTypeSpec = serde_json::from_value(json!({
            "providerRef": "p",
            "resources": {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "2"},
            "taints": [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}],
        }))
        .expect("spec");
        let provider = scheduling::ProviderContext {
            name: "p".into(),
            properties: Default::default(),
            host_cluster: "h".into(),
            vm_namespace: "vms".into(),
            base_template: Some(
                json!({"spec": {"template": {"spec": {"domain": {"devices": {}}}}}}),
            ),
        };
        let t = scheduling::prepare_type("p.gpu", &spec, Some(&provider));
        assert!(t.problem.is_none(), "{:?}", t.problem);
        let reserved = ResourceAmounts::from_list(
            &Overhead {
                kube_reserved: BTreeMap::from([
                    ("cpu".to_string(), Quantity("500m".into())),
                    ("memory".to_string(), Quantity("1Gi".into())),
                ]),
            }
            .kube_reserved,
        )
        .expect("reserved");
        let template: NodeClaimSpec = serde_json::from_value(json!({
            "vClusterRef": {"name": "t"},
            "labels": {"team": "blue"},
            "taints": [{"key": "pool", "effect": "NoExecute"}],
            "startupTaints": [{"key": "cni", "effect": "NoSchedule"}],
        }))
        .expect("template");
        let a = capacity_annotations(&t, &reserved, &template);
        assert_eq!(a[CAPACITY_CPU], "3500m");
        assert_eq!(a[CAPACITY_MEMORY], "7Gi");
        assert_eq!(a[CAPACITY_MAX_PODS], "110");
        assert_eq!(a[CAPACITY_GPU_COUNT], "2");
        assert_eq!(a[CAPACITY_GPU_TYPE], "nvidia.com/gpu");
        let labels: BTreeSet<&str> = a[CAPACITY_LABELS].split(',').collect();
        for l in [
            "team=blue",
            "autonodes.io/node-type=gpu",
            "node.kubernetes.io/instance-type=p.gpu",
            "kubernetes.io/arch=amd64",
        ] {
            assert!(labels.contains(l), "{l} missing from {labels:?}");
        }
        assert_eq!(a[CAPACITY_TAINTS], "gpu=yes:NoSchedule,pool:NoExecute");
    }

    #[test]
    fn a_failed_claim_gives_a_failed_machine_with_its_reason() {
        let claim: NodeClaim = serde_json::from_value(json!({
            "apiVersion": "autonodes.io/v1alpha1", "kind": "NodeClaim",
            "metadata": {"name": "c", "namespace": "t"},
            "spec": {"vClusterRef": {"name": "t"}},
            "status": {"phase": "Failed", "vmName": "c-vm", "conditions": [
                {"type": "Ready", "status": "False", "reason": "LaunchTimeout",
                 "message": "the VM did not run within 10m", "lastTransitionTime": "2024-01-01T00:00:00Z"}
            ]}
        }))
        .expect("claim");
        let s = machine_status(&claim);
        assert_eq!(s.phase.as_deref(), Some("Failed"));
        assert_eq!(s.failure_reason.as_deref(), Some("LaunchTimeout"));
        assert_eq!(
            s.failure_message.as_deref(),
            Some("the VM did not run within 10m")
        );
        assert!(s.node_ref.is_none());
        assert!(provider_id_list(&[claim]).is_empty());
    }
}

//! NodePool controller (DESIGN §2): keeps a pool's NodeClaims alive.
//!
//! - **Static pools** (`spec.replicas`): exactly N live claims from the pool's claim
//!   template. Scale-down removes the least valuable claims first (not yet Available, then
//!   newest) with at most `disruption.budget` Ready nodes draining at once; Failed claims are
//!   deleted and replaced; claims made from an older template (or older than
//!   `disruption.expireAfter`) are rolled by surge: a replacement is created first and the
//!   old claim is deleted once the replacement is Available.
//! - **Dynamic pools** (no `replicas`): the tenant's unschedulable pods that a node of the
//!   pool would accept are packed first-fit-decreasing onto the free room of the tenant's
//!   existing and in-flight nodes, then onto new claims of the cheapest accepting node type,
//!   never beyond `spec.limits`. Nodes without non-DaemonSet pods for
//!   `disruption.consolidateAfter` are removed.
//!
//! The planning is pure and lives in [`autonodes_core::pool`] (the claim template, the
//! claims to keep, delete and create, pending pods packed onto nodes); this module observes
//! — the pool's claims straight from the API server (never a lagging cache, so a claim
//! created a moment ago is always counted), the tenant's pods and nodes — plans through the
//! core, then creates and deletes claims and writes the pool's status.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use autonodes_core::pool::pack::{
    claim_type, is_unschedulable, non_daemon_running, pack, pod_request, Amount, Bin, Candidate,
    Limits, NodeShape, PendingPod,
};
use autonodes_core::pool::plan::{claim_views, is_live, plan_claims, DeleteReason};
use autonodes_core::pool::{
    self, budget, consolidate_after, due_for_removal, expire_after, selector, template_hash,
    template_spec, ANNOTATION_EMPTY_SINCE, ANNOTATION_REPLACES, LABEL_TEMPLATE_HASH,
    READY_NODE_GRACE,
};
use futures::channel::mpsc::{self, UnboundedSender};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::{Action, Config as RunConfig};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{watcher, Controller};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tokio::sync::Mutex;

use super::{apply_status, now, Context, Error};
use crate::api::{
    NodeClaim, NodeClaimPhase, NodeClaimSpec, NodePool, NodePoolResources, NodePoolStatus,
    ResourceList, LABEL_NODEPOOL,
};
use crate::clients::{remote_error_text, ClusterKey, Remote, REMOTE_TIMEOUT};
use crate::conditions::{self, status_of, TRUE};
use crate::resources::{self, ResourceAmounts};
use crate::scheduling::{self, ClaimRequest, PreparedType};

/// Pool condition: demand is blocked by `spec.limits`.
pub const LIMIT_REACHED: &str = "LimitReached";
/// Pool condition: the pool has what it should (replicas Ready, no demand left unserved).
pub const READY: &str = "Ready";

/// `<pool>-<5 random [a-z0-9]>`.
fn claim_name(pool: &str) -> String {
    pool::claim_name(pool, uuid::Uuid::new_v4().as_bytes())
}

// ---------------------------------------------------------------------------------------
// The controller
// ---------------------------------------------------------------------------------------

/// Shared state of the NodePool controller.
pub struct PoolContext {
    /// The controllers' shared context.
    pub ctx: Arc<Context>,
    /// Every NodePool (the controller's reflector).
    pub pools: Store<NodePool>,
    /// Wakes pools (tenant pod and node changes).
    pub wake: UnboundedSender<ObjectRef<NodePool>>,
    /// Watches on tenant clusters, by tenant: the client they use and their tasks.
    watches: Mutex<HashMap<ClusterKey, TenantWatch>>,
    /// Pools whose gauges are set (to remove those of deleted pools).
    gauges: std::sync::Mutex<BTreeSet<String>>,
}

struct TenantWatch {
    remote: Arc<Remote>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for TenantWatch {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Runs the NodePool controller until `shutdown` resolves: it owns NodeClaims (a claim's
/// change wakes its pool) and is woken by the tenant pod and node watches of dynamic pools.
pub async fn run(
    ctx: Arc<Context>,
    reflectors: &super::Reflectors,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + Clone + 'static,
) {
    let (wake, wakeups) = mpsc::unbounded();
    let pctx = Arc::new(PoolContext {
        ctx,
        pools: reflectors.pools.store(),
        wake,
        watches: Mutex::new(HashMap::new()),
        gauges: std::sync::Mutex::new(BTreeSet::new()),
    });
    Controller::for_shared_stream(reflectors.pools.applied(), reflectors.pools.store())
        .owns_shared_stream(reflectors.claims.touched_objects())
        .reconcile_on(wakeups)
        .with_config(RunConfig::default().debounce(Duration::from_millis(300)))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, pctx)
        .for_each(super::log_run_error)
        .await;
}

/// Reconciles one NodePool.
pub async fn reconcile(pool: Arc<NodePool>, pctx: Arc<PoolContext>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = reconcile_pool(&pool, &pctx).await;
    pctx.ctx
        .metrics
        .observe_reconcile("nodepool", started, &result);
    result
}

/// Logs the error; the pool is retried with backoff.
pub fn error_policy(pool: Arc<NodePool>, error: &Error, _pctx: Arc<PoolContext>) -> Action {
    if error.is_conflict() {
        tracing::debug!(%error, "stale read; reconciling the pool again");
    } else {
        tracing::warn!(
            nodepool = %pool.name_any(),
            namespace = %pool.namespace().unwrap_or_default(),
            %error,
            "reconciling NodePool failed"
        );
    }
    super::error_requeue(error)
}

/// Everything one reconcile decided, for the status.
#[derive(Default)]
struct Outcome {
    /// `Ready` condition: (ok, reason, message).
    ready: Option<(bool, String, String)>,
    /// `LimitReached` condition: (reached, reason, message).
    limit: Option<(bool, String, String)>,
    /// Unschedulable pods the pool would take (dynamic pools).
    pending_pods: Option<i32>,
}

fn conflict_or(e: Error) -> Error {
    match e {
        Error::Kube {
            source: kube::Error::Api(s),
            context,
        } if s.code == 409 => Error::Conflict(context),
        e => e,
    }
}

async fn reconcile_pool(pool: &NodePool, pctx: &PoolContext) -> Result<Action, Error> {
    let ctx = &pctx.ctx;
    if pool.meta().deletion_timestamp.is_some() {
        // The garbage collector removes the owned claims; their finalizers drain the nodes.
        return Ok(Action::await_change());
    }
    ctx.wait_synced().await;
    let ns = pool.namespace().unwrap_or_default();
    let name = pool.name_any();
    let uid = pool
        .uid()
        .ok_or_else(|| Error::Missing(format!("NodePool {name}"), "metadata.uid"))?;
    // A claim that cannot be decoded is reported by its watch and left out here.
    let all_claims: Vec<NodeClaim> = super::lenient::list(&ctx.client, &ns, &ListParams::default())
        .await
        .map_err(Error::kube(format!("listing NodeClaims in {ns}")))?;
    let (mine, others): (Vec<NodeClaim>, Vec<NodeClaim>) =
        all_claims.into_iter().partition(|c| owned_by(c, &uid));

    let mut outcome = Outcome::default();
    let template = template_spec(&pool.spec);
    let hash = template_hash(&pool.spec);
    let mut requeue = Duration::from_secs(60);
    let mut created: Vec<NodeClaim> = Vec::new();
    let mut deleted: HashSet<String> = HashSet::new();

    let mut problem = template_problem(pool, ctx);
    if problem.is_none() && pool.spec.replicas.is_some() {
        // A static pool needs no tenant watch, but claims for a tenant that cannot be
        // reached would only wait: say so on the pool and leave the claims as they are.
        if let Err(e) = ctx.clients.tenant(&ns, &pool.spec.v_cluster_ref.name).await {
            problem = Some((e.reason().to_string(), e.to_string()));
        }
    }
    if let Some((reason, message)) = problem {
        outcome.ready = Some((false, reason, message));
        requeue = Duration::from_secs(30);
    } else {
        let views = claim_views(
            &mine,
            &hash,
            expire_after(&pool.spec),
            now().as_millisecond(),
        );
        let budget = budget(&pool.spec);
        let desired = pool.spec.replicas.map(|r| usize::try_from(r).unwrap_or(0));
        let plan = plan_claims(&views, desired, budget);
        for (claim_name, reason) in &plan.delete {
            if let Some(c) = mine.iter().find(|c| &c.name_any() == claim_name) {
                delete_claim(pctx, pool, c, *reason).await?;
                deleted.insert(claim_name.clone());
            }
        }
        for replaces in &plan.create {
            let old = replaces
                .as_ref()
                .and_then(|o| mine.iter().find(|c| &c.name_any() == o));
            let (capacity, type_ref) = match old {
                Some(o) => (
                    o.spec.desired_capacity.clone(),
                    // An expired claim keeps its type; a changed template chooses anew.
                    (o.labels().get(LABEL_TEMPLATE_HASH) == Some(&hash))
                        .then(|| o.spec.type_ref.clone())
                        .flatten(),
                ),
                None => (ResourceList::new(), None),
            };
            let c = create_claim(
                pctx,
                pool,
                &template,
                &hash,
                capacity,
                type_ref,
                replaces.as_deref(),
            )
            .await?;
            created.push(c);
        }
        if pool.spec.replicas.is_none() {
            let with_created: Vec<NodeClaim> = mine.iter().chain(created.iter()).cloned().collect();
            match dynamic(
                pctx,
                pool,
                &template,
                &hash,
                &with_created,
                &others,
                &deleted,
            )
            .await?
            {
                DynamicResult::Done {
                    outcome: o,
                    created: c,
                    deleted: d,
                    requeue: r,
                } => {
                    outcome = o;
                    created.extend(c);
                    deleted.extend(d);
                    requeue = r;
                }
                DynamicResult::Unreachable(reason, message) => {
                    outcome.ready = Some((false, reason, message));
                    requeue = Duration::from_secs(15);
                }
            }
        } else if !plan.create.is_empty() || !plan.delete.is_empty() {
            requeue = Duration::from_secs(5);
        }
    }
    write_status(pctx, pool, &mine, &created, &deleted, outcome).await?;
    Ok(Action::requeue(requeue))
}

fn owned_by(claim: &NodeClaim, pool_uid: &str) -> bool {
    claim
        .owner_references()
        .iter()
        .any(|o| o.kind == "NodePool" && o.uid == pool_uid && o.controller == Some(true))
}

/// Why the pool's template cannot be used: (reason, message).
fn template_problem(pool: &NodePool, ctx: &Context) -> Option<(String, String)> {
    if let Some(p) = &pool.spec.provider_ref {
        if ctx.providers.get(&ObjectRef::new(p)).is_none() {
            return Some((
                "ProviderNotFound".into(),
                format!("NodeProvider {p} does not exist"),
            ));
        }
    }
    let template = template_spec(&pool.spec);
    if let Err(e) = ClaimRequest::new(&template, None) {
        return Some(("InvalidTemplate".into(), e.to_string()));
    }
    if let Err(e) = scheduling::node_labels(
        &Default::default(),
        None,
        &template.labels,
        &BTreeMap::new(),
    ) {
        return Some(("InvalidTemplate".into(), e.to_string()));
    }
    None
}

async fn create_claim(
    pctx: &PoolContext,
    pool: &NodePool,
    template: &NodeClaimSpec,
    hash: &str,
    desired_capacity: ResourceList,
    type_ref: Option<String>,
    replaces: Option<&str>,
) -> Result<NodeClaim, Error> {
    let ctx = &pctx.ctx;
    let ns = pool.namespace().unwrap_or_default();
    let pool_name = pool.name_any();
    let api: Api<NodeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let owner = OwnerReference {
        api_version: NodePool::api_version(&()).into_owned(),
        kind: NodePool::kind(&()).into_owned(),
        name: pool_name.clone(),
        uid: pool.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    let mut spec = template.clone();
    spec.desired_capacity = desired_capacity;
    spec.type_ref = type_ref;
    let annotations =
        replaces.map(|o| BTreeMap::from([(ANNOTATION_REPLACES.to_string(), o.to_string())]));
    // A name collision (1 in 36^5) gets another name.
    for attempt in 0..3 {
        let claim = NodeClaim {
            metadata: ObjectMeta {
                name: Some(claim_name(&pool_name)),
                namespace: Some(ns.clone()),
                labels: Some(BTreeMap::from([
                    (
                        LABEL_NODEPOOL.to_string(),
                        crate::names::label_value(&pool_name),
                    ),
                    (LABEL_TEMPLATE_HASH.to_string(), hash.to_string()),
                ])),
                annotations: annotations.clone(),
                owner_references: Some(vec![owner.clone()]),
                ..Default::default()
            },
            spec: spec.clone(),
            status: None,
        };
        match api.create(&PostParams::default(), &claim).await {
            Ok(c) => {
                let what = match replaces {
                    Some(o) => format!("created NodeClaim {} to replace {o}", c.name_any()),
                    None => format!("created NodeClaim {}", c.name_any()),
                };
                tracing::info!(nodepool = %pool_name, namespace = %ns, claim = %c.name_any(), replaces = ?replaces, "claim created");
                ctx.event(pool, EventType::Normal, "ClaimCreated", "Scale", what)
                    .await;
                return Ok(c);
            }
            Err(kube::Error::Api(s)) if s.code == 409 && attempt < 2 => continue,
            Err(e) => {
                return Err(Error::Kube {
                    context: format!("creating a NodeClaim for NodePool {ns}/{pool_name}"),
                    source: e,
                })
            }
        }
    }
    Err(Error::Internal(format!(
        "no free claim name for NodePool {ns}/{pool_name}"
    )))
}

async fn delete_claim(
    pctx: &PoolContext,
    pool: &NodePool,
    claim: &NodeClaim,
    reason: DeleteReason,
) -> Result<(), Error> {
    let ctx = &pctx.ctx;
    let ns = claim.namespace().unwrap_or_default();
    let name = claim.name_any();
    let api: Api<NodeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: claim.uid(),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    match api.delete(&name, &params).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => return Ok(()),
        Err(e) => {
            return Err(Error::Kube {
                context: format!("deleting NodeClaim {ns}/{name}"),
                source: e,
            })
        }
    }
    tracing::info!(nodepool = %pool.name_any(), namespace = %ns, claim = %name, ?reason, "claim deleted");
    let note = match reason {
        DeleteReason::Failed => format!("deleted Failed NodeClaim {name}; a new one replaces it"),
        DeleteReason::Outdated => {
            format!("deleted NodeClaim {name}: made from an older template and not Available")
        }
        DeleteReason::Replaced => format!("deleted NodeClaim {name}: its replacement is Available"),
        DeleteReason::ScaleDown => format!("deleted NodeClaim {name}: more claims than replicas"),
        DeleteReason::Empty => {
            format!("deleted NodeClaim {name}: its node ran no pods for the consolidation delay")
        }
    };
    ctx.event(
        pool,
        EventType::Normal,
        reason.event_reason(),
        "Scale",
        note,
    )
    .await;
    Ok(())
}

enum DynamicResult {
    Done {
        outcome: Outcome,
        created: Vec<NodeClaim>,
        deleted: Vec<String>,
        requeue: Duration,
    },
    Unreachable(String, String),
}

async fn tenant_call<T>(
    remote: &Remote,
    context: &str,
    fut: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, (String, String)> {
    match tokio::time::timeout(REMOTE_TIMEOUT, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err((
            "TenantUnreachable".into(),
            format!("{}: {context}: {}", remote.key, remote_error_text(&e)),
        )),
        Err(_) => Err((
            "TenantUnreachable".into(),
            format!(
                "{}: {context}: no answer within {}s",
                remote.key,
                REMOTE_TIMEOUT.as_secs()
            ),
        )),
    }
}

/// Starts (or keeps) the pod and node watches on the pool's tenant.
async fn ensure_tenant_watch(pctx: &PoolContext, remote: &Arc<Remote>) {
    let mut watches = pctx.watches.lock().await;
    if watches
        .get(&remote.key)
        .is_some_and(|w| Arc::ptr_eq(&w.remote, remote))
    {
        return;
    }
    let ClusterKey::Tenant {
        namespace,
        vcluster,
    } = remote.key.clone()
    else {
        return;
    };
    let wake_pools = {
        let pools = pctx.pools.clone();
        let wake = pctx.wake.clone();
        move || {
            for p in pools.state() {
                if p.namespace().as_deref() == Some(namespace.as_str())
                    && p.spec.v_cluster_ref.name == vcluster
                    && p.spec.replicas.is_none()
                {
                    let _ = wake.unbounded_send(ObjectRef::from_obj(&*p));
                }
            }
        }
    };
    let pods: Api<Pod> = Api::all(remote.client.clone());
    let nodes: Api<Node> = Api::all(remote.client.clone());
    let tasks = vec![
        spawn_wake_watch(remote.key.to_string(), pods, wake_pools.clone()),
        spawn_wake_watch(remote.key.to_string(), nodes, wake_pools),
    ];
    tracing::info!(cluster = %remote.key, "watching tenant pods and nodes for node pools");
    watches.insert(
        remote.key.clone(),
        TenantWatch {
            remote: remote.clone(),
            tasks,
        },
    );
}

fn spawn_wake_watch<K>(
    cluster: String,
    api: Api<K>,
    wake: impl Fn() + Send + 'static,
) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    tokio::spawn(async move {
        use kube::runtime::WatchStreamExt;
        let mut stream = watcher(api, watcher::Config::default().any_semantic())
            .default_backoff()
            .boxed();
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Init) | Ok(watcher::Event::InitApply(_)) => {}
                Ok(_) => wake(),
                Err(e) => tracing::debug!(%cluster, error = %e, "tenant watch error (retrying)"),
            }
        }
    })
}

/// The node type, labels, taints and allocatable room of a live claim.
struct ClaimNode<'a> {
    claim: &'a NodeClaim,
    node_type: Option<&'a PreparedType>,
    shape: NodeShape,
    allocatable: Amount,
}

fn allocatable_of(ctx: &Context, t: &PreparedType) -> Amount {
    let reserved = ctx
        .types
        .get(&ObjectRef::new(&t.name))
        .and_then(|nt| nt.spec.overhead.clone())
        .and_then(|o| ResourceAmounts::from_list(&o.kube_reserved).ok())
        .map(|r| Amount {
            cpu: r.cpu_millis(),
            memory: r.memory_bytes(),
            pods: 0,
        })
        .unwrap_or_default();
    Amount::of_node(&t.amounts).minus(&reserved)
}

#[allow(clippy::too_many_arguments)]
async fn dynamic(
    pctx: &PoolContext,
    pool: &NodePool,
    template: &NodeClaimSpec,
    hash: &str,
    mine: &[NodeClaim],
    others: &[NodeClaim],
    deleted_now: &HashSet<String>,
) -> Result<DynamicResult, Error> {
    let ctx = &pctx.ctx;
    let ns = pool.namespace().unwrap_or_default();
    let vcluster = &pool.spec.v_cluster_ref.name;
    let tenant = match ctx.clients.tenant(&ns, vcluster).await {
        Ok(t) => t,
        Err(e) => return Ok(DynamicResult::Unreachable(e.reason().into(), e.to_string())),
    };
    ensure_tenant_watch(pctx, &tenant).await;
    let pods_api: Api<Pod> = Api::all(tenant.client.clone());
    let nodes_api: Api<Node> = Api::all(tenant.client.clone());
    let pods = match tenant_call(
        &tenant,
        "listing pods",
        pods_api.list(&ListParams::default()),
    )
    .await
    {
        Ok(l) => l.items,
        Err((r, m)) => return Ok(DynamicResult::Unreachable(r, m)),
    };
    let nodes = match tenant_call(
        &tenant,
        "listing nodes",
        nodes_api.list(&ListParams::default()),
    )
    .await
    {
        Ok(l) => l.items,
        Err((r, m)) => return Ok(DynamicResult::Unreachable(r, m)),
    };
    let nodes: HashMap<String, &Node> = nodes.iter().map(|n| (n.name_any(), n)).collect();
    let mut bound: HashMap<String, (Amount, usize)> = HashMap::new();
    for p in pods.iter().filter(|p| non_daemon_running(p)) {
        if let Some(n) = p.spec.as_ref().and_then(|s| s.node_name.clone()) {
            let e = bound.entry(n).or_default();
            e.0 = e.0.plus(&pod_request(p));
            e.1 += 1;
        }
    }
    // DaemonSet pods take room too, but do not keep a node alive.
    let mut daemon_use: HashMap<String, Amount> = HashMap::new();
    for p in pods.iter().filter(|p| !non_daemon_running(p)) {
        if let Some(n) = p.spec.as_ref().and_then(|s| s.node_name.clone()) {
            let e = daemon_use.entry(n).or_default();
            *e = e.plus(&pod_request(p));
        }
    }
    let pending: Vec<PendingPod> = pods
        .iter()
        .filter(|p| is_unschedulable(p))
        .map(PendingPod::from_pod)
        .collect();

    let catalogue = super::nodeclaim::catalogue(ctx);
    let claimed = {
        let r = ctx.scheduling.lock().await;
        super::nodeclaim::claimed_counts(ctx, &r)
    };
    let now_ts = now();

    // Existing room: every live claim of the tenant (this pool's and others').
    let tenant_claims = mine.iter().chain(
        others
            .iter()
            .filter(|c| &c.spec.v_cluster_ref.name == vcluster),
    );
    let mut claim_nodes: Vec<ClaimNode> = Vec::new();
    for c in tenant_claims.filter(|c| is_live(c) && !deleted_now.contains(&c.name_any())) {
        let t = claim_type(c, &catalogue, &claimed);
        let (shape, allocatable) = match t {
            Some(t) => (
                NodeShape::of_type(t, &c.spec).unwrap_or_default(),
                allocatable_of(ctx, t),
            ),
            None => (NodeShape::default(), Amount::default()),
        };
        claim_nodes.push(ClaimNode {
            claim: c,
            node_type: t,
            shape,
            allocatable,
        });
    }
    let mut bins = Vec::new();
    for cn in &claim_nodes {
        let s = cn.claim.status.clone().unwrap_or_default();
        let node = s.node_name.as_ref().and_then(|n| nodes.get(n));
        if node
            .and_then(|n| n.spec.as_ref())
            .and_then(|s| s.unschedulable)
            .unwrap_or(false)
        {
            continue;
        }
        let ready_since = conditions::true_since(&s.conditions, super::nodeclaim::READY);
        if let Some(since) = ready_since {
            if due_for_removal(since, now_ts, READY_NODE_GRACE) {
                // The scheduler has seen this node: pods it still calls unschedulable
                // do not fit there.
                continue;
            }
        }
        let used = s
            .node_name
            .as_ref()
            .map(|n| {
                let b = bound.get(n).map(|b| b.0).unwrap_or_default();
                b.plus(&daemon_use.get(n).copied().unwrap_or_default())
            })
            .unwrap_or_default();
        bins.push(Bin {
            claim: cn.claim.name_any(),
            shape: cn.shape.clone(),
            free: cn.allocatable.minus(&used),
        });
    }

    // Candidates: the types the pool's template fits, cheapest first.
    let request = ClaimRequest::new(template, None).map_err(|e| Error::Internal(e.to_string()))?;
    let candidates: Vec<Candidate> = catalogue
        .types()
        .iter()
        .filter(|t| {
            template
                .provider_ref
                .as_deref()
                .is_none_or(|p| p == t.provider)
                && scheduling::fits(t, &request)
        })
        .filter_map(|t| {
            Some(Candidate {
                node_type: t.name.clone(),
                shape: NodeShape::of_type(t, template)?,
                allocatable: allocatable_of(ctx, t),
                resources: Amount::of_node(&t.amounts),
                room: t
                    .max_capacity
                    .map(|m| m - claimed.get(&t.name).copied().unwrap_or(0)),
            })
        })
        .collect();

    // The pool's usage against its limits.
    let mut usage = (0i64, Amount::default());
    for cn in claim_nodes.iter().filter(|cn| owned_mine(mine, cn.claim)) {
        usage.0 += 1;
        if let Some(t) = cn.node_type {
            usage.1 = usage.1.plus(&Amount::of_node(&t.amounts));
        }
    }
    let limits = Limits::from_spec(pool.spec.limits.as_ref());
    let packing = pack(&pending, &bins, &candidates, &limits, usage);

    let mut created = Vec::new();
    for n in &packing.new_nodes {
        let c = create_claim(
            pctx,
            pool,
            template,
            hash,
            n.request.to_resource_list(),
            Some(n.node_type.clone()),
            None,
        )
        .await?;
        tracing::info!(nodepool = %pool.name_any(), claim = %c.name_any(), node_type = %n.node_type, pods = n.pods.len(), "new node for pending pods");
        created.push(c);
    }

    // Consolidation: this pool's Available claims whose node runs no non-DaemonSet pod.
    // `consolidateAfter: Never`: empty nodes stay.
    let consolidate = consolidate_after(&pool.spec);
    let after = consolidate.unwrap_or(Duration::MAX);
    let draining = mine
        .iter()
        .filter(|c| {
            c.metadata.deletion_timestamp.is_some()
                && c.status
                    .as_ref()
                    .and_then(|s| s.node_name.as_ref())
                    .is_some()
        })
        .count()
        + deleted_now.len();
    let mut disrupt = budget(&pool.spec).saturating_sub(draining);
    let mut deleted = Vec::new();
    let mut next_check: Option<Duration> = None;
    let mut empties: Vec<(&NodeClaim, Timestamp)> = Vec::new();
    for c in mine
        .iter()
        .filter(|c| is_live(c) && !deleted_now.contains(&c.name_any()))
        .filter(|_| consolidate.is_some())
    {
        let s = c.status.clone().unwrap_or_default();
        if s.phase != Some(NodeClaimPhase::Available) {
            continue;
        }
        let Some(node_name) = s.node_name.as_ref() else {
            continue;
        };
        let busy = bound.get(node_name).is_some_and(|b| b.1 > 0)
            || packing.placed.contains_key(&c.name_any());
        let since = c
            .annotations()
            .get(ANNOTATION_EMPTY_SINCE)
            .and_then(|v| v.parse::<Timestamp>().ok());
        match (busy, since) {
            (true, Some(_)) => annotate_empty(ctx, c, None).await?,
            (true, None) => {}
            (false, None) => {
                annotate_empty(ctx, c, Some(now_ts)).await?;
                next_check = Some(next_check.map_or(after, |n| n.min(after)));
            }
            (false, Some(since)) => {
                if due_for_removal(since, now_ts, after) {
                    empties.push((c, since));
                } else {
                    let waited = (now_ts.as_millisecond() - since.as_millisecond()).max(0);
                    let left = after.saturating_sub(Duration::from_millis(waited as u64));
                    next_check = Some(next_check.map_or(left, |n| n.min(left)));
                }
            }
        }
    }
    empties.sort_by_key(|(_, since)| since.as_millisecond());
    for (c, _) in empties {
        if disrupt == 0 {
            next_check = Some(Duration::from_secs(2));
            break;
        }
        disrupt -= 1;
        delete_claim(pctx, pool, c, DeleteReason::Empty).await?;
        deleted.push(c.name_any());
    }

    let mut outcome = Outcome {
        pending_pods: Some(i32::try_from(packing.wanted).unwrap_or(i32::MAX)),
        ..Outcome::default()
    };
    outcome.limit = Some(if packing.blocked_by_limits.is_empty() {
        (
            false,
            "WithinLimits".into(),
            "demand fits within the pool's limits".into(),
        )
    } else {
        (
            true,
            LIMIT_REACHED.into(),
            format!(
                "{} pending pod(s) need nodes beyond the pool's limits ({})",
                packing.blocked_by_limits.len(),
                limits.describe()
            ),
        )
    });
    outcome.ready = Some(if !packing.blocked_by_capacity.is_empty() {
        (
            false,
            scheduling::REASON_INSUFFICIENT_CAPACITY.into(),
            format!(
                "{} pending pod(s) fit node types that are all at maxCapacity",
                packing.blocked_by_capacity.len()
            ),
        )
    } else if candidates.is_empty() {
        (
            false,
            scheduling::REASON_NO_MATCHING_NODE_TYPE.into(),
            "no node type fits the pool's template".into(),
        )
    } else if !packing.new_nodes.is_empty() {
        (
            false,
            "ScalingUp".into(),
            format!(
                "{} new node(s) for {} pending pod(s)",
                packing.new_nodes.len(),
                packing
                    .new_nodes
                    .iter()
                    .map(|n| n.pods.len())
                    .sum::<usize>()
            ),
        )
    } else {
        (
            true,
            "Ready".into(),
            "no pending pod waits for a new node".into(),
        )
    });
    let requeue = next_check
        .map(|d| d.max(Duration::from_millis(500)) + Duration::from_millis(200))
        .unwrap_or(Duration::from_secs(30))
        .min(Duration::from_secs(30));
    Ok(DynamicResult::Done {
        outcome,
        created,
        deleted,
        requeue,
    })
}

fn owned_mine(mine: &[NodeClaim], c: &NodeClaim) -> bool {
    mine.iter().any(|m| m.uid() == c.uid())
}

async fn annotate_empty(
    ctx: &Context,
    c: &NodeClaim,
    since: Option<Timestamp>,
) -> Result<(), Error> {
    let api: Api<NodeClaim> =
        Api::namespaced(ctx.client.clone(), &c.namespace().unwrap_or_default());
    let value = since.map(|t| json!(t.to_string())).unwrap_or(json!(null));
    let patch = json!({"metadata": {"annotations": {ANNOTATION_EMPTY_SINCE: value}}});
    match api
        .patch(
            &c.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(Error::Kube {
            context: format!("annotating NodeClaim {}", c.name_any()),
            source: e,
        }),
    }
}

/// Writes the pool's status (if it changed) and its gauges.
async fn write_status(
    pctx: &PoolContext,
    pool: &NodePool,
    mine: &[NodeClaim],
    created: &[NodeClaim],
    deleted: &HashSet<String>,
    outcome: Outcome,
) -> Result<(), Error> {
    let ctx = &pctx.ctx;
    let old = pool.status.clone().unwrap_or_default();
    let mut new = old.clone();
    let live: Vec<&NodeClaim> = mine
        .iter()
        .chain(created.iter())
        .filter(|c| is_live(c) && !deleted.contains(&c.name_any()))
        .collect();
    let catalogue = super::nodeclaim::catalogue(ctx);
    new.replicas = i32::try_from(live.len()).unwrap_or(i32::MAX);
    new.ready_replicas = i32::try_from(
        live.iter()
            .filter(|c| c.status.as_ref().and_then(|s| s.phase) == Some(NodeClaimPhase::Available))
            .count(),
    )
    .unwrap_or(i32::MAX);
    new.selector = Some(selector(&pool.name_any()));
    let types: BTreeSet<String> = live
        .iter()
        .filter_map(|c| c.status.as_ref().and_then(|s| s.type_ref.clone()))
        .collect();
    new.node_type = (!types.is_empty()).then(|| types.into_iter().collect::<Vec<_>>().join(","));
    let mut used = Amount::default();
    let mut cost = 0i64;
    for c in &live {
        let s = c.status.clone().unwrap_or_default();
        cost += s.cost.unwrap_or(0);
        if let Some(t) = s.type_ref.as_ref().and_then(|t| catalogue.get(t)) {
            used = used.plus(&Amount::of_node(&t.amounts));
        }
    }
    new.resources = Some(NodePoolResources {
        nodes: live.len() as i64,
        cpu: Some(Quantity(resources::format_cpu(used.cpu))),
        memory: Some(Quantity(resources::format_memory(used.memory))),
    });
    new.cost = Some(cost);
    new.pending_pods = outcome.pending_pods;
    let generation = pool.metadata.generation;
    let ready = outcome.ready.unwrap_or_else(|| {
        let desired = pool.spec.replicas.unwrap_or(0);
        let outdated = live
            .iter()
            .filter(|c| c.labels().get(LABEL_TEMPLATE_HASH) != Some(&template_hash(&pool.spec)))
            .count();
        if outdated > 0 {
            (
                false,
                "RollingUpdate".to_string(),
                format!("{outdated} claim(s) from an older template are being replaced"),
            )
        } else if new.ready_replicas == desired && new.replicas == desired {
            (
                true,
                "AllReplicasReady".to_string(),
                format!("{desired} of {desired} nodes Ready"),
            )
        } else if new.replicas > desired {
            (
                false,
                "ScalingDown".to_string(),
                format!("{} claims, {desired} wanted", new.replicas),
            )
        } else {
            (
                false,
                "ScalingUp".to_string(),
                format!("{} of {desired} nodes Ready", new.ready_replicas),
            )
        }
    });
    let limit = outcome.limit.unwrap_or_else(|| {
        (
            false,
            "WithinLimits".to_string(),
            "the pool is within its limits".to_string(),
        )
    });
    conditions::set(
        &mut new.conditions,
        READY,
        status_of(ready.0),
        &ready.1,
        ready.2.clone(),
        generation,
        now(),
    );
    conditions::set(
        &mut new.conditions,
        LIMIT_REACHED,
        status_of(limit.0),
        &limit.1,
        limit.2.clone(),
        generation,
        now(),
    );
    new.observed_generation = generation;
    set_gauges(pctx, pool, &new);
    if new == old {
        return Ok(());
    }
    // Events for problems, once per reason.
    for c in &new.conditions {
        let before = conditions::get(&old.conditions, &c.type_);
        if before.is_some_and(|b| b.status == c.status && b.reason == c.reason) {
            continue;
        }
        let problem = (c.type_ == READY
            && c.status != TRUE
            && !matches!(
                c.reason.as_str(),
                "ScalingUp" | "ScalingDown" | "RollingUpdate"
            ))
            || (c.type_ == LIMIT_REACHED && c.status == TRUE);
        if problem {
            tracing::info!(nodepool = %pool.name_any(), condition = %c.type_, reason = %c.reason, message = %c.message, "pool condition");
            ctx.event(
                pool,
                EventType::Warning,
                &c.reason,
                &c.type_,
                c.message.clone(),
            )
            .await;
        }
    }
    let api: Api<NodePool> =
        Api::namespaced(ctx.client.clone(), &pool.namespace().unwrap_or_default());
    apply_status(&api, pool, &new)
        .await
        .map(|_| ())
        .map_err(conflict_or)
}

fn set_gauges(pctx: &PoolContext, pool: &NodePool, status: &NodePoolStatus) {
    let g = &pctx.ctx.metrics.nodepool_replicas;
    let key = format!(
        "{}/{}",
        pool.namespace().unwrap_or_default(),
        pool.name_any()
    );
    let desired = pool.spec.replicas.unwrap_or(status.replicas);
    g.with_label_values(&[&key, "desired"])
        .set(i64::from(desired));
    g.with_label_values(&[&key, "ready"])
        .set(i64::from(status.ready_replicas));
    let live: BTreeSet<String> = pctx
        .pools
        .state()
        .iter()
        .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
        .collect();
    if let Ok(mut known) = pctx.gauges.lock() {
        known.insert(key);
        let gone: Vec<String> = known
            .iter()
            .filter(|k| !live.contains(*k))
            .cloned()
            .collect();
        for k in gone {
            let _ = g.remove_label_values(&[&k, "desired"]);
            let _ = g.remove_label_values(&[&k, "ready"]);
            known.remove(&k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_names_are_the_pool_name_and_five_random_characters() {
        let n = claim_name("workers");
        let suffix = n.strip_prefix("workers-").expect("prefix");
        assert_eq!(suffix.len(), 5);
        assert!(suffix
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()));
        assert_ne!(claim_name("workers"), claim_name("workers"));
    }
}

//! One pool reconcile planned from observations: static pools, dynamic pools (pending pods,
//! empty nodes, limits) and the status that follows.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};

use super::*;
use crate::pool::plan::{DeleteReason, Verdict};
use crate::pool::status::{new_problems, pool_status};
use crate::pool::{ANNOTATION_EMPTY_SINCE, ANNOTATION_UNDERUTILIZED_SINCE, LABEL_TEMPLATE_HASH};
use autonodes_api::conditions;
use autonodes_api::reasons::{PoolCondition, PoolReason};
use autonodes_api::{NodePoolStatus, NodeProvider, Overhead};

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(secs).expect("time")
}

/// The time every scenario is planned at.
const NOW: i64 = 100_000;

/// Provider `p` with `small` (4 CPU, 8Gi, the cheapest) and `large` (8 CPU, 32Gi).
fn catalogue() -> Catalogue {
    catalogue_of(json!([
        {"name": "small", "cost": 1, "resources": {"cpu": "4", "memory": "8Gi"}},
        {"name": "large", "cost": 3, "resources": {"cpu": "8", "memory": "32Gi"}},
        {"name": "gpu", "cost": 20,
         "resources": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "2"}},
    ]))
}

/// The catalogue of provider `p` with `node_types` (the explain tests use it too).
pub(crate) fn catalogue_of(node_types: Value) -> Catalogue {
    let provider: NodeProvider = serde_json::from_value(json!({
        "apiVersion": "autonodes.io/v1alpha1", "kind": "NodeProvider",
        "metadata": {"name": "p"},
        "spec": {"kubeVirt": {
            "clusterRef": {"cluster": "h", "namespace": "vms"},
            "virtualMachineTemplate": {"spec": {"template": {"spec": {"domain": {"devices": {}}}}}},
            "nodeTypes": node_types,
        }},
    }))
    .expect("provider");
    Catalogue::from_provider(&provider)
}

/// NodePool `blue` in `t` (vCluster `t`, provider `p`, generation 3) with `spec` over that.
fn pool(spec: Value) -> NodePool {
    let mut s = json!({"vClusterRef": {"name": "t"}, "providerRef": "p"});
    if let (Some(s), Some(extra)) = (s.as_object_mut(), spec.as_object()) {
        s.extend(extra.clone());
    }
    serde_json::from_value(json!({
        "apiVersion": "autonodes.io/v1alpha1", "kind": "NodePool",
        "metadata": {"name": "blue", "namespace": "t", "uid": "pool-uid", "generation": 3},
        "spec": s,
    }))
    .expect("pool")
}

/// Claim `name` of `pool` made at second 0 from its template, with `status`.
fn claim(pool: &NodePool, name: &str, status: Value) -> Arc<NodeClaim> {
    let mut c = claim_object(pool, name, template_spec(&pool.spec), None);
    c.metadata.uid = Some(format!("{name}-uid"));
    c.metadata.creation_timestamp = Some(Time(at(0)));
    c.status = serde_json::from_value(status).expect("status");
    Arc::new(c)
}

/// The status of an Available claim of `type_ref` and `cost` whose node `node` has been
/// Ready since second 0.
fn available_status(type_ref: &str, node: &str, cost: i64) -> Value {
    json!({"phase": "Available", "typeRef": type_ref, "nodeName": node, "cost": cost,
           "conditions": [{"type": "Ready", "status": "True", "reason": "NodeReady",
                           "message": "", "lastTransitionTime": "1970-01-01T00:00:00Z"}]})
}

/// A claim of type `p.small` whose node `name` has been Ready since second 0.
fn available(pool: &NodePool, name: &str) -> Arc<NodeClaim> {
    claim(pool, name, available_status("p.small", name, 1))
}

/// An Available claim of `type_ref` and `cost` (node `name`), marked underutilized since
/// second `since` when given.
fn available_marked(
    pool: &NodePool,
    name: &str,
    type_ref: &str,
    cost: i64,
    since: Option<i64>,
) -> Arc<NodeClaim> {
    let c = claim(pool, name, available_status(type_ref, name, cost));
    match since {
        Some(s) => with_annotation(c, ANNOTATION_UNDERUTILIZED_SINCE, &at(s).to_string()),
        None => c,
    }
}

fn with_annotation(c: Arc<NodeClaim>, key: &str, value: &str) -> Arc<NodeClaim> {
    let mut c = (*c).clone();
    c.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(key.into(), value.into());
    Arc::new(c)
}

/// A pod the scheduler could not place, asking for `cpu`.
fn pending(name: &str, cpu: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"namespace": "default", "name": name},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
        "status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]},
    }))
    .expect("pod")
}

/// A running pod on `node`.
fn running(name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"namespace": "default", "name": name},
        "spec": {"nodeName": node, "containers": [{"name": "c"}]},
        "status": {"phase": "Running"},
    }))
    .expect("pod")
}

fn node(name: &str) -> Node {
    serde_json::from_value(json!({"metadata": {"name": name}})).expect("node")
}

/// Everything a reconcile observes, for a dynamic pool by default.
struct Scene {
    pool: NodePool,
    claims: Vec<Arc<NodeClaim>>,
    pods: Vec<Pod>,
    nodes: Vec<Node>,
    daemonsets: Vec<DaemonSet>,
    others: Vec<Arc<NodeClaim>>,
    pools: Vec<Arc<NodePool>>,
    problem: Option<Verdict>,
    unreachable: Option<Verdict>,
    catalogue: Catalogue,
    room: ClaimRoom,
    now: i64,
}

impl Scene {
    fn new(spec: Value) -> Scene {
        Scene {
            pool: pool(spec),
            claims: Vec::new(),
            pods: Vec::new(),
            nodes: Vec::new(),
            daemonsets: Vec::new(),
            others: Vec::new(),
            pools: Vec::new(),
            problem: None,
            unreachable: None,
            catalogue: catalogue(),
            room: ClaimRoom::UNBOUNDED,
            now: NOW,
        }
    }

    fn plan(&self) -> PoolPlan {
        let claimed = BTreeMap::new();
        let overheads: BTreeMap<String, Overhead> = BTreeMap::new();
        let tenant = Tenant {
            pods: &self.pods,
            nodes: &self.nodes,
            others: &self.others,
            claimed: &claimed,
            overheads: &overheads,
            daemonsets: &self.daemonsets,
            pools: &self.pools,
        };
        let tenant = match (&self.unreachable, self.pool.spec.replicas) {
            (_, Some(_)) => None,
            (Some(problem), None) => Some(Err(problem)),
            (None, None) => Some(Ok(tenant)),
        };
        plan_pool(&Observed {
            pool: &self.pool,
            claims: &self.claims,
            problem: self.problem.as_ref(),
            tenant,
            catalogue: &self.catalogue,
            repair_after: Some(Duration::from_secs(600)),
            provider_repair: None,
            batch: Default::default(),
            room: &self.room,
            registration: self
                .pool
                .status
                .as_ref()
                .and_then(|s| s.registration.as_ref()),
            now: at(self.now),
        })
    }

    fn status(&self, plan: &PoolPlan) -> NodePoolStatus {
        pool_status(
            &self.pool,
            &self.claims,
            plan,
            &self.catalogue,
            at(self.now),
        )
    }
}

fn deleted(plan: &PoolPlan) -> Vec<(&str, DeleteReason)> {
    plan.delete.iter().map(|(n, r)| (n.as_str(), *r)).collect()
}

fn condition(s: &NodePoolStatus, type_: PoolCondition) -> (&str, &str) {
    let c = conditions::get(&s.conditions, type_).expect("condition");
    (c.status.as_str(), c.reason.as_str())
}

// --- any pool -------------------------------------------------------------------------

#[test]
fn a_pool_with_a_problem_leaves_its_claims_alone_and_says_why() {
    let mut scene = Scene::new(json!({"replicas": 3}));
    scene.claims = vec![available(&scene.pool, "a")];
    scene.problem = Some(Verdict::problem(PoolReason::ProviderNotFound, "gone"));
    let plan = scene.plan();
    assert!(plan.create.is_empty() && plan.delete.is_empty());
    assert_eq!(plan.requeue, PROBLEM_RECHECK);
    let s = scene.status(&plan);
    assert_eq!(
        condition(&s, PoolCondition::Ready),
        ("False", "ProviderNotFound")
    );
    assert_eq!(s.replicas, 1, "its claims still count");
}

#[test]
fn a_template_naming_a_missing_provider_or_an_unusable_label_is_a_problem() {
    let spec = pool(json!({})).spec;
    let missing = template_problem(&spec, |_| false).expect("problem");
    assert_eq!(missing.reason, PoolReason::ProviderNotFound);
    assert_eq!(missing.message, "NodeProvider p does not exist");
    assert_eq!(template_problem(&spec, |p| p == "p"), None);
    let bad = pool(json!({"labels": {"kubernetes.io/hostname": "x"}})).spec;
    let problem = template_problem(&bad, |_| true).expect("problem");
    assert_eq!(problem.reason, PoolReason::InvalidTemplate);
}

#[test]
fn a_template_with_a_reserved_kubelet_argument_is_a_problem_that_names_it() {
    let bad = pool(json!({"kubeletArgs": {"register_with_taints": "a=b:NoSchedule"}})).spec;
    let problem = template_problem(&bad, |_| true).expect("problem");
    assert_eq!(problem.reason, PoolReason::InvalidTemplate);
    assert!(
        problem.message.contains("\"register_with_taints\"")
            && problem.message.contains("--register-with-taints"),
        "{}",
        problem.message
    );
}

// --- static pools ---------------------------------------------------------------------

#[test]
fn a_static_pool_below_its_replicas_plans_claims_from_its_template_and_looks_again_soon() {
    let mut scene = Scene::new(json!({"replicas": 3, "labels": {"team": "blue"}}));
    scene.claims = vec![available(&scene.pool, "a")];
    let plan = scene.plan();
    assert_eq!(plan.create.len(), 2);
    for c in &plan.create {
        assert_eq!(c.spec, template_spec(&scene.pool.spec));
        assert_eq!(c.replaces, None);
    }
    assert_eq!(plan.requeue, BUSY_RECHECK);
    let s = scene.status(&plan);
    assert_eq!((s.replicas, s.ready_replicas), (3, 1));
    assert_eq!(condition(&s, PoolCondition::Ready), ("False", "ScalingUp"));
    assert_eq!(
        condition(&s, PoolCondition::LimitReached),
        ("False", "WithinLimits")
    );
}

#[test]
fn a_static_pool_with_every_replica_available_is_ready_and_idle() {
    let mut scene = Scene::new(json!({"replicas": 2}));
    scene.claims = vec![available(&scene.pool, "a"), available(&scene.pool, "b")];
    let plan = scene.plan();
    assert_eq!(
        plan,
        PoolPlan {
            requeue: IDLE_RECHECK,
            repair: Some(Verdict::new(
                true,
                PoolReason::RepairAllowed,
                "0 of 2 nodes are unhealthy; a node unhealthy for its toleration is restarted, then replaced if that does not help"
            )),
            registration: Some((
                RegistrationStatus::default(),
                Verdict::new(
                    true,
                    PoolReason::NodesRegistered,
                    "the pool's latest claims came up"
                ),
            )),
            ..PoolPlan::default()
        }
    );
    let s = scene.status(&plan);
    assert_eq!(
        condition(&s, PoolCondition::NodeRegistrationHealthy),
        ("True", "NodesRegistered")
    );
    assert_eq!(s.registration, None, "nothing to record");
    assert_eq!((s.replicas, s.ready_replicas, s.cost), (2, 2, Some(2)));
    assert_eq!(
        condition(&s, PoolCondition::NodeRepair),
        ("True", "RepairAllowed")
    );
    assert_eq!(s.node_type.as_deref(), Some("p.small"));
    assert_eq!(s.selector.as_deref(), Some("autonodes.io/nodepool=blue"));
    assert_eq!(s.observed_generation, Some(3));
    assert_eq!(
        s.resources
            .as_ref()
            .and_then(|r| r.cpu.clone())
            .map(|q| q.0),
        Some("8".to_string())
    );
    assert_eq!(
        condition(&s, PoolCondition::Ready),
        ("True", "AllReplicasReady")
    );
}

#[test]
fn a_static_pool_whose_third_claim_in_a_row_failed_to_register_holds_its_replacement_and_says_why()
{
    let mut scene = Scene::new(json!({"replicas": 1}));
    let failed = claim(
        &scene.pool,
        "c",
        json!({"phase": "Failed", "conditions": [
            {"type": "Ready", "status": "False", "reason": "RegistrationTimeout", "message": "",
             "lastTransitionTime": at(NOW - 1).to_string()}]}),
    );
    scene.claims = vec![failed];
    // Two failures recorded before: this one is the third.
    scene.pool.status = Some(NodePoolStatus {
        registration: Some(RegistrationStatus {
            consecutive_failures: 2,
            last_failure_reason: Some("LaunchTimeout".into()),
            last_failure_time: Some(Time(at(NOW - 60))),
            backoff_until: None,
        }),
        ..NodePoolStatus::default()
    });
    let plan = scene.plan();
    assert_eq!(deleted(&plan), [("c", DeleteReason::Failed)]);
    assert!(plan.create.is_empty(), "no replacement while backing off");
    assert!(
        plan.requeue <= Duration::from_millis(30_100),
        "looked at again by the end"
    );
    let s = scene.status(&plan);
    assert_eq!(
        condition(&s, PoolCondition::NodeRegistrationHealthy),
        ("False", "RegistrationTimeout")
    );
    let r = s.registration.clone().expect("recorded");
    assert_eq!(r.consecutive_failures, 3);
    assert_eq!(r.backoff_until, Some(Time(at(NOW + 30))));
    assert_eq!(
        new_problems(&NodePoolStatus::default(), &s)
            .iter()
            .map(|c| c.type_.as_str())
            .collect::<Vec<_>>(),
        ["NodeRegistrationHealthy"]
    );

    // Once the back-off is over, the replacement is made.
    scene.pool.status = Some(s);
    scene.claims = Vec::new();
    scene.now = NOW + 31;
    assert_eq!(scene.plan().create.len(), 1);
}

#[test]
fn a_scaled_down_static_pool_no_longer_counts_the_claims_it_deletes() {
    let mut scene = Scene::new(json!({"replicas": 1}));
    let mut newer = (*available(&scene.pool, "b")).clone();
    newer.metadata.creation_timestamp = Some(Time(at(5)));
    scene.claims = vec![available(&scene.pool, "a"), Arc::new(newer)];
    let plan = scene.plan();
    assert_eq!(deleted(&plan), [("b", DeleteReason::ScaleDown)]);
    let s = scene.status(&plan);
    assert_eq!((s.replicas, s.ready_replicas), (1, 1));
    assert_eq!(
        condition(&s, PoolCondition::Ready),
        ("True", "AllReplicasReady")
    );
}

#[test]
fn a_replacement_keeps_the_old_claim_s_capacity_and_its_type_only_for_an_unchanged_template() {
    let scene = |hash: Option<&str>| {
        let mut scene = Scene::new(json!({"replicas": 1, "disruption": {"expireAfter": "1h"}}));
        // Made at second 0, planned at NOW, more than an hour later: expired.
        let mut old = (*available(&scene.pool, "old")).clone();
        old.spec.type_ref = Some("p.small".into());
        old.spec.desired_capacity = BTreeMap::from([("cpu".to_string(), Quantity("3".into()))]);
        if let (Some(hash), Some(labels)) = (hash, old.metadata.labels.as_mut()) {
            labels.insert(LABEL_TEMPLATE_HASH.into(), hash.into());
        }
        scene.claims = vec![Arc::new(old)];
        scene
    };
    let expired = scene(None).plan();
    let surge = &expired.create[0];
    assert_eq!(surge.replaces.as_deref(), Some("old"));
    assert_eq!(surge.spec.type_ref.as_deref(), Some("p.small"));
    assert_eq!(surge.spec.desired_capacity["cpu"].0, "3");
    let changed = scene(Some("older")).plan();
    let surge = &changed.create[0];
    assert_eq!(surge.replaces.as_deref(), Some("old"));
    assert_eq!(surge.spec.type_ref, None, "a changed template chooses anew");
    assert_eq!(surge.spec.desired_capacity["cpu"].0, "3");
}

// --- dynamic pools --------------------------------------------------------------------

#[test]
fn a_static_pool_asking_for_two_billion_replicas_creates_one_batch_and_then_stops_at_the_namespace_cap(
) {
    let mut scene = Scene::new(json!({"replicas": i32::MAX}));
    scene.room = crate::pool::limits::claim_room(&crate::pool::limits::NamespaceClaims {
        namespace: "t",
        live: 0,
        max: 1000,
        quota_nodes: None,
        quota_missing: false,
    });
    let plan = scene.plan();
    assert_eq!(plan.create.len(), crate::pool::limits::CREATE_BATCH);
    assert_eq!(plan.limit, None, "the batch alone is no limit");
    assert_eq!(plan.requeue, BUSY_RECHECK);

    scene.room = crate::pool::limits::claim_room(&crate::pool::limits::NamespaceClaims {
        namespace: "t",
        live: 1000,
        max: 1000,
        quota_nodes: None,
        quota_missing: false,
    });
    let plan = scene.plan();
    assert!(plan.create.is_empty());
    let s = scene.status(&plan);
    assert_eq!(
        condition(&s, PoolCondition::LimitReached),
        ("True", "NamespaceClaimLimit")
    );
    let problems: Vec<&str> = new_problems(&NodePoolStatus::default(), &s)
        .iter()
        .map(|c| c.reason.as_str())
        .collect();
    assert_eq!(problems, ["NamespaceClaimLimit"]);
}

#[test]
fn a_dynamic_pool_creates_no_more_claims_than_the_namespace_s_quota_leaves() {
    let mut scene = Scene::new(json!({}));
    scene.pods = (0..12).map(|i| pending(&format!("p{i:02}"), "1")).collect();
    scene.room = crate::pool::limits::claim_room(&crate::pool::limits::NamespaceClaims {
        namespace: "t",
        live: 4,
        max: 1000,
        quota_nodes: Some(("q", 5)),
        quota_missing: false,
    });
    let plan = scene.plan();
    assert_eq!(plan.create.len(), 1);
    let limit = plan.limit.clone().expect("limit");
    assert_eq!(limit.reason, PoolReason::QuotaExceeded);
    assert!(limit.message.contains("NodeQuota q"), "{}", limit.message);
}

#[test]
fn twelve_pending_one_cpu_pods_get_three_claims_pinned_to_the_cheapest_type() {
    let mut scene = Scene::new(json!({}));
    scene.pods = (0..12).map(|i| pending(&format!("p{i:02}"), "1")).collect();
    let plan = scene.plan();
    assert_eq!(plan.create.len(), 3);
    for c in &plan.create {
        assert_eq!(c.spec.type_ref.as_deref(), Some("p.small"));
        assert_eq!(c.spec.desired_capacity["cpu"].0, "4");
        assert_eq!(c.pods.len(), 4);
    }
    assert_eq!(plan.pending_pods, Some(12));
    let s = scene.status(&plan);
    assert_eq!(s.replicas, 3);
    let ready = conditions::get(&s.conditions, PoolCondition::Ready).expect("Ready");
    assert_eq!(
        (ready.reason.as_str(), ready.message.as_str()),
        ("ScalingUp", "3 new node(s) for 12 pending pod(s)")
    );
}

/// A DaemonSet in `kube-system` whose pods ask for `cpu`.
fn daemonset(name: &str, cpu: &str) -> DaemonSet {
    serde_json::from_value(json!({
        "metadata": {"namespace": "kube-system", "name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                         "spec": {"containers": [{"name": "c",
                             "resources": {"requests": {"cpu": cpu}}}]}}
        },
    }))
    .expect("daemonset")
}

#[test]
fn a_pod_that_fits_the_small_type_alone_gets_the_large_one_when_a_daemonset_takes_room_on_every_node(
) {
    let mut scene = Scene::new(json!({}));
    scene.pods = vec![pending("web", "3")];
    let plan = scene.plan();
    assert_eq!(plan.create[0].spec.type_ref.as_deref(), Some("p.small"));
    // A tenant DaemonSet asking for 2 CPU leaves 2 of the small type's 4: too little.
    scene.daemonsets = vec![daemonset("agent", "2")];
    let plan = scene.plan();
    assert_eq!(plan.create.len(), 1, "{:?}", plan.create);
    assert_eq!(plan.create[0].spec.type_ref.as_deref(), Some("p.large"));
}

#[test]
fn a_claim_on_its_way_has_room_only_for_what_its_daemon_pods_leave() {
    let mut scene = Scene::new(json!({}));
    scene.claims = vec![claim(
        &scene.pool,
        "booting",
        json!({"phase": "Provisioning", "typeRef": "p.small"}),
    )];
    scene.daemonsets = vec![daemonset("agent", "1")];
    // 4 CPU less the agent's 1: three 1-CPU pods fit, the fourth needs a new node.
    scene.pods = (0..4).map(|i| pending(&format!("p{i}"), "1")).collect();
    let plan = scene.plan();
    assert_eq!(plan.create.len(), 1, "{:?}", plan.create);
    assert_eq!(plan.create[0].pods.len(), 1);
}

#[test]
fn pending_pods_that_fit_a_claim_on_its_way_need_no_new_claim() {
    let mut scene = Scene::new(json!({}));
    scene.claims = vec![claim(
        &scene.pool,
        "booting",
        json!({"phase": "Provisioning", "typeRef": "p.small"}),
    )];
    scene.pods = (0..4).map(|i| pending(&format!("p{i}"), "1")).collect();
    let plan = scene.plan();
    assert!(plan.create.is_empty(), "{:?}", plan.create);
    assert_eq!(plan.ready.map(|r| r.reason), Some(PoolReason::Ready));
}

/// A pod the scheduler could not place, asking for 1.5 CPU, labelled `app=<app>`, with
/// required pod affinity on the hostname to `app=<partner>` if given.
fn pending_affine(name: &str, app: &str, partner: Option<&str>) -> Pod {
    let mut p = pending(name, "1500m");
    p.metadata.labels = Some(BTreeMap::from([("app".to_string(), app.to_string())]));
    if let (Some(partner), Some(spec)) = (partner, p.spec.as_mut()) {
        spec.affinity = serde_json::from_value(json!({"podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [{
                "topologyKey": "kubernetes.io/hostname",
                "labelSelector": {"matchLabels": {"app": partner}}}]}}))
        .expect("affinity");
    }
    p
}

#[test]
fn a_claim_made_for_a_pod_gives_way_before_it_joins_to_one_that_holds_the_partner_that_came_later()
{
    // `two` (2 CPU) was made for cache; web, which must run beside cache, came after it.
    let mut scene = Scene::new(json!({}));
    scene.catalogue = catalogue_of(json!([
        {"name": "two", "cost": 10, "resources": {"cpu": "2", "memory": "4Gi"}},
        {"name": "four", "cost": 30, "resources": {"cpu": "4", "memory": "8Gi"}},
    ]));
    scene.claims = vec![claim(
        &scene.pool,
        "for-cache",
        json!({"phase": "Provisioning", "typeRef": "p.two"}),
    )];
    scene.pods = vec![
        pending_affine("cache", "cache", None),
        pending_affine("web", "web", Some("cache")),
    ];
    let plan = scene.plan();
    assert_eq!(deleted(&plan), [("for-cache", DeleteReason::Outgrown)]);
    assert_eq!(plan.create.len(), 1, "{:?}", plan.create);
    assert_eq!(plan.create[0].spec.type_ref.as_deref(), Some("p.four"));
    assert_eq!(plan.create[0].pods, ["default/cache", "default/web"]);
    // With no room to create a claim now, the claim on its way stays as well.
    scene.room = ClaimRoom {
        create: 0,
        bound: crate::pool::limits::Bound::Batch,
    };
    let held = scene.plan();
    assert!(held.create.is_empty() && held.delete.is_empty(), "{held:?}");
    scene.room = ClaimRoom::UNBOUNDED;

    // Once cache runs on the claim's node, nothing is planned again: web can only follow
    // cache there, and the pool says it cannot.
    scene.claims = vec![claim(
        &scene.pool,
        "for-cache",
        json!({"phase": "Available", "typeRef": "p.two", "nodeName": "for-cache"}),
    )];
    scene.nodes = vec![node("for-cache")];
    let mut cache = pending_affine("cache", "cache", None);
    cache.spec.as_mut().expect("spec").node_name = Some("for-cache".into());
    cache.status = serde_json::from_value(json!({"phase": "Running"})).expect("status");
    scene.pods = vec![cache, pending_affine("web", "web", Some("cache"))];
    let plan = scene.plan();
    assert!(deleted(&plan).is_empty(), "{:?}", plan.delete);
    assert!(plan.create.is_empty(), "{:?}", plan.create);
    assert_eq!(
        plan.ready.map(|r| r.reason),
        Some(PoolReason::PodRulesUnsatisfiable)
    );
}

#[test]
fn a_pool_that_ignores_preferences_packs_pods_that_would_rather_be_apart_onto_one_node() {
    // Three 1-CPU replicas that would rather not share a node.
    let replica = |name: &str| {
        let mut p = pending(name, "1");
        p.metadata.labels = Some(BTreeMap::from([("app".to_string(), "web".to_string())]));
        if let Some(spec) = p.spec.as_mut() {
            spec.affinity = serde_json::from_value(json!({"podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100,
                    "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": {"app": "web"}}}}]}}))
            .expect("affinity");
        }
        p
    };
    let mut scene = Scene::new(json!({}));
    scene.pods = vec![replica("w0"), replica("w1"), replica("w2")];
    assert_eq!(scene.plan().create.len(), 3, "apart, as they prefer");
    let mut scene = Scene::new(json!({"preferencePolicy": "Ignore"}));
    scene.pods = vec![replica("w0"), replica("w1"), replica("w2")];
    let plan = scene.plan();
    assert_eq!(plan.create.len(), 1, "{:?}", plan.create);
    assert_eq!(plan.create[0].pods.len(), 3);
}

#[test]
fn the_room_of_another_pool_s_claim_in_the_same_tenant_counts_but_not_another_tenant_s() {
    let mut scene = Scene::new(json!({}));
    let other_pool = pool(json!({}));
    let mut theirs = (*claim(&other_pool, "theirs", json!({"typeRef": "p.small"}))).clone();
    theirs.metadata.owner_references = None;
    let mut elsewhere = theirs.clone();
    elsewhere.metadata.name = Some("elsewhere".into());
    elsewhere.spec.v_cluster_ref.name = "other".into();
    scene.others = vec![Arc::new(elsewhere)];
    scene.pods = (0..4).map(|i| pending(&format!("p{i}"), "1")).collect();
    assert_eq!(scene.plan().create.len(), 1);
    scene.others.push(Arc::new(theirs));
    assert!(scene.plan().create.is_empty());
}

#[test]
fn a_node_ready_for_longer_than_the_grace_offers_no_room_to_pods_the_scheduler_refused() {
    let mut scene = Scene::new(json!({}));
    scene.claims = vec![available(&scene.pool, "a")];
    scene.nodes = vec![node("a")];
    scene.pods = vec![pending("p", "1"), running("busy", "a")];
    let plan = scene.plan();
    assert_eq!(plan.create.len(), 1);
    assert!(plan.empty_since.is_empty(), "its node runs a pod");
}

#[test]
fn claims_planned_for_a_rolling_update_take_pending_pods_first() {
    let mut scene = Scene::new(json!({}));
    let mut outdated = (*available(&scene.pool, "old")).clone();
    outdated
        .metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(LABEL_TEMPLATE_HASH.into(), "older".into());
    scene.claims = vec![Arc::new(outdated)];
    scene.pods = vec![pending("p", "1"), running("busy", "old")];
    let plan = scene.plan();
    assert_eq!(plan.create.len(), 1, "{:?}", plan.create);
    assert_eq!(plan.create[0].replaces.as_deref(), Some("old"));
}

#[test]
fn limits_stop_growth_and_say_so() {
    let mut scene = Scene::new(json!({"limits": {"nodes": 1}}));
    scene.pods = (0..8).map(|i| pending(&format!("p{i}"), "1")).collect();
    let plan = scene.plan();
    assert_eq!(plan.create.len(), 1);
    let limit = plan.limit.clone().expect("limit");
    assert_eq!(
        (limit.status, limit.reason, limit.message.as_str()),
        (
            true,
            PoolReason::LimitReached,
            "4 pending pod(s) need nodes beyond the pool's limits (nodes 1)"
        )
    );
    let s = scene.status(&plan);
    let problems: Vec<&str> = new_problems(&NodePoolStatus::default(), &s)
        .iter()
        .map(|c| c.reason.as_str())
        .collect();
    assert_eq!(problems, ["LimitReached"], "ScalingUp is progress");
    assert!(new_problems(&s, &s).is_empty(), "once per reason");
}

#[test]
fn a_claim_being_deleted_counts_against_the_pool_s_limits_until_it_is_gone() {
    let mut scene = Scene::new(json!({"limits": {"nodes": 1}}));
    let mut draining = (*available(&scene.pool, "old")).clone();
    draining.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
    scene.claims = vec![Arc::new(draining)];
    scene.pods = vec![pending("p", "1")];
    let plan = scene.plan();
    assert!(plan.create.is_empty(), "{:?}", plan.create);
    let limit = plan.limit.clone().expect("limit");
    assert_eq!(limit.reason, PoolReason::LimitReached, "{}", limit.message);
    scene.claims.clear();
    assert_eq!(
        scene.plan().create.len(),
        1,
        "once it is gone, the pod gets its node"
    );
}

/// A pod the scheduler could not place, asking for `gpus` of `nvidia.com/gpu` (as limits,
/// which the API server copies to requests) and 1 cpu.
fn pending_gpu(name: &str, gpus: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"namespace": "default", "name": name},
        "spec": {"containers": [{"name": "c", "resources": {
            "requests": {"cpu": "1"}, "limits": {"nvidia.com/gpu": gpus}}}]},
        "status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]},
    }))
    .expect("pod")
}

#[test]
fn pending_gpu_pods_get_nodes_of_the_type_offering_gpus_and_plain_pods_do_not() {
    let mut scene = Scene::new(json!({}));
    scene.pods = vec![
        pending_gpu("g1", "1"),
        pending_gpu("g2", "1"),
        pending_gpu("g3", "1"),
        pending("plain", "1"),
    ];
    let plan = scene.plan();
    let mut types: Vec<(&str, usize)> = plan
        .create
        .iter()
        .map(|c| (c.spec.type_ref.as_deref().unwrap_or_default(), c.pods.len()))
        .collect();
    types.sort();
    // Two GPUs per node: two gpu nodes for three GPU pods; the plain pod takes room left
    // on the first (first fit) rather than opening a node of its own.
    assert_eq!(types, [("p.gpu", 1), ("p.gpu", 3)], "{:?}", plan.create);
    let gpu_claims: Vec<&str> = plan
        .create
        .iter()
        .filter_map(|c| c.spec.desired_capacity.get("nvidia.com/gpu"))
        .map(|q| q.0.as_str())
        .collect();
    assert_eq!(gpu_claims.len(), 2, "desiredCapacity asks for the GPUs");
    assert_eq!(plan.pending_pods, Some(4));
    scene.pods = vec![pending("plain", "1")];
    let plan = scene.plan();
    assert_eq!(plan.create.len(), 1);
    assert_eq!(plan.create[0].spec.type_ref.as_deref(), Some("p.small"));
}

#[test]
fn gpu_limits_count_the_gpus_of_the_pool_s_nodes() {
    let mut scene = Scene::new(json!({"limits": {"nvidia.com/gpu": "2"}}));
    scene.pods = (0..3).map(|i| pending_gpu(&format!("g{i}"), "1")).collect();
    let plan = scene.plan();
    assert_eq!(plan.create.len(), 1, "one node of 2 GPUs reaches the limit");
    let limit = plan.limit.clone().expect("limit");
    assert_eq!(
        (limit.status, limit.message.as_str()),
        (
            true,
            "1 pending pod(s) need nodes beyond the pool's limits (nvidia.com/gpu 2)"
        )
    );
    scene.claims = vec![claim(
        &scene.pool,
        "gpu-node",
        json!({"phase": "Available", "typeRef": "p.gpu", "nodeName": "gpu-node"}),
    )];
    scene.nodes = vec![node("gpu-node")];
    let s = scene.status(&scene.plan());
    let used = s.resources.expect("resources");
    assert_eq!(used.extended["nvidia.com/gpu"].0, "2");
}

/// Dynamic pool `name` of tenant `t` with `weight` and `spec` over that.
fn weighted(name: &str, weight: i32, spec: Value) -> NodePool {
    let mut p = pool(spec);
    p.metadata.name = Some(name.into());
    p.metadata.uid = Some(format!("{name}-uid"));
    p.spec.weight = Some(weight);
    p
}

#[test]
fn a_pending_pod_is_left_to_a_higher_weight_pool_until_that_one_reaches_its_limits() {
    // `blue` (weight 0) and `red` (weight 10) both take any pod.
    let mut scene = Scene::new(json!({}));
    let red = weighted("red", 10, json!({"limits": {"nodes": 1}}));
    scene.pools = vec![Arc::new(scene.pool.clone()), Arc::new(red.clone())];
    scene.pods = vec![pending("p", "1")];
    let plan = scene.plan();
    assert!(plan.create.is_empty(), "red goes first: {:?}", plan.create);
    assert_eq!(plan.pending_pods, Some(0));
    // red is at its limit of one node: blue takes the pod.
    let mut reds = (*available(&red, "red-1")).clone();
    reds.metadata.name = Some("red-1".into());
    scene.others = vec![Arc::new(reds)];
    scene.nodes = vec![node("red-1")];
    scene.pods = vec![pending("p", "1"), running("busy", "red-1")];
    let plan = scene.plan();
    assert_eq!(plan.create.len(), 1, "red is full");
    // A lower weight, or the same weight and a later name, comes after blue.
    scene.others.clear();
    scene.pools = vec![
        Arc::new(weighted("green", 0, json!({}))),
        Arc::new(weighted("amber", 0, json!({"providerRef": "missing"}))),
    ];
    assert_eq!(
        scene.plan().create.len(),
        1,
        "green ranks after blue, amber has no node type"
    );
    scene.pools = vec![Arc::new(weighted("azure", 0, json!({})))];
    assert!(
        scene.plan().create.is_empty(),
        "same weight: the first name goes first"
    );
}

/// The zones each new claim of `plan` is pinned to.
fn claim_zones(plan: &PoolPlan) -> Vec<Vec<String>> {
    plan.create
        .iter()
        .map(|c| {
            c.spec
                .requirements
                .iter()
                .filter(|r| r.key == "topology.kubernetes.io/zone")
                .flat_map(|r| r.values.clone())
                .collect()
        })
        .collect()
}

#[test]
fn pods_spread_over_zones_get_claims_pinned_to_the_zones_of_a_type_that_offers_several() {
    let mut scene = Scene::new(json!({}));
    scene.catalogue = catalogue_of(json!([
        {"name": "small", "cost": 1, "resources": {"cpu": "4", "memory": "8Gi"},
         "properties": {"topology.kubernetes.io/zone": "a,b"}}
    ]));
    scene.pods = (0..2)
        .map(|i| {
            serde_json::from_value(json!({
                "metadata": {"namespace": "default", "name": format!("web-{i}"),
                             "labels": {"app": "web"}},
                "spec": {
                    "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
                    "topologySpreadConstraints": [{
                        "maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                        "whenUnsatisfiable": "DoNotSchedule",
                        "labelSelector": {"matchLabels": {"app": "web"}}}]
                },
                "status": {"phase": "Pending", "conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]},
            }))
            .expect("pod")
        })
        .collect();
    let plan = scene.plan();
    let zones = claim_zones(&plan);
    assert_eq!(zones, [vec!["a".to_string()], vec!["b".to_string()]]);
    // Plain pods use the first zone offered, as one node.
    scene.pods = vec![pending("p1", "1"), pending("p2", "1")];
    let plan = scene.plan();
    assert_eq!(plan.create.len(), 1);
}

/// [`pending`], marked unschedulable at second `marked`.
fn marked(name: &str, cpu: &str, marked: i64) -> Pod {
    let mut p = pending(name, cpu);
    if let Some(c) = p
        .status
        .as_mut()
        .and_then(|s| s.conditions.as_mut())
        .and_then(|cs| cs.first_mut())
    {
        c.last_transition_time = Some(Time(at(marked)));
    }
    p
}

#[test]
fn a_burst_of_pending_pods_gets_its_nodes_once_no_pod_was_marked_for_a_while_or_the_first_waited_long(
) {
    let mut scene = Scene::new(json!({}));
    // Marked a second ago: more may come; the pool looks again when the batch closes.
    scene.pods = vec![marked("a", "1", NOW - 5), marked("b", "1", NOW - 1)];
    let plan = scene.plan();
    assert!(plan.create.is_empty(), "{:?}", plan.create);
    assert!(
        plan.requeue <= Duration::from_millis(1200),
        "{:?}",
        plan.requeue
    );
    assert_eq!(plan.pending_pods, Some(2));
    // Nothing new for two seconds: one node for both.
    scene.pods = vec![marked("a", "1", NOW - 5), marked("b", "1", NOW - 2)];
    assert_eq!(scene.plan().create.len(), 1);
    // Pods keep coming, but the first has waited ten seconds: the batch closes.
    scene.pods = vec![marked("a", "1", NOW - 10), marked("b", "1", NOW)];
    assert_eq!(scene.plan().create.len(), 1);
    // A mark an hour ahead of the controller's clock holds nothing.
    scene.pods = vec![marked("a", "1", NOW + 3600)];
    assert_eq!(scene.plan().create.len(), 1);
}

#[test]
fn a_zone_spread_counts_the_pods_on_nodes_the_scheduler_has_long_seen() {
    let mut scene = Scene::new(json!({}));
    scene.catalogue = catalogue_of(json!([
        {"name": "small", "cost": 1, "resources": {"cpu": "4", "memory": "8Gi"},
         "properties": {"topology.kubernetes.io/zone": "a,b"}}
    ]));
    // A node in zone a, Ready since second 0 (long past the grace in which the scheduler
    // may not have tried it yet), runs two web pods and has room for more.
    let mut old = (*available(&scene.pool, "old-a")).clone();
    old.spec.requirements = serde_json::from_value(json!([
        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}]))
    .expect("requirements");
    scene.claims = vec![Arc::new(old)];
    scene.nodes = vec![node("old-a")];
    let web = |name: &str, node: Option<&str>| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"namespace": "default", "name": name, "labels": {"app": "web"}},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
                "topologySpreadConstraints": [{
                    "maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                    "whenUnsatisfiable": "DoNotSchedule",
                    "labelSelector": {"matchLabels": {"app": "web"}}}]
            },
            "status": match node {
                Some(_) => json!({"phase": "Running"}),
                None => json!({"phase": "Pending", "conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}),
            },
        }))
        .expect("pod")
    };
    scene.pods = vec![
        web("web-0", Some("old-a")),
        web("web-1", Some("old-a")),
        web("web-2", None),
    ];
    // The scheduler left web-2 pending: zone a has two, zone b none. Its node goes to b.
    let plan = scene.plan();
    let zones = claim_zones(&plan);
    assert_eq!(zones, [vec!["b".to_string()]]);
}

#[test]
fn no_fitting_node_type_is_a_problem() {
    let mut scene = Scene::new(json!({"requirements": [
        {"key": "autonodes.io/node-type", "operator": "In", "values": ["huge"]}]}));
    scene.pods = vec![pending("p", "1")];
    let plan = scene.plan();
    assert!(plan.create.is_empty());
    assert_eq!(
        plan.ready.map(|r| r.reason),
        Some(PoolReason::NoMatchingNodeType)
    );
}

#[test]
fn a_dynamic_pool_whose_tenant_cannot_be_reached_still_replaces_failed_claims() {
    let mut scene = Scene::new(json!({}));
    scene.claims = vec![claim(&scene.pool, "f", json!({"phase": "Failed"}))];
    scene.unreachable = Some(Verdict::problem(PoolReason::TenantUnreachable, "t: down"));
    let plan = scene.plan();
    assert_eq!(deleted(&plan), [("f", DeleteReason::Failed)]);
    assert_eq!(plan.requeue, UNREACHABLE_RECHECK);
    assert_eq!(
        plan.ready.map(|r| r.reason),
        Some(PoolReason::TenantUnreachable)
    );
}

#[test]
fn an_empty_node_is_marked_then_removed_after_consolidate_after() {
    let mut scene = Scene::new(json!({}));
    scene.claims = vec![available(&scene.pool, "a")];
    scene.nodes = vec![node("a")];
    let plan = scene.plan();
    assert_eq!(plan.empty_since, [("a".to_string(), Some(at(NOW)))]);
    assert!(plan.delete.is_empty());
    assert_eq!(plan.requeue, Duration::from_secs(30), "at most 30s");

    let since = |secs: i64| at(NOW - secs).to_string();
    scene.claims = vec![with_annotation(
        available(&scene.pool, "a"),
        ANNOTATION_EMPTY_SINCE,
        &since(10),
    )];
    let plan = scene.plan();
    assert!(plan.delete.is_empty() && plan.empty_since.is_empty());
    assert_eq!(plan.requeue, Duration::from_millis(20_200));

    scene.claims = vec![with_annotation(
        available(&scene.pool, "a"),
        ANNOTATION_EMPTY_SINCE,
        &since(30),
    )];
    assert_eq!(deleted(&scene.plan()), [("a", DeleteReason::Empty)]);

    let mut never = Scene::new(json!({"disruption": {"consolidateAfter": "Never"}}));
    never.claims = scene.claims.clone();
    never.nodes = vec![node("a")];
    let plan = never.plan();
    assert!(plan.delete.is_empty() && plan.empty_since.is_empty());
}

#[test]
fn a_node_that_runs_pods_again_loses_its_empty_mark() {
    let mut scene = Scene::new(json!({}));
    scene.claims = vec![with_annotation(
        available(&scene.pool, "a"),
        ANNOTATION_EMPTY_SINCE,
        &at(0).to_string(),
    )];
    scene.pods = vec![running("web", "a")];
    let plan = scene.plan();
    assert_eq!(plan.empty_since, [("a".to_string(), None)]);
    assert!(plan.delete.is_empty());
}

#[test]
fn empty_nodes_go_longest_empty_first_within_the_budget_left_by_draining_ones() {
    let mut scene = Scene::new(json!({}));
    let empty = |name: &str, secs: i64| {
        with_annotation(
            available(&scene.pool, name),
            ANNOTATION_EMPTY_SINCE,
            &at(secs).to_string(),
        )
    };
    scene.claims = vec![empty("recent", 50), empty("oldest", 10)];
    let plan = scene.plan();
    assert_eq!(deleted(&plan), [("oldest", DeleteReason::Empty)]);
    assert_eq!(plan.requeue, Duration::from_millis(2_200));

    let mut draining = (*available(&scene.pool, "going")).clone();
    draining.metadata.deletion_timestamp = Some(Time(at(1)));
    scene.claims.push(Arc::new(draining));
    assert!(scene.plan().delete.is_empty(), "the budget (1) is in use");
}

#[test]
fn a_budget_limited_to_empty_nodes_holds_them_and_lets_underutilized_ones_go() {
    let marked = |scene: &Scene, name: &str, key: &str| {
        with_annotation(available(&scene.pool, name), key, &at(NOW - 60).to_string())
    };
    let spec = json!({"disruption": {"budgets": [
        {"nodes": "0", "reasons": ["Empty"]},
        {"nodes": "100%", "reasons": ["Underutilized"]},
    ]}});
    let mut scene = two_half_empty_nodes(spec);
    scene.claims = vec![
        marked(&scene, "a", ANNOTATION_UNDERUTILIZED_SINCE),
        marked(&scene, "b", ANNOTATION_UNDERUTILIZED_SINCE),
        marked(&scene, "idle", ANNOTATION_EMPTY_SINCE),
    ];
    scene.nodes.push(node("idle"));
    let plan = scene.plan();
    assert_eq!(deleted(&plan), [("a", DeleteReason::Underutilized)]);

    // The same budgets the other way round: the empty node goes, the underutilized stay.
    scene.pool = pool(json!({"disruption": {"budgets": [
        {"nodes": "1", "reasons": ["Empty"]},
        {"nodes": "0", "reasons": ["Underutilized"]},
    ]}}));
    let plan = scene.plan();
    assert_eq!(deleted(&plan), [("idle", DeleteReason::Empty)]);
    scene
        .claims
        .retain(|c| c.metadata.name.as_deref() != Some("idle"));
    assert!(
        scene.plan().delete.is_empty(),
        "no budget for Underutilized"
    );
}

/// A running pod on `node` asking for `cpu`.
fn running_cpu(name: &str, node: &str, cpu: &str) -> Pod {
    running_requesting(name, node, json!({"cpu": cpu}))
}

/// A running pod on `node` with these `requests`.
fn running_requesting(name: &str, node: &str, requests: Value) -> Pod {
    let mut p = running(name, node);
    if let Some(c) = p.spec.as_mut().and_then(|s| s.containers.first_mut()) {
        c.resources = serde_json::from_value(json!({"requests": requests})).ok();
    }
    p
}

/// Nodes `a` (one 1-CPU pod) and `b` (two), both Available `p.small` (4 CPU).
fn two_half_empty_nodes(spec: Value) -> Scene {
    let mut scene = Scene::new(spec);
    scene.claims = vec![available(&scene.pool, "a"), available(&scene.pool, "b")];
    scene.nodes = vec![node("a"), node("b")];
    scene.pods = vec![
        running_cpu("a1", "a", "1"),
        running_cpu("b1", "b", "1"),
        running_cpu("b2", "b", "1"),
    ];
    scene
}

#[test]
fn an_underutilized_node_is_marked_then_the_one_with_least_to_move_goes_after_consolidate_after() {
    let mut scene = two_half_empty_nodes(json!({}));
    let plan = scene.plan();
    // Either node's pods fit the other's room: both are marked, nothing goes yet.
    assert_eq!(
        plan.underutilized_since,
        [
            ("a".to_string(), Some(at(NOW))),
            ("b".to_string(), Some(at(NOW)))
        ]
    );
    assert!(plan.delete.is_empty() && plan.empty_since.is_empty());
    let marked = |c: Arc<NodeClaim>, secs: i64| {
        with_annotation(
            c,
            ANNOTATION_UNDERUTILIZED_SINCE,
            &at(NOW - secs).to_string(),
        )
    };
    scene.claims = vec![
        marked(available(&scene.pool, "a"), 10),
        marked(available(&scene.pool, "b"), 10),
    ];
    assert!(scene.plan().delete.is_empty(), "10s of 30s waited");
    scene.claims = vec![
        marked(available(&scene.pool, "a"), 40),
        marked(available(&scene.pool, "b"), 50),
    ];
    let plan = scene.plan();
    assert_eq!(
        deleted(&plan),
        [("a", DeleteReason::Underutilized)],
        "one node at a time, the one with the least to move"
    );
    // While it drains, nothing else goes, and b (its pods no longer fit anywhere) loses
    // its mark.
    let mut going = (*scene.claims[0]).clone();
    going.metadata.deletion_timestamp = Some(Time(at(NOW)));
    scene.claims[0] = Arc::new(going);
    let plan = scene.plan();
    assert!(plan.delete.is_empty());
    assert_eq!(plan.underutilized_since, [("b".to_string(), None)]);
}

#[test]
fn two_nodes_whose_pods_fit_one_cheaper_node_together_are_replaced_by_it_and_go_one_by_one() {
    let mut scene = Scene::new(json!({}));
    // Two 4-CPU nodes at 20 each cost 40; one 8-CPU node costs 30.
    scene.catalogue = catalogue_of(json!([
        {"name": "small", "cost": 20, "resources": {"cpu": "4", "memory": "8Gi"}},
        {"name": "large", "cost": 30, "resources": {"cpu": "8", "memory": "32Gi"}},
    ]));
    let node_claim =
        |name: &str, since: Option<i64>| available_marked(&scene.pool, name, "p.small", 20, since);
    scene.claims = vec![node_claim("a", None), node_claim("b", None)];
    scene.nodes = vec![node("a"), node("b")];
    // 2.5 CPU on each: neither fits the other's room, nor a cheaper node of its own.
    let pod = |name: &str, node: &str| {
        running_requesting(name, node, json!({"cpu": "2500m", "memory": "256Mi"}))
    };
    scene.pods = vec![pod("pa", "a"), pod("pb", "b")];
    let plan = scene.plan();
    assert_eq!(
        plan.underutilized_since,
        [
            ("a".to_string(), Some(at(NOW))),
            ("b".to_string(), Some(at(NOW)))
        ],
        "together they fit one large node, cheaper than both"
    );
    assert!(plan.create.is_empty() && plan.delete.is_empty());
    // Due: one large node first, for both nodes' pods, replacing the first.
    scene.claims = vec![node_claim("a", Some(0)), node_claim("b", Some(0))];
    let plan = scene.plan();
    assert!(plan.delete.is_empty());
    assert_eq!(plan.create.len(), 1, "{:?}", plan.create);
    assert_eq!(plan.create[0].replaces.as_deref(), Some("a"));
    assert_eq!(plan.create[0].spec.type_ref.as_deref(), Some("p.large"));
    assert_eq!(plan.create[0].spec.desired_capacity["cpu"].0, "5");
    // Available: a goes first, its pod moves there; then b's pod fits the rest of its room.
    let mut big = claim_object(&scene.pool, "big", plan.create[0].spec.clone(), Some("a"));
    big.status = serde_json::from_value(available_status("p.large", "big", 30)).expect("status");
    scene.claims.push(Arc::new(big));
    scene.nodes.push(node("big"));
    let plan = scene.plan();
    assert_eq!(deleted(&plan), [("a", DeleteReason::Underutilized)]);
    scene
        .claims
        .retain(|c| c.metadata.name.as_deref() != Some("a"));
    scene
        .nodes
        .retain(|n| n.metadata.name.as_deref() != Some("a"));
    scene.pods = vec![
        running_cpu("pa", "big", "2500m"),
        running_cpu("pb", "b", "2500m"),
    ];
    let plan = scene.plan();
    assert_eq!(deleted(&plan), [("b", DeleteReason::Underutilized)]);
    assert!(plan.create.is_empty());
}

#[test]
fn a_node_a_cheaper_type_could_replace_gets_its_replacement_first_and_goes_once_it_is_available() {
    let mut scene = Scene::new(json!({}));
    let large =
        |name: &str, since: Option<i64>| available_marked(&scene.pool, name, "p.large", 3, since);
    scene.claims = vec![large("big", None)];
    scene.nodes = vec![node("big")];
    scene.pods = vec![running_cpu("a", "big", "1"), running_cpu("b", "big", "1")];
    let plan = scene.plan();
    assert_eq!(
        plan.underutilized_since,
        [("big".to_string(), Some(at(NOW)))],
        "two 1-CPU pods on an 8-CPU node of cost 3 fit a 4-CPU node of cost 1"
    );
    assert!(plan.create.is_empty());
    // Due: the replacement first, of the cheaper type, asking for what the pods ask for.
    scene.claims = vec![large("big", Some(0))];
    let plan = scene.plan();
    assert!(plan.delete.is_empty());
    assert_eq!(plan.create.len(), 1, "{:?}", plan.create);
    assert_eq!(plan.create[0].replaces.as_deref(), Some("big"));
    assert_eq!(plan.create[0].spec.type_ref.as_deref(), Some("p.small"));
    assert_eq!(plan.create[0].spec.desired_capacity["cpu"].0, "2");
    // On its way: nothing more.
    let mut replacement = claim_object(
        &scene.pool,
        "small",
        plan.create[0].spec.clone(),
        Some("big"),
    );
    replacement.metadata.creation_timestamp = Some(Time(at(NOW)));
    scene.claims.push(Arc::new(replacement.clone()));
    let plan = scene.plan();
    assert!(plan.create.is_empty() && plan.delete.is_empty(), "{plan:?}");
    // Available: the pods fit its room; the large node goes, and the replacement is not
    // taken for an empty node meanwhile.
    replacement.status =
        serde_json::from_value(available_status("p.small", "small", 1)).expect("status");
    scene.claims[1] = Arc::new(replacement);
    scene.nodes.push(node("small"));
    let plan = scene.plan();
    assert_eq!(deleted(&plan), [("big", DeleteReason::Underutilized)]);
    assert!(plan.empty_since.is_empty(), "{:?}", plan.empty_since);
}

#[test]
fn when_empty_pools_and_nodes_marked_do_not_disrupt_are_not_consolidated_while_busy() {
    let scene = two_half_empty_nodes(json!({"disruption": {"consolidationPolicy": "WhenEmpty"}}));
    let plan = scene.plan();
    assert!(plan.underutilized_since.is_empty() && plan.delete.is_empty());

    // A pod marked do-not-disrupt holds its node; the Node's own mark holds it too.
    let mut scene = two_half_empty_nodes(json!({}));
    scene.pods[0]
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert("karpenter.sh/do-not-disrupt".into(), "true".into());
    scene.nodes[1]
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert("autonodes.io/do-not-disrupt".into(), "true".into());
    let plan = scene.plan();
    assert!(plan.underutilized_since.is_empty(), "{plan:?}");

    // An empty node marked on its Node stays too.
    let mut scene = Scene::new(json!({}));
    scene.claims = vec![available(&scene.pool, "a")];
    scene.nodes = vec![node("a")];
    scene.nodes[0]
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert("karpenter.sh/do-not-disrupt".into(), "true".into());
    assert!(scene.plan().empty_since.is_empty());
}

#[test]
fn no_node_is_underutilized_or_goes_while_pending_pods_wait_for_the_pool() {
    let mut scene = two_half_empty_nodes(json!({}));
    let marked =
        |c: Arc<NodeClaim>| with_annotation(c, ANNOTATION_UNDERUTILIZED_SINCE, &at(0).to_string());
    scene.claims = vec![
        marked(available(&scene.pool, "a")),
        marked(available(&scene.pool, "b")),
    ];
    scene.pods.push(pending("waiting", "3"));
    let plan = scene.plan();
    assert!(
        !plan
            .delete
            .iter()
            .any(|(_, r)| *r == DeleteReason::Underutilized),
        "{:?}",
        plan.delete
    );
    // Their room may be what the waiting pod needs: the marks go, and come back (from
    // then on) once no pod waits.
    let mut cleared = plan.underutilized_since.clone();
    cleared.sort();
    assert_eq!(
        cleared,
        vec![("a".to_string(), None), ("b".to_string(), None)]
    );
}

#[test]
fn an_imported_pool_says_whether_its_vcluster_configuration_could_be_imported() {
    use crate::pool::status::{import_verdict, is_problem};
    let scene = Scene::new(json!({"replicas": 0}));
    let mut plan = scene.plan();
    plan.imported = Some(import_verdict(Some(
        "vc-config-t: the configuration is not YAML",
    )));
    let condition = |plan: &PoolPlan| {
        scene
            .status(plan)
            .conditions
            .into_iter()
            .find(|c| c.type_ == "VClusterConfig")
            .expect("condition")
    };
    let c = condition(&plan);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "InvalidVClusterConfig")
    );
    assert!(is_problem(&c), "a Warning Event");
    plan.imported = Some(import_verdict(None));
    let c = condition(&plan);
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "Imported"));
    assert!(!is_problem(&c));
    // A pool written by hand has no such condition.
    let s = scene.status(&scene.plan());
    assert!(!s.conditions.iter().any(|c| c.type_ == "VClusterConfig"));
}

#[test]
fn a_node_whose_pods_carry_anti_affinity_is_consolidated_when_they_may_share_the_other_node_and_kept_when_not(
) {
    // `a1` keeps pods labelled `app: db` off its node. Beside `b1` (app web) it may move;
    // beside a db pod it may not.
    let anti = |mut p: Pod| {
        if let Some(s) = p.spec.as_mut() {
            s.affinity = serde_json::from_value(json!({"podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [{
                    "topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"matchLabels": {"app": "db"}}}]}}))
            .ok();
        }
        p
    };
    let labelled = |mut p: Pod, app: &str| {
        p.metadata.labels = Some(BTreeMap::from([("app".to_string(), app.to_string())]));
        p
    };
    let mut scene = two_half_empty_nodes(json!({}));
    scene.pods = vec![
        anti(labelled(running_cpu("a1", "a", "1"), "db")),
        labelled(running_cpu("b1", "b", "1"), "web"),
        labelled(running_cpu("b2", "b", "1"), "web"),
    ];
    let plan = scene.plan();
    assert!(
        plan.underutilized_since
            .contains(&("a".to_string(), Some(at(NOW)))),
        "{:?}",
        plan.underutilized_since
    );
    scene.pods[1] = labelled(running_cpu("b1", "b", "1"), "db");
    scene.pods[2] = anti(labelled(running_cpu("b2", "b", "1"), "web"));
    let plan = scene.plan();
    assert!(plan.underutilized_since.is_empty(), "{plan:?}");
}

#[test]
fn one_plan_packs_at_most_five_thousand_pending_pods_the_oldest_first() {
    let mut scene = Scene::new(json!({}));
    scene.pods = (0..5_010)
        .map(|i| {
            let mut p = pending(&format!("p{i:05}"), "10m");
            p.metadata.creation_timestamp = Some(Time(at(i)));
            p
        })
        .collect();
    let plan = scene.plan();
    assert_eq!(plan.pending_pods, Some(5_000));
    let packed: BTreeSet<&str> = plan
        .create
        .iter()
        .flat_map(|c| c.pods.iter().map(String::as_str))
        .collect();
    assert!(packed.contains("default/p00000") && packed.contains("default/p04999"));
    assert!(
        !packed.contains("default/p05000"),
        "the newest wait for the next plan"
    );
}

/// The status of an Available claim whose node's kubelet is v1.19 under a v1.20 tenant,
/// drifted for `reason` (`KubernetesVersionChanged`: since the tenant's upgrade;
/// `KubeletVersionMismatch`: since it came up).
fn version_drifted_status(node: &str, reason: &str) -> Value {
    let mut s = available_status("p.small", node, 1);
    if let Some(cs) = s["conditions"].as_array_mut() {
        cs.push(
            json!({"type": "Drifted", "status": "True", "reason": reason,
            "message": "the node's kubelet is v1.19, the tenant runs v1.20",
            "lastTransitionTime": "1970-01-01T00:00:00Z"}),
        );
    }
    s
}

#[test]
fn nodes_that_drifted_after_joining_roll_but_one_that_came_up_drifted_holds_the_roll() {
    let changed = "KubernetesVersionChanged";
    let mismatch = "KubeletVersionMismatch";
    let mut scene = Scene::new(json!({"replicas": 3}));
    // The tenant was upgraded after these nodes joined: they roll, one at a time.
    scene.claims = ["a", "b", "c"]
        .iter()
        .map(|n| claim(&scene.pool, n, version_drifted_status(n, changed)))
        .collect();
    let plan = scene.plan();
    assert_eq!(plan.create.len(), 1, "{plan:?}");
    assert_eq!(plan.version_drift_held, None);
    // The replacement came up with the same kubelet: nothing more is replaced, the pool
    // says why and what to change, and is Ready with its replicas.
    scene.claims[0] = claim(&scene.pool, "d", version_drifted_status("d", mismatch));
    let plan = scene.plan();
    assert!(plan.create.is_empty() && plan.delete.is_empty(), "{plan:?}");
    let held = plan.version_drift_held.clone().expect("held");
    assert!(
        held.message.contains("the node of claim d came up drifted"),
        "{}",
        held.message
    );
    assert!(held
        .message
        .contains("kubelet is v1.19, the tenant runs v1.20"));
    assert!(held
        .message
        .contains("autonodes.io/kubernetes-download-url"));
    let s = scene.status(&plan);
    assert_eq!(
        condition(&s, PoolCondition::VersionDriftHeld),
        ("True", "ReplacementWouldDrift")
    );
    assert_eq!(
        condition(&s, PoolCondition::Ready),
        ("True", "AllReplicasReady")
    );
    assert_eq!(new_problems(&NodePoolStatus::default(), &s).len(), 1);
    // Once that node is gone, the others roll again.
    scene.claims[0] = available(&scene.pool, "e");
    let plan = scene.plan();
    assert_eq!(plan.version_drift_held, None);
    assert_eq!(plan.create.len(), 1, "the drifted claims roll again");
    let s = scene.status(&plan);
    assert!(conditions::get(&s.conditions, PoolCondition::VersionDriftHeld).is_none());
    // A pool that does not roll for the version is never held, nor rolls a mismatch.
    let mut off = Scene::new(json!({"replicas": 1,
        "disruption": {"kubernetesVersionDrift": "Disabled"}}));
    off.claims = vec![claim(&off.pool, "d", version_drifted_status("d", mismatch))];
    let plan = off.plan();
    assert_eq!(plan.version_drift_held, None);
    assert!(plan.create.is_empty());
}

//! What the NodePool tests share: their provider `pools`, a pool's claims, the tenant's pods
//! and nodes, a real `kube-scheduler` on the tenant, `kubectl` on the management cluster.

use std::time::Duration;

use autonodes_api::{NodeClaim, NodeClaimPhase, LABEL_NODEPOOL};
use autonodes_testenv::testenv::ManagedProcess;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::ResourceExt;
use serde_json::json;

use super::world::{provider_yaml, World};

/// How long a pool test waits for one step.
pub const WAIT: Duration = Duration::from_secs(150);

/// The NodeProvider `pools` on the playground's host (`test-kubevirt-1`, a base template of
/// 4 CPU and 8Gi) with these `nodeTypes` entries (as [`node_type`] makes them).
pub fn pools_provider(node_types: &[String]) -> String {
    provider_yaml(
        "pools",
        "test-kubevirt-1",
        "4",
        "8Gi",
        &node_types.join("\n"),
    )
}

/// A `nodeTypes` entry `name` of `cpu` and `memory`; more of its fields (or more resources)
/// may follow as lines indented as its `resources` (or their entries).
pub fn node_type(name: &str, cpu: &str, memory: &str) -> String {
    format!("      - name: {name}\n        resources:\n          cpu: {cpu}\n          memory: {memory}")
}

/// The type `small`: 4 CPU, 8Gi.
pub fn small() -> String {
    node_type("small", "4", "8Gi")
}

/// The type `large`: 8 CPU, 32Gi.
pub fn large() -> String {
    node_type("large", "8", "32Gi")
}

/// The claims labelled with `pool`.
pub async fn pool_claims(world: &World, pool: &str) -> Vec<NodeClaim> {
    world
        .claims()
        .list(&ListParams::default().labels(&format!("{LABEL_NODEPOOL}={pool}")))
        .await
        .expect("list claims")
        .items
}

/// A claim's phase.
pub fn phase(c: &NodeClaim) -> Option<NodeClaimPhase> {
    c.status.as_ref().and_then(|s| s.phase)
}

/// Whether a claim is Available and not being deleted.
pub fn available(c: &NodeClaim) -> bool {
    c.metadata.deletion_timestamp.is_none() && phase(c) == Some(NodeClaimPhase::Available)
}

/// Whether a Node's `Ready` condition is True.
pub fn node_ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The tenant's Ready Nodes.
pub async fn ready_nodes(world: &World) -> Vec<Node> {
    world.nodes().await.into_iter().filter(node_ready).collect()
}

/// `kubectl` on the management cluster; fails the test when it fails.
pub fn kubectl(world: &World, args: &[&str]) -> String {
    super::kubectl_ok(
        &world.playground.env,
        world.playground.mgmt().expect("mgmt"),
        args,
    )
}

/// A pause pod in the tenant's `default` namespace requesting 1 CPU.
pub fn pod(name: &str, node_selector: Option<(&str, &str)>) -> Pod {
    let mut spec = json!({
        "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.9",
                        "resources": {"requests": {"cpu": "1", "memory": "256Mi"}}}],
    });
    if let Some((k, v)) = node_selector {
        spec["nodeSelector"] = json!({k: v});
    }
    serde_json::from_value(
        json!({"metadata": {"name": name, "namespace": "default"}, "spec": spec}),
    )
    .expect("pod")
}

/// Creates the pods in the tenant.
pub async fn create_pods(world: &World, pods: impl IntoIterator<Item = Pod>) {
    let api: Api<Pod> = Api::namespaced(world.tenant.clone(), "default");
    for p in pods {
        api.create(&PostParams::default(), &p)
            .await
            .expect("pod created");
    }
}

/// The tenant's pods in `default`.
pub async fn tenant_pods(world: &World) -> Vec<Pod> {
    Api::<Pod>::namespaced(world.tenant.clone(), "default")
        .list(&ListParams::default())
        .await
        .expect("pods")
        .items
}

/// The node a pod is bound to.
pub fn bound_to(p: &Pod) -> Option<String> {
    p.spec.as_ref().and_then(|s| s.node_name.clone())
}

/// Since when the scheduler has marked a pod unschedulable.
pub fn unschedulable_since(p: &Pod) -> Option<k8s_openapi::jiff::Timestamp> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        .and_then(|c| c.last_transition_time.as_ref().map(|t| t.0))
}

/// Since when a Node has been Ready.
pub fn ready_since(n: &Node) -> Option<k8s_openapi::jiff::Timestamp> {
    n.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")
        .and_then(|c| c.last_transition_time.as_ref().map(|t| t.0))
}

/// Deletes the tenant's pods in `default` without grace.
pub async fn delete_pods_now(world: &World) {
    let api: Api<Pod> = Api::namespaced(world.tenant.clone(), "default");
    for p in tenant_pods(world).await {
        let _ = api
            .delete(&p.name_any(), &DeleteParams::default().grace_period(0))
            .await;
    }
}

/// Starts a real `kube-scheduler` on the tenant.
pub fn scheduler(world: &World) -> ManagedProcess {
    world
        .playground
        .env
        .start_scheduler("tenant")
        .expect("kube-scheduler started")
}

/// `kubectl` on the tenant; fails the test when it fails.
pub fn tenant_kubectl(world: &World, args: &[&str]) -> String {
    super::kubectl_ok(
        &world.playground.env,
        world.playground.tenant().expect("tenant"),
        args,
    )
}

/// Prints what a user would look at: the pools and claims, the tenant's pods and nodes.
pub fn show(world: &World, title: &str) {
    println!(
        "== {title}\n$ kubectl get npool,nclaim -n {ns}\n{}$ kubectl get pods,nodes (tenant)\n{}",
        kubectl(world, &["get", "npool,nclaim", "-n", super::world::NS]),
        tenant_kubectl(world, &["get", "pods,nodes", "-n", "default", "-o", "wide"]),
        ns = super::world::NS,
    );
}

/// Plays the ReplicaSet controller and the pod garbage collector the tenant does not run,
/// for the pods `names` (pause pods as [`pod`] makes them): one evicted (Terminating) is
/// removed, one missing is made again. Call it in a loop while waiting.
pub async fn remake_evicted(world: &World, pods: &[Pod], names: &[String]) {
    remake_evicted_as(world, pods, names, |name| pod(name, None)).await
}

/// [`remake_evicted`] with the pods `make` makes.
pub async fn remake_evicted_as(
    world: &World,
    pods: &[Pod],
    names: &[String],
    make: impl Fn(&str) -> Pod,
) {
    let api: Api<Pod> = Api::namespaced(world.tenant.clone(), "default");
    for name in names {
        match pods.iter().find(|p| &p.name_any() == name) {
            Some(p) if p.metadata.deletion_timestamp.is_some() => {
                let _ = api
                    .delete(name, &DeleteParams::default().grace_period(0))
                    .await;
            }
            Some(_) => {}
            None => create_pods(world, [make(name)]).await,
        }
    }
}

/// Asserts that the pool `pool` recorded an Event with `reason`, waiting up to 30 s for it:
/// the controller records Events after the status write that a test may see first.
pub async fn assert_pool_event(world: &World, pool: &str, reason: &str) {
    let started = std::time::Instant::now();
    loop {
        let events = world.events_for(super::world::NS, pool).await;
        if events.iter().any(|e| e.starts_with(reason)) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no {reason} Event on NodePool {pool} within 30 s: {events:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Merges `spec` into the NodePool's spec (`replicas`, `labels`, `disruption`, …).
pub async fn patch_pool_spec(world: &World, pool: &str, spec: serde_json::Value) {
    world
        .pools()
        .patch(
            pool,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({ "spec": spec })),
        )
        .await
        .expect("NodePool patched");
}

/// Sets the tenant Node's condition `type_` to `status`, as node-problem-detector would.
pub async fn set_node_condition(world: &World, node: &str, type_: &str, status: &str) {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(world.tenant.clone());
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    nodes
        .patch_status(
            node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Strategic(json!({"status": {"conditions": [{
                "type": type_, "status": status, "reason": "Test",
                "lastHeartbeatTime": now, "lastTransitionTime": now,
            }]}})),
        )
        .await
        .expect("Node condition set");
}

/// The tenant's PodDisruptionBudgets in `default` (policy/v1beta1: the tenant runs 1.20).
pub fn pdbs(world: &World) -> Api<DynamicObject> {
    Api::namespaced_with(
        world.tenant.clone(),
        "default",
        &kube::core::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("policy", "v1beta1", "PodDisruptionBudget"),
            "poddisruptionbudgets",
        ),
    )
}

/// A pod bound to `node` that a PodDisruptionBudget protects: no disruption controller runs
/// in the tenant, so the budget allows none and every eviction of the pod is refused.
pub async fn protected_pod(world: &World, name: &str, node: &str) {
    let pods: Api<Pod> = Api::namespaced(world.tenant.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("pod");
    let pdb: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": name}}},
    }))
    .expect("pdb");
    pdbs(world)
        .create(&PostParams::default(), &pdb)
        .await
        .expect("pdb");
}

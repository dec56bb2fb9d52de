//! NodePools on real API servers: management + host + tenant clusters,
//! the controller, the KubeVirt simulator and a real `kube-scheduler` on the tenant, so
//! pending pods are really bound to the nodes the pools create.
//!
//! Run with `--nocapture` to see the `kubectl get npool,nclaim` transcript and the
//! dynamic-pool figures.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use autonodes_core::pool::LABEL_TEMPLATE_HASH;
use common::pools::*;
use common::world::*;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::ResourceExt;
use serde_json::json;

/// A provider on the playground's host with two types: `small` (4 CPU, 8Gi, the cheapest)
/// and `large` (8 CPU, 32Gi).
fn provider() -> String {
    pools_provider(&[small(), large()])
}

async fn world() -> World {
    World::with_provider(provider()).await
}

/// Waits until the pool has exactly `n` claims, all Available, `n` Ready tenant Nodes, and
/// as many VMs and user-data Secrets on the host, and no bootstrap token left. Returns the
/// most claims seen Terminating with a node at once while waiting.
async fn wait_settled(world: &World, pool: &str, n: usize) -> usize {
    let start = Instant::now();
    let mut most_draining = 0;
    loop {
        let claims = pool_claims(world, pool).await;
        let draining = claims
            .iter()
            .filter(|c| {
                c.metadata.deletion_timestamp.is_some()
                    && c.status
                        .as_ref()
                        .and_then(|s| s.node_name.as_ref())
                        .is_some()
                    && c.status
                        .as_ref()
                        .is_some_and(|s| s.conditions.iter().any(|x| x.type_ == "Joined"))
            })
            .count();
        most_draining = most_draining.max(draining);
        let p = world.pools().get(pool).await.expect("pool");
        let s = p.status.clone().unwrap_or_default();
        let settled = claims.len() == n
            && claims.iter().all(available)
            && ready_nodes(world).await.len() == n
            && world.nodes().await.len() == n
            && world.vms().await.len() == n
            && world.host_secrets().await.len() == n
            && world.tokens().await.is_empty()
            && s.replicas == n as i32
            && s.ready_replicas == n as i32;
        if settled {
            return most_draining;
        }
        if start.elapsed() > WAIT {
            panic!(
                "pool {pool}: not settled at {n} nodes: {} claims ({:?}), {} nodes, {} VMs, {} secrets, {} tokens, status {:?}",
                claims.len(),
                claims.iter().map(phase).collect::<Vec<_>>(),
                world.nodes().await.len(),
                world.vms().await.len(),
                world.host_secrets().await.len(),
                world.tokens().await.len(),
                s
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_pool_follows_kubectl_scale_from_0_to_5_to_2_to_0_without_leaking_objects() {
    let world = world().await;
    world.create_pool("workers",
        json!({"providerRef": "pools", "replicas": 0,
               "requirements": [{"key": "autonodes.io/node-type", "operator": "In", "values": ["small"]}],
               "labels": {"team": "blue"}}),
    )
    .await;
    world
        .wait_pool("workers", "selector", |p| {
            p.status.as_ref().and_then(|s| s.selector.as_deref())
                == Some("autonodes.io/nodepool=workers")
        })
        .await;
    let step = |title: &str, world: &World| {
        let out = kubectl(world, &["get", "npool,nclaim", "-n", NS]);
        format!("$ kubectl get npool,nclaim -n {NS}   # {title}\n{out}\n")
    };
    let mut transcript = step("replicas 0", &world);

    for (n, title) in [
        (5usize, "after scale to 5"),
        (2, "after scale to 2"),
        (0, "after scale to 0"),
    ] {
        let started = Instant::now();
        let out = kubectl(
            &world,
            &[
                "scale",
                "-n",
                NS,
                "npool/workers",
                &format!("--replicas={n}"),
            ],
        );
        transcript.push_str(&format!(
            "$ kubectl scale -n {NS} npool/workers --replicas={n}\n{out}"
        ));
        let most_draining = wait_settled(&world, "workers", n).await;
        assert!(
            most_draining <= 1,
            "at most one node (the budget) drains at a time, saw {most_draining}"
        );
        // The controller reads claims from its cache: a reconcile right after a create
        // must still count the new claim. Scaling 0 → 5 creates exactly 5, and scaling
        // down creates none.
        let created: Vec<String> = world
            .events_for(NS, "workers")
            .await
            .into_iter()
            .filter(|e| e.starts_with("ClaimCreated"))
            .collect();
        assert_eq!(created.len(), 5, "{created:?}");
        transcript.push_str(&step(
            &format!(
                "{title}, settled in {:.1}s",
                started.elapsed().as_secs_f64()
            ),
            &world,
        ));
    }

    // The scale subresource reports what HPA and KEDA read.
    let scale = kubectl(
        &world,
        &[
            "get",
            "--raw",
            &format!("/apis/autonodes.io/v1alpha1/namespaces/{NS}/nodepools/workers/scale"),
        ],
    );
    let scale: serde_json::Value = serde_json::from_str(&scale).expect("scale JSON");
    // `spec.replicas` of a Scale is omitted when 0.
    assert_eq!(scale["spec"]["replicas"].as_i64().unwrap_or(0), 0);
    assert_eq!(scale["status"]["replicas"], 0);
    assert_eq!(scale["status"]["selector"], "autonodes.io/nodepool=workers");
    println!("{transcript}");
    assert!(world.data_volumes().await.is_empty());
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_claim_is_replaced_and_bad_pools_get_conditions_while_others_keep_working() {
    let world = world().await;
    // Bad input first: an unknown provider and an unreachable tenant.
    world
        .create_pool("ghost", json!({"providerRef": "nope", "replicas": 2}))
        .await;
    world
        .create_pool(
            "lost",
            json!({"vClusterRef": {"name": "missing"}, "limits": {"nodes": 3}}),
        )
        .await;
    world
        .create_pool(
            "lost-static",
            json!({"vClusterRef": {"name": "missing"}, "replicas": 1}),
        )
        .await;
    let pool = world
        .create_pool(
            "steady",
            json!({"providerRef": "pools", "replicas": 2, "labels": {"team": "green"}}),
        )
        .await;
    wait_settled(&world, "steady", 2).await;
    let ghost = world
        .wait_pool("ghost", "ProviderNotFound", |p| {
            pool_condition(p, "Ready").is_some_and(|c| c.1 == "ProviderNotFound")
        })
        .await;
    assert_eq!(ghost.status.expect("status").replicas, 0);
    assert!(pool_claims(&world, "ghost").await.is_empty());
    world
        .wait_pool("lost", "KubeconfigSecretNotFound", |p| {
            pool_condition(p, "Ready").is_some_and(|c| c.1 == "KubeconfigSecretNotFound")
        })
        .await;
    world
        .wait_pool("lost-static", "KubeconfigSecretNotFound", |p| {
            pool_condition(p, "Ready").is_some_and(|c| c.1 == "KubeconfigSecretNotFound")
        })
        .await;
    assert!(pool_claims(&world, "lost-static").await.is_empty());
    let events = world.events_for(NS, "lost").await;
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("KubeconfigSecretNotFound")),
        "{events:?}"
    );
    let events = world.events_for(NS, "ghost").await;
    assert!(
        events.iter().any(|e| e.starts_with("ProviderNotFound")),
        "{events:?}"
    );

    // Every claim carries the owner reference, the pool label and the template hash.
    let claims = pool_claims(&world, "steady").await;
    for c in &claims {
        let owner = &c.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str()),
            ("NodePool", "steady")
        );
        assert_eq!(owner.uid, pool.uid().expect("uid"));
        assert_eq!(owner.controller, Some(true));
        assert!(c.name_any().starts_with("steady-") && c.name_any().len() == "steady-".len() + 5);
        assert!(c.labels().contains_key(LABEL_TEMPLATE_HASH));
        assert_eq!(c.spec.labels.get("team").map(String::as_str), Some("green"));
        assert_eq!(c.spec.provider_ref.as_deref(), Some("pools"));
    }

    // Delete one claim's VM on the host: the claim fails and the pool replaces it.
    let victim = claims[0].clone();
    let s = victim.status.clone().expect("status");
    let vms: Api<DynamicObject> = Api::namespaced_with(
        world.host.clone(),
        s.vm_namespace.as_deref().expect("vm namespace"),
        &autonodes_api::kubevirt::virtual_machine(),
    );
    vms.delete(s.vm_name.as_deref().expect("vm"), &DeleteParams::default())
        .await
        .expect("VM deleted");
    world.wait_claim_gone(&victim.name_any(), WAIT).await;
    wait_settled(&world, "steady", 2).await;
    let names: BTreeSet<String> = pool_claims(&world, "steady")
        .await
        .iter()
        .map(|c| c.name_any())
        .collect();
    assert!(!names.contains(&victim.name_any()));
    let events = world.events_for(NS, "steady").await;
    assert!(
        events.iter().any(|e| e.starts_with("ReplacingFailedClaim")),
        "{events:?}"
    );
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_change_rolls_the_claims_one_at_a_time_without_dropping_below_the_floor() {
    let world = world().await;
    world
        .create_pool(
            "rolling",
            json!({"providerRef": "pools", "replicas": 3, "labels": {"release": "v1"},
               "disruption": {"budget": 1}}),
        )
        .await;
    wait_settled(&world, "rolling", 3).await;
    let before: BTreeSet<String> = pool_claims(&world, "rolling")
        .await
        .iter()
        .map(|c| c.name_any())
        .collect();
    let started = Instant::now();
    world
        .pools()
        .patch(
            "rolling",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"labels": {"release": "v2"}}})),
        )
        .await
        .expect("template changed");
    // Floor: replicas - budget = 2 Ready nodes at every moment.
    let mut lowest = usize::MAX;
    let mut most_claims = 0;
    loop {
        let claims = pool_claims(&world, "rolling").await;
        let ready = ready_nodes(&world).await;
        lowest = lowest.min(ready.len());
        let live = claims
            .iter()
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .count();
        most_claims = most_claims.max(live);
        assert!(ready.len() >= 2, "Ready nodes dropped to {}", ready.len());
        let all_new = claims.len() == 3
            && claims
                .iter()
                .all(|c| available(c) && !before.contains(&c.name_any()))
            && ready.len() == 3
            && ready
                .iter()
                .all(|n| n.labels().get("release").map(String::as_str) == Some("v2"));
        if all_new && world.vms().await.len() == 3 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(240),
            "roll did not finish"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "rolled 3 claims in {:.1}s; lowest Ready nodes seen {lowest} (floor 2); most live claims at once {most_claims}",
        started.elapsed().as_secs_f64()
    );
    assert!(
        most_claims <= 4,
        "one surge claim at a time, saw {most_claims}"
    );
    wait_settled(&world, "rolling", 3).await;
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dynamic_pool_packs_twelve_pending_one_cpu_pods_onto_three_nodes_and_removes_them_when_empty(
) {
    let world = world().await;
    let _scheduler = scheduler(&world);
    world
        .create_pool(
            "burst",
            json!({"providerRef": "pools", "limits": {"nodes": 10, "cpu": "64"},
               "disruption": {"consolidateAfter": "5s"}}),
        )
        .await;
    let created = Instant::now();
    create_pods(&world, (0..12).map(|i| pod(&format!("app-{i:02}"), None))).await;

    // All 12 pods bound by the scheduler to Ready nodes. While waiting, note when the
    // scheduler first marked a pod Unschedulable (the condition is gone once it is bound).
    let mut first_unschedulable: Option<k8s_openapi::jiff::Timestamp> = None;
    let mut seen_unschedulable: BTreeSet<String> = BTreeSet::new();
    let mut nodes_ready_after: Option<Duration> = None;
    let (pods, nodes) = loop {
        let pods = tenant_pods(&world).await;
        for p in &pods {
            if let Some(t) = unschedulable_since(p) {
                seen_unschedulable.insert(p.name_any());
                first_unschedulable = Some(first_unschedulable.map_or(t, |f| f.min(t)));
            }
        }
        let nodes = ready_nodes(&world).await;
        if nodes.len() == 3 && nodes_ready_after.is_none() {
            nodes_ready_after = Some(created.elapsed());
        }
        let ready: BTreeSet<String> = nodes.iter().map(|n| n.name_any()).collect();
        if pods.len() == 12
            && pods
                .iter()
                .all(|p| bound_to(p).is_some_and(|n| ready.contains(&n)))
        {
            break (pods, nodes);
        }
        assert!(created.elapsed() < WAIT, "12 pods not bound to Ready nodes");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let wall = created.elapsed();
    let claims = pool_claims(&world, "burst").await;
    let used: BTreeSet<String> = pods.iter().filter_map(bound_to).collect();
    assert_eq!(claims.len(), 3, "3 nodes of 4 CPU, not 12");
    assert_eq!(nodes.len(), 3);
    assert_eq!(used.len(), 3);
    for c in &claims {
        let s = c.status.clone().expect("status");
        assert_eq!(
            s.type_ref.as_deref(),
            Some("pools.small"),
            "the cheapest type"
        );
        // desiredCapacity covers the pods packed when the claim was made (the scheduler
        // marks pods one by one, so the first claim may be made for fewer than 4).
        let cpu = autonodes_core::resources::cpu_millis(&c.spec.desired_capacity["cpu"])
            .expect("cpu quantity");
        assert!((1000..=4000).contains(&cpu), "desiredCapacity cpu {cpu}m");
    }
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for n in pods.iter().filter_map(bound_to) {
        *per_node.entry(n).or_default() += 1;
    }
    assert!(per_node.values().all(|n| *n == 4), "{per_node:?}");
    // Pods are pending from their creation; the earliest of creation and the first
    // Unschedulable mark is the start.
    let first_pending = pods
        .iter()
        .filter_map(|p| p.metadata.creation_timestamp.as_ref().map(|t| t.0))
        .chain(first_unschedulable)
        .min()
        .expect("creation times");
    let last_ready = nodes
        .iter()
        .filter_map(ready_since)
        .max()
        .expect("ready times");
    let p = world
        .wait_pool("burst", "status", |p| {
            p.status
                .as_ref()
                .is_some_and(|s| s.ready_replicas == 3 && s.replicas == 3)
        })
        .await;
    let s = p.status.clone().expect("status");
    assert_eq!(s.cost, Some(3 * 56));
    let r = s.resources.expect("resources");
    assert_eq!((r.nodes, r.cpu.map(|q| q.0)), (3, Some("12".to_string())));
    println!(
        "dynamic pool figures: pods pending 12 ({} seen marked Unschedulable by kube-scheduler), nodes created {}, first pending pod -> all pods' nodes Ready {:.1}s (API timestamps, 1s resolution; simulated VMs boot at once), pods created -> 3 nodes Ready {:.1}s and -> all 12 bound on Ready nodes {:.1}s (wall clock, 100ms polls), pods per node {:?}",
        seen_unschedulable.len(),
        claims.len(),
        (last_ready.as_millisecond() - first_pending.as_millisecond()) as f64 / 1000.0,
        nodes_ready_after.unwrap_or(wall).as_secs_f64(),
        wall.as_secs_f64(),
        per_node.values().collect::<Vec<_>>()
    );

    // Pods gone: after consolidateAfter the empty nodes are removed, one at a time.
    let deleted = Instant::now();
    delete_pods_now(&world).await;
    common::eventually("empty nodes removed", WAIT, || async {
        (pool_claims(&world, "burst").await.is_empty()
            && world.nodes().await.is_empty()
            && world.vms().await.is_empty()
            && world.host_secrets().await.is_empty())
        .then_some(())
    })
    .await;
    let removed_after = deleted.elapsed();
    assert!(
        removed_after >= Duration::from_secs(5),
        "nodes removed only after consolidateAfter, took {removed_after:?}"
    );
    println!(
        "consolidation: 3 empty nodes removed {:.1}s after their pods were deleted (consolidateAfter 5s, budget 1)",
        removed_after.as_secs_f64()
    );
    let events = world.events_for(NS, "burst").await;
    assert_eq!(
        events
            .iter()
            .filter(|e| e.starts_with("Consolidated"))
            .count(),
        3,
        "{events:?}"
    );
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dynamic_pool_honours_node_selectors_and_its_limits() {
    let world = world().await;
    let _scheduler = scheduler(&world);
    world
        .create_pool(
            "capped",
            json!({"providerRef": "pools", "limits": {"nodes": 2}, "labels": {"pool": "capped"}}),
        )
        .await;
    // Two pods that only a large node takes.
    create_pods(
        &world,
        (0..2).map(|i| {
            pod(
                &format!("big-{i}"),
                Some(("autonodes.io/node-type", "large")),
            )
        }),
    )
    .await;
    let large = common::eventually("pods bound to a large node", WAIT, || async {
        let pods = tenant_pods(&world).await;
        let nodes = ready_nodes(&world).await;
        let all_bound = pods.len() == 2 && pods.iter().all(|p| bound_to(p).is_some());
        all_bound.then_some(nodes)
    })
    .await;
    assert_eq!(large.len(), 1);
    assert_eq!(
        large[0]
            .labels()
            .get("autonodes.io/node-type")
            .map(String::as_str),
        Some("large")
    );
    assert_eq!(
        large[0].labels().get("pool").map(String::as_str),
        Some("capped")
    );
    // A pod no node type of the pool accepts is not the pool's business.
    create_pods(&world, [pod("nowhere", Some(("disk", "nvme")))]).await;
    // Twelve more 1-CPU pods: 6 fit the large node's free room; the rest need one small
    // node (4 pods) and would need another, which the limit of 2 nodes forbids.
    create_pods(&world, (0..12).map(|i| pod(&format!("app-{i:02}"), None))).await;
    let p = world
        .wait_pool("capped", "LimitReached", |p| {
            pool_condition(p, "LimitReached").is_some_and(|c| c.0 == "True")
        })
        .await;
    let (_, reason, message) = pool_condition(&p, "LimitReached").expect("condition");
    assert_eq!(reason, "LimitReached");
    assert!(message.contains("nodes 2"), "{message}");
    common::eventually("2 Ready nodes, 12 of 15 pods bound", WAIT, || async {
        let pods = tenant_pods(&world).await;
        let bound = pods.iter().filter(|p| bound_to(p).is_some()).count();
        (ready_nodes(&world).await.len() == 2 && bound == 12).then_some(())
    })
    .await;
    // The limit holds over time.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(pool_claims(&world, "capped").await.len(), 2);
    let pods = tenant_pods(&world).await;
    assert!(pods
        .iter()
        .find(|p| p.name_any() == "nowhere")
        .and_then(bound_to)
        .is_none());
    let large_name = large[0].name_any();
    for p in pods.iter().filter(|p| p.name_any().starts_with("big-")) {
        assert_eq!(bound_to(p).as_deref(), Some(large_name.as_str()));
    }
    let events = world.events_for(NS, "capped").await;
    assert!(
        events.iter().any(|e| e.starts_with("LimitReached")),
        "{events:?}"
    );
    let s = p.status.expect("status");
    println!(
        "limits: {} claims, pendingPods {:?}, LimitReached: {message}",
        s.replicas, s.pending_pods
    );
    delete_pods_now(&world).await;
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pools_termination_grace_period_bounds_a_blocked_drain_and_never_waits_for_it() {
    let world = world().await;
    let small = json!([{"property": "autonodes.io/node-type", "value": "small"}]);
    for (pool, grace) in [("brief", "1s"), ("patient", "Never")] {
        world
            .create_pool(
                pool,
                json!({"providerRef": "pools", "replicas": 1, "requirements": small,
                       "terminationGracePeriod": grace}),
            )
            .await;
    }
    let node_of = |pool: &'static str| {
        let world = &world;
        async move {
            common::eventually("the pool's node", WAIT, || async {
                let claims = pool_claims(world, pool).await;
                let c = claims.iter().find(|c| available(c))?;
                Some((c.name_any(), c.status.as_ref()?.node_name.clone()?))
            })
            .await
        }
    };
    let ((brief_claim, brief), (_, patient)) = (node_of("brief").await, node_of("patient").await);
    protected_pod(&world, "held-brief", &brief).await;
    protected_pod(&world, "held-patient", &patient).await;
    let deleted = Instant::now();
    for pool in ["brief", "patient"] {
        world
            .pools()
            .patch(
                pool,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": 0}})),
            )
            .await
            .expect("scale to 0");
    }
    let nodes: Api<Node> = Api::all(world.tenant.clone());
    // 1s: the blocked drain gives up and the node goes, long before the controller's
    // --drain-timeout of 20s.
    common::eventually("the brief pool's node to go", WAIT, || async {
        nodes.get_opt(&brief).await.ok()?.is_none().then_some(())
    })
    .await;
    let took = deleted.elapsed();
    println!("brief pool: node {brief} gone {took:?} after scaling to 0 despite a blocking PDB");
    assert!(
        took < Duration::from_secs(20),
        "the pool's 1s grace, not the 20s --drain-timeout: {took:?}"
    );
    // Never: still draining after the controller's 20s --drain-timeout.
    tokio::time::sleep(Duration::from_secs(25).saturating_sub(deleted.elapsed())).await;
    let waiting = pool_claims(&world, "patient").await;
    let message = waiting
        .iter()
        .flat_map(|c| c.status.iter().flat_map(|s| s.conditions.clone()))
        .find(|c| c.type_ == "Ready")
        .map(|c| c.message)
        .unwrap_or_default();
    println!(
        "patient pool after 25s: {} claim(s), Ready: {message}",
        waiting.len()
    );
    assert_eq!(waiting.len(), 1, "the claim waits for its drain");
    assert!(
        message.contains("terminationGracePeriod Never"),
        "{message}"
    );
    assert!(nodes.get_opt(&patient).await.expect("read").is_some());
    // The budget goes, the eviction goes through, the node follows.
    let pods: Api<Pod> = Api::namespaced(world.tenant.clone(), "default");
    pdbs(&world)
        .delete("held-patient", &DeleteParams::default())
        .await
        .expect("delete pdb");
    common::eventually("the patient pod to be evicted", WAIT, || async {
        pods.get("held-patient")
            .await
            .ok()
            .filter(|p| p.metadata.deletion_timestamp.is_some())
    })
    .await;
    pods.delete("held-patient", &DeleteParams::default().grace_period(0))
        .await
        .expect("the kubelet's part");
    common::eventually("the patient pool's node to go", WAIT, || async {
        nodes.get_opt(&patient).await.ok()?.is_none().then_some(())
    })
    .await;
    let events = world.events_for(NS, &brief_claim).await;
    println!("{brief_claim}: {events:?}");
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("DrainTimeout") && e.contains("after 1s")),
        "{events:?}"
    );
    world.shutdown().await;
}

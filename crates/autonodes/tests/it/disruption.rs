//! Voluntary disruption of pool nodes on real API servers (issue 14): management + host +
//! tenant clusters, the controller, the KubeVirt simulator and a real `kube-scheduler` on
//! the tenant.
//!
//! Run with `--nocapture` to see `kubectl get npool,nclaim` and the tenant's pods and nodes
//! before and after each step.

use crate::common;

use std::time::{Duration, Instant};

use autonodes_core::pool::{
    ANNOTATION_EMPTY_SINCE, ANNOTATION_UNDERUTILIZED_SINCE, LABEL_TEMPLATE_HASH,
};
use common::pools::*;
use common::world::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::ResourceExt;
use serde_json::json;

/// A provider on the playground's host with one type, `small` (4 CPU, 8Gi).
fn provider() -> String {
    pools_provider(&[small()])
}

async fn set_budgets(world: &World, pool: &str, budgets: serde_json::Value) {
    patch_pool_spec(world, pool, json!({"disruption": {"budgets": budgets}})).await;
}

/// How many of the pool's claims are being deleted while their node is still there.
async fn draining(world: &World, pool: &str) -> usize {
    pool_claims(world, pool)
        .await
        .iter()
        .filter(|c| {
            c.metadata.deletion_timestamp.is_some()
                && c.status.as_ref().is_some_and(|s| s.node_name.is_some())
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_of_zero_in_its_window_holds_consolidation_and_roll_outs_of_its_reasons_and_a_percentage_paces_them_after(
) {
    let world = World::with_provider(provider()).await;
    let _scheduler = scheduler(&world);
    // A window that fires every minute and lasts an hour: active all through the test.
    let closed = json!([{"nodes": "0", "schedule": "* * * * *", "duration": "1h"}]);

    // Dynamic pool: 8 one-CPU pods make two 4-CPU nodes.
    world
        .create_pool(
            "burst",
            json!({"providerRef": "pools", "limits": {"nodes": 4},
                   "disruption": {"consolidateAfter": "2s", "budgets": closed}}),
        )
        .await;
    create_pods(&world, (0..8).map(|i| pod(&format!("app-{i}"), None))).await;
    common::eventually("8 pods bound to 2 Ready nodes", WAIT, || async {
        let pods = tenant_pods(&world).await;
        (pods.len() == 8
            && pods.iter().all(|p| bound_to(p).is_some())
            && ready_nodes(&world).await.len() == 2)
            .then_some(())
    })
    .await;
    show(&world, "two nodes busy, budget 0 in its window");

    // Empty nodes are marked, but the window lets none go.
    delete_pods_now(&world).await;
    common::eventually("both nodes marked empty", WAIT, || async {
        let claims = pool_claims(&world, "burst").await;
        (claims.len() == 2
            && claims
                .iter()
                .all(|c| c.annotations().contains_key(ANNOTATION_EMPTY_SINCE)))
        .then_some(())
    })
    .await;
    let marked = Instant::now();
    while marked.elapsed() < Duration::from_secs(10) {
        let claims = pool_claims(&world, "burst").await;
        assert_eq!(claims.len(), 2, "no node may go while the budget is 0");
        assert!(claims.iter().all(available), "{claims:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    show(
        &world,
        "empty for 10s, five times consolidateAfter: both nodes kept",
    );

    // The window lifted for 50 %: one of the two nodes at a time. A budget of 0 limited
    // to other reasons does not hold empty nodes.
    set_budgets(
        &world,
        "burst",
        json!([{"nodes": "0", "reasons": ["Drifted", "Underutilized"]}, {"nodes": "50%"}]),
    )
    .await;
    let lifted = Instant::now();
    let mut most_draining = 0;
    loop {
        most_draining = most_draining.max(draining(&world, "burst").await);
        if pool_claims(&world, "burst").await.is_empty() && world.nodes().await.is_empty() {
            break;
        }
        assert!(lifted.elapsed() < WAIT, "empty nodes not removed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(most_draining, 1, "50 % of 2 nodes: one at a time");
    show(
        &world,
        "budget 50 %: both empty nodes removed, one at a time",
    );
    println!(
        "consolidation: held 10s by the 0 window; after the change both nodes gone in {:.1}s, at most {most_draining} draining at once",
        lifted.elapsed().as_secs_f64()
    );

    // Static pool: a template change is held by a window limited to `Drifted`, a
    // scale-down is not.
    let drift_closed = json!([{"nodes": "0", "schedule": "* * * * *", "duration": "1h",
                               "reasons": ["Drifted"]}]);
    world
        .create_pool(
            "workers",
            json!({"providerRef": "pools", "replicas": 2, "labels": {"team": "blue"},
                   "disruption": {"budgets": drift_closed}}),
        )
        .await;
    common::eventually("2 Available workers", WAIT, || async {
        let claims = pool_claims(&world, "workers").await;
        (claims.len() == 2 && claims.iter().all(available)).then_some(())
    })
    .await;
    let hashes = |claims: &[autonodes_api::NodeClaim]| -> Vec<String> {
        let mut h: Vec<String> = claims
            .iter()
            .filter_map(|c| c.labels().get(LABEL_TEMPLATE_HASH).cloned())
            .collect();
        h.sort();
        h.dedup();
        h
    };
    let before = hashes(&pool_claims(&world, "workers").await);
    patch_pool_spec(&world, "workers", json!({"labels": {"team": "green"}})).await;
    let changed = Instant::now();
    while changed.elapsed() < Duration::from_secs(8) {
        let claims = pool_claims(&world, "workers").await;
        assert_eq!(claims.len(), 2, "no surge claim while the budget is 0");
        assert_eq!(hashes(&claims), before, "no claim rolled");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    show(&world, "template changed, budget 0: nothing rolled for 8s");
    patch_pool_spec(&world, "workers", json!({"replicas": 1})).await;
    common::eventually("scaled down to 1 inside the window", WAIT, || async {
        let claims = pool_claims(&world, "workers").await;
        (claims.len() == 1 && claims.iter().all(available) && world.nodes().await.len() == 1)
            .then_some(())
    })
    .await;
    // A budget of 0 for the other reasons only: the roll-out goes.
    set_budgets(
        &world,
        "workers",
        json!([{"nodes": "0", "reasons": ["Empty", "Underutilized"]}]),
    )
    .await;
    common::eventually("rolled to the new template", WAIT, || async {
        let claims = pool_claims(&world, "workers").await;
        (claims.len() == 1
            && claims.iter().all(available)
            && hashes(&claims) != before
            && world.nodes().await.len() == 1)
            .then_some(())
    })
    .await;
    show(
        &world,
        "scale-down went inside the window; the roll-out after the window lifted",
    );
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_startup_taint_never_goes_fails_its_claim_by_initialization_timeout_and_a_pool_failing_so_backs_off_until_a_claim_comes_up(
) {
    let world = World::start(WorldOptions {
        provider: provider(),
        initialization_timeout: Duration::from_secs(8),
        ..WorldOptions::default()
    })
    .await;
    let claim = |name: &str| {
        json!({"metadata": {"name": name},
               "spec": {"providerRef": "pools",
                        "startupTaints": [{"key": "example.com/cni", "effect": "NoSchedule"}]}})
    };
    world.create_claim(claim("stuck")).await;
    world.create_claim(claim("healthy")).await;
    let joined =
        |c: &autonodes_api::NodeClaim| condition(c, "Joined").is_some_and(|(s, _, _)| s == "True");
    world.wait_claim("stuck", "joined", WAIT, joined).await;
    let healthy = world.wait_claim("healthy", "joined", WAIT, joined).await;
    assert_eq!(
        condition(&healthy, "Initialized").map(|(s, r, _)| (s, r)),
        Some(("False".into(), "NodeNotReady".into()))
    );
    show(&world, "both joined, each Node keeps its startup taint");

    // What a CNI would do on the healthy node: remove its startup taint.
    let node = healthy
        .status
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .expect("node name");
    tenant_kubectl(
        &world,
        &["taint", "node", &node, "example.com/cni:NoSchedule-"],
    );
    let healthy = world.wait_phase("healthy", "Available", WAIT).await;
    assert_eq!(
        condition(&healthy, "Initialized").map(|(s, r, _)| (s, r)),
        Some(("True".into(), "Initialized".into()))
    );

    let failed = world.wait_phase("stuck", "Failed", WAIT).await;
    let (status, reason, _) = condition(&failed, "Ready").expect("Ready");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "InitializationTimeout")
    );
    common::eventually("the failed claim's VM and Node removed", WAIT, || async {
        (world.vms().await.len() == 1 && world.nodes().await.len() == 1).then_some(())
    })
    .await;
    assert_pool_event(&world, "stuck", "InitializationTimeout").await;
    // The initialized claim outlives the timeout.
    tokio::time::sleep(Duration::from_secs(9)).await;
    let healthy = world.claims().get("healthy").await.expect("healthy");
    assert!(available(&healthy), "{:?}", healthy.status);
    show(
        &world,
        "stuck failed and removed; healthy initialized and kept",
    );

    // A pool whose nodes keep that taint: its claims fail one after another, and from the
    // third in a row the pool says so and backs off instead of churning VMs.
    let taint = json!([{"key": "example.com/cni", "effect": "NoSchedule"}]);
    world
        .create_pool(
            "tainted",
            json!({"providerRef": "pools", "replicas": 1, "startupTaints": taint}),
        )
        .await;
    let registration = |p: &autonodes_api::NodePool| {
        let s = p.status.clone().unwrap_or_default();
        let c = s
            .conditions
            .iter()
            .find(|c| c.type_ == "NodeRegistrationHealthy")
            .map(|c| (c.status.clone(), c.reason.clone()));
        (c, s.registration)
    };
    let pools: Api<autonodes_api::NodePool> = Api::namespaced(world.mgmt.clone(), NS);
    let unhealthy = common::eventually(
        "the pool unhealthy after 3 failed claims",
        Duration::from_secs(240),
        || async {
            let p = pools.get("tainted").await.ok()?;
            match registration(&p) {
                (Some((s, r)), Some(reg)) if s == "False" => Some((r, reg)),
                _ => None,
            }
        },
    )
    .await;
    assert_eq!(unhealthy.0, "InitializationTimeout");
    assert_eq!(unhealthy.1.consecutive_failures, 3);
    assert_eq!(
        unhealthy.1.last_failure_reason.as_deref(),
        Some("InitializationTimeout")
    );
    let until = unhealthy.1.backoff_until.clone().expect("backoffUntil").0;
    let since = unhealthy
        .1
        .last_failure_time
        .clone()
        .expect("lastFailureTime")
        .0;
    assert_eq!(until.duration_since(since).as_secs(), 30);
    assert_pool_event(&world, "tainted", "InitializationTimeout").await;
    show(
        &world,
        "3 claims in a row failed: NodeRegistrationHealthy=False",
    );
    // Backing off: no claim of the pool for most of the 30 s.
    let backing_off = Instant::now();
    while backing_off.elapsed() < Duration::from_secs(20) {
        let live: Vec<_> = pool_claims(&world, "tainted")
            .await
            .into_iter()
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .collect();
        assert!(live.is_empty(), "a claim while backing off: {live:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The taint dropped from the pool: after the back-off its next claim comes up, and the
    // pool is healthy again.
    patch_pool_spec(&world, "tainted", json!({"startupTaints": null})).await;
    common::eventually("the pool healthy again", WAIT, || async {
        let p = pools.get("tainted").await.ok()?;
        let claims = pool_claims(&world, "tainted").await;
        (claims.iter().any(available)
            && registration(&p) == (Some(("True".into(), "NodesRegistered".into())), None))
            .then_some(())
    })
    .await;
    show(
        &world,
        "taint dropped: a claim Available, the pool healthy again",
    );
    world.shutdown().await;
}

/// Sets (`Some`) or removes (`None`) the simulator's annotation `key` on the claim's VM
/// (`simulator.autonodes.io/kubelet-stopped`, `simulator.autonodes.io/kubelet-version`).
async fn annotate_vm(
    world: &World,
    claim: &autonodes_api::NodeClaim,
    key: &str,
    value: Option<&str>,
) {
    let s = claim.status.clone().expect("status");
    let (ns, vm) = (
        s.vm_namespace.expect("vm namespace"),
        s.vm_name.expect("vm"),
    );
    let api: kube::Api<kube::api::DynamicObject> = kube::Api::namespaced_with(
        world.host.clone(),
        &ns,
        &autonodes_api::kubevirt::virtual_machine(),
    );
    api.patch(
        &vm,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {key: value}}})),
    )
    .await
    .expect("VM annotated");
}

/// Stops (`true`) or restarts the simulated kubelet of the claim's VM.
async fn kubelet_stopped(world: &World, claim: &autonodes_api::NodeClaim, stopped: bool) {
    let value = stopped.then_some("true");
    annotate_vm(
        world,
        claim,
        autonodes_testenv::simulator::KUBELET_STOPPED_ANNOTATION,
        value,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_not_ready_for_the_repair_time_is_restarted_then_replaced_first_and_repair_stops_while_more_than_a_fifth_are_unhealthy(
) {
    let world = World::start(WorldOptions {
        provider: provider(),
        node_repair_after: Some(Duration::from_secs(3)),
        ..WorldOptions::default()
    })
    .await;
    // A budget of 0: repair is not voluntary disruption and ignores it. A restart does not
    // bring a stopped kubelet back: the node is replaced 2 s after it.
    world
        .create_pool(
            "workers",
            json!({"providerRef": "pools", "replicas": 5,
                   "disruption": {"budgets": [{"nodes": "0"}]},
                   "repair": {"restartTimeout": "2s"}}),
        )
        .await;
    let all_available = |n: usize| {
        let world = &world;
        async move {
            let claims = pool_claims(world, "workers").await;
            (claims.len() == n
                && claims.iter().all(available)
                && ready_nodes(world).await.len() == n
                && world.nodes().await.len() == n)
                .then_some(claims)
        }
    };
    let claims = common::eventually("5 Available workers", WAIT, || all_available(5)).await;
    show(&world, "5 workers Ready");

    // One kubelet stops: after the repair time a replacement comes first, then it goes.
    let broken = claims[0].clone();
    kubelet_stopped(&world, &broken, true).await;
    let stopped_at = Instant::now();
    let mut most_live = 0;
    let mut restarted = None;
    loop {
        let claims = pool_claims(&world, "workers").await;
        if let Some(r) = claims
            .iter()
            .find(|c| c.name_any() == broken.name_any())
            .and_then(|c| c.status.as_ref()?.last_restart.clone())
        {
            restarted.get_or_insert((r, stopped_at.elapsed()));
        }
        most_live = most_live.max(
            claims
                .iter()
                .filter(|c| c.metadata.deletion_timestamp.is_none())
                .count(),
        );
        if claims.len() == 5
            && claims.iter().all(available)
            && !claims.iter().any(|c| c.name_any() == broken.name_any())
            && ready_nodes(&world).await.len() == 5
        {
            break;
        }
        assert!(stopped_at.elapsed() < WAIT, "broken node not repaired");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        most_live, 6,
        "the replacement came before the broken claim went"
    );
    assert_pool_event(&world, "workers", "NodeRepaired").await;
    let (restart, restarted_after) =
        restarted.expect("the VM was restarted before it was replaced");
    assert!(restart.requested.starts_with("repair "), "{restart:?}");
    println!(
        "repair: {} restarted {:.1}s and replaced {:.1}s after its kubelet stopped (repair after 3s, restart timeout 2s)",
        broken.name_any(),
        restarted_after.as_secs_f64(),
        stopped_at.elapsed().as_secs_f64()
    );
    show(&world, "the broken node replaced");

    // Two of five stop: more than a fifth, nothing is repaired.
    let claims = pool_claims(&world, "workers").await;
    let (a, b) = (claims[0].clone(), claims[1].clone());
    kubelet_stopped(&world, &a, true).await;
    kubelet_stopped(&world, &b, true).await;
    world
        .wait_pool("workers", "NodeRepair False", |p| {
            pool_condition(p, "NodeRepair").map(|(s, r, _)| (s, r))
                == Some(("False".into(), "TooManyUnhealthyNodes".into()))
        })
        .await;
    let held = Instant::now();
    while held.elapsed() < Duration::from_secs(8) {
        let names: Vec<String> = pool_claims(&world, "workers")
            .await
            .iter()
            .map(|c| c.name_any())
            .collect();
        assert_eq!(names.len(), 5, "no replacement while blocked: {names:?}");
        assert!(names.contains(&a.name_any()) && names.contains(&b.name_any()));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    show(&world, "2 of 5 not Ready: repair blocked");

    // One comes back: one of five is a fifth, the other is repaired.
    kubelet_stopped(&world, &a, false).await;
    common::eventually("the other broken node repaired", WAIT, || async {
        let claims = pool_claims(&world, "workers").await;
        (claims.len() == 5
            && claims.iter().all(available)
            && claims.iter().any(|c| c.name_any() == a.name_any())
            && !claims.iter().any(|c| c.name_any() == b.name_any()))
        .then_some(())
    })
    .await;
    let p = world
        .wait_pool("workers", "NodeRepair True", |p| {
            pool_condition(p, "NodeRepair").is_some_and(|(s, _, _)| s == "True")
        })
        .await;
    println!("{:?}", pool_condition(&p, "NodeRepair"));
    show(&world, "one kubelet back, the other node repaired");
    world.shutdown().await;
}

/// The UID of the claim's VirtualMachineInstance, if it has one.
async fn vmi_uid(world: &World, claim: &autonodes_api::NodeClaim) -> Option<String> {
    let s = claim.status.clone()?;
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
        world.host.clone(),
        s.vm_namespace.as_deref()?,
        &autonodes_api::kubevirt::virtual_machine_instance(),
    );
    api.get_opt(s.vm_name.as_deref()?).await.ok()??.uid()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_a_kernel_deadlock_is_restarted_first_replaced_when_it_comes_back_and_its_vm_kept_halted_for_keep_failed_for(
) {
    let world = World::start(WorldOptions {
        provider: provider(),
        ..WorldOptions::default()
    })
    .await;
    // The provider's repair defaults: KernelDeadlock=True for 2 s, keep a replaced VM 15 s;
    // the pool sets its own restart timeout and lets one node of three be unhealthy. The
    // restart timeout is the time a restarted node has to come back healthy: 20 s, so a
    // reboot on a loaded machine (VM stopped, a new VMI, the Node Ready again) fits in it
    // and the node is not replaced after its first restart.
    let providers: Api<autonodes_api::NodeProvider> = Api::all(world.mgmt.clone());
    providers
        .patch(
            "pools",
            &PatchParams::default(),
            // A template that runs its VMs with `running: true`: halting one must take
            // that out (KubeVirt, and the simulator, refuse it beside `runStrategy`).
            &Patch::Merge(json!({"spec": {
                "repair": {
                    "conditions": [{"type": "KernelDeadlock", "status": "True", "tolerationDuration": "2s"}],
                    "keepFailedFor": "15s",
                },
                "kubeVirt": {"virtualMachineTemplate": {"spec": {"running": true}}},
            }})),
        )
        .await
        .expect("provider repair set");
    world
        .create_pool(
            "workers",
            json!({"providerRef": "pools", "replicas": 3,
                   "repair": {"restartTimeout": "20s", "maxUnhealthy": "1"}}),
        )
        .await;
    let claims = common::eventually("3 Available workers", WAIT, || async {
        let claims = pool_claims(&world, "workers").await;
        (claims.len() == 3 && claims.iter().all(available) && ready_nodes(&world).await.len() == 3)
            .then_some(claims)
    })
    .await;
    let sick = claims[0].clone();
    let node = sick
        .status
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .expect("node");
    let first_boot = vmi_uid(&world, &sick).await.expect("a VMI");
    // A 3-CPU pod on each 4-CPU node, bound by the kube-scheduler.
    let _scheduler = scheduler(&world);
    let apps: Vec<String> = (0..3).map(|i| format!("app-{i}")).collect();
    create_pods(&world, apps.iter().map(|n| pod_of(n, "3"))).await;
    let on_sick = common::eventually("each app pod bound", WAIT, || async {
        let pods = tenant_pods(&world).await;
        let bound: Vec<(String, String)> = pods
            .iter()
            .filter_map(|p| Some((p.name_any(), bound_to(p)?)))
            .collect();
        (bound.len() == 3)
            .then(|| bound.into_iter().find(|(_, n)| *n == node).map(|(p, _)| p))
            .flatten()
    })
    .await;

    // The kernel deadlocks: after 2 s the VM is restarted, and the reboot clears it.
    set_node_condition(&world, &node, "KernelDeadlock", "True").await;
    let sick_at = Instant::now();
    let restarted = common::eventually("the sick node's VM restarted", WAIT, || async {
        let c = world.claims().get(&sick.name_any()).await.ok()?;
        let r = c.status.as_ref()?.last_restart.clone()?;
        let boot = vmi_uid(&world, &c).await?;
        (boot != first_boot && available(&c)).then_some(r)
    })
    .await;
    let restarted_after = sick_at.elapsed();
    assert!(restarted.requested.starts_with("repair "), "{restarted:?}");
    show(&world, "the deadlocked node's VM restarted");
    // Healthy after the restart: it stays past the restart timeout.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let names: Vec<String> = pool_claims(&world, "workers")
        .await
        .iter()
        .map(|c| c.name_any())
        .collect();
    assert!(
        names.contains(&sick.name_any()) && names.len() == 3,
        "{names:?}"
    );
    let seen = world.claims().get(&sick.name_any()).await.expect("claim");
    let kd = seen
        .status
        .as_ref()
        .map(|s| {
            s.node_conditions
                .iter()
                .any(|c| c.type_ == "KernelDeadlock")
        })
        .unwrap_or(true);
    assert!(
        !kd,
        "the reboot cleared the deadlock: {:?}",
        seen.status.map(|s| s.node_conditions)
    );

    // It deadlocks again: restarted once already, so it is replaced (a new claim first),
    // and its VM is kept halted, outside the pool, for 15 s.
    set_node_condition(&world, &node, "KernelDeadlock", "True").await;
    let again_at = Instant::now();
    common::eventually("the sick node replaced", WAIT, || async {
        let claims = pool_claims(&world, "workers").await;
        let live: Vec<_> = claims
            .iter()
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .collect();
        (live.len() == 3
            && live.iter().all(|c| available(c))
            && !live.iter().any(|c| c.name_any() == sick.name_any()))
        .then_some(())
    })
    .await;
    let replaced_after = again_at.elapsed();
    // The sick node is drained: its pod (made again, as its ReplicaSet would) binds on the
    // replacement.
    let rebound = common::eventually("the drained pod bound on the replacement", WAIT, || async {
        let pods = tenant_pods(&world).await;
        remake_evicted_as(&world, &pods, &apps, |n| pod_of(n, "3")).await;
        let p = pods.iter().find(|p| p.name_any() == on_sick)?;
        let to = bound_to(p).filter(|n| *n != node)?;
        (p.metadata.deletion_timestamp.is_none()).then_some(to)
    })
    .await;
    let kept = common::eventually(
        "the sick node's VM halted and its Node gone",
        WAIT,
        || async {
            let vm = world.vms().await.into_iter().find(|v| {
                Some(v.name_any()) == sick.status.as_ref().and_then(|s| s.vm_name.clone())
            })?;
            let halted = vm
                .data
                .pointer("/spec/runStrategy")
                .and_then(|v| v.as_str())
                == Some("Halted");
            let stopped = vm
                .data
                .pointer("/status/printableStatus")
                .and_then(|v| v.as_str())
                == Some("Stopped");
            let node_gone = !world.nodes().await.iter().any(|n| n.name_any() == node);
            let claim = world.claims().get_opt(&sick.name_any()).await.ok()??;
            let ready = claim
                .status
                .as_ref()
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready").cloned())?;
            let says_kept = ready
                .message
                .contains("is halted and kept for debugging until");
            (halted && stopped && node_gone && says_kept).then_some((vm, claim))
        },
    )
    .await;
    let (vm, claim) = kept;
    assert!(
        vm.labels().contains_key(autonodes_api::LABEL_NODECLAIM_UID),
        "the kept VM stays labelled"
    );
    assert!(
        claim.metadata.deletion_timestamp.is_some(),
        "the kept VM's claim is going"
    );
    show(&world, "replaced; the old VM halted and kept");
    assert_pool_event(&world, "workers", "RestartingUnhealthyNode").await;
    assert_pool_event(&world, "workers", "NodeRepaired").await;
    // After keepFailedFor the VM and the claim go.
    let kept_at = Instant::now();
    world.wait_claim_gone(&sick.name_any(), WAIT).await;
    assert!(
        !world
            .vms()
            .await
            .iter()
            .any(|v| Some(v.name_any()) == sick.status.as_ref().and_then(|s| s.vm_name.clone())),
        "the kept VM is removed with its claim"
    );
    println!(
        "repair: KernelDeadlock node restarted {:.1}s after the condition (toleration 2s); deadlocked again, replaced {:.1}s after; its pod {on_sick} rebound on {rebound}; VM kept halted, removed {:.1}s later (keepFailedFor 15s)",
        restarted_after.as_secs_f64(),
        replaced_after.as_secs_f64(),
        kept_at.elapsed().as_secs_f64()
    );
    delete_pods_now(&world).await;
    world.shutdown().await;
}

/// Sets (`Some("true")`, `Some("90s")`) or removes (`None`) `karpenter.sh/do-not-disrupt` on
/// a tenant pod.
async fn mark_do_not_disrupt(world: &World, pod: &str, value: Option<&str>) {
    Api::<Pod>::namespaced(world.tenant.clone(), "default")
        .patch(
            pod,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"karpenter.sh/do-not-disrupt": value}}}),
            ),
        )
        .await
        .expect("pod annotated");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_underutilized_node_is_held_by_do_not_disrupt_pods_then_drained_onto_the_other_nodes_room(
) {
    let world = World::with_provider(provider()).await;
    let _scheduler = scheduler(&world);
    // WhenEmptyOrUnderutilized is the default policy.
    world
        .create_pool(
            "burst",
            json!({"providerRef": "pools", "disruption": {"consolidateAfter": "2s"}}),
        )
        .await;
    create_pods(&world, (0..8).map(|i| pod(&format!("app-{i}"), None))).await;
    let nodes = common::eventually("8 pods bound to 2 Ready nodes", WAIT, || async {
        let pods = tenant_pods(&world).await;
        let nodes = ready_nodes(&world).await;
        (pods.len() == 8 && pods.iter().all(|p| bound_to(p).is_some()) && nodes.len() == 2)
            .then_some(nodes)
    })
    .await;
    // Keep one pod on the first node and two on the second, each node with one pod marked
    // do-not-disrupt: either node's pods would fit the other's room.
    let (first, second) = (nodes[0].name_any(), nodes[1].name_any());
    let pods = tenant_pods(&world).await;
    let on = |n: &str| -> Vec<String> {
        let mut v: Vec<String> = pods
            .iter()
            .filter(|p| bound_to(p).as_deref() == Some(n))
            .map(|p| p.name_any())
            .collect();
        v.sort();
        v
    };
    let keep: Vec<String> = on(&first)
        .into_iter()
        .take(1)
        .chain(on(&second).into_iter().take(2))
        .collect();
    let held = [keep[0].clone(), keep[1].clone()];
    for p in &held {
        mark_do_not_disrupt(&world, p, Some("true")).await;
    }
    let api: Api<Pod> = Api::namespaced(world.tenant.clone(), "default");
    for p in pods.iter().filter(|p| !keep.contains(&p.name_any())) {
        api.delete(&p.name_any(), &DeleteParams::default().grace_period(0))
            .await
            .expect("pod deleted");
    }
    show(
        &world,
        "two half-empty nodes, one do-not-disrupt pod on each",
    );
    let quiet = Instant::now();
    while quiet.elapsed() < Duration::from_secs(10) {
        let claims = pool_claims(&world, "burst").await;
        assert_eq!(claims.len(), 2, "held by do-not-disrupt pods");
        assert!(claims.iter().all(available), "{claims:?}");
        assert!(
            claims
                .iter()
                .all(|c| !c.annotations().contains_key(ANNOTATION_UNDERUTILIZED_SINCE)),
            "a held node is not even marked"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    show(&world, "10s, five times consolidateAfter: both nodes kept");

    // The marks become a duration that ends 6s from now (counted from each pod's start):
    // the nodes stay held until then, and nothing else has to change for them to go.
    for p in &held {
        let pod = api.get(p).await.expect("held pod");
        let started = pod
            .status
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .or(pod.metadata.creation_timestamp.as_ref())
            .expect("the pod's start")
            .0;
        let age = k8s_openapi::jiff::Timestamp::now().duration_since(started);
        let hold = format!("{}s", age.as_secs().max(0) + 6);
        mark_do_not_disrupt(&world, p, Some(&hold)).await;
    }
    let marked = Instant::now();
    while marked.elapsed() < Duration::from_secs(4) {
        let claims = pool_claims(&world, "burst").await;
        assert_eq!(claims.len(), 2, "held until the duration ends");
        assert!(
            claims
                .iter()
                .all(|c| !c.annotations().contains_key(ANNOTATION_UNDERUTILIZED_SINCE)),
            "a held node is not even marked"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    show(&world, "marks of a duration, 4s in: both nodes kept");

    // The holds ended: the node with the least to move goes; its pod is evicted and,
    // recreated as its ReplicaSet would, lands on the other node's room.
    let lifted = Instant::now();
    let mut most_claims = 0;
    let survivor = loop {
        let claims = pool_claims(&world, "burst").await;
        most_claims = most_claims.max(claims.len());
        let pods = tenant_pods(&world).await;
        remake_evicted(&world, &pods, &keep).await;
        let nodes = world.nodes().await;
        let bound: Vec<Option<String>> = pods.iter().map(bound_to).collect();
        if claims.len() == 1
            && claims.iter().all(available)
            && nodes.len() == 1
            && pods.len() == 3
            && bound
                .iter()
                .all(|b| b.as_deref() == nodes[0].metadata.name.as_deref())
        {
            break nodes[0].name_any();
        }
        if lifted.elapsed() > WAIT {
            show(&world, "not consolidated");
            panic!(
                "underutilized node not consolidated: claims {:?}\n{}",
                claims
                    .iter()
                    .map(|c| (c.name_any(), c.annotations().clone(), c.status.clone()))
                    .collect::<Vec<_>>(),
                kubectl(&world, &["get", "npool", "-n", NS, "-o", "yaml"])
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    show(
        &world,
        "marks removed: one node left, running all three pods",
    );
    assert_eq!(survivor, second, "the node with the least to move went");
    assert_eq!(most_claims, 2, "no new node for the moved pod");
    assert_pool_event(&world, "burst", "ConsolidatedUnderutilized").await;
    println!(
        "underutilized: held 10s by do-not-disrupt \"true\", then 6s by a duration; once it ended, {first} was drained and removed in {:.1}s and its pod runs on {survivor}",
        lifted.elapsed().as_secs_f64()
    );
    delete_pods_now(&world).await;
    world.shutdown().await;
}

/// The NodeType's `status.definitionHash`.
async fn definition_hash(world: &World, name: &str) -> Option<String> {
    world
        .node_type(name)
        .await
        .status
        .and_then(|s| s.definition_hash)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_node_type_marks_its_claims_drifted_and_the_pool_rolls_them_within_its_budget() {
    let world = World::with_provider(provider()).await;
    world
        .create_pool(
            "workers",
            json!({"providerRef": "pools", "replicas": 2,
                   "disruption": {"budgets": [{"nodes": "1"}]}}),
        )
        .await;
    // A single claim of the same type: it is marked, but nothing replaces it.
    world
        .create_claim(json!({"metadata": {"name": "single"},
                             "spec": {"providerRef": "pools"}}))
        .await;
    common::eventually("2 Available workers and the single claim", WAIT, || async {
        let claims = pool_claims(&world, "workers").await;
        let single = world.claims().get("single").await.ok()?;
        (claims.len() == 2 && claims.iter().all(available) && available(&single)).then_some(())
    })
    .await;
    let before = definition_hash(&world, "pools.small").await.expect("hash");
    let originals: Vec<String> = pool_claims(&world, "workers")
        .await
        .iter()
        .map(|c| c.name_any())
        .collect();
    for c in pool_claims(&world, "workers").await {
        let recorded = c.status.as_ref().and_then(|s| s.node_type_hash.clone());
        assert_eq!(recorded.as_deref(), Some(before.as_str()));
    }
    show(
        &world,
        "before: two workers and a single claim of pools.small",
    );

    // The type changes what its VMs are made from (a property, which becomes a node label).
    let changed = pools_provider(&[small() + "\n        properties:\n          tier: gold"]);
    world.apply_provider(&changed).await;
    let after = common::eventually("a new definition hash", WAIT, || async {
        definition_hash(&world, "pools.small")
            .await
            .filter(|h| *h != before)
    })
    .await;
    let single = world
        .wait_claim("single", "Drifted", WAIT, |c| {
            condition(c, "Drifted").is_some_and(|d| d.0 == "True")
        })
        .await;
    let (_, reason, message) = condition(&single, "Drifted").expect("Drifted");
    assert_eq!(reason, "NodeTypeChanged");
    assert!(message.contains(&after), "{message}");

    // The pool rolls its two claims by surge, one at a time (budget 1): never fewer than
    // one Available worker.
    let start = Instant::now();
    let mut seen_drifted = std::collections::BTreeSet::new();
    let mut fewest_available = usize::MAX;
    loop {
        let claims = pool_claims(&world, "workers").await;
        for c in &claims {
            if condition(c, "Drifted").is_some_and(|d| d.0 == "True") {
                seen_drifted.insert(c.name_any());
            }
        }
        let live: Vec<_> = claims
            .iter()
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .collect();
        fewest_available = fewest_available.min(live.iter().filter(|c| available(c)).count());
        let rolled = live.len() == 2
            && live.iter().all(|c| {
                available(c)
                    && !originals.contains(&c.name_any())
                    && c.status.as_ref().and_then(|s| s.node_type_hash.as_deref())
                        == Some(after.as_str())
                    && condition(c, "Drifted").is_none()
            })
            && claims.len() == 2
            && world.nodes().await.len() == 3;
        if rolled {
            break;
        }
        assert!(start.elapsed() < WAIT, "not rolled: {claims:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    show(
        &world,
        "after: both workers replaced; the single claim says Drifted",
    );
    assert_eq!(
        seen_drifted.iter().cloned().collect::<Vec<_>>(),
        {
            let mut o = originals.clone();
            o.sort();
            o
        },
        "both originals were marked Drifted"
    );
    assert!(fewest_available >= 1, "the budget of 1 keeps one worker");
    let nodes = world.nodes().await;
    let gold = nodes
        .iter()
        .filter(|n| n.labels().get("tier").map(String::as_str) == Some("gold"))
        .count();
    assert_eq!(gold, 2, "the new workers' nodes carry the new property");
    let single = world.claims().get("single").await.expect("single");
    assert!(available(&single), "a single claim is not replaced");
    println!(
        "drift: pools.small {before} -> {after}; 2 workers rolled in {:.1}s, at least {fewest_available} Available throughout; the single claim stays Drifted",
        start.elapsed().as_secs_f64()
    );
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_with_a_kubelet_older_than_the_tenant_are_drifted_and_rolled_one_at_a_time_unless_version_drift_is_disabled(
) {
    let world = World::with_provider(provider()).await;
    world
        .create_pool(
            "workers",
            json!({"providerRef": "pools", "replicas": 2,
                   "disruption": {"budgets": [{"nodes": "1"}],
                                  "kubernetesVersionDrift": "Disabled"}}),
        )
        .await;
    let originals = common::eventually("2 Available workers", WAIT, || async {
        let claims = pool_claims(&world, "workers").await;
        (claims.len() == 2 && claims.iter().all(available)).then_some(claims)
    })
    .await;
    // The tenant (v1.20) was upgraded after these nodes joined: their kubelets are v1.19.
    for c in &originals {
        let key = autonodes_testenv::simulator::KUBELET_VERSION_ANNOTATION;
        annotate_vm(&world, c, key, Some("v1.19.7")).await;
    }
    common::eventually("both Nodes report kubelet v1.19.7", WAIT, || async {
        let nodes = world.nodes().await;
        let old = nodes
            .iter()
            .filter_map(|n| n.status.as_ref()?.node_info.as_ref())
            .filter(|i| i.kubelet_version == "v1.19.7")
            .count();
        (old == 2).then_some(())
    })
    .await;
    common::eventually("both claims Drifted by the version", WAIT, || async {
        let claims = pool_claims(&world, "workers").await;
        let drifted = claims
            .iter()
            .filter_map(|c| condition(c, "Drifted"))
            .filter(|(s, r, m)| {
                s == "True"
                    && r == "KubernetesVersionChanged"
                    && m.contains("v1.19")
                    && m.contains("v1.20")
            })
            .count();
        (drifted == 2).then_some(())
    })
    .await;
    show(
        &world,
        "both kubelets v1.19 under a v1.20 tenant, version drift Disabled",
    );
    let held = Instant::now();
    while held.elapsed() < Duration::from_secs(8) {
        let claims = pool_claims(&world, "workers").await;
        assert_eq!(
            claims.len(),
            2,
            "no roll-out while version drift is Disabled"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Enabled: rolled by surge, one at a time (budget 1), never below one Available node.
    patch_pool_spec(
        &world,
        "workers",
        json!({"disruption": {"kubernetesVersionDrift": "Enabled"}}),
    )
    .await;
    let names: Vec<String> = originals.iter().map(|c| c.name_any()).collect();
    let start = Instant::now();
    let (mut most_live, mut fewest_available) = (0, usize::MAX);
    loop {
        let claims = pool_claims(&world, "workers").await;
        let live: Vec<_> = claims
            .iter()
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .collect();
        most_live = most_live.max(live.len());
        fewest_available = fewest_available.min(live.iter().filter(|c| available(c)).count());
        let rolled = claims.len() == 2
            && live.len() == 2
            && live.iter().all(|c| {
                available(c) && !names.contains(&c.name_any()) && condition(c, "Drifted").is_none()
            })
            && world.nodes().await.len() == 2;
        if rolled {
            break;
        }
        assert!(start.elapsed() < WAIT, "not rolled: {claims:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(most_live, 3, "one surge claim at a time");
    assert!(fewest_available >= 1, "never without an Available worker");
    show(
        &world,
        "rolled: two new workers whose kubelets match the tenant",
    );
    println!(
        "version drift: both v1.19 nodes replaced in {:.1}s, at most {most_live} live claims",
        start.elapsed().as_secs_f64()
    );
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_whose_nodes_come_up_with_a_kubelet_drifted_from_the_tenant_holds_its_version_roll_with_a_condition_and_its_claims_stay_available(
) {
    // Every VM of the provider boots a kubelet of v1.19 under the v1.20 tenant, as a
    // prepared image with a baked kubelet would: replacing a node changes nothing.
    let key = autonodes_testenv::simulator::KUBELET_VERSION_ANNOTATION;
    let provider = provider().replacen(
        "    virtualMachineTemplate:\n",
        &format!("    virtualMachineTemplate:\n      metadata:\n        annotations:\n          {key}: v1.19.7\n"),
        1,
    );
    assert!(provider.contains(key));
    let world = World::with_provider(provider).await;
    world
        .create_pool("baked", json!({"providerRef": "pools", "replicas": 3}))
        .await;
    let mut seen = std::collections::BTreeSet::new();
    let start = Instant::now();
    let message = loop {
        for c in pool_claims(&world, "baked").await {
            seen.insert(c.name_any());
        }
        let p = world.pools().get("baked").await.expect("pool");
        if let Some((_, _, m)) = pool_condition(&p, "VersionDriftHeld")
            .filter(|(s, r, _)| s == "True" && r == "ReplacementWouldDrift")
        {
            break m;
        }
        assert!(
            start.elapsed() < WAIT,
            "never held: {seen:?} {:?}",
            p.status
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        // The tenant's release is the test servers' (1.20 in CI, newer by hand).
        message.contains("the node's kubelet is v1.19, the tenant runs v1.")
            && message.contains("autonodes.io/kubernetes-download-url"),
        "{message}"
    );
    // Held for a while: no more replacements, three Available claims, the pool Ready.
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        let claims = pool_claims(&world, "baked").await;
        for c in &claims {
            seen.insert(c.name_any());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(seen.len() <= 4, "at most one node replaced: {seen:?}");
    let claims = common::eventually("3 Available claims", WAIT, || async {
        let claims = pool_claims(&world, "baked").await;
        (claims.len() == 3 && claims.iter().all(available)).then_some(claims)
    })
    .await;
    for c in &claims {
        let (s, r, m) = condition(c, "Drifted").expect("Drifted");
        assert_eq!(
            (s.as_str(), r.as_str()),
            ("True", "KubeletVersionMismatch"),
            "{m}"
        );
    }
    let p = world.pools().get("baked").await.expect("pool");
    assert_eq!(
        pool_condition(&p, "Ready").map(|(s, r, _)| (s, r)),
        Some(("True".to_string(), "AllReplicasReady".to_string()))
    );
    println!(
        "version drift held after {} claim(s) in all: {message}",
        seen.len()
    );
    world.shutdown().await;
}

/// A pause pod in the tenant's `default` namespace requesting `cpu`.
fn pod_of(name: &str, cpu: &str) -> Pod {
    let mut p = pod(name, None);
    if let Some(c) = p.spec.as_mut().and_then(|s| s.containers.first_mut()) {
        c.resources =
            serde_json::from_value(json!({"requests": {"cpu": cpu, "memory": "256Mi"}})).ok();
    }
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_whose_pods_fit_one_cheaper_node_are_merged_into_it_after_it_is_available() {
    // Two small nodes cost 40, one large node 30.
    let world = World::with_provider(pools_provider(&[
        small() + "\n        cost: 20",
        large() + "\n        cost: 30",
    ]))
    .await;
    let _scheduler = scheduler(&world);
    world
        .create_pool(
            "burst",
            // 6 s: longer than the test takes, on a loaded machine, to make an evicted pod
            // again (as its ReplicaSet would); for a shorter delay the large node, holding
            // one pod for a moment, is itself replaced by a cheaper small one.
            json!({"providerRef": "pools", "disruption": {"consolidateAfter": "6s"}}),
        )
        .await;
    // One pod, then another once the first runs: each gets a small node of its own (the
    // second does not fit the first node's room). Until both run, the pool's nodes are
    // not underutilized.
    let names = ["first".to_string(), "second".to_string()];
    for name in &names {
        create_pods(&world, [pod_of(name, "2500m")]).await;
        common::eventually(&format!("{name} bound"), WAIT, || async {
            let pods = tenant_pods(&world).await;
            pods.iter()
                .find(|p| &p.name_any() == name)
                .and_then(bound_to)
        })
        .await;
    }
    let smalls: Vec<String> = ready_nodes(&world)
        .await
        .iter()
        .map(|n| n.name_any())
        .collect();
    assert_eq!(smalls.len(), 2, "{smalls:?}");
    show(&world, "two small nodes, 2.5 CPU on each");
    let start = Instant::now();
    let mut large_seen_available = false;
    let merged = loop {
        let claims = pool_claims(&world, "burst").await;
        let large_available = claims.iter().any(|c| {
            available(c)
                && c.status.as_ref().and_then(|s| s.type_ref.as_deref()) == Some("pools.large")
        });
        let small_draining = claims.iter().any(|c| {
            c.metadata.deletion_timestamp.is_some()
                && c.status.as_ref().and_then(|s| s.type_ref.as_deref()) == Some("pools.small")
        });
        // A small node drains only once the large one is Available.
        if small_draining {
            assert!(
                large_available,
                "a small node drains before the large one is Available: {claims:?}"
            );
        }
        large_seen_available |= large_available;
        let pods = tenant_pods(&world).await;
        remake_evicted_as(&world, &pods, &names, |n| pod_of(n, "2500m")).await;
        let nodes = world.nodes().await;
        let on: Vec<Option<String>> = pods.iter().map(bound_to).collect();
        if claims.len() == 1
            && claims.iter().all(available)
            && nodes.len() == 1
            && nodes[0]
                .labels()
                .get("autonodes.io/node-type")
                .map(String::as_str)
                == Some("large")
            && pods.len() == 2
            && on
                .iter()
                .all(|n| n.as_deref() == nodes[0].metadata.name.as_deref())
        {
            break nodes[0].name_any();
        }
        assert!(start.elapsed() < WAIT, "not merged: {claims:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    show(
        &world,
        "after: both pods on one large node; the small ones are gone",
    );
    assert!(large_seen_available, "the large node was seen Available");
    assert_pool_event(&world, "burst", "ConsolidatedUnderutilized").await;
    println!(
        "merge: small nodes {smalls:?} replaced by large node {merged} in {:.1}s, replacement first",
        start.elapsed().as_secs_f64()
    );
    delete_pods_now(&world).await;
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_a_cheaper_type_could_replace_is_replaced_first_and_then_removed() {
    let world = World::with_provider(pools_provider(&[small(), large()])).await;
    let _scheduler = scheduler(&world);
    world
        .create_pool(
            "burst",
            json!({"providerRef": "pools", "disruption": {"consolidateAfter": "2s"}}),
        )
        .await;
    // A pod that only a large node takes, and a plain one that fills its room.
    create_pods(
        &world,
        [
            pod("needs-large", Some(("autonodes.io/node-type", "large"))),
            pod("web", None),
        ],
    )
    .await;
    let large = common::eventually("both pods on one large node", WAIT, || async {
        let pods = tenant_pods(&world).await;
        let nodes = ready_nodes(&world).await;
        (pods.len() == 2 && pods.iter().all(|p| bound_to(p).is_some()) && nodes.len() == 1)
            .then(|| nodes[0].name_any())
    })
    .await;
    show(&world, "one large node running both pods");
    // The large-only pod goes: what is left (1 CPU) fits a small node, which costs less.
    Api::<Pod>::namespaced(world.tenant.clone(), "default")
        .delete("needs-large", &DeleteParams::default().grace_period(0))
        .await
        .expect("pod deleted");
    let start = Instant::now();
    let mut replacement_seen_before_drain = false;
    let survivor = loop {
        let claims = pool_claims(&world, "burst").await;
        let replacement = claims.iter().find(|c| {
            c.annotations()
                .get("autonodes.io/replaces")
                .is_some_and(|_| {
                    c.status.as_ref().and_then(|s| s.type_ref.as_deref()) == Some("pools.small")
                })
        });
        let large_draining = claims.iter().any(|c| {
            c.status.as_ref().and_then(|s| s.node_name.as_deref()) == Some(large.as_str())
                && c.metadata.deletion_timestamp.is_some()
        });
        if replacement.is_some_and(available) && !large_draining {
            replacement_seen_before_drain = true;
        }
        // The tenant runs no ReplicaSet controller: the test makes the evicted pod again.
        let pods = tenant_pods(&world).await;
        remake_evicted(&world, &pods, &["web".to_string()]).await;
        let nodes = world.nodes().await;
        let web_on = pods
            .iter()
            .find(|p| p.name_any() == "web")
            .and_then(bound_to);
        if claims.len() == 1
            && claims.iter().all(available)
            && nodes.len() == 1
            && nodes[0]
                .labels()
                .get("autonodes.io/node-type")
                .map(String::as_str)
                == Some("small")
            && web_on.as_deref() == nodes[0].metadata.name.as_deref()
        {
            break nodes[0].name_any();
        }
        assert!(start.elapsed() < WAIT, "not replaced: {claims:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    show(
        &world,
        "after: the pod runs on a small node; the large one is gone",
    );
    assert!(
        replacement_seen_before_drain,
        "the small node was Available before the large one drained"
    );
    assert_pool_event(&world, "burst", "ConsolidatedUnderutilized").await;
    println!(
        "cheaper: large node {large} replaced by small node {survivor} in {:.1}s, replacement first",
        start.elapsed().as_secs_f64()
    );
    delete_pods_now(&world).await;
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_leaves_do_not_disrupt_pods_until_the_pools_termination_grace_period_then_the_node_goes(
) {
    let world = World::with_provider(provider()).await;
    world
        .create_pool(
            "keep",
            json!({"providerRef": "pools", "replicas": 1, "terminationGracePeriod": "8s"}),
        )
        .await;
    let (claim, node) = common::eventually("the pool's node", WAIT, || async {
        let claims = pool_claims(&world, "keep").await;
        let c = claims.iter().find(|c| available(c))?;
        Some((c.name_any(), c.status.as_ref()?.node_name.clone()?))
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(world.tenant.clone(), "default");
    for (name, marked) in [("held", true), ("free", false)] {
        let mut p = pod(name, None);
        if let Some(spec) = p.spec.as_mut() {
            spec.node_name = Some(node.clone());
        }
        if marked {
            p.metadata.annotations = Some(
                [(
                    "karpenter.sh/do-not-disrupt".to_string(),
                    "true".to_string(),
                )]
                .into(),
            );
        }
        create_pods(&world, [p]).await;
    }
    show(&world, "a node with a do-not-disrupt pod and a plain one");
    let deleted = Instant::now();
    patch_pool_spec(&world, "keep", json!({"replicas": 0})).await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(world.tenant.clone());
    let mut message_seen = String::new();
    loop {
        // The plain pod is evicted (the test plays its kubelet); the marked one never is
        // while its node is there.
        if let Some(p) = pods.get_opt("free").await.expect("read") {
            if p.metadata.deletion_timestamp.is_some() {
                let _ = pods
                    .delete("free", &DeleteParams::default().grace_period(0))
                    .await;
            }
        }
        let held = pods.get_opt("held").await.expect("read");
        let node_there = nodes.get_opt(&node).await.expect("read").is_some();
        if !node_there {
            break;
        }
        assert!(
            held.is_some_and(|p| p.metadata.deletion_timestamp.is_none()),
            "a do-not-disrupt pod is not evicted"
        );
        if let Ok(c) = world.claims().get(&claim).await {
            if let Some((_, _, m)) = condition(&c, "Ready") {
                if m.contains("do-not-disrupt") {
                    message_seen = m;
                }
            }
        }
        assert!(deleted.elapsed() < WAIT, "the node never went");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let took = deleted.elapsed();
    show(&world, "the grace period over: the node is gone");
    assert!(
        message_seen.contains("1 of them marked do-not-disrupt"),
        "{message_seen:?}"
    );
    assert!(
        took >= Duration::from_secs(8),
        "the node went only after the grace period: {took:?}"
    );
    let events = world.events_for(NS, &claim).await;
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("DrainTimeout") && e.contains("marked do-not-disrupt")),
        "{events:?}"
    );
    println!("drain: {message_seen}; node {node} gone {took:?} after the scale-down (grace 8s)");
    world.shutdown().await;
}

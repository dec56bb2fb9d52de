//! Provisioning across clusters on real API servers: management + host + tenant, the
//! controller and the KubeVirt simulator (scheduling, launch, join, cleanup).

use crate::common;

use std::time::Duration;

use common::column;
use common::pools::kubectl;
use common::world::*;

const AVAILABLE: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_provider_claims_for_standard_and_high_memory_nodes_turn_available() {
    let world = World::start(WorldOptions::default()).await;
    world.claim_type("standard-1", "standard-node").await;
    world.claim_type("high-memory-1", "high-memory-node").await;
    let standard = world.wait_phase("standard-1", "Available", AVAILABLE).await;
    let high = world
        .wait_phase("high-memory-1", "Available", AVAILABLE)
        .await;

    let s = standard.status.clone().expect("status");
    assert_eq!(
        s.type_ref.as_deref(),
        Some("kubevirt-provider-advanced.standard-node")
    );
    assert_eq!(s.cost, Some(28));
    let h = high.status.clone().expect("status");
    assert_eq!(
        h.type_ref.as_deref(),
        Some("kubevirt-provider-advanced.high-memory-node")
    );
    assert_eq!(h.cost, Some(72));
    let vm_name = h.vm_name.clone().expect("vm name");
    assert_eq!(
        h.provider_id.as_deref(),
        Some(format!("kubevirt://{vm_name}").as_str())
    );
    for cond in ["Scheduled", "Provisioned", "Joined", "Ready"] {
        assert_eq!(
            condition(&high, cond).map(|c| c.0),
            Some("True".into()),
            "{cond}"
        );
    }

    // The VM on the host is the type's template with the claim's fields forced.
    let vms = world.vms().await;
    assert_eq!(vms.len(), 2);
    let vm = vms
        .iter()
        .find(|v| v.metadata.name.as_deref() == Some(vm_name.as_str()))
        .expect("high-memory VM");
    let labels = vm.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("provider").map(String::as_str), Some("kubevirt"));
    assert_eq!(
        labels.get("workload").map(String::as_str),
        Some("memory-intensive")
    );
    assert_eq!(
        labels.get("autonodes.io/nodeclaim").map(String::as_str),
        Some("high-memory-1")
    );
    let spec = &vm.data["spec"];
    assert_eq!(spec["runStrategy"], "Always");
    let tspec = &spec["template"]["spec"];
    assert_eq!(tspec["hostname"], vm_name.as_str());
    assert_eq!(tspec["domain"]["resources"]["requests"]["cpu"], "4");
    assert_eq!(tspec["domain"]["resources"]["requests"]["memory"], "16Gi");
    assert!(
        tspec.get("taints").is_none(),
        "taints must not reach KubeVirt"
    );
    let volumes = tspec["volumes"].as_array().expect("volumes");
    let cloud = volumes
        .iter()
        .find(|v| v["name"] == "cloudinitdisk")
        .expect("cloudinitdisk volume");
    assert_eq!(
        cloud["cloudInitNoCloud"]["secretRef"]["name"],
        format!("{vm_name}-userdata")
    );
    let dv_name = format!("{vm_name}-containerdisk");
    assert_eq!(
        spec["dataVolumeTemplates"][0]["metadata"]["name"],
        dv_name.as_str()
    );
    assert!(volumes
        .iter()
        .any(|v| v["dataVolume"]["name"] == dv_name.as_str()));
    let disks = tspec["domain"]["devices"]["disks"]
        .as_array()
        .expect("disks");
    assert!(disks.iter().any(|d| d["name"] == "containerdisk"));
    assert!(disks.iter().any(|d| d["name"] == "cloudinitdisk"));
    assert_eq!(
        tspec["domain"]["devices"]["interfaces"][0]["name"],
        "default"
    );

    // The Secret holds the user data; the token is gone once the node joined.
    let secrets = world.host_secrets().await;
    assert_eq!(secrets.len(), 2);
    assert!(secrets.iter().any(|s| s.metadata.name.as_deref()
        == Some(format!("{vm_name}-userdata").as_str())
        && s.data.as_ref().is_some_and(|d| d.contains_key("userdata"))));
    assert!(
        world.tokens().await.is_empty(),
        "bootstrap tokens must be deleted after the join"
    );

    // The Node carries the labels and taints, without the registration taint.
    let nodes = world.nodes().await;
    let node = nodes
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some(vm_name.as_str()))
        .expect("node");
    let nl = node.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        nl.get("autonodes.io/node-type").map(String::as_str),
        Some("high-memory-node")
    );
    assert_eq!(
        nl.get("node.kubernetes.io/instance-type")
            .map(String::as_str),
        Some("kubevirt-provider-advanced.high-memory-node")
    );
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    assert!(
        taints.iter().any(|t| t.key == "workload"
            && t.value.as_deref() == Some("high-memory")
            && t.effect == "NoSchedule"),
        "{taints:?}"
    );
    assert!(
        !taints.iter().any(|t| t.key == "autonodes.io/unregistered"),
        "{taints:?}"
    );

    // Cost and capacity show in NodeType status.
    let t = world
        .wait_node_type(
            "kubevirt-provider-advanced.high-memory-node",
            "claimed 1",
            |t| {
                t.status
                    .as_ref()
                    .and_then(|s| s.capacity.as_ref())
                    .is_some_and(|c| c.claimed == 1)
            },
        )
        .await;
    let ts = t.status.expect("status");
    assert_eq!(ts.cost, Some(72));
    let cap = ts.capacity.expect("capacity");
    assert_eq!((cap.total, cap.available), (Some(5), Some(4)));
    world.shutdown().await;
}

/// A provider on the playground's host with one small type of the given capacity.
fn small_provider(name: &str, max_capacity: u32) -> String {
    provider_yaml(
        name,
        "test-kubevirt-1",
        "1",
        "1Gi",
        &format!("      - name: tiny\n        maxCapacity: {max_capacity}"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_without_requirements_gets_the_cheapest_type() {
    let world = World::start(WorldOptions::default()).await;
    world
        .create_claim(serde_json::json!({"metadata": {"name": "any"}, "spec": {}}))
        .await;
    let c = world.wait_phase("any", "Available", AVAILABLE).await;
    let s = c.status.expect("status");
    assert_eq!(
        s.type_ref.as_deref(),
        Some("kubevirt-provider-advanced.standard-node"),
        "28 beats 72"
    );
    assert_eq!(s.cost, Some(28));
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_type_keeps_a_claim_pending_until_another_claim_is_deleted() {
    let world = World::start(WorldOptions {
        provider: small_provider("small", 1),
        ..Default::default()
    })
    .await;
    world
        .create_claim(serde_json::json!({"metadata": {"name": "first"}, "spec": {}}))
        .await;
    world.wait_phase("first", "Available", AVAILABLE).await;
    world
        .create_claim(serde_json::json!({"metadata": {"name": "second"}, "spec": {}}))
        .await;
    let pending = world
        .wait_claim("second", "Scheduled=False", AVAILABLE, |c| {
            condition(c, "Scheduled").is_some_and(|x| x.0 == "False")
        })
        .await;
    let (_, reason, message) = condition(&pending, "Scheduled").expect("condition");
    assert_eq!(reason, "InsufficientCapacity");
    assert!(message.contains("small.tiny (1/1 claimed)"), "{message}");
    // `kubectl get nclaim` says why a claim waits; `-o wide` where the others run.
    let table = kubectl(&world, &["get", "nclaim", "-n", NS]);
    println!("$ kubectl get nclaim -n {NS}\n{table}");
    assert_eq!(column(&table, "second", "REASON"), "InsufficientCapacity");
    assert_eq!(column(&table, "second", "PHASE"), "Pending");
    assert_eq!(column(&table, "first", "REASON"), "");
    let wide = kubectl(&world, &["get", "nclaim", "-n", NS, "-o", "wide"]);
    println!("$ kubectl get nclaim -n {NS} -o wide\n{wide}");
    assert_eq!(column(&wide, "first", "PROVIDER"), "small");
    assert_eq!(
        column(&wide, "first", "HOSTCLUSTER"),
        world.playground.provider.spec.kube_virt.cluster_ref.cluster
    );
    assert!(
        column(&wide, "first", "PROVIDERID").starts_with("kubevirt://"),
        "{wide}"
    );
    let t = world
        .wait_node_type("small.tiny", "Exhausted", |t| {
            t.status
                .as_ref()
                .and_then(|s| s.phase)
                .map(|p| format!("{p:?}"))
                == Some("Exhausted".into())
        })
        .await;
    assert_eq!(
        t.status.and_then(|s| s.capacity).and_then(|c| c.available),
        Some(0)
    );

    world.delete_claim("first").await;
    world.wait_claim_gone("first", AVAILABLE).await;
    let second = world.wait_phase("second", "Available", AVAILABLE).await;
    assert_eq!(
        second.status.and_then(|s| s.type_ref).as_deref(),
        Some("small.tiny")
    );
    assert_eq!(world.vms().await.len(), 1);
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_claim_leaves_no_vm_secret_token_data_volume_or_node_behind() {
    let world = World::start(WorldOptions::default()).await;
    world.claim_type("doomed", "standard-node").await;
    world.claim_type("kept", "standard-node").await;
    let doomed = world.wait_phase("doomed", "Available", AVAILABLE).await;
    world.wait_phase("kept", "Available", AVAILABLE).await;
    assert_eq!(world.vms().await.len(), 2);
    assert_eq!(world.data_volumes().await.len(), 2);
    let vm = doomed.status.and_then(|s| s.vm_name).expect("vm name");

    world.delete_claim("doomed").await;
    world.wait_claim_gone("doomed", AVAILABLE).await;
    let vms: Vec<String> = world
        .vms()
        .await
        .into_iter()
        .filter_map(|v| v.metadata.name)
        .collect();
    assert!(!vms.contains(&vm), "VM {vm} left behind: {vms:?}");
    assert_eq!(vms.len(), 1, "the other claim's VM stays");
    let secrets: Vec<String> = world
        .host_secrets()
        .await
        .into_iter()
        .filter_map(|s| s.metadata.name)
        .collect();
    assert_eq!(secrets.len(), 1, "{secrets:?}");
    assert!(!secrets.contains(&format!("{vm}-userdata")));
    assert!(world.tokens().await.is_empty());
    let nodes: Vec<String> = world
        .nodes()
        .await
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    assert!(!nodes.contains(&vm), "Node {vm} left behind: {nodes:?}");
    assert_eq!(nodes.len(), 1);
    common::eventually(
        "the DataVolume of the deleted VM to go",
        Duration::from_secs(30),
        || async { (world.data_volumes().await.len() == 1).then_some(()) },
    )
    .await;
    let events = world.events_for(NS, "doomed").await;
    assert!(
        events.iter().any(|e| e.starts_with("NodeDeleted")),
        "{events:?}"
    );
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_claim_cordons_and_drains_its_node_before_its_vm_is_deleted() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, DeleteParams, PostParams};

    let world = World::start(WorldOptions::default()).await;
    world.claim_type("drained", "standard-node").await;
    let claim = world.wait_phase("drained", "Available", AVAILABLE).await;
    let status = claim.status.expect("status");
    let (vm, node) = (
        status.vm_name.expect("vm name"),
        status.node_name.expect("node name"),
    );
    // A workload bound to the node, and a DaemonSet's pod, which a drain leaves alone.
    let pods: Api<Pod> = Api::namespaced(world.tenant.clone(), "default");
    let pod = |name: &str, daemon: bool| -> Pod {
        let owners = if daemon {
            serde_json::json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds",
                                "uid": "00000000-0000-0000-0000-000000000001"}])
        } else {
            serde_json::json!([])
        };
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "ownerReferences": owners},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
        }))
        .expect("pod")
    };
    pods.create(&PostParams::default(), &pod("workload", false))
        .await
        .expect("workload pod");
    pods.create(&PostParams::default(), &pod("daemon", true))
        .await
        .expect("daemon pod");

    world.delete_claim("drained").await;
    // The eviction marks the workload for deletion; no kubelet confirms it, so it stays.
    common::eventually("the workload to be evicted", AVAILABLE, || async {
        pods.get("workload")
            .await
            .ok()
            .filter(|p| p.metadata.deletion_timestamp.is_some())
    })
    .await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(world.tenant.clone());
    let cordoned = nodes.get(&node).await.expect("the node is still there");
    assert_eq!(
        cordoned.spec.and_then(|s| s.unschedulable),
        Some(true),
        "cordoned before the eviction"
    );
    let daemon = pods.get("daemon").await.expect("daemon pod");
    assert!(daemon.metadata.deletion_timestamp.is_none(), "not evicted");
    let vms: Vec<String> = world
        .vms()
        .await
        .into_iter()
        .filter(|v| v.metadata.deletion_timestamp.is_none())
        .filter_map(|v| v.metadata.name)
        .collect();
    assert!(
        vms.contains(&vm),
        "the VM waits for the drain, and the drain for the workload: {vms:?}"
    );
    // The kubelet's part: the pod has stopped.
    pods.delete("workload", &DeleteParams::default().grace_period(0))
        .await
        .expect("force delete");
    world.wait_claim_gone("drained", AVAILABLE).await;
    assert!(world.vms().await.is_empty());
    assert!(nodes.get_opt(&node).await.expect("read node").is_none());
    let events = world.events_for(NS, "drained").await;
    assert!(
        events.iter().any(|e| e.starts_with("NodeCordoned")),
        "{events:?}"
    );
    assert!(
        !events.iter().any(|e| e.starts_with("DrainTimeout")),
        "drained in time: {events:?}"
    );
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_claims_at_once_never_exceed_a_max_capacity_of_ten() {
    let world = World::start(WorldOptions {
        provider: small_provider("small", 10),
        ..Default::default()
    })
    .await;
    let creates = (0..50).map(|i| {
        world.create_claim(serde_json::json!({"metadata": {"name": format!("c-{i}")}, "spec": {}}))
    });
    futures::future::join_all(creates).await;
    // Claims created before the provider is ready wait with NoMatchingNodeType; once it
    // is, exactly ten get scheduled and the other forty wait for capacity.
    let scheduled =
        |c: &autonodes_api::NodeClaim| condition(c, "Scheduled").is_some_and(|x| x.0 == "True");
    let waiting = |c: &autonodes_api::NodeClaim| {
        condition(c, "Scheduled").is_some_and(|x| x.0 == "False" && x.1 == "InsufficientCapacity")
    };
    let claims = common::eventually(
        "10 scheduled and 40 waiting for capacity",
        Duration::from_secs(120),
        || async {
            let list = world.claims().list(&Default::default()).await.ok()?;
            let s = list.items.iter().filter(|c| scheduled(c)).count();
            let w = list.items.iter().filter(|c| waiting(c)).count();
            assert!(
                s <= 10,
                "{s} claims scheduled to a type with maxCapacity 10"
            );
            (s == 10 && w == 40).then_some(list.items)
        },
    )
    .await;
    assert_eq!(claims.len(), 50);
    common::eventually("ten VMs", Duration::from_secs(60), || async {
        (world.vms().await.len() == 10).then_some(())
    })
    .await;
    // Still ten a little later: nothing schedules beyond capacity on later reconciles.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(world.vms().await.len(), 10);
    let t = world.node_type("small.tiny").await;
    let cap = t.status.and_then(|s| s.capacity).expect("capacity");
    assert!(cap.claimed <= 10, "claimed {}", cap.claimed);
    world.shutdown().await;
}

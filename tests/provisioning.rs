//! Provisioning across clusters on real API servers: management + host + tenant, the
//! controller and the KubeVirt simulator (DESIGN §4–§6).

mod common;

use std::time::Duration;

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

    // The VM on the host is what DESIGN §3 says.
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

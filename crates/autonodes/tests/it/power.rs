//! Powering a claim's node off and on, on real API servers (management and host in one,
//! tenant, the controller and the KubeVirt simulator): off, its Node is drained, cordoned and
//! kept, its VM stopped and the host room it took given to a claim that waited for it; on
//! again, the same Node comes back Ready.

use std::time::Duration;

use crate::common;
use common::world::*;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::ResourceExt;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(120);

/// Sets (or with `null` removes) a claim's `spec.power`.
async fn power(world: &World, claim: &str, power: serde_json::Value) {
    world
        .claims()
        .patch(
            claim,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"power": power}})),
        )
        .await
        .expect("claim patched");
}

fn phase(c: &autonodes_api::NodeClaim) -> Option<autonodes_api::NodeClaimPhase> {
    c.status.as_ref()?.phase
}

fn power_state(c: &autonodes_api::NodeClaim) -> Option<autonodes_api::PowerState> {
    c.status.as_ref()?.power
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_powered_off_claim_keeps_its_node_cordoned_gives_its_host_room_back_and_is_ready_again_when_powered_on(
) {
    use autonodes_api::{NodeClaimPhase, PowerState};
    // One host node with room for two VMs of the type (2 cpu, 4Gi and the launcher's
    // 100m, 256Mi each).
    let types = r#"      - name: tight
        resources:
          cpu: "2"
          memory: 4Gi
        properties:
          autonodes.io/host-node-selector: "autonodes.test/rack=tight"
"#;
    let mut world = World::start_clusters(&WorldOptions {
        provider: provider_yaml("power", "test-kubevirt-1", "1", "1Gi", types),
        ..WorldOptions::default()
    })
    .await;
    autonodes_testenv::playground::put_host_node(
        &world.host,
        "tight-0",
        None,
        &[("autonodes.test/rack", "tight")],
        &[("cpu", "5"), ("memory", "9Gi"), ("pods", "110")],
    )
    .await
    .expect("host node");
    world
        .start_simulator(autonodes_testenv::simulator::SimMode::Normal)
        .await;
    world.start_controller();
    let claim =
        |name: &str| json!({"metadata": {"name": name}, "spec": {"typeRef": "power.tight"}});
    world.create_claim(claim("p-1")).await;
    world.create_claim(claim("p-2")).await;
    let p1 = world.wait_phase("p-1", "Available", WAIT).await;
    world.wait_phase("p-2", "Available", WAIT).await;
    world.create_claim(claim("p-3")).await;
    world
        .wait_claim("p-3", "HostCapacityExhausted", WAIT, |c| {
            condition(c, "Scheduled").is_some_and(|(_, r, _)| r == "HostCapacityExhausted")
        })
        .await;
    let node_name = p1
        .status
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .expect("node");
    let tenant_nodes: Api<Node> = Api::all(world.tenant.clone());
    let uid = tenant_nodes
        .get(&node_name)
        .await
        .expect("Node")
        .uid()
        .expect("uid");

    // Off: drained, cordoned and kept; the VM stopped; its room goes to p-3.
    power(&world, "p-1", json!("Off")).await;
    let off = world
        .wait_claim("p-1", "powered off", WAIT, |c| {
            phase(c) == Some(NodeClaimPhase::PoweredOff) && power_state(c) == Some(PowerState::Off)
        })
        .await;
    let (status, reason, _) = condition(&off, "Ready").expect("Ready");
    assert_eq!((status.as_str(), reason.as_str()), ("False", "PoweredOff"));
    let node = tenant_nodes
        .get(&node_name)
        .await
        .expect("the Node is kept");
    assert_eq!(node.uid().as_deref(), Some(uid.as_str()));
    assert_eq!(node.spec.and_then(|s| s.unschedulable), Some(true));
    let vm = world.vm_of(&off).await;
    assert_eq!(
        vm.data["spec"]["runStrategy"],
        json!("Halted"),
        "{:?}",
        vm.data["spec"]
    );
    let vmis: Api<DynamicObject> = Api::namespaced_with(
        world.host.clone(),
        &vm.namespace().expect("namespace"),
        &autonodes_api::kubevirt::virtual_machine_instance(),
    );
    assert!(vmis.get_opt(&vm.name_any()).await.expect("read").is_none());
    world.wait_phase("p-3", "Available", WAIT).await;
    // Nothing disrupts it meanwhile.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let still = world.claims().get("p-1").await.expect("claim");
    assert_eq!(phase(&still), Some(NodeClaimPhase::PoweredOff));

    // On again (after p-3 gave the room back): the same Node, Ready and schedulable.
    world.delete_claim("p-3").await;
    world.wait_claim_gone("p-3", WAIT).await;
    power(&world, "p-1", json!(null)).await;
    world
        .wait_claim("p-1", "Available and On", WAIT, |c| {
            phase(c) == Some(NodeClaimPhase::Available) && power_state(c) == Some(PowerState::On)
        })
        .await;
    let node = common::eventually("the Node Ready and uncordoned", WAIT, || async {
        let n = tenant_nodes.get(&node_name).await.ok()?;
        let ready = n
            .status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        let cordoned = n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
        (ready && !cordoned).then_some(n)
    })
    .await;
    assert_eq!(
        node.uid().as_deref(),
        Some(uid.as_str()),
        "the Node was kept"
    );
    let vm = world.vm_of(&still).await;
    assert_eq!(vm.data["spec"]["runStrategy"], json!("Always"));
    world.shutdown().await;
}

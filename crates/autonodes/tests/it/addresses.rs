//! Static node addresses on real API servers (management, host, tenant, the controller and
//! the KubeVirt simulator, whose guests take the address their cloud-init network data
//! gives them): each claim of a type with an `addressPool` holds one address of it for its
//! life, no address is held twice, and a pool with none left keeps claims waiting.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::common::world::*;
use autonodes_api::{NodeClaim, NodeClaimPhase};
use k8s_openapi::api::core::v1::Node;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use serde_json::json;

const AVAILABLE: Duration = Duration::from_secs(120);

/// A provider `addr` with one type, `static`, whose nodes get addresses of `cidr` on
/// their first interface, bridged to a Multus network (`autonodes.io/default-network`).
fn provider(cidr: &str, gateway: &str, dns: &str) -> String {
    provider_yaml(
        "addr",
        "test-kubevirt-1",
        "1",
        "1Gi",
        &format!(
            "      - name: static\n        properties:\n          autonodes.io/default-network: tenant-networks/nodes\n        addressPool:\n          cidr: {cidr}\n          gateway: {gateway}\n          dnsServers: [{dns}]\n"
        ),
    )
}

/// The address (without its prefix length) a claim's status shows.
fn address(c: &NodeClaim) -> Option<String> {
    let a = c.status.as_ref()?.address.as_deref()?;
    Some(a.split('/').next()?.to_string())
}

/// The InternalIP of a Node.
fn internal_ip(n: &Node) -> Option<String> {
    n.status
        .as_ref()?
        .addresses
        .as_ref()?
        .iter()
        .find(|a| a.type_ == "InternalIP")
        .map(|a| a.address.clone())
}

/// Creates `n` claims `<prefix>-<i>` of type `addr.static`.
async fn create_claims(world: &World, prefix: &str, n: usize) {
    let api = world.claims();
    for i in 0..n {
        let claim: NodeClaim = serde_json::from_value(json!({
            "apiVersion": "autonodes.io/v1alpha1", "kind": "NodeClaim",
            "metadata": {"name": format!("{prefix}-{i}"), "namespace": NS},
            "spec": {"vClusterRef": {"name": "tenant"}, "typeRef": "addr.static"},
        }))
        .expect("claim");
        api.create(&PostParams::default(), &claim)
            .await
            .expect("claim created");
    }
}

/// Waits until `n` claims are Available; returns every claim.
async fn wait_available(world: &World, n: usize) -> Vec<NodeClaim> {
    let start = Instant::now();
    loop {
        let claims = world
            .claims()
            .list(&ListParams::default())
            .await
            .expect("list claims")
            .items;
        let available = claims
            .iter()
            .filter(|c| c.status.as_ref().and_then(|s| s.phase) == Some(NodeClaimPhase::Available))
            .count();
        if available >= n {
            return claims;
        }
        assert!(
            start.elapsed() < AVAILABLE,
            "{available} of {n} claims Available after {AVAILABLE:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_claims_of_one_address_pool_get_distinct_addresses_that_their_nodes_report_and_keep_across_a_new_vm_instance(
) {
    let world = World::with_provider(provider("10.77.0.0/24", "10.77.0.1", "10.77.0.2")).await;
    let started = Instant::now();
    create_claims(&world, "a", 200).await;
    let claims = wait_available(&world, 200).await;
    println!(
        "200 claims Available with static addresses in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // Two hundred distinct addresses of the pool, none of them kept back.
    let by_claim: BTreeMap<String, String> = claims
        .iter()
        .map(|c| (c.name_any(), address(c).expect("status.address")))
        .collect();
    let distinct: BTreeSet<&String> = by_claim.values().collect();
    assert_eq!(distinct.len(), 200, "an address held twice: {by_claim:?}");
    for a in &distinct {
        let last: u32 = a
            .strip_prefix("10.77.0.")
            .and_then(|l| l.parse().ok())
            .unwrap_or_else(|| panic!("{a} is outside 10.77.0.0/24"));
        assert!((3..=254).contains(&last), "{a} is kept back");
    }
    assert!(claims.iter().all(|c| c
        .status
        .as_ref()
        .and_then(|s| s.address.as_deref())
        .is_some_and(|a| a.ends_with("/24"))));

    // Every node reports the address its claim holds (the simulated guest sets what its
    // network data says; without it the guest would take another 10.x address).
    let nodes: BTreeMap<String, String> = world
        .nodes()
        .await
        .iter()
        .filter_map(|n| Some((n.name_any(), internal_ip(n)?)))
        .collect();
    for c in &claims {
        let node = c
            .status
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .expect("nodeName");
        assert_eq!(
            nodes.get(&node),
            address(c).as_ref(),
            "Node {node} of claim {}",
            c.name_any()
        );
    }

    // The VM reads its network data from its user-data Secret.
    let one = claims.iter().find(|c| c.name_any() == "a-0").expect("a-0");
    let vm = world.vm_of(one).await;
    let secret_name = format!("{}-userdata", vm.name_any());
    let volumes = vm.data["spec"]["template"]["spec"]["volumes"].to_string();
    assert!(
        volumes.contains(&format!(
            "\"networkDataSecretRef\":{{\"name\":\"{secret_name}\"}}"
        )),
        "{volumes}"
    );
    let secret = world
        .host_secrets()
        .await
        .into_iter()
        .find(|s| s.name_any() == secret_name)
        .expect("the user-data Secret");
    let network = secret.data.unwrap_or_default()["networkdata"].0.clone();
    let network = String::from_utf8(network).expect("UTF-8");
    let held = one
        .status
        .as_ref()
        .and_then(|s| s.address.clone())
        .expect("address");
    assert!(network.contains(&format!("\"{held}\"")), "{network}");
    // The interface the network data matches by its MAC address.
    let mac = vm.data["spec"]["template"]["spec"]["domain"]["devices"]["interfaces"][0]
        ["macAddress"]
        .as_str()
        .expect("macAddress")
        .to_string();
    assert!(
        network.contains(&format!("macaddress: \"{mac}\"")),
        "{network}"
    );
    assert!(network.contains("via: \"10.77.0.1\""), "{network}");

    // A new instance of the VM (a restart) comes back with the same address.
    let node_name = one
        .status
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .expect("nodeName");
    let boot_before = world
        .nodes()
        .await
        .into_iter()
        .find(|n| n.name_any() == node_name)
        .and_then(|n| n.status?.node_info.map(|i| i.boot_id))
        .expect("bootID");
    world
        .claims()
        .patch(
            "a-0",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"autonodes.io/restart": "address-test"}}}),
            ),
        )
        .await
        .expect("restart asked");
    let rebooted = crate::common::eventually("the node's new boot", AVAILABLE, || async {
        let n = world
            .nodes()
            .await
            .into_iter()
            .find(|n| n.name_any() == node_name)?;
        let boot = n.status.as_ref()?.node_info.as_ref()?.boot_id.clone();
        (boot != boot_before).then_some(n)
    })
    .await;
    assert_eq!(
        internal_ip(&rebooted),
        address(one),
        "the address after the restart"
    );
    let after = world.wait_phase("a-0", "Available", AVAILABLE).await;
    assert_eq!(after.status.and_then(|s| s.address), Some(held));
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_address_pool_keeps_a_claim_waiting_with_a_reason_until_a_deleted_claim_gives_its_address_back(
) {
    // A /29 without its subnet, broadcast and gateway addresses: five to hand out.
    let world =
        World::with_provider(provider("192.168.50.8/29", "192.168.50.9", "192.168.50.9")).await;
    create_claims(&world, "b", 5).await;
    let claims = wait_available(&world, 5).await;
    let held: BTreeSet<String> = claims.iter().filter_map(address).collect();
    let expected: BTreeSet<String> = (10..=14).map(|i| format!("192.168.50.{i}")).collect();
    assert_eq!(held, expected);

    create_claims(&world, "late", 1).await;
    let waiting = world
        .wait_claim(
            "late-0",
            "Scheduled=False AddressPoolExhausted",
            AVAILABLE,
            |c| {
                condition(c, "Scheduled")
                    .is_some_and(|(s, r, _)| s == "False" && r == "AddressPoolExhausted")
            },
        )
        .await;
    let (_, _, message) = condition(&waiting, "Scheduled").expect("Scheduled");
    println!("late-0 waits: {message}");
    assert!(message.contains("all 5 addresses"), "{message}");
    assert_eq!(address(&waiting), None);
    // It stays so: no address is handed out twice.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let still = world.claims().get("late-0").await.expect("late-0");
    assert_eq!(address(&still), None);

    // A claim deleted gives its address back, and the waiting claim gets it.
    let freed = claims
        .iter()
        .find(|c| c.name_any() == "b-2")
        .and_then(address)
        .expect("b-2's address");
    world.delete_claim("b-2").await;
    world.wait_claim_gone("b-2", AVAILABLE).await;
    let served = world.wait_phase("late-0", "Available", AVAILABLE).await;
    assert_eq!(address(&served), Some(freed));
    world.shutdown().await;
}

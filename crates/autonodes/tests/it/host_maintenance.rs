//! Host maintenance on real API servers (management and host in one, tenant, the controller
//! and the KubeVirt simulator, whose VMs run on the playground's host Nodes and migrate
//! between them): a host node cordoned under the VMs of two pools. VMs that can live-migrate
//! move with their tenant Nodes untouched; one that cannot is replaced by a Ready node before
//! its old node is drained, within a budget; a budget of 0 for `HostMaintenance` holds the
//! replacement and says so, and a failed migration is replaced too.

use std::time::Duration;

use crate::common;
use common::pools::*;
use common::world::*;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::ResourceExt;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(150);

/// The host node the simulator runs VMs on first.
const HOST_NODE: &str = "kubevirt-host-0";

/// A provider `maint` with two types, both asking KubeVirt to live-migrate on eviction:
/// `live` (a container disk: KubeVirt can move it) and `pinned` (also a blank data disk,
/// `ReadWriteOnce` by default: KubeVirt cannot).
fn provider() -> String {
    let live_migrate = "        mergeVirtualMachineTemplate:\n          spec:\n            template:\n              spec:\n                evictionStrategy: LiveMigrate\n";
    provider_yaml(
        "maint",
        "test-kubevirt-1",
        "1",
        "1Gi",
        &format!(
            "      - name: live\n{live_migrate}      - name: pinned\n        properties:\n          autonodes.io/data-disks: \"data:1Gi\"\n{live_migrate}"
        ),
    )
}

/// A static pool of `replicas` nodes of type `type_`, with `budgets`.
fn pool_spec(type_: &str, replicas: u32, budgets: serde_json::Value) -> serde_json::Value {
    json!({"providerRef": "maint", "replicas": replicas,
           "requirements": [{"key": "autonodes.io/node-type", "operator": "In", "values": [type_]}],
           "disruption": {"budgets": budgets}})
}

/// Sets `spec.unschedulable` of a host node, as `kubectl cordon` does.
async fn cordon(world: &World, node: &str) {
    let nodes: Api<Node> = Api::all(world.host.clone());
    nodes
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"unschedulable": true}})),
        )
        .await
        .expect("host node cordoned");
}

/// The claim's `HostMaintenance` condition as `(status, reason)`.
fn maintenance(c: &autonodes_api::NodeClaim) -> Option<(String, String)> {
    condition(c, "HostMaintenance").map(|(s, r, _)| (s, r))
}

fn host_node(c: &autonodes_api::NodeClaim) -> Option<String> {
    c.status.as_ref()?.host_node.clone()
}

/// The VirtualMachineInstanceMigrations on the host.
async fn migrations(world: &World) -> Vec<DynamicObject> {
    let api: Api<DynamicObject> = Api::all_with(
        world.host.clone(),
        &autonodes_api::kubevirt::virtual_machine_instance_migration(),
    );
    api.list(&ListParams::default())
        .await
        .expect("list migrations")
        .items
}

/// Waits until the pool has `n` claims, all Available on host node `on`.
async fn available_on(
    world: &World,
    pool: &str,
    n: usize,
    on: &str,
) -> Vec<autonodes_api::NodeClaim> {
    common::eventually(
        &format!("{n} Available claims of {pool} on {on}"),
        WAIT,
        || async {
            let claims = pool_claims(world, pool).await;
            (claims.len() == n
                && claims
                    .iter()
                    .all(|c| available(c) && host_node(c).as_deref() == Some(on)))
            .then_some(claims)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cordoned_host_node_live_migrates_the_vms_that_can_move_and_replaces_the_one_that_cannot_before_draining_it(
) {
    let world = World::with_provider(provider()).await;
    world
        .create_pool("live", pool_spec("live", 2, json!([{"nodes": "1"}])))
        .await;
    world
        .create_pool("pinned", pool_spec("pinned", 1, json!([{"nodes": "1"}])))
        .await;
    let live = available_on(&world, "live", 2, HOST_NODE).await;
    let pinned = available_on(&world, "pinned", 1, HOST_NODE).await;
    let tenant_nodes: Api<Node> = Api::all(world.tenant.clone());
    let mut before = Vec::new();
    for c in &live {
        let name = c
            .status
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .expect("node");
        let node = tenant_nodes.get(&name).await.expect("tenant Node");
        before.push((c.name_any(), name, node.uid().expect("uid")));
    }
    let old = pinned[0].name_any();
    let old_node = pinned[0]
        .status
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .expect("node");

    cordon(&world, HOST_NODE).await;

    // The pinned node is replaced first: its old Node is cordoned (the drain starts) only
    // once the replacement is Available, on another host node.
    let replacement = common::eventually(
        "the pinned claim's replacement Available, then its old Node drained",
        WAIT,
        || async {
            let claims = pool_claims(&world, "pinned").await;
            let new = claims.iter().find(|c| c.name_any() != old).cloned();
            let old_cordoned = tenant_nodes
                .get_opt(&old_node)
                .await
                .expect("read Node")
                .is_none_or(|n| n.spec.and_then(|s| s.unschedulable) == Some(true));
            if old_cordoned {
                let new = new.expect("a replacement exists before the old node is drained");
                assert!(
                    available(&new),
                    "the old node is drained before its replacement is Available: {:?}",
                    new.status
                );
                return Some(new);
            }
            None
        },
    )
    .await;
    assert_ne!(host_node(&replacement).as_deref(), Some(HOST_NODE));
    let old_claim = world.claims().get_opt(&old).await.expect("read claim");
    if let Some(c) = &old_claim {
        assert_eq!(
            maintenance(c),
            Some(("True".into(), "HostDraining".into())),
            "{:?}",
            c.status
        );
    }
    world.wait_claim_gone(&old, WAIT).await;

    // The two live VMs moved: same claims, same tenant Nodes (same UID, never cordoned).
    for (claim, node, uid) in &before {
        let c = world
            .wait_claim(claim, "Migrated", WAIT, |c| {
                maintenance(c) == Some(("False".into(), "Migrated".into()))
            })
            .await;
        let now_on = host_node(&c).expect("hostNode");
        assert_ne!(
            now_on, HOST_NODE,
            "claim {claim} still on the cordoned node"
        );
        assert!(available(&c));
        let n = tenant_nodes.get(node).await.expect("the same Node");
        assert_eq!(
            n.uid().as_deref(),
            Some(uid.as_str()),
            "Node {node} was made again"
        );
        assert_ne!(
            n.spec.and_then(|s| s.unschedulable),
            Some(true),
            "Node {node} was cordoned"
        );
        let (_, _, message) = condition(&c, "HostMaintenance").expect("condition");
        assert!(
            message.contains(&format!("from host node {HOST_NODE} to {now_on}")),
            "{message}"
        );
    }
    assert_eq!(
        pool_claims(&world, "live").await.len(),
        2,
        "no live node was replaced"
    );
    // Each migration was deleted once it ended.
    common::eventually("no migration left", WAIT, || async {
        migrations(&world).await.is_empty().then_some(())
    })
    .await;
    assert_pool_event(&world, "pinned", "ReplacedForHostMaintenance").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_maintenance_budget_of_zero_holds_the_replacement_of_a_vm_whose_migration_failed_and_says_so(
) {
    let world = World::with_provider(provider()).await;
    world
        .create_pool(
            "live",
            pool_spec(
                "live",
                1,
                json!([{"nodes": "0", "reasons": ["HostMaintenance"]}]),
            ),
        )
        .await;
    let claims = available_on(&world, "live", 1, HOST_NODE).await;
    let old = claims[0].name_any();
    // The simulator fails this VM's migrations.
    let vm = world.vm_of(&claims[0]).await;
    let vms: Api<DynamicObject> = Api::namespaced_with(
        world.host.clone(),
        &vm.namespace().expect("namespace"),
        &autonodes_api::kubevirt::virtual_machine(),
    );
    vms.patch(
        &vm.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"annotations": {
            autonodes_testenv::simulator::MIGRATION_FAILS_ANNOTATION: "true"}}})),
    )
    .await
    .expect("VM annotated");

    cordon(&world, HOST_NODE).await;
    world
        .wait_claim(&old, "MigrationFailed", WAIT, |c| {
            maintenance(c) == Some(("True".into(), "MigrationFailed".into()))
        })
        .await;
    let pool = world
        .wait_pool("live", "HostMaintenanceHeld=True", |p| {
            p.status.as_ref().is_some_and(|s| {
                find_condition(&s.conditions, "HostMaintenanceHeld").is_some_and(
                    |(status, reason, _)| status == "True" && reason == "BudgetExhausted",
                )
            })
        })
        .await;
    let (_, _, message) = find_condition(
        &pool.status.expect("status").conditions,
        "HostMaintenanceHeld",
    )
    .expect("condition");
    assert!(message.contains(&old), "{message}");
    // Held: no replacement for a while, the node keeps serving.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let claims = pool_claims(&world, "live").await;
    assert_eq!(
        claims.len(),
        1,
        "a replacement was made under a budget of 0"
    );
    assert!(available(&claims[0]));

    // The budget opens: the node is replaced, and the condition goes.
    patch_pool_spec(
        &world,
        "live",
        json!({"disruption": {"budgets": [{"nodes": "1", "reasons": ["HostMaintenance"]}]}}),
    )
    .await;
    world.wait_claim_gone(&old, WAIT).await;
    let claims = available_on(&world, "live", 1, "kubevirt-host-zone-a").await;
    assert_ne!(claims[0].name_any(), old);
    world
        .wait_pool("live", "HostMaintenanceHeld gone", |p| {
            p.status
                .as_ref()
                .is_some_and(|s| find_condition(&s.conditions, "HostMaintenanceHeld").is_none())
        })
        .await;
}

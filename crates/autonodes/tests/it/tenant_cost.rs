//! What one tenant cluster costs the controller on real API servers (the controller as its
//! own process, so its connections can be counted): all of a tenant's watches and requests
//! share one HTTP/2 connection, and a tenant with a dynamic pool that has nothing to plan
//! watches only its pods; the Node and DaemonSet watches start with the first pod waiting
//! for a node, the token watch with the first claim.

use std::time::Duration;

use crate::common;
use crate::common::world::*;
use crate::opscommon::measure::{connections_to, server_gauge, MeteredController};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};

const WAIT: Duration = Duration::from_secs(120);

/// The claims of pool `name`.
fn managed_by_pool(name: &str) -> kube::api::ListParams {
    kube::api::ListParams::default().labels(&format!("{}={name}", autonodes_api::LABEL_NODEPOOL))
}

/// Watches open on the tenant API server, by resource (`apiserver_longrunning_gauge`).
async fn tenant_watches(world: &World, resource: &str) -> f64 {
    server_gauge(&world.tenant, "apiserver_longrunning_gauge", |l| {
        l.get("verb").map(String::as_str) == Some("WATCH")
            && l.get("resource").map(String::as_str) == Some(resource)
    })
    .await
}

/// Clusters with the provider `cost` (one type, `small`) and the simulator running.
async fn cost_world() -> World {
    let mut world = World::start_clusters(&WorldOptions {
        provider: provider_yaml(
            "cost",
            "test-kubevirt-1",
            "1",
            "1Gi",
            "      - name: small\n",
        ),
        ..WorldOptions::default()
    })
    .await;
    world
        .start_simulator(autonodes_testenv::simulator::SimMode::Normal)
        .await;
    world
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_s_watches_share_one_connection_and_an_idle_pool_watches_no_nodes_until_a_pod_waits(
) {
    let world = cost_world().await;
    let tenant_port = world.playground.tenant().expect("tenant").port;
    // What watches the tenant before the controller runs (the simulator's kubelets' view
    // of Nodes and tokens, which it opens as it starts), once it holds still.
    let (nodes_before, tokens_before, pods_before, daemonsets_before) =
        common::eventually("the simulator's watches settled", WAIT, || async {
            let read = || async {
                (
                    tenant_watches(&world, "nodes").await,
                    tenant_watches(&world, "secrets").await,
                    tenant_watches(&world, "pods").await,
                    tenant_watches(&world, "daemonsets").await,
                )
            };
            let first = read().await;
            tokio::time::sleep(Duration::from_secs(3)).await;
            let second = read().await;
            (first == second && second.0 >= 1.0 && second.1 >= 1.0).then_some(second)
        })
        .await;
    let controller = MeteredController::start(&world, 1).await;
    world
        .create_pool(
            "dynamic",
            serde_json::json!({"providerRef": "cost", "disruption": {"consolidateAfter": "Never"}}),
        )
        .await;
    world
        .wait_pool("dynamic", "Ready", |p| {
            pool_condition(p, "Ready").is_some_and(|(s, _, _)| s == "True")
        })
        .await;
    // Idle: the pool's watch of pods, on one connection; nothing watches the tenant's
    // Nodes, DaemonSets or tokens (no claim yet, nothing to plan).
    let pods = common::eventually("the tenant's pods watched", WAIT, || async {
        let pods = tenant_watches(&world, "pods").await - pods_before;
        (pods >= 1.0).then_some(pods)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let nodes = tenant_watches(&world, "nodes").await - nodes_before;
    let tokens = tenant_watches(&world, "secrets").await - tokens_before;
    let daemonsets = tenant_watches(&world, "daemonsets").await - daemonsets_before;
    assert_eq!(
        (nodes, pods, tokens, daemonsets),
        (0.0, 1.0, 0.0, 0.0),
        "watches of Nodes, pods, Secrets and DaemonSets while idle"
    );
    assert_eq!(
        connections_to(controller.pid(), tenant_port),
        1,
        "one connection to the tenant"
    );

    // A pod the scheduler gave up on: the pool plans a node, now with the tenant's Nodes.
    let pods_api: Api<Pod> = Api::namespaced(world.tenant.clone(), "default");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "waits"},
        "spec": {"containers": [{"name": "c", "image": "busybox",
                  "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]},
    }))
    .expect("a pod");
    pods_api
        .create(&PostParams::default(), &pod)
        .await
        .expect("pod created");
    pods_api
        .patch_status(
            "waits",
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"status": {"phase": "Pending", "conditions": [{
                    "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                    "message": "0/0 nodes are available",
                }]}}),
            ),
        )
        .await
        .expect("marked unschedulable");
    common::eventually("a claim of the pool", WAIT, || async {
        let listed = world
            .claims()
            .list(&managed_by_pool("dynamic"))
            .await
            .ok()?;
        (!listed.items.is_empty()).then_some(())
    })
    .await;
    let (nodes, tokens, daemonsets) = common::eventually(
        "the tenant's Nodes, tokens and DaemonSets watched",
        WAIT,
        || async {
            let nodes = tenant_watches(&world, "nodes").await - nodes_before;
            let tokens = tenant_watches(&world, "secrets").await - tokens_before;
            let daemonsets = tenant_watches(&world, "daemonsets").await - daemonsets_before;
            (nodes >= 2.0 && tokens >= 1.0 && daemonsets >= 1.0)
                .then_some((nodes, tokens, daemonsets))
        },
    )
    .await;
    assert_eq!(
        (nodes, tokens, daemonsets),
        (2.0, 1.0, 1.0),
        "the pool's and the claim's watches of Nodes, the claim's of tokens, the pool's of DaemonSets"
    );
    assert_eq!(
        connections_to(controller.pid(), tenant_port),
        1,
        "still one connection to the tenant"
    );
    drop(controller);
    world.shutdown().await;
}

/// A dynamic pool in namespace `ns` on the tenant Secret `vc-tenant` there.
async fn pool_in(world: &World, ns: &str) {
    let pool: autonodes_api::NodePool = serde_json::from_value(serde_json::json!({
        "apiVersion": "autonodes.io/v1alpha1", "kind": "NodePool",
        "metadata": {"name": "dynamic", "namespace": ns},
        "spec": {"vClusterRef": {"name": "tenant"}, "providerRef": "cost",
                 "disruption": {"consolidateAfter": "Never"}},
    }))
    .expect("a pool");
    Api::<autonodes_api::NodePool>::namespaced(world.mgmt.clone(), ns)
        .create(&PostParams::default(), &pool)
        .await
        .expect("pool created");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_whose_kubeconfigs_are_the_same_share_one_connection_and_another_identity_gets_its_own(
) {
    use autonodes_testenv::playground::put_kubeconfig_secret;
    use autonodes_testenv::testenv::client_cert_kubeconfig;
    let world = cost_world().await;
    let tenant = world.playground.tenant().expect("tenant");
    let tenant_port = tenant.port;
    let identity = |name: &str| {
        let (cert, key) = tenant
            .client_certificate(name, &["system:masters"])
            .expect("a client certificate");
        client_cert_kubeconfig("tenant", &tenant.url, &tenant.ca_pem, &cert, &key)
    };
    // One vCluster's Secret in two namespaces, and a third namespace with an identity of
    // its own on the same server.
    let shared = identity("shared-tenant");
    let own = identity("own-tenant");
    for (ns, kubeconfig) in [("same-a", &shared), ("same-b", &shared), ("own", &own)] {
        put_kubeconfig_secret(&world.mgmt, ns, "vc-tenant", "config", kubeconfig)
            .await
            .expect("the tenant's Secret");
    }
    let pods_before = tenant_watches(&world, "pods").await;
    let controller = MeteredController::start(&world, 1).await;
    // Each namespace's pool watches the tenant's pods; the two with the same kubeconfig do
    // it over one connection. One pool at a time: requests sent at once before a new
    // connection has settled on HTTP/2 may each open one, which is not what is measured.
    for (i, ns) in ["same-a", "same-b", "own"].into_iter().enumerate() {
        pool_in(&world, ns).await;
        common::eventually(&format!("{ns}'s pods watched"), WAIT, || async {
            let watched = tenant_watches(&world, "pods").await - pods_before;
            (watched >= (i + 1) as f64).then_some(())
        })
        .await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        connections_to(controller.pid(), tenant_port),
        2,
        "one connection for the two namespaces with the same kubeconfig, one for the other identity"
    );
    drop(controller);
    world.shutdown().await;
}

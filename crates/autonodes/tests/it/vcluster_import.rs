//! A vCluster's own configuration, stored as its chart stores it (Secret
//! `vc-config-<name>`, key `config.yaml`), becomes NodePools and nodes; edits, removed
//! entries and broken configurations behave as the book's vCluster chapter says.

use crate::common;

use std::time::Duration;

use autonodes::controller::config::ImportScope;
use autonodes_api::NodePool;
use autonodes_testenv::simulator::SimMode;
use common::world::*;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(180);

fn example() -> String {
    std::fs::read_to_string(common::repo().join("examples/vcluster.yaml")).expect("example")
}

/// The Secret as the vCluster chart writes it (`templates/config-secret.yaml`).
fn config_secret(release: &str, config: &str) -> Secret {
    use base64::Engine as _;
    serde_json::from_value(json!({
        "metadata": {"name": format!("vc-config-{release}"), "namespace": NS,
                     "labels": {"app": "vcluster", "release": release, "heritage": "Helm"}},
        "type": "Opaque",
        "data": {"config.yaml": base64::engine::general_purpose::STANDARD.encode(config)},
    }))
    .expect("secret")
}

async fn put_config(world: &World, release: &str, config: &str) {
    let api: Api<Secret> = Api::namespaced(world.mgmt.clone(), NS);
    let secret = config_secret(release, config);
    api.patch(
        &secret.name_any(),
        &PatchParams::apply("vcluster-chart").force(),
        &Patch::Apply(&secret),
    )
    .await
    .expect("config Secret written");
}

fn ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Waits until the pool has `n` Available claims and the tenant `n` Ready Nodes labelled
/// with the pool's `nodeLabels`.
async fn wait_nodes(world: &World, pool: &str, n: usize) {
    common::eventually(&format!("{n} Ready nodes of {pool}"), WAIT, || async {
        let claims = world
            .claims()
            .list(&ListParams::default().labels(&format!("autonodes.io/nodepool={pool}")))
            .await
            .ok()?
            .items;
        let available = claims
            .iter()
            .filter(|c| {
                c.metadata.deletion_timestamp.is_none()
                    && c.status.as_ref().and_then(|s| s.phase)
                        == Some(autonodes_api::NodeClaimPhase::Available)
            })
            .count();
        let nodes: Vec<Node> = Api::<Node>::all(world.tenant.clone())
            .list(&ListParams::default().labels("pool=fixed"))
            .await
            .ok()?
            .items;
        let ready_nodes = nodes.iter().filter(|n| ready(n)).count();
        (claims.len() == n && available == n && nodes.len() == n && ready_nodes == n).then_some(())
    })
    .await;
}

fn show(world: &World) {
    let env = &world.playground.env;
    let mgmt = world.playground.mgmt().expect("mgmt");
    println!(
        "{}",
        common::kubectl_ok(env, mgmt, &["-n", NS, "get", "npool,nclaim"])
    );
    let tenant = world.playground.tenant().expect("tenant");
    println!(
        "{}",
        common::kubectl_ok(env, tenant, &["get", "nodes", "-L", "pool"])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vcluster_config_secret_becomes_pools_and_nodes_and_follows_its_edits() {
    let mut world = World::start_clusters(&WorldOptions::default()).await;
    world.config.vcluster_import = ImportScope::Namespaces(vec![NS.to_string()]);
    world.start_simulator(SimMode::Normal).await;
    world.start_controller();
    world
        .apply_provider(
            &std::fs::read_to_string(common::repo().join("examples/nodeprovider-types.yaml"))
                .expect("types example"),
        )
        .await;

    // The chart's Secret, with the example vcluster.yaml as it is.
    put_config(&world, "tenant", &example()).await;
    let pools: Api<NodePool> = world.pools();
    common::eventually("both pools", WAIT, || async {
        let names: Vec<String> = pools
            .list(&ListParams::default().labels("autonodes.io/vcluster=tenant"))
            .await
            .ok()?
            .items
            .iter()
            .map(|p| p.name_any())
            .collect();
        (names.len() == 2).then_some(names)
    })
    .await;
    let burst = pools.get("tenant-burst").await.expect("dynamic pool");
    assert_eq!(
        burst
            .spec
            .limits
            .as_ref()
            .map(|l| l["cpu"].0.clone())
            .as_deref(),
        Some("64")
    );
    assert_eq!(
        burst
            .spec
            .disruption
            .as_ref()
            .and_then(|d| d.consolidate_after),
        Some(autonodes_api::DurationOrNever::Never)
    );
    let fixed = pools.get("tenant-fixed").await.expect("static pool");
    assert_eq!(fixed.owner_references()[0].name, "vc-config-tenant");
    wait_nodes(&world, "tenant-fixed", 2).await;
    common::eventually("VClusterConfig=True on the pool", WAIT, || async {
        let p = pools.get("tenant-fixed").await.ok()?;
        p.status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "VClusterConfig" && c.status == "True" && c.reason == "Imported")
    })
    .await;
    show(&world);

    // Editing quantity adds a node.
    put_config(
        &world,
        "tenant",
        &example().replace("quantity: 2", "quantity: 3"),
    )
    .await;
    wait_nodes(&world, "tenant-fixed", 3).await;
    show(&world);

    // A pool edited by hand is put back as the configuration says.
    pools
        .patch(
            "tenant-fixed",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .expect("hand edit");
    common::eventually("the hand edit undone", WAIT, || async {
        (pools.get("tenant-fixed").await.ok()?.spec.replicas == Some(3)).then_some(())
    })
    .await;

    // A broken configuration: a Warning Event on the Secret, the pools left as they are,
    // and another vCluster's configuration still imported meanwhile.
    put_config(&world, "tenant", "privateNodes: [not, a, map\n").await;
    let kubeconfig: Secret = Api::<Secret>::namespaced(world.mgmt.clone(), NS)
        .get("vc-tenant")
        .await
        .expect("the tenant's kubeconfig Secret");
    let mut other = kubeconfig.clone();
    other.metadata = kube::api::ObjectMeta {
        name: Some("vc-other".into()),
        namespace: Some(NS.into()),
        ..Default::default()
    };
    Api::<Secret>::namespaced(world.mgmt.clone(), NS)
        .create(&PostParams::default(), &other)
        .await
        .expect("a second vCluster's kubeconfig");
    put_config(
        &world,
        "other",
        "privateNodes:\n  enabled: true\n  autoNodes:\n  - provider: kubevirt-provider-advanced\n    static:\n    - {name: idle, quantity: 0}\n",
    )
    .await;
    common::eventually("the other vCluster's pool", WAIT, || async {
        pools.get("other-idle").await.ok()
    })
    .await;
    let events = common::eventually("the Warning Event on the Secret", WAIT, || async {
        let events = world.events_for(NS, "vc-config-tenant").await;
        events
            .iter()
            .any(|e| e.starts_with("InvalidVClusterConfig"))
            .then_some(events)
    })
    .await;
    println!("events on vc-config-tenant: {events:#?}");
    let condition = common::eventually("VClusterConfig=False on the pool", WAIT, || async {
        let p = pools.get("tenant-fixed").await.ok()?;
        let c = p
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "VClusterConfig")?;
        (c.status == "False" && c.reason == "InvalidVClusterConfig").then_some(c)
    })
    .await;
    println!(
        "tenant-fixed VClusterConfig: {} {}: {}",
        condition.status, condition.reason, condition.message
    );
    assert_eq!(
        pools.get("tenant-fixed").await.expect("kept").spec.replicas,
        Some(3)
    );
    assert!(pools.get("tenant-burst").await.is_ok(), "kept");

    // Removing the static entry removes its pool and its nodes.
    let without_static = example();
    let start = without_static.find("    static:").expect("static entry");
    let end = without_static
        .find("  - provider: kubevirt-provider-types")
        .expect("second entry");
    let config = format!("{}{}", &without_static[..start], &without_static[end..]);
    put_config(&world, "tenant", &config).await;
    common::eventually("the static pool and its nodes gone", WAIT, || async {
        let pool_gone = pools.get_opt("tenant-fixed").await.ok()?.is_none();
        let nodes = Api::<Node>::all(world.tenant.clone())
            .list(&ListParams::default().labels("pool=fixed"))
            .await
            .ok()?
            .items;
        let vms = world.vms().await;
        (pool_gone && nodes.is_empty() && vms.is_empty()).then_some(())
    })
    .await;
    assert!(
        pools.get("tenant-burst").await.is_ok(),
        "the dynamic pool stays"
    );
    show(&world);
    let events = world.events_for(NS, "vc-config-tenant").await;
    println!("events on vc-config-tenant: {events:#?}");
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("VClusterConfigImported") && e.contains("deleted tenant-fixed")),
        "{events:?}"
    );
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_join_at_the_control_plane_endpoint_the_tenant_publishes_not_at_its_kubeconfig_server(
) {
    let world = World::start(WorldOptions::default()).await;
    let url = world.playground.tenant().expect("tenant").url.clone();
    let port = url
        .rsplit_once(':')
        .map(|(_, p)| p.to_string())
        .expect("port");
    let published = format!("localhost:{port}");
    let cm: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "kubeadm-config", "namespace": "kube-system"},
        "data": {"ClusterConfiguration": format!(
            "apiVersion: kubeadm.k8s.io/v1beta3\nkind: ClusterConfiguration\ncontrolPlaneEndpoint: {published}\n")},
    }))
    .expect("configmap");
    Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(world.tenant.clone(), "kube-system")
        .create(&PostParams::default(), &cm)
        .await
        .expect("kubeadm-config");
    for (name, template) in [("via-kubeadm", "kubeadm"), ("via-vcluster", "vcluster")] {
        world
            .create_claim(json!({"metadata": {"name": name}, "spec": {
                "requirements": [{"property": "autonodes.io/node-type", "value": "standard-node"}],
                "properties": {"autonodes.io/user-data-template": template}}}))
            .await;
    }
    for name in ["via-kubeadm", "via-vcluster"] {
        let claim = world.wait_phase(name, "Available", WAIT).await;
        assert!(claim.status.and_then(|s| s.vm_name).is_some());
        let text = user_data_of(&world, name).await;
        assert!(
            text.contains(&format!("apiServerEndpoint: \"{published}\"")),
            "{name}: {text}"
        );
        assert!(
            !text.contains(&url.trim_start_matches("https://").to_string()),
            "{name}: {text}"
        );
        if name == "via-vcluster" {
            let script = text
                .lines()
                .find(|l| l.contains("/node/join"))
                .unwrap_or_default();
            println!("{name}: {script}");
            assert!(
                script.contains(&format!("https://{published}/node/join?token=")),
                "{script}"
            );
            assert!(
                script.contains("--skip-join") && script.contains("--cacert"),
                "{script}"
            );
        }
        println!("{name}: Available, joined at {published} (the kubeconfig says {url})");
    }
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vcluster_properties_give_ssh_keys_user_data_and_a_root_disk_from_an_image() {
    let world = World::start(WorldOptions {
        provider: provider_yaml(
            "imaged",
            "test-kubevirt-1",
            "2",
            "4Gi",
            concat!(
                "      - name: from-image\n",
                "        properties:\n",
                "          kubevirt.vcluster.com/image-url: docker://quay.io/containerdisks/ubuntu:22.04\n",
                "          kubevirt.vcluster.com/root-disk-size: 15Gi\n",
                "        virtualMachineTemplate:\n",
                "          spec:\n",
                "            template:\n",
                "              spec:\n",
                "                domain:\n",
                "                  resources:\n",
                "                    requests: {cpu: \"2\", memory: 4Gi}\n",
            ),
        ),
        ..WorldOptions::default()
    })
    .await;
    world
        .create_claim(json!({"metadata": {"name": "imaged"}, "spec": {
            "providerRef": "imaged",
            "properties": {
                "vcluster.com/ssh-keys": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOtest admin@example",
                "vcluster.com/user-data": "#cloud-config\nruncmd:\n- echo from-vcluster-user-data\n"}}}))
        .await;
    let claim = world.wait_phase("imaged", "Available", WAIT).await;
    let vm_name = claim.status.and_then(|s| s.vm_name).expect("vm name");
    let vm = world
        .vms()
        .await
        .into_iter()
        .find(|v| v.name_any() == vm_name)
        .expect("the VM");
    let dvt = &vm.data["spec"]["dataVolumeTemplates"][0];
    println!("stored dataVolumeTemplates[0]: {dvt}");
    assert_eq!(dvt["metadata"]["name"], format!("{vm_name}-rootdisk"));
    assert_eq!(
        dvt["spec"]["source"]["registry"]["url"],
        "docker://quay.io/containerdisks/ubuntu:22.04"
    );
    assert_eq!(
        dvt["spec"]["storage"]["resources"]["requests"]["storage"],
        "15Gi"
    );
    let volumes = vm.data["spec"]["template"]["spec"]["volumes"].to_string();
    assert!(
        volumes.contains(&format!("{vm_name}-rootdisk")),
        "{volumes}"
    );
    let text = user_data_of(&world, "imaged").await;
    assert!(
        text.contains("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOtest"),
        "{text}"
    );
    assert!(text.contains("echo from-vcluster-user-data"), "{text}");
    // The configuration properties are no node labels.
    let node = Api::<Node>::all(world.tenant.clone())
        .get(&claim_node(&world, "imaged").await)
        .await
        .expect("node");
    assert!(
        !node
            .labels()
            .keys()
            .any(|k| k.starts_with("vcluster.com/ssh") || k.starts_with("kubevirt.vcluster.com/")),
        "{:?}",
        node.labels()
    );
    world.shutdown().await;
}

/// The user data autonodes wrote for the claim `name` (its Secret on the host).
async fn user_data_of(world: &World, name: &str) -> String {
    let secret = world
        .host_secrets()
        .await
        .into_iter()
        .find(|s| s.labels().get("autonodes.io/nodeclaim").map(String::as_str) == Some(name))
        .unwrap_or_else(|| panic!("the user data of {name}"));
    secret
        .data
        .as_ref()
        .and_then(|d| d.get("userdata"))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .unwrap_or_default()
}

async fn claim_node(world: &World, name: &str) -> String {
    world
        .claims()
        .get(name)
        .await
        .expect("claim")
        .status
        .and_then(|s| s.node_name)
        .expect("node name")
}

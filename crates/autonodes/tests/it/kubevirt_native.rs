//! KubeVirt-native node type settings on real API servers (management, host, tenant, the
//! controller and the KubeVirt simulator): what a type's properties add to its VMs reaches
//! the host's API server whole, and goes away with the claim.
//!
//! The host runs our own KubeVirt and CDI CRDs, structural for every field these settings
//! write, so a field KubeVirt would not know is pruned here as it is on a real host.

use crate::common;

use std::time::Duration;

use autonodes::render::render_documents;
use autonodes_core::userdata::JoinParams;
use common::world::*;
use kube::ResourceExt;
use serde_json::{json, Value};

const AVAILABLE: Duration = Duration::from_secs(90);
const GONE: Duration = Duration::from_secs(60);

fn example() -> String {
    std::fs::read_to_string(common::repo().join("examples/nodeprovider-kubevirt-native.yaml"))
        .expect("example readable")
}

/// The VirtualMachine `autonodes render` composes for the claim as created (its UID fixes
/// the VM name), from the same provider text.
fn rendered_vm(provider: &str, claim: &autonodes_api::NodeClaim) -> Value {
    let claim_text = serde_json::to_string(&json!({
        "apiVersion": "autonodes.io/v1alpha1",
        "kind": "NodeClaim",
        "metadata": {"name": claim.name_any(), "namespace": NS, "uid": claim.uid().expect("uid"), "labels": claim.labels()},
        "spec": serde_json::to_value(&claim.spec).expect("spec"),
    }))
    .expect("claim text");
    render_documents(
        provider,
        "provider.yaml",
        &claim_text,
        "claim.yaml",
        None,
        &JoinParams::placeholder(),
    )
    .expect("renders")
    .into_iter()
    .find(|d| d["kind"] == "VirtualMachine")
    .expect("a VirtualMachine")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_disks_a_root_disk_storage_class_and_multus_networks_reach_the_host_unpruned_and_leave_with_the_claim(
) {
    let provider = example();
    let world = World::with_provider(provider.clone()).await;
    let mut claims = Vec::new();
    for (name, type_) in [
        ("storage-1", "kubevirt-native.storage-node"),
        ("isolated-1", "kubevirt-native.isolated-node"),
    ] {
        claims.push(
            world
                .create_claim(json!({"metadata": {"name": name}, "spec": {"typeRef": type_}}))
                .await,
        );
    }
    let vms_by_claim: Vec<(String, String)> = {
        let mut out = Vec::new();
        for c in &claims {
            let done = world
                .wait_phase(&c.name_any(), "Available", AVAILABLE)
                .await;
            let vm = done
                .status
                .and_then(|s| s.vm_name)
                .expect("the claim names its VM");
            out.push((c.name_any(), vm));
        }
        out
    };
    let stored = world.vms().await;
    for (claim, (name, vm_name)) in claims.iter().zip(&vms_by_claim) {
        let vm = stored
            .iter()
            .find(|v| v.name_any() == *vm_name)
            .unwrap_or_else(|| panic!("{name}: VM {vm_name} on the host"));
        let want = rendered_vm(&provider, claim);
        // Nothing pruned: the host stored the spec the controller composed, field by field.
        assert_eq!(
            vm.data["spec"], want["spec"],
            "{name}: the stored VM differs from what autonodes composes"
        );
    }

    // What the settings asked for is in that spec.
    let (_, storage_vm) = &vms_by_claim[0];
    let vm = stored
        .iter()
        .find(|v| v.name_any() == *storage_vm)
        .expect("storage VM");
    let dvts = vm.data["spec"]["dataVolumeTemplates"]
        .as_array()
        .expect("DataVolume templates");
    let dvt = |suffix: &str| {
        dvts.iter()
            .find(|d| d["metadata"]["name"] == format!("{storage_vm}-{suffix}").as_str())
            .unwrap_or_else(|| panic!("DataVolume template {storage_vm}-{suffix}: {dvts:?}"))
    };
    assert_eq!(
        dvt("rootdisk")["spec"]["storage"],
        json!({"resources": {"requests": {"storage": "30Gi"}}, "storageClassName": "fast-ssd"})
    );
    assert_eq!(dvt("data")["spec"]["source"], json!({"blank": {}}));
    assert_eq!(
        dvt("data")["spec"]["storage"],
        json!({"resources": {"requests": {"storage": "100Gi"}}})
    );
    assert_eq!(
        dvt("logs")["spec"]["storage"]["storageClassName"],
        "standard"
    );
    let tspec = &vm.data["spec"]["template"]["spec"];
    let disks = tspec["domain"]["devices"]["disks"]
        .as_array()
        .expect("disks");
    assert!(
        disks.contains(&json!({"name": "logs", "disk": {"bus": "scsi"}})),
        "{disks:?}"
    );
    assert!(tspec["volumes"]
        .as_array()
        .expect("volumes")
        .contains(&json!({"name": "data", "dataVolume": {"name": format!("{storage_vm}-data")}})));
    assert_eq!(
        tspec["networks"],
        json!([
            {"name": "default", "pod": {}},
            {"name": "multus-1", "multus": {"networkName": "storage-net"}},
            {"name": "multus-2", "multus": {"networkName": "infra/vlan-20"}},
        ])
    );
    assert_eq!(
        tspec["domain"]["devices"]["interfaces"],
        json!([
            {"name": "default", "masquerade": {}},
            {"name": "multus-1", "bridge": {}},
            {"name": "multus-2", "bridge": {}},
        ])
    );
    let (_, isolated_vm) = &vms_by_claim[1];
    let vm = stored
        .iter()
        .find(|v| v.name_any() == *isolated_vm)
        .expect("isolated VM");
    let tspec = &vm.data["spec"]["template"]["spec"];
    assert_eq!(
        tspec["networks"],
        json!([{"name": "default", "multus": {"networkName": "tenant-networks/isolated", "default": true}}])
    );
    assert_eq!(
        tspec["domain"]["devices"]["interfaces"],
        json!([{"name": "default", "bridge": {}}])
    );

    // The DataVolumes made from those templates keep the storage class and blank source.
    let dvs = world.data_volumes().await;
    let logs = dvs
        .iter()
        .find(|d| d.name_any() == format!("{storage_vm}-logs"))
        .unwrap_or_else(|| {
            panic!(
                "DataVolume {storage_vm}-logs: {:?}",
                dvs.iter().map(|d| d.name_any()).collect::<Vec<_>>()
            )
        });
    assert_eq!(
        logs.data["spec"],
        json!({"source": {"blank": {}}, "storage": {"resources": {"requests": {"storage": "10Gi"}}, "storageClassName": "standard"}})
    );

    // Deleting the claims removes the VMs and every DataVolume made for them, data disks
    // included; the provider's golden volume stays while its types use it.
    for (name, _) in &vms_by_claim {
        world.delete_claim(name).await;
    }
    for (name, _) in &vms_by_claim {
        world.wait_claim_gone(name, GONE).await;
    }
    assert!(world.vms().await.is_empty(), "VMs left behind");
    common::eventually("the claims' DataVolumes to go", GONE, || async {
        let left = world.data_volumes().await;
        (left.len() == 1 && left[0].labels().contains_key("autonodes.io/golden-image"))
            .then_some(())
    })
    .await;
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_network_or_placement_property_autonodes_cannot_use_fails_its_type_with_the_property_named_and_siblings_serve(
) {
    let types = r#"      - name: fine
        properties:
          autonodes.io/data-disks: "data:1Gi"
          autonodes.io/networks: "storage-net"
      - name: bad-size
        properties:
          autonodes.io/data-disks: "data:lots"
      - name: taken-name
        properties:
          autonodes.io/data-disks: "root:1Gi"
      - name: bad-network
        properties:
          autonodes.io/networks: "Not_A_Name"
      - name: bad-default-network
        properties:
          autonodes.io/default-network: "a/b/c"
      - name: bad-anti-affinity
        properties:
          autonodes.io/vm-anti-affinity: always
      - name: bad-host-selector
        properties:
          autonodes.io/host-node-selector: "bad key=x"
      - name: bad-class
        properties:
          kubevirt.vcluster.com/image-url: docker://quay.io/containerdisks/ubuntu:22.04
          autonodes.io/root-disk-storage-class: "Fast SSD"
        virtualMachineTemplate:
          spec:
            template:
              spec:
                domain:
                  resources:
                    requests:
                      memory: 1Gi
"#;
    let world = World::with_provider(provider_yaml(
        "native",
        "test-kubevirt-1",
        "1",
        "1Gi",
        types,
    ))
    .await;
    for (name, property) in [
        ("native.bad-size", "autonodes.io/data-disks"),
        ("native.taken-name", "autonodes.io/data-disks"),
        ("native.bad-network", "autonodes.io/networks"),
        ("native.bad-default-network", "autonodes.io/default-network"),
        ("native.bad-class", "autonodes.io/root-disk-storage-class"),
        ("native.bad-anti-affinity", "autonodes.io/vm-anti-affinity"),
        (
            "native.bad-host-selector",
            "autonodes.io/host-node-selector",
        ),
    ] {
        let ready = world.wait_type_phase(name, "Failed").await;
        assert_eq!(ready.reason, "InvalidTemplate", "{name}: {}", ready.message);
        assert!(
            ready.message.contains(property),
            "{name}: the message names {property}: {}",
            ready.message
        );
        assert!(
            ready.message.len() <= autonodes_api::conditions::MAX_MESSAGE_BYTES,
            "{name}: message unbounded"
        );
    }
    // The sibling type serves claims meanwhile.
    world
        .create_claim(json!({"metadata": {"name": "fine-1"}, "spec": {"providerRef": "native"}}))
        .await;
    let placed = world.wait_phase("fine-1", "Available", AVAILABLE).await;
    assert_eq!(
        placed.status.and_then(|s| s.type_ref).as_deref(),
        Some("native.fine")
    );
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_a_type_with_zones_spreads_least_used_first_a_requirement_pins_one_and_vm_and_node_carry_the_zone(
) {
    let types = r#"      - name: zoned
        properties:
          topology.kubernetes.io/zone: "zone-a,zone-b"
"#;
    let world =
        World::with_provider(provider_yaml("zoned", "test-kubevirt-1", "1", "1Gi", types)).await;
    // A pool of four over the type's two zones.
    world
        .create_pool("spread", json!({"providerRef": "zoned", "replicas": 4}))
        .await;
    let zone_of = |c: &autonodes_api::NodeClaim| c.status.as_ref().and_then(|s| s.zone.clone());
    let pool_claims = common::eventually(
        "four claims of the pool with a zone each",
        AVAILABLE,
        || async {
            let claims = common::pools::pool_claims(&world, "spread").await;
            (claims.len() == 4 && claims.iter().all(|c| zone_of(c).is_some())).then_some(claims)
        },
    )
    .await;
    let spread: Vec<String> = pool_claims.iter().map(|c| c.name_any()).collect();
    let mut zones: Vec<String> = pool_claims.iter().filter_map(zone_of).collect();
    zones.sort();
    assert_eq!(
        zones,
        ["zone-a", "zone-a", "zone-b", "zone-b"],
        "a pool of four over a two-zone type spreads two and two"
    );
    // A requirement pins the zone, however used it is.
    world
        .create_claim(json!({"metadata": {"name": "pinned"}, "spec": {
            "providerRef": "zoned",
            "requirements": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-b"]}],
        }}))
        .await;
    let pinned = world.wait_phase("pinned", "Available", AVAILABLE).await;
    assert_eq!(zone_of(&pinned).as_deref(), Some("zone-b"));

    // The VM requires host nodes of its zone; the tenant Node is labelled with it.
    let vm = world.vm_of(&pinned).await;
    assert_eq!(
        vm.data
            .pointer("/spec/template/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms")
            .cloned(),
        Some(json!([{"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-b"]}]}])),
        "the stored VM keeps the zone affinity"
    );
    let node = world
        .nodes()
        .await
        .into_iter()
        .find(|n| n.name_any() == vm.name_any())
        .expect("pinned Node");
    assert_eq!(
        node.labels()
            .get("topology.kubernetes.io/zone")
            .map(String::as_str),
        Some("zone-b")
    );
    for name in &spread {
        let c = world.wait_phase(name, "Available", AVAILABLE).await;
        let node_name = c
            .status
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .expect("node");
        let node = world
            .nodes()
            .await
            .into_iter()
            .find(|n| n.name_any() == node_name)
            .expect("Node");
        assert_eq!(
            node.labels().get("topology.kubernetes.io/zone"),
            zone_of(&c).as_ref(),
            "{name}: the Node's zone label is the claim's zone"
        );
    }
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_a_type_with_hard_anti_affinity_gets_vms_kept_apart_within_the_pool_on_selected_host_nodes(
) {
    let provider = example();
    let world = World::with_provider(provider.clone()).await;
    world
        .create_pool(
            "workers",
            json!({
                "providerRef": "kubevirt-native",
                "requirements": [{"key": "autonodes.io/node-type", "operator": "In", "values": ["spread-node"]}],
                "replicas": 2,
            }),
        )
        .await;
    let claims = common::eventually("two Available claims of the pool", AVAILABLE, || async {
        let claims = common::pools::pool_claims(&world, "workers").await;
        (claims.len() == 2 && claims.iter().all(common::pools::available)).then_some(claims)
    })
    .await;
    let vms = world.vms().await;
    let group = json!({
        "autonodes.io/nodeclaim-namespace": NS,
        "autonodes.io/nodepool": "workers",
        "autonodes.io/vcluster": "tenant",
    });
    for claim in &claims {
        let vm_name = claim
            .status
            .as_ref()
            .and_then(|s| s.vm_name.clone())
            .expect("vm name");
        let vm = vms
            .iter()
            .find(|v| v.name_any() == vm_name)
            .expect("the claim's VM");
        // Nothing pruned: the host stored what autonodes composes for this claim.
        assert_eq!(vm.data["spec"], rendered_vm(&provider, claim)["spec"]);
        let template = &vm.data["spec"]["template"];
        for (k, v) in group.as_object().expect("labels") {
            assert_eq!(
                &template["metadata"]["labels"][k], v,
                "launcher pod label {k}"
            );
        }
        let affinity = &template["spec"]["affinity"];
        assert_eq!(
            affinity["podAntiAffinity"],
            json!({"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": group}, "topologyKey": "kubernetes.io/hostname"},
            ]})
        );
        assert_eq!(
            affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"],
            json!({"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "node-role.kubernetes.io/kubevirt", "operator": "Exists"},
            ]}]})
        );
        assert_eq!(
            affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"],
            json!([{"weight": 100, "preference": {"matchExpressions": [
                {"key": "disktype", "operator": "In", "values": ["nvme"]},
            ]}}])
        );
    }
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_quota_keeps_claims_over_its_limits_or_of_types_it_does_not_select_pending_and_shows_use(
) {
    let types = r#"      - name: small
      - name: big
        resources:
          cpu: "4"
          memory: 8Gi
"#;
    let world =
        World::with_provider(provider_yaml("quota", "test-kubevirt-1", "1", "1Gi", types)).await;
    world
        .create_node_quota(
            "team",
            json!({
                "namespaces": [NS],
                "nodeTypeSelector": {"matchLabels": {"autonodes.io/node-type": "small"}},
                "limits": {"nodes": "2", "memory": "3Gi"},
            }),
        )
        .await;
    for name in ["q-1", "q-2"] {
        world
            .create_claim(json!({"metadata": {"name": name}, "spec": {"providerRef": "quota"}}))
            .await;
        let c = world.wait_phase(name, "Available", AVAILABLE).await;
        assert_eq!(
            c.status.and_then(|s| s.type_ref).as_deref(),
            Some("quota.small"),
            "the quota's selector leaves only the small type"
        );
    }
    // A third claim would make three nodes: it waits, saying which limit.
    world
        .create_claim(json!({"metadata": {"name": "q-3"}, "spec": {"providerRef": "quota"}}))
        .await;
    let (status, message) = wait_unscheduled(&world, "q-3", "QuotaExceeded").await;
    assert_eq!(status, "False");
    assert!(
        message.contains("NodeQuota team limits nodes to 2"),
        "{message}"
    );
    assert!(message.contains("2 used"), "{message}");
    // A claim pinned to a type the quota does not select waits too.
    world
        .create_claim(json!({"metadata": {"name": "q-big"}, "spec": {"typeRef": "quota.big"}}))
        .await;
    let (_, message) = wait_unscheduled(&world, "q-big", "QuotaExceeded").await;
    assert!(
        message.contains("does not allow node type quota.big"),
        "{message}"
    );
    // The quota shows what the namespace holds.
    let quotas: kube::Api<autonodes_api::NodeQuota> = kube::Api::all(world.mgmt.clone());
    let shown = common::eventually("the quota's use", AVAILABLE, || async {
        let q = quotas.get("team").await.ok()?;
        let status = q.status?;
        let used = status
            .namespaces
            .iter()
            .find(|n| n.namespace == NS)?
            .used
            .clone();
        (used.get("nodes").map(|q| q.0.as_str()) == Some("2")).then_some((used, status.conditions))
    })
    .await;
    assert_eq!(shown.0["memory"].0, "2Gi");
    let ready = shown.1.iter().find(|c| c.type_ == "Ready").expect("Ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("True", "Enforced")
    );
    // A node given back lets the waiting claim through.
    world.delete_claim("q-1").await;
    world.wait_claim_gone("q-1", GONE).await;
    let through = world.wait_phase("q-3", "Available", AVAILABLE).await;
    assert_eq!(
        through.status.and_then(|s| s.type_ref).as_deref(),
        Some("quota.small")
    );
    let big = world.claims().get("q-big").await.expect("q-big");
    assert_eq!(
        condition(&big, "Scheduled").map(|c| c.1).as_deref(),
        Some("QuotaExceeded"),
        "a type the quota does not select stays refused"
    );
    world.shutdown().await;
}

/// A provider whose types boot from one image, made golden or not.
fn golden_provider(golden: bool) -> String {
    format!(
        r#"
apiVersion: autonodes.io/v1alpha1
kind: NodeProvider
metadata:
  name: golden
spec:
  properties:
    kubevirt.vcluster.com/image-url: docker://quay.io/containerdisks/ubuntu:22.04
    kubevirt.vcluster.com/root-disk-size: 10Gi
    autonodes.io/golden-image: "{golden}"
  kubeVirt:
    clusterRef:
      cluster: test-kubevirt-1
      namespace: vcluster-platform
    virtualMachineTemplate:
      spec:
        template:
          spec:
            domain:
              resources:
                requests:
                  cpu: "1"
                  memory: 1Gi
    nodeTypes:
      - name: small
      - name: big
        resources:
          cpu: "2"
          memory: 2Gi
"#
    )
}

/// The golden DataVolumes on the host.
async fn golden_volumes(world: &World) -> Vec<kube::api::DynamicObject> {
    world
        .data_volumes()
        .await
        .into_iter()
        .filter(|dv| {
            dv.labels()
                .get("autonodes.io/golden-image")
                .map(String::as_str)
                == Some("golden")
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_golden_image_is_imported_once_per_provider_cloned_by_every_vm_and_removed_when_no_type_uses_it(
) {
    let world = World::with_provider(golden_provider(true)).await;
    for (name, type_) in [
        ("g-1", "golden.small"),
        ("g-2", "golden.small"),
        ("g-3", "golden.big"),
    ] {
        world
            .create_claim(json!({"metadata": {"name": name}, "spec": {"typeRef": type_}}))
            .await;
    }
    let mut vm_names = Vec::new();
    for name in ["g-1", "g-2", "g-3"] {
        let c = world.wait_phase(name, "Available", AVAILABLE).await;
        vm_names.push(c.status.and_then(|s| s.vm_name).expect("vm name"));
    }
    // One golden volume for both types (same image, same size), labelled, importing it.
    let golden = golden_volumes(&world).await;
    assert_eq!(
        golden.len(),
        1,
        "{:?}",
        golden.iter().map(|d| d.name_any()).collect::<Vec<_>>()
    );
    let golden_name = golden[0].name_any();
    assert!(
        golden_name.starts_with("autonodes-golden-"),
        "{golden_name}"
    );
    assert_eq!(
        golden[0]
            .labels()
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("autonodes")
    );
    assert_eq!(
        golden[0].data["spec"],
        json!({"source": {"registry": {"url": "docker://quay.io/containerdisks/ubuntu:22.04"}},
               "storage": {"resources": {"requests": {"storage": "10Gi"}}}})
    );
    // Every VM's root disk clones it; none imports the image itself.
    let vms = world.vms().await;
    for vm_name in &vm_names {
        let vm = vms.iter().find(|v| v.name_any() == *vm_name).expect("VM");
        let root = &vm.data["spec"]["dataVolumeTemplates"][0];
        assert_eq!(
            root["metadata"]["name"],
            format!("{vm_name}-rootdisk").as_str()
        );
        assert_eq!(
            root["spec"]["source"],
            json!({"pvc": {"namespace": "vcluster-platform", "name": golden_name}})
        );
    }
    // Golden images turned off: no type uses the volume any more, and it goes; the
    // running nodes keep their disks.
    world.apply_provider(&golden_provider(false)).await;
    common::eventually("the unused golden volume to go", GONE, || async {
        golden_volumes(&world).await.is_empty().then_some(())
    })
    .await;
    for name in ["g-1", "g-2", "g-3"] {
        world.wait_phase(name, "Available", AVAILABLE).await;
    }
    // Turned on again, then the provider deleted: its golden volume goes with it.
    world.apply_provider(&golden_provider(true)).await;
    world
        .create_claim(json!({"metadata": {"name": "g-4"}, "spec": {"typeRef": "golden.small"}}))
        .await;
    world.wait_phase("g-4", "Available", AVAILABLE).await;
    assert_eq!(golden_volumes(&world).await.len(), 1);
    for name in ["g-1", "g-2", "g-3", "g-4"] {
        world.delete_claim(name).await;
    }
    for name in ["g-1", "g-2", "g-3", "g-4"] {
        world.wait_claim_gone(name, GONE).await;
    }
    let providers: kube::Api<autonodes_api::NodeProvider> = kube::Api::all(world.mgmt.clone());
    providers
        .delete("golden", &kube::api::DeleteParams::default())
        .await
        .expect("provider deletion accepted");
    common::eventually("the provider to go", GONE, || async {
        matches!(providers.get_opt("golden").await, Ok(None)).then_some(())
    })
    .await;
    assert!(
        golden_volumes(&world).await.is_empty(),
        "the golden volume outlived its provider"
    );
    common::eventually("every DataVolume to go", GONE, || async {
        world.data_volumes().await.is_empty().then_some(())
    })
    .await;
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_type_naming_an_instancetype_schedules_and_costs_by_its_guest_resources_and_its_vm_names_it(
) {
    let types = r#"      - name: medium
        properties:
          autonodes.io/instancetype: u1.medium
          autonodes.io/preference: ubuntu
      - name: missing
        properties:
          autonodes.io/instancetype: VirtualMachineInstancetype/nowhere
      - name: both
        resources:
          cpu: "2"
        properties:
          autonodes.io/instancetype: u1.medium
"#;
    let mut world = World::start_clusters(&WorldOptions {
        provider: provider_yaml("it", "test-kubevirt-1", "1", "1Gi", types),
        ..WorldOptions::default()
    })
    .await;
    // The host's instance type, before the controller starts.
    let resource = autonodes_api::kubevirt::instancetype("VirtualMachineClusterInstancetype");
    let instancetypes: kube::Api<kube::api::DynamicObject> =
        kube::Api::all_with(world.host.clone(), &resource);
    let it: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "instancetype.kubevirt.io/v1beta1",
        "kind": "VirtualMachineClusterInstancetype",
        "metadata": {"name": "u1.medium"},
        "spec": {"cpu": {"guest": 2}, "memory": {"guest": "3Gi"}},
    }))
    .expect("instancetype");
    instancetypes
        .create(&kube::api::PostParams::default(), &it)
        .await
        .expect("instancetype created");
    world
        .start_simulator(autonodes_testenv::simulator::SimMode::Normal)
        .await;
    world.start_controller();

    // Its guest cpu and memory are the type's resources and cost (10 × 2 + 2 × 3).
    let t = world
        .wait_node_type(
            "it.medium",
            "Available with the instance type's resources",
            |t| {
                t.status.as_ref().is_some_and(|s| {
                    s.resources.contains_key("memory")
                        && s.phase.map(|p| format!("{p:?}")) == Some("Available".into())
                })
            },
        )
        .await;
    let status = t.status.expect("status");
    assert_eq!(status.resources["cpu"].0, "2");
    assert_eq!(status.resources["memory"].0, "3Gi");
    assert_eq!(status.cost, Some(26));
    // A claim asking 3Gi fits it; its VM names the instance type and sets no cpu or memory.
    world
        .create_claim(json!({"metadata": {"name": "it-1"}, "spec": {
            "providerRef": "it", "desiredCapacity": {"memory": "3Gi"},
        }}))
        .await;
    let claim = world.wait_phase("it-1", "Available", AVAILABLE).await;
    let s = claim.status.clone().expect("status");
    assert_eq!(s.type_ref.as_deref(), Some("it.medium"));
    assert_eq!(s.cost, Some(26));
    let vm = world
        .vms()
        .await
        .into_iter()
        .find(|v| Some(v.name_any()) == s.vm_name)
        .expect("VM");
    assert_eq!(
        vm.data["spec"]["instancetype"],
        json!({"kind": "VirtualMachineClusterInstancetype", "name": "u1.medium"})
    );
    assert_eq!(
        vm.data["spec"]["preference"],
        json!({"kind": "VirtualMachineClusterPreference", "name": "ubuntu"})
    );
    let domain = &vm.data["spec"]["template"]["spec"]["domain"];
    for field in ["cpu", "memory", "resources"] {
        assert!(domain.get(field).is_none(), "domain.{field} set: {domain}");
    }
    // The node has the instance type's size (the simulator sizes it as KubeVirt would).
    let node = world
        .nodes()
        .await
        .into_iter()
        .find(|n| Some(n.name_any()) == s.node_name)
        .expect("Node");
    let capacity = node.status.and_then(|st| st.capacity).expect("capacity");
    assert_eq!(capacity["cpu"].0, "2");
    assert_eq!(capacity["memory"].0, "3Gi");
    // A type whose instance type is not on the host, or that also sets cpu, is Failed.
    for (name, reason, says) in [
        (
            "it.missing",
            "InstancetypeUnavailable",
            "not found on host cluster",
        ),
        ("it.both", "InvalidTemplate", "sets cpu and memory itself"),
    ] {
        let ready = world.wait_type_phase(name, "Failed").await;
        assert_eq!(ready.reason, reason, "{name}: {}", ready.message);
        assert!(ready.message.contains(says), "{name}: {}", ready.message);
    }
    world.shutdown().await;
}

/// Waits until claim `name` is not scheduled for `reason`; its `Scheduled` status and
/// message.
async fn wait_unscheduled(world: &World, name: &str, reason: &str) -> (String, String) {
    let waiting = world
        .wait_claim(name, reason, AVAILABLE, |c| {
            condition(c, "Scheduled").is_some_and(|(_, r, _)| r == reason)
        })
        .await;
    let (status, _, message) = condition(&waiting, "Scheduled").expect("Scheduled");
    (status, message)
}

/// A pod bound to host node `node` asking `cpu` and `memory` (no kubelet runs it: bound and
/// Pending, it holds its node's room as a running one does).
async fn bind_host_pod(
    world: &World,
    name: &str,
    namespace: &str,
    labels: Value,
    node: &str,
    cpu: &str,
    memory: &str,
) {
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(world.host.clone(), namespace);
    let pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "compute", "image": "virt-launcher",
            "resources": {"requests": {"cpu": cpu, "memory": memory}}}]},
    }))
    .expect("pod");
    pods.create(&kube::api::PostParams::default(), &pod)
        .await
        .expect("pod created");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_wait_with_host_capacity_exhausted_while_no_host_node_has_room_and_go_when_room_comes_back(
) {
    let types = r#"      - name: tight
        resources:
          cpu: "2"
          memory: 4Gi
        properties:
          topology.kubernetes.io/zone: "zone-c,zone-d"
          autonodes.io/host-node-selector: "autonodes.test/rack=tight"
"#;
    let mut world = World::start_clusters(&WorldOptions {
        provider: provider_yaml("room", "test-kubevirt-1", "1", "1Gi", types),
        ..WorldOptions::default()
    })
    .await;
    // The type's VM asks 2 cpu and 4Gi, plus the default launcher overhead (100m, 256Mi):
    // zone-c's node has room for two of them, zone-d's for one beside another workload.
    let rack = [("autonodes.test/rack", "tight")];
    let size = [("cpu", "5"), ("memory", "9Gi"), ("pods", "110")];
    for (node, zone) in [("tight-c", "zone-c"), ("tight-d", "zone-d")] {
        autonodes_testenv::playground::put_host_node(&world.host, node, Some(zone), &rack, &size)
            .await
            .expect("host node");
    }
    bind_host_pod(
        &world,
        "other-workload",
        "default",
        json!({}),
        "tight-d",
        "1",
        "4Gi",
    )
    .await;
    world
        .start_simulator(autonodes_testenv::simulator::SimMode::Normal)
        .await;
    world.start_controller();

    // The NodeType shows the room: two VMs in zone-c, one in zone-d, on two host nodes.
    let t = world
        .wait_node_type("room.tight", "its host room", |t| {
            t.status
                .as_ref()
                .and_then(|s| s.host.as_ref())
                .is_some_and(|h| h.headroom == Some(3))
        })
        .await;
    let host = t.status.and_then(|s| s.host).expect("host");
    assert_eq!(host.eligible_nodes, Some(2));
    assert_eq!(
        host.zones,
        [("zone-c".to_string(), 2), ("zone-d".to_string(), 1)].into()
    );

    // The first VM runs: its launcher pod is bound in zone-c, and counted once, by its pod.
    world
        .create_claim(json!({"metadata": {"name": "r-1"}, "spec": {"typeRef": "room.tight"}}))
        .await;
    let first = world.wait_phase("r-1", "Available", AVAILABLE).await;
    let s = first.status.clone().expect("status");
    assert_eq!(s.zone.as_deref(), Some("zone-c"));
    let vm = s.vm_name.expect("VM name");
    bind_host_pod(
        &world,
        &format!("virt-launcher-{vm}-x7k2p"),
        "vcluster-platform",
        // What KubeVirt gives a launcher pod: its own labels and the VM template's.
        json!({"kubevirt.io": "virt-launcher", "vm.kubevirt.io/name": vm,
               "autonodes.io/nodeclaim-uid": first.uid().expect("uid")}),
        "tight-c",
        "2100m",
        "4352Mi",
    )
    .await;
    // Two more fit: one in each zone (zone-c would be full had the first counted twice).
    for (name, zone) in [("r-2", "zone-d"), ("r-3", "zone-c")] {
        world
            .create_claim(json!({"metadata": {"name": name}, "spec": {"typeRef": "room.tight"}}))
            .await;
        let c = world.wait_phase(name, "Available", AVAILABLE).await;
        assert_eq!(
            c.status.and_then(|s| s.zone).as_deref(),
            Some(zone),
            "{name}"
        );
    }
    // A fourth fits no host node: it waits, saying so, and no VM is made for it.
    world
        .create_claim(json!({"metadata": {"name": "r-4"}, "spec": {"typeRef": "room.tight"}}))
        .await;
    let (status, message) = wait_unscheduled(&world, "r-4", "HostCapacityExhausted").await;
    assert_eq!(status, "False");
    let host = &world.playground.provider.spec.kube_virt.cluster_ref.cluster;
    assert!(
        message.contains(&format!("node type room.tight on host cluster {host}"))
            && message.contains(
                "(2100m cpu, 4352Mi memory) fits none of 1 eligible host node(s) in zone"
            ),
        "{message}"
    );
    assert_eq!(world.vms().await.len(), 3, "no VM for the waiting claim");
    let full = world
        .wait_node_type("room.tight", "no host room", |t| {
            t.status
                .as_ref()
                .and_then(|s| s.host.as_ref())
                .is_some_and(|h| h.headroom == Some(0))
        })
        .await;
    let message = full.status.and_then(|s| s.host).and_then(|h| h.message);
    assert!(
        message
            .as_deref()
            .is_some_and(|m| m.contains("fits none of")),
        "{message:?}"
    );

    // The other workload ends: zone-d has room again, and the waiting claim goes there.
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(world.host.clone(), "default");
    // (At once: no kubelet confirms a graceful deletion.)
    let now = kube::api::DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    pods.delete("other-workload", &now)
        .await
        .expect("pod deleted");
    let through = world.wait_phase("r-4", "Available", AVAILABLE).await;
    assert_eq!(
        through.status.and_then(|s| s.zone).as_deref(),
        Some("zone-d")
    );
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_type_with_hard_anti_affinity_takes_no_more_claims_than_host_nodes_free_of_their_group() {
    let types = r#"      - name: spread
        properties:
          autonodes.io/vm-anti-affinity: hard
          autonodes.io/host-node-selector: "autonodes.test/rack=spread"
"#;
    let mut world = World::start_clusters(&WorldOptions {
        provider: provider_yaml("apart", "test-kubevirt-1", "1", "1Gi", types),
        ..WorldOptions::default()
    })
    .await;
    let rack = [("autonodes.test/rack", "spread")];
    let size = [("cpu", "64"), ("memory", "256Gi"), ("pods", "110")];
    for node in ["spread-1", "spread-2"] {
        autonodes_testenv::playground::put_host_node(&world.host, node, None, &rack, &size)
            .await
            .expect("host node");
    }
    world
        .start_simulator(autonodes_testenv::simulator::SimMode::Normal)
        .await;
    world.start_controller();

    // Room for dozens, but each VM of the tenant needs a host node of its own: two fit.
    let mut first = None;
    for name in ["s-1", "s-2"] {
        world
            .create_claim(json!({"metadata": {"name": name}, "spec": {"typeRef": "apart.spread"}}))
            .await;
        let c = world.wait_phase(name, "Available", AVAILABLE).await;
        first.get_or_insert(c);
    }
    world
        .create_claim(json!({"metadata": {"name": "s-3"}, "spec": {"typeRef": "apart.spread"}}))
        .await;
    let (_, message) = wait_unscheduled(&world, "s-3", "HostCapacityExhausted").await;
    assert!(
        message.contains("hard VM anti-affinity: 2 eligible host node(s) with room run no VM of the claim's group, and 2 of the group are on their way"),
        "{message}"
    );
    // Once s-1's launcher pod is bound, it holds its node by its labels instead.
    let first = first.expect("s-1");
    let uid = first.uid().expect("uid");
    bind_host_pod(
        &world,
        "virt-launcher-s-1",
        "vcluster-platform",
        json!({"autonodes.io/nodeclaim-uid": uid, "autonodes.io/nodeclaim-namespace": NS,
               "autonodes.io/vcluster": "tenant"}),
        "spread-1",
        "1100m",
        "1280Mi",
    )
    .await;
    common::eventually("the refusal counting s-1 by its pod", AVAILABLE, || async {
        let c = world.claims().get("s-3").await.ok()?;
        let (_, _, m) = condition(&c, "Scheduled")?;
        m.contains("1 eligible host node(s) with room run no VM of the claim's group, and 1 of the group are on their way")
            .then_some(())
    })
    .await;
    // A third host node of the rack: the third claim gets it.
    autonodes_testenv::playground::put_host_node(&world.host, "spread-3", None, &rack, &size)
        .await
        .expect("host node");
    world.wait_phase("s-3", "Available", AVAILABLE).await;
    world.shutdown().await;
}

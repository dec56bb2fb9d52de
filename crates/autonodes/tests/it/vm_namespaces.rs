//! A provider that places each tenant's VMs in a host namespace of its own
//! (`vmNamespacePerTenant`), on real API servers (management and host in one, tenant, the
//! controller and the KubeVirt simulator): two tenant namespaces' VMs land in their own
//! host namespaces, which autonodes creates and, once their claims are gone, deletes.

use std::time::Duration;

use crate::common;
use common::world::*;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, ListParams};
use kube::ResourceExt;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(120);

/// The provider `split`: one type, `node`, its VMs in `vms-<tenant namespace>`.
fn provider() -> String {
    provider_yaml(
        "split",
        "test-kubevirt-1",
        "1",
        "1Gi",
        "      - name: node\n",
    )
    .replace(
        "    nodeTypes:\n",
        "    vmNamespacePerTenant:\n      prefix: vms-\n    nodeTypes:\n",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tenants_vms_land_in_their_own_host_namespaces_and_nothing_is_left_after_deletion() {
    let world = World::start(WorldOptions {
        provider: provider(),
        orphan_sweep_interval: Duration::from_secs(2),
        ..WorldOptions::default()
    })
    .await;
    // A second tenant namespace, with the same vCluster's kubeconfig.
    let secrets: Api<Secret> = Api::namespaced(world.mgmt.clone(), NS);
    let kubeconfig = secrets.get("vc-tenant").await.expect("tenant Secret");
    let yaml = kubeconfig
        .data
        .as_ref()
        .and_then(|d| d.get(autonodes_api::TENANT_KUBECONFIG_KEY))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .expect("kubeconfig");
    autonodes_testenv::playground::put_kubeconfig_secret(
        &world.mgmt,
        "other",
        "vc-tenant",
        autonodes_api::TENANT_KUBECONFIG_KEY,
        &yaml,
    )
    .await
    .expect("second tenant");
    let other: Api<autonodes_api::NodeClaim> = Api::namespaced(world.mgmt.clone(), "other");
    for name in ["a-1", "a-2"] {
        world
            .create_claim(json!({"metadata": {"name": name}, "spec": {"typeRef": "split.node"}}))
            .await;
    }
    let b: autonodes_api::NodeClaim = serde_json::from_value(json!({
        "apiVersion": "autonodes.io/v1alpha1", "kind": "NodeClaim",
        "metadata": {"name": "b-1", "namespace": "other"},
        "spec": {"vClusterRef": {"name": "tenant"}, "typeRef": "split.node"},
    }))
    .expect("claim");
    other
        .create(&Default::default(), &b)
        .await
        .expect("claim created");
    for name in ["a-1", "a-2"] {
        let c = world.wait_phase(name, "Available", WAIT).await;
        assert_eq!(
            c.status.and_then(|s| s.vm_namespace).as_deref(),
            Some("vms-tenant")
        );
    }
    let b = common::eventually("claim b-1 Available", WAIT, || async {
        let c = other.get("b-1").await.ok()?;
        (c.status.as_ref()?.phase == Some(autonodes_api::NodeClaimPhase::Available)).then_some(c)
    })
    .await;
    assert_eq!(
        b.status.and_then(|s| s.vm_namespace).as_deref(),
        Some("vms-other")
    );
    // The VMs and their user data are there, and only there.
    let by_ns = |vms: &[kube::api::DynamicObject]| {
        let mut v: Vec<String> = vms.iter().filter_map(|vm| vm.namespace()).collect();
        v.sort();
        v
    };
    assert_eq!(
        by_ns(&world.vms().await),
        ["vms-other", "vms-tenant", "vms-tenant"]
    );
    let namespaces: Api<Namespace> = Api::all(world.host.clone());
    for ns in ["vms-tenant", "vms-other"] {
        let n = namespaces.get(ns).await.expect("namespace made");
        assert_eq!(
            n.labels()
                .get(autonodes_api::LABEL_MANAGED_BY)
                .map(String::as_str),
            Some(autonodes_api::MANAGED_BY)
        );
        let secrets: Api<Secret> = Api::namespaced(world.host.clone(), ns);
        let ours = secrets.list(&managed()).await.expect("list").items;
        assert!(!ours.is_empty(), "user data in {ns}");
    }

    // Deleted: nothing is left, the namespaces included.
    world.delete_claim("a-1").await;
    world.delete_claim("a-2").await;
    other
        .delete("b-1", &Default::default())
        .await
        .expect("deleted");
    world.wait_claim_gone("a-1", WAIT).await;
    world.wait_claim_gone("a-2", WAIT).await;
    common::eventually("nothing of autonodes left on the host", WAIT, || async {
        let vms = world.vms().await;
        let left: Vec<String> = namespaces
            .list(&ListParams::default().labels(&format!(
                "{}={}",
                autonodes_api::LABEL_MANAGED_BY,
                autonodes_api::MANAGED_BY
            )))
            .await
            .ok()?
            .items
            .into_iter()
            .filter(|n| n.metadata.deletion_timestamp.is_none())
            .map(|n| n.name_any())
            .collect();
        (vms.is_empty() && left.is_empty()).then_some(())
    })
    .await;
    world.shutdown().await;
}

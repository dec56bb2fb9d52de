//! Crash safety: the real `autonodes run` process killed (SIGKILL) right after it created a
//! claim's user-data Secret, or right after it created the VM, then restarted, ends with
//! exactly one VM, one Secret and at most one live token for the claim.

use crate::common;

use std::time::Duration;

use autonodes_testenv::playground::{put_kubeconfig_secret, SERVICE_NAMESPACE};
use autonodes_testenv::simulator::SimMode;
use autonodes_testenv::testenv::ManagedProcess;
use common::world::*;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, Patch, PatchParams};

const WAIT: Duration = Duration::from_secs(90);
/// The user the controller acts as on the host cluster in these tests.
const HOST_USER: &str = "autonodes-host";

fn spawn_controller(world: &World, n: u32) -> ManagedProcess {
    world.spawn_controller_process(n, env!("CARGO_BIN_EXE_autonodes"))
}

/// Lets the controller act on the host only as [`HOST_USER`], whose role allows creating
/// VirtualMachines only when `may_create_vms`.
async fn restrict_host(world: &World, may_create_vms: bool) {
    let mut vm_verbs = vec!["get", "list", "watch", "delete"];
    if may_create_vms {
        vm_verbs.push("create");
    }
    let role: ClusterRole = serde_json::from_value(serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": HOST_USER},
        "rules": [
            {"apiGroups": ["kubevirt.io"], "resources": ["virtualmachines"], "verbs": vm_verbs},
            {"apiGroups": ["kubevirt.io"], "resources": ["virtualmachineinstances"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["cdi.kubevirt.io"], "resources": ["datavolumes"], "verbs": ["get", "list", "watch", "delete"]},
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "watch", "create", "patch", "delete"]}
        ]
    }))
    .expect("role");
    let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": HOST_USER},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": HOST_USER},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": HOST_USER}]
    }))
    .expect("binding");
    let pp = PatchParams::apply("test").force();
    Api::<ClusterRole>::all(world.host.clone())
        .patch(HOST_USER, &pp, &Patch::Apply(&role))
        .await
        .expect("role applied");
    Api::<ClusterRoleBinding>::all(world.host.clone())
        .patch(HOST_USER, &pp, &Patch::Apply(&binding))
        .await
        .expect("binding applied");
    // The host kubeconfig Secret now authenticates as the restricted user (a client
    // certificate signed by the host's client CA).
    let host = world.playground.host().expect("host");
    let (cert, key) = host
        .client_certificate(HOST_USER, &[])
        .expect("client certificate");
    let restricted = autonodes_testenv::testenv::client_cert_kubeconfig(
        "host",
        &host.url,
        &host.ca_pem,
        &cert,
        &key,
    );
    put_kubeconfig_secret(
        &world.mgmt,
        SERVICE_NAMESPACE,
        "test-kubevirt-1",
        "kubeconfig",
        &restricted,
    )
    .await
    .expect("host Secret updated");
}

async fn assert_exactly_one_of_each(world: &World) {
    let vms = world.vms().await;
    assert_eq!(
        vms.len(),
        1,
        "VMs: {:?}",
        vms.iter()
            .map(|v| v.metadata.name.clone())
            .collect::<Vec<_>>()
    );
    let secrets = world.host_secrets().await;
    assert_eq!(
        secrets.len(),
        1,
        "Secrets: {:?}",
        secrets
            .iter()
            .map(|s| s.metadata.name.clone())
            .collect::<Vec<_>>()
    );
    assert!(world.tokens().await.len() <= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_killed_right_after_creating_the_secret_ends_with_one_vm_and_one_secret() {
    // The host identity is restricted through its kubeconfig Secret: a host of its own.
    let mut world = World::start_clusters(&WorldOptions {
        separate_host: true,
        ..WorldOptions::default()
    })
    .await;
    restrict_host(&world, false).await;
    let mut first = spawn_controller(&world, 1);
    world.claim_type("crash", "standard-node").await;
    // The Secret is created; creating the VM is forbidden, so the process is stuck right after.
    let c = world
        .wait_claim("crash", "the VM creation to be refused", WAIT, |c| {
            condition(c, "Provisioned").is_some_and(|x| x.1 == "HostForbidden")
        })
        .await;
    let vm = c
        .status
        .and_then(|s| s.vm_name)
        .expect("vm name stored before anything remote");
    first.kill();
    assert_eq!(
        world.host_secrets().await.len(),
        1,
        "the Secret was written before the VM"
    );
    assert!(world.vms().await.is_empty());
    assert_eq!(world.tokens().await.len(), 1);

    restrict_host(&world, true).await;
    world.start_simulator(SimMode::Normal).await;
    let _second = spawn_controller(&world, 2);
    let c = world.wait_phase("crash", "Available", WAIT).await;
    assert_eq!(
        c.status.and_then(|s| s.vm_name).as_deref(),
        Some(vm.as_str()),
        "the VM name is fixed"
    );
    assert_exactly_one_of_each(&world).await;
    assert!(
        world.tokens().await.is_empty(),
        "the token is gone after the join"
    );
    assert_eq!(world.nodes().await.len(), 1);
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_killed_right_after_creating_the_vm_ends_with_one_vm_and_one_secret() {
    // The host identity is restricted through its kubeconfig Secret: a host of its own.
    let mut world = World::start_clusters(&WorldOptions {
        separate_host: true,
        ..WorldOptions::default()
    })
    .await;
    let mut first = spawn_controller(&world, 1);
    world.claim_type("crash", "standard-node").await;
    // No simulator yet: the VM is created and never boots; kill the process as soon as the
    // VM exists.
    common::eventually("the VM to be created", WAIT, || async {
        (!world.vms().await.is_empty()).then_some(())
    })
    .await;
    first.kill();
    assert_exactly_one_of_each(&world).await;

    world.start_simulator(SimMode::Normal).await;
    let _second = spawn_controller(&world, 2);
    world.wait_phase("crash", "Available", WAIT).await;
    assert_exactly_one_of_each(&world).await;
    assert!(world.tokens().await.is_empty());
    assert_eq!(world.nodes().await.len(), 1);

    // And deletion still cleans up everything after the restart.
    world.delete_claim("crash").await;
    world.wait_claim_gone("crash", WAIT).await;
    assert!(world.vms().await.is_empty() && world.host_secrets().await.is_empty());
    assert!(world.nodes().await.is_empty());
    world.shutdown().await;
}

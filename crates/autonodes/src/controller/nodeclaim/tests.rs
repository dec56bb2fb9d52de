//! The stages of a claim's life on a host and a tenant held in memory
//! ([`crate::remote::memory`]): what each stage creates, waits for, decides and removes,
//! and what it does when a cluster answers 409, 404, 403 or 422, does not answer, or loses
//! the VM. No API server runs here; the integration tests run the same stages against real
//! ones.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;

use super::context::ClaimContext;
use super::provisioning::{Provisioning, StageContext, Step};
use super::status::{StatusWriter, JOINED, PROVISIONED, READY};
use super::terminate::{remove_from, RemoteNames, Removal};
use super::tokens::ensure_token;
use crate::controller::config::ControllerConfig;
use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::remote::memory::{Failure, MemoryHost, MemoryTenant};
use autonodes_api::reasons::ClaimReason;
use autonodes_api::{conditions, NodeClaim, NodeProvider};
use autonodes_core::catalogue::{Catalogue, PreparedType};

const NS: &str = "tenant";
const UID: &str = "claim-uid-1";
const VM: &str = "tenant-claim-1";
const VM_NS: &str = "vcluster-platform";
const HOST: &str = "test-kubevirt-1";

/// The minimal example provider's first type.
fn node_type() -> PreparedType {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/nodeprovider-minimal.yaml");
    let text = std::fs::read_to_string(path).expect("the example exists");
    let provider: NodeProvider = autonodes_core::yaml::from_str(&text).expect("it parses");
    let catalogue = Catalogue::from_provider(&provider);
    catalogue.types().first().expect("a type").clone()
}

/// A claim scheduled to `t` `scheduled_ago` ago, with `conditions` besides `Scheduled`.
fn claim(t: &PreparedType, scheduled_ago: Duration, conditions: serde_json::Value) -> NodeClaim {
    let at = |ago: Duration| {
        let t = k8s_openapi::jiff::Timestamp::now()
            - k8s_openapi::jiff::SignedDuration::from_secs(ago.as_secs() as i64);
        t.to_string()
    };
    let mut all = vec![
        serde_json::json!({"type": "Scheduled", "status": "True", "reason": "Scheduled",
        "message": "m", "lastTransitionTime": at(scheduled_ago)}),
    ];
    all.extend(conditions.as_array().cloned().unwrap_or_default());
    serde_json::from_value(serde_json::json!({
        "apiVersion": "autonodes.io/v1alpha1", "kind": "NodeClaim",
        "metadata": {"name": "claim-1", "namespace": NS, "uid": UID, "resourceVersion": "1"},
        "spec": {"vClusterRef": {"name": "vc"}},
        "status": {"typeRef": t.name, "vmName": VM, "vmNamespace": VM_NS, "hostCluster": HOST,
                   "conditions": all},
    }))
    .expect("a claim")
}

/// A claim context, the example type, an empty host and an empty tenant on 1.31.
fn setup() -> (ClaimContext, PreparedType, MemoryHost, MemoryTenant) {
    (
        ClaimContext::new(Context::for_unit_tests(ControllerConfig::default())),
        node_type(),
        MemoryHost::new(HOST),
        MemoryTenant::new(NS, "vc", "v1.31.2"),
    )
}

/// The names of the example claim's remote objects.
fn names() -> RemoteNames {
    RemoteNames {
        uid: UID.into(),
        vm_ns: VM_NS.into(),
        vm_name: VM.into(),
        node_name: VM.into(),
    }
}

/// The condition list of a claim whose VM ran (long ago).
fn provisioned() -> serde_json::Value {
    serde_json::json!([{"type": "Provisioned", "status": "True", "reason": "Running",
        "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}])
}

/// Runs the stages once on `claim`; returns the step and the claim's new status.
async fn walk_once(
    ctx: &ClaimContext,
    claim: &NodeClaim,
    t: &PreparedType,
    host: &MemoryHost,
    tenant: &MemoryTenant,
) -> (Result<Step, Error>, autonodes_api::NodeClaimStatus) {
    let mut p = provisioning(ctx, claim, t, host, tenant);
    let step = super::walk(&mut p).await;
    (step, p.status.new.clone())
}

/// One reconcile of `claim` on the memory host and tenant.
fn provisioning<'a>(
    ctx: &'a ClaimContext,
    claim: &'a NodeClaim,
    t: &'a PreparedType,
    host: &'a MemoryHost,
    tenant: &'a MemoryTenant,
) -> Provisioning<'a, &'a MemoryHost, &'a MemoryTenant> {
    Provisioning {
        claim,
        ctx: StageContext::of(ctx),
        node_type: t,
        tenant,
        host,
        host_cluster: HOST.into(),
        vm_ns: VM_NS.into(),
        vm_name: VM.into(),
        status: StatusWriter::new(claim, ctx),
        node: None,
        soon: None,
    }
}

/// `claim` with the status a walk left.
fn with_status(claim: &NodeClaim, status: autonodes_api::NodeClaimStatus) -> NodeClaim {
    let mut c = claim.clone();
    c.status = Some(status);
    c
}

fn condition(
    s: &autonodes_api::NodeClaimStatus,
    c: autonodes_api::reasons::ClaimCondition,
) -> (&str, &str) {
    let found = conditions::get(&s.conditions, c).expect("the condition is set");
    (found.status.as_str(), found.reason.as_str())
}

/// The Node the VM's kubelet registers: `ready`, with the registration taint.
fn node(ready: bool) -> Node {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": VM, "labels": {}},
        "spec": {"providerID": format!("kubevirt://{VM}"),
                 "taints": [{"key": "autonodes.io/unregistered", "effect": "NoExecute"}]},
        "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]},
    }))
    .expect("a Node")
}

#[tokio::test]
async fn launch_creates_the_token_the_user_data_and_the_vm_then_waits_for_the_vm_to_run() {
    let (ctx, t, host, tenant) = setup();
    let c = claim(&t, Duration::from_secs(5), serde_json::json!([]));
    let (step, status) = walk_once(&ctx, &c, &t, &host, &tenant).await;
    assert!(matches!(step, Ok(Step::Stop(_))), "{step:?}");
    assert_eq!(condition(&status, PROVISIONED), ("False", "Booting"));
    assert_eq!(host.vms.lock().unwrap().len(), 1, "one VM");
    let secrets = host.secrets.lock().unwrap();
    let secret = secrets.values().next().expect("the user-data Secret");
    assert!(secret.labels().get(autonodes_api::LABEL_NODECLAIM_UID) == Some(&UID.to_string()));
    assert_eq!(
        tenant.tokens.lock().unwrap().len(),
        1,
        "one bootstrap token"
    );
}

#[tokio::test]
async fn a_claim_walks_from_a_running_vm_to_a_joined_and_ready_node_and_its_token_goes() {
    let (ctx, t, host, tenant) = setup();
    let c = claim(&t, Duration::from_secs(5), serde_json::json!([]));
    let (_, status) = walk_once(&ctx, &c, &t, &host, &tenant).await;
    host.run_vm(VM_NS, VM, "10.0.0.7");
    let c = with_status(&c, status);
    let (step, status) = walk_once(&ctx, &c, &t, &host, &tenant).await;
    assert!(matches!(step, Ok(Step::Stop(_))), "{step:?}");
    assert_eq!(condition(&status, PROVISIONED), ("True", "Running"));
    assert_eq!(condition(&status, JOINED), ("False", "WaitingForNode"));

    tenant.nodes.lock().unwrap().insert(VM.into(), node(false));
    let c = with_status(&c, status);
    let (_, status) = walk_once(&ctx, &c, &t, &host, &tenant).await;
    assert_eq!(condition(&status, JOINED), ("True", "NodeJoined"));
    assert!(
        tenant.tokens.lock().unwrap().is_empty(),
        "the token is deleted once joined"
    );
    let taints = {
        let nodes = tenant.nodes.lock().unwrap();
        nodes[VM]
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default()
    };
    assert!(
        taints.iter().all(|t| t.key != "autonodes.io/unregistered"),
        "the registration taint is removed: {taints:?}"
    );

    tenant.nodes.lock().unwrap().insert(VM.into(), node(true));
    let c = with_status(&c, status);
    let (_, status) = walk_once(&ctx, &c, &t, &host, &tenant).await;
    assert_eq!(condition(&status, READY), ("True", "NodeReady"));
}

#[tokio::test]
async fn a_vm_of_that_name_belonging_to_another_claim_is_left_alone_as_name_taken() {
    let (ctx, t, host, tenant) = setup();
    let other = [(
        autonodes_api::LABEL_NODECLAIM_UID.to_string(),
        "other".to_string(),
    )];
    host.put_vm(VM_NS, VM, other.into_iter().collect());
    let c = claim(&t, Duration::from_secs(5), serde_json::json!([]));
    let (step, status) = walk_once(&ctx, &c, &t, &host, &tenant).await;
    assert!(matches!(step, Ok(Step::Stop(_))), "{step:?}");
    assert_eq!(condition(&status, PROVISIONED), ("False", "NameTaken"));
    let vms = host.vms.lock().unwrap();
    assert_eq!(vms.len(), 1);
    assert!(vms
        .values()
        .all(|vm| vm.labels()[autonodes_api::LABEL_NODECLAIM_UID] == "other"));
}

#[tokio::test]
async fn a_create_that_conflicts_with_this_claims_own_vm_keeps_it_and_one_whose_vm_vanished_looks_again(
) {
    let (ctx, t, host, tenant) = setup();
    let c = claim(&t, Duration::from_secs(5), serde_json::json!([]));
    host.fail_next("create_vm", Failure::Vanish);
    let (step, _) = walk_once(&ctx, &c, &t, &host, &tenant).await;
    let Ok(Step::Stop(action)) = step else {
        panic!("{step:?}")
    };
    assert_eq!(
        action,
        kube::runtime::controller::Action::requeue(Duration::from_secs(1))
    );
    assert!(host.vms.lock().unwrap().is_empty(), "nothing was made");
    // The next attempt creates it; the one after finds its own VM (a 409) and keeps it.
    walk_once(&ctx, &c, &t, &host, &tenant)
        .await
        .0
        .expect("a step");
    let first = host
        .vms
        .lock()
        .unwrap()
        .values()
        .next()
        .cloned()
        .expect("a VM");
    host.vms.lock().unwrap().clear();
    host.vms
        .lock()
        .unwrap()
        .insert((VM_NS.into(), VM.into()), first.clone());
    walk_once(&ctx, &c, &t, &host, &tenant)
        .await
        .0
        .expect("a step");
    let vms = host.vms.lock().unwrap();
    assert_eq!(vms.len(), 1);
    assert_eq!(
        vms.values().next().and_then(|v| v.metadata.uid.clone()),
        first.metadata.uid
    );
}

#[tokio::test]
async fn a_vm_the_host_refuses_with_422_stops_with_virtual_machine_rejected() {
    let (ctx, t, host, tenant) = setup();
    host.fail_next("create_vm", Failure::Status(422));
    let c = claim(&t, Duration::from_secs(5), serde_json::json!([]));
    let (step, status) = walk_once(&ctx, &c, &t, &host, &tenant).await;
    assert!(matches!(step, Ok(Step::Stop(_))), "{step:?}");
    assert_eq!(
        condition(&status, PROVISIONED),
        ("False", "VirtualMachineRejected")
    );
}

#[tokio::test]
async fn a_vm_that_vanishes_after_it_ran_fails_the_claim_as_virtual_machine_lost() {
    let (ctx, t, host, tenant) = setup();
    let c = claim(&t, Duration::from_secs(60), provisioned());
    let (step, _) = walk_once(&ctx, &c, &t, &host, &tenant).await;
    let Ok(Step::Fail { reason, .. }) = step else {
        panic!("{step:?}")
    };
    assert_eq!(reason, ClaimReason::VirtualMachineLost);
}

#[tokio::test]
async fn a_vm_that_does_not_run_within_the_launch_timeout_fails_the_claim() {
    let (ctx, t, host, tenant) = setup();
    let c = claim(&t, Duration::from_secs(3600), serde_json::json!([]));
    let (step, _) = walk_once(&ctx, &c, &t, &host, &tenant).await;
    let Ok(Step::Fail { reason, message }) = step else {
        panic!("{step:?}")
    };
    assert_eq!(reason, ClaimReason::LaunchTimeout);
    assert!(message.contains("did not run within 600s"), "{message}");
}

#[tokio::test]
async fn a_node_that_never_registers_fails_the_claim_after_the_registration_timeout() {
    let (ctx, t, host, tenant) = setup();
    let c = claim(&t, Duration::from_secs(7200), provisioned());
    host.put_vm(
        VM_NS,
        VM,
        [(
            autonodes_api::LABEL_NODECLAIM_UID.to_string(),
            UID.to_string(),
        )]
        .into(),
    );
    host.run_vm(VM_NS, VM, "10.0.0.7");
    let (step, _) = walk_once(&ctx, &c, &t, &host, &tenant).await;
    let Ok(Step::Fail { reason, .. }) = step else {
        panic!("{step:?}")
    };
    assert_eq!(reason, ClaimReason::RegistrationTimeout);
}

#[tokio::test]
async fn a_host_that_does_not_answer_or_refuses_stops_the_walk_with_the_clusters_reason() {
    let (ctx, t, host, tenant) = setup();
    let c = claim(&t, Duration::from_secs(5), serde_json::json!([]));
    host.fail_next("vm", Failure::Timeout);
    let (step, _) = walk_once(&ctx, &c, &t, &host, &tenant).await;
    let err = step.expect_err("the host did not answer");
    assert_eq!(err.cluster_reason(), Some(ClaimReason::HostUnreachable));
    host.fail_next("vm", Failure::Status(403));
    let err = walk_once(&ctx, &c, &t, &host, &tenant)
        .await
        .0
        .expect_err("refused");
    assert_eq!(err.cluster_reason(), Some(ClaimReason::HostForbidden));
    assert!(host.vms.lock().unwrap().is_empty(), "nothing was created");
}

#[tokio::test]
async fn a_tenant_that_refuses_the_token_stops_the_launch_before_anything_is_made_on_the_host() {
    let (ctx, t, host, tenant) = setup();
    tenant.fail_next("create_token", Failure::Status(403));
    let c = claim(&t, Duration::from_secs(5), serde_json::json!([]));
    let err = walk_once(&ctx, &c, &t, &host, &tenant)
        .await
        .0
        .expect_err("refused");
    assert_eq!(err.cluster_reason(), Some(ClaimReason::TenantForbidden));
    assert!(host.secrets.lock().unwrap().is_empty() && host.vms.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_tenant_too_old_to_join_stops_the_launch_with_unsupported_tenant_version() {
    let (ctx, t, host, _) = setup();
    let tenant = MemoryTenant::new(NS, "vc", "v1.12.0");
    let c = claim(&t, Duration::from_secs(5), serde_json::json!([]));
    let (step, status) = walk_once(&ctx, &c, &t, &host, &tenant).await;
    assert!(matches!(step, Ok(Step::Stop(_))), "{step:?}");
    assert_eq!(
        condition(&status, PROVISIONED).1,
        "UnsupportedTenantVersion"
    );
    assert!(host.vms.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_live_token_is_reused_and_a_stale_one_is_replaced_by_a_fresh_one() {
    let (ctx, t, _, tenant) = setup();
    let c = claim(&t, Duration::from_secs(5), serde_json::json!([]));
    let first = ensure_token(&c, &ctx.config, &tenant)
        .await
        .expect("a token");
    assert!(first.fresh);
    let again = ensure_token(&c, &ctx.config, &tenant)
        .await
        .expect("the same token");
    assert!(!again.fresh);
    assert_eq!(again.token.token(), first.token.token());
    // Expire it: the next call deletes it and mints another.
    for s in tenant.tokens.lock().unwrap().values_mut() {
        let data = s.data.get_or_insert_with(Default::default);
        data.insert(
            "expiration".into(),
            k8s_openapi::ByteString(b"2020-01-01T00:00:00Z".to_vec()),
        );
    }
    let fresh = ensure_token(&c, &ctx.config, &tenant)
        .await
        .expect("a new token");
    assert!(fresh.fresh);
    assert_ne!(fresh.token.token(), first.token.token());
    assert_eq!(
        tenant.tokens.lock().unwrap().len(),
        1,
        "the stale one is gone"
    );
}

#[tokio::test]
async fn removal_drains_deletes_the_vm_and_waits_then_removes_the_secret_volumes_node_and_token() {
    let (ctx, t, host, tenant) = setup();
    let c = claim(&t, Duration::from_secs(5), serde_json::json!([]));
    walk_once(&ctx, &c, &t, &host, &tenant)
        .await
        .0
        .expect("launched");
    host.data_volumes.lock().unwrap().insert(
        (VM_NS.into(), format!("{VM}-root")),
        [(
            autonodes_api::LABEL_NODECLAIM_UID.to_string(),
            UID.to_string(),
        )]
        .into(),
    );
    tenant.nodes.lock().unwrap().insert(VM.into(), node(true));
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "default", "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "rs", "controller": true}]},
        "spec": {"nodeName": VM, "containers": [{"name": "c", "image": "i"}]},
    }))
    .expect("a pod");
    tenant
        .pods
        .lock()
        .unwrap()
        .insert(("default".into(), "web".into()), pod);
    let names = names();
    let first = remove_from(&c, &ctx, true, false, &names, &host, Some(&tenant))
        .await
        .expect("a step");
    assert!(
        matches!(first, Removal::Waiting(_)),
        "the drain comes first"
    );
    let cordoned = {
        let nodes = tenant.nodes.lock().unwrap();
        nodes[VM].spec.as_ref().and_then(|s| s.unschedulable)
    };
    assert_eq!(cordoned, Some(true), "cordoned");
    assert!(tenant.pods.lock().unwrap().is_empty(), "the pod is evicted");
    let mut rounds = 0;
    loop {
        rounds += 1;
        assert!(rounds < 5, "removal never finished");
        match remove_from(&c, &ctx, true, false, &names, &host, Some(&tenant)).await {
            Ok(Removal::Done) => break,
            Ok(Removal::Waiting(_)) => continue,
            Ok(Removal::Kept(why, _)) => panic!("nothing was to be kept: {why}"),
            Err(e) => panic!("{e}"),
        }
    }
    assert!(host.vms.lock().unwrap().is_empty(), "the VM is gone");
    assert!(
        host.secrets.lock().unwrap().is_empty(),
        "the user-data Secret is gone"
    );
    assert!(
        host.data_volumes.lock().unwrap().is_empty(),
        "the DataVolumes are gone"
    );
    assert!(tenant.nodes.lock().unwrap().is_empty(), "the Node is gone");
    assert!(
        tenant.tokens.lock().unwrap().is_empty(),
        "the token is gone"
    );
}

#[tokio::test]
async fn a_removal_that_cannot_reach_the_tenant_keeps_everything_and_says_so() {
    let (ctx, t, host, tenant) = setup();
    let c = claim(&t, Duration::from_secs(5), serde_json::json!([]));
    walk_once(&ctx, &c, &t, &host, &tenant)
        .await
        .0
        .expect("launched");
    tenant.nodes.lock().unwrap().insert(VM.into(), node(true));
    tenant.fail_next("node", Failure::Status(500));
    let names = names();
    let err = remove_from(&c, &ctx, true, false, &names, &host, Some(&tenant))
        .await
        .err()
        .expect("the tenant error stops the removal within the grace time");
    assert_eq!(err.cluster_reason(), Some(ClaimReason::TenantUnreachable));
    assert_eq!(
        host.vms.lock().unwrap().len(),
        1,
        "the VM stays until the drain"
    );
    // Once the tenant answers (the Node gone already), the VM is deleted.
    tenant.nodes.lock().unwrap().clear();
    let step = remove_from(&c, &ctx, true, false, &names, &host, Some(&tenant)).await;
    assert!(
        matches!(step, Ok(Removal::Waiting(_))),
        "the VM is deleted now"
    );
    assert!(host.vms.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_vm_on_a_cordoned_host_node_is_live_migrated_and_its_claim_says_where_it_went() {
    let (ctx, t, host, tenant) = setup();
    let c = claim(&t, Duration::from_secs(5), serde_json::json!([]));
    let (_, status) = walk_once(&ctx, &c, &t, &host, &tenant).await;
    host.run_vm(VM_NS, VM, "10.0.0.7");
    let set_vmi = |status: serde_json::Value| {
        let vmi = serde_json::from_value(serde_json::json!({
            "metadata": {"name": VM, "namespace": VM_NS},
            "spec": {"evictionStrategy": "LiveMigrate"},
            "status": status,
        }))
        .expect("a VMI");
        host.vmis
            .lock()
            .unwrap()
            .insert((VM_NS.to_string(), VM.to_string()), vmi);
    };
    let migratable = serde_json::json!([{"type": "LiveMigratable", "status": "True"}]);
    set_vmi(
        serde_json::json!({"phase": "Running", "nodeName": "host-0", "conditions": migratable}),
    );
    let c = with_status(&c, status);
    let (_, status) = walk_once(&ctx, &c, &t, &host, &tenant).await;
    assert_eq!(status.host_node.as_deref(), Some("host-0"));
    assert!(conditions::get(&status.conditions, "HostMaintenance").is_none());

    // The host node is cordoned: a migration is asked for, the node keeps serving.
    host.cordoned.lock().unwrap().insert("host-0".into());
    let c = with_status(&c, status);
    let (_, status) = walk_once(&ctx, &c, &t, &host, &tenant).await;
    let hm = autonodes_api::reasons::ClaimCondition::HostMaintenance;
    assert_eq!(condition(&status, hm), ("True", "Migrating"));
    let asked: Vec<_> = host.migrations.lock().unwrap().values().cloned().collect();
    assert_eq!(asked, vec![VM.to_string()]);

    // KubeVirt moved it: the claim says from where to where, and the migration goes.
    set_vmi(
        serde_json::json!({"phase": "Running", "nodeName": "host-1", "conditions": migratable,
        "migrationState": {"sourceNode": "host-0", "targetNode": "host-1", "completed": true}}),
    );
    let c = with_status(&c, status);
    let (_, status) = walk_once(&ctx, &c, &t, &host, &tenant).await;
    assert_eq!(condition(&status, hm), ("False", "Migrated"));
    assert_eq!(status.host_node.as_deref(), Some("host-1"));
    assert!(host.migrations.lock().unwrap().is_empty());
    let message = &conditions::get(&status.conditions, hm)
        .expect("kept")
        .message;
    assert!(
        message.contains("from host node host-0 to host-1"),
        "{message}"
    );
}

#[tokio::test]
async fn a_vm_that_cannot_migrate_off_a_cordoned_host_node_asks_its_pool_for_a_replacement_and_a_refused_migration_too(
) {
    let (ctx, t, host, tenant) = setup();
    let c = claim(&t, Duration::from_secs(5), serde_json::json!([]));
    let (_, status) = walk_once(&ctx, &c, &t, &host, &tenant).await;
    host.run_vm(VM_NS, VM, "10.0.0.7");
    let vmi = |strategy: &str| {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": VM, "namespace": VM_NS},
            "spec": {"evictionStrategy": strategy},
            "status": {"phase": "Running", "nodeName": "host-0",
                       "conditions": [{"type": "LiveMigratable", "status": "True"}]},
        }))
        .expect("a VMI")
    };
    let key = (VM_NS.to_string(), VM.to_string());
    host.vmis.lock().unwrap().insert(key.clone(), vmi("None"));
    host.cordoned.lock().unwrap().insert("host-0".into());
    let hm = autonodes_api::reasons::ClaimCondition::HostMaintenance;
    let c = with_status(&c, status);
    let (_, after) = walk_once(&ctx, &c, &t, &host, &tenant).await;
    assert_eq!(condition(&after, hm), ("True", "HostDraining"));
    assert!(host.migrations.lock().unwrap().is_empty());

    // A migratable VM whose migration the host refuses (no rights to ask) is replaced too.
    host.vmis.lock().unwrap().insert(key, vmi("LiveMigrate"));
    host.fail_next("migrate", Failure::Status(403));
    let (_, after) = walk_once(&ctx, &c, &t, &host, &tenant).await;
    assert_eq!(condition(&after, hm), ("True", "HostDraining"));
    let message = &conditions::get(&after.conditions, hm).expect("set").message;
    assert!(
        message.contains("asking KubeVirt to migrate it failed"),
        "{message}"
    );
}

/// Runs the power-off step once on `claim`; returns the step and the claim's new status.
async fn power_off_once(
    ctx: &ClaimContext,
    claim: &NodeClaim,
    t: &PreparedType,
    host: &MemoryHost,
    tenant: &MemoryTenant,
) -> (Result<Step, Error>, autonodes_api::NodeClaimStatus) {
    let mut p = provisioning(ctx, claim, t, host, tenant);
    let step = super::power::power_off(&mut p, ctx).await;
    (step, p.status.new.clone())
}

#[tokio::test]
async fn a_claim_powered_off_keeps_its_node_cordoned_and_its_vm_stopped_and_powered_on_runs_again()
{
    let (ctx, t, host, tenant) = setup();
    // An Available claim: VM running, Node joined and Ready.
    let c = claim(&t, Duration::from_secs(5), serde_json::json!([]));
    let (_, status) = walk_once(&ctx, &c, &t, &host, &tenant).await;
    host.run_vm(VM_NS, VM, "10.0.0.7");
    tenant.nodes.lock().unwrap().insert(VM.into(), node(true));
    let mut c = with_status(&c, status);
    for _ in 0..3 {
        let (_, status) = walk_once(&ctx, &c, &t, &host, &tenant).await;
        c = with_status(&c, status);
    }
    assert_eq!(
        condition(c.status.as_ref().unwrap(), READY),
        ("True", "NodeReady")
    );
    assert_eq!(
        c.status.as_ref().and_then(|s| s.power),
        Some(autonodes_api::PowerState::On)
    );

    // Off: the Node is cordoned and kept, the VM halted, the claim says so.
    c.spec.power = Some(autonodes_api::Power::Off);
    let (step, status) = power_off_once(&ctx, &c, &t, &host, &tenant).await;
    assert!(matches!(step, Ok(Step::Stop(_))), "{step:?}");
    let cordoned = |tenant: &MemoryTenant| {
        tenant.nodes.lock().unwrap()[VM]
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            == Some(true)
    };
    assert!(cordoned(&tenant));
    assert!(
        host.vmis.lock().unwrap().is_empty(),
        "the VM's instance is gone"
    );
    assert_eq!(host.vms.lock().unwrap().len(), 1, "the VM is kept");
    assert_eq!(condition(&status, READY), ("False", "PoweredOff"));
    assert_eq!(status.power, Some(autonodes_api::PowerState::Off));
    assert_eq!(tenant.nodes.lock().unwrap().len(), 1, "the Node is kept");

    // On again while the tenant still reports the Node Ready (its kubelet's last word,
    // before the node lifecycle controller marks it Unknown): the VM waits, since a join
    // from a fresh disk is refused while the Node says Ready.
    let mut c = with_status(&c, status);
    c.spec.power = None;
    assert!(
        tenant.tokens.lock().unwrap().is_empty(),
        "the first join's token is gone"
    );
    let before = host.secrets.lock().unwrap().values().next().cloned();
    let (_, status) = walk_once(&ctx, &c, &t, &host, &tenant).await;
    assert_eq!(status.power, Some(autonodes_api::PowerState::Off));
    assert_eq!(condition(&status, READY), ("False", "PoweredOff"));
    let message = &conditions::get(&status.conditions, READY)
        .expect("set")
        .message;
    assert!(message.contains("no longer reports Node"), "{message}");
    assert!(host.vmis.lock().unwrap().is_empty(), "the VM did not start");
    assert!(tenant.tokens.lock().unwrap().is_empty(), "no token yet");
    // Once the tenant marks it Unknown: the VM starts, the Node is uncordoned, Starting
    // until the Node is Ready.
    if let Some(n) = tenant.nodes.lock().unwrap().get_mut(VM) {
        n.status = node(false).status;
        if let Some(c) = n.status.as_mut().and_then(|s| s.conditions.as_mut()) {
            c[0].status = "Unknown".into();
        }
    }
    let c = with_status(&c, status);
    let (_, status) = walk_once(&ctx, &c, &t, &host, &tenant).await;
    assert_eq!(status.power, Some(autonodes_api::PowerState::Starting));
    assert_eq!(condition(&status, PROVISIONED), ("False", "Booting"));
    assert!(!cordoned(&tenant));
    // A guest booting from a fresh disk joins again: its user data carries a new token.
    assert_eq!(tenant.tokens.lock().unwrap().len(), 1, "a fresh token");
    let after = host.secrets.lock().unwrap().values().next().cloned();
    assert_ne!(
        before.and_then(|s| s.data),
        after.and_then(|s| s.data),
        "user data rewritten"
    );
    host.run_vm(VM_NS, VM, "10.0.0.7");
    // Not On before the new kubelet reports Ready: the token stays for its join.
    let c = with_status(&c, status);
    let (_, status) = walk_once(&ctx, &c, &t, &host, &tenant).await;
    assert_eq!(status.power, Some(autonodes_api::PowerState::Starting));
    assert_eq!(tenant.tokens.lock().unwrap().len(), 1, "the token is kept");
    if let Some(n) = tenant.nodes.lock().unwrap().get_mut(VM) {
        n.status = node(true).status;
    }
    let c = with_status(&c, status);
    let (_, status) = walk_once(&ctx, &c, &t, &host, &tenant).await;
    assert_eq!(condition(&status, READY), ("True", "NodeReady"));
    assert_eq!(status.power, Some(autonodes_api::PowerState::On));
    assert!(
        tenant.tokens.lock().unwrap().is_empty(),
        "the token did its job"
    );
}

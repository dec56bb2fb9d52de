//! The paths that are not the happy one, on real API servers: timeouts, bad input, provider
//! deletion with live claims, a controller killed mid-provisioning, and the calls a deletion
//! makes (each once).

use crate::common;
use crate::opscommon;

use std::net::SocketAddr;
use std::time::Duration;

use autonodes_api::NodeProvider;
use autonodes_testenv::playground::{put_kubeconfig_secret, SERVICE_NAMESPACE};
use autonodes_testenv::simulator::SimMode;
use autonodes_testenv::testenv::ManagedProcess;
use common::world::*;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::ResourceExt;

const WAIT: Duration = Duration::from_secs(90);

/// A provider whose VMs go to `cluster`, with one small type (optionally broken).
fn provider(name: &str, cluster: &str, extra_type_fields: &str) -> String {
    provider_yaml(
        name,
        cluster,
        "1",
        "1Gi",
        &format!("      - name: small\n{extra_type_fields}"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_that_never_boots_fails_its_claim_by_launch_timeout_and_is_removed() {
    let world = World::start(WorldOptions {
        mode: SimMode::NeverBoot,
        launch_timeout: Duration::from_secs(6),
        ..Default::default()
    })
    .await;
    world.claim_type("stuck", "standard-node").await;
    let failed = world.wait_phase("stuck", "Failed", WAIT).await;
    let (status, reason, message) = condition(&failed, "Ready").expect("Ready condition");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "LaunchTimeout"),
        "{message}"
    );
    assert!(message.contains("did not run within 6s"), "{message}");
    common::eventually("the failed claim's VM and Secret to go", WAIT, || async {
        (world.vms().await.is_empty()
            && world.host_secrets().await.is_empty()
            && world.tokens().await.is_empty())
        .then_some(())
    })
    .await;
    let events = world.events_for(NS, "stuck").await;
    assert!(
        events.iter().any(|e| e.starts_with("LaunchTimeout")),
        "{events:?}"
    );
    // A failed claim no longer holds capacity.
    let t = world
        .wait_node_type(
            "kubevirt-provider-advanced.standard-node",
            "capacity freed",
            |t| {
                t.status
                    .as_ref()
                    .and_then(|s| s.capacity.as_ref())
                    .is_some_and(|c| c.claimed == 0)
            },
        )
        .await;
    assert_eq!(
        t.status.and_then(|s| s.capacity).and_then(|c| c.available),
        Some(10)
    );
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_that_never_joins_fails_its_claim_by_registration_timeout_and_is_removed() {
    let world = World::start(WorldOptions {
        mode: SimMode::NeverJoin,
        registration_timeout: Duration::from_secs(6),
        ..Default::default()
    })
    .await;
    world.claim_type("lonely", "standard-node").await;
    let joining = world.wait_phase("lonely", "Joining", WAIT).await;
    assert_eq!(
        condition(&joining, "Provisioned").map(|c| c.0),
        Some("True".into())
    );
    let failed = world.wait_phase("lonely", "Failed", WAIT).await;
    let (_, reason, message) = condition(&failed, "Ready").expect("Ready condition");
    assert_eq!(reason, "RegistrationTimeout", "{message}");
    common::eventually(
        "the failed claim's VM, Secret and token to go",
        WAIT,
        || async {
            (world.vms().await.is_empty()
                && world.host_secrets().await.is_empty()
                && world.tokens().await.is_empty())
            .then_some(())
        },
    )
    .await;
    assert!(world.nodes().await.is_empty());
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_host_clusters_and_templates_give_conditions_and_events_while_good_claims_are_served() {
    let world = World::start(WorldOptions::default()).await;
    let mgmt = world.mgmt.clone();
    put_kubeconfig_secret(
        &mgmt,
        SERVICE_NAMESPACE,
        "malformed",
        "kubeconfig",
        "this: is: not a kubeconfig [",
    )
    .await
    .expect("secret");
    let closed = autonodes_testenv::testenv::free_port().expect("port");
    let unreachable = autonodes_testenv::testenv::admin_kubeconfig(
        "gone",
        &format!("https://127.0.0.1:{closed}"),
        &world.playground.host().expect("host").ca_pem,
        "token",
    );
    put_kubeconfig_secret(
        &mgmt,
        SERVICE_NAMESPACE,
        "unreachable",
        "kubeconfig",
        &unreachable,
    )
    .await
    .expect("secret");
    world
        .apply_provider(&provider("no-secret", "no-such-cluster", ""))
        .await;
    world
        .apply_provider(&provider("bad-kubeconfig", "malformed", ""))
        .await;
    world
        .apply_provider(&provider("no-answer", "unreachable", ""))
        .await;
    // One provider, three types: two broken ones (the cheaper) fail themselves, not the
    // valid sibling, and a claim for the provider goes to the valid one.
    world
        .apply_provider(&provider_yaml(
            "mixed",
            "test-kubevirt-1",
            "1",
            "1Gi",
            "      - name: both-templates\n        mergeVirtualMachineTemplate: {metadata: {labels: {a: b}}}\n        virtualMachineTemplate: {spec: {template: {spec: {domain: {memory: {guest: 1Gi}}}}}}\n      - name: run-twice\n        mergeVirtualMachineTemplate: {spec: {running: true, runStrategy: Always}}\n      - name: fine\n        resources: {cpu: \"2\", memory: 2Gi}\n",
        ))
        .await;
    // A claim for a good type goes on regardless.
    world.claim_type("good", "standard-node").await;

    let cases = [
        (
            "no-secret",
            "HostReachable",
            "KubeconfigSecretNotFound",
            "autonodes-system/no-such-cluster",
        ),
        (
            "bad-kubeconfig",
            "HostReachable",
            "InvalidKubeconfig",
            "is not YAML",
        ),
        (
            "no-answer",
            "HostReachable",
            "HostUnreachable",
            "test-kubevirt-1",
        ),
    ];
    for (name, cond, reason, text) in cases {
        let p = world
            .wait_provider(name, &format!("{cond}={reason}"), |p| {
                provider_condition(p, cond).is_some_and(|c| c.0 == "False" && c.1 == reason)
            })
            .await;
        let (_, _, message) = provider_condition(&p, cond).expect("condition");
        let text = if name == "no-answer" {
            "unreachable"
        } else {
            text
        };
        assert!(message.contains(text), "{name}: {message}");
        assert_eq!(
            p.status
                .as_ref()
                .and_then(|s| s.phase)
                .map(|ph| format!("{ph:?}")),
            Some("Failed".into())
        );
        let ready = provider_condition(&p, "Ready").expect("Ready");
        assert_eq!((ready.0.as_str(), ready.1.as_str()), ("False", reason));
        let events = common::eventually(&format!("an Event for {name}"), WAIT, || async {
            let e = world.cluster_events_for(name).await;
            e.iter().any(|e| e.starts_with(reason)).then_some(e)
        })
        .await;
        assert!(!events.is_empty());
    }
    // The provider with broken types stays Ready and says which types are broken.
    let p = world
        .wait_provider("mixed", "TemplatesValid=False", |p| {
            provider_condition(p, "TemplatesValid")
                .is_some_and(|c| c.0 == "False" && c.1 == "InvalidTemplate")
        })
        .await;
    let (_, _, message) = provider_condition(&p, "TemplatesValid").expect("TemplatesValid");
    assert!(
        message.starts_with("2 of 3 node types invalid: "),
        "{message}"
    );
    assert!(
        message.contains("node type mixed.both-templates: mergeVirtualMachineTemplate and virtualMachineTemplate are mutually exclusive")
            && message.contains("mixed.run-twice")
            && message.contains("runStrategy"),
        "{message}"
    );
    let p = world
        .wait_provider("mixed", "Ready=True", |p| {
            provider_condition(p, "Ready").is_some_and(|c| c.0 == "True")
        })
        .await;
    assert_eq!(
        p.status
            .as_ref()
            .and_then(|s| s.phase)
            .map(|ph| format!("{ph:?}")),
        Some("Available".into())
    );
    // The broken types are Failed with the reason; the sibling is Available.
    for (name, phase, reason) in [
        ("mixed.both-templates", "Failed", "InvalidTemplate"),
        ("mixed.run-twice", "Failed", "InvalidTemplate"),
        ("mixed.fine", "Available", "Available"),
    ] {
        let ready = world.wait_type_phase(name, phase).await;
        assert_eq!(ready.reason, reason, "{name}: {}", ready.message);
    }
    world
        .create_claim(
            serde_json::json!({"metadata": {"name": "to-mixed"}, "spec": {"providerRef": "mixed"}}),
        )
        .await;
    let placed = world.wait_phase("to-mixed", "Available", WAIT).await;
    assert_eq!(
        placed.status.and_then(|s| s.type_ref).as_deref(),
        Some("mixed.fine")
    );
    // A claim pinned to a type of a provider whose host is broken says why.
    world
        .create_claim(serde_json::json!({"metadata": {"name": "pinned"}, "spec": {"typeRef": "no-secret.small"}}))
        .await;
    let pinned = world
        .wait_claim("pinned", "Scheduled=False", WAIT, |c| {
            condition(c, "Scheduled").is_some_and(|x| x.0 == "False")
        })
        .await;
    let (_, reason, message) = condition(&pinned, "Scheduled").expect("Scheduled");
    assert_eq!(reason, "NoMatchingNodeType");
    assert!(
        message.contains("no-secret.small") && message.contains("not ready"),
        "{message}"
    );

    world.wait_phase("good", "Available", WAIT).await;
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_claims_give_conditions_and_events_while_good_claims_are_served() {
    let world = World::start(WorldOptions::default()).await;
    world
        .create_claim(serde_json::json!({"metadata": {"name": "unknown-type"}, "spec": {"typeRef": "kubevirt-provider-advanced.huge-node"}}))
        .await;
    world
        .create_claim(serde_json::json!({"metadata": {"name": "no-tenant"}, "spec": {"vClusterRef": {"name": "missing"}}}))
        .await;
    world
        .create_claim(serde_json::json!({"metadata": {"name": "bad-gt"}, "spec": {"requirements": [{"key": "cores", "operator": "Gt", "values": ["many"]}]}}))
        .await;
    world.claim_type("good", "high-memory-node").await;

    let c = world
        .wait_claim("unknown-type", "Scheduled=False", WAIT, |c| {
            condition(c, "Scheduled").is_some_and(|x| x.0 == "False")
        })
        .await;
    let (_, reason, message) = condition(&c, "Scheduled").expect("Scheduled");
    assert_eq!(reason, "NoMatchingNodeType");
    assert!(
        message.contains("kubevirt-provider-advanced.huge-node does not exist"),
        "{message}"
    );

    let c = world
        .wait_claim("no-tenant", "Scheduled=False", WAIT, |c| {
            condition(c, "Scheduled").is_some_and(|x| x.0 == "False")
        })
        .await;
    let (_, reason, message) = condition(&c, "Scheduled").expect("Scheduled");
    assert_eq!(reason, "KubeconfigSecretNotFound");
    assert!(message.contains("tenant/vc-missing"), "{message}");
    assert_eq!(
        c.status
            .as_ref()
            .and_then(|s| s.phase)
            .map(|p| format!("{p:?}")),
        Some("Pending".into())
    );

    let c = world
        .wait_claim("bad-gt", "Scheduled=False", WAIT, |c| {
            condition(c, "Scheduled").is_some_and(|x| x.0 == "False")
        })
        .await;
    let (_, reason, message) = condition(&c, "Scheduled").expect("Scheduled");
    assert_eq!(reason, "InvalidRequest");
    assert!(
        message.contains("spec.requirements[0]") && message.contains("many"),
        "{message}"
    );

    for (name, reason) in [
        ("unknown-type", "NoMatchingNodeType"),
        ("no-tenant", "KubeconfigSecretNotFound"),
        ("bad-gt", "InvalidRequest"),
    ] {
        let events = world.events_for(NS, name).await;
        assert!(
            events.iter().any(|e| e.starts_with(reason)),
            "{name}: {events:?}"
        );
    }
    world.wait_phase("good", "Available", WAIT).await;
    // None of the bad claims made anything remote.
    assert_eq!(world.vms().await.len(), 1);
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_provider_with_live_claims_waits_for_them_and_orphans_nothing() {
    let world = World::start(WorldOptions::default()).await;
    world.claim_type("live", "standard-node").await;
    world.wait_phase("live", "Available", WAIT).await;
    let providers: Api<NodeProvider> = Api::all(world.mgmt.clone());
    providers
        .delete("kubevirt-provider-advanced", &DeleteParams::default())
        .await
        .expect("delete accepted");
    let p = world
        .wait_provider("kubevirt-provider-advanced", "InUse", |p| {
            provider_condition(p, "Ready").is_some_and(|c| c.1 == "InUse")
        })
        .await;
    let (_, _, message) = provider_condition(&p, "Ready").expect("Ready");
    assert!(message.contains("tenant/live"), "{message}");
    // The claim keeps its node while the provider waits.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(world.vms().await.len(), 1);
    assert_eq!(
        world
            .wait_phase("live", "Available", WAIT)
            .await
            .metadata
            .name
            .as_deref(),
        Some("live")
    );

    world.delete_claim("live").await;
    world.wait_claim_gone("live", WAIT).await;
    common::eventually("the provider to be gone", WAIT, || async {
        matches!(
            providers.get_opt("kubevirt-provider-advanced").await,
            Ok(None)
        )
        .then_some(())
    })
    .await;
    let types: Api<autonodes_api::NodeType> = Api::all(world.mgmt.clone());
    common::eventually("its node types to be gone", WAIT, || async {
        types
            .list(&Default::default())
            .await
            .ok()
            .filter(|l| l.items.is_empty())
            .map(|_| ())
    })
    .await;
    assert!(world.vms().await.is_empty());
    assert!(world.host_secrets().await.is_empty());
    assert!(world.nodes().await.is_empty());
    assert!(world.tokens().await.is_empty());
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_type_removed_from_its_provider_is_kept_while_a_claim_uses_it_and_deleted_after() {
    let world = World::start(WorldOptions::default()).await;
    let provider = "kubevirt-provider-advanced";
    let removed = format!("{provider}.standard-node");
    world.claim_type("live", "standard-node").await;
    world.wait_phase("live", "Available", WAIT).await;
    let providers: Api<NodeProvider> = Api::all(world.mgmt.clone());
    common::eventually("the type removed from the provider", WAIT, || async {
        let mut p = providers.get(provider).await.ok()?;
        p.spec
            .kube_virt
            .node_types
            .retain(|t| t.name != "standard-node");
        providers
            .replace(provider, &Default::default(), &p)
            .await
            .ok()
            .map(|_| ())
    })
    .await;
    world
        .wait_provider(provider, "the type kept in use", |p| {
            provider_condition(p, "Ready").is_some_and(|c| c.2.contains(&removed))
        })
        .await;
    let types: Api<autonodes_api::NodeType> = Api::all(world.mgmt.clone());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        types.get_opt(&removed).await.expect("read").is_some(),
        "the type goes only with its last claim"
    );
    assert_eq!(world.vms().await.len(), 1);

    world.delete_claim("live").await;
    world.wait_claim_gone("live", WAIT).await;
    common::eventually("the removed type to be gone", WAIT, || async {
        matches!(types.get_opt(&removed).await, Ok(None)).then_some(())
    })
    .await;
    assert!(
        providers
            .get(provider)
            .await
            .expect("provider")
            .metadata
            .deletion_timestamp
            .is_none(),
        "the provider stays"
    );
    world.shutdown().await;
}

/// Clusters, the simulator and the real `autonodes run` binary serving its metrics on the
/// returned address.
async fn world_with_controller_process() -> (World, ManagedProcess, SocketAddr) {
    // The requests are counted per cluster: the host is one of its own.
    let mut world = World::start_clusters(&WorldOptions {
        separate_host: true,
        ..WorldOptions::default()
    })
    .await;
    world.start_simulator(SimMode::Normal).await;
    let port = autonodes_testenv::testenv::free_port().expect("free port");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let controller =
        world.spawn_controller_process_on(1, env!("CARGO_BIN_EXE_autonodes"), &addr.to_string());
    (world, controller, addr)
}

/// Creates `n` claims `<prefix>-<i>` at once and waits until all are Available.
async fn available_claims(world: &World, prefix: &str, n: u64) -> Vec<String> {
    let names: Vec<String> = (0..n).map(|i| format!("{prefix}-{i}")).collect();
    for name in &names {
        world
            .create_claim(serde_json::json!({"metadata": {"name": name}, "spec": {}}))
            .await;
    }
    for name in &names {
        world.wait_phase(name, "Available", WAIT).await;
    }
    names
}

/// The controller process's requests of one (`cluster`, `verb`, `resource`), from its
/// `autonodes_kube_requests_total`.
#[derive(Clone, Copy, Debug, Default)]
struct Requests {
    /// Whatever the answer.
    all: u64,
    /// Answered 200.
    ok: u64,
    /// Answered 404.
    not_found: u64,
}

/// The controller process's `autonodes_kube_requests_total` for (`cluster`, `verb`,
/// `resource`).
async fn controller_requests(
    addr: SocketAddr,
    cluster: &str,
    verb: &str,
    resource: &str,
) -> Requests {
    let (code, text) = opscommon::http_get(addr, "/metrics")
        .await
        .expect("GET /metrics");
    assert_eq!(code, 200, "GET /metrics: {text}");
    let mut requests = Requests::default();
    for line in text.lines() {
        let Some((labels, value)) = line
            .strip_prefix("autonodes_kube_requests_total{")
            .and_then(|l| l.rsplit_once("} "))
        else {
            continue;
        };
        let labels: std::collections::BTreeMap<&str, &str> = labels
            .split(',')
            .filter_map(|pair| pair.split_once('='))
            .map(|(k, v)| (k, v.trim_matches('"')))
            .collect();
        let wanted = [("cluster", cluster), ("verb", verb), ("resource", resource)];
        if !wanted.iter().all(|(k, v)| labels.get(k) == Some(v)) {
            continue;
        }
        let n: u64 = value.trim().parse().expect("a count");
        requests.all += n;
        match labels.get("code") {
            Some(&"200") => requests.ok += n,
            Some(&"404") => requests.not_found += n,
            _ => {}
        }
    }
    requests
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_claims_releases_each_finalizer_once_and_deletes_each_vm_once() {
    let (world, _controller, addr) = world_with_controller_process().await;
    const N: u64 = 8;
    let names = available_claims(&world, "goes", N).await;
    let patches = controller_requests(addr, "management", "patch", "nodeclaims").await;
    let vm_deletes = controller_requests(addr, "host", "delete", "virtualmachines").await;
    for name in &names {
        world.delete_claim(name).await;
    }
    for name in &names {
        world.wait_claim_gone(name, WAIT).await;
    }
    assert!(world.vms().await.is_empty(), "every VM is gone");
    // Each claim's finalizer is released by one patch: a reconcile woken before the store
    // showed the claim gone does not send it again (it would be answered 404).
    let after = controller_requests(addr, "management", "patch", "nodeclaims").await;
    assert_eq!(
        (after.all - patches.all, after.not_found - patches.not_found),
        (N, 0),
        "finalizer patches of {N} deleted claims (all, 404)"
    );
    // Each VM is deleted once: the reconcile after the delete reads the VM as marked deleted,
    // not the cache's copy from before (which would drain and delete again).
    let after = controller_requests(addr, "host", "delete", "virtualmachines").await;
    assert_eq!(
        after.all - vm_deletes.all,
        N,
        "VM deletes of {N} deleted claims"
    );
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_node_watch_past_its_body_limit_resumes_and_its_cache_keeps_answering() {
    let (world, _controller, addr) = world_with_controller_process().await;
    world
        .create_claim(serde_json::json!({"metadata": {"name": "busy"}, "spec": {}}))
        .await;
    world.wait_phase("busy", "Available", WAIT).await;
    let lists = controller_requests(addr, "tenant", "list", "nodes").await;

    // The claim's Node changes until its watch has carried more than one connection may
    // (autonodes' limit on a tenant's answers): 48 versions of about 200 KB each.
    let nodes: Api<Node> = Api::all(world.tenant.clone());
    let node = world
        .nodes()
        .await
        .into_iter()
        .next()
        .expect("the claim's Node");
    let filler = "x".repeat(200 * 1024);
    for i in 0..48 {
        let patch = serde_json::json!({"metadata": {"annotations": {
            "example.com/filler": format!("{i}{filler}"),
        }}});
        nodes
            .patch(
                &node.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .expect("patch the Node");
    }
    assert!(
        48 * filler.len() > autonodes::remote::egress::TENANT_BODY_LIMIT,
        "the patches pass the limit"
    );
    let reads = [("tenant", "nodes"), ("tenant", "secrets")];
    let mut before = Vec::new();
    for (cluster, resource) in reads {
        before.push(
            controller_requests(addr, cluster, "get", resource)
                .await
                .all,
        );
    }
    available_claims(&world, "after", 4).await;
    // Their Nodes came through the watch after the patches. The claims read Nodes and
    // tokens from the caches: not one GET (a cache taken for stale after its connection
    // ended sends one per reconcile), and the watch resumed without listing again.
    let mut got = Vec::new();
    for ((cluster, resource), before) in reads.into_iter().zip(before) {
        let now = controller_requests(addr, cluster, "get", resource)
            .await
            .all;
        got.push((format!("{cluster} get {resource}"), now - before));
    }
    let relists = controller_requests(addr, "tenant", "list", "nodes")
        .await
        .all
        - lists.all;
    got.push(("tenant list nodes".to_string(), relists));
    assert!(
        got.iter().all(|(_, n)| *n == 0),
        "requests while 4 claims turned Available after the watch passed its limit: {got:?}"
    );
    world.shutdown().await;
}

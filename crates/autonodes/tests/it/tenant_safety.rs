//! One tenant cannot hurt the others, on real API servers: what a hostile tenant writes is
//! bounded by the CRDs and by the controller, and the other tenants keep being served.
//!
//! Run with `--nocapture` to see the figures each test prints.

use crate::common;
use crate::hostile;

use std::time::{Duration, Instant};

use autonodes::controller::config::ControllerConfig;
use autonodes_api::{NodeClaim, NodePool};
use autonodes_testenv::playground::put_kubeconfig_secret;
use autonodes_testenv::simulator::SimMode;
use common::pools::*;
use common::world::*;
use kube::api::{Api, ListParams, PostParams};
use kube::ResourceExt;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(120);

/// A provider with one cheap type, `small`.
fn provider() -> String {
    provider_yaml(
        "pools",
        "test-kubevirt-1",
        "1",
        "1Gi",
        "      - name: small\n        resources:\n          cpu: 1\n          memory: 1Gi",
    )
}

/// A world whose controller allows `max_claims` live claims per namespace, with a second
/// tenant namespace `other` whose `vc-tenant` Secret points at the same tenant cluster.
async fn world(max_claims: usize) -> World {
    world_with(provider(), |c| c.max_claims_per_namespace = max_claims).await
}

/// [`world`] with this provider, and the controller's configuration changed by `tweak`.
async fn world_with(provider: String, tweak: impl FnOnce(&mut ControllerConfig)) -> World {
    let mut world = clusters(provider).await;
    tweak(&mut world.config);
    let tenant = world.playground.tenant().expect("tenant");
    let kubeconfig = tenant.kubeconfig_yaml().expect("tenant kubeconfig");
    tenant_namespace(&world, "other", &kubeconfig).await;
    world.start_simulator(SimMode::Normal).await;
    world.start_controller();
    world
}

/// The clusters with this provider, no controller and no simulator yet.
async fn clusters(provider: String) -> World {
    World::start_clusters(&WorldOptions {
        provider,
        ..WorldOptions::default()
    })
    .await
}

/// A world whose controller sweeps orphans every 2 seconds.
async fn sweeping_world() -> World {
    World::start(WorldOptions {
        provider: provider(),
        orphan_sweep_interval: Duration::from_secs(2),
        ..WorldOptions::default()
    })
    .await
}

/// Makes `ns` a tenant namespace on the management cluster whose `vc-tenant` Secret holds
/// `kubeconfig`.
async fn tenant_namespace(world: &World, ns: &str, kubeconfig: &str) {
    world.mgmt_namespace(ns).await;
    put_kubeconfig_secret(
        &world.mgmt,
        ns,
        "vc-tenant",
        autonodes_api::TENANT_KUBECONFIG_KEY,
        kubeconfig,
    )
    .await
    .unwrap_or_else(|e| panic!("the kubeconfig Secret of {ns}: {e}"));
}

/// Creates a static pool `name` of provider `pools` in [`NS`].
async fn static_pool(world: &World, name: &str, replicas: i64) {
    world
        .create_pool(name, json!({"providerRef": "pools", "replicas": replicas}))
        .await;
}

/// Waits until the pool `name` in [`NS`] says LimitReached=True; its reason and message.
async fn limit_reached(world: &World, name: &str) -> (String, String) {
    let pool = world
        .wait_pool(name, "LimitReached=True", |p| limit_reason(p).is_some())
        .await;
    let (reason, message) = limit_reason(&pool).expect("limit");
    println!("pool {name} LimitReached: {reason}: {message}");
    (reason, message)
}

/// Creates a NodeQuota `name` allowing the `namespaces` `nodes` nodes, once the controller
/// enforces it.
async fn node_quota(world: &World, name: &str, namespaces: &[&str], nodes: &str) {
    world
        .create_node_quota(
            name,
            json!({"namespaces": namespaces, "limits": {"nodes": nodes}}),
        )
        .await;
}

fn pool_object(namespace: &str, name: &str, replicas: i64) -> NodePool {
    serde_json::from_value(json!({
        "apiVersion": "autonodes.io/v1alpha1", "kind": "NodePool",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"vClusterRef": {"name": "tenant"}, "providerRef": "pools", "replicas": replicas},
    }))
    .expect("NodePool")
}

fn limit_reason(p: &NodePool) -> Option<(String, String)> {
    p.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "LimitReached" && c.status == "True")
        .map(|c| (c.reason.clone(), c.message.clone()))
}

async fn claims_in(world: &World, namespace: &str) -> Vec<NodeClaim> {
    Api::<NodeClaim>::namespaced(world.mgmt.clone(), namespace)
        .list(&ListParams::default())
        .await
        .expect("list claims")
        .items
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_two_billion_replicas_is_refused_and_one_of_a_thousand_stops_at_the_namespace_cap_while_another_tenant_is_served(
) {
    let world = world(5).await;

    // The CRD refuses what no platform would mean.
    let refused = world
        .pools()
        .create(
            &PostParams::default(),
            &pool_object(NS, "huge", 2_147_483_647),
        )
        .await
        .expect_err("2^31-1 replicas refused");
    let text = refused.to_string();
    println!("replicas 2147483647: {text}");
    assert!(text.contains("1000"), "the error names the maximum: {text}");

    // The most the CRD takes, against a cap of 5 live claims per namespace.
    static_pool(&world, "big", 1000).await;
    let (reason, message) = limit_reached(&world, "big").await;
    assert_eq!(reason, "NamespaceClaimLimit");
    assert!(message.contains("--max-claims-per-namespace"), "{message}");
    assert_pool_event(&world, "big", "NamespaceClaimLimit").await;

    // Another tenant's claim is served while the first pool sits at the cap.
    let started = Instant::now();
    let other = claim_in(&world, "other", "b").await;
    available(&other, "b").await;
    println!(
        "the other tenant's claim was Available after {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // The capped pool never went beyond the cap.
    for _ in 0..10 {
        let n = claims_in(&world, NS).await.len();
        assert!(n <= 5, "{n} claims in a namespace capped at 5");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(pool_claims(&world, "big").await.len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_quota_s_nodes_bounds_the_claims_a_pool_creates_counting_claims_written_by_hand() {
    let world = world(1000).await;
    node_quota(&world, "three", &[NS], "3").await;
    world
        .create_claim(json!({"metadata": {"name": "by-hand"}, "spec": {"providerRef": "pools"}}))
        .await;
    // The pool is created once the controller has seen the claim written by hand.
    world
        .wait_claim("by-hand", "a phase", WAIT, |c| phase(c).is_some())
        .await;
    static_pool(&world, "workers", 10).await;
    let (reason, message) = limit_reached(&world, "workers").await;
    assert_eq!(reason, "QuotaExceeded");
    assert!(message.contains("NodeQuota three"), "{message}");
    for _ in 0..10 {
        let n = claims_in(&world, NS).await.len();
        assert!(
            n <= 3,
            "{n} claims in a namespace whose quota allows 3 nodes"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(pool_claims(&world, "workers").await.len(), 2);
}

/// A claim in `namespace` of the tenant, for provider `pools`.
async fn claim_in(world: &World, namespace: &str, name: &str) -> Api<NodeClaim> {
    let api: Api<NodeClaim> = Api::namespaced(world.mgmt.clone(), namespace);
    let claim: NodeClaim = serde_json::from_value(json!({
        "apiVersion": "autonodes.io/v1alpha1", "kind": "NodeClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"vClusterRef": {"name": "tenant"}, "providerRef": "pools"},
    }))
    .expect("claim");
    api.create(&PostParams::default(), &claim)
        .await
        .expect("claim created");
    api
}

/// Waits until the claim's `Scheduled` condition is False with `reason` (before the node
/// types are read it may say that there are none), and returns its message.
async fn unscheduled(api: &Api<NodeClaim>, name: &str, reason: &str) -> String {
    common::eventually(&format!("Scheduled=False {reason}"), WAIT, || {
        let api = api.clone();
        async move {
            let c = api.get(name).await.ok()?;
            let (status, found, message) = condition(&c, "Scheduled")?;
            (status == "False" && found == reason).then_some(message)
        }
    })
    .await
}

/// Waits until the claim is Available.
async fn available(api: &Api<NodeClaim>, name: &str) {
    common::eventually("Available", WAIT, || {
        let api = api.clone();
        async move {
            let c = api.get(name).await.ok()?;
            (phase(&c) == Some(autonodes_api::NodeClaimPhase::Available)).then_some(())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_serves_only_the_tenant_namespaces_its_selector_selects() {
    let restricted = provider().replacen(
        "\nspec:\n",
        "\nspec:\n  tenantNamespaceSelector:\n    matchLabels:\n      team: ml\n",
        1,
    );
    let world = world_with(restricted, |_| {}).await;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(world.mgmt.clone());
    namespaces
        .patch(
            "other",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"labels": {"team": "ml"}}})),
        )
        .await
        .expect("label namespace other");

    // A claim in a namespace the provider does not serve waits, and says why.
    let refused = claim_in(&world, NS, "outside").await;
    let message = unscheduled(&refused, "outside", "ProviderNotAllowed").await;
    println!("{NS}: Scheduled=False ProviderNotAllowed: {message}");
    assert!(
        message.contains(&format!("NodeProvider pools does not serve namespace {NS}")),
        "{message}"
    );

    // A pool there names the provider: it says so and creates nothing.
    static_pool(&world, "workers", 2).await;
    let pool = world
        .wait_pool("workers", "ProviderNotAllowed", |p| {
            p.status
                .iter()
                .flat_map(|s| &s.conditions)
                .any(|c| c.reason == "ProviderNotAllowed")
        })
        .await;
    println!("pool: {:?}", pool_condition(&pool, "Ready"));
    assert!(pool_claims(&world, "workers").await.is_empty());

    // The namespace it serves gets its node.
    let served = claim_in(&world, "other", "inside").await;
    available(&served, "inside").await;
    unscheduled(&refused, "outside", "ProviderNotAllowed").await;

    // A claim the provider refuses opens no connection to its tenant's cluster.
    assert_no_connection_before(&world, "ProviderNotAllowed").await;
}

/// A namespace `unserved` whose tenant cluster is a server of the test counting what it is
/// asked, and a claim there that gets `reason` without one request reaching that server.
async fn assert_no_connection_before(world: &World, reason: &str) {
    use hostile::{Hostile, HostileServer};
    let server = HostileServer::start(
        &world.playground.env.dir.join("unserved"),
        Hostile::Flood { bytes: 1 << 20 },
    )
    .await;
    tenant_namespace(world, "unserved", &server.kubeconfig()).await;
    let api = claim_in(world, "unserved", "c").await;
    let message = unscheduled(&api, "c", reason).await;
    // Time for any connection the claim's reconciles would open.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let asked = server.requests.load(std::sync::atomic::Ordering::Relaxed);
    println!("unserved: Scheduled=False {reason}: {message}; its tenant's server was asked {asked} times");
    assert_eq!(
        asked, 0,
        "no request reaches the tenant of a claim refused with {reason}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_require_quota_only_a_namespace_a_node_quota_covers_gets_nodes() {
    let world = world_with(provider(), |c| c.require_quota = true).await;
    node_quota(&world, "other-only", &["other"], "5").await;

    let refused = claim_in(&world, NS, "uncovered").await;
    let message = unscheduled(&refused, "uncovered", "NoQuota").await;
    println!("{NS}: Scheduled=False NoQuota: {message}");
    assert!(message.contains("--require-quota"), "{message}");

    static_pool(&world, "workers", 3).await;
    let (reason, _) = limit_reached(&world, "workers").await;
    assert_eq!(reason, "NoQuota");
    assert_pool_event(&world, "workers", "NoQuota").await;
    assert!(pool_claims(&world, "workers").await.is_empty());

    let covered = claim_in(&world, "other", "covered").await;
    available(&covered, "covered").await;

    // A claim --require-quota refuses opens no connection to its tenant's cluster.
    assert_no_connection_before(&world, "NoQuota").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_drain_a_budget_blocks_for_ever_keeps_its_place_under_the_namespace_cap_until_the_controller_s_maximum_ends_it(
) {
    const MAX_DRAIN: Duration = Duration::from_secs(20);
    let world = world_with(provider(), |c| {
        c.max_claims_per_namespace = 1;
        c.max_drain_duration = MAX_DRAIN;
    })
    .await;
    world
        .create_pool(
            "patient",
            json!({"providerRef": "pools", "replicas": 1, "terminationGracePeriod": "Never"}),
        )
        .await;
    let (old, node) = common::eventually("the pool's node", WAIT, || async {
        let claims = pool_claims(&world, "patient").await;
        let c = claims
            .iter()
            .find(|c| phase(c) == Some(autonodes_api::NodeClaimPhase::Available))?;
        Some((c.name_any(), c.status.as_ref()?.node_name.clone()?))
    })
    .await;
    // A pod a PodDisruptionBudget protects: the drain of `Never` would wait for ever.
    protected_pod(&world, "held", &node).await;
    let scale = |replicas: i64| {
        let pools = world.pools();
        async move {
            pools
                .patch(
                    "patient",
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(json!({"spec": {"replicas": replicas}})),
                )
                .await
                .expect("scale")
        }
    };
    scale(0).await;
    let deleted = Instant::now();
    common::eventually("the old claim to be deleting", WAIT, || async {
        let c = world.claims().get(&old).await.ok()?;
        c.metadata.deletion_timestamp.map(|_| ())
    })
    .await;
    scale(1).await;
    // The deleting claim's VM still runs: the namespace is at its cap of 1.
    let (reason, message) = limit_reached(&world, "patient").await;
    assert_eq!(reason, "NamespaceClaimLimit", "{message}");
    assert!(message.contains("being deleted included"), "{message}");
    assert_eq!(
        pool_claims(&world, "patient").await.len(),
        1,
        "no second VM while the first drains"
    );
    // At the controller's maximum the drain ends, the old claim goes with a Warning Event,
    // and the pool gets its node.
    world.wait_claim_gone(&old, WAIT).await;
    let took = deleted.elapsed();
    println!("patient: the Never drain behind a blocking budget ended {took:?} after the claim was deleted (--max-drain-duration {MAX_DRAIN:?})");
    assert!(took >= MAX_DRAIN, "not before the maximum: {took:?}");
    let events = world.events_for(NS, &old).await;
    println!("{old}: {events:?}");
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("DrainTimeout") && e.contains("--max-drain-duration")),
        "{events:?}"
    );
    common::eventually("the pool's new node", WAIT, || async {
        let claims = pool_claims(&world, "patient").await;
        claims
            .iter()
            .find(|c| {
                c.name_any() != old && phase(c) == Some(autonodes_api::NodeClaimPhase::Available)
            })
            .map(|_| ())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_vm_boots_after_the_registration_timeout_still_joins_with_its_token() {
    // Tokens used to live as long as the registration timeout (15 s here), counted from the
    // start of the launch; this guest boots 25 s after its VM is made. A token now lives for
    // the launch (60 s) and the registration, plus a minute.
    let boot = Duration::from_secs(25);
    let world = World::start(WorldOptions {
        provider: provider(),
        mode: SimMode::SlowBoot(boot),
        launch_timeout: Duration::from_secs(60),
        registration_timeout: Duration::from_secs(15),
        ..WorldOptions::default()
    })
    .await;
    let started = Instant::now();
    world
        .create_claim(json!({"metadata": {"name": "slow"}, "spec": {"providerRef": "pools"}}))
        .await;
    let claim = world.wait_phase("slow", "Available", WAIT).await;
    println!(
        "claim Available after {:.1} s (guest boot {} s, registration timeout 15 s) on node {:?}",
        started.elapsed().as_secs_f64(),
        boot.as_secs(),
        claim.status.and_then(|s| s.node_name)
    );
    assert!(started.elapsed() > boot);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_whose_kubeconfig_turns_invalid_cannot_keep_its_deleted_claim_s_vm_alive() {
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::{Patch, PatchParams};
    let world = world(1000).await;
    world
        .create_claim(json!({"metadata": {"name": "held"}, "spec": {"providerRef": "pools"}}))
        .await;
    world.wait_phase("held", "Available", WAIT).await;
    assert_eq!(world.vms().await.len(), 1);

    // The tenant rewrites its kubeconfig Secret into one autonodes refuses (an exec
    // plugin), then deletes the claim.
    let hostile = "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts:\n- name: c\n  context: {cluster: c, user: u}\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:1'}\nusers:\n- name: u\n  user:\n    exec: {command: /bin/sh, apiVersion: client.authentication.k8s.io/v1}\n";
    Api::<Secret>::namespaced(world.mgmt.clone(), NS)
        .patch(
            "vc-tenant",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {autonodes_api::TENANT_KUBECONFIG_KEY: hostile}})),
        )
        .await
        .expect("kubeconfig Secret rewritten");
    // Past the controller's recheck of kubeconfig Secrets, the tenant is refused.
    tokio::time::sleep(autonodes::remote::clients::SECRET_RECHECK + Duration::from_secs(2)).await;
    let started = Instant::now();
    world.delete_claim("held").await;
    // The drain timeout of this world is 20 s: the VM goes after it, the claim with it.
    world.wait_claim_gone("held", WAIT).await;
    let took = started.elapsed();
    println!(
        "the claim was gone {:.0} s after its deletion",
        took.as_secs_f64()
    );
    assert!(
        took + Duration::from_secs(2) >= world.config.drain_timeout,
        "the cleanup waited for the tenant for the drain timeout first ({took:?})"
    );
    assert!(world.vms().await.is_empty(), "the VM was deleted");
    assert!(world.host_secrets().await.is_empty(), "the user data too");
    let events = world.events_for(NS, "held").await;
    assert!(
        events.iter().any(|e| e.starts_with("TenantCleanupSkipped")),
        "{events:?}"
    );
}

/// An object on the host labelled as autonodes makes them, for `installation` (none: made
/// before installations were labelled) and the claim UID `uid`.
fn host_labels(installation: Option<&str>, uid: &str) -> serde_json::Value {
    let mut labels = json!({
        "app.kubernetes.io/managed-by": "autonodes",
        "autonodes.io/nodeclaim-uid": uid,
    });
    if let Some(i) = installation {
        labels["autonodes.io/installation"] = json!(i);
    }
    labels
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_removes_only_its_own_installation_s_orphans_and_a_claim_never_adopts_or_deletes_another_s_vm_or_user_data(
) {
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::DynamicObject;
    let world = sweeping_world().await;
    let installation = world.config.installation.clone();
    let secrets: Api<Secret> = Api::namespaced(world.host.clone(), "vcluster-platform");
    for (name, owner) in [
        ("ours-orphaned", Some(installation.as_str())),
        ("production-s", Some("production")),
        ("unlabelled", None),
    ] {
        let s: Secret = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": host_labels(owner, &format!("uid-of-{name}"))},
            "stringData": {"userdata": "#cloud-config\n"},
        }))
        .expect("secret");
        secrets
            .create(&PostParams::default(), &s)
            .await
            .expect("host Secret");
    }
    common::wait_gone(
        "this installation's orphan swept",
        &secrets,
        "ours-orphaned",
        WAIT,
    )
    .await;
    for name in ["production-s", "unlabelled"] {
        assert!(
            secrets.get_opt(name).await.expect("get").is_some(),
            "{name} is not this installation's and stays"
        );
    }
    println!("swept ours-orphaned; production-s and unlabelled stay");

    // A claim whose VM name another installation's VM holds: not adopted, not deleted.
    world
        .create_claim(json!({"metadata": {"name": "clash"}, "spec": {"providerRef": "later"}}))
        .await;
    let claim = world
        .wait_claim("clash", "a phase", WAIT, |c| phase(c).is_some())
        .await;
    let vm_name = autonodes_core::template::names::vm_name_for_claim(
        NS,
        "clash",
        claim.metadata.uid.as_deref().expect("uid"),
    );
    let vms: Api<DynamicObject> = Api::namespaced_with(
        world.host.clone(),
        "vcluster-platform",
        &autonodes_api::kubevirt::virtual_machine(),
    );
    let foreign: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": vm_name, "labels": host_labels(Some("production"), "uid-of-another-claim")},
        "spec": {"runStrategy": "Halted", "template": {"spec": {"domain": {"devices": {}, "resources": {"requests": {"memory": "1Gi"}}}}}},
    }))
    .expect("VM");
    let foreign = vms
        .create(&PostParams::default(), &foreign)
        .await
        .expect("the other installation's VM");
    // And the user-data Secret of that name: deleting the claim must not delete it by name.
    let user_data = autonodes_core::template::names::user_data_secret_name(&vm_name);
    let foreign_secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": user_data, "labels": host_labels(Some("production"), "uid-of-another-claim")},
        "stringData": {"userdata": "#cloud-config\n"},
    }))
    .expect("secret");
    let foreign_secret = secrets
        .create(&PostParams::default(), &foreign_secret)
        .await
        .expect("the other installation's user-data Secret");
    world
        .apply_provider(&provider().replace("name: pools", "name: later"))
        .await;
    let claim = world
        .wait_claim("clash", "NameTaken", WAIT, |c| {
            c.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|x| x.type_ == "Provisioned" && x.reason == "NameTaken")
            })
        })
        .await;
    let message = claim
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|x| x.reason == "NameTaken"))
        .map(|x| x.message.clone())
        .unwrap_or_default();
    println!("Provisioned=False NameTaken: {message}");
    world.delete_claim("clash").await;
    world.wait_claim_gone("clash", WAIT).await;
    let still = vms
        .get(&vm_name)
        .await
        .expect("the foreign VM is still there");
    assert_eq!(still.metadata.uid, foreign.metadata.uid, "the very same VM");
    assert_eq!(
        still
            .labels()
            .get("autonodes.io/nodeclaim-uid")
            .map(String::as_str),
        Some("uid-of-another-claim"),
        "and not relabelled"
    );
    let kept = secrets
        .get_opt(&user_data)
        .await
        .expect("get")
        .expect("the foreign user-data Secret is still there");
    assert_eq!(
        kept.metadata.uid, foreign_secret.metadata.uid,
        "the very same Secret"
    );
    println!("after the claim went: the foreign VM {vm_name} and Secret {user_data} stay");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_kubeconfig_naming_the_management_api_server_in_any_spelling_or_a_closed_port_gets_a_coarse_condition_and_no_connection(
) {
    let world = world(1000).await;
    let mgmt = world.playground.mgmt().expect("mgmt");
    // The management API server by a name that resolves to it (loopback is allowed in this
    // world, the management server never is).
    let by_name = mgmt
        .kubeconfig_yaml()
        .expect("kubeconfig")
        .replace("https://127.0.0.1:", "https://localhost:");
    let (reason, message) = tenant_unreachable(&world, "at-mgmt", &by_name).await;
    println!(
        "kubeconfig at https://localhost:{}: {reason}: {message}",
        mgmt.port
    );
    assert!(
        message.contains("refused by autonodes' address policy"),
        "{message}"
    );
    // The management API server in the IPv6 spellings that carry its IPv4 address (NAT64,
    // 6to4, IPv4-compatible): refused as the plain address is, before any connection.
    for (ns, spelled) in [
        ("at-mgmt-nat64", "[64:ff9b::7f00:1]"),
        ("at-mgmt-6to4", "[2002:7f00:1::]"),
        ("at-mgmt-compat", "[::7f00:1]"),
    ] {
        let kubeconfig = mgmt
            .kubeconfig_yaml()
            .expect("kubeconfig")
            .replace("https://127.0.0.1:", &format!("https://{spelled}:"));
        let (reason, message) = tenant_unreachable(&world, ns, &kubeconfig).await;
        println!(
            "kubeconfig at https://{spelled}:{}: {reason}: {message}",
            mgmt.port
        );
        assert!(
            message.contains("refused by autonodes' address policy"),
            "{spelled}: {message}"
        );
    }
    // A closed port on an allowed address: unreachable, and not a word of the OS's error.
    let closed = mgmt
        .kubeconfig_yaml()
        .expect("kubeconfig")
        .replace(&format!("127.0.0.1:{}", mgmt.port), "127.0.0.1:1");
    let (reason, message) = tenant_unreachable(&world, "at-closed", &closed).await;
    println!("kubeconfig at https://127.0.0.1:1: {reason}: {message}");
    assert!(message.contains("cannot be reached"), "{message}");
    for leak in [
        "refused (os",
        "Connection refused",
        "tcp connect",
        "os error",
    ] {
        assert!(!message.contains(leak), "{leak:?} in {message}");
    }
    // The management API server saw no request from autonodes with the tenant's identity
    // beyond its own: the claims there never got a token.
    assert!(world.tokens().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_removes_tenant_nodes_of_this_installation_whose_claim_is_gone_and_no_other_node()
{
    use k8s_openapi::api::core::v1::Node;
    let world = sweeping_world().await;
    // A live claim: the sweep looks at the tenants claims name, and its Node stays.
    world
        .create_claim(json!({"metadata": {"name": "live"}, "spec": {"providerRef": "pools"}}))
        .await;
    let live = world.wait_phase("live", "Available", WAIT).await;
    let live_node = live
        .status
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .expect("the live claim's Node");

    let installation = world.config.installation.clone();
    let nodes: Api<Node> = Api::all(world.tenant.clone());
    for (name, labels) in [
        (
            "left-behind",
            json!({"autonodes.io/installation": installation, "autonodes.io/nodeclaim-uid": "uid-of-a-gone-claim"}),
        ),
        (
            "production-node",
            json!({"autonodes.io/installation": "production", "autonodes.io/nodeclaim-uid": "uid-of-another-claim"}),
        ),
        ("tenant-own", json!({"team": "web"})),
    ] {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
        }))
        .expect("node");
        nodes
            .create(&PostParams::default(), &node)
            .await
            .expect("tenant Node");
    }
    common::wait_gone(
        "the Node of a gone claim swept",
        &nodes,
        "left-behind",
        WAIT,
    )
    .await;
    // A few more sweeps: nothing else goes.
    tokio::time::sleep(Duration::from_secs(5)).await;
    for name in ["production-node", "tenant-own", live_node.as_str()] {
        assert!(
            nodes.get_opt(name).await.expect("get").is_some(),
            "{name} stays"
        );
    }
    let events = world.events_for(NS, "vc-tenant").await;
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("OrphanRemoved") && e.contains("Node /left-behind")),
        "{events:?}"
    );
    println!("swept left-behind; production-node, tenant-own and {live_node} stay");
}

/// Claims of `ns` written for tenant `vcluster`.
async fn claims_of(world: &World, ns: &str) -> usize {
    claims_in(world, ns).await.len()
}

/// How long tenant B's ordinary claim `b` in [`NS`] takes from its creation to Available.
async fn ordinary_claim_available(world: &World) -> Duration {
    let started = Instant::now();
    world
        .create_claim(json!({"metadata": {"name": "b"}, "spec": {"providerRef": "pools"}}))
        .await;
    world.wait_phase("b", "Available", WAIT).await;
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_a_hostile_tenant_neither_starves_another_nor_grows_the_controller_past_its_bounds() {
    use autonodes_testenv::testenv::process_memory;
    use hostile::{Hostile, HostileServer};
    const CAP: usize = 20;
    let mut world = clusters(provider()).await;
    world.start_simulator(SimMode::Normal).await;

    // Tenant A's API server: a 1 GB Node list, and 1,000 Secrets of 100 KiB in kube-system
    // carrying autonodes' labels (its own installation's, as a tenant could copy them).
    let hostile = HostileServer::start(
        &world.playground.env.dir.join("hostile"),
        Hostile::Huge {
            node_bytes: 1 << 30,
            secrets: 1000,
            secret_bytes: 100 * 1024,
            installation: "soak".into(),
        },
    )
    .await;
    tenant_namespace(&world, "tenant-a", &hostile.kubeconfig()).await;

    let cap = CAP.to_string();
    let controller = world.spawn_controller_process_with(
        0,
        env!("CARGO_BIN_EXE_autonodes"),
        "127.0.0.1:0",
        &[
            "--installation-id",
            "soak",
            "--max-claims-per-namespace",
            &cap,
        ],
    );
    let pid = controller.pid().expect("controller pid");

    // Tenant A asks for 2^31-1 nodes (refused by the API server), then for the most the CRD
    // takes, and runs a dynamic pool that must read its 1 GB of Nodes.
    let a_pools: Api<NodePool> = Api::namespaced(world.mgmt.clone(), "tenant-a");
    let refused = a_pools
        .create(
            &PostParams::default(),
            &pool_object("tenant-a", "flood", 2_147_483_647),
        )
        .await
        .expect_err("2^31-1 replicas refused")
        .to_string();
    a_pools
        .create(
            &PostParams::default(),
            &pool_object("tenant-a", "flood", 1000),
        )
        .await
        .expect("1000 replicas");
    let mut demand = pool_object("tenant-a", "demand", 0);
    demand.spec.replicas = None;
    a_pools
        .create(&PostParams::default(), &demand)
        .await
        .expect("dynamic pool");
    // Let the controller chew on tenant A for a while.
    tokio::time::sleep(Duration::from_secs(15)).await;

    // Tenant B's ordinary claim.
    let b_available = ordinary_claim_available(&world).await;

    // Tenant A keeps at it a little longer.
    let mut most_claims = 0;
    for _ in 0..20 {
        most_claims = most_claims.max(claims_of(&world, "tenant-a").await);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (rss, peak) = process_memory(pid).expect("controller memory");
    let demand = a_pools.get("demand").await.expect("dynamic pool");
    let demand_ready = pool_condition(&demand, "Ready");
    let flood = a_pools.get("flood").await.expect("static pool");
    println!("soak: replicas 2147483647 refused: {refused}");
    println!(
        "soak: tenant A's server sent {:.1} MiB in {} requests (it offered a 1 GiB Node list and 1,000 Secrets of 100 KiB)",
        hostile.sent() as f64 / (1 << 20) as f64,
        hostile.requests.load(std::sync::atomic::Ordering::Relaxed)
    );
    println!("soak: tenant A's claims: at most {most_claims} (cap {CAP})");
    println!("soak: tenant A's dynamic pool Ready: {demand_ready:?}");
    println!(
        "soak: tenant A's static pool LimitReached: {:?}",
        limit_reason(&flood)
    );
    println!(
        "soak: tenant B's claim Available after {:.1} s",
        b_available.as_secs_f64()
    );
    println!(
        "soak: controller RSS {:.1} MiB, peak {:.1} MiB",
        rss as f64 / (1 << 20) as f64,
        peak as f64 / (1 << 20) as f64
    );
    assert!(refused.contains("1000"), "{refused}");
    assert!(
        most_claims <= CAP,
        "{most_claims} claims over the cap {CAP}"
    );
    assert!(
        demand_ready
            .as_ref()
            .is_some_and(|(status, _, message)| status == "False"
                && (message.contains("larger than autonodes accepts")
                    || message.contains("memory budget"))),
        "the dynamic pool says the tenant's answer was too large, or that its answers passed the memory budget (several of its 8 MiB answers at once pass the namespace's 16 MiB): {demand_ready:?}"
    );
    assert!(peak <= 128 << 20, "peak RSS {peak} bytes over 128 MiB");
    drop(controller);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_two_namespaces_naming_twenty_flooding_tenant_clusters_each_keep_the_controller_within_its_memory_budget_while_another_tenant_is_served(
) {
    use autonodes_testenv::testenv::process_memory;
    use hostile::{Hostile, HostileServer};
    const CLUSTERS: usize = 20;
    const NAMESPACES: [&str; 2] = ["flood-a", "flood-b"];
    let mut world = clusters(provider()).await;
    world.start_simulator(SimMode::Normal).await;

    // Twenty tenant API servers of the tenants' own (a CA of theirs, an allowed address),
    // answering every list with 7.5 MiB and every watch with events of 7.5 MiB each.
    let dir = world.playground.env.dir.join("flood");
    let mut servers = Vec::new();
    for i in 0..CLUSTERS {
        servers.push(
            HostileServer::start(
                &dir.join(format!("h{i}")),
                Hostile::Flood { bytes: 15 << 19 },
            )
            .await,
        );
    }
    // Two namespaces name all twenty, each with one claim per cluster.
    for ns in NAMESPACES {
        world.mgmt_namespace(ns).await;
        let api: Api<NodeClaim> = Api::namespaced(world.mgmt.clone(), ns);
        for (i, server) in servers.iter().enumerate() {
            put_kubeconfig_secret(
                &world.mgmt,
                ns,
                &format!("vc-h{i}"),
                autonodes_api::TENANT_KUBECONFIG_KEY,
                &server.kubeconfig(),
            )
            .await
            .expect("kubeconfig Secret");
            let claim: NodeClaim = serde_json::from_value(json!({
                "apiVersion": "autonodes.io/v1alpha1", "kind": "NodeClaim",
                "metadata": {"name": format!("h{i}"), "namespace": ns},
                "spec": {"vClusterRef": {"name": format!("h{i}")}, "providerRef": "pools"},
            }))
            .expect("claim");
            api.create(&PostParams::default(), &claim)
                .await
                .expect("claim created");
        }
    }
    let controller = world.spawn_controller_process_with(
        0,
        env!("CARGO_BIN_EXE_autonodes"),
        "127.0.0.1:0",
        &["--installation-id", "soak"],
    );
    let pid = controller.pid().expect("controller pid");
    let mut peak_seen = 0u64;
    let mut sample = || {
        if let Some((rss, _)) = process_memory(pid) {
            peak_seen = peak_seen.max(rss);
        }
    };
    // Let the floods run.
    for _ in 0..40 {
        sample();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Another tenant's ordinary claim, in the middle of it.
    let b_available = ordinary_claim_available(&world).await;
    for _ in 0..20 {
        sample();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (rss, peak) = process_memory(pid).expect("controller memory");
    let sent: u64 = servers.iter().map(|s| s.sent()).sum();
    println!(
        "soak-many: {} tenant clusters in {} namespaces sent {:.0} MiB",
        CLUSTERS * NAMESPACES.len(),
        NAMESPACES.len(),
        sent as f64 / (1 << 20) as f64
    );
    let mut capped = Vec::new();
    for ns in NAMESPACES {
        let mut reasons: std::collections::BTreeMap<String, (usize, String)> = Default::default();
        let mut over_cap = 0;
        for c in claims_in(&world, ns).await {
            let (reason, message) = c
                .status
                .as_ref()
                .and_then(|s| s.conditions.iter().find(|x| x.status == "False"))
                .map(|x| (x.reason.clone(), x.message.clone()))
                .unwrap_or_default();
            if reason == "TooManyTenantClusters" {
                over_cap += 1;
            }
            let entry = reasons.entry(reason).or_insert((0, message));
            entry.0 += 1;
        }
        for (reason, (n, message)) in &reasons {
            println!("soak-many: namespace {ns}: {n} claims {reason}, as: {message}");
        }
        capped.push(over_cap);
    }
    println!(
        "soak-many: tenant B's claim Available after {:.1} s",
        b_available.as_secs_f64()
    );
    println!(
        "soak-many: controller RSS {:.1} MiB, peak {:.1} MiB (sampled peak {:.1} MiB)",
        rss as f64 / (1 << 20) as f64,
        peak as f64 / (1 << 20) as f64,
        peak_seen as f64 / (1 << 20) as f64
    );
    let cap = autonodes::remote::clients::DEFAULT_MAX_TENANT_CLUSTERS_PER_NAMESPACE;
    for (ns, over) in NAMESPACES.iter().zip(&capped) {
        assert_eq!(
            *over,
            CLUSTERS - cap,
            "{ns}: the claims past the cap of {cap} tenant clusters say so"
        );
    }
    assert!(sent > 256 << 20, "the floods ran: {sent} bytes");
    assert!(peak <= 128 << 20, "peak RSS {peak} bytes over 128 MiB");
    drop(controller);
}

/// Creates namespace `ns` with a `vc-tenant` Secret holding `kubeconfig`, and a claim `c`
/// there; waits until one of the claim's conditions has a reason `wanted` accepts (`what`
/// names it) and returns that reason and message: why the tenant cannot be used.
async fn tenant_condition(
    world: &World,
    ns: &str,
    kubeconfig: &str,
    what: &str,
    wanted: fn(&str) -> bool,
) -> (String, String) {
    tenant_namespace(world, ns, kubeconfig).await;
    let api = claim_in(world, ns, "c").await;
    common::eventually(&format!("claim {ns}/c {what}"), WAIT, || {
        let api = api.clone();
        async move {
            let c = api.get("c").await.ok()?;
            c.status?
                .conditions
                .iter()
                .find(|x| wanted(&x.reason))
                .map(|x| (x.reason.clone(), x.message.clone()))
        }
    })
    .await
}

/// [`tenant_condition`] for the reason `TenantUnreachable`.
async fn tenant_unreachable(world: &World, ns: &str, kubeconfig: &str) -> (String, String) {
    tenant_condition(world, ns, kubeconfig, "TenantUnreachable", |r| {
        r == "TenantUnreachable"
    })
    .await
}

/// [`tenant_condition`] for any reason starting with `Tenant`.
async fn any_tenant_reason(world: &World, ns: &str, kubeconfig: &str) -> (String, String) {
    tenant_condition(world, ns, kubeconfig, "with a Tenant* reason", |r| {
        r.starts_with("Tenant")
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_servers_that_trickle_or_redirect_to_loopback_get_a_condition_and_no_request_reaches_the_redirect_target(
) {
    use hostile::{Hostile, HostileServer};
    use std::sync::atomic::{AtomicU64, Ordering};
    let world = world(1000).await;
    let dir = world.playground.env.dir.join("hostile");

    // Where a redirect points: a loopback port that counts who connects.
    let target = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let target_port = target.local_addr().expect("addr").port();
    let reached = std::sync::Arc::new(AtomicU64::new(0));
    let counter = reached.clone();
    let target_task = tokio::spawn(async move {
        while target.accept().await.is_ok() {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    });

    let redirect = HostileServer::start(
        &dir.join("redirect"),
        Hostile::Redirect {
            location: format!("https://127.0.0.1:{target_port}/api/v1/nodes"),
        },
    )
    .await;
    let trickle = HostileServer::start(&dir.join("trickle"), Hostile::Trickle).await;

    let started = Instant::now();
    let (reason, message) = any_tenant_reason(&world, "at-redirect", &redirect.kubeconfig()).await;
    println!("redirecting tenant: {reason}: {message}");
    assert!(message.contains("redirect"), "{message}");
    let (reason, message) = any_tenant_reason(&world, "at-trickle", &trickle.kubeconfig()).await;
    println!(
        "trickling tenant after {:.1} s: {reason}: {message}",
        started.elapsed().as_secs_f64()
    );

    // Meanwhile another tenant is served.
    let served = claim_in(&world, "other", "b").await;
    available(&served, "b").await;
    println!(
        "the other tenant's claim Available {:.1} s after the hostile tenants' claims",
        started.elapsed().as_secs_f64()
    );
    assert!(redirect.requests.load(Ordering::Relaxed) > 0);
    assert_eq!(
        reached.load(Ordering::Relaxed),
        0,
        "nobody followed the redirect to loopback"
    );
    target_task.abort();
}

/// GET `path` on the metrics server at `port` over HTTPS (its certificate is self-signed:
/// not checked here), with `token` as bearer; the status and body.
async fn https_get(port: u16, path: &str, token: Option<&str>) -> (u16, String) {
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::rustls::client::danger::{
        HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
    };
    use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use tokio_rustls::rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};

    #[derive(Debug)]
    struct AnyCertificate;
    impl ServerCertVerifier for AnyCertificate {
        fn verify_server_cert(
            &self,
            _: &CertificateDer<'_>,
            _: &[CertificateDer<'_>],
            _: &ServerName<'_>,
            _: &[u8],
            _: UnixTime,
        ) -> Result<ServerCertVerified, tokio_rustls::rustls::Error> {
            Ok(ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            _: &[u8],
            _: &CertificateDer<'_>,
            _: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, tokio_rustls::rustls::Error> {
            Ok(HandshakeSignatureValid::assertion())
        }
        fn verify_tls13_signature(
            &self,
            _: &[u8],
            _: &CertificateDer<'_>,
            _: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, tokio_rustls::rustls::Error> {
            Ok(HandshakeSignatureValid::assertion())
        }
        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            tokio_rustls::rustls::crypto::ring::default_provider()
                .signature_verification_algorithms
                .supported_schemes()
        }
    }

    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate))
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect to the metrics server");
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await
        .expect("TLS with the metrics server");
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    tls.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .expect("request");
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer).await;
    let text = String::from_utf8_lossy(&answer).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// A token of a new ServiceAccount `name` in `default` (TokenRequest).
async fn service_account_token(world: &World, name: &str) -> String {
    use k8s_openapi::api::authentication::v1::TokenRequest;
    use k8s_openapi::api::core::v1::ServiceAccount;
    let accounts: Api<ServiceAccount> = Api::namespaced(world.mgmt.clone(), "default");
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": name}})).expect("sa");
    accounts
        .create(&PostParams::default(), &sa)
        .await
        .expect("ServiceAccount");
    let request: TokenRequest =
        serde_json::from_value(json!({"spec": {"audiences": [], "expirationSeconds": 3600}}))
            .expect("token request");
    accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .expect("token")
        .status
        .expect("token status")
        .token
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_metrics_auth_only_callers_the_cluster_authorizes_read_metrics_and_the_probes_stay_open(
) {
    let world = clusters(provider()).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("a free port")
        .local_addr()
        .expect("addr")
        .port();
    let addr = format!("127.0.0.1:{port}");
    let _controller = world.spawn_controller_process_with(
        0,
        env!("CARGO_BIN_EXE_autonodes"),
        &addr,
        &["--metrics-auth"],
    );
    let healthz = common::eventually("the metrics server answers", WAIT, || async move {
        let probe = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        drop(probe);
        let (status, _) = https_get(port, "/healthz", None).await;
        (status != 0).then_some(status)
    })
    .await;
    let (no_token, _) = https_get(port, "/metrics", None).await;
    let (bad_token, _) = https_get(port, "/metrics", Some("not-a-token")).await;
    let stranger = service_account_token(&world, "stranger").await;
    let (not_allowed, _) = https_get(port, "/metrics", Some(&stranger)).await;

    // The chart's metrics-reader rule, bound to a scraper's ServiceAccount.
    let scraper = service_account_token(&world, "scraper").await;
    let rbac: Vec<serde_json::Value> = vec![
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": "autonodes-metrics-reader"},
               "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": "scraper-reads-metrics"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "autonodes-metrics-reader"},
               "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": "default"}]}),
    ];
    for object in rbac {
        let kind = object["kind"].as_str().expect("kind").to_string();
        let api: Api<kube::api::DynamicObject> = Api::all_with(
            world.mgmt.clone(),
            &kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
                "rbac.authorization.k8s.io",
                "v1",
                &kind,
            )),
        );
        api.create(
            &PostParams::default(),
            &serde_json::from_value(object).expect("rbac object"),
        )
        .await
        .expect("rbac");
    }
    let (allowed, body) = common::eventually("the scraper is allowed", WAIT, || {
        let scraper = scraper.clone();
        async move {
            let (status, body) = https_get(port, "/metrics", Some(&scraper)).await;
            (status == 200).then_some((status, body))
        }
    })
    .await;
    let (readyz, _) = https_get(port, "/readyz", None).await;
    println!(
        "/healthz {healthz}, /readyz {readyz} without a token; /metrics: no token {no_token}, unknown token {bad_token}, a ServiceAccount without the rule {not_allowed}, with it {allowed}"
    );
    assert_eq!(healthz, 200);
    assert!(readyz == 200 || readyz == 503, "{readyz}");
    assert_eq!(no_token, 401);
    assert_eq!(bad_token, 401);
    assert_eq!(not_allowed, 403);
    assert!(body.contains("autonodes_reconcile_total"), "{body}");

    // A flood of distinct bad tokens: the API server reviews a bounded number of them, the
    // rest wait with a 429, and the scraper (decided already) is served throughout.
    let reviews_before = token_reviews(&world).await;
    println!("the management API server answered {reviews_before} TokenReviews so far");
    let started = std::time::Instant::now();
    let flood = futures::future::join_all((0..60).map(|i| async move {
        let token = format!("flood-{i}");
        tokio::time::timeout(
            Duration::from_secs(30),
            https_get(port, "/metrics", Some(&token)),
        )
        .await
        .map_or(0, |(status, _)| status)
    }))
    .await;
    let elapsed = started.elapsed().as_secs_f64();
    let (scraped, _) = https_get(port, "/metrics", Some(&scraper)).await;
    let reviewed = token_reviews(&world).await - reviews_before;
    let unauthorized = flood.iter().filter(|s| **s == 401).count();
    let throttled = flood.iter().filter(|s| **s == 429).count();
    let bound = f64::from(autonodes::metrics_auth::REVIEW_BURST)
        + f64::from(autonodes::metrics_auth::REVIEWS_PER_SECOND) * (elapsed + 1.0);
    println!(
        "60 distinct bad tokens in {elapsed:.1}s: {unauthorized} reviewed (401), {throttled} throttled (429); the API server made {reviewed} TokenReviews (bound {bound:.0}); the scraper meanwhile {scraped}"
    );
    // Every one is refused; on a loaded machine a few may find the API server unable to
    // review (503) or time out here (0), which costs no review either.
    assert!(flood.iter().all(|s| *s != 200), "{flood:?}");
    assert!(unauthorized + throttled >= 50, "{flood:?}");
    assert!(
        f64::from(u32::try_from(reviewed).unwrap_or(u32::MAX)) <= bound,
        "{reviewed} > {bound}"
    );
    assert!(f64::from(u32::try_from(unauthorized).unwrap_or(u32::MAX)) <= bound);
    if bound < 60.0 {
        assert!(throttled > 0, "{flood:?}");
    }
    assert_eq!(scraped, 200);
}

/// The TokenReviews the management API server has answered, from its own metrics.
async fn token_reviews(world: &World) -> u64 {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("request");
    let text = world
        .mgmt
        .request_text(request)
        .await
        .expect("the management API server's metrics");
    text.lines()
        .filter(|l| {
            l.starts_with("apiserver_request_total{") && l.contains("resource=\"tokenreviews\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

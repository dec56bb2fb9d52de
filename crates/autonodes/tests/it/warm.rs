//! Warm VMs (issue 38) on real API servers: a node type keeps warm VMs on its host; a
//! claim takes a ready one, writes its binding, and the VM's agent (simulated, with the
//! VM's own token against the real host API server and its RBAC) joins the tenant with it;
//! the binding and the VM's credential are gone once the Node joined; the type refills, is
//! replaced when it drifts, and `replicas: 0` removes what is warm. What a warm VM's token
//! can read is checked on the host's real authorizer.

use crate::common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use autonodes_api::{
    NodeClaim, NodeType, ANNOTATION_WARM_CREDENTIAL_EXPIRES, LABEL_WARM_NODEPOOL,
    LABEL_WARM_NODETYPE, LABEL_WARM_VM,
};
use autonodes_core::userdata::warm::{read_warm_agent, WarmAgent};
use autonodes_testenv::simulator::warm_agent::agent_client;
use common::pools::*;
use common::world::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::ResourceExt;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(90);
const VMS: &str = "vcluster-platform";
/// How long a simulated guest takes to boot in the first test.
const BOOT: Duration = Duration::from_secs(8);

/// The provider `pools` with `warm` (2 warm VMs) and `cold` (none).
fn provider(warm_replicas: i32, warm_label: Option<&str>) -> String {
    let mut warm = format!(
        "{}\n        warm:\n          replicas: {warm_replicas}",
        node_type("warm", "2", "4Gi")
    );
    if let Some(v) = warm_label {
        warm.push_str(&format!(
            "\n        properties:\n          example.com/revision: \"{v}\""
        ));
    }
    pools_provider(&[warm, node_type("cold", "2", "4Gi")])
}

fn warm_status(t: &NodeType) -> (i64, i64) {
    t.status
        .as_ref()
        .and_then(|s| s.warm.as_ref())
        .map_or((0, 0), |w| (w.current, w.ready))
}

/// The unbound warm VMs' names on the host.
async fn warm_vms(world: &World) -> BTreeSet<String> {
    world
        .vms()
        .await
        .iter()
        .filter(|vm| vm.labels().contains_key(LABEL_WARM_NODETYPE))
        .map(|vm| vm.name_any())
        .collect()
}

/// The agent configuration of the warm VM `vm`, from its user data.
async fn agent_of(world: &World, vm: &str) -> WarmAgent {
    let secret = Api::<Secret>::namespaced(world.host.clone(), VMS)
        .get(&format!("{vm}-userdata"))
        .await
        .expect("user-data Secret");
    let text = String::from_utf8(secret.data.expect("data")["userdata"].0.clone()).expect("utf-8");
    read_warm_agent(&text).expect("a warm VM's user data")
}

fn status_code(r: Result<impl Sized, kube::Error>) -> u16 {
    match r {
        Ok(_) => 200,
        Err(kube::Error::Api(s)) => s.code,
        Err(e) => panic!("unexpected error: {e}"),
    }
}

/// Objects made for warm VMs still on the host, by kind.
async fn warm_leftovers(world: &World, vms: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    let by_vm = ListParams::default().labels(LABEL_WARM_VM);
    let keep =
        |name: String, vm: Option<&String>| vm.is_some_and(|v| vms.contains(v)).then_some(name);
    for sa in Api::<ServiceAccount>::namespaced(world.host.clone(), VMS)
        .list(&by_vm)
        .await
        .expect("list")
        .items
    {
        out.extend(keep(
            format!("ServiceAccount/{}", sa.name_any()),
            sa.labels().get(LABEL_WARM_VM),
        ));
    }
    for r in Api::<Role>::namespaced(world.host.clone(), VMS)
        .list(&by_vm)
        .await
        .expect("list")
        .items
    {
        out.extend(keep(
            format!("Role/{}", r.name_any()),
            r.labels().get(LABEL_WARM_VM),
        ));
    }
    for r in Api::<RoleBinding>::namespaced(world.host.clone(), VMS)
        .list(&by_vm)
        .await
        .expect("list")
        .items
    {
        out.extend(keep(
            format!("RoleBinding/{}", r.name_any()),
            r.labels().get(LABEL_WARM_VM),
        ));
    }
    for l in Api::<Lease>::namespaced(world.host.clone(), VMS)
        .list(&by_vm)
        .await
        .expect("list")
        .items
    {
        out.extend(keep(
            format!("Lease/{}", l.name_any()),
            l.labels().get(LABEL_WARM_VM),
        ));
    }
    for s in Api::<Secret>::namespaced(world.host.clone(), VMS)
        .list(&by_vm)
        .await
        .expect("list")
        .items
    {
        out.extend(keep(
            format!("Secret/{}", s.name_any()),
            s.labels().get(LABEL_WARM_VM),
        ));
    }
    out
}

/// Waits until nothing made for the warm VMs `vms` is left on the host.
async fn assert_no_leftovers(world: &World, vms: &BTreeSet<String>) {
    let start = Instant::now();
    loop {
        let left = warm_leftovers(world, vms).await;
        if left.is_empty() {
            return;
        }
        assert!(start.elapsed() < WAIT, "left on the host: {left:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn wait_warm(world: &World, what: &str, pred: impl Fn(&NodeType) -> bool) -> NodeType {
    world.wait_node_type("pools.warm", what, pred).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_takes_a_ready_warm_vm_that_joins_from_its_binding_and_the_type_refills_drifts_and_scales_to_zero(
) {
    // Guests boot 8 s after their VM starts, so a cold claim waits for that and a warm one
    // does not.
    let world = World::start(WorldOptions {
        provider: provider(2, None),
        mode: autonodes_testenv::simulator::SimMode::SlowBoot(BOOT),
        ..WorldOptions::default()
    })
    .await;
    let t = wait_warm(&world, "2 warm VMs ready", |t| warm_status(t) == (2, 2)).await;
    let (warm_ready, reason, _) = find_condition(
        t.status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default(),
        "WarmReady",
    )
    .expect("WarmReady");
    assert_eq!(
        (warm_ready.as_str(), reason.as_str()),
        ("True", "WarmReady")
    );
    let before = warm_vms(&world).await;
    assert_eq!(before.len(), 2, "{before:?}");
    let names: Vec<&String> = before.iter().collect();

    // Each warm VM records when the host says its token expires (asked for 24 h).
    for vm in world
        .vms()
        .await
        .into_iter()
        .filter(|v| before.contains(&v.name_any()))
    {
        let expires: k8s_openapi::jiff::Timestamp = vm
            .annotations()
            .get(ANNOTATION_WARM_CREDENTIAL_EXPIRES)
            .and_then(|t| t.parse().ok())
            .expect("the credential's expiry, recorded");
        let hours = k8s_openapi::jiff::Timestamp::now()
            .duration_until(expires)
            .as_secs_f64()
            / 3600.0;
        assert!((23.0..=24.1).contains(&hours), "{hours} h left");
    }

    // What a controller killed right after making a warm VM's Lease (the first of its
    // credential) leaves: that Lease alone, no ServiceAccount, no VM. It is swept once it is
    // old enough, with the rest of what warm VMs that are gone left.
    let host_leases: Api<Lease> = Api::namespaced(world.host.clone(), VMS);
    let model = host_leases
        .get(&format!("{}-warm", names[0]))
        .await
        .expect("a warm VM's Lease");
    let cut_short = "warm-cut-short".to_string();
    let mut labels = model.labels().clone();
    labels.insert(LABEL_WARM_VM.to_string(), cut_short.clone());
    host_leases
        .create(
            &kube::api::PostParams::default(),
            &Lease {
                metadata: kube::api::ObjectMeta {
                    name: Some(format!("{cut_short}-warm")),
                    labels: Some(labels),
                    ..Default::default()
                },
                ..Lease::default()
            },
        )
        .await
        .expect("a Lease left alone");

    // What a warm VM's own token may do on the host: its binding (not written yet: 404, so
    // authorized) and its Lease; nothing of the other warm VM, nothing else.
    let a = agent_of(&world, names[0]).await;
    let b = agent_of(&world, names[1]).await;
    let as_a = agent_client(&a).await.expect("client");
    let secrets: Api<Secret> = Api::namespaced(as_a.clone(), VMS);
    let leases: Api<Lease> = Api::namespaced(as_a.clone(), VMS);
    assert_eq!(
        status_code(secrets.get(&a.binding).await),
        404,
        "its own binding"
    );
    assert_eq!(
        status_code(leases.get(&a.lease).await),
        200,
        "its own Lease"
    );
    assert_eq!(
        status_code(secrets.get(&b.binding).await),
        403,
        "another VM's binding"
    );
    assert_eq!(
        status_code(leases.get(&b.lease).await),
        403,
        "another VM's Lease"
    );
    assert_eq!(
        status_code(secrets.get(&format!("{}-userdata", names[0])).await),
        403,
        "its own user data"
    );
    assert_eq!(
        status_code(secrets.list(&ListParams::default()).await),
        403,
        "listing Secrets"
    );
    let accounts: Api<ServiceAccount> = Api::namespaced(as_a.clone(), VMS);
    assert_eq!(
        status_code(accounts.delete(&b.lease, &Default::default()).await),
        403,
        "deleting another VM's ServiceAccount"
    );
    assert_eq!(
        status_code(accounts.get(&a.lease).await),
        403,
        "reading even its own ServiceAccount"
    );
    let tenant_nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(as_a.clone());
    assert_eq!(
        status_code(tenant_nodes.list(&ListParams::default()).await),
        403,
        "the host's Nodes"
    );

    // A warm VM may write its own Lease, labels included: it claims to be the other VM,
    // with a renewal a day ahead. Heartbeats are read by the Lease's name and count from
    // when the controller sees them, so through two settled reconciles (every 10 s) both
    // VMs stay ready on their own agents' heartbeats; another VM's Lease stays closed.
    let ahead = k8s_openapi::jiff::Timestamp::now()
        .checked_add(k8s_openapi::jiff::SignedDuration::from_hours(24))
        .expect("a day ahead");
    let forged = json!({
        "metadata": {"labels": {LABEL_WARM_VM: names[1]}},
        "spec": {
            "holderIdentity": names[1],
            "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(ahead),
        },
    });
    assert_eq!(
        status_code(
            leases
                .patch(&a.lease, &PatchParams::default(), &Patch::Merge(&forged))
                .await
        ),
        200,
        "its own Lease, labels included"
    );
    assert_eq!(
        status_code(
            leases
                .patch(&b.lease, &PatchParams::default(), &Patch::Merge(&forged))
                .await
        ),
        403,
        "another VM's Lease"
    );
    let until = Instant::now() + Duration::from_secs(25);
    while Instant::now() < until {
        let t = world.node_type("pools.warm").await;
        assert_eq!(
            warm_status(&t),
            (2, 2),
            "a forged Lease changes no VM's readiness: {:?}",
            t.status
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    // A claim of the type takes the oldest ready warm VM; a claim of `cold` makes its VM.
    let start = Instant::now();
    world.claim_type("fast", "warm").await;
    let fast = world.wait_phase("fast", "Available", WAIT).await;
    let warm_took = start.elapsed();
    let start = Instant::now();
    world.claim_type("slow", "cold").await;
    world.wait_phase("slow", "Available", WAIT).await;
    let cold_took = start.elapsed();
    let status = fast.status.clone().expect("status");
    let vm = status.vm_name.clone().expect("vmName");
    assert!(before.contains(&vm), "{vm} was warm: {before:?}");
    assert!(status.warm.is_some(), "status.warm set");
    // The warm claim's VM booted before the claim existed: the claim waited for no boot.
    let vm_made = world
        .vms()
        .await
        .into_iter()
        .find(|v| v.name_any() == status.vm_name.clone().unwrap_or_default())
        .and_then(|v| v.metadata.creation_timestamp)
        .expect("the claim's VM");
    let claim_made = fast.metadata.creation_timestamp.clone().expect("created");
    assert!(
        vm_made.0 < claim_made.0,
        "VM made {vm_made:?}, claim {claim_made:?}"
    );
    let node = world
        .nodes()
        .await
        .into_iter()
        .find(|n| n.name_any() == vm)
        .expect("the warm VM joined as a Node named after it");
    assert_eq!(
        node.spec.and_then(|s| s.provider_id),
        Some(format!("kubevirt://{vm}"))
    );
    assert_eq!(
        node.metadata
            .labels
            .unwrap_or_default()
            .get("autonodes.io/nodeclaim")
            .map(String::as_str),
        Some("fast"),
        "the claim's labels, given at bind time"
    );

    // Once bound, the agent revoked its own token (it deleted its ServiceAccount, with the
    // token itself); once joined, the binding and the rest of the credential are gone.
    let released = world
        .wait_claim("fast", "the warm binding released", WAIT, |c| {
            c.status
                .as_ref()
                .and_then(|s| s.warm.as_ref())
                .is_some_and(|w| w.released)
        })
        .await;
    assert!(released.status.is_some());
    let taken = agent_of(&world, &vm).await;
    let host_secrets: Api<Secret> = Api::namespaced(world.host.clone(), VMS);
    assert!(
        host_secrets
            .get_opt(&taken.binding)
            .await
            .expect("get")
            .is_none(),
        "binding deleted"
    );
    let as_taken = agent_client(&taken).await.expect("client");
    let leases_as_taken: Api<Lease> = Api::namespaced(as_taken, VMS);
    assert_ne!(
        status_code(leases_as_taken.get(&taken.lease).await),
        200,
        "the taken VM's token reads nothing"
    );
    // Its ServiceAccount is gone: once the API server's token cache (10 s) forgets it, the
    // token does not even authenticate.
    common::eventually(
        "the taken VM's token refused",
        Duration::from_secs(40),
        || async { (status_code(leases_as_taken.get(&taken.lease).await) == 401).then_some(()) },
    )
    .await;

    // The type refills: two warm VMs again, neither the taken one.
    wait_warm(&world, "refilled", |t| warm_status(t) == (2, 2)).await;
    let refilled = warm_vms(&world).await;
    assert!(
        !refilled.contains(&vm) && refilled.len() == 2,
        "{refilled:?}"
    );
    println!(
        "warm: claim Available after {:.1} s on warm VM {vm}; cold claim Available after {:.1} s; refilled to {} warm VMs",
        warm_took.as_secs_f64(),
        cold_took.as_secs_f64(),
        refilled.len()
    );

    // The type drifts (a new property): its warm VMs are replaced; the claim's VM stays.
    world.apply_provider(&provider(2, Some("2"))).await;
    wait_warm(&world, "replaced after drift", |t| warm_status(t) == (2, 2)).await;
    let drifted = common::eventually("the drifted warm VMs gone", WAIT, || async {
        let now = warm_vms(&world).await;
        (now.len() == 2 && now.is_disjoint(&refilled)).then_some(now)
    })
    .await;
    assert!(
        world.vms().await.iter().any(|v| v.name_any() == vm),
        "the claim's VM is not warm any more"
    );

    // replicas: 0 removes the warm VMs and everything made for them.
    world.apply_provider(&provider(0, Some("2"))).await;
    common::eventually("no warm VMs", WAIT, || async {
        warm_vms(&world).await.is_empty().then_some(())
    })
    .await;
    let t = wait_warm(&world, "no warm VMs and no WarmReady", |t| {
        let conditions = t
            .status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default();
        warm_status(t) == (0, 0) && find_condition(conditions, "WarmReady").is_none()
    })
    .await;
    let shown = t
        .status
        .and_then(|s| s.warm)
        .expect("status.warm kept, as zeros");
    assert_eq!(
        (shown.replicas, shown.current, shown.cost, shown.bound),
        (0, 0, 0, 1)
    );
    let mut all: BTreeSet<String> = before.clone();
    all.extend(refilled);
    all.extend(drifted);
    // (The taken VM is the claim's now: its user data stays with it.)
    all.insert(cut_short);
    let unbound: BTreeSet<String> = all.iter().filter(|v| **v != vm).cloned().collect();
    assert_no_leftovers(&world, &unbound).await;

    // What the provider entry drops (here the property), its NodeType drops too, though the
    // controller wrote the type's status in between (API servers before 1.22 keep one field
    // set per manager for both).
    world.apply_provider(&provider(0, None)).await;
    wait_warm(&world, "the dropped property gone from the type", |t| {
        !t.spec.properties.contains_key("example.com/revision")
    })
    .await;
    // So does what somebody else wrote into the generated type (a field another manager
    // owns, which the controller's apply leaves alone): the controller patches it away.
    Api::<NodeType>::all(world.mgmt.clone())
        .patch(
            "pools.warm",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"properties": {"example.com/edited": "yes"}}})),
        )
        .await
        .expect("type edited");
    wait_warm(&world, "the edit undone", |t| {
        !t.spec.properties.contains_key("example.com/edited")
    })
    .await;

    // The claim goes: its VM (once warm) and everything of it go too.
    world.delete_claim("fast").await;
    world.delete_claim("slow").await;
    world.wait_claim_gone("fast", WAIT).await;
    world.wait_claim_gone("slow", WAIT).await;
    assert!(world.vms().await.is_empty(), "no VM left");
    assert!(world.host_secrets().await.is_empty(), "no Secret left");
    assert_no_leftovers(&world, &all).await;
    println!("warm: drift replaced both warm VMs, replicas 0 removed them, nothing left");
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn where_warm_vms_cannot_reach_the_host_api_server_they_never_get_ready_and_claims_are_served_cold(
) {
    // The VMs are told a host API server nothing listens at: their agents never report.
    let unreachable = provider(1, None).replace(
        "    clusterRef:",
        "    guestApiServer: https://127.0.0.1:1\n    clusterRef:",
    );
    let world = World::with_provider(unreachable).await;
    let t = wait_warm(&world, "a warm VM made, not ready", |t| {
        warm_status(t) == (1, 0)
    })
    .await;
    let (status, reason, message) = find_condition(
        t.status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default(),
        "WarmReady",
    )
    .expect("WarmReady");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "WarmStarting")
    );
    assert!(message.contains("https://127.0.0.1:1"), "{message}");
    // The simulated agent reports on its VM why it cannot reach the host.
    let host_events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(world.host.clone(), VMS);
    let failure = common::eventually("the agent's failure reported", WAIT, || async {
        let vms = warm_vms(&world).await;
        host_events
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("WarmAgentFailed")
                    && e.regarding
                        .as_ref()
                        .and_then(|r| r.name.as_ref())
                        .is_some_and(|n| vms.contains(n))
            })
            .and_then(|e| e.note)
    })
    .await;
    println!("warm: WarmReady=False: {message}; the VM's agent: {failure}");
    world.claim_type("c", "warm").await;
    let c: NodeClaim = world.wait_phase("c", "Available", WAIT).await;
    let vm = c
        .status
        .as_ref()
        .and_then(|s| s.vm_name.clone())
        .expect("vmName");
    assert!(
        c.status.as_ref().is_some_and(|s| s.warm.is_none()),
        "served cold"
    );
    assert!(!vm.starts_with("warm-"), "{vm}");
    world.delete_claim("c").await;
    world.wait_claim_gone("c", WAIT).await;
    world.shutdown().await;
}

/// Every warm VM's binding written on the host from now on, by name, as first seen (a
/// binding lives only until its Node joined, so it is watched rather than read after).
fn record_bindings(
    world: &World,
) -> (
    tokio::task::JoinHandle<()>,
    std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<String, Secret>>>,
) {
    use futures::StreamExt;
    use kube::runtime::{watcher, WatchStreamExt};
    let seen = std::sync::Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::new()));
    let api: Api<Secret> = Api::namespaced(world.host.clone(), VMS);
    let into = seen.clone();
    let task = tokio::spawn(async move {
        let mut events = watcher(api, watcher::Config::default().labels(LABEL_WARM_VM))
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(event) = events.next().await {
            if let Ok(secret) = event {
                if secret.name_any().ends_with("-binding") {
                    into.lock()
                        .expect("lock")
                        .entry(secret.name_any())
                        .or_insert(secret);
                }
            }
        }
    });
    (task, seen)
}

/// The warm VMs kept for the pool with UID `uid`, unbound, by name.
async fn pool_warm_vms(world: &World, uid: &str) -> BTreeSet<String> {
    world
        .vms()
        .await
        .iter()
        .filter(|vm| vm.labels().get(LABEL_WARM_NODEPOOL).map(String::as_str) == Some(uid))
        .map(|vm| vm.name_any())
        .collect()
}

fn pool_warm(p: &autonodes_api::NodePool) -> Option<(Option<String>, i64, i64, i64)> {
    p.status
        .as_ref()
        .and_then(|s| s.warm.as_ref())
        .map(|w| (w.node_type.clone(), w.replicas, w.current, w.ready))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pools_warm_vms_boot_with_its_properties_serve_only_its_claims_fit_its_namespaces_quota_and_go_with_it(
) {
    // The type `warm` keeps none of its own here: every warm VM is the pool's.
    let mut world = World::with_provider(provider(0, None)).await;
    world
        .create_node_quota(
            "team",
            json!({"namespaces": [NS], "limits": {"nodes": "3"}}),
        )
        .await;
    // A claim of the type by hand, not of the pool: it holds one of the namespace's 3 nodes.
    world.claim_type("solo", "warm").await;
    world.wait_phase("solo", "Available", WAIT).await;

    let key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPoolWarmKey pool@example";
    let pool = world
        .create_pool(
            "team",
            json!({
                "replicas": 0,
                "requirements": [{"key": "autonodes.io/node-type", "operator": "In", "values": ["warm"]}],
                "properties": {"autonodes.io/ssh-keys": key},
                "warm": {"replicas": 3},
            }),
        )
        .await;
    let uid = pool.uid().expect("uid");
    // 3 asked; the quota's 3 nodes less the hand-made claim leave 2.
    let p = world
        .wait_pool("team", "2 warm VMs ready", |p| {
            pool_warm(p) == Some((Some("pools.warm".into()), 2, 2, 2))
        })
        .await;
    let (status, reason, message) = pool_condition(&p, "WarmReady").expect("WarmReady");
    assert_eq!((status.as_str(), reason.as_str()), ("False", "WarmLimited"));
    assert!(
        message.contains("2 of 3 warm VM(s): NodeQuota team limits namespace tenant to 3 nodes"),
        "{message}"
    );
    let kept = pool_warm_vms(&world, &uid).await;
    assert_eq!(kept.len(), 2, "{kept:?}");
    // They boot without the pool's SSH key: nobody of the tenant's can log in to a VM that
    // holds a host credential. The key comes with the binding.
    for vm in &kept {
        let secret = Api::<Secret>::namespaced(world.host.clone(), VMS)
            .get(&format!("{vm}-userdata"))
            .await
            .expect("user-data Secret");
        let text =
            String::from_utf8(secret.data.expect("data")["userdata"].0.clone()).expect("utf-8");
        assert!(
            text.contains("autonodes-warm"),
            "{vm}: a warm VM's user data"
        );
        assert!(
            !text.contains("AAAAIPoolWarmKey"),
            "{vm}: not the pool's key"
        );
    }
    // The type shows them apart from its own.
    let t = wait_warm(&world, "the pool's warm VMs shown", |t| {
        t.status
            .as_ref()
            .and_then(|s| s.warm.as_ref())
            .is_some_and(|w| w.pools == 2)
    })
    .await;
    let shown = t.status.and_then(|s| s.warm).expect("status.warm");
    assert_eq!((shown.current, shown.replicas), (0, 0));

    // Another claim of the type, not of the pool, is served cold.
    world.claim_type("other", "warm").await;
    let other = world.wait_phase("other", "Available", WAIT).await;
    assert!(
        other.status.as_ref().is_some_and(|s| s.warm.is_none()),
        "not served by the pool's warm VMs"
    );
    world.delete_claim("other").await;
    world.wait_claim_gone("other", WAIT).await;
    // (While it lived it held one of the namespace's nodes, and the pool kept one warm VM
    // fewer.)
    world
        .wait_pool("team", "2 warm VMs ready again", |p| {
            pool_warm(p) == Some((Some("pools.warm".into()), 2, 2, 2))
        })
        .await;
    let kept = pool_warm_vms(&world, &uid).await;

    // The pool's claim takes one; the namespace then holds 2 claims, so 1 warm VM stays.
    let (watching, bindings) = record_bindings(&world);
    tokio::time::sleep(Duration::from_secs(1)).await;
    patch_pool_spec(&world, "team", json!({"replicas": 1})).await;
    let claim = common::eventually("the pool's claim Available", WAIT, || async {
        pool_claims(&world, "team")
            .await
            .into_iter()
            .find(available)
    })
    .await;
    let status = claim.status.clone().expect("status");
    let vm = status.vm_name.clone().expect("vmName");
    assert!(kept.contains(&vm), "{vm} was the pool's: {kept:?}");
    assert!(status.warm.is_some(), "served warm");
    // Its binding carried the pool's key, for cloud-init to apply once the VM revoked its
    // credential; the simulated agent revoked it with the VM's own token (its Role's one
    // deletion), so the ServiceAccount was gone before the Node joined.
    let binding = bindings
        .lock()
        .expect("lock")
        .get(&format!("{vm}-binding"))
        .cloned()
        .expect("the taken VM's binding, seen");
    watching.abort();
    let user_data = binding
        .data
        .as_ref()
        .and_then(|d| d.get(autonodes_core::warm::BINDING_USER_DATA_KEY))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .expect("the pool's user data in the binding");
    let config: serde_json::Value = serde_json::from_str(&user_data).expect("JSON");
    assert_eq!(config["ssh_authorized_keys"], json!([key]), "{user_data}");
    println!("warm pool: the binding of {vm} carried the pool's key: {user_data}");
    let p = world
        .wait_pool("team", "1 warm VM left", |p| {
            pool_warm(p) == Some((Some("pools.warm".into()), 1, 1, 1))
        })
        .await;
    let (_, reason, message) = pool_condition(&p, "WarmReady").expect("WarmReady");
    assert_eq!(reason, "WarmLimited", "{message}");
    assert_eq!(pool_warm_vms(&world, &uid).await.len(), 1);

    // replicas: 0 removes the pool's warm VMs, and its status says nothing of them.
    patch_pool_spec(&world, "team", json!({"warm": {"replicas": 0}})).await;
    world
        .wait_pool("team", "no warm VMs", |p| {
            pool_warm(p).is_none() && pool_condition(p, "WarmReady").is_none()
        })
        .await;
    assert!(pool_warm_vms(&world, &uid).await.is_empty());

    // Turned off while no controller ran: the next one removes them all the same.
    patch_pool_spec(&world, "team", json!({"warm": {"replicas": 1}})).await;
    world
        .wait_pool("team", "a warm VM again", |p| {
            pool_warm(p).is_some_and(|w| w.2 == 1)
        })
        .await;
    world.stop_controller().await;
    patch_pool_spec(&world, "team", json!({"warm": {"replicas": 0}})).await;
    world.start_controller();
    common::eventually(
        "the warm VM turned off while no controller ran gone",
        WAIT,
        || async { pool_warm_vms(&world, &uid).await.is_empty().then_some(()) },
    )
    .await;

    // A pool deleted with warm VMs: they go with it.
    patch_pool_spec(
        &world,
        "team",
        json!({"replicas": 0, "warm": {"replicas": 1}}),
    )
    .await;
    world
        .wait_pool("team", "a warm VM again", |p| {
            pool_warm(p).is_some_and(|w| w.2 == 1)
        })
        .await;
    let last = pool_warm_vms(&world, &uid).await;
    world
        .pools()
        .delete("team", &Default::default())
        .await
        .expect("pool deleted");
    common::eventually("the deleted pool's warm VM gone", WAIT, || async {
        pool_warm_vms(&world, &uid).await.is_empty().then_some(())
    })
    .await;
    assert_no_leftovers(&world, &last).await;
    for c in pool_claims(&world, "team").await {
        world.delete_claim(&c.name_any()).await;
        world.wait_claim_gone(&c.name_any(), WAIT).await;
    }
    world.delete_claim("solo").await;
    world.wait_claim_gone("solo", WAIT).await;
    assert!(world.vms().await.is_empty(), "no VM left");
    println!(
        "warm: the pool's warm VMs: 2 of 3 under the quota, {vm} taken by its claim, the rest removed with replicas 0 and with the pool"
    );
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_taking_the_last_room_under_max_capacity_is_served_by_the_warm_vm_holding_it() {
    let one = format!(
        "{}\n        maxCapacity: 1\n        warm:\n          replicas: 1",
        node_type("warm", "2", "4Gi")
    );
    let world = World::with_provider(pools_provider(&[one])).await;
    wait_warm(&world, "1 warm VM ready", |t| warm_status(t) == (1, 1)).await;
    let before = warm_vms(&world).await;
    // The claim takes the type's only room, which the warm VM holds: the warm VM is not
    // removed to make room for the claim that is about to take it.
    world.claim_type("last", "warm").await;
    let c = world.wait_phase("last", "Available", WAIT).await;
    let status = c.status.expect("status");
    let vm = status.vm_name.expect("vmName");
    assert!(
        status.warm.is_some() && before.contains(&vm),
        "{vm} was warm: {before:?}"
    );
    // No room is left for a refill.
    let t = wait_warm(&world, "no room for a warm VM", |t| {
        t.status
            .as_ref()
            .and_then(|s| s.warm.as_ref())
            .is_some_and(|w| (w.replicas, w.current) == (0, 0))
    })
    .await;
    assert!(warm_vms(&world).await.is_empty());
    println!(
        "warm: the type's last room went to {vm}, its warm VM; status.warm {:?}",
        t.status.and_then(|s| s.warm)
    );
    world.delete_claim("last").await;
    world.wait_claim_gone("last", WAIT).await;
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pools_warm_vms_get_the_room_under_max_capacity_that_the_types_own_leave() {
    // The type has room for 2 VMs and keeps 1 warm VM of its own; the pool asks for 2.
    let capped = |own: i32| {
        pools_provider(&[format!(
            "{}\n        maxCapacity: 2\n        warm:\n          replicas: {own}",
            node_type("warm", "2", "4Gi")
        )])
    };
    let world = World::with_provider(capped(1)).await;
    wait_warm(&world, "the type's own warm VM ready", |t| {
        warm_status(t) == (1, 1)
    })
    .await;
    let pool = world
        .create_pool(
            "capped",
            json!({
                "replicas": 0,
                "requirements": [{"key": "autonodes.io/node-type", "operator": "In", "values": ["warm"]}],
                "warm": {"replicas": 2},
            }),
        )
        .await;
    let uid = pool.uid().expect("uid");
    // The type's own come first: 1 room is left for the pool's.
    let p = world
        .wait_pool("capped", "1 of 2 warm VMs", |p| {
            pool_warm(p) == Some((Some("pools.warm".into()), 1, 1, 1))
        })
        .await;
    let (status, reason, message) = pool_condition(&p, "WarmReady").expect("WarmReady");
    assert_eq!((status.as_str(), reason.as_str()), ("False", "WarmLimited"));
    assert!(
        message
            .contains("1 of 2 warm VM(s): node type pools.warm's maxCapacity leaves no more room"),
        "{message}"
    );
    assert_eq!(pool_warm_vms(&world, &uid).await.len(), 1);
    let t = wait_warm(&world, "the type shows both groups", |t| {
        t.status
            .as_ref()
            .and_then(|s| s.warm.as_ref())
            .is_some_and(|w| (w.current, w.pools) == (1, 1))
    })
    .await;
    println!(
        "warm: under maxCapacity 2, the type keeps its own and the pool 1 of 2: {:?}; pool: {message}",
        t.status.and_then(|s| s.warm)
    );

    // The type keeps none of its own any more: the pool gets the room.
    world.apply_provider(&capped(0)).await;
    let p = world
        .wait_pool("capped", "2 of 2 warm VMs", |p| {
            pool_warm(p) == Some((Some("pools.warm".into()), 2, 2, 2))
        })
        .await;
    let (status, reason, _) = pool_condition(&p, "WarmReady").expect("WarmReady");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "WarmReady"));
    let kept = pool_warm_vms(&world, &uid).await;
    assert_eq!(kept.len(), 2, "{kept:?}");
    wait_warm(&world, "the type keeps none of its own", |t| {
        t.status
            .as_ref()
            .and_then(|s| s.warm.as_ref())
            .is_some_and(|w| (w.current, w.pools) == (0, 2))
    })
    .await;

    world
        .pools()
        .delete("capped", &Default::default())
        .await
        .expect("pool deleted");
    common::eventually("the pool's warm VMs gone", WAIT, || async {
        pool_warm_vms(&world, &uid).await.is_empty().then_some(())
    })
    .await;
    assert_no_leftovers(&world, &kept).await;
    assert!(world.vms().await.is_empty(), "no VM left");
    world.shutdown().await;
}

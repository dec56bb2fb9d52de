//! Tenants shared among replicas (`--shard-tenants`), with the real binary on real API
//! servers: three replicas and thirty tenant namespaces (each with its own identity on one
//! tenant kube-apiserver). Every tenant's claims turn Available, each namespace is served
//! by exactly one replica (its owner metric and the replica that created its VMs), the
//! leader is killed with SIGKILL and its namespaces are served by the others within the
//! Lease duration + 30 s (the claims made and deleted there meanwhile are served), and at
//! every step each claim has exactly one VM, user-data Secret and Node and at most one
//! token. Then three random replicas are SIGKILLed at random moments while claims are made
//! and deleted everywhere, each replaced by a new one; a type with room for fewer claims
//! than there are tenants is never held by more than its room throughout. Once the claims
//! are deleted nothing of them is left.

use crate::common;
use crate::opscommon;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use autonodes_api::{NodeClaim, NodeClaimPhase, LABEL_NODECLAIM_UID};
use autonodes_testenv::playground::put_kubeconfig_secret;
use autonodes_testenv::simulator::SimMode;
use autonodes_testenv::testenv::client_cert_kubeconfig;
use common::world::*;
use common::{eventually, path_str};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::ResourceExt;
use opscommon::{http_get, spawn_controller, Proc};

const TENANTS: usize = 30;
const CLAIMS_PER_TENANT: usize = 2;
const LEASE_SECONDS: u64 = 10;
const TYPE: &str = "tenants.small";
/// A type with room for fewer claims than there are tenants.
const CAPPED: &str = "tenants.capped";
const CAPPED_MAX: usize = 12;

fn tenant_ns(i: usize) -> String {
    format!("shard-{i:02}")
}

fn claim(ns: &str, name: &str) -> NodeClaim {
    claim_of(ns, name, TYPE)
}

fn claim_of(ns: &str, name: &str, type_: &str) -> NodeClaim {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "autonodes.io/v1alpha1", "kind": "NodeClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"vClusterRef": {"name": "tenant"}, "typeRef": type_},
    }))
    .expect("a claim")
}

fn type_of(c: &NodeClaim) -> Option<&str> {
    c.status.as_ref()?.type_ref.as_deref()
}

/// The replica (POD_NAME) of a member or holder identity: `replica-a-1a2b…` or
/// `replica-a_1a2b…`.
fn replica_of(identity: &str) -> String {
    identity.chars().take("replica-a".len()).collect()
}

async fn scrape(p: &Proc) -> String {
    http_get(p.metrics_addr().await, "/metrics")
        .await
        .map(|(_, s)| s)
        .unwrap_or_default()
}

/// The namespaces each replica says it acts for (`autonodes_tenant_namespace_owner`).
async fn owners(replicas: &[&Proc]) -> BTreeMap<String, Vec<String>> {
    let mut by_ns: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in replicas {
        let text = scrape(p).await;
        for (labels, value) in
            opscommon::measure::samples(&text, "autonodes_tenant_namespace_owner")
        {
            if value == 1.0 {
                if let Some(ns) = labels.get("namespace") {
                    by_ns.entry(ns.clone()).or_default().push(p.name.clone());
                }
            }
        }
    }
    by_ns
}

/// The namespaces whose claims' VMs each replica created, from its JSON log.
fn created_by(p: &Proc) -> BTreeSet<String> {
    p.log_text()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["fields"]["message"] == "created VirtualMachine")
        .filter_map(|v| v["fields"]["namespace"].as_str().map(str::to_string))
        .collect()
}

async fn all_claims(world: &World) -> Vec<NodeClaim> {
    Api::<NodeClaim>::all(world.mgmt.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

fn available(c: &NodeClaim) -> bool {
    c.status.as_ref().and_then(|s| s.phase) == Some(NodeClaimPhase::Available)
}

/// Each claim has exactly one VM, user-data Secret and Node, and at most one token; and
/// nothing of autonodes belongs to no claim.
async fn one_of_each_per_claim(world: &World) {
    let all = all_claims(world).await;
    // Claims waiting for capacity have nothing yet.
    let claims: BTreeSet<String> = all.iter().filter_map(|c| c.uid()).collect();
    let scheduled: BTreeSet<String> = all
        .iter()
        .filter(|c| type_of(c).is_some())
        .filter_map(|c| c.uid())
        .collect();
    let ObjectsPerClaim {
        vms,
        secrets,
        tokens,
        nodes,
    } = world.objects_per_claim(LABEL_NODECLAIM_UID).await;
    for (what, found, exact) in [
        ("VMs", &vms, true),
        ("user-data Secrets", &secrets, true),
        ("Nodes", &nodes, true),
        ("tokens", &tokens, false),
    ] {
        for (uid, n) in found.iter() {
            assert!(
                claims.contains(uid),
                "{n} {what} of no claim (uid {uid:?}): {found:?}"
            );
            assert!(*n <= 1, "claim {uid}: {n} {what}");
        }
        if exact {
            for uid in &scheduled {
                assert_eq!(found.get(uid), Some(&1), "claim {uid}: {what} {found:?}");
            }
        }
    }
    println!(
        "{} claims ({} scheduled): {} VMs, {} user-data Secrets, {} Nodes, {} tokens",
        claims.len(),
        scheduled.len(),
        vms.values().sum::<usize>(),
        secrets.values().sum::<usize>(),
        nodes.values().sum::<usize>(),
        tokens.values().sum::<usize>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_share_thirty_tenants_each_served_by_one_and_a_killed_leaders_tenants_are_taken_over_within_the_lease_and_thirty_seconds(
) {
    let mut world = World::start_clusters(&WorldOptions {
        provider: provider_yaml(
            "tenants",
            "test-kubevirt-1",
            "1",
            "1Gi",
            "      - name: small\n      - name: capped\n        maxCapacity: 12\n",
        ),
        ..Default::default()
    })
    .await;
    world.start_simulator(SimMode::Normal).await;
    let tenant = world.playground.tenant().expect("tenant");
    for i in 0..TENANTS {
        let (cert, key) = tenant
            .client_certificate(&format!("shard-tenant-{i}"), &["system:masters"])
            .expect("a client certificate");
        let kubeconfig = client_cert_kubeconfig("tenant", &tenant.url, &tenant.ca_pem, &cert, &key);
        put_kubeconfig_secret(
            &world.mgmt,
            &tenant_ns(i),
            "vc-tenant",
            "config",
            &kubeconfig,
        )
        .await
        .expect("the tenant's Secret");
    }

    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = world
        .playground
        .mgmt()
        .expect("mgmt")
        .kubeconfig_path
        .clone();
    let lease = format!("{LEASE_SECONDS}s");
    let args = vec![
        "--kubeconfig",
        path_str(&kubeconfig),
        "--namespace",
        "autonodes-system",
        "--leader-elect",
        "--shard-tenants",
        "--leader-election-lease-duration",
        &lease,
        "--metrics-addr",
        "127.0.0.1:0",
        "--log-format",
        "json",
        "--launch-timeout",
        "300s",
        "--registration-timeout",
        "300s",
    ];
    let mut replicas: Vec<Proc> = ["replica-a", "replica-b", "replica-c"]
        .iter()
        .map(|name| spawn_controller(dir.path(), name, &args))
        .collect();
    for p in &replicas {
        let addr = p.metrics_addr().await;
        eventually(
            &format!("{} ready", p.name),
            Duration::from_secs(90),
            || async move { matches!(http_get(addr, "/readyz").await, Ok((200, _))).then_some(()) },
        )
        .await;
    }

    let started = Instant::now();
    for i in 0..TENANTS {
        let ns = tenant_ns(i);
        for j in 0..CLAIMS_PER_TENANT {
            Api::<NodeClaim>::namespaced(world.mgmt.clone(), &ns)
                .create(&PostParams::default(), &claim(&ns, &format!("c-{j}")))
                .await
                .expect("claim created");
        }
    }
    let total = TENANTS * CLAIMS_PER_TENANT;
    let logs = |replicas: &[Proc]| {
        replicas
            .iter()
            .map(|p| format!("--- {}:\n{}", p.name, p.log_text()))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let up = all_claims(&world)
            .await
            .iter()
            .filter(|c| available(c))
            .count();
        if up == total {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{up} of {total} claims Available after 300 s; logs:\n{}",
            logs(&replicas)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "{total} claims of {TENANTS} tenants Available {:.1}s after they were made",
        started.elapsed().as_secs_f64()
    );

    // Each namespace: exactly one replica says it acts for it, and only that one created
    // its VMs.
    let refs: Vec<&Proc> = replicas.iter().collect();
    let by_ns = owners(&refs).await;
    let creators: BTreeMap<String, BTreeSet<String>> = replicas
        .iter()
        .map(|p| (p.name.clone(), created_by(p)))
        .collect();
    for i in 0..TENANTS {
        let ns = tenant_ns(i);
        let owner = by_ns.get(&ns).cloned().unwrap_or_default();
        assert_eq!(owner.len(), 1, "{ns} is acted for by {owner:?}");
        let made: Vec<&String> = creators
            .iter()
            .filter(|(_, set)| set.contains(&ns))
            .map(|(p, _)| p)
            .collect();
        assert_eq!(
            made,
            vec![&owner[0]],
            "{ns}: VMs created by {made:?}, owner {owner:?}"
        );
    }
    let mut shares: BTreeMap<&str, usize> = BTreeMap::new();
    for o in by_ns.values() {
        *shares.entry(o[0].as_str()).or_default() += 1;
    }
    println!("namespaces per replica: {shares:?}");
    // `autonodes explain` names the replica that acts for a claim's namespace.
    let ns = tenant_ns(0);
    let explained = std::process::Command::new(env!("CARGO_BIN_EXE_autonodes"))
        .args(["explain", "nodeclaim", &format!("{ns}/c-1"), "--kubeconfig"])
        .arg(&kubeconfig)
        .output()
        .expect("autonodes explain runs");
    let text = String::from_utf8_lossy(&explained.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("served by replica"))
        .unwrap_or_else(|| {
            panic!(
                "no `served by` line in:\n{text}{}",
                String::from_utf8_lossy(&explained.stderr)
            )
        });
    println!("$ autonodes explain nodeclaim {ns}/c-1\n  …{}", line.trim());
    let named = line
        .split("served by replica ")
        .nth(1)
        .map(replica_of)
        .unwrap_or_default();
    assert_eq!(vec![named], by_ns[&ns], "{line}");
    assert_eq!(
        shares.len(),
        3,
        "every replica serves some tenants: {shares:?}"
    );
    one_of_each_per_claim(&world).await;

    // Kill the leader: it scheduled every claim and acts for a third of the namespaces.
    let holder = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
        world.mgmt.clone(),
        "autonodes-system",
    )
    .get("autonodes")
    .await
    .ok()
    .and_then(|l| l.spec)
    .and_then(|s| s.holder_identity)
    .expect("a leader");
    let victim = replicas
        .iter()
        .position(|p| p.name == replica_of(&holder))
        .expect("the leader is one of the replicas");
    // The claim gauges count the whole store, which every replica holds: only the leader
    // exports them, so a sum across replicas counts each claim once.
    for (i, p) in replicas.iter().enumerate() {
        let text = scrape(p).await;
        let counted: f64 = opscommon::measure::samples(&text, "autonodes_nodeclaims")
            .iter()
            .map(|(_, v)| v)
            .sum();
        let want = if i == victim { total as f64 } else { 0.0 };
        assert_eq!(counted, want, "{}'s autonodes_nodeclaims", p.name);
    }
    let orphaned: Vec<String> = by_ns
        .iter()
        .filter(|(_, o)| o[0] == replicas[victim].name)
        .map(|(ns, _)| ns.clone())
        .collect();
    println!(
        "killing the leader {} (SIGKILL), which acts for {} namespaces",
        replicas[victim].name,
        orphaned.len()
    );
    // Claims of a type with room for 12, one in each namespace, scheduled while the leader
    // is killed: never more than 12 hold it, whichever replica acts for their namespace.
    for i in 0..TENANTS {
        let ns = tenant_ns(i);
        Api::<NodeClaim>::namespaced(world.mgmt.clone(), &ns)
            .create(&PostParams::default(), &claim_of(&ns, "capped", CAPPED))
            .await
            .expect("claim created");
    }
    let most_capped = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let sampler = {
        let (mgmt, most) = (world.mgmt.clone(), most_capped.clone());
        tokio::spawn(async move {
            loop {
                if let Ok(l) = Api::<NodeClaim>::all(mgmt.clone())
                    .list(&ListParams::default())
                    .await
                {
                    let n = l
                        .items
                        .iter()
                        .filter(|c| type_of(c) == Some(CAPPED))
                        .count();
                    most.fetch_max(n, std::sync::atomic::Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    replicas[victim].signal("KILL");
    let killed = Instant::now();
    let mut dead = replicas.remove(victim);
    assert_eq!(
        dead.wait_exit(Duration::from_secs(10)).await,
        Some(None),
        "killed by a signal"
    );
    // Meanwhile in each of its namespaces one claim is added and one deleted.
    for ns in &orphaned {
        let api = Api::<NodeClaim>::namespaced(world.mgmt.clone(), ns);
        api.create(&PostParams::default(), &claim(ns, "after-kill"))
            .await
            .expect("claim created");
        api.delete("c-0", &DeleteParams::default())
            .await
            .expect("claim deleted");
    }
    let survivors: Vec<&Proc> = replicas.iter().collect();
    let bound = Duration::from_secs(LEASE_SECONDS + 30);
    loop {
        let by_ns = owners(&survivors).await;
        let served = orphaned
            .iter()
            .all(|ns| by_ns.get(ns).is_some_and(|o| o.len() == 1));
        if served {
            break;
        }
        assert!(
            killed.elapsed() < bound,
            "the killed leader's namespaces are not all served {bound:?} after the kill: {by_ns:?}; logs:\n{}",
            logs(&replicas)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let takeover = killed.elapsed();
    println!(
        "the killed leader's {} namespaces served by the others {:.1}s after the kill (lease {LEASE_SECONDS}s)",
        orphaned.len(),
        takeover.as_secs_f64()
    );
    // Served: the new claims turn Available, the deleted ones are cleaned up.
    eventually(
        "the claims made after the kill Available and those deleted gone",
        Duration::from_secs(180),
        || async {
            let now = all_claims(&world).await;
            let done = orphaned.iter().all(|ns| {
                let here: Vec<&NodeClaim> = now
                    .iter()
                    .filter(|c| c.namespace().as_deref() == Some(ns.as_str()))
                    .collect();
                !here.iter().any(|c| c.name_any() == "c-0")
                    && here
                        .iter()
                        .any(|c| c.name_any() == "after-kill" && available(c))
            });
            done.then_some(())
        },
    )
    .await;
    println!(
        "claims made and deleted after the kill served {:.1}s after it",
        killed.elapsed().as_secs_f64()
    );
    let by_ns = owners(&survivors).await;
    for i in 0..TENANTS {
        let ns = tenant_ns(i);
        let o = by_ns.get(&ns).cloned().unwrap_or_default();
        assert_eq!(o.len(), 1, "{ns} acted for by {o:?} after the kill");
    }
    // The capped type: exactly its capacity taken, the other claims told why they wait.
    eventually(
        "the capped type full and its other claims waiting for capacity",
        Duration::from_secs(120),
        || async {
            let now = all_claims(&world).await;
            let capped: Vec<&NodeClaim> = now
                .iter()
                .filter(|c| c.spec.type_ref.as_deref() == Some(CAPPED))
                .collect();
            let held = capped.iter().filter(|c| type_of(c) == Some(CAPPED)).count();
            let waiting = capped
                .iter()
                .filter(|c| condition(c, "Scheduled").is_some_and(|(s, _, _)| s == "False"))
                .count();
            (held == CAPPED_MAX && waiting == TENANTS - CAPPED_MAX).then_some(())
        },
    )
    .await;
    one_of_each_per_claim(&world).await;

    // Chaos: the killed replica comes back as a new member, then three times a random
    // replica is SIGKILLed at a random moment while claims are made and deleted in every
    // namespace, and a new one started in its place.
    use std::hash::BuildHasher as _;
    let random = std::collections::hash_map::RandomState::new();
    let mut next = 0u64;
    let mut pick = |below: u64| {
        next += 1;
        random.hash_one(next) % below
    };
    let mut names = ["replica-d", "replica-e", "replica-f", "replica-g"].into_iter();
    replicas.push(spawn_controller(
        dir.path(),
        names.next().expect("a name"),
        &args,
    ));
    let mut kills = Vec::new();
    for round in 0..3 {
        // Ten new claims, and the ten of the round before deleted.
        for i in 0..TENANTS {
            let ns = tenant_ns(i);
            let api = Api::<NodeClaim>::namespaced(world.mgmt.clone(), &ns);
            if i % 3 == round {
                let name = format!("chaos-{round}");
                api.create(&PostParams::default(), &claim(&ns, &name))
                    .await
                    .expect("claim created");
            }
            if round > 0 && i % 3 == round - 1 {
                api.delete(&format!("chaos-{}", round - 1), &DeleteParams::default())
                    .await
                    .expect("claim deleted");
            }
        }
        tokio::time::sleep(Duration::from_millis(500 + pick(3000))).await;
        let victim = usize::try_from(pick(replicas.len() as u64)).unwrap_or(0);
        let mut gone = replicas.remove(victim);
        gone.signal("KILL");
        let _ = gone.wait_exit(Duration::from_secs(10)).await;
        kills.push(gone.name.clone());
        replicas.push(spawn_controller(
            dir.path(),
            names.next().expect("a name"),
            &args,
        ));
        tokio::time::sleep(Duration::from_millis(1000 + pick(3000))).await;
    }
    println!(
        "chaos: killed {kills:?}, replicas now {:?}",
        replicas.iter().map(|p| &p.name).collect::<Vec<_>>()
    );
    let chaos_started = Instant::now();
    eventually(
        "every claim of a type with room Available and the deleted ones gone after the kills",
        Duration::from_secs(300),
        || async {
            let now = all_claims(&world).await;
            let settled = now
                .iter()
                .filter(|c| c.spec.type_ref.as_deref() != Some(CAPPED))
                .all(|c| c.metadata.deletion_timestamp.is_none() && available(c));
            let chaos = now
                .iter()
                .filter(|c| c.name_any().starts_with("chaos-"))
                .count();
            (settled && chaos == TENANTS / 3).then_some(())
        },
    )
    .await;
    println!(
        "chaos: every claim settled {:.1}s after the last kill",
        chaos_started.elapsed().as_secs_f64()
    );
    let live: Vec<&Proc> = replicas.iter().collect();
    eventually(
        "each namespace served by exactly one live replica",
        Duration::from_secs(60),
        || async {
            let by_ns = owners(&live).await;
            (0..TENANTS)
                .all(|i| by_ns.get(&tenant_ns(i)).is_some_and(|o| o.len() == 1))
                .then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    sampler.abort();
    let most = most_capped.load(std::sync::atomic::Ordering::SeqCst);
    println!("capped type: at most {most} claims held its {CAPPED_MAX} places at any time, across four kills");
    assert_eq!(most, CAPPED_MAX, "claims holding the capped type at once");
    one_of_each_per_claim(&world).await;

    // Everything deleted: nothing is left.
    for i in 0..TENANTS {
        Api::<NodeClaim>::namespaced(world.mgmt.clone(), &tenant_ns(i))
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await
            .expect("claims deleted");
    }
    eventually("every claim gone", Duration::from_secs(180), || async {
        all_claims(&world).await.is_empty().then_some(())
    })
    .await;
    let left = (
        world.vms().await.len(),
        world.host_secrets().await.len(),
        world.tokens().await.len(),
        world.nodes().await.len(),
        world.data_volumes().await.len(),
    );
    println!("after deletion: VMs, Secrets, tokens, Nodes, DataVolumes left: {left:?}");
    assert_eq!(left, (0, 0, 0, 0, 0), "logs:\n{}", logs(&replicas));
    drop(replicas);
    world.shutdown().await;
}

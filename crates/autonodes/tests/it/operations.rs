//! Operations on real API servers: the HTTP server (/metrics,
//! /healthz, /readyz), the metrics after a claim turned Available, and Events recorded once
//! per state change rather than once per reconcile.

use crate::common;
use crate::opscommon;

use std::net::SocketAddr;
use std::time::Duration;

use autonodes::run::{run_with_options, RunOptions};
use common::world::*;
use kube::api::{Api, ListParams, Patch, PatchParams};
use opscommon::{http_get, sample};
use tokio::sync::{oneshot, watch};

const AVAILABLE: Duration = Duration::from_secs(90);

/// Runs the controller in this process and returns its metrics address and a stopper.
async fn start_controller(
    world: &World,
) -> (SocketAddr, watch::Sender<bool>, tokio::task::JoinHandle<()>) {
    let (bound_tx, bound_rx) = oneshot::channel();
    let (stop_tx, mut stop_rx) = watch::channel(false);
    let client = world.mgmt.clone();
    let config = world.config.clone();
    let task = tokio::spawn(async move {
        let options = RunOptions {
            metrics_addr: "127.0.0.1:0".parse().expect("address"),
            metrics_auth: false,
            leader: None,
            bound: Some(bound_tx),
        };
        let stopped = async move {
            let _ = stop_rx.wait_for(|v| *v).await;
        };
        if let Err(e) = run_with_options(client, config, options, stopped).await {
            panic!("controller failed: {e:#}");
        }
    });
    let addr = bound_rx.await.expect("the controller reports its address");
    (addr, stop_tx, task)
}

async fn wait_http(addr: SocketAddr, path: &str, code: u16) -> String {
    common::eventually(
        &format!("{path} to answer {code}"),
        Duration::from_secs(60),
        || async move {
            match http_get(addr, path).await {
                Ok((c, body)) if c == code => Some(body),
                other => {
                    eprintln!("{path}: {other:?}");
                    None
                }
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_stays_unavailable_while_the_watches_cannot_sync_and_healthz_reports_the_loops_alive(
) {
    // A management "cluster" that does not answer: the watches never list anything.
    let port = autonodes_testenv::testenv::free_port().expect("free port");
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: dead\n  cluster:\n    server: https://127.0.0.1:{port}\n    insecure-skip-tls-verify: true\nusers:\n- name: dead\n  user:\n    token: none\ncontexts:\n- name: dead\n  context:\n    cluster: dead\n    user: dead\ncurrent-context: dead\n"
    ))
    .expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("config");
    let client = kube::Client::try_from(config).expect("client");
    let (bound_tx, bound_rx) = oneshot::channel();
    let (stop_tx, mut stop_rx) = watch::channel(false);
    let task = tokio::spawn(async move {
        let options = RunOptions {
            metrics_addr: "127.0.0.1:0".parse().expect("address"),
            metrics_auth: false,
            leader: None,
            bound: Some(bound_tx),
        };
        run_with_options(client, Default::default(), options, async move {
            let _ = stop_rx.wait_for(|v| *v).await;
        })
        .await
    });
    let addr = bound_rx.await.expect("bound");
    let (health, body) = http_get(addr, "/healthz").await.expect("GET /healthz");
    assert_eq!((health, body.as_str()), (200, "ok"));
    // Several seconds of failing lists: still not ready.
    for _ in 0..6 {
        let (code, body) = http_get(addr, "/readyz").await.expect("GET /readyz");
        assert_eq!(code, 503, "ready without synced watches: {body}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (code, scrape) = http_get(addr, "/metrics").await.expect("GET /metrics");
    assert_eq!(code, 200);
    assert!(scrape.contains("# HELP autonodes_leader "), "{scrape}");
    let _ = stop_tx.send(true);
    let result = tokio::time::timeout(autonodes::run::SHUTDOWN_GRACE * 2, task)
        .await
        .expect("the controller stops on shutdown")
        .expect("no panic");
    assert!(result.is_ok(), "{result:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_capacity_cost_claims_and_stage_durations_once_a_claim_is_available() {
    let opts = WorldOptions::default();
    let mut world = World::start_clusters(&opts).await;
    world.start_simulator(opts.mode).await;
    let (addr, stop, task) = start_controller(&world).await;

    let ready = wait_http(addr, "/readyz", 200).await;
    assert_eq!(ready, "ok");
    assert_eq!(wait_http(addr, "/healthz", 200).await, "ok");

    world.claim_type("standard-1", "standard-node").await;
    world.wait_phase("standard-1", "Available", AVAILABLE).await;

    let t = "kubevirt-provider-advanced.standard-node";
    let p = "kubevirt-provider-advanced";
    // The gauges follow the stores; give the claimed count a moment to reach the type.
    let scrape = common::eventually(
        "the metrics to show the claim",
        Duration::from_secs(30),
        || async move {
            let (_, s) = http_get(addr, "/metrics").await.ok()?;
            let claimed =
                format!("autonodes_nodetype_claimed{{nodetype=\"{t}\",provider=\"{p}\"}}");
            let available = format!(
                "autonodes_nodeclaims{{nodetype=\"{t}\",phase=\"Available\",provider=\"{p}\"}}"
            );
            (sample(&s, &claimed) == Some(1.0) && sample(&s, &available) == Some(1.0)).then_some(s)
        },
    )
    .await;
    println!("---- GET /metrics (autonodes_ lines) ----");
    for line in scrape
        .lines()
        .filter(|l| l.contains("autonodes_") && !l.contains("_bucket{"))
    {
        println!("{line}");
    }

    let has = |series: &str, want: f64| {
        assert_eq!(sample(&scrape, series), Some(want), "{series} in\n{scrape}");
    };
    has(
        &format!("autonodes_nodetype_cost{{nodetype=\"{t}\",provider=\"{p}\"}}"),
        28.0,
    );
    has(
        &format!(
            "autonodes_nodetype_claimed{{nodetype=\"{p}.high-memory-node\",provider=\"{p}\"}}"
        ),
        0.0,
    );
    has(
        &format!("autonodes_nodeclaims{{nodetype=\"{t}\",phase=\"Available\",provider=\"{p}\"}}"),
        1.0,
    );
    has(
        &format!(
            "autonodes_nodeclaims_cost{{namespace=\"{NS}\",provider=\"{p}\",vcluster=\"tenant\"}}"
        ),
        28.0,
    );
    has(
        &format!(
            "autonodes_nodeclaims_created_total{{namespace=\"{NS}\",nodepool=\"\",nodetype=\"{t}\"}}"
        ),
        1.0,
    );
    // Totals and their parts are separate series: a type with maxCapacity has all three.
    let capacity = sample(
        &scrape,
        &format!("autonodes_nodetype_capacity{{nodetype=\"{t}\",provider=\"{p}\"}}"),
    )
    .expect("the type's capacity");
    has(
        &format!("autonodes_nodetype_available{{nodetype=\"{t}\",provider=\"{p}\"}}"),
        capacity - 1.0,
    );
    has(
        &format!(
            "autonodes_build_info{{revision=\"{}\",version=\"{}\"}}",
            autonodes::metrics::REVISION,
            env!("CARGO_PKG_VERSION")
        ),
        1.0,
    );
    assert!(
        sample(&scrape, "process_resident_memory_bytes").unwrap_or(0.0) > 0.0,
        "the process's own series are exported"
    );
    // The type's room on the playground's host: three nodes of 64Ti each hold 15,420 VMs of
    // 4Gi + 256Mi launcher overhead; the claim's VM (no launcher pod here) takes one.
    let headroom = format!("autonodes_nodetype_host_headroom{{nodetype=\"{t}\",provider=\"{p}\"}}");
    let shown = common::eventually("the type's host room", Duration::from_secs(60), || {
        let headroom = headroom.clone();
        async move {
            let (_, s) = http_get(addr, "/metrics").await.ok()?;
            sample(&s, &headroom)
        }
    })
    .await;
    assert_eq!(shown, 46_259.0);
    for stage in ["scheduled", "provisioned", "joined", "ready"] {
        has(
            &format!(
                "autonodes_nodeclaim_duration_seconds_count{{stage=\"{stage}\",start=\"cold\"}}"
            ),
            1.0,
        );
    }
    has("autonodes_leader", 0.0);
    for name in [
        "autonodes_reconcile_total{controller=\"nodeclaim\",result=\"ok\"}",
        "autonodes_reconcile_total{controller=\"nodetype\",result=\"ok\"}",
        "autonodes_reconcile_total{controller=\"nodeprovider\",result=\"ok\"}",
        "autonodes_reconcile_duration_seconds_count{controller=\"nodeclaim\"}",
    ] {
        assert!(
            sample(&scrape, name).unwrap_or(0.0) >= 1.0,
            "{name} in\n{scrape}"
        );
    }
    let remote_ok: f64 = scrape
        .lines()
        .filter(|l| {
            l.starts_with("autonodes_cluster_requests_total{")
                && l.contains("code=\"200\"")
                && (l.contains("kind=\"host\"") || l.contains(&format!("namespace=\"{NS}\"")))
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    assert!(
        remote_ok >= 1.0,
        "no successful remote requests counted:\n{scrape}"
    );

    // Every family has help text; no sample carries a reserved label.
    for line in scrape.lines().filter(|l| l.starts_with("# TYPE ")) {
        let name = line.split_whitespace().nth(2).expect("family name");
        assert!(
            name.starts_with("autonodes_") || name.starts_with("process_"),
            "{line}"
        );
        assert!(
            scrape.contains(&format!("# HELP {name} ")),
            "no help for {name}"
        );
    }
    for line in scrape.lines().filter(|l| !l.starts_with('#')) {
        assert!(
            !line.contains("instance=") && !line.contains("job="),
            "{line}"
        );
    }

    // Deleting the claim: it leaves the claim gauges and counts as terminated.
    world.delete_claim("standard-1").await;
    world.wait_claim_gone("standard-1", AVAILABLE).await;
    let after = common::eventually(
        "the deleted claim to leave the gauges",
        Duration::from_secs(30),
        || async move {
            let (_, s) = http_get(addr, "/metrics").await.ok()?;
            let gone = !s.lines().any(|l| l.starts_with("autonodes_nodeclaims{"));
            (gone
                && sample(
                    &s,
                    &format!("autonodes_nodeclaims_terminated_total{{namespace=\"{NS}\",nodepool=\"\",nodetype=\"{t}\",reason=\"deleted\"}}"),
                ) == Some(1.0))
            .then_some(s)
        },
    )
    .await;
    assert_eq!(
        sample(
            &after,
            &format!("autonodes_nodetype_claimed{{nodetype=\"{t}\",provider=\"{p}\"}}")
        ),
        Some(0.0)
    );

    let _ = stop.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(20), task).await;
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_and_providers_get_one_event_per_state_change_and_a_healthy_claims_life_only_normal_ones(
) {
    let world = World::start(WorldOptions::default()).await;
    // The type is usable before the claim comes, so the claim meets no problem on its way.
    world
        .wait_node_type(
            "kubevirt-provider-advanced.standard-node",
            "Available",
            |t| {
                t.status
                    .as_ref()
                    .and_then(|s| s.phase)
                    .is_some_and(|p| format!("{p:?}") == "Available")
            },
        )
        .await;
    world.claim_type("evented", "standard-node").await;
    world.wait_phase("evented", "Available", AVAILABLE).await;

    // Make the controllers reconcile the claim and the provider many more times without
    // changing their state (a metadata-only change wakes the controllers).
    let claims = world.claims();
    let providers: Api<autonodes_api::NodeProvider> = Api::all(world.mgmt.clone());
    for i in 0..5 {
        let patch = serde_json::json!({"metadata": {"annotations": {"test/poke": i.to_string()}}});
        claims
            .patch("evented", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("poke claim");
        providers
            .patch(
                "kubevirt-provider-advanced",
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .expect("poke provider");
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;

    let claim_events = world.events_for(NS, "evented").await;
    // The provider is cluster-scoped: its Events are tried in `default`, which a 1.20 API
    // server refuses (they are then recorded in `kube-system`) and newer ones keep.
    let minor = autonodes_testenv::testenv::server_minor(&world.mgmt)
        .await
        .expect("server version");
    let (kept_in, refused_in) = if minor <= 20 {
        ("kube-system", "default")
    } else {
        ("default", "kube-system")
    };
    let provider_events = world
        .events_for(kept_in, "kubevirt-provider-advanced")
        .await;
    assert!(
        world
            .events_for(refused_in, "kubevirt-provider-advanced")
            .await
            .is_empty(),
        "a 1.{minor} API server's Events about a cluster-scoped object belong in {kept_in} only"
    );
    assert!(
        !provider_events.is_empty(),
        "the provider's Events are in {kept_in} on a 1.{minor} API server"
    );
    println!("claim events:\n  {}", claim_events.join("\n  "));
    println!("provider events:\n  {}", provider_events.join("\n  "));
    for (what, events) in [("claim", &claim_events), ("provider", &provider_events)] {
        let mut reasons: Vec<&str> = events
            .iter()
            .map(|e| e.split(':').next().unwrap_or(""))
            .collect();
        reasons.sort();
        let before = reasons.len();
        reasons.dedup();
        assert_eq!(
            before,
            reasons.len(),
            "a {what} event was recorded twice: {events:#?}"
        );
    }
    let claim_reasons: Vec<&str> = claim_events
        .iter()
        .map(|e| e.split(':').next().unwrap_or(""))
        .collect();
    // One Event per stage reached (Running and NodeJoined are told by NodeReady when they
    // were written together with Ready); progress on the way (Creating, Booting,
    // WaitingForNode) is no Event.
    for reason in ["Scheduled", "NodeReady"] {
        assert!(
            claim_reasons.contains(&reason),
            "{reason}: {claim_events:#?}"
        );
    }
    for reason in ["Creating", "Booting", "WaitingForNode"] {
        assert!(
            !claim_reasons.contains(&reason),
            "{reason}: {claim_events:#?}"
        );
    }
    assert!(
        !provider_events.is_empty(),
        "the provider turning ready is an event"
    );

    // Every Event is events.k8s.io/v1 with the controller as reporter.
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(world.mgmt.clone(), NS);
    for e in api
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
    {
        assert_eq!(e.reporting_controller.as_deref(), Some("autonodes"));
        assert!(e.regarding.is_some());
        // Progress is never a Warning (the claim may have met a real problem on the way,
        // e.g. no node type yet while the provider's types were being made).
        if e.type_.as_deref() == Some("Warning") {
            let reason = e.reason.clone().unwrap_or_default();
            assert!(!autonodes_api::conditions::is_progress(&reason), "{e:?}");
        }
        if e.reason.as_deref() == Some("NodeReady") {
            assert_eq!(e.type_.as_deref(), Some("Normal"), "{e:?}");
        }
    }

    // A healthy claim's whole life, its deletion included, holds Normal Events only: nobody
    // alerting on Warning Events is paged for it.
    world.delete_claim("evented").await;
    world.wait_claim_gone("evented", AVAILABLE).await;
    let history: Vec<(String, String)> = api
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("evented"))
        .map(|e| (e.type_.unwrap_or_default(), e.reason.unwrap_or_default()))
        .collect();
    println!("the claim's whole history: {history:?}");
    assert!(
        history.iter().any(|(_, r)| r == "NodeDeleted"),
        "{history:?}"
    );
    for (type_, reason) in &history {
        assert_eq!(type_, "Normal", "{reason} in {history:?}");
    }
    world.shutdown().await;
}

//! The metrics, the dashboard and the alerts against a real Prometheus (Debian's
//! `prometheus` package, installed by `scripts/test-env.sh`): Prometheus scrapes the real
//! `autonodes` binary, `promtool check metrics` reads the scrape, every query of the shipped
//! dashboard returns series, and the shipped alerting rules load, stay quiet on a healthy
//! installation and pass their `promtool test rules` unit tests.

use crate::common;
use crate::opscommon;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use autonodes_testenv::testenv::{free_port, ManagedProcess};
use common::world::*;
use common::{eventually, path_str, repo};
use opscommon::{documents, http_get, spawn_controller};
use serde_json::{json, Value};

const AVAILABLE: Duration = Duration::from_secs(120);
const RULES: &str = "charts/autonodes/alerts/autonodes.rules.yaml";
const RULE_TESTS: &str = "crates/autonodes/tests/alerts/autonodes.rules.test.yaml";

/// A Prometheus tool from Debian's package (`$AUTONODES_PROMETHEUS_BIN` overrides the
/// directory).
fn tool(name: &str) -> PathBuf {
    let dir = std::env::var_os("AUTONODES_PROMETHEUS_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin"));
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} not found: run scripts/test-env.sh (it installs Debian's prometheus package)",
        path.display()
    );
    path
}

/// Runs `promtool args…` (feeding `stdin`), returning (success, stdout + stderr).
fn promtool(args: &[&str], cwd: &Path, stdin: Option<&str>) -> (bool, String) {
    use std::io::Write;
    let mut child = Command::new(tool("promtool"))
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool starts");
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("promtool reads stdin");
    }
    let out = child.wait_with_output().expect("promtool runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The names of the alerts in the shipped rules file.
fn alert_names() -> Vec<String> {
    let rules = documents(&std::fs::read_to_string(repo().join(RULES)).expect("rules file"));
    rules[0]["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| r["alert"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn the_alerting_rules_pass_promtool_and_every_alert_has_a_unit_test_in_which_it_fires() {
    let root = repo();
    let (ok, out) = promtool(&["check", "rules", RULES], &root, None);
    println!("$ promtool check rules {RULES}\n{out}");
    assert!(ok, "{out}");
    let names = alert_names();
    assert!(
        out.contains(&format!("SUCCESS: {} rules found", names.len())),
        "{out}"
    );
    for want in [
        "AutonodesNodeClaimStuck",
        "AutonodesNodeClaimsFailed",
        "AutonodesNodePoolBelowDesired",
        "AutonodesHostUnreachable",
        "AutonodesTenantUnreachable",
        "AutonodesNodeTypeExhausted",
        "AutonodesOrphansRemoved",
        "AutonodesReconcileErrors",
        "AutonodesLeaderMissing",
        "AutonodesTenantsUnowned",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
    }

    let tests = root.join(RULE_TESTS);
    let dir = tests.parent().expect("test directory");
    let file = tests.file_name().and_then(|f| f.to_str()).expect("name");
    let (ok, out) = promtool(&["test", "rules", file], dir, None);
    println!("$ promtool test rules {RULE_TESTS}\n{out}");
    assert!(ok && out.contains("SUCCESS"), "{out}");

    // Each alert is seen firing in some test (not only its silence).
    let unit = documents(&std::fs::read_to_string(&tests).expect("rule tests"));
    let fired: Vec<&str> = unit[0]["tests"]
        .as_array()
        .expect("tests")
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().into_iter().flatten())
        .filter(|a| a["exp_alerts"].as_array().is_some_and(|e| !e.is_empty()))
        .filter_map(|a| a["alertname"].as_str())
        .collect();
    for name in &names {
        assert!(
            fired.contains(&name.as_str()),
            "{name} has no test in which it fires"
        );
    }
}

/// `q` percent-encoded for a URL query.
fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Evaluates `query` with Prometheus's HTTP API: the result vector.
async fn query(prom: SocketAddr, query: &str) -> Vec<Value> {
    let (code, body) = http_get(prom, &format!("/api/v1/query?query={}", encode(query)))
        .await
        .unwrap_or_default();
    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    assert!(
        code == 200 || code == 0,
        "query {query} answered {code}: {body}"
    );
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

/// Every panel query of the shipped dashboard, with Grafana's range variables filled in.
fn dashboard_queries() -> Vec<(String, String)> {
    let path = repo().join("charts/autonodes/dashboards/autonodes.json");
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("dashboard readable"))
            .expect("dashboard JSON");
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                out.push((
                    panel["title"].as_str().unwrap_or("?").to_string(),
                    expr.replace("$__rate_interval", "1m")
                        .replace("$__range", "5m")
                        // The dashboard's variables, as Grafana fills them in with this
                        // job and "All" tenants.
                        .replace("$job", "autonodes")
                        .replace("$namespace", ".*")
                        .replace("$vcluster", ".*"),
                ));
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scrapes_the_controller_and_every_dashboard_query_returns_series() {
    let opts = WorldOptions::default();
    let mut world = World::start_clusters(&opts).await;
    world.start_simulator(opts.mode).await;
    let kubeconfig = world
        .playground
        .mgmt()
        .expect("mgmt")
        .kubeconfig_path
        .clone();
    let dir = tempfile::tempdir().expect("tempdir");
    let controller = spawn_controller(
        dir.path(),
        "autonodes-0",
        &[
            "--kubeconfig",
            path_str(&kubeconfig),
            "--namespace",
            "autonodes-system",
            "--leader-elect",
            "--metrics-addr",
            "127.0.0.1:0",
            "--log-format",
            "json",
        ],
    );
    let metrics = controller.metrics_addr().await;

    // Prometheus scrapes it every second and evaluates the shipped rules.
    let port = free_port().expect("free port");
    let prom: SocketAddr = format!("127.0.0.1:{port}").parse().expect("address");
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: autonodes\n    static_configs:\n      - targets: ['{metrics}']\n",
            repo().join(RULES).display()
        ),
    )
    .expect("prometheus.yml");
    let mut prometheus = ManagedProcess::spawn(
        "prometheus",
        &tool("prometheus"),
        &[
            format!("--config.file={}", config.display()),
            format!("--storage.tsdb.path={}", dir.path().join("tsdb").display()),
            format!("--web.listen-address={prom}"),
        ],
        &dir.path().join("prometheus.log"),
    )
    .expect("prometheus starts");
    let started = std::time::Instant::now();
    loop {
        // Prometheus answers 503 until its storage is open (slow on a loaded machine); only
        // then is it asked whether it scraped autonodes.
        let ready = http_get(prom, "/-/ready").await.ok().map(|(code, _)| code) == Some(200);
        if ready && !query(prom, "up{job=\"autonodes\"} == 1").await.is_empty() {
            break;
        }
        if let Err(e) = prometheus.check_running() {
            panic!("{e}");
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "Prometheus never {}:\n{}",
            if ready {
                "scraped autonodes"
            } else {
                "became ready"
            },
            prometheus.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // A node type that keeps a warm VM (the dashboard's warm panel has series).
    let warm: autonodes_api::NodeType = serde_json::from_value(json!({
        "apiVersion": "autonodes.io/v1alpha1", "kind": "NodeType",
        "metadata": {"name": "warm-standard"},
        "spec": {"providerRef": "kubevirt-provider-advanced",
                 "resources": {"cpu": "2", "memory": "4Gi"},
                 "warm": {"replicas": 1}},
    }))
    .expect("node type");
    kube::Api::<autonodes_api::NodeType>::all(world.mgmt.clone())
        .create(&Default::default(), &warm)
        .await
        .expect("warm node type created");

    // A node pool of one node: its claim turns Available.
    world
        .create_pool(
            "workers",
            json!({"providerRef": "kubevirt-provider-advanced", "replicas": 1,
                   "requirements": [{"key": "autonodes.io/node-type", "operator": "In",
                                     "values": ["standard-node"]}]}),
        )
        .await;
    eventually("the pool's claim to be Available", AVAILABLE, || async {
        let claims = world.claims().list(&Default::default()).await.ok()?;
        claims
            .items
            .iter()
            .any(|c| {
                c.status
                    .as_ref()
                    .and_then(|s| s.phase)
                    .is_some_and(|p| format!("{p:?}") == "Available")
            })
            .then_some(())
    })
    .await;

    // promtool's linter on what Prometheus scrapes.
    let (_, scrape) = http_get(metrics, "/metrics").await.expect("scrape");
    let (ok, lint) = promtool(&["check", "metrics"], dir.path(), Some(&scrape));
    println!(
        "$ curl -s {metrics}/metrics | promtool check metrics\n{lint}(exit {})",
        if ok { 0 } else { 1 }
    );
    assert!(ok && lint.trim().is_empty(), "{lint}");

    // Every dashboard query, evaluated by Prometheus, returns at least one series.
    let queries = dashboard_queries();
    assert!(queries.len() >= 15, "{queries:?}");
    for (title, expr) in &queries {
        let result = eventually(
            &format!("dashboard panel {title:?} to return series: {expr}"),
            Duration::from_secs(60),
            || async { Some(query(prom, expr).await).filter(|r| !r.is_empty()) },
        )
        .await;
        println!("{:>3} series  {title}: {expr}", result.len());
    }

    // The shipped rules loaded, evaluate without errors, and a healthy installation raises
    // no alert.
    let (_, body) = http_get(prom, "/api/v1/rules").await.expect("rules");
    let rules: Value = serde_json::from_str(&body).expect("rules JSON");
    let loaded: Vec<&Value> = rules["data"]["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .collect();
    assert_eq!(loaded.len(), alert_names().len(), "{body}");
    for r in &loaded {
        assert_eq!(r["health"], "ok", "{r}");
    }
    // An alert may be pending from an evaluation while the pool came up (its ready gauge
    // was 0 then); a healthy installation has none once the rules see it settled.
    let settled = std::time::Instant::now();
    loop {
        let (_, body) = http_get(prom, "/api/v1/alerts").await.expect("alerts");
        let alerts: Value = serde_json::from_str(&body).expect("alerts JSON");
        if alerts["data"]["alerts"] == json!([]) {
            println!("$ curl -s {prom}/api/v1/alerts\n{body}");
            break;
        }
        assert!(
            settled.elapsed() < Duration::from_secs(60),
            "a healthy installation still raises alerts after 60 s: {body}\ncontroller warnings and errors:\n{}",
            controller
                .log_text()
                .lines()
                .filter(|l| {
                    let l = l.to_ascii_lowercase();
                    l.contains("\"warn") || l.contains("\"error")
                })
                .take(40)
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    prometheus.kill();
    drop(controller);
    world.shutdown().await;
}

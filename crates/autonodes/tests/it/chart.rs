//! The Helm chart `charts/autonodes` (issue 6): rendered with Helm v4's library (PyPI
//! helm-python-sdk), linted, applied to a real API server with a server-side dry run, its
//! RBAC proven sufficient by a controller that runs with nothing else, its CRDs identical to
//! `crds/`, and its Grafana dashboard querying only metrics the controller exports.

use crate::common;
use crate::opscommon;

use std::collections::BTreeSet;
use std::time::Duration;

use autonodes::leader::LeaderConfig;
use autonodes::run::{run_with_options, RunOptions};
use common::world::*;
use common::{kubectl, kubectl_ok, path_str, repo};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::ResourceExt;
use opscommon::{documents, helm_chart, render_chart};
use serde_json::json;

const AVAILABLE: Duration = Duration::from_secs(90);

/// Values for a v1.20 API server: it serves PodDisruptionBudgets as policy/v1beta1 only.
fn values_for_1_20(extra: serde_json::Value) -> serde_json::Value {
    let mut v = json!({"podDisruptionBudget": {"apiVersion": "policy/v1beta1"}});
    if let (Some(base), Some(more)) = (v.as_object_mut(), extra.as_object()) {
        for (k, x) in more {
            base.insert(k.clone(), x.clone());
        }
    }
    v
}

/// Asserts that each chart directory holds exactly the files of its generated directory
/// (`crds/` or `crds/capi/`), byte for byte.
fn assert_copies_of_generated_crds(pairs: &[(&str, &str)]) {
    let names = |dir: &std::path::Path| -> BTreeSet<String> {
        std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
            .map(|e| e.expect("entry"))
            .filter(|e| e.path().is_file())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    };
    for (generated, chart) in pairs {
        let (generated, chart) = (repo().join(generated), repo().join(chart));
        assert_eq!(
            names(&generated),
            names(&chart),
            "{} must hold exactly the files of {}",
            chart.display(),
            generated.display()
        );
        for name in names(&generated) {
            assert!(
                std::fs::read(generated.join(&name)).expect("read")
                    == std::fs::read(chart.join(&name)).expect("read"),
                "{}/{name} differs from {}/{name}: copy it",
                chart.display(),
                generated.display()
            );
        }
    }
}

#[test]
fn chart_crds_are_identical_to_the_generated_crds() {
    // autonodes' own kinds in the chart's crds/ (installed by every `helm install`), the
    // Cluster API mirror's in capi-crds/ (rendered only with the mirror on).
    assert_copies_of_generated_crds(&[
        ("crds", "charts/autonodes/crds"),
        ("crds/capi", "charts/autonodes/capi-crds"),
    ]);
}

/// The names of every metric family the controller registers (histograms with their
/// `_bucket`, `_sum` and `_count` series).
fn exported_metric_names() -> BTreeSet<String> {
    let descs = autonodes::metrics::Metrics::new().expect("metrics").descs();
    let mut names = BTreeSet::new();
    for d in descs {
        let name = format!("autonodes_{}", d.fq_name);
        for suffix in ["_bucket", "_sum", "_count"] {
            names.insert(format!("{name}{suffix}"));
        }
        names.insert(name);
    }
    names
}

#[test]
fn every_dashboard_panel_query_names_a_metric_the_controller_exports() {
    let path = repo().join("charts/autonodes/dashboards/autonodes.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("dashboard readable"))
            .expect("the dashboard is JSON");
    let exported = exported_metric_names();
    let mut queries = 0;
    let mut used = BTreeSet::new();
    let panels = dashboard["panels"].as_array().expect("panels");
    for panel in panels {
        if panel["type"] == "row" {
            continue;
        }
        let title = panel["title"].as_str().unwrap_or("?");
        let targets = panel["targets"]
            .as_array()
            .expect("every panel has targets");
        assert!(!targets.is_empty(), "panel {title} has no query");
        for t in targets {
            let expr = t["expr"].as_str().expect("expr");
            queries += 1;
            let names: Vec<&str> = expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("autonodes_"))
                .collect();
            assert!(
                !names.is_empty(),
                "panel {title}: query names no autonodes metric: {expr}"
            );
            for n in names {
                assert!(
                    exported.contains(n),
                    "panel {title}: {n} is not exported ({expr})"
                );
                used.insert(n.to_string());
            }
        }
    }
    // What the dashboard must show (issue 6).
    for want in [
        "autonodes_nodetype_capacity",
        "autonodes_nodeclaims",
        "autonodes_nodeclaim_duration_seconds_bucket",
        "autonodes_nodeclaims_cost",
        "autonodes_reconcile_total",
        "autonodes_leader",
    ] {
        assert!(used.contains(want), "the dashboard has no panel on {want}");
    }
    for q in [0.5, 0.9, 0.99] {
        let needle = format!("histogram_quantile({q}, sum by (le, stage) (rate(autonodes_nodeclaim_duration_seconds_bucket");
        assert!(
            panels
                .iter()
                .any(|p| p["targets"].to_string().contains(&needle)),
            "no p{} provisioning-time query per stage",
            q * 100.0
        );
    }
    // Variables to pick the data source, the installation and the tenants; no time series
    // plots a total over the whole range.
    let variables: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .expect("templating")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert_eq!(variables, ["datasource", "job", "namespace", "vcluster"]);
    for panel in panels {
        let text = panel["targets"].to_string();
        if panel["type"] == "timeseries" {
            assert!(
                !text.contains("$__range"),
                "{}: a range total plotted over time",
                panel["title"]
            );
        }
        if !text.is_empty() && text != "null" {
            assert!(
                text.contains("job=~\\\"$job\\\""),
                "{} ignores the job variable: {text}",
                panel["title"]
            );
        }
    }
    println!(
        "{} panels, {queries} queries, metrics used: {used:?}",
        panels.len()
    );
}

#[test]
fn every_rbac_rule_of_the_chart_has_a_comment() {
    let text = std::fs::read_to_string(repo().join("charts/autonodes/templates/rbac.yaml"))
        .expect("rbac.yaml");
    let lines: Vec<&str> = text.lines().collect();
    let mut rules = 0;
    for (i, line) in lines.iter().enumerate() {
        if line.trim_start().starts_with("- apiGroups:") {
            rules += 1;
            let above = lines[..i]
                .iter()
                .rev()
                .find(|l| !l.trim().is_empty())
                .expect("a line above");
            assert!(
                above.trim_start().starts_with('#'),
                "rule without a comment: {line} (line {})",
                i + 1
            );
        }
    }
    assert!(rules >= 8, "expected the chart's rules, found {rules}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_lints_renders_and_passes_a_server_side_dry_run_on_the_api_server() {
    let lint = helm_chart("lint", &json!({}));
    println!(
        "== helm lint (strict)\n{}",
        String::from_utf8_lossy(&lint.stdout)
    );
    assert!(
        lint.status.success(),
        "helm lint failed: {}{}",
        String::from_utf8_lossy(&lint.stdout),
        String::from_utf8_lossy(&lint.stderr)
    );

    let env = common::start(&["mgmt"]).await;
    let mgmt = env.apiserver("mgmt").expect("mgmt");
    for ns in ["autonodes-system", "tenant-a", "tenant-b"] {
        kubectl_ok(&env, mgmt, &["create", "namespace", ns]);
    }
    let crds = repo().join("charts/autonodes/crds");
    // The CRDs carry CEL rules, which a 1.20 server does not know: kubectl's client-side
    // validation refuses them there (`--validate=false` skips it, as Helm does), and the
    // server drops them on create.
    let out = kubectl_ok(
        &env,
        mgmt,
        &[
            "apply",
            "--dry-run=server",
            "--validate=false",
            "-f",
            path_str(&crds),
        ],
    );
    println!("== kubectl apply --dry-run=server --validate=false -f charts/autonodes/crds\n{out}");
    let strict = kubectl(
        &env,
        mgmt,
        &["apply", "--dry-run=server", "-f", path_str(&crds)],
    );
    let refused = String::from_utf8_lossy(&strict.stderr);
    assert!(
        !strict.status.success() && refused.contains("x-kubernetes-validations"),
        "kubectl 1.20 validates the CRDs' CEL rules away only with --validate=false: {refused}"
    );

    let variants = [
        ("defaults", values_for_1_20(json!({}))),
        (
            "dashboard ConfigMap, tenant namespaces, no leader election",
            values_for_1_20(json!({
                "dashboard": {"enabled": true},
                "rbac": {"tenantNamespaces": ["tenant-a", "tenant-b"]},
                "leaderElection": {"enabled": false},
                "replicaCount": 1,
                "podDisruptionBudget": {"enabled": false}
            })),
        ),
        (
            "the operator chart options",
            values_for_1_20(operator_options()),
        ),
    ];
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, values) in &variants {
        let rendered = render_chart(values);
        let docs = documents(&rendered);
        let kinds: Vec<String> = docs
            .iter()
            .map(|d| {
                format!(
                    "{}/{}",
                    d["kind"].as_str().unwrap_or("?"),
                    d["metadata"]["name"].as_str().unwrap_or("?")
                )
            })
            .collect();
        println!(
            "== helm render ({name}): {} objects: {}",
            docs.len(),
            kinds.join(", ")
        );
        let file = dir.path().join("rendered.yaml");
        std::fs::write(&file, &rendered).expect("write");
        let out = kubectl(
            &env,
            mgmt,
            &["apply", "--dry-run=server", "-f", path_str(&file)],
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        println!("== kubectl apply --dry-run=server ({name})\n{stdout}");
        assert!(
            out.status.success(),
            "server-side dry run failed: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            stdout.lines().count(),
            docs.len(),
            "every object passes the dry run"
        );
    }

    // What the defaults promise.
    let docs = documents(&render_chart(&values_for_1_20(json!({}))));
    let find = |kind: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind} rendered"))
            .clone()
    };
    let find_named = |kind: &str, name: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
            .clone()
    };
    let deploy = find("Deployment");
    assert_eq!(deploy["spec"]["replicas"], 2);
    let pod = &deploy["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let args: Vec<&str> = c["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    for want in [
        "run",
        "--leader-elect=true",
        "--namespace=autonodes-system",
        "--log-format=json",
        "--leader-election-lease-duration=15s",
        "--metrics-auth",
    ] {
        assert!(args.contains(&want), "{want} missing from {args:?}");
    }
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    // /metrics is authenticated by default: HTTPS, and the probes use it too.
    assert_eq!(c["livenessProbe"]["httpGet"]["scheme"], "HTTPS");
    assert_eq!(c["readinessProbe"]["httpGet"]["scheme"], "HTTPS");
    let reader = find_named("ClusterRole", "autonodes-metrics-reader");
    assert_eq!(reader["rules"][0]["nonResourceURLs"], json!(["/metrics"]));
    assert!(c["resources"]["requests"].is_object() && c["resources"]["limits"].is_object());
    let sc = &c["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["runAsNonRoot"], true);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(find("PodDisruptionBudget")["spec"]["minAvailable"], 1);
    assert_eq!(
        c["image"],
        format!(
            "registry.example.com/autonodes:{}",
            env!("CARGO_PKG_VERSION")
        )
    );
    assert_eq!(find("Service")["spec"]["ports"][0]["targetPort"], "metrics");
    find("ServiceAccount");
    // The ServiceMonitor scrapes with the token of a ServiceAccount of its own, bound to the
    // reader role and handed over in a Secret; no deprecated bearerTokenFile.
    let monitored = documents(&render_chart(&json!({"serviceMonitor": {"enabled": true}})));
    let named = |kind: &str, name: &str| {
        monitored
            .iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
            .clone()
    };
    let endpoint = &named("ServiceMonitor", "autonodes")["spec"]["endpoints"][0];
    assert_eq!(endpoint["port"], "metrics");
    assert_eq!(endpoint["scheme"], "https");
    assert_eq!(
        endpoint["authorization"],
        json!({"type": "Bearer", "credentials": {"name": "autonodes-metrics-scraper", "key": "token"}})
    );
    assert!(endpoint.get("bearerTokenFile").is_none(), "{endpoint}");
    named("ServiceAccount", "autonodes-metrics-scraper");
    let token = named("Secret", "autonodes-metrics-scraper");
    assert_eq!(token["type"], "kubernetes.io/service-account-token");
    assert_eq!(
        token["metadata"]["annotations"]["kubernetes.io/service-account.name"],
        "autonodes-metrics-scraper"
    );
    let binding = named("ClusterRoleBinding", "autonodes-metrics-scraper");
    assert_eq!(binding["roleRef"]["name"], "autonodes-metrics-reader");
    assert_eq!(binding["subjects"][0]["name"], "autonodes-metrics-scraper");
    let open = documents(&render_chart(&json!({"metricsAuth": false})));
    let open_c = &open
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("Deployment")["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(open_c["livenessProbe"]["httpGet"]["scheme"], "HTTP");
    assert!(!open_c["args"]
        .as_array()
        .expect("args")
        .iter()
        .any(|a| a == "--metrics-auth"));
    let cm = documents(&render_chart(&json!({"dashboard": {"enabled": true}})));
    let cm = cm
        .iter()
        .find(|d| d["kind"] == "ConfigMap")
        .expect("dashboard ConfigMap when enabled");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    let embedded: serde_json::Value = serde_json::from_str(
        cm["data"]["autonodes.json"]
            .as_str()
            .expect("dashboard data"),
    )
    .expect("embedded JSON");
    assert_eq!(embedded["uid"], "autonodes");
    // The PrometheusRule is off by default and, when on, carries the plain rules file's
    // groups unchanged (the alert templates `{{ $labels.… }}` are not Helm's).
    assert!(!docs.iter().any(|d| d["kind"] == "PrometheusRule"));
    let pr = documents(&render_chart(&json!({"prometheusRule": {"enabled": true}})));
    let pr = pr
        .iter()
        .find(|d| d["kind"] == "PrometheusRule")
        .expect("PrometheusRule when enabled");
    let file = documents(
        &std::fs::read_to_string(repo().join("charts/autonodes/alerts/autonodes.rules.yaml"))
            .expect("rules file"),
    );
    assert_eq!(pr["spec"]["groups"], file[0]["groups"]);
    assert_eq!(
        pr["spec"]["groups"][0]["rules"][0]["annotations"]["summary"],
        "A NodeClaim has been {{ $labels.phase }} for {{ $value | humanizeDuration }}"
    );
}

#[test]
fn the_values_schema_makes_helm_refuse_a_wrong_type_or_an_unknown_key() {
    for (values, field) in [
        (json!({"replicaCount": "two"}), "replicaCount"),
        (json!({"controller": {"logFormat": "xml"}}), "logFormat"),
        (
            json!({"controller": {"launchTimeout": "soon"}}),
            "launchTimeout",
        ),
        (
            json!({"rbac": {"tenantNamespaces": "tenant-a"}}),
            "tenantNamespaces",
        ),
        (json!({"metricsAuth": "yes"}), "metricsAuth"),
        (json!({"replicaCont": 2}), "replicaCont"),
    ] {
        let out = helm_chart("render", &values);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{values} was accepted");
        assert!(
            err.contains(field),
            "the refusal of {values} does not name {field}: {err}"
        );
        let why = err
            .lines()
            .filter(|l| l.contains("- at "))
            .collect::<Vec<_>>();
        println!("refused {values}: {}", why.join("; "));
    }
    let lint = helm_chart("lint", &json!({"replicaCount": "two"}));
    assert!(!lint.status.success(), "helm lint accepted a wrong type");
    // Every value values.yaml sets is described by the schema.
    let values: serde_json::Value = autonodes_core::yaml::from_str(
        &std::fs::read_to_string(repo().join("charts/autonodes/values.yaml")).expect("values"),
    )
    .expect("values.yaml parses");
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("charts/autonodes/values.schema.json"))
            .expect("schema"),
    )
    .expect("values.schema.json parses");
    fn walk(v: &serde_json::Value, s: &serde_json::Value, path: &str, missing: &mut Vec<String>) {
        let Some(map) = v.as_object() else { return };
        let Some(props) = s.get("properties").and_then(|p| p.as_object()) else {
            // A free-form map (resources, affinity, labels): any keys.
            return;
        };
        for (k, x) in map {
            let here = format!("{path}{k}");
            match props.get(k) {
                Some(sub) => walk(x, sub, &format!("{here}."), missing),
                None => missing.push(here),
            }
        }
    }
    let mut missing = Vec::new();
    walk(&values, &schema, "", &mut missing);
    assert!(
        missing.is_empty(),
        "values the schema does not describe: {missing:?}"
    );
}

#[test]
fn sharing_the_tenants_adds_the_flag_and_the_member_lease_rights_and_needs_leader_election() {
    let lease_rights = |docs: &[serde_json::Value]| -> Vec<serde_json::Value> {
        object(docs, "Role", "autonodes")["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .filter(|r| r["resources"] == json!(["leases"]) && r.get("resourceNames").is_none())
            .map(|r| r["verbs"].clone())
            .collect()
    };
    let args = |docs: &[serde_json::Value]| -> Vec<String> {
        object(docs, "Deployment", "autonodes")["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .expect("args")
            .iter()
            .filter_map(|a| a.as_str().map(str::to_string))
            .collect()
    };
    let plain = rendered(&values_for_1_20(json!({})));
    assert!(!args(&plain).iter().any(|a| a == "--shard-tenants"));
    assert_eq!(
        lease_rights(&plain),
        vec![json!(["create"])],
        "only the leader Lease's"
    );
    let shared = rendered(&values_for_1_20(json!({
        "replicaCount": 3, "leaderElection": {"shardTenants": true},
    })));
    assert!(args(&shared).iter().any(|a| a == "--shard-tenants"));
    assert_eq!(
        object(&shared, "Deployment", "autonodes")["spec"]["replicas"],
        3
    );
    assert_eq!(
        lease_rights(&shared),
        vec![json!(["create"]), json!(["list", "update", "delete"])],
        "every member's Lease"
    );
    let refused = helm_chart(
        "render",
        &values_for_1_20(json!({"leaderElection": {"enabled": false, "shardTenants": true}})),
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("needs leaderElection.enabled"),
        "{stderr}"
    );
}

#[test]
fn the_chart_makes_a_disruption_budget_only_for_more_than_one_replica_and_honours_digest_and_spread(
) {
    let kinds = |values: serde_json::Value| -> Vec<serde_json::Value> {
        documents(&render_chart(&values_for_1_20(values)))
    };
    let pdb = |docs: &[serde_json::Value]| {
        docs.iter()
            .find(|d| d["kind"] == "PodDisruptionBudget")
            .cloned()
    };
    assert!(
        pdb(&kinds(json!({"replicaCount": 1}))).is_none(),
        "one replica: a budget would block every drain"
    );
    let max = pdb(&kinds(
        json!({"podDisruptionBudget": {"maxUnavailable": 1}}),
    ))
    .expect("budget");
    assert_eq!(max["spec"]["maxUnavailable"], 1);
    assert!(max["spec"].get("minAvailable").is_none());
    let digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    let docs = kinds(json!({
        "image": {"repository": "registry.example.com/autonodes", "digest": digest},
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"}
        ]
    }));
    let deploy = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("Deployment");
    let pod = &deploy["spec"]["template"]["spec"];
    assert_eq!(
        pod["containers"][0]["image"],
        format!("registry.example.com/autonodes@{digest}")
    );
    let spread = &pod["topologySpreadConstraints"][0];
    assert_eq!(spread["topologyKey"], "topology.kubernetes.io/zone");
    assert_eq!(
        spread["labelSelector"]["matchLabels"], deploy["spec"]["selector"]["matchLabels"],
        "the constraint selects the chart's own pods"
    );
}

/// A kubeconfig for `server` that authenticates as admin but impersonates `user`.
fn impersonating_kubeconfig(server: &autonodes_testenv::testenv::ApiServer, user: &str) -> String {
    use base64::Engine as _;
    let ca = base64::engine::general_purpose::STANDARD.encode(&server.ca_pem);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: mgmt\n  cluster:\n    server: {}\n    certificate-authority-data: {ca}\nusers:\n- name: sa\n  user:\n    token: {}\n    as: {user}\ncontexts:\n- name: mgmt\n  context:\n    cluster: mgmt\n    user: sa\ncurrent-context: mgmt\n",
        server.url, server.admin_token
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_with_only_the_charts_rbac_provisions_a_claim_and_cleans_it_up() {
    // The chart's RBAC is for a management cluster that is not the host (whose rights the
    // host kubeconfig Secret carries).
    let opts = WorldOptions {
        separate_host: true,
        ..WorldOptions::default()
    };
    let mut world = World::start_clusters(&opts).await;
    let env = &world.playground.env;
    let mgmt = world.playground.mgmt().expect("mgmt");

    // The default install reads no Secret outside its own namespace: no ClusterRole grants
    // Secrets at all.
    let defaults = documents(&render_chart(&values_for_1_20(json!({}))));
    for d in defaults.iter().filter(|d| d["kind"] == "ClusterRole") {
        for rule in d["rules"].as_array().into_iter().flatten() {
            assert!(
                !rule["resources"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|r| r == "secrets"),
                "the default ClusterRole {} grants {rule}",
                d["metadata"]["name"]
            );
        }
    }

    // The chart's ServiceAccount and RBAC, for real, with the tenant's namespace listed, and
    // the replicas sharing the tenants (which needs the most of Leases).
    let rendered = render_chart(&values_for_1_20(json!({
        "rbac": {"tenantNamespaces": [NS]},
        "leaderElection": {"shardTenants": true},
    })));
    let rbac: Vec<serde_json::Value> = documents(&rendered)
        .into_iter()
        .filter(|d| {
            matches!(
                d["kind"].as_str(),
                Some(
                    "ServiceAccount"
                        | "ClusterRole"
                        | "ClusterRoleBinding"
                        | "Role"
                        | "RoleBinding"
                )
            )
        })
        .collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("rbac.json");
    std::fs::write(
        &file,
        json!({"apiVersion": "v1", "kind": "List", "items": rbac}).to_string(),
    )
    .expect("write");
    println!(
        "{}",
        kubectl_ok(env, mgmt, &["apply", "-f", path_str(&file)])
    );

    let user = "system:serviceaccount:autonodes-system:autonodes";
    let kc_path = dir.path().join("sa.kubeconfig");
    std::fs::write(&kc_path, impersonating_kubeconfig(mgmt, user)).expect("write kubeconfig");
    let client = autonodes::run::management_client(Some(&kc_path))
        .await
        .expect("client");

    // It really is the ServiceAccount: what the chart does not grant is refused — Secrets
    // are listed nowhere but in the tenant namespace it names.
    let can = |args: &[&str]| {
        let out = kubectl(
            env,
            mgmt,
            &[&["auth", "can-i"][..], args, &["--as", user]].concat(),
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(can(&["list", "secrets", "--all-namespaces"]), "no");
    assert_eq!(can(&["get", "secrets", "-n", "default"]), "no");
    assert_eq!(can(&["get", "secrets", "-n", NS]), "yes");
    assert_eq!(can(&["list", "leases", "-n", "autonodes-system"]), "yes");
    assert_eq!(can(&["list", "leases", "-n", "default"]), "no");
    // It really is the ServiceAccount: what the chart does not grant is refused.
    let denied = Api::<Secret>::namespaced(client.clone(), "kube-system")
        .delete("anything", &Default::default())
        .await;
    assert!(
        matches!(&denied, Err(kube::Error::Api(s)) if s.code == 403),
        "deleting Secrets must be forbidden: {denied:?}"
    );
    let can_i = kubectl_ok(env, mgmt, &["auth", "can-i", "--list", "--as", user]);
    println!("== kubectl auth can-i --list --as {user}\n{can_i}");

    world.start_simulator(opts.mode).await;
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    // As the chart runs it: the vCluster import on, in the listed tenant namespace.
    let mut config = world.config.clone();
    config.vcluster_import =
        autonodes::controller::config::ImportScope::Namespaces(vec![NS.to_string()]);
    let task = tokio::spawn(async move {
        let options = RunOptions {
            metrics_addr: "127.0.0.1:0".parse().expect("address"),
            metrics_auth: false,
            leader: Some(LeaderConfig {
                shard_tenants: true,
                ..LeaderConfig::new("autonodes-system", "autonodes", Duration::from_secs(15))
            }),
            bound: None,
        };
        run_with_options(client, config, options, async move {
            let _ = stop_rx.wait_for(|v| *v).await;
        })
        .await
    });

    world.claim_type("rbac-only", "standard-node").await;
    let claim = world.wait_phase("rbac-only", "Available", AVAILABLE).await;
    println!(
        "claim rbac-only is {:?} on {:?} with only the chart's RBAC",
        claim.status.as_ref().and_then(|s| s.phase),
        claim.status.as_ref().and_then(|s| s.node_name.clone())
    );
    let lease = Api::<Lease>::namespaced(world.mgmt.clone(), "autonodes-system")
        .get("autonodes")
        .await
        .expect("the Lease exists");
    assert!(
        lease.spec.and_then(|s| s.holder_identity).is_some(),
        "the controller holds the Lease"
    );
    let members = Api::<Lease>::namespaced(world.mgmt.clone(), "autonodes-system")
        .list(&kube::api::ListParams::default().labels("autonodes.io/member"))
        .await
        .expect("member Leases listed");
    assert_eq!(members.items.len(), 1, "the replica's member Lease");
    assert!(
        !world.events_for(NS, "rbac-only").await.is_empty(),
        "events were recorded"
    );

    world.delete_claim("rbac-only").await;
    world.wait_claim_gone("rbac-only", AVAILABLE).await;
    assert!(world.vms().await.is_empty(), "the VM is gone");

    // The vCluster import reads the chart's Secret and writes its pool with this RBAC too.
    let config = "privateNodes:\n  enabled: true\n  autoNodes:\n  - provider: kubevirt-provider-advanced\n    static:\n    - {name: none, quantity: 0}\n";
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "vc-config-tenant", "labels": {"app": "vcluster", "release": "tenant"}},
        "stringData": {"config.yaml": config},
    }))
    .expect("secret");
    Api::<Secret>::namespaced(world.mgmt.clone(), NS)
        .create(&Default::default(), &secret)
        .await
        .expect("config Secret");
    let pool = world.wait_pool("tenant-none", "imported", |_| true).await;
    println!(
        "imported with the chart's RBAC: NodePool {}",
        pool.name_any()
    );

    let _ = stop_tx.send(true);
    let result = tokio::time::timeout(autonodes::run::SHUTDOWN_GRACE * 2, task)
        .await
        .expect("the controller stops")
        .expect("no panic");
    assert!(result.is_ok(), "{result:?}");
    let lease = Api::<Lease>::namespaced(world.mgmt.clone(), "autonodes-system")
        .get("autonodes")
        .await
        .expect("the Lease exists");
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity),
        None,
        "released on shutdown"
    );
    world.shutdown().await;
}

/// Every option operator charts usually have, set (the ServiceMonitor's apart: a plain API
/// server has no such kind).
fn operator_options() -> serde_json::Value {
    json!({
        "additionalLabels": {"team": "platform"},
        "additionalAnnotations": {"owner": "platform@example.com"},
        "service": {"annotations": {"owner": "metrics"}},
        "rbac": {"aggregateToEdit": true},
        "controller": {"envFrom": [{"secretRef": {"name": "autonodes-env"}}]},
        "revisionHistoryLimit": 3,
        "strategy": {"type": "Recreate"},
        "dnsPolicy": "Default",
        "extraVolumes": [{"name": "metrics-tls", "secret": {"secretName": "metrics-tls"}}],
        "extraVolumeMounts": [{"name": "metrics-tls", "mountPath": "/tls", "readOnly": true}],
        "extraObjects": [
            {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": "extra-{{ .Release.Name }}", "namespace": "{{ .Release.Namespace }}"}},
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: extra-string\n"
        ],
        "metricsReaderBinding": {"serviceAccountName": "prometheus-k8s", "namespace": "monitoring"}
    })
}

/// The objects of the chart rendered with `values`.
fn rendered(values: &serde_json::Value) -> Vec<serde_json::Value> {
    documents(&render_chart(values))
}

fn object<'a>(docs: &'a [serde_json::Value], kind: &str, name: &str) -> &'a serde_json::Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind}/{name} rendered"))
}

#[test]
fn the_operator_chart_options_land_on_the_objects_they_name_and_the_defaults_stay_lean() {
    // The defaults: a read-only role aggregated into view, none into edit; memory sized
    // from the benchmarks; RollingUpdate with a surge; ClusterFirst; 10 old ReplicaSets.
    let defaults = rendered(&json!({}));
    let view = object(&defaults, "ClusterRole", "autonodes-view");
    assert_eq!(
        view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"],
        "true"
    );
    assert_eq!(view["rules"][0]["verbs"], json!(["get", "list", "watch"]));
    assert!(
        !defaults
            .iter()
            .any(|d| d["metadata"]["name"] == "autonodes-edit"),
        "no edit role by default"
    );
    let deploy = object(&defaults, "Deployment", "autonodes");
    assert_eq!(deploy["spec"]["revisionHistoryLimit"], 10);
    assert_eq!(
        deploy["spec"]["strategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}})
    );
    let pod = &deploy["spec"]["template"]["spec"];
    assert_eq!(pod["dnsPolicy"], "ClusterFirst");
    assert_eq!(
        pod["containers"][0]["resources"]["limits"]["memory"],
        "512Mi"
    );
    assert!(pod["containers"][0].get("envFrom").is_none());
    for d in &defaults {
        assert!(
            d["metadata"].get("annotations").is_none(),
            "no annotations by default: {}",
            d["metadata"]
        );
    }

    let mut values = operator_options();
    values["serviceMonitor"] = json!({
        "enabled": true,
        "relabelings": [{"targetLabel": "cluster", "replacement": "mgmt"}],
        "metricRelabelings": [{"sourceLabels": ["__name__"], "regex": "go_.*", "action": "drop"}]
    });
    let lint = helm_chart("lint", &values);
    assert!(
        lint.status.success(),
        "helm lint: {}",
        String::from_utf8_lossy(&lint.stdout)
    );
    let docs = rendered(&values);
    // Every object of the chart carries the labels and annotations; an object's own
    // annotation wins on the same key.
    for d in docs.iter().filter(|d| {
        !d["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .starts_with("extra-")
    }) {
        assert_eq!(
            d["metadata"]["labels"]["team"], "platform",
            "{}",
            d["metadata"]
        );
        let want = if d["kind"] == "Service" {
            "metrics"
        } else {
            "platform@example.com"
        };
        assert_eq!(
            d["metadata"]["annotations"]["owner"], want,
            "{}",
            d["metadata"]
        );
    }
    let deploy = object(&docs, "Deployment", "autonodes");
    assert_eq!(
        deploy["spec"]["template"]["metadata"]["labels"]["team"],
        "platform"
    );
    assert_eq!(deploy["spec"]["revisionHistoryLimit"], 3);
    assert_eq!(
        deploy["spec"]["strategy"],
        json!({"type": "Recreate"}),
        "Recreate takes no rollingUpdate"
    );
    let pod = &deploy["spec"]["template"]["spec"];
    assert_eq!(pod["dnsPolicy"], "Default");
    let c = &pod["containers"][0];
    assert_eq!(
        c["envFrom"],
        json!([{"secretRef": {"name": "autonodes-env"}}])
    );
    assert_eq!(
        c["volumeMounts"][1],
        json!({"name": "metrics-tls", "mountPath": "/tls", "readOnly": true})
    );
    assert_eq!(pod["volumes"][1]["secret"]["secretName"], "metrics-tls");
    assert_eq!(
        object(&docs, "ConfigMap", "extra-autonodes")["metadata"]["namespace"],
        "autonodes-system",
        "a map in extraObjects is rendered as a template"
    );
    object(&docs, "ConfigMap", "extra-string");
    let edit = object(&docs, "ClusterRole", "autonodes-edit");
    assert_eq!(
        edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"],
        "true"
    );
    assert!(edit["rules"][0]["verbs"]
        .as_array()
        .expect("verbs")
        .contains(&json!("create")));
    let endpoint = &object(&docs, "ServiceMonitor", "autonodes")["spec"]["endpoints"][0];
    assert_eq!(endpoint["relabelings"][0]["targetLabel"], "cluster");
    assert_eq!(endpoint["metricRelabelings"][0]["action"], "drop");
    let reader = object(&docs, "ClusterRoleBinding", "autonodes-metrics-reader");
    assert_eq!(
        reader["subjects"],
        json!([{"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}])
    );

    // The other ways to authorize the scrape: a Secret of one's own, or Prometheus' token.
    let secret = rendered(
        &json!({"serviceMonitor": {"enabled": true, "authorization": "secret",
        "tokenSecret": {"name": "prom-token"}}}),
    );
    assert_eq!(
        object(&secret, "ServiceMonitor", "autonodes")["spec"]["endpoints"][0]["authorization"]
            ["credentials"],
        json!({"name": "prom-token", "key": "token"})
    );
    assert!(!secret
        .iter()
        .any(|d| d["metadata"]["name"] == "autonodes-metrics-scraper"));
    let own =
        rendered(&json!({"serviceMonitor": {"enabled": true, "authorization": "prometheusToken"}}));
    assert_eq!(
        object(&own, "ServiceMonitor", "autonodes")["spec"]["endpoints"][0]["bearerTokenFile"],
        "/var/run/secrets/kubernetes.io/serviceaccount/token"
    );
    let missing = helm_chart(
        "render",
        &json!({"serviceMonitor": {"enabled": true, "authorization": "secret"}}),
    );
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("needs serviceMonitor.tokenSecret.name"),
        "{}",
        String::from_utf8_lossy(&missing.stderr)
    );
}

/// A stand-in for Cluster API's own `machines.cluster.x-k8s.io` CRD: its group, kind and
/// names, with an open schema (what kubectl resolves is all this test reads).
const CLUSTER_API_MACHINES_CRD: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: machines.cluster.x-k8s.io
spec:
  group: cluster.x-k8s.io
  names: {kind: Machine, listKind: MachineList, plural: machines, singular: machine, shortNames: [ma]}
  scope: Namespaced
  versions:
    - name: v1beta1
      served: true
      storage: true
      schema:
        openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_api_mirror_is_off_by_default_so_kubectl_get_machines_finds_cluster_apis_own_machines(
) {
    // Rendered: off by default (no CRD, no rights, no flag); on, all three; the
    // cluster-autoscaler's Role without the mirror is refused.
    let off = documents(&render_chart(&values_for_1_20(json!({}))));
    let on_text = render_chart(&values_for_1_20(
        json!({"clusterAutoscaler": {"mirror": {"enabled": true}}}),
    ));
    let on = documents(&on_text);
    let crds = |docs: &[serde_json::Value]| -> Vec<String> {
        docs.iter()
            .filter(|d| d["kind"] == "CustomResourceDefinition")
            .map(|d| d["metadata"]["name"].as_str().unwrap_or("?").to_string())
            .collect()
    };
    let args = |docs: &[serde_json::Value]| -> Vec<String> {
        let deploy = object(docs, "Deployment", "autonodes");
        deploy["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .expect("args")
            .iter()
            .map(|a| a.as_str().unwrap_or_default().to_string())
            .collect()
    };
    let capi_role = |docs: &[serde_json::Value]| {
        docs.iter()
            .any(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == "autonodes-capi")
    };
    assert!(crds(&off).is_empty(), "{:?}", crds(&off));
    assert!(!args(&off).contains(&"--capi-mirror".to_string()));
    assert!(!capi_role(&off));
    assert_eq!(
        crds(&on),
        [
            "machinepools.capi.autonodes.io",
            "machines.capi.autonodes.io",
            "machinesets.capi.autonodes.io"
        ]
    );
    assert!(args(&on).contains(&"--capi-mirror".to_string()));
    assert!(capi_role(&on));
    // Where the autonodes-crd chart owns the mirror's CRDs: the mirror runs, no CRD here.
    let without_crds = documents(&render_chart(&values_for_1_20(
        json!({"clusterAutoscaler": {"mirror": {"enabled": true, "crds": false}}}),
    )));
    assert!(crds(&without_crds).is_empty());
    assert!(args(&without_crds).contains(&"--capi-mirror".to_string()) && capi_role(&without_crds));
    for crd in on
        .iter()
        .filter(|d| d["kind"] == "CustomResourceDefinition")
    {
        assert_eq!(
            crd["metadata"]["annotations"]["helm.sh/resource-policy"], "keep",
            "{}",
            crd["metadata"]
        );
        assert_eq!(
            crd["metadata"]["labels"]["app.kubernetes.io/managed-by"],
            "Helm"
        );
    }
    let refused = helm_chart(
        "render",
        &values_for_1_20(json!({"clusterAutoscaler": {"rbac": {"create": true}}})),
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("needs clusterAutoscaler.mirror.enabled"),
        "{stderr}"
    );

    // A management cluster that runs Cluster API: its Machine CRD, one Machine, and the
    // chart installed with its defaults (crds/ as Helm creates them).
    let env = common::start(&["mgmt"]).await;
    let mgmt = env.apiserver("mgmt").expect("mgmt");
    let dir = tempfile::tempdir().expect("tempdir");
    let capi_crd = dir.path().join("cluster-api-machines.yaml");
    std::fs::write(&capi_crd, CLUSTER_API_MACHINES_CRD).expect("write");
    kubectl_ok(&env, mgmt, &["create", "-f", path_str(&capi_crd)]);
    kubectl_ok(
        &env,
        mgmt,
        &[
            "create",
            "--validate=false",
            "-f",
            path_str(&repo().join("charts/autonodes/crds")),
        ],
    );
    common::wait_established(
        &env,
        mgmt,
        &[
            "crd/machines.cluster.x-k8s.io",
            "crd/nodeclaims.autonodes.io",
            "crd/nodepools.autonodes.io",
        ],
    );
    let machine = dir.path().join("machine.yaml");
    std::fs::write(
        &machine,
        "apiVersion: cluster.x-k8s.io/v1beta1\nkind: Machine\nmetadata: {name: worker-0, namespace: default}\nspec: {clusterName: prod}\n",
    )
    .expect("write");
    kubectl_ok(&env, mgmt, &["create", "-f", path_str(&machine)]);

    // With the defaults, `kubectl get machines` is Cluster API's.
    let listed = kubectl_ok(&env, mgmt, &["get", "machines", "-A", "-o", "name"]);
    println!("$ kubectl get machines -A -o name   # autonodes with its defaults\n{listed}");
    assert_eq!(listed.trim(), "machine.cluster.x-k8s.io/worker-0");

    // With the mirror on, both groups are served; their full names keep them apart.
    let mirror_crds = dir.path().join("mirror-crds.yaml");
    // The rendered template as Helm would apply it (YAML: kubectl 1.20 cannot read a
    // one-line JSON document this long).
    let template = on_text
        .split("---\n# Source: ")
        .find(|part| part.starts_with("autonodes/templates/capi-crds.yaml"))
        .expect("the capi-crds template rendered");
    std::fs::write(&mirror_crds, format!("# Source: {template}")).expect("write");
    kubectl_ok(
        &env,
        mgmt,
        &["create", "--validate=false", "-f", path_str(&mirror_crds)],
    );
    common::wait_established(
        &env,
        mgmt,
        &[
            "crd/machines.capi.autonodes.io",
            "crd/machinepools.capi.autonodes.io",
        ],
    );
    let theirs = kubectl_ok(
        &env,
        mgmt,
        &["get", "machines.cluster.x-k8s.io", "-A", "-o", "name"],
    );
    assert_eq!(theirs.trim(), "machine.cluster.x-k8s.io/worker-0");
    let ours = kubectl(
        &env,
        mgmt,
        &["get", "machines.capi.autonodes.io", "-A", "-o", "name"],
    );
    assert!(
        ours.status.success() && ours.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&ours.stderr)
    );
    let bare = kubectl(&env, mgmt, &["get", "machines", "-A", "-o", "name"]);
    println!(
        "$ kubectl get machines.cluster.x-k8s.io -A -o name   # mirror on\n{theirs}\
         $ kubectl get machines -A -o name   # mirror on: kubectl picks one group by name\n{}",
        String::from_utf8_lossy(&bare.stdout)
    );
}

/// Runs Helm's own `install` or `upgrade` (`scripts/helm-chart.py`, Helm v4's library) of
/// `chart` as release `name` in `autonodes-system` against the cluster of `kubeconfig`.
fn helm_release(
    command: &str,
    chart: &std::path::Path,
    name: &str,
    kubeconfig: &std::path::Path,
    values: &serde_json::Value,
) -> serde_json::Value {
    let out = std::process::Command::new(opscommon::helm_python())
        .arg(repo().join("scripts/helm-chart.py"))
        .arg(command)
        .arg(chart)
        .args(["--name", name, "--namespace", "autonodes-system"])
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--values")
        .arg(values.to_string())
        .output()
        .expect("helm-chart.py runs");
    assert!(
        out.status.success(),
        "helm {command} {name}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the release as JSON")
}

/// Copies directory `from` into `to` (created), recursively.
fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read_dir") {
        let path = entry.expect("entry").path();
        let target = to.join(path.file_name().expect("name"));
        if path.is_dir() {
            copy_dir(&path, &target);
        } else {
            std::fs::copy(&path, &target).expect("copy");
        }
    }
}

/// `scripts/helm-chart.py COMMAND charts/autonodes-crd` with `values`.
fn crd_chart(command: &str, values: &serde_json::Value) -> std::process::Output {
    std::process::Command::new(opscommon::helm_python())
        .arg(repo().join("scripts/helm-chart.py"))
        .arg(command)
        .arg(repo().join("charts/autonodes-crd"))
        .arg("--values")
        .arg(values.to_string())
        .output()
        .expect("helm-chart.py runs")
}

#[test]
fn the_crd_chart_lints_and_renders_autonodes_crds_and_the_mirrors_only_when_asked() {
    let lint = crd_chart("lint", &json!({}));
    assert!(
        lint.status.success(),
        "{}",
        String::from_utf8_lossy(&lint.stdout)
    );
    let typo = crd_chart("render", &json!({"capiMirorr": {"enabled": true}}));
    assert!(!typo.status.success(), "the values schema refuses a typo");
    let crds = |values: serde_json::Value| -> Vec<serde_json::Value> {
        let out = crd_chart("render", &values);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        documents(&String::from_utf8_lossy(&out.stdout))
    };
    let default = crds(json!({}));
    assert_eq!(default.len(), 5, "autonodes.io's five kinds");
    assert!(default.iter().all(|c| c["spec"]["group"] == "autonodes.io"
        && c["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        && c["metadata"]["labels"]["helm.sh/chart"]
            == format!("autonodes-crd-{}", env!("CARGO_PKG_VERSION"))));
    let mirror = crds(json!({"capiMirror": {"enabled": true}, "keep": false}));
    assert_eq!(mirror.len(), 8);
    assert_eq!(
        mirror
            .iter()
            .filter(|c| c["spec"]["group"] == "capi.autonodes.io")
            .count(),
        3
    );
    assert!(mirror
        .iter()
        .all(|c| c["metadata"].get("annotations").is_none()));
}

#[test]
fn the_crd_charts_files_are_the_generated_crds() {
    assert_copies_of_generated_crds(&[
        ("crds", "charts/autonodes-crd/files/autonodes"),
        ("crds/capi", "charts/autonodes-crd/files/capi"),
    ]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_of_the_previous_version_upgraded_with_both_charts_serves_the_new_crd_field() {
    const PREVIOUS: &str = "0.0.9";
    // The previous release: this version's two charts one version back, its NodePool CRD
    // without the field this version added (`spec.weight`, as if it were new).
    let dir = tempfile::tempdir().expect("tempdir");
    let (prev_crd, prev_main) = (
        dir.path().join("prev/autonodes-crd"),
        dir.path().join("prev/autonodes"),
    );
    copy_dir(&repo().join("charts/autonodes-crd"), &prev_crd);
    copy_dir(&repo().join("charts/autonodes"), &prev_main);
    for chart in [&prev_crd, &prev_main] {
        let file = chart.join("Chart.yaml");
        let text = std::fs::read_to_string(&file).expect("Chart.yaml");
        let version = env!("CARGO_PKG_VERSION");
        let text = text
            .replace(
                &format!("\nversion: {version}\n"),
                &format!("\nversion: {PREVIOUS}\n"),
            )
            .replace(
                &format!("appVersion: \"{version}\""),
                &format!("appVersion: \"{PREVIOUS}\""),
            );
        assert!(text.contains(&format!("version: {PREVIOUS}")), "{text}");
        std::fs::write(&file, text).expect("write");
    }
    let pools_file = prev_crd.join("files/autonodes/nodepools.autonodes.io.yaml");
    let mut pools: serde_json::Value = autonodes_core::yaml::from_str(
        &std::fs::read_to_string(&pools_file).expect("the NodePool CRD"),
    )
    .expect("YAML");
    let spec = pools
        .pointer_mut("/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties")
        .and_then(|p| p.as_object_mut())
        .expect("the NodePool spec's properties");
    assert!(
        spec.remove("weight").is_some(),
        "this version's NodePool has spec.weight"
    );
    std::fs::write(
        &pools_file,
        serde_json::to_string_pretty(&pools).expect("JSON"),
    )
    .expect("write");

    let env = common::start(&["mgmt"]).await;
    let mgmt = env.apiserver("mgmt").expect("mgmt");
    kubectl_ok(&env, mgmt, &["create", "namespace", "autonodes-system"]);
    let kubeconfig = mgmt.kubeconfig_path.clone();
    let main_values = values_for_1_20(json!({}));

    // Install the previous version: the CRD chart first, then the controller's chart
    // without its crds/, as `helm install --skip-crds` does (the CRD chart owns them; Helm 4
    // would server-side apply crds/ over them, which a server before 1.25 refuses for their
    // CEL rules).
    std::fs::remove_dir_all(prev_main.join("crds")).expect("rm crds/");
    let crd = helm_release(
        "install",
        &prev_crd,
        "autonodes-crd",
        &kubeconfig,
        &json!({}),
    );
    let main = helm_release(
        "install",
        &prev_main,
        "autonodes",
        &kubeconfig,
        &main_values,
    );
    println!("== installed {PREVIOUS}: {crd} {main}");
    common::wait_established(&env, mgmt, &["crd/nodepools.autonodes.io"]);
    let pool = dir.path().join("pool.yaml");
    std::fs::write(
        &pool,
        "apiVersion: autonodes.io/v1alpha1\nkind: NodePool\nmetadata: {name: workers, namespace: default}\nspec: {vClusterRef: {name: tenant}, providerRef: kubevirt, weight: 7}\n",
    )
    .expect("write");
    let weight = || {
        kubectl_ok(
            &env,
            mgmt,
            &[
                "get",
                "nodepools.autonodes.io",
                "workers",
                "-n",
                "default",
                "-o",
                "jsonpath={.spec.weight}",
            ],
        )
    };
    kubectl_ok(
        &env,
        mgmt,
        &["apply", "--validate=false", "-f", path_str(&pool)],
    );
    assert_eq!(weight(), "", "the previous CRD prunes spec.weight");

    // Upgrade both charts to this version: the CRD chart upgrades the CRDs.
    let crd = helm_release(
        "upgrade",
        &repo().join("charts/autonodes-crd"),
        "autonodes-crd",
        &kubeconfig,
        &json!({}),
    );
    let main = helm_release(
        "upgrade",
        &repo().join("charts/autonodes"),
        "autonodes",
        &kubeconfig,
        &main_values,
    );
    println!("== upgraded to {}: {crd} {main}", env!("CARGO_PKG_VERSION"));
    for release in [&crd, &main] {
        assert_eq!(release["revision"], 2, "{release}");
        assert_eq!(release["status"], "deployed", "{release}");
    }
    let labels = kubectl_ok(
        &env,
        mgmt,
        &[
            "get",
            "crd",
            "nodepools.autonodes.io",
            "-o",
            "jsonpath={.metadata.labels.helm\\.sh/chart}",
        ],
    );
    assert_eq!(
        labels,
        format!("autonodes-crd-{}", env!("CARGO_PKG_VERSION"))
    );
    common::eventually(
        "spec.weight to be served",
        Duration::from_secs(30),
        || async {
            let out = kubectl(
                &env,
                mgmt,
                &["apply", "--validate=false", "-f", path_str(&pool)],
            );
            (out.status.success() && weight() == "7").then_some(())
        },
    )
    .await;
    println!(
        "== NodePool workers: spec.weight {} after the upgrade",
        weight()
    );
    let deployed = kubectl_ok(
        &env,
        mgmt,
        &[
            "-n",
            "autonodes-system",
            "get",
            "deployment",
            "autonodes",
            "-o",
            "jsonpath={.metadata.labels.app\\.kubernetes\\.io/version}",
        ],
    );
    assert_eq!(deployed, env!("CARGO_PKG_VERSION"));
}

#[test]
fn the_prometheus_rules_runbook_links_point_where_the_book_is_hosted_each_at_its_own_section() {
    let rules = |values: serde_json::Value| -> Vec<(String, String)> {
        let docs = rendered(&values);
        let rule = docs
            .iter()
            .find(|d| d["kind"] == "PrometheusRule")
            .expect("a PrometheusRule");
        rule["spec"]["groups"]
            .as_array()
            .expect("groups")
            .iter()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .filter_map(|r| {
                Some((
                    r["alert"].as_str()?.to_string(),
                    r["annotations"]["runbook_url"].as_str()?.to_string(),
                ))
            })
            .collect()
    };
    let default = rules(json!({"prometheusRule": {"enabled": true}}));
    assert!(default.len() >= 10);
    for (alert, url) in &default {
        assert!(
            url.ends_with(&format!("operations.md#{}", alert.to_lowercase())),
            "{alert}: {url}"
        );
    }
    let base = "https://docs.example.com/autonodes/operations.html";
    let hosted = rules(json!({"prometheusRule": {"enabled": true, "runbookBaseUrl": base}}));
    assert_eq!(hosted.len(), default.len());
    for (alert, url) in &hosted {
        assert_eq!(url, &format!("{base}#{}", alert.to_lowercase()));
    }
    let refused = helm_chart(
        "render",
        &json!({"prometheusRule": {"enabled": true, "runbookBaseUrl": format!("{base}#x")}}),
    );
    assert!(
        !refused.status.success(),
        "a base URL with an anchor is refused"
    );
}

//! Foundation: the CRDs on a real kube-apiserver, the scale subresource, printer columns,
//! schema validation, and a test environment that cleans up after itself.

use crate::common;

use std::time::Duration;

use autonodes_api::{NodePool, NodeProvider};
use common::*;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::ResourceExt;
use serde_json::json;

fn dynamic_api(
    client: kube::Client,
    kind: &str,
    plural: &str,
    ns: Option<&str>,
) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("autonodes.io", "v1alpha1", kind);
    let ar = ApiResource::from_gvk_with_plural(&gvk, plural);
    match ns {
        Some(ns) => Api::namespaced_with(client, ns, &ar),
        None => Api::all_with(client, &ar),
    }
}

async fn create_err(api: &Api<DynamicObject>, body: serde_json::Value) -> String {
    let obj: DynamicObject =
        serde_json::from_value(body).expect("test object is a valid DynamicObject");
    match api.create(&PostParams::default(), &obj).await {
        Ok(o) => panic!(
            "the API server accepted {}, which the schema must reject",
            o.name_any()
        ),
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "expected 422 Invalid, got {status:?}");
            status.message
        }
        Err(e) => panic!("unexpected error: {e}"),
    }
}

#[tokio::test]
async fn crds_apply_cleanly_become_established_and_explain_shows_the_doc_text() {
    let env = start(&["mgmt"]).await;
    let mgmt = env.apiserver("mgmt").expect("mgmt server");
    apply_crds_dir(&env, mgmt);
    let established = kubectl_ok(&env, mgmt, &["get", "crd", "-o", "name"]);
    for crd in ["nodeclaims", "nodepools", "nodeproviders", "nodetypes"] {
        assert!(
            established.contains(&format!("{crd}.autonodes.io")),
            "{crd} missing from {established}"
        );
    }
    // The OpenAPI document is published a moment after the CRD is established.
    let explain = eventually(
        "kubectl explain to show the requirement docs",
        Duration::from_secs(60),
        || async {
            let out = kubectl(&env, mgmt, &["explain", "nodeclaims.spec.requirements"]);
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            (out.status.success() && text.contains("operator")).then_some(text)
        },
    )
    .await;
    assert!(
        explain.contains("Requirements every candidate node type's properties must meet"),
        "kubectl explain did not show the field's doc comment:\n{explain}"
    );
    assert!(
        explain.contains("Gt, Lt"),
        "operator docs missing:\n{explain}"
    );
}

#[tokio::test]
async fn reference_advanced_provider_is_accepted_and_stored_without_pruning() {
    let env = start(&["mgmt"]).await;
    let mgmt = env.apiserver("mgmt").expect("mgmt server");
    apply_crds_dir(&env, mgmt);
    let file = repo().join("examples/nodeprovider-advanced.yaml");
    kubectl_ok(&env, mgmt, &["apply", "-f", path_str(&file)]);

    let local: NodeProvider =
        autonodes_core::yaml::from_str(&std::fs::read_to_string(&file).expect("example readable"))
            .expect("the example deserializes into a NodeProvider");
    let api: Api<NodeProvider> = Api::all(mgmt.client().await.expect("client"));
    let stored = api
        .get("kubevirt-provider-advanced")
        .await
        .expect("provider stored");
    assert_eq!(
        stored.spec, local.spec,
        "the API server changed (pruned) the provider spec"
    );
    let high = &stored.spec.kube_virt.node_types[1];
    assert_eq!(high.name, "high-memory-node");
    assert_eq!(high.resources["memory"].0, "16Gi");
    assert_eq!(high.resources["cpu"].0, "4");
}

#[tokio::test]
async fn kubectl_scale_and_the_scale_subresource_change_node_pool_replicas() {
    let env = start(&["mgmt"]).await;
    let mgmt = env.apiserver("mgmt").expect("mgmt server");
    apply_crds_dir(&env, mgmt);
    kubectl_ok(&env, mgmt, &["create", "namespace", "tenant"]);
    let pool = repo().join("examples/nodepool.yaml");
    kubectl_ok(&env, mgmt, &["apply", "-f", path_str(&pool)]);

    let out = kubectl_ok(
        &env,
        mgmt,
        &["-n", "tenant", "scale", "npool/standard", "--replicas=3"],
    );
    assert!(out.contains("scaled"), "kubectl scale said: {out}");
    let api: Api<NodePool> = Api::namespaced(mgmt.client().await.expect("client"), "tenant");
    assert_eq!(
        api.get("standard").await.expect("pool").spec.replicas,
        Some(3)
    );

    let patch = json!({"spec": {"replicas": 5}});
    let scale = api
        .patch_scale(
            "standard",
            &Default::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .expect("PATCH on /scale");
    assert_eq!(scale.spec.and_then(|s| s.replicas), Some(5));
    assert_eq!(
        api.get("standard").await.expect("pool").spec.replicas,
        Some(5)
    );
    let scale = api.get_scale("standard").await.expect("GET on /scale");
    assert_eq!(scale.spec.and_then(|s| s.replicas), Some(5));
}

#[tokio::test]
async fn kubectl_get_prints_the_declared_columns() {
    let env = start(&["mgmt"]).await;
    let mgmt = env.apiserver("mgmt").expect("mgmt server");
    apply_crds_dir(&env, mgmt);
    kubectl_ok(&env, mgmt, &["create", "namespace", "tenant"]);
    for f in [
        "examples/nodeclaim.yaml",
        "examples/nodepool.yaml",
        "examples/nodequota.yaml",
    ] {
        kubectl_ok(&env, mgmt, &["apply", "-f", path_str(&repo().join(f))]);
    }
    let ntype = json!({
        "apiVersion": "autonodes.io/v1alpha1", "kind": "NodeType",
        "metadata": {"name": "manual.small"},
        "spec": {"providerRef": "manual", "resources": {"cpu": 2, "memory": "4Gi"}}
    });
    let api = dynamic_api(
        mgmt.client().await.expect("client"),
        "NodeType",
        "nodetypes",
        None,
    );
    let obj: DynamicObject = serde_json::from_value(ntype).expect("valid object");
    api.create(&PostParams::default(), &obj)
        .await
        .expect("NodeType created");

    let out = kubectl_ok(&env, mgmt, &["get", "ntype,nclaim,npool,nquota", "-A"]);
    let headers: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("NAME") || l.starts_with("NAMESPACE"))
        .collect();
    assert_eq!(headers.len(), 4, "expected four tables:\n{out}");
    let want: [&[&str]; 4] = [
        &[
            "NAME",
            "AVAILABLE",
            "TOTAL",
            "PROVIDER",
            "COST",
            "PHASE",
            "AGE",
        ],
        &[
            "NAMESPACE",
            "NAME",
            "PHASE",
            "REASON",
            "VCLUSTER",
            "NODETYPE",
            "NODE",
            "AGE",
        ],
        &[
            "NAMESPACE",
            "NAME",
            "DESIRED",
            "AVAILABLE",
            "READY",
            "REASON",
            "NODETYPE",
            "VCLUSTER",
            "AGE",
        ],
        &["NAMESPACE", "NAME", "READY", "REASON", "NAMESPACES", "AGE"],
    ];
    for (header, want) in headers.iter().zip(want) {
        let got: Vec<&str> = header.split_whitespace().collect();
        assert_eq!(got, want, "columns of:\n{out}");
    }
    assert!(
        out.contains("manual.small")
            && out.contains("high-memory-1")
            && out.contains("standard")
            && out.contains("teams")
    );
}

#[tokio::test]
async fn a_node_pool_in_vcluster_spelling_is_stored_as_written_and_what_neither_spelling_allows_is_refused(
) {
    let env = start(&["mgmt"]).await;
    let mgmt = env.apiserver("mgmt").expect("mgmt server");
    apply_crds_dir(&env, mgmt);
    kubectl_ok(&env, mgmt, &["create", "namespace", "tenant"]);
    let client = mgmt.client().await.expect("client");
    let dynamic = dynamic_api(client.clone(), "NodePool", "nodepools", Some("tenant"));
    let pool = |name: &str, spec: serde_json::Value| {
        json!({"apiVersion": "autonodes.io/v1alpha1", "kind": "NodePool",
               "metadata": {"name": name, "namespace": "tenant"}, "spec": spec})
    };
    let spec = json!({
        "vClusterRef": {"name": "t"},
        "requirements": [
            {"property": "topology.kubernetes.io/zone", "value": "a"},
            {"property": "tier", "operator": "NotIn", "values": ["spot"]},
            {"key": "gpu", "operator": "Exists"}
        ],
        "limits": {"nodes": "10", "cpu": 64, "memory": "256Gi", "nvidia.com/gpu": "4"},
        "disruption": {
            "consolidateAfter": "Never",
            "consolidationPolicy": "WhenEmpty",
            "budgets": [{"nodes": "10%"}, {"nodes": "0", "schedule": "0 9 * * 1-5", "duration": "8h"}]
        },
        "terminationGracePeriod": "1h",
        "expireAfter": "720h",
        "weight": 50
    });
    let obj: DynamicObject =
        serde_json::from_value(pool("vcluster-style", spec.clone())).expect("object");
    dynamic
        .create(&PostParams::default(), &obj)
        .await
        .expect("the API server takes the vCluster spelling");
    let raw = dynamic.get("vcluster-style").await.expect("stored");
    assert_eq!(
        raw.data["spec"], spec,
        "the API server changed (pruned) the spec"
    );
    let typed: Api<NodePool> = Api::namespaced(client, "tenant");
    let read = typed.get("vcluster-style").await.expect("decodes").spec;
    let keys: Vec<(&str, &str, Vec<String>)> = read
        .requirements
        .iter()
        .map(|r| (r.key.as_str(), r.operator.as_str(), r.values.clone()))
        .collect();
    println!("read back as: {keys:?}");
    assert_eq!(
        keys,
        [
            ("topology.kubernetes.io/zone", "In", vec!["a".to_string()]),
            ("tier", "NotIn", vec!["spot".to_string()]),
            ("gpu", "Exists", vec![]),
        ]
    );
    let limits = read.limits.expect("limits");
    assert_eq!(limits["nvidia.com/gpu"].0, "4");
    assert_eq!(limits["cpu"].0, "64");
    assert_eq!(read.weight, Some(50));

    for (name, bad, says) in [
        (
            "both-key-and-property",
            json!({"vClusterRef": {"name": "t"}, "requirements": [{"key": "a", "property": "a", "value": "x"}]}),
            "spec.requirements",
        ),
        (
            "neither-key-nor-property",
            json!({"vClusterRef": {"name": "t"}, "requirements": [{"operator": "Exists"}]}),
            "spec.requirements",
        ),
        (
            "value-and-values",
            json!({"vClusterRef": {"name": "t"}, "requirements": [{"property": "a", "value": "x", "values": ["y"]}]}),
            "spec.requirements",
        ),
        (
            "budget-nodes",
            json!({"vClusterRef": {"name": "t"}, "disruption": {"budgets": [{"nodes": "ten"}]}}),
            "spec.disruption.budgets.nodes",
        ),
        (
            "policy",
            json!({"vClusterRef": {"name": "t"}, "disruption": {"consolidationPolicy": "Sometimes"}}),
            "spec.disruption.consolidationPolicy",
        ),
        (
            "weight",
            json!({"vClusterRef": {"name": "t"}, "weight": 101}),
            "spec.weight",
        ),
        (
            "grace",
            json!({"vClusterRef": {"name": "t"}, "terminationGracePeriod": "forever"}),
            "spec.terminationGracePeriod",
        ),
        (
            "limit",
            json!({"vClusterRef": {"name": "t"}, "limits": {"nvidia.com/gpu": "four"}}),
            "spec.limits",
        ),
    ] {
        let msg = create_err(&dynamic, pool(name, bad)).await;
        println!("{name}: {msg}");
        assert!(msg.contains(says), "{name}: {msg}");
    }
}

#[tokio::test]
async fn schema_rejects_negative_replicas_unknown_operators_and_missing_required_fields() {
    let env = start(&["mgmt"]).await;
    let mgmt = env.apiserver("mgmt").expect("mgmt server");
    apply_crds_dir(&env, mgmt);
    kubectl_ok(&env, mgmt, &["create", "namespace", "tenant"]);
    let client = mgmt.client().await.expect("client");
    let pools = dynamic_api(client.clone(), "NodePool", "nodepools", Some("tenant"));
    let claims = dynamic_api(client.clone(), "NodeClaim", "nodeclaims", Some("tenant"));
    let providers = dynamic_api(client, "NodeProvider", "nodeproviders", None);

    let msg = create_err(
        &pools,
        json!({
            "apiVersion": "autonodes.io/v1alpha1", "kind": "NodePool",
            "metadata": {"name": "negative", "namespace": "tenant"},
            "spec": {"vClusterRef": {"name": "t"}, "replicas": -1}
        }),
    )
    .await;
    assert!(msg.contains("spec.replicas"), "{msg}");

    let msg = create_err(&claims, json!({
        "apiVersion": "autonodes.io/v1alpha1", "kind": "NodeClaim",
        "metadata": {"name": "bad-op", "namespace": "tenant"},
        "spec": {"vClusterRef": {"name": "t"},
                 "requirements": [{"key": "autonodes.io/node-type", "operator": "Matches", "values": ["x"]}]}
    })).await;
    assert!(
        msg.contains("spec.requirements")
            && msg.contains("operator: Unsupported value: \"Matches\""),
        "{msg}"
    );

    let msg = create_err(
        &claims,
        json!({
            "apiVersion": "autonodes.io/v1alpha1", "kind": "NodeClaim",
            "metadata": {"name": "no-tenant", "namespace": "tenant"},
            "spec": {"typeRef": "p.small"}
        }),
    )
    .await;
    assert!(
        msg.contains("spec.vClusterRef") && msg.contains("Required value"),
        "{msg}"
    );

    let msg = create_err(
        &providers,
        json!({
            "apiVersion": "autonodes.io/v1alpha1", "kind": "NodeProvider",
            "metadata": {"name": "no-namespace"},
            "spec": {"kubeVirt": {"clusterRef": {"cluster": "local"},
                     "nodeTypes": [{"name": "small", "maxCapacity": -3}]}}
        }),
    )
    .await;
    assert!(msg.contains("spec.kubeVirt.clusterRef.namespace"), "{msg}");
    assert!(
        msg.contains("spec.kubeVirt.nodeTypes.maxCapacity")
            && msg.contains("greater than or equal to 0"),
        "{msg}"
    );
}

#[tokio::test]
async fn several_named_api_servers_share_one_etcd_without_seeing_each_others_objects() {
    let env = start(&["mgmt", "host"]).await;
    let mgmt = env.apiserver("mgmt").expect("mgmt");
    let host = env.apiserver("host").expect("host");
    assert_ne!(mgmt.port, host.port);
    kubectl_ok(&env, mgmt, &["create", "namespace", "only-in-mgmt"]);
    let out = kubectl(&env, host, &["get", "namespace", "only-in-mgmt"]);
    assert!(!out.status.success(), "host sees mgmt's namespace");
    assert!(String::from_utf8_lossy(&out.stderr).contains("NotFound"));
}

/// The uid of each CRD of server `name`, which are all established.
async fn crd_uids(
    env: &autonodes_testenv::testenv::TestEnv,
    name: &str,
) -> std::collections::BTreeMap<String, String> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let server = env.apiserver(name).expect("server");
    let api: Api<CustomResourceDefinition> = Api::all(server.client().await.expect("client"));
    let mut uids = std::collections::BTreeMap::new();
    for crd in api.list(&Default::default()).await.expect("CRDs") {
        assert!(
            autonodes_testenv::testenv::crd_established(&crd),
            "{} not established",
            crd.name_any()
        );
        uids.insert(crd.name_any(), crd.uid().unwrap_or_default());
    }
    uids
}

#[tokio::test]
async fn a_server_given_the_crds_an_earlier_server_stored_starts_with_them_established_and_changed_crds_are_applied_anew(
) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds = autonodes_testenv::playground::mgmt_crds();
    let mut env = start(&[]).await;
    add_server(&mut env, "first", crds.clone()).await;
    add_server(&mut env, "second", crds.clone()).await;
    let first = crd_uids(&env, "first").await;
    assert_eq!(first.len(), crds.len());
    // The second server's CRDs are the objects the first stored (the same uids).
    assert_eq!(crd_uids(&env, "second").await, first);
    // Its OpenAPI document has them from the start.
    let second = env.apiserver("second").expect("second");
    let out = kubectl(&env, second, &["explain", "nodeclaims.spec.requirements"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("Requirements every candidate node type"),
        "{out:?}"
    );
    // A set with one CRD changed is applied through the API: objects of its own, the change in.
    let marker = format!("changed {}", uuid::Uuid::new_v4().simple());
    let mut changed = crds.clone();
    if let Some(schema) = changed[0]
        .spec
        .versions
        .iter_mut()
        .find_map(|v| v.schema.as_mut())
        .and_then(|s| s.open_api_v3_schema.as_mut())
    {
        schema.description = Some(marker.clone());
    }
    add_server(&mut env, "third", changed.clone()).await;
    let third = crd_uids(&env, "third").await;
    let name = changed[0].name_any();
    assert_ne!(third[&name], first[&name], "{name} applied anew");
    let api: Api<CustomResourceDefinition> = Api::all(
        env.apiserver("third")
            .expect("third")
            .client()
            .await
            .expect("client"),
    );
    let stored = api.get(&name).await.expect("the changed CRD");
    let description = stored.spec.versions.iter().find_map(|v| {
        v.schema
            .as_ref()?
            .open_api_v3_schema
            .as_ref()?
            .description
            .clone()
    });
    assert_eq!(description.as_deref(), Some(marker.as_str()));
}

#[test]
fn test_env_stops_every_process_it_started_when_dropped_also_on_panic() {
    // Normal drop.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let pids = rt.block_on(async {
        let env = start(&["a", "b"]).await;
        let pids = env.pids();
        assert_eq!(pids.len(), 3, "etcd and two API servers");
        assert!(pids.iter().all(|p| pid_alive(*p)));
        pids
    });
    for pid in &pids {
        assert!(!pid_alive(*pid), "process {pid} outlived its TestEnv");
    }

    // A panicking test: the environment is dropped while unwinding.
    let (tx, rx) = std::sync::mpsc::channel();
    let joined = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let env = start(&["c"]).await;
            tx.send(env.pids()).expect("send pids");
            panic!("deliberate panic with a live TestEnv");
        });
    })
    .join();
    assert!(joined.is_err(), "the thread was meant to panic");
    let pids = rx.recv().expect("pids from the panicking thread");
    assert_eq!(pids.len(), 2);
    for pid in &pids {
        assert!(!pid_alive(*pid), "process {pid} outlived a panicking test");
    }
}

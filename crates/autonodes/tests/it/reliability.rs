//! Reliability on real API servers: a cleanup that cannot finish keeps its finalizer (and
//! with it the claim) until everything the claim created is gone.
use crate::common;

use std::time::Duration;

use autonodes_testenv::playground::{put_kubeconfig_secret, SERVICE_NAMESPACE};
use common::world::*;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};

const WAIT: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleanup_that_cannot_reach_the_host_keeps_the_claim_until_its_vm_is_gone() {
    // The host's kubeconfig Secret goes away: a host of its own.
    let world = World::start(WorldOptions {
        separate_host: true,
        ..WorldOptions::default()
    })
    .await;
    for name in ["keep-a", "keep-b"] {
        world.claim_type(name, "standard-node").await;
    }
    for name in ["keep-a", "keep-b"] {
        world.wait_phase(name, "Available", WAIT).await;
    }
    assert_eq!(world.vms().await.len(), 2);

    // The host's kubeconfig Secret goes away, then the claims are deleted.
    let host_secrets: Api<Secret> = Api::namespaced(world.mgmt.clone(), SERVICE_NAMESPACE);
    host_secrets
        .delete("test-kubevirt-1", &DeleteParams::default())
        .await
        .expect("host kubeconfig Secret deleted");
    // The controller reads a kubeconfig Secret at most once per SECRET_RECHECK; until then
    // it keeps the client it has (and a cleanup in that window would simply succeed).
    tokio::time::sleep(autonodes::remote::clients::SECRET_RECHECK + Duration::from_secs(1)).await;
    for name in ["keep-a", "keep-b"] {
        world.delete_claim(name).await;
    }
    for name in ["keep-a", "keep-b"] {
        let c = world
            .wait_claim(name, "Ready=False/KubeconfigSecretNotFound", WAIT, |c| {
                condition(c, "Ready").is_some_and(|x| x.1 == "KubeconfigSecretNotFound")
            })
            .await;
        assert!(c.metadata.deletion_timestamp.is_some());
        assert_eq!(
            c.status.and_then(|s| s.phase).map(|p| format!("{p:?}")),
            Some("Terminating".into())
        );
        common::eventually(&format!("an Event for {name}"), WAIT, || async {
            let e = world.events_for(NS, name).await;
            e.iter()
                .any(|e| e.starts_with("KubeconfigSecretNotFound"))
                .then_some(())
        })
        .await;
    }
    // The first retries come after 5 s; the old code released the finalizer on the first
    // failed attempt. After several attempts the claims and their VMs are all still there.
    tokio::time::sleep(Duration::from_secs(20)).await;
    for name in ["keep-a", "keep-b"] {
        let c = world
            .claims()
            .get_opt(name)
            .await
            .expect("read claim")
            .unwrap_or_else(|| panic!("claim {name} was released while its VM still exists"));
        assert_eq!(
            condition(&c, "Ready").map(|x| x.1),
            Some("KubeconfigSecretNotFound".into())
        );
    }
    assert_eq!(world.vms().await.len(), 2, "the VMs are still there");
    assert_eq!(world.host_secrets().await.len(), 2);

    // The Secret comes back: the cleanup finishes and nothing is left.
    let host = world.playground.host().expect("host");
    put_kubeconfig_secret(
        &world.mgmt,
        SERVICE_NAMESPACE,
        "test-kubevirt-1",
        "kubeconfig",
        &host.kubeconfig_yaml().expect("kubeconfig"),
    )
    .await
    .expect("host kubeconfig Secret restored");
    for name in ["keep-a", "keep-b"] {
        world.wait_claim_gone(name, WAIT).await;
    }
    common::eventually("no VM, Secret, token or Node left", WAIT, || async {
        (world.vms().await.is_empty()
            && world.host_secrets().await.is_empty()
            && world.tokens().await.is_empty()
            && world.nodes().await.is_empty())
        .then_some(())
    })
    .await;
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_with_500_invalid_node_types_gets_a_short_status_and_others_are_served() {
    let world = World::start(WorldOptions::default()).await;
    // 500 broken entries: their messages together are far beyond the 32 KiB the API
    // allows in one condition message.
    let entries: String = (0..500)
        .map(|i| {
            format!(
                "      - name: broken-node-type-with-a-long-name-{i:03}\n        mergeVirtualMachineTemplate: {{metadata: {{labels: {{a: b}}}}}}\n        virtualMachineTemplate: {{spec: {{template: {{spec: {{domain: {{memory: {{guest: 1Gi}}}}}}}}}}}}\n"
            )
        })
        .collect();
    world
        .apply_provider(&provider_yaml(
            "many-broken",
            "test-kubevirt-1",
            "1",
            "1Gi",
            &entries,
        ))
        .await;
    world.claim_type("good", "standard-node").await;
    let p = world
        .wait_provider("many-broken", "TemplatesValid=False", |p| {
            provider_condition(p, "TemplatesValid").is_some_and(|c| c.0 == "False")
        })
        .await;
    let (_, reason, message) = provider_condition(&p, "TemplatesValid").expect("condition");
    assert_eq!(reason, "InvalidTemplate");
    assert!(
        message.starts_with("500 of 500 node types invalid: node type many-broken.broken-node-type-with-a-long-name-000: "),
        "{message}"
    );
    assert!(message.ends_with("and 497 more"), "{message}");
    assert!(message.len() < 1024, "{}", message.len());
    // Broken types fail themselves, not the provider.
    let ready = provider_condition(&p, "Ready").expect("Ready");
    assert_eq!(ready.0, "True", "{ready:?}");
    // Each type says what is wrong with it.
    let t = world
        .wait_node_type(
            "many-broken.broken-node-type-with-a-long-name-499",
            "Failed",
            |t| {
                t.status
                    .as_ref()
                    .and_then(|s| s.phase)
                    .map(|p| format!("{p:?}"))
                    == Some("Failed".into())
            },
        )
        .await;
    let why = find_condition(&t.status.expect("status").conditions, "Ready").expect("Ready");
    assert_eq!(why.1, "InvalidTemplate");
    world.wait_phase("good", "Available", WAIT).await;
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_with_a_253_character_name_turns_available_and_kubelet_owned_labels_and_reserved_kubelet_flags_are_refused(
) {
    let world = World::start(WorldOptions::default()).await;
    // The longest name a claim may have: every label value and Event name derived from it
    // must be shortened to fit.
    let long = format!("{}-{}", "long".repeat(60), "x".repeat(12));
    assert_eq!(long.len(), 253);
    world.claim_type(&long, "standard-node").await;
    world
        .create_claim(
            serde_json::json!({"metadata": {"name": "evil-label"}, "spec": {
            "typeRef": "kubevirt-provider-advanced.standard-node",
            "labels": {"kubernetes.io/hostname": "evil"}}}),
        )
        .await;
    // `provider_id` is the kubelet's `--provider-id` (it reads `_` as `-`), which would
    // make the node claim another claim's VM.
    world
        .create_claim(
            serde_json::json!({"metadata": {"name": "evil-flag"}, "spec": {
            "typeRef": "kubevirt-provider-advanced.standard-node",
            "kubeletArgs": {"provider_id": "kubevirt://vcluster-platform/other"}}}),
        )
        .await;

    let c = world.wait_phase(&long, "Available", WAIT).await;
    let node = c
        .status
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .expect("node name");
    let labels = world
        .nodes()
        .await
        .into_iter()
        .find(|n| n.metadata.name.as_deref() == Some(node.as_str()))
        .and_then(|n| n.metadata.labels)
        .expect("the claim's Node");
    let value = &labels["autonodes.io/nodeclaim"];
    assert!(
        value.len() <= 63 && value.starts_with("longlong"),
        "{value}"
    );
    assert_eq!(
        labels["autonodes.io/nodeclaim-uid"],
        c.metadata.uid.clone().expect("uid")
    );
    let events = world.events_for(NS, &long).await;
    assert!(
        events.iter().any(|e| e.starts_with("NodeReady")),
        "{events:?}"
    );

    // A label the kubelet owns is refused with a condition and an Event; no Node is made.
    let evil = world
        .wait_claim("evil-label", "Scheduled=False/InvalidLabels", WAIT, |c| {
            condition(c, "Scheduled").is_some_and(|x| x.0 == "False" && x.1 == "InvalidLabels")
        })
        .await;
    assert_eq!(evil.status.as_ref().and_then(|s| s.type_ref.clone()), None);
    let (_, _, message) = condition(&evil, "Scheduled").expect("Scheduled");
    assert!(
        message.contains("kubernetes.io/hostname") && message.contains("kubelet"),
        "{message}"
    );
    let events = world.events_for(NS, "evil-label").await;
    assert!(
        events.iter().any(|e| e.starts_with("InvalidLabels")),
        "{events:?}"
    );
    assert!(world.nodes().await.iter().all(|n| n
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("kubernetes.io/hostname"))
        != Some(&"evil".to_string())));

    // A reserved kubelet flag, however spelled, is refused the same way, before scheduling.
    let evil = world
        .wait_claim(
            "evil-flag",
            "Scheduled=False/InvalidKubeletArgs",
            WAIT,
            |c| {
                condition(c, "Scheduled")
                    .is_some_and(|x| x.0 == "False" && x.1 == "InvalidKubeletArgs")
            },
        )
        .await;
    assert_eq!(evil.status.as_ref().and_then(|s| s.type_ref.clone()), None);
    let (_, _, message) = condition(&evil, "Scheduled").expect("Scheduled");
    assert!(
        message.contains("\"provider_id\"") && message.contains("--provider-id"),
        "{message}"
    );
    let events = world.events_for(NS, "evil-flag").await;
    assert!(
        events.iter().any(|e| e.starts_with("InvalidKubeletArgs")),
        "{events:?}"
    );

    // Deleting the long-named claim leaves nothing behind.
    world.delete_claim(&long).await;
    world.wait_claim_gone(&long, WAIT).await;
    common::eventually("the long-named claim's objects to go", WAIT, || async {
        (world.vms().await.is_empty() && world.host_secrets().await.is_empty()).then_some(())
    })
    .await;
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_orphan_sweep_removes_what_a_vanished_claim_left_and_keeps_what_live_claims_use() {
    let mut world = World::start(WorldOptions {
        orphan_sweep_interval: Duration::from_secs(2),
        ..Default::default()
    })
    .await;
    for name in ["kept", "leaked"] {
        world.claim_type(name, "standard-node").await;
    }
    let mut leaked_uid = String::new();
    for name in ["kept", "leaked"] {
        let c = world.wait_phase(name, "Available", WAIT).await;
        if name == "leaked" {
            leaked_uid = c.metadata.uid.expect("uid");
        }
    }
    // The controller is stopped and the claim's finalizer removed by hand: the claim goes,
    // its VM and user-data Secret stay (as after a cleanup someone cut short).
    world.stop_controller().await;
    world
        .claims()
        .patch(
            "leaked",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("finalizer removed");
    world.delete_claim("leaked").await;
    world.wait_claim_gone("leaked", WAIT).await;
    assert_eq!(world.vms().await.len(), 2);
    // A DataVolume and a bootstrap token of the vanished claim, as this installation makes
    // them, and a managed Secret of no claim at all (never touched: autonodes did not make
    // it for a claim).
    let labels = serde_json::json!({
        "app.kubernetes.io/managed-by": "autonodes",
        "autonodes.io/installation": world.config.installation,
        "autonodes.io/nodeclaim-uid": leaked_uid,
    });
    let dvs: Api<DynamicObject> = Api::namespaced_with(
        world.host.clone(),
        "vcluster-platform",
        &autonodes_api::kubevirt::data_volume(),
    );
    dvs.create(
        &PostParams::default(),
        &serde_json::from_value(serde_json::json!({
            "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": "leaked-root", "labels": labels},
            "spec": {"source": {"blank": {}}, "pvc": {"accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": "1Gi"}}}}}))
        .expect("DataVolume"),
    )
    .await
    .expect("DataVolume created");
    let tenant_secrets: Api<Secret> = Api::namespaced(world.tenant.clone(), "kube-system");
    tenant_secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({
                "metadata": {"name": "bootstrap-token-abcdef", "labels": labels},
                "type": "bootstrap.kubernetes.io/token",
                "stringData": {"token-id": "abcdef", "token-secret": "0123456789abcdef"}}))
            .expect("token"),
        )
        .await
        .expect("token created");
    let host_secrets: Api<Secret> = Api::namespaced(world.host.clone(), "vcluster-platform");
    host_secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({
                "metadata": {"name": "not-a-claims",
                             "labels": {"app.kubernetes.io/managed-by": "autonodes"}}}))
            .expect("secret"),
        )
        .await
        .expect("secret created");

    world.start_controller();
    let leaked = |labels: Option<&std::collections::BTreeMap<String, String>>| {
        labels.and_then(|l| l.get("autonodes.io/nodeclaim-uid")) == Some(&leaked_uid)
    };
    common::eventually("the vanished claim's objects to go", WAIT, || async {
        let vms = world.vms().await;
        let secrets = world.host_secrets().await;
        let dvs = world.data_volumes().await;
        let tokens = world.tokens().await;
        (vms.len() == 1
            && !vms.iter().any(|v| leaked(v.metadata.labels.as_ref()))
            && !secrets.iter().any(|s| leaked(s.metadata.labels.as_ref()))
            && !dvs.iter().any(|d| leaked(d.metadata.labels.as_ref()))
            && !tokens.iter().any(|t| leaked(t.metadata.labels.as_ref())))
        .then_some(())
    })
    .await;
    // What the live claim uses, and what belongs to no claim, stays.
    let kept = world.wait_phase("kept", "Available", WAIT).await;
    let vm = world.vms().await.pop().expect("the kept claim's VM");
    assert_eq!(
        vm.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("autonodes.io/nodeclaim-uid")),
        kept.metadata.uid.as_ref()
    );
    assert!(host_secrets
        .get_opt("not-a-claims")
        .await
        .expect("get")
        .is_some());
    // Each removal is an Event: on the provider for host objects, on the tenant's
    // kubeconfig Secret for tokens.
    let provider_events = world.cluster_events_for("kubevirt-provider-advanced").await;
    for kind in ["VirtualMachine", "Secret", "DataVolume"] {
        assert!(
            provider_events.iter().any(
                |e| e.starts_with(&format!("OrphanRemoved: removed {kind} vcluster-platform/"))
            ),
            "{kind}: {provider_events:?}"
        );
    }
    let tenant_events = world.events_for(NS, "vc-tenant").await;
    assert!(
        tenant_events.iter().any(|e| e.starts_with(
            "OrphanRemoved: removed BootstrapToken kube-system/bootstrap-token-abcdef"
        )),
        "{tenant_events:?}"
    );
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_that_never_consolidates_is_served_and_durations_no_controller_could_read_are_refused(
) {
    let world = World::start(WorldOptions::default()).await;
    // `Never`, as Karpenter and vCluster write it, is read and the pool is reconciled.
    world
        .create_pool(
            "keep-empty",
            serde_json::json!({"providerRef": "kubevirt-provider-advanced", "replicas": 1,
                "disruption": {"consolidateAfter": "Never", "expireAfter": "Never"}}),
        )
        .await;
    let pool = world
        .wait_pool("keep-empty", "status.selector", |p| {
            p.status
                .as_ref()
                .and_then(|s| s.selector.as_deref())
                .is_some()
        })
        .await;
    assert_eq!(
        pool.spec
            .disruption
            .and_then(|d| d.consolidate_after)
            .map(|d| d.to_string()),
        Some("Never".to_string())
    );
    // The API server itself refuses what the controller could not read (the CRD's pattern
    // is at least as strict as the parser), so no such object is ever stored.
    let pools = untyped::<autonodes_api::NodePool>(&world);
    for bad in ["5 minutes", "-5m", "99999999999999999999h", "never"] {
        let body = serde_json::json!({
            "apiVersion": "autonodes.io/v1alpha1", "kind": "NodePool",
            "metadata": {"name": "bad-duration", "namespace": NS},
            "spec": {"providerRef": "kubevirt-provider-advanced", "vClusterRef": {"name": "tenant"},
                     "disruption": {"consolidateAfter": bad}}});
        assert_refused(&pools, body, "consolidateAfter").await;
    }
    // Likewise for the other fields the controller parses (see `src/api/schema_walk.rs`).
    let claims = untyped::<autonodes_api::NodeClaim>(&world);
    for (field, spec) in [
        (
            "effect",
            serde_json::json!({"taints": [{"key": "a", "effect": "Sometimes"}]}),
        ),
        (
            "key",
            serde_json::json!({"taints": [{"key": "a/b/c", "effect": "NoSchedule"}]}),
        ),
        (
            "labels",
            serde_json::json!({"labels": {"team": "not a label value"}}),
        ),
        (
            "key",
            serde_json::json!({"requirements": [{"key": "bad key", "operator": "Exists"}]}),
        ),
        (
            "desiredCapacity",
            serde_json::json!({"desiredCapacity": {"cpu": "1e1.5"}}),
        ),
        (
            "name",
            serde_json::json!({"vClusterRef": {"name": "Tenant_1"}}),
        ),
    ] {
        let mut spec = spec;
        if spec["vClusterRef"].is_null() {
            spec["vClusterRef"] = serde_json::json!({"name": "tenant"});
        }
        let body = serde_json::json!({
            "apiVersion": "autonodes.io/v1alpha1", "kind": "NodeClaim",
            "metadata": {"name": "bad-field", "namespace": NS}, "spec": spec});
        assert_refused(&claims, body, field).await;
    }
    world.shutdown().await;
}

/// The API of kind `K` in [`NS`], untyped: for objects the Rust type would not accept.
fn untyped<K: kube::Resource<DynamicType = ()>>(world: &World) -> Api<DynamicObject> {
    Api::namespaced_with(
        world.mgmt.clone(),
        NS,
        &kube::discovery::ApiResource::erase::<K>(&()),
    )
}

/// Asserts that the API server refuses to create `body` with a 422 whose message names
/// `field`.
async fn assert_refused(api: &Api<DynamicObject>, body: serde_json::Value, field: &str) {
    let err = api
        .create(
            &PostParams::default(),
            &serde_json::from_value(body.clone()).expect("object"),
        )
        .await
        .expect_err(field);
    match err {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 422, "{body}: {s:?}");
            assert!(s.message.contains(field), "{body}: {}", s.message);
        }
        e => panic!("{body}: {e}"),
    }
}

/// The CRD of `K` with every `pattern` and `enum` removed: what an older or hand-edited CRD
/// lets through that the controller's types cannot read.
fn loose_crd<K: kube::CustomResourceExt>() -> serde_json::Value {
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                m.remove("pattern");
                m.remove("enum");
                // Nor CEL rules (which a 1.20 server's server-side apply refuses).
                m.remove("x-kubernetes-validations");
                m.values_mut().for_each(strip);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut crd = serde_json::to_value(K::crd()).expect("crd");
    strip(&mut crd["spec"]);
    crd
}

/// Polls the object until its `Ready` condition has reason `InvalidSpec`; returns the
/// condition's message.
async fn wait_invalid_spec(api: &Api<DynamicObject>, name: &str) -> String {
    let start = std::time::Instant::now();
    loop {
        let o = api.get(name).await.expect("object");
        let found = o.data["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Ready" && c["reason"] == "InvalidSpec")
            .map(|c| c["message"].as_str().unwrap_or_default().to_string());
        if let Some(m) = found {
            return m;
        }
        assert!(
            start.elapsed() < OBJECT_WAIT,
            "{name}: no InvalidSpec condition; status: {}",
            o.data["status"]
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_the_controller_cannot_decode_gets_invalid_spec_and_every_other_object_is_served()
{
    use autonodes_api::{NodeClaim, NodePool};
    let world = World::start(WorldOptions::default()).await;
    // CRDs without patterns or enums, as an outdated installation might have.
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(world.mgmt.clone());
    for crd in [loose_crd::<NodeClaim>(), loose_crd::<NodePool>()] {
        let name = crd["metadata"]["name"].as_str().expect("name").to_string();
        crds.patch(
            &name,
            &PatchParams::apply("reliability-test").force(),
            &Patch::Apply(&crd),
        )
        .await
        .expect("loose CRD applied");
    }
    let claims_api = untyped::<NodeClaim>(&world);
    let pools_api = untyped::<NodePool>(&world);
    let create = |api: Api<DynamicObject>, body: serde_json::Value| async move {
        // The API server may take a moment to serve the loosened schema.
        let start = std::time::Instant::now();
        loop {
            match api
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(body.clone()).expect("object"),
                )
                .await
            {
                Ok(_) => return,
                Err(e) if start.elapsed() < Duration::from_secs(30) => {
                    eprintln!("retrying create: {e}");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => panic!("create: {e}"),
            }
        }
    };
    create(
        claims_api.clone(),
        serde_json::json!({"apiVersion": "autonodes.io/v1alpha1", "kind": "NodeClaim",
            "metadata": {"name": "bad-claim", "namespace": NS},
            "spec": {"vClusterRef": {"name": "tenant"},
                     "requirements": [{"key": "autonodes.io/node-type", "operator": "Maybe", "values": ["x"]}]}}),
    )
    .await;
    create(
        pools_api.clone(),
        serde_json::json!({"apiVersion": "autonodes.io/v1alpha1", "kind": "NodePool",
            "metadata": {"name": "bad-pool", "namespace": NS},
            "spec": {"providerRef": "kubevirt-provider-advanced", "vClusterRef": {"name": "tenant"},
                     "replicas": 1, "disruption": {"consolidateAfter": "soon"}}}),
    )
    .await;

    // Each gets a condition naming the field, and a Warning Event.
    let claim_msg = wait_invalid_spec(&claims_api, "bad-claim").await;
    assert!(claim_msg.contains("spec.requirements"), "{claim_msg}");
    let pool_msg = wait_invalid_spec(&pools_api, "bad-pool").await;
    assert!(
        pool_msg.contains("spec.disruption.consolidateAfter"),
        "{pool_msg}"
    );
    for name in ["bad-claim", "bad-pool"] {
        let events = world.events_for(NS, name).await;
        assert!(
            events
                .iter()
                .any(|e| e.starts_with("InvalidSpec: cannot be read")),
            "{name}: {events:?}"
        );
    }

    // Everything else is served: a new claim becomes Available, a new pool gets its node.
    world.claim_type("good-claim", "standard-node").await;
    world
        .wait_phase("good-claim", "Available", Duration::from_secs(120))
        .await;
    world
        .create_pool(
            "good-pool",
            serde_json::json!({"providerRef": "kubevirt-provider-advanced", "replicas": 1}),
        )
        .await;
    world
        .wait_pool("good-pool", "a ready node", |p| {
            p.status.as_ref().is_some_and(|s| s.ready_replicas == 1)
        })
        .await;

    // Fixed, the pool is served like any other, its condition written anew.
    pools_api
        .patch(
            "bad-pool",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"disruption": {"consolidateAfter": "30s"}}})),
        )
        .await
        .expect("pool fixed");
    world
        .wait_pool("bad-pool", "served after the fix", |p| {
            p.status.as_ref().is_some_and(|s| {
                s.selector.is_some() && s.conditions.iter().all(|c| c.reason != "InvalidSpec")
            })
        })
        .await;
    // No claim was ever made for the undecodable pool while it was undecodable, and the
    // bad claim got no VM.
    let vms = world.vms().await;
    assert!(
        vms.iter()
            .all(|v| !kube::ResourceExt::name_any(v).contains("bad-claim")),
        "{:?}",
        vms.iter()
            .map(kube::ResourceExt::name_any)
            .collect::<Vec<_>>()
    );
    world.shutdown().await;
}

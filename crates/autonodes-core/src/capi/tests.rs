use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use serde_json::json;

use super::*;
use crate::catalogue::{Catalogue, PreparedType};
use crate::resources::ResourceAmounts;
use autonodes_api::capi::*;
use autonodes_api::{NodeClaim, NodeClaimSpec, NodePool, NodeTypeSpec, Overhead};

const NAMES: ClaimNames = ClaimNames {
    delete_first: "autonodes.io/delete-first",
    ready: "Ready",
    provisioned: "Provisioned",
};

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(secs).expect("valid timestamp")
}

/// NodePool `blue` in `t` for vCluster `t`, with `spec` merged over that.
fn pool(spec: serde_json::Value) -> NodePool {
    let mut s = json!({"vClusterRef": {"name": "t"}});
    if let (Some(s), Some(extra)) = (s.as_object_mut(), spec.as_object()) {
        s.extend(extra.clone());
    }
    serde_json::from_value(json!({
        "apiVersion": "autonodes.io/v1alpha1", "kind": "NodePool",
        "metadata": {"name": "blue", "namespace": "t", "uid": "pool-uid"},
        "spec": s,
    }))
    .expect("pool")
}

/// Pool `blue` with bounds 1–3 and 2 replicas.
fn autoscaled_pool() -> NodePool {
    pool(json!({"autoscaling": {"minReplicas": 1, "maxReplicas": 3}, "replicas": 2}))
}

/// Claim `name` of pool `blue` in `t` with `status`.
fn claim(name: &str, status: serde_json::Value) -> NodeClaim {
    serde_json::from_value(json!({
        "apiVersion": "autonodes.io/v1alpha1", "kind": "NodeClaim",
        "metadata": {"name": name, "namespace": "t",
                     "labels": {"autonodes.io/nodepool": "blue"}},
        "spec": {"vClusterRef": {"name": "t"}},
        "status": status,
    }))
    .expect("claim")
}

fn joined(name: &str, phase: &str) -> NodeClaim {
    claim(
        name,
        json!({"phase": phase, "vmName": format!("{name}-vm"),
               "providerID": format!("kubevirt://{name}-vm"), "nodeName": name}),
    )
}

fn deleting(mut c: NodeClaim) -> NodeClaim {
    c.metadata.deletion_timestamp = Some(Time(at(0)));
    c
}

fn annotated<M: serde::Serialize + serde::de::DeserializeOwned>(
    obj: M,
    annotations: serde_json::Value,
) -> M {
    let mut v = serde_json::to_value(obj).expect("serializes");
    v["metadata"]["annotations"] = annotations;
    serde_json::from_value(v).expect("deserializes")
}

fn prepared(name: &str, spec: serde_json::Value) -> PreparedType {
    let spec: NodeTypeSpec = serde_json::from_value(spec).expect("spec");
    let provider = crate::catalogue::ProviderContext {
        name: "p".into(),
        properties: Default::default(),
        host_cluster: "h".into(),
        vm_namespace: "vms".into(),
        tenant_namespaces: None,
        per_tenant: None,
        base_template: Some(json!({"spec": {"template": {"spec": {"domain": {"devices": {}}}}}})),
    };
    let t = crate::catalogue::prepare_type(name, &spec, Some(&provider));
    assert!(t.problem.is_none(), "{:?}", t.problem);
    t
}

/// A True condition of type `type_`.
fn condition(type_: &str) -> Condition {
    Condition {
        type_: type_.into(),
        status: "True".into(),
        reason: "Because".into(),
        message: String::new(),
        observed_generation: None,
        last_transition_time: Time(at(0)),
    }
}

// --- the pool and its condition ---------------------------------------------------------

#[test]
fn only_a_pool_with_autoscaling_and_replicas_is_mirrored() {
    let bounds = json!({"minReplicas": 1, "maxReplicas": 3});
    let p = pool(json!({"autoscaling": bounds, "replicas": 2}));
    assert!(matches!(
        pool_mirror(&p),
        PoolMirror::Mirrored { replicas: 2, autoscaling } if autoscaling.max_replicas == 3
    ));
    assert_eq!(
        pool_mirror(&pool(json!({"replicas": 2}))),
        PoolMirror::NotAutoscaled
    );
    let PoolMirror::ReplicasRequired(c) = pool_mirror(&pool(json!({"autoscaling": bounds}))) else {
        panic!("a pool without replicas is not mirrored");
    };
    assert_eq!((c.ok, c.reason), (false, REASON_REPLICAS_REQUIRED));
    let mut gone = p.clone();
    gone.metadata.deletion_timestamp = Some(Time(at(0)));
    assert_eq!(pool_mirror(&gone), PoolMirror::Deleting);
    assert!(pool_mirror(&p).is_mirrored() && !pool_mirror(&gone).is_mirrored());
}

#[test]
fn the_condition_names_the_bounds_or_their_problem() {
    let a = autonodes_api::Autoscaling {
        min_replicas: 1,
        max_replicas: 4,
    };
    let ok = mirrored_condition("blue", &a, None);
    assert_eq!((ok.ok, ok.reason), (true, REASON_MIRRORED));
    assert!(ok.message.contains("capi.autonodes.io/blue") && ok.message.contains("max 4"));
    let bad = mirrored_condition("blue", &a, Some("too tight".into()));
    assert_eq!(
        bad,
        AutoscalingCondition {
            ok: false,
            reason: REASON_INVALID_BOUNDS,
            message: "too tight".into()
        }
    );
}

#[test]
fn setting_the_same_condition_again_changes_nothing_and_a_new_reason_is_a_transition() {
    let other = condition("Ready");
    let mirrored = AutoscalingCondition {
        ok: true,
        reason: REASON_MIRRORED,
        message: "m".into(),
    };
    let first =
        set_autoscaling(std::slice::from_ref(&other), &mirrored, Some(1), at(10)).expect("new");
    assert!(first.transition);
    assert_eq!(first.conditions.len(), 2);
    assert_eq!(first.conditions[0], other);
    assert_eq!(
        set_autoscaling(&first.conditions, &mirrored, Some(1), at(20)),
        None
    );
    // A new message is a change but no transition; a new reason is both.
    let reworded = AutoscalingCondition {
        message: "n".into(),
        ..mirrored.clone()
    };
    let change = set_autoscaling(&first.conditions, &reworded, Some(1), at(20)).expect("change");
    assert!(!change.transition);
    let invalid = AutoscalingCondition {
        ok: false,
        reason: REASON_INVALID_BOUNDS,
        message: "n".into(),
    };
    let change = set_autoscaling(&first.conditions, &invalid, Some(1), at(20)).expect("change");
    assert!(change.transition);
}

#[test]
fn clearing_removes_only_the_autoscaling_condition() {
    let c = condition;
    assert_eq!(clear_autoscaling(&[c("Ready")]), None);
    assert_eq!(
        clear_autoscaling(&[c("Ready"), c(AUTOSCALING)]),
        Some(vec![c("Ready")])
    );
}

#[test]
fn the_controlling_owner_is_found_by_kind_and_any_owner_by_uid() {
    let meta: ObjectMeta = serde_json::from_value(json!({"ownerReferences": [
        {"apiVersion": "v1", "kind": "NodePool", "name": "other", "uid": "u1"},
        {"apiVersion": "v1", "kind": "NodePool", "name": "blue", "uid": "u2", "controller": true},
    ]}))
    .expect("meta");
    assert_eq!(owner_named(&meta, "NodePool").as_deref(), Some("blue"));
    assert_eq!(owner_named(&meta, "MachinePool"), None);
    assert!(owned_by(&meta, "NodePool", "u1") && owned_by(&meta, "NodePool", "u2"));
    assert!(!owned_by(&meta, "MachinePool", "u1"));
}

// --- the MachinePool --------------------------------------------------------------------

#[test]
fn taints_are_written_as_the_provider_parses_them() {
    let t = |k: &str, v: Option<&str>, e: &str| Taint {
        key: k.into(),
        value: v.map(Into::into),
        effect: e.into(),
        ..Taint::default()
    };
    assert_eq!(
        format_taint(&t("dedicated", Some("gpu"), "NoSchedule")),
        "dedicated=gpu:NoSchedule"
    );
    assert_eq!(
        format_taint(&t("spot", None, "NoExecute")),
        "spot:NoExecute"
    );
    assert_eq!(
        format_taint(&t("spot", Some(""), "NoExecute")),
        "spot:NoExecute"
    );
}

#[test]
fn scale_from_zero_annotations_are_the_type_resources_less_kube_reserved() {
    let t = prepared(
        "p.gpu",
        json!({
            "providerRef": "p",
            "resources": {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "2"},
            "taints": [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}],
        }),
    );
    let reserved = ResourceAmounts::from_list(
        &Overhead {
            kube_reserved: BTreeMap::from([
                ("cpu".to_string(), Quantity("500m".into())),
                ("memory".to_string(), Quantity("1Gi".into())),
            ]),
        }
        .kube_reserved,
    )
    .expect("reserved");
    let template: NodeClaimSpec = serde_json::from_value(json!({
        "vClusterRef": {"name": "t"},
        "labels": {"team": "blue"},
        "taints": [{"key": "pool", "effect": "NoExecute"}],
        "startupTaints": [{"key": "cni", "effect": "NoSchedule"}],
    }))
    .expect("template");
    let a = capacity_annotations(&t, &reserved, &template, 110);
    assert_eq!(a[CAPACITY_CPU], "3500m");
    assert_eq!(a[CAPACITY_MEMORY], "7Gi");
    assert_eq!(a[CAPACITY_MAX_PODS], "110");
    assert_eq!(a[CAPACITY_GPU_COUNT], "2");
    assert_eq!(a[CAPACITY_GPU_TYPE], "nvidia.com/gpu");
    let labels: BTreeSet<&str> = a[CAPACITY_LABELS].split(',').collect();
    for l in [
        "team=blue",
        "autonodes.io/node-type=gpu",
        "node.kubernetes.io/instance-type=p.gpu",
        "kubernetes.io/arch=amd64",
    ] {
        assert!(labels.contains(l), "{l} missing from {labels:?}");
    }
    assert_eq!(a[CAPACITY_TAINTS], "gpu=yes:NoSchedule,pool:NoExecute");
}

#[test]
fn scale_from_zero_describes_the_type_a_new_claim_would_get_even_when_every_type_is_full() {
    let catalogue = Catalogue::new(vec![
        prepared(
            "p.small",
            json!({"providerRef": "p", "resources": {"cpu": "2", "memory": "4Gi"},
                   "cost": 1, "maxCapacity": 1}),
        ),
        prepared(
            "p.large",
            json!({"providerRef": "p", "resources": {"cpu": "8", "memory": "32Gi"},
                   "cost": 5, "maxCapacity": 1}),
        ),
    ]);
    let template: NodeClaimSpec =
        serde_json::from_value(json!({"vClusterRef": {"name": "t"}})).expect("template");
    let reserved = |t: &str| {
        (t == "p.small").then(|| Overhead {
            kube_reserved: BTreeMap::from([("cpu".to_string(), Quantity("1".into()))]),
        })
    };
    let cpu = |claimed: &[(&str, i64)]| {
        let claimed = claimed.iter().map(|(t, n)| (t.to_string(), *n)).collect();
        scale_from_zero(&catalogue, &template, &claimed, reserved, 110)
            .get(CAPACITY_CPU)
            .cloned()
    };
    // The cheapest type, less its kubeReserved.
    assert_eq!(cpu(&[]).as_deref(), Some("1"));
    // The cheapest is full: the next one with room.
    assert_eq!(cpu(&[("p.small", 1)]).as_deref(), Some("8"));
    // All full: still the cheapest fitting type.
    assert_eq!(cpu(&[("p.small", 1), ("p.large", 1)]).as_deref(), Some("1"));
    // No type fits: no annotations.
    let huge: NodeClaimSpec = serde_json::from_value(json!({
        "vClusterRef": {"name": "t"},
        "requirements": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64"]}],
    }))
    .expect("template");
    assert!(scale_from_zero(&catalogue, &huge, &BTreeMap::new(), reserved, 110).is_empty());
}

#[test]
fn provider_ids_are_those_of_joined_live_claims_sorted() {
    let claims = [
        joined("b", "Available"),
        joined("a", "Joining"),
        claim(
            "pending",
            json!({"phase": "Provisioning", "providerID": "kubevirt://p"}),
        ),
        deleting(joined("gone", "Available")),
        joined("failed", "Failed"),
    ];
    assert_eq!(
        provider_id_list(&claims),
        ["kubevirt://a-vm", "kubevirt://b-vm"]
    );
}

#[test]
fn the_machine_pool_carries_the_bounds_only_while_they_are_valid() {
    let p = autoscaled_pool();
    let capacity = BTreeMap::from([(CAPACITY_CPU.to_string(), "2".to_string())]);
    let mp = desired_machine_pool(
        &p,
        "pool-uid",
        &[joined("a", "Available")],
        true,
        2,
        capacity,
    );
    let annotations = mp.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(annotations[ANNOTATION_MIN_SIZE], "1");
    assert_eq!(annotations[ANNOTATION_MAX_SIZE], "3");
    assert_eq!(annotations[ANNOTATION_SYNCED_REPLICAS], "2");
    assert_eq!(annotations[CAPACITY_CPU], "2");
    assert_eq!(mp.spec.replicas, Some(2));
    assert_eq!(mp.spec.cluster_name, "t");
    assert_eq!(mp.spec.provider_id_list, ["kubevirt://a-vm"]);
    assert_eq!(mp.metadata.namespace.as_deref(), Some("t"));
    let owner = &mp.metadata.owner_references.clone().unwrap_or_default()[0];
    assert_eq!(
        (
            owner.api_version.as_str(),
            owner.kind.as_str(),
            owner.name.as_str()
        ),
        ("autonodes.io/v1alpha1", "NodePool", "blue")
    );
    assert_eq!(owner.uid, "pool-uid");
    let invalid = desired_machine_pool(&p, "pool-uid", &[], false, 2, BTreeMap::new());
    let annotations = invalid.metadata.annotations.unwrap_or_default();
    assert!(!annotations.contains_key(ANNOTATION_MIN_SIZE));
    assert!(!annotations.contains_key(ANNOTATION_MAX_SIZE));
    assert_eq!(annotations[ANNOTATION_SYNCED_REPLICAS], "2");
}

#[test]
fn a_machine_pool_needs_an_update_only_when_it_lacks_what_the_mirror_owns() {
    let p = autoscaled_pool();
    let desired = desired_machine_pool(&p, "pool-uid", &[], true, 2, BTreeMap::new());
    let mut existing = desired.clone();
    assert!(!needs_update(&existing, &desired));
    // Labels and annotations of others do not count.
    if let Some(a) = existing.metadata.annotations.as_mut() {
        a.insert("someone/else".into(), "x".into());
    }
    if let Some(l) = existing.metadata.labels.as_mut() {
        l.insert("someone/else".into(), "x".into());
    }
    assert!(!needs_update(&existing, &desired));
    // An annotation the mirror owns but no longer sets does.
    let mut stale = existing.clone();
    if let Some(a) = stale.metadata.annotations.as_mut() {
        a.insert(CAPACITY_GPU_COUNT.into(), "1".into());
    }
    assert!(needs_update(&stale, &desired));
    let mut scaled = existing.clone();
    scaled.spec.replicas = Some(3);
    assert!(needs_update(&scaled, &desired));
    let mut orphaned = existing.clone();
    orphaned.metadata.owner_references = None;
    assert!(needs_update(&orphaned, &desired));
}

#[test]
fn the_machine_pool_is_applied_without_status_and_conditional_on_the_version_read() {
    let p = autoscaled_pool();
    let mut desired = desired_machine_pool(&p, "pool-uid", &[], true, 2, BTreeMap::new());
    desired.status = Some(MachinePoolStatus::default());
    let body = machine_pool_body(&desired, None).expect("body");
    assert!(body.get("status").is_none());
    assert!(body["metadata"].get("resourceVersion").is_none());
    assert_eq!(body["kind"], "MachinePool");
    assert_eq!(body["apiVersion"], "capi.autonodes.io/v1alpha1");
    let mut existing = desired.clone();
    existing.metadata.resource_version = Some("42".into());
    let body = machine_pool_body(&desired, Some(&existing)).expect("body");
    assert_eq!(body["metadata"]["resourceVersion"], "42");
}

#[test]
fn the_machine_pool_is_scaling_up_until_every_desired_machine_is_ready() {
    let p = autoscaled_pool();
    let mut mp = desired_machine_pool(&p, "pool-uid", &[], true, 2, BTreeMap::new());
    mp.metadata.generation = Some(3);
    let claims = [joined("b", "Available"), joined("a", "Joining")];
    let s = machine_pool_status(&mp, &claims, 2, at(10));
    assert_eq!(s.phase.as_deref(), Some("ScalingUp"));
    assert_eq!(
        (s.replicas, s.ready_replicas, s.unavailable_replicas),
        (2, 1, 1)
    );
    assert_eq!(
        s.selector.as_deref(),
        Some("capi.autonodes.io/pool-name=blue")
    );
    assert_eq!(s.observed_generation, Some(3));
    let nodes: Vec<_> = s
        .node_refs
        .iter()
        .filter_map(|r| r.name.as_deref())
        .collect();
    assert_eq!(nodes, ["a", "b"]);
    let ready = &s.conditions[0];
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "ScalingUp")
    );

    let claims = [joined("b", "Available"), joined("a", "Available")];
    let s = machine_pool_status(&mp, &claims, 2, at(20));
    assert_eq!(s.phase.as_deref(), Some("Running"));
    assert_eq!(s.conditions[0].reason, "AllMachinesReady");
    let s = machine_pool_status(&mp, &claims, 1, at(20));
    assert_eq!(s.phase.as_deref(), Some("ScalingDown"));
}

// --- the Machines -----------------------------------------------------------------------

#[test]
fn a_failed_claim_gives_a_failed_machine_with_its_reason() {
    let claim: NodeClaim = serde_json::from_value(json!({
        "apiVersion": "autonodes.io/v1alpha1", "kind": "NodeClaim",
        "metadata": {"name": "c", "namespace": "t"},
        "spec": {"vClusterRef": {"name": "t"}},
        "status": {"phase": "Failed", "vmName": "c-vm", "conditions": [
            {"type": "Ready", "status": "False", "reason": "LaunchTimeout",
             "message": "the VM did not run within 10m", "lastTransitionTime": "2024-01-01T00:00:00Z"}
        ]}
    }))
    .expect("claim");
    let s = machine_status(&claim, &NAMES);
    assert_eq!(s.phase.as_deref(), Some("Failed"));
    assert_eq!(s.failure_reason.as_deref(), Some("LaunchTimeout"));
    assert_eq!(
        s.failure_message.as_deref(),
        Some("the VM did not run within 10m")
    );
    assert!(s.node_ref.is_none());
    assert!(provider_id_list(&[claim]).is_empty());
}

#[test]
fn a_running_machine_names_its_node_and_a_claim_being_deleted_is_deleting() {
    let c = joined("a", "Available");
    let s = machine_status(&c, &NAMES);
    assert_eq!(s.phase.as_deref(), Some("Running"));
    assert_eq!(s.node_ref.and_then(|r| r.name).as_deref(), Some("a"));
    assert!(s.bootstrap_ready);
    assert_eq!((s.failure_reason, s.failure_message), (None, None));
    assert_eq!(machine_phase(&deleting(c)), "Deleting");
    assert_eq!(machine_phase(&claim("p", json!({}))), "Pending");
}

/// The Machine the plan would create for `claim`, as the API server returns it.
fn machine_for(claim: &NodeClaim, p: &NodePool) -> Machine {
    let plan = plan_machines(p, "mp-uid", std::slice::from_ref(claim), &[], &NAMES);
    let MachineWrite::Create(body) = &plan.machines[0].write else {
        panic!("a claim without Machine gets one");
    };
    serde_json::from_value(body.clone()).expect("machine")
}

#[test]
fn every_claim_gets_a_machine_and_machines_without_a_claim_are_deleted() {
    let p = autoscaled_pool();
    let kept = joined("kept", "Available");
    let moved = joined("moved", "Available");
    let mut stale = machine_for(&moved, &p);
    stale.spec.provider_id = None;
    stale.metadata.resource_version = Some("7".into());
    let orphan = machine_for(&joined("orphan", "Available"), &p);
    let machines = [machine_for(&kept, &p), stale, orphan];
    let claims = [
        kept,
        moved,
        joined("new", "Joining"),
        deleting(joined("leaving", "Available")),
    ];
    let plan = plan_machines(&p, "mp-uid", &claims, &machines, &NAMES);
    assert_eq!(plan.delete, ["orphan"]);
    let names: Vec<&str> = plan.machines.iter().map(|m| m.name.as_str()).collect();
    // A claim on its way out gets no new Machine.
    assert_eq!(names, ["kept", "moved", "new"]);
    assert!(
        matches!(plan.machines[0].write, MachineWrite::Keep(m) if std::ptr::eq(m, &machines[0]))
    );
    let MachineWrite::Update(body) = &plan.machines[1].write else {
        panic!("a Machine that lacks its providerID is updated");
    };
    assert_eq!(body["metadata"]["resourceVersion"], "7");
    assert_eq!(body["spec"]["providerID"], "kubevirt://moved-vm");
    let MachineWrite::Create(body) = &plan.machines[2].write else {
        panic!("a new claim gets a Machine");
    };
    assert!(body["metadata"].get("resourceVersion").is_none());
    assert_eq!(body["metadata"]["namespace"], "t");
    assert_eq!(body["metadata"]["labels"][LABEL_POOL_NAME], "blue");
    assert_eq!(body["metadata"]["ownerReferences"][0]["uid"], "mp-uid");
    assert_eq!(
        body["spec"]["bootstrap"]["dataSecretName"],
        "new-vm-userdata"
    );
    assert_eq!(
        plan.machines[2].status.phase.as_deref(),
        Some("Provisioned")
    );
    // A Machine owned by another MachinePool (one that was replaced) is taken over.
    let replaced = plan_machines(&p, "new-mp-uid", &claims[..1], &machines, &NAMES);
    assert!(matches!(
        replaced.machines[0].write,
        MachineWrite::Update(_)
    ));
}

#[test]
fn a_claim_being_deleted_keeps_its_existing_machine() {
    let p = autoscaled_pool();
    let leaving = deleting(joined("leaving", "Available"));
    let machines = [machine_for(&joined("leaving", "Available"), &p)];
    let plan = plan_machines(
        &p,
        "mp-uid",
        std::slice::from_ref(&leaving),
        &machines,
        &NAMES,
    );
    assert!(plan.delete.is_empty());
    assert!(matches!(plan.machines[0].write, MachineWrite::Keep(_)));
    assert_eq!(plan.machines[0].status.phase.as_deref(), Some("Deleting"));
}

#[test]
fn the_autoscalers_choice_of_machine_goes_onto_its_claim_and_is_taken_back_with_it() {
    let p = autoscaled_pool();
    let marked = |c: NodeClaim| annotated(c, json!({NAMES.delete_first: "yes"}));
    let chosen = |m: Machine| annotated(m, json!({ANNOTATION_DELETE_MACHINE: "yes"}));
    let chosen_claim = joined("chosen", "Available");
    let chosen_m = chosen(machine_for(&chosen_claim, &p));
    let unchosen_claim = marked(joined("unchosen", "Available"));
    let unchosen_m = machine_for(&unchosen_claim, &p);
    let already = marked(joined("already", "Available"));
    let already_m = chosen(machine_for(&already, &p));
    // No Machine yet: left alone.
    let machineless = marked(joined("machineless", "Joining"));
    let marks = delete_first_marks(
        &[chosen_claim, unchosen_claim, already, machineless],
        &[chosen_m, unchosen_m, already_m],
        &NAMES,
    );
    assert_eq!(
        marks,
        [
            Mark {
                claim: "chosen".into(),
                value: Some("yes".into())
            },
            Mark {
                claim: "unchosen".into(),
                value: None
            },
        ]
    );
}

#[test]
fn removing_the_mirror_unmarks_only_the_pools_marked_claims() {
    let marked = annotated(
        joined("marked", "Available"),
        json!({NAMES.delete_first: "yes"}),
    );
    let unmarked = joined("unmarked", "Available");
    let mut elsewhere = marked.clone();
    elsewhere.metadata.name = Some("elsewhere".into());
    elsewhere.metadata.namespace = Some("other".into());
    let mut other_pool = marked.clone();
    other_pool.metadata.name = Some("other-pool".into());
    other_pool.metadata.labels = Some(BTreeMap::from([(
        autonodes_api::LABEL_NODEPOOL.to_string(),
        "green".to_string(),
    )]));
    let claims = [marked, unmarked, elsewhere, other_pool];
    assert_eq!(
        claims_to_unmark(&claims, "t", "blue", &NAMES),
        [Mark {
            claim: "marked".into(),
            value: None
        }]
    );
}

#[test]
fn a_machine_is_of_the_pool_its_label_names_in_its_namespace() {
    let p = autoscaled_pool();
    let m = machine_for(&joined("a", "Available"), &p);
    assert!(is_machine_of(&m.metadata, "t", "blue"));
    assert!(!is_machine_of(&m.metadata, "other", "blue"));
    assert!(!is_machine_of(&m.metadata, "t", "green"));
    assert_eq!(machine_selector("blue"), "capi.autonodes.io/pool-name=blue");
    assert_eq!(claim_selector("blue"), "autonodes.io/nodepool=blue");
}

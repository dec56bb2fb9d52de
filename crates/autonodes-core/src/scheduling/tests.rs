//! Tests of the catalogue, scheduling and node configuration together.

use super::*;
use autonodes_api::reasons::TypeReason;
use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::core::v1::Taint;

use crate::catalogue::*;
use crate::node_config::*;
use crate::requirements::RequirementMiss;
use autonodes_api::VClusterRef;
use autonodes_api::{
    NodeClaim, NodeClaimSpec, NodePoolSpec, NodeProvider, NodeTypeCapacity, NodeTypePhase,
    NodeTypeSpec, Operator, Properties, Requirement, ResourceList,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::json;

fn example_provider(file: &str) -> NodeProvider {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(file);
    let text = std::fs::read_to_string(&path).expect("example exists");
    crate::yaml::from_str(&text).expect("example parses")
}

fn claim() -> NodeClaimSpec {
    NodeClaimSpec {
        provider_ref: None,
        type_ref: None,
        requirements: vec![],
        desired_capacity: ResourceList::new(),
        v_cluster_ref: VClusterRef {
            name: "tenant".into(),
        },
        properties: Properties::new(),
        taints: vec![],
        startup_taints: vec![],
        labels: BTreeMap::new(),
        kubelet_args: BTreeMap::new(),
        kubernetes_version: None,
        power: None,
    }
}

fn req(key: &str, op: Operator, values: &[&str]) -> Requirement {
    Requirement {
        key: key.into(),
        operator: op,
        values: values.iter().map(|s| s.to_string()).collect(),
        min_values: None,
    }
}

fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
    Taint {
        key: key.into(),
        value: value.map(str::to_string),
        effect: effect.into(),
        time_added: None,
    }
}

fn ctx() -> ProviderContext {
    ProviderContext {
        name: "p".into(),
        properties: Properties::from([("zone".to_string(), "a".to_string())]),
        base_template: Some(json!({"spec": {"template": {"spec": {"domain": {
                "resources": {"requests": {"cpu": "2", "memory": "4Gi"}}}}}}})),
        host_cluster: "host".into(),
        vm_namespace: "vms".into(),
        tenant_namespaces: None,
        per_tenant: None,
    }
}

fn spec(resources: &[(&str, &str)]) -> NodeTypeSpec {
    NodeTypeSpec {
        provider_ref: "p".into(),
        display_name: None,
        resources: resources
            .iter()
            .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
            .collect(),
        overhead: None,
        cost: None,
        max_capacity: None,
        properties: Properties::new(),
        taints: vec![],
        merge_virtual_machine_template: None,
        virtual_machine_template: None,
        warm: None,
        address_pool: None,
    }
}

fn prepared(short: &str, resources: &[(&str, &str)]) -> PreparedType {
    prepare_type(&format!("p.{short}"), &spec(resources), Some(&ctx()))
}

fn request(c: &NodeClaimSpec) -> ClaimRequest {
    ClaimRequest::new(c, None).expect("valid request")
}

#[test]
fn the_definition_hash_follows_what_makes_the_vm_and_not_cost_or_capacity() {
    let base = prepare_type("p.a", &spec(&[("cpu", "2")]), Some(&ctx())).definition;
    assert_eq!(base.len(), 16);
    let hash = |s: &NodeTypeSpec, c: &ProviderContext| prepare_type("p.a", s, Some(c)).definition;
    let mut cheaper = spec(&[("cpu", "2")]);
    cheaper.cost = Some(1);
    cheaper.max_capacity = Some(3);
    assert_eq!(
        hash(&cheaper, &ctx()),
        base,
        "cost and capacity change no VM"
    );
    assert_ne!(hash(&spec(&[("cpu", "4")]), &ctx()), base, "resources");
    let mut user_data = spec(&[("cpu", "2")]);
    user_data
        .properties
        .insert("autonodes.io/user-data".into(), "#cloud-config\n".into());
    assert_ne!(hash(&user_data, &ctx()), base, "properties (user data)");
    let mut provider = ctx();
    provider.base_template = Some(json!({"spec": {"template": {"spec": {"domain": {
            "resources": {"requests": {"cpu": "2", "memory": "8Gi"}}}}}}}));
    assert_ne!(
        hash(&spec(&[("cpu", "2")]), &provider),
        base,
        "the provider's base template"
    );
}

#[test]
fn a_type_admit_refuses_is_passed_over_for_the_next_and_all_refused_keeps_the_first_refusals_reason(
) {
    let cat = Catalogue::from_provider(&example_provider("nodeprovider-advanced.yaml"));
    let no_standard = |t: &PreparedType| {
        if t.short_name == "standard-node" {
            Err(NoFit {
                reason: REASON_QUOTA_EXCEEDED,
                message: "NodeQuota q does not allow node type standard-node".to_string(),
            })
        } else {
            Ok(())
        }
    };
    let chosen =
        choose_within(&cat, &request(&claim()), &BTreeMap::new(), no_standard).expect("fits");
    assert_eq!(chosen.short_name, "high-memory-node");
    let e = choose_within(
        &cat,
        &request(&claim()),
        &BTreeMap::new(),
        |t: &PreparedType| {
            Err(NoFit {
                reason: REASON_HOST_CAPACITY_EXHAUSTED,
                message: format!("refused {}", t.short_name),
            })
        },
    )
    .expect_err("all refused");
    assert_eq!(
        e.reason, REASON_HOST_CAPACITY_EXHAUSTED,
        "the refusal's reason is kept"
    );
    assert_eq!(
        e.message,
        "refused standard-node (and 1 more fitting node type(s) refused)"
    );
}

#[test]
fn advanced_example_types_cost_28_and_72_with_discovered_and_spec_resources() {
    let cat = Catalogue::from_provider(&example_provider("nodeprovider-advanced.yaml"));
    let std = cat.get("standard-node").expect("standard");
    let high = cat
        .get("kubevirt-provider-advanced.high-memory-node")
        .expect("high");
    assert_eq!(std.cost, 28);
    assert_eq!(high.cost, 72);
    assert_eq!(std.resources["cpu"].0, "2");
    assert_eq!(std.resources["memory"].0, "4Gi");
    assert_eq!(high.resources["memory"].0, "16Gi");
    assert_eq!(
        cat.types()
            .iter()
            .map(|t| t.short_name.as_str())
            .collect::<Vec<_>>(),
        vec!["standard-node", "high-memory-node"],
        "cheapest first"
    );
    assert_eq!(
        high.taints,
        vec![taint("workload", Some("high-memory"), "NoSchedule")]
    );
}

#[test]
fn reference_minimal_and_types_examples_prepare_without_problems() {
    let cat = Catalogue::from_provider(&example_provider("nodeprovider-minimal.yaml"));
    let small = cat.get("small-ubuntu-vm").expect("small");
    assert!(small.is_usable());
    assert_eq!(small.cost, 14);
    let cat = Catalogue::from_provider(&example_provider("nodeprovider-types.yaml"));
    for t in cat.types() {
        assert!(t.is_usable(), "{}: {:?}", t.name, t.problem);
    }
    assert_eq!(cat.get("mid-ubuntu-vm-2").map(|t| t.cost), Some(50)); // 4*10 + 5*2
    let replaced = cat
        .get("different-vm-with-different-template-2")
        .expect("type");
    assert_eq!(replaced.cost, 36); // 2*10 + 8*2
    assert_eq!(
        replaced.template["metadata"]["labels"],
        json!({"foo": "baz"})
    );
}

#[test]
fn explicit_cost_wins_over_the_formula() {
    let mut s = spec(&[("cpu", "4"), ("memory", "16Gi")]);
    s.cost = Some(5);
    assert_eq!(prepare_type("p.t", &s, Some(&ctx())).cost, 5);
}

#[test]
fn built_in_properties_are_set_and_only_os_arch_and_capacity_type_can_be_overridden() {
    let mut s = spec(&[]);
    s.properties = Properties::from([
        ("kubernetes.io/arch".to_string(), "arm64".to_string()),
        ("autonodes.io/node-type".to_string(), "fake".to_string()),
        ("zone".to_string(), "b".to_string()),
    ]);
    let t = prepare_type("p.small", &s, Some(&ctx()));
    let p = &t.properties;
    assert_eq!(p["autonodes.io/node-type"], "small");
    assert_eq!(p["vcluster.com/node-type"], "small");
    assert_eq!(p["autonodes.io/provider"], "p");
    assert_eq!(p["node.kubernetes.io/instance-type"], "p.small");
    assert_eq!(p["kubernetes.io/os"], "linux");
    assert_eq!(p["kubernetes.io/arch"], "arm64");
    assert_eq!(p["karpenter.sh/capacity-type"], "on-demand");
    assert_eq!(p["zone"], "b", "type over provider");
    let plain = prepared("plain", &[]);
    assert_eq!(plain.properties["kubernetes.io/arch"], "amd64");
    assert_eq!(plain.properties["zone"], "a");
}

#[test]
fn a_type_offering_several_zones_fits_a_claim_for_either_and_its_node_gets_the_one_asked_for() {
    let mut s = spec(&[]);
    s.properties = Properties::from([
        ("topology.kubernetes.io/zone".to_string(), "a,b".to_string()),
        ("tier".to_string(), "*".to_string()),
    ]);
    let t = prepare_type("p.multi", &s, Some(&ctx()));
    let catalogue = Catalogue::new(vec![t]);
    let mut c = claim();
    c.requirements = vec![
        serde_json::from_value(
            serde_json::json!({"property": "topology.kubernetes.io/zone", "value": "b"}),
        )
        .expect("requirement"),
        serde_json::from_value(
            serde_json::json!({"property": "tier", "operator": "In", "values": ["gold"]}),
        )
        .expect("requirement"),
    ];
    let req = ClaimRequest::new(&c, None).expect("valid");
    let chosen = choose(&catalogue, &req, &BTreeMap::new()).expect("fits");
    let p = node_properties(chosen, None, &c);
    assert_eq!(p["topology.kubernetes.io/zone"], "b");
    assert_eq!(p["tier"], "gold");
    // Nothing asked: the first of several, and `*` stays (no label value: no label).
    let p = node_properties(chosen, None, &claim());
    assert_eq!(p["topology.kubernetes.io/zone"], "a");
    assert_eq!(p["tier"], "*");
    // A zone the type does not offer does not fit.
    c.requirements = vec![serde_json::from_value(
            serde_json::json!({"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["c"]}),
        )
        .expect("requirement")];
    let req = ClaimRequest::new(&c, None).expect("valid");
    assert!(choose(&catalogue, &req, &BTreeMap::new()).is_err());
}

#[test]
fn node_properties_go_provider_then_type_then_pool_then_claim() {
    let mut s = spec(&[]);
    s.properties = Properties::from([
        ("a".to_string(), "type".to_string()),
        ("b".to_string(), "type".to_string()),
    ]);
    let t = prepare_type("p.t", &s, Some(&ctx()));
    let pool = NodePoolSpec {
        v_cluster_ref: VClusterRef { name: "x".into() },
        provider_ref: None,
        requirements: vec![],
        properties: Properties::from([
            ("b".to_string(), "pool".to_string()),
            ("c".to_string(), "pool".to_string()),
        ]),
        taints: vec![],
        startup_taints: vec![],
        labels: BTreeMap::new(),
        kubelet_args: BTreeMap::new(),
        replicas: None,
        limits: None,
        disruption: None,
        termination_grace_period: None,
        expire_after: None,
        weight: None,
        autoscaling: None,
        repair: None,
        warm: None,
        preference_policy: None,
    };
    let mut c = claim();
    c.properties = Properties::from([
        ("c".to_string(), "claim".to_string()),
        ("autonodes.io/provider".to_string(), "evil".to_string()),
    ]);
    let p = node_properties(&t, Some(&pool), &c);
    assert_eq!(p["zone"], "a");
    assert_eq!(p["a"], "type");
    assert_eq!(p["b"], "pool");
    assert_eq!(p["c"], "claim");
    assert_eq!(
        p["autonodes.io/provider"], "p",
        "identity cannot be overridden"
    );
}

#[test]
fn in_notin_exists_and_does_not_exist_match_properties() {
    let props = Properties::from([("zone".to_string(), "a".to_string())]);
    let check = |r: Requirement| {
        CheckedRequirement::new(&r, "f")
            .expect("valid")
            .matches(&props)
            .is_ok()
    };
    assert!(check(req("zone", Operator::In, &["a", "b"])));
    assert!(!check(req("zone", Operator::In, &["b"])));
    assert!(!check(req("missing", Operator::In, &["a"])));
    assert!(check(req("zone", Operator::NotIn, &["b"])));
    assert!(!check(req("zone", Operator::NotIn, &["a"])));
    assert!(check(req("missing", Operator::NotIn, &["a"])));
    assert!(check(req("zone", Operator::Exists, &[])));
    assert!(!check(req("missing", Operator::Exists, &[])));
    assert!(check(req("missing", Operator::DoesNotExist, &[])));
    assert!(!check(req("zone", Operator::DoesNotExist, &[])));
    assert!(
        check(req("missing", Operator::NotExists, &[])),
        "NotExists is DoesNotExist"
    );
    assert!(!check(req("zone", Operator::NotExists, &[])));
}

#[test]
fn gt_and_lt_compare_integers() {
    let props = Properties::from([
        ("cores".to_string(), "8".to_string()),
        ("name".to_string(), "big".to_string()),
    ]);
    let m = |r: Requirement| {
        CheckedRequirement::new(&r, "f")
            .expect("valid")
            .matches(&props)
    };
    assert!(m(req("cores", Operator::Gt, &["4"])).is_ok());
    assert!(m(req("cores", Operator::Gt, &["8"])).is_err());
    assert!(m(req("cores", Operator::Lt, &["10"])).is_ok());
    assert!(m(req("cores", Operator::Lt, &["-1"])).is_err());
    // 10 > 9 numerically even though "10" < "9" as strings.
    let props10 = Properties::from([("cores".to_string(), "10".to_string())]);
    assert!(
        CheckedRequirement::new(&req("cores", Operator::Gt, &["9"]), "f")
            .expect("valid")
            .matches(&props10)
            .is_ok()
    );
    assert_eq!(
        m(req("name", Operator::Gt, &["1"])),
        Err(RequirementMiss::NotAnInteger {
            actual: "big".into()
        })
    );
    assert_eq!(
        m(req("absent", Operator::Lt, &["1"])),
        Err(RequirementMiss::NotMet { actual: None })
    );
}

#[test]
fn a_non_integer_gt_value_is_an_error_naming_the_field() {
    let e = CheckedRequirement::new(
        &req("cores", Operator::Gt, &["four"]),
        "spec.requirements[1]",
    )
    .expect_err("invalid");
    assert_eq!(
        e.to_string(),
        "spec.requirements[1]: requirement on cores: Gt needs an integer value, got \"four\""
    );
    assert!(CheckedRequirement::new(&req("cores", Operator::Lt, &["1", "2"]), "f").is_err());
    assert!(CheckedRequirement::new(&req("cores", Operator::Lt, &[]), "f").is_err());
    assert!(CheckedRequirement::new(&req("zone", Operator::In, &[]), "f").is_err());
    assert!(CheckedRequirement::new(&req("zone", Operator::Exists, &["x"]), "f").is_err());
    let mut c = claim();
    c.requirements = vec![
        req("a", Operator::Exists, &[]),
        req("cores", Operator::Gt, &["x"]),
    ];
    let e = ClaimRequest::new(&c, None).expect_err("invalid");
    assert!(e.to_string().starts_with("spec.requirements[1]:"), "{e}");
}

#[test]
fn the_cheapest_fitting_type_wins_and_ties_go_by_name() {
    let cat = Catalogue::new(vec![
        prepared("large", &[("cpu", "8"), ("memory", "32Gi")]),
        prepared("b-small", &[("cpu", "2"), ("memory", "4Gi")]),
        prepared("a-small", &[("cpu", "2"), ("memory", "4Gi")]),
    ]);
    let chosen = choose(&cat, &request(&claim()), &BTreeMap::new()).expect("fits");
    assert_eq!(chosen.name, "p.a-small");
    let mut c = claim();
    c.desired_capacity = ResourceList::from([("memory".to_string(), Quantity("8Gi".into()))]);
    assert_eq!(
        choose(&cat, &request(&c), &BTreeMap::new())
            .expect("fits")
            .name,
        "p.large"
    );
}

#[test]
fn a_full_type_is_skipped_for_the_next_cheapest() {
    let mut small = prepared("small", &[("cpu", "2"), ("memory", "4Gi")]);
    small.max_capacity = Some(2);
    let cat = Catalogue::new(vec![
        small,
        prepared("large", &[("cpu", "8"), ("memory", "32Gi")]),
    ]);
    let claimed = BTreeMap::from([("p.small".to_string(), 2)]);
    assert_eq!(
        choose(&cat, &request(&claim()), &claimed)
            .expect("fits")
            .name,
        "p.large"
    );
    let claimed = BTreeMap::from([("p.small".to_string(), 1)]);
    assert_eq!(
        choose(&cat, &request(&claim()), &claimed)
            .expect("fits")
            .name,
        "p.small"
    );
}

#[test]
fn all_fitting_types_full_is_insufficient_capacity() {
    let mut small = prepared("small", &[("cpu", "2"), ("memory", "4Gi")]);
    small.max_capacity = Some(1);
    let cat = Catalogue::new(vec![small]);
    let claimed = BTreeMap::from([("p.small".to_string(), 1)]);
    let e = choose(&cat, &request(&claim()), &claimed).expect_err("full");
    assert_eq!(e.reason, "InsufficientCapacity");
    assert!(e.message.contains("p.small (1/1 claimed)"), "{}", e.message);
}

#[test]
fn no_fit_names_the_failed_requirement_of_the_nearest_type() {
    let cat = Catalogue::from_provider(&example_provider("nodeprovider-advanced.yaml"));
    let mut c = claim();
    c.requirements = vec![
        req(
            "autonodes.io/node-type",
            Operator::In,
            &["high-memory-node"],
        ),
        req("topology.kubernetes.io/zone", Operator::In, &["eu-1"]),
    ];
    let e = choose(&cat, &request(&c), &BTreeMap::new()).expect_err("no fit");
    assert_eq!(e.reason, "NoMatchingNodeType");
    assert_eq!(
            e.message,
            "none of 2 node type(s) fits; nearest is kubevirt-provider-advanced.high-memory-node: \
             requirement `topology.kubernetes.io/zone In [eu-1]` not met (the type has no such property)"
        );
    let mut c = claim();
    c.desired_capacity = ResourceList::from([("memory".to_string(), Quantity("32Gi".into()))]);
    let e = choose(&cat, &request(&c), &BTreeMap::new()).expect_err("no fit");
    assert!(
        e.message
            .contains("desiredCapacity not covered: memory 32Gi wanted, 4Gi available"),
        "{}",
        e.message
    );
}

#[test]
fn extended_resources_are_chosen_only_when_requested() {
    let cat = Catalogue::new(vec![
        prepared(
            "gpu",
            &[("cpu", "1"), ("memory", "1Gi"), ("nvidia.com/gpu", "1")],
        ),
        prepared("cpu-only", &[("cpu", "16"), ("memory", "64Gi")]),
    ]);
    let gpu_only = Catalogue::new(vec![cat.get("gpu").cloned().expect("gpu")]);
    let e = choose(&gpu_only, &request(&claim()), &BTreeMap::new()).expect_err("unrequested gpu");
    assert!(
        e.message
            .contains("nvidia.com/gpu, which the claim does not request"),
        "{}",
        e.message
    );
    let mut c = claim();
    c.desired_capacity = ResourceList::from([("nvidia.com/gpu".to_string(), Quantity("1".into()))]);
    assert_eq!(
        choose(&cat, &request(&c), &BTreeMap::new())
            .expect("fits")
            .name,
        "p.gpu"
    );
    // Naming the type explicitly also requests it.
    let mut c = claim();
    c.requirements = vec![req("autonodes.io/node-type", Operator::In, &["gpu"])];
    assert_eq!(
        choose(&cat, &request(&c), &BTreeMap::new())
            .expect("fits")
            .name,
        "p.gpu"
    );
    let mut c = claim();
    c.type_ref = Some("p.gpu".into());
    assert_eq!(
        choose(&cat, &request(&c), &BTreeMap::new())
            .expect("fits")
            .name,
        "p.gpu"
    );
    // Without a request, the cpu-only type is chosen although it costs more per cpu.
    assert_eq!(
        choose(&cat, &request(&claim()), &BTreeMap::new())
            .expect("fits")
            .name,
        "p.cpu-only"
    );
}

#[test]
fn type_ref_and_provider_ref_restrict_the_candidates() {
    let cat = Catalogue::new(vec![
        prepared("small", &[("cpu", "2"), ("memory", "4Gi")]),
        prepared("large", &[("cpu", "8"), ("memory", "32Gi")]),
    ]);
    let mut c = claim();
    c.type_ref = Some("large".into());
    assert_eq!(
        choose(&cat, &request(&c), &BTreeMap::new())
            .expect("fits")
            .name,
        "p.large"
    );
    c.type_ref = Some("p.missing".into());
    let e = choose(&cat, &request(&c), &BTreeMap::new()).expect_err("missing");
    assert_eq!(e.message, "node type p.missing does not exist");
    let mut c = claim();
    c.provider_ref = Some("other".into());
    let e = choose(&cat, &request(&c), &BTreeMap::new()).expect_err("other provider");
    assert_eq!(e.reason, "NoMatchingNodeType");
    assert_eq!(e.message, "provider other offers no node types");
}

#[test]
fn failed_types_are_never_chosen_and_explain_themselves_when_nearest() {
    let mut s = spec(&[]);
    s.merge_virtual_machine_template = Some(json!({}));
    s.virtual_machine_template = Some(json!({}));
    let both = prepare_type("p.both", &s, Some(&ctx()));
    assert_eq!(both.phase(0), NodeTypePhase::Failed);
    assert_eq!(
        both.problem.as_ref().map(TypeProblem::reason),
        Some(TypeReason::InvalidTemplate)
    );
    let cat = Catalogue::new(vec![both]);
    let e = choose(&cat, &request(&claim()), &BTreeMap::new()).expect_err("failed");
    assert!(e.message.contains("mutually exclusive"), "{}", e.message);
    assert!(e.message.contains("p.both"), "{}", e.message);
}

#[test]
fn a_template_kubevirt_would_refuse_fails_its_type_and_claims_go_to_a_valid_sibling() {
    let mut both = spec(&[("cpu", "1"), ("memory", "1Gi")]);
    both.merge_virtual_machine_template =
        Some(json!({"spec": {"running": true, "runStrategy": "Always"}}));
    let both = prepare_type("p.cheap-but-broken", &both, Some(&ctx()));
    assert_eq!(both.phase(0), NodeTypePhase::Failed);
    assert_eq!(
        both.problem.as_ref().map(TypeProblem::reason),
        Some(TypeReason::InvalidTemplate)
    );
    assert!(both
        .problem
        .as_ref()
        .is_some_and(|p| p.to_string().contains("runStrategy")));
    // A data volume whose name cannot fit beside the longest VM name fails too.
    let mut long_dv = spec(&[]);
    long_dv.merge_virtual_machine_template = Some(json!({"spec": {"dataVolumeTemplates": [
            {"metadata": {"name": "d".repeat(200)}}]}}));
    let long_dv = prepare_type("p.long-dv", &long_dv, Some(&ctx()));
    assert_eq!(long_dv.phase(0), NodeTypePhase::Failed);
    let cat = Catalogue::new(vec![both, long_dv, prepared("valid", &[("cpu", "8")])]);
    let chosen = choose(&cat, &request(&claim()), &BTreeMap::new()).expect("a valid type");
    assert_eq!(chosen.name, "p.valid");
}

#[test]
fn a_type_whose_memory_cannot_be_found_is_failed_with_that_reason() {
    let mut c = ctx();
    c.base_template =
        Some(json!({"spec": {"template": {"spec": {"domain": {"cpu": {"cores": 2}}}}}}));
    let t = prepare_type("p.nomem", &spec(&[]), Some(&c));
    assert_eq!(t.phase(0), NodeTypePhase::Failed);
    assert_eq!(
        t.problem.as_ref().map(TypeProblem::reason),
        Some(TypeReason::MemoryNotFound)
    );
    let status = t.status(0);
    assert_eq!(status.phase, Some(NodeTypePhase::Failed));
    assert_eq!(status.cost, None);
}

#[test]
fn a_type_whose_provider_is_missing_is_failed() {
    let t = prepare_type("p.orphan", &spec(&[]), None);
    assert_eq!(
        t.problem.as_ref().map(TypeProblem::reason),
        Some(TypeReason::ProviderNotFound)
    );
    assert!(t
        .problem
        .as_ref()
        .is_some_and(|p| p.to_string().contains("NodeProvider p not found")));
}

#[test]
fn capacity_reports_total_claimed_and_available_and_absent_when_unlimited() {
    assert_eq!(
        capacity(Some(5), 2),
        NodeTypeCapacity {
            total: Some(5),
            claimed: 2,
            available: Some(3)
        }
    );
    assert_eq!(
        capacity(Some(1), 3),
        NodeTypeCapacity {
            total: Some(1),
            claimed: 3,
            available: Some(0)
        }
    );
    assert_eq!(
        capacity(None, 7),
        NodeTypeCapacity {
            total: None,
            claimed: 7,
            available: None
        }
    );
    let mut t = prepared("t", &[]);
    t.max_capacity = Some(1);
    assert_eq!(t.phase(0), NodeTypePhase::Available);
    assert_eq!(t.phase(1), NodeTypePhase::Exhausted);
}

#[test]
fn claims_hold_capacity_from_scheduling_until_failed_or_released_and_reservations_count_once() {
    let mk = |uid: &str, t: Option<&str>, phase: Option<autonodes_api::NodeClaimPhase>| {
        let mut c = NodeClaim::new("c", claim());
        c.metadata.uid = Some(uid.to_string());
        c.status = Some(autonodes_api::NodeClaimStatus {
            type_ref: t.map(str::to_string),
            phase,
            ..Default::default()
        });
        c
    };
    let claims = [
        mk("1", Some("p.a"), None),
        mk(
            "2",
            Some("p.a"),
            Some(autonodes_api::NodeClaimPhase::Terminating),
        ),
        mk("3", Some("p.b"), None),
        mk("4", None, None),
        mk(
            "5",
            Some("p.b"),
            Some(autonodes_api::NodeClaimPhase::Failed),
        ),
        mk("6", Some("p.b"), None),
    ];
    let reserved = HashMap::from([
        ("1".to_string(), "p.a".to_string()),
        ("4".to_string(), "p.c".to_string()),
    ]);
    let released = HashSet::from(["6".to_string()]);
    let counts = count_claimed(claims.iter(), &reserved, &released);
    assert_eq!(
        counts,
        BTreeMap::from([
            ("p.a".to_string(), 2),
            ("p.b".to_string(), 1),
            ("p.c".to_string(), 1)
        ])
    );
}

#[test]
fn status_lists_properties_as_in_requirements() {
    let t = prepared("t", &[]);
    let s = t.status(0);
    assert_eq!(s.cost, Some(28));
    let r = s
        .requirements
        .iter()
        .find(|r| r.key == "autonodes.io/node-type")
        .expect("present");
    assert_eq!(r.operator, "In");
    assert_eq!(r.values, Some(vec!["t".to_string()]));
}

#[test]
fn kubelet_restricted_labels_are_set_after_join() {
    assert!(kubelet_may_set_label("workload"));
    assert!(kubelet_may_set_label("autonodes.io/node-type"));
    assert!(kubelet_may_set_label("kubernetes.io/arch"));
    assert!(kubelet_may_set_label("node.kubernetes.io/instance-type"));
    assert!(kubelet_may_set_label("node.kubernetes.io/anything"));
    assert!(kubelet_may_set_label("x.kubelet.kubernetes.io/y"));
    assert!(kubelet_may_set_label("topology.kubernetes.io/zone"));
    assert!(!kubelet_may_set_label("node-role.kubernetes.io/worker"));
    assert!(!kubelet_may_set_label("kubernetes.io/role"));
    assert!(!kubelet_may_set_label("example.k8s.io/x"));
    assert!(!kubelet_may_set_label("k8s.io/x"));
    assert!(kubelet_may_set_label("notk8s.io/x"));

    let props = Properties::from([
        ("node-role.kubernetes.io/worker".to_string(), "".to_string()),
        ("autonodes.io/node-type".to_string(), "small".to_string()),
        ("autonodes.io/user-data".to_string(), "x".to_string()),
        ("display".to_string(), "has spaces".to_string()),
    ]);
    let labels = node_labels(
        &props,
        None,
        &BTreeMap::from([("team".to_string(), "a".to_string())]),
        &BTreeMap::new(),
    )
    .expect("valid");
    assert_eq!(
        labels.join,
        BTreeMap::from([
            ("autonodes.io/node-type".to_string(), "small".to_string()),
            ("team".to_string(), "a".to_string()),
        ])
    );
    assert_eq!(
        labels.after_join,
        BTreeMap::from([("node-role.kubernetes.io/worker".to_string(), "".to_string())])
    );
    assert_eq!(labels.all().len(), 3);
}

#[test]
fn labels_the_kubelet_the_node_controller_or_autonodes_own_are_refused() {
    for key in [
        "kubernetes.io/hostname",
        "kubernetes.io/arch",
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
        "node.kubernetes.io/windows-build",
        "topology.kubernetes.io/zone",
        "autonodes.io/node-type",
        "autonodes.io/nodeclaim",
    ] {
        let e = node_labels(
            &Properties::new(),
            None,
            &BTreeMap::from([(key.to_string(), "evil".to_string())]),
            &BTreeMap::new(),
        )
        .expect_err(key);
        assert_eq!(e.field, "spec.labels");
        assert_eq!(e.key, key);
    }
    for key in [
        "node.kubernetes.io/exclude-from-external-load-balancers",
        "node-role.kubernetes.io/worker",
        "team",
        "example.com/tier",
    ] {
        assert_eq!(reserved_label(key), None, "{key}");
    }
    // autonodes' own identity labels come last and are not refused.
    let labels = node_labels(
        &Properties::new(),
        None,
        &BTreeMap::new(),
        &BTreeMap::from([("autonodes.io/nodeclaim".to_string(), "c".to_string())]),
    )
    .expect("identity");
    assert_eq!(labels.join["autonodes.io/nodeclaim"], "c");
}

#[test]
fn invalid_claim_labels_are_errors_naming_the_field() {
    let e = node_labels(
        &Properties::new(),
        None,
        &BTreeMap::from([("bad key".to_string(), "v".to_string())]),
        &BTreeMap::new(),
    )
    .expect_err("invalid");
    assert_eq!(
        e.to_string(),
        "spec.labels: label \"bad key\"=\"v\": not a valid label key"
    );
    let e = node_labels(
        &Properties::new(),
        None,
        &BTreeMap::from([("k".to_string(), "a,b".to_string())]),
        &BTreeMap::new(),
    )
    .expect_err("invalid");
    assert!(e.to_string().contains("not a valid label value"));
}

#[test]
fn label_keys_and_values_follow_kubernetes_syntax() {
    assert!(is_valid_label_key("a"));
    assert!(is_valid_label_key("example.com/My_Label.1"));
    assert!(!is_valid_label_key("Example.com/x"));
    assert!(!is_valid_label_key("/x"));
    assert!(!is_valid_label_key("a/b/c"));
    assert!(!is_valid_label_key(&"a".repeat(64)));
    assert!(is_valid_label_value(""));
    assert!(is_valid_label_value("v1.2_3-x"));
    assert!(!is_valid_label_value("-x"));
    assert!(!is_valid_label_value("a b"));
    assert!(!is_valid_label_value("ä"));
}

#[test]
fn node_taints_merge_type_pool_and_claim_and_register_with_startup_and_unregistered() {
    let cat = Catalogue::from_provider(&example_provider("nodeprovider-advanced.yaml"));
    let high = cat.get("high-memory-node").expect("type");
    let mut c = claim();
    c.taints = vec![
        taint("dedicated", Some("db"), "NoSchedule"),
        taint("workload", Some("other"), "NoSchedule"),
    ];
    c.startup_taints = vec![taint("cni-not-ready", None, "NoSchedule")];
    let t = node_taints(high, None, &c).expect("valid");
    assert_eq!(
        t.taints,
        vec![
            taint("workload", Some("other"), "NoSchedule"),
            taint("dedicated", Some("db"), "NoSchedule")
        ]
    );
    let reg = t.registration();
    assert_eq!(reg.len(), 4);
    assert_eq!(
        reg[3],
        taint("autonodes.io/unregistered", None, "NoExecute")
    );
    c.taints = vec![taint("x", None, "Never")];
    let e = node_taints(high, None, &c).expect_err("bad effect");
    assert!(e.to_string().starts_with("spec.taints:"), "{e}");
}

#[test]
fn generated_node_types_are_named_labelled_and_owned() {
    let mut p = example_provider("nodeprovider-advanced.yaml");
    p.metadata.uid = Some("uid-9".into());
    let types = node_types_from_provider(&p);
    assert_eq!(types.len(), 2);
    let t = &types[1];
    assert_eq!(
        t.metadata.name.as_deref(),
        Some("kubevirt-provider-advanced.high-memory-node")
    );
    assert_eq!(
        t.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("autonodes.io/provider"))
            .map(String::as_str),
        Some("kubevirt-provider-advanced")
    );
    let owner = &t.metadata.owner_references.as_ref().expect("owned")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("NodeProvider", "uid-9", Some(true))
    );
    assert_eq!(t.spec.max_capacity, Some(5));
    assert_eq!(
        short_type_name(
            "kubevirt-provider-advanced.high-memory-node",
            "kubevirt-provider-advanced"
        ),
        "high-memory-node"
    );
    assert_eq!(short_type_name("custom", "p"), "custom");
}

/// The requirement of a claim and the same requirement of a pod agree.
mod agreement {
    use super::*;
    use crate::requirements::Requirement;
    use autonodes_api::{self, Properties};
    use k8s_openapi::api::core::v1::NodeSelectorRequirement;
    use proptest::prelude::*;

    const OPERATORS: &[(autonodes_api::Operator, &str)] = &[
        (autonodes_api::Operator::In, "In"),
        (autonodes_api::Operator::NotIn, "NotIn"),
        (autonodes_api::Operator::Exists, "Exists"),
        (autonodes_api::Operator::DoesNotExist, "DoesNotExist"),
        (autonodes_api::Operator::Gt, "Gt"),
        (autonodes_api::Operator::Lt, "Lt"),
    ];

    /// Label-like values, integers among them.
    fn value() -> impl Strategy<Value = String> {
        prop_oneof![
            (-20i64..20).prop_map(|n| n.to_string()),
            "[a-c]{1,2}",
            Just("007".to_string()),
            Just("+3".to_string()),
        ]
    }

    proptest! {
        #[test]
        fn a_requirement_holds_for_a_pod_exactly_when_it_holds_for_a_claim(
            key in "[a-c]",
            op in 0..OPERATORS.len(),
            values in proptest::collection::vec(value(), 0..3),
            map in proptest::collection::btree_map("[a-c]", value(), 0..3),
        ) {
            let (claim_op, pod_op) = OPERATORS[op];
            let claim = CheckedRequirement::new(
                &autonodes_api::Requirement { key: key.clone(), operator: claim_op, values: values.clone(), min_values: None },
                "f",
            );
            // The claim side refuses malformed requirements; those a claim accepts
            // mean the same to a pod.
            if let Ok(claim) = claim {
                let pod = Requirement::from_node_selector(&NodeSelectorRequirement {
                    key,
                    operator: pod_op.to_string(),
                    values: Some(values),
                });
                let properties: Properties = map;
                prop_assert_eq!(
                    claim.matches(&properties).is_ok(),
                    pod.is_some_and(|p| p.matches(&properties).is_ok())
                );
            }
        }
    }
}

#[test]
fn gte_and_lte_include_their_bound() {
    let props = Properties::from([("cores".to_string(), "8".to_string())]);
    let m = |op: Operator, v: &str| {
        CheckedRequirement::new(&req("cores", op, &[v]), "f")
            .expect("valid")
            .matches(&props)
            .is_ok()
    };
    assert!(m(Operator::Gte, "8") && m(Operator::Lte, "8"));
    assert!(m(Operator::Gte, "7") && !m(Operator::Gte, "9"));
    assert!(m(Operator::Lte, "9") && !m(Operator::Lte, "7"));
    assert!(!m(Operator::Gt, "8") && !m(Operator::Lt, "8"));
    assert!(CheckedRequirement::new(&req("cores", Operator::Gte, &["x"]), "f").is_err());
}

#[test]
fn a_claim_is_scheduled_only_when_the_fitting_types_offer_min_values_of_the_key() {
    let zoned = |short: &str, zone: &str| {
        let mut s = spec(&[("cpu", "2"), ("memory", "4Gi")]);
        s.properties
            .insert("topology.kubernetes.io/zone".into(), zone.into());
        prepare_type(&format!("p.{short}"), &s, Some(&ctx()))
    };
    let cat = Catalogue::new(vec![zoned("a1", "a"), zoned("a2", "a"), zoned("b1", "b")]);
    let with = |n: i64| {
        let mut c = claim();
        let mut r = req("topology.kubernetes.io/zone", Operator::Exists, &[]);
        r.min_values = Some(n);
        c.requirements = vec![r];
        c
    };
    assert!(choose(&cat, &request(&with(2)), &BTreeMap::new()).is_ok());
    let e = choose(&cat, &request(&with(3)), &BTreeMap::new()).expect_err("too few zones");
    assert_eq!(e.reason, "NoMatchingNodeType");
    assert!(
        e.message.contains("at least 3 distinct values") && e.message.contains("offer 2 (a, b)"),
        "{}",
        e.message
    );
    // Requirements narrowing the types narrow the values too.
    let mut narrowed = with(2);
    narrowed
        .requirements
        .push(req("topology.kubernetes.io/zone", Operator::In, &["a"]));
    assert!(choose(&cat, &request(&narrowed), &BTreeMap::new()).is_err());
    // Out of Karpenter's range: refused as invalid.
    assert!(ClaimRequest::new(&with(0), None).is_err());
    assert!(ClaimRequest::new(&with(51), None).is_err());
}

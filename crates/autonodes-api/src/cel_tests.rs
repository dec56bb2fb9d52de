//! The CRDs' CEL rules (`x-kubernetes-validations`), evaluated as an API server of 1.25 or
//! later evaluates them (kube-rs' evaluator, on the generated schemas): each refuses what
//! the controller would refuse with a condition, with a message naming the field, and
//! every example of the repository passes them.

use kube_core::cel::Validator;
use serde_json::{json, Value};

use crate::crds;

/// The `openAPIV3Schema` of the CRD of `kind`.
fn schema(kind: &str) -> Value {
    let crd = crds()
        .into_iter()
        .find(|c| c.spec.names.kind == kind)
        .unwrap_or_else(|| panic!("no CRD of kind {kind}"));
    let schema = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .expect("schema");
    serde_json::to_value(schema).expect("json")
}

/// The messages of the rules `object` (of `kind`) breaks.
fn broken(kind: &str, object: &Value) -> Vec<String> {
    match Validator::new().validate(&schema(kind), object, None) {
        Ok(()) => Vec::new(),
        Err(errors) => errors
            .iter()
            .map(|e| format!("{}: {}", e.field_path, e.message))
            .collect(),
    }
}

fn pool(spec: Value) -> Value {
    json!({"apiVersion": "autonodes.io/v1alpha1", "kind": "NodePool",
           "metadata": {"name": "p", "namespace": "t"},
           "spec": merge(json!({"vClusterRef": {"name": "vc"}}), spec)})
}

fn claim(spec: Value) -> Value {
    json!({"apiVersion": "autonodes.io/v1alpha1", "kind": "NodeClaim",
           "metadata": {"name": "c", "namespace": "t"},
           "spec": merge(json!({"vClusterRef": {"name": "vc"}}), spec)})
}

fn merge(mut base: Value, extra: Value) -> Value {
    if let (Some(b), Some(e)) = (base.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    base
}

#[test]
fn a_requirement_whose_operator_and_values_disagree_is_refused_naming_the_operator() {
    let with = |r: Value| broken("NodeClaim", &claim(json!({"requirements": [r]})));
    for ok in [
        json!({"key": "zone", "operator": "In", "values": ["a"]}),
        json!({"key": "zone", "values": ["a"]}),
        json!({"property": "zone", "value": "a"}),
        json!({"key": "gpu", "operator": "Exists"}),
        json!({"key": "cpu", "operator": "Gt", "values": ["4"]}),
        json!({"property": "cpu", "operator": "Lte", "value": "8"}),
    ] {
        assert_eq!(with(ok.clone()), Vec::<String>::new(), "{ok}");
    }
    let cases = [
        (json!({"key": "zone", "operator": "In"}), "In and NotIn"),
        (json!({"key": "zone"}), "In and NotIn"),
        (
            json!({"key": "zone", "operator": "NotIn", "values": []}),
            "In and NotIn",
        ),
        (
            json!({"key": "gpu", "operator": "Exists", "values": ["x"]}),
            "Exists and DoesNotExist take no values",
        ),
        (
            json!({"key": "gpu", "operator": "DoesNotExist", "value": "x"}),
            "Exists and DoesNotExist take no values",
        ),
        (
            json!({"key": "cpu", "operator": "Gt", "values": ["4", "8"]}),
            "exactly one integer",
        ),
        (
            json!({"key": "cpu", "operator": "Lt"}),
            "exactly one integer",
        ),
    ];
    for (requirement, message) in cases {
        let errors = with(requirement.clone());
        assert_eq!(errors.len(), 1, "{requirement}: {errors:?}");
        assert!(errors[0].contains(message), "{requirement}: {errors:?}");
        assert!(
            errors[0].contains("requirements"),
            "the path names the list: {errors:?}"
        );
    }
    // The same rules on a pool.
    let errors = broken(
        "NodePool",
        &pool(json!({"requirements": [{"key": "zone", "operator": "In"}]})),
    );
    assert_eq!(errors.len(), 1, "{errors:?}");
}

#[test]
fn a_budget_with_a_schedule_and_no_duration_or_the_other_way_round_is_refused() {
    let with = |b: Value| broken("NodePool", &pool(json!({"disruption": {"budgets": [b]}})));
    assert!(with(json!({"nodes": "1"})).is_empty());
    assert!(with(json!({"nodes": "0", "schedule": "@daily", "duration": "8h"})).is_empty());
    for b in [
        json!({"nodes": "0", "schedule": "@daily"}),
        json!({"nodes": "0", "duration": "8h"}),
    ] {
        let errors = with(b.clone());
        assert_eq!(errors.len(), 1, "{b}: {errors:?}");
        assert!(errors[0].contains("budgets"), "{errors:?}");
        assert!(
            errors[0].contains("schedule needs a duration"),
            "{errors:?}"
        );
    }
}

#[test]
fn autoscaling_needs_replicas_and_a_max_above_its_min() {
    let ok = pool(json!({"replicas": 1, "autoscaling": {"minReplicas": 1, "maxReplicas": 5}}));
    assert!(broken("NodePool", &ok).is_empty());
    let errors = broken(
        "NodePool",
        &pool(json!({"autoscaling": {"minReplicas": 1, "maxReplicas": 5}})),
    );
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("autoscaling needs replicas"),
        "{errors:?}"
    );
    for (min, max) in [(3, 3), (5, 2)] {
        let errors = broken(
            "NodePool",
            &pool(json!({"replicas": 3, "autoscaling": {"minReplicas": min, "maxReplicas": max}})),
        );
        assert_eq!(errors.len(), 1, "{min}..{max}: {errors:?}");
        assert!(errors[0].contains("autoscaling"), "{errors:?}");
        assert!(
            errors[0].contains("maxReplicas must exceed minReplicas"),
            "{errors:?}"
        );
    }
}

#[test]
fn every_example_of_the_repository_passes_the_rules() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).expect("examples") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("readable");
        for doc in text.split("\n---") {
            let Ok(value) = serde_saphyr::from_str::<Value>(doc) else {
                continue;
            };
            let Some(kind) = value.get("kind").and_then(Value::as_str).filter(|_| {
                value["apiVersion"]
                    .as_str()
                    .is_some_and(|a| a.contains("autonodes.io"))
            }) else {
                continue;
            };
            assert_eq!(
                broken(kind, &value),
                Vec::<String>::new(),
                "{} ({kind})",
                path.display()
            );
            checked += 1;
        }
    }
    assert!(checked >= 8, "only {checked} examples checked");
}

#[test]
fn the_rules_are_where_the_crds_carry_them() {
    // Each rule is written into the generated CRDs (kept by `crdgen` and its test).
    let text = serde_json::to_string(&crds()).expect("json");
    for rule in crate::schema::REQUIREMENT_RULES
        .iter()
        .map(|(r, _)| *r)
        .chain([
            "has(self.schedule) == has(self.duration)",
            "self.maxReplicas > self.minReplicas",
            "!has(self.autoscaling) || has(self.replicas)",
        ])
    {
        assert!(
            text.contains(&serde_json::to_string(rule).expect("json")[1..]),
            "{rule}"
        );
    }
}

//! Where on the host a VM runs: the host node affinity of its zone. Pure code, no I/O.
//!
//! Written into the VM's `spec.template.spec.affinity` (core/v1 Affinity, which KubeVirt
//! gives the launcher pod): a required node affinity term matching the host nodes'
//! `topology.kubernetes.io/zone`. Terms the template brings are kept: the zone is added to
//! each of them (a pod may go where any term matches, so each must also hold the zone).

use serde_json::{json, Map, Value};

use super::TemplateError;
use crate::zones::PROP_ZONE;

const TERMS: &str = "/spec/template/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms";

/// Makes the VM's launcher pod run only on host nodes labelled `topology.kubernetes.io/zone
/// = zone`: a match expression added to every required node selector term of the template
/// (one term made when it has none). A template whose affinity is not an object there is
/// an error naming the field.
pub fn require_host_zone(vm: &mut Value, zone: &str, node_type: &str) -> Result<(), TemplateError> {
    let not_object = |field: &str| TemplateError::NotAnObject {
        node_type: node_type.to_string(),
        field: field.to_string(),
    };
    let expression = json!({"key": PROP_ZONE, "operator": "In", "values": [zone]});
    let mut at = vm;
    for part in TERMS.split('/').filter(|p| !p.is_empty()) {
        if at.is_null() {
            *at = Value::Object(Map::new());
        }
        let is_last = part == "nodeSelectorTerms";
        at = at
            .as_object_mut()
            .ok_or_else(|| not_object("spec.template.spec.affinity.nodeAffinity"))?
            .entry(part)
            .or_insert_with(|| if is_last { json!([]) } else { json!({}) });
    }
    let terms = at.as_array_mut().ok_or_else(|| {
        not_object("spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms (a list)")
    })?;
    if terms.is_empty() {
        terms.push(json!({"matchExpressions": [expression]}));
        return Ok(());
    }
    for term in terms.iter_mut() {
        let term = term.as_object_mut().ok_or_else(|| {
            not_object("a nodeSelectorTerm of spec.template.spec.affinity.nodeAffinity")
        })?;
        let expressions = term
            .entry("matchExpressions")
            .or_insert_with(|| json!([]))
            .as_array_mut()
            .ok_or_else(|| not_object("matchExpressions (a list)"))?;
        expressions.retain(|e| e.get("key").and_then(Value::as_str) != Some(PROP_ZONE));
        expressions.push(expression.clone());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn terms(vm: &Value) -> &Value {
        vm.pointer(TERMS).expect("terms")
    }

    #[test]
    fn a_zone_becomes_a_required_host_node_affinity_term() {
        let mut vm = json!({"spec": {"template": {"spec": {}}}});
        require_host_zone(&mut vm, "zone-b", "p.t").expect("adds");
        assert_eq!(
            terms(&vm),
            &json!([{"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-b"]}]}])
        );
    }

    #[test]
    fn the_zone_joins_every_term_the_template_brings_and_replaces_a_zone_expression_there() {
        let mut vm = json!({"spec": {"template": {"spec": {"affinity": {
            "podAntiAffinity": {"x": 1},
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1}],
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "kubevirt.io/schedulable", "operator": "In", "values": ["true"]}]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["h1"]}]},
                    {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-a"]}]},
                ]},
            },
        }}}}});
        require_host_zone(&mut vm, "zone-b", "p.t").expect("adds");
        let zone =
            json!({"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-b"]});
        assert_eq!(
            terms(&vm),
            &json!([
                {"matchExpressions": [{"key": "kubevirt.io/schedulable", "operator": "In", "values": ["true"]}, zone]},
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["h1"]}], "matchExpressions": [zone]},
                {"matchExpressions": [zone]},
            ])
        );
        let affinity = vm
            .pointer("/spec/template/spec/affinity")
            .expect("affinity");
        assert_eq!(affinity["podAntiAffinity"], json!({"x": 1}));
        assert_eq!(
            affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"],
            json!([{"weight": 1}])
        );
    }

    #[test]
    fn an_affinity_that_is_not_an_object_is_an_error_naming_the_field() {
        let mut vm = json!({"spec": {"template": {"spec": {"affinity": "anywhere"}}}});
        let e = require_host_zone(&mut vm, "zone-a", "p.t").expect_err("refused");
        assert!(e.to_string().contains("affinity"), "{e}");
    }
}

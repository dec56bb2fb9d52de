//! What a Node that joined a tenant still needs from autonodes: the labels the kubelet may
//! not set on itself and the removal of the registration taint, as one JSON patch.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Taint};
use serde_json::{json, Value};

use crate::scheduling::REGISTRATION_TAINT_KEY;

/// The JSON-patch operations that give `node` the `labels` it lacks and remove the
/// registration taint, or `None` when it needs neither.
///
/// Labels are added one by one; the taints are replaced only if they are still the ones
/// read (a `test` op), so the kubelet's status heartbeats, which change the Node's
/// `resourceVersion`, do not make the patch conflict, and a taint someone else changed
/// meanwhile makes it fail (422) instead of being overwritten.
pub fn node_patch(node: &Node, labels: &BTreeMap<String, String>) -> Option<Vec<Value>> {
    let current = node.metadata.labels.clone().unwrap_or_default();
    let missing: BTreeMap<&String, &String> = labels
        .iter()
        .filter(|(k, v)| current.get(*k) != Some(*v))
        .collect();
    let taints: Vec<Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let has_registration = removes_registration_taint(node);
    if missing.is_empty() && !has_registration {
        return None;
    }
    let kept: Vec<&Taint> = taints
        .iter()
        .filter(|t| t.key != REGISTRATION_TAINT_KEY)
        .collect();
    let mut ops: Vec<Value> = Vec::new();
    if current.is_empty() && !missing.is_empty() {
        ops.push(json!({"op": "add", "path": "/metadata/labels", "value": {}}));
    }
    for (k, v) in &missing {
        ops.push(json!({"op": "add", "path": format!("/metadata/labels/{}", json_pointer_escape(k)), "value": v}));
    }
    if has_registration {
        ops.push(json!({"op": "test", "path": "/spec/taints", "value": taints}));
        if kept.is_empty() {
            ops.push(json!({"op": "remove", "path": "/spec/taints"}));
        } else {
            ops.push(json!({"op": "replace", "path": "/spec/taints", "value": kept}));
        }
    }
    Some(ops)
}

/// True when `node` still carries the registration taint (its patch tests the taints).
pub fn removes_registration_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == REGISTRATION_TAINT_KEY))
}

/// A JSON pointer segment for `key` (`~` → `~0`, `/` → `~1`).
fn json_pointer_escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSpec;

    fn node(labels: &[(&str, &str)], taints: &[&str]) -> Node {
        let mut n = Node::default();
        if !labels.is_empty() {
            n.metadata.labels = Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            );
        }
        n.spec = Some(NodeSpec {
            taints: Some(
                taints
                    .iter()
                    .map(|k| Taint {
                        key: k.to_string(),
                        effect: "NoSchedule".into(),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        });
        n
    }

    fn want(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_node_with_its_labels_and_no_registration_taint_needs_no_patch() {
        let n = node(&[("a/b", "1")], &["other"]);
        assert_eq!(node_patch(&n, &want(&[("a/b", "1")])), None);
    }

    #[test]
    fn missing_labels_are_added_escaped_and_the_registration_taint_is_removed_if_unchanged() {
        let n = node(&[], &[REGISTRATION_TAINT_KEY, "keep"]);
        let ops = node_patch(&n, &want(&[("example.com/x~y", "v")])).expect("a patch");
        assert_eq!(
            ops[0],
            json!({"op": "add", "path": "/metadata/labels", "value": {}})
        );
        assert_eq!(
            ops[1],
            json!({"op": "add", "path": "/metadata/labels/example.com~1x~0y", "value": "v"})
        );
        assert_eq!(ops[2]["op"], "test");
        assert_eq!(ops[3]["op"], "replace");
        assert_eq!(ops[3]["value"].as_array().map(Vec::len), Some(1));
    }

    #[test]
    fn the_last_taint_going_removes_the_taint_list() {
        let n = node(&[("a", "b")], &[REGISTRATION_TAINT_KEY]);
        let ops = node_patch(&n, &want(&[("a", "b")])).expect("a patch");
        assert_eq!(ops.len(), 2);
        assert_eq!(ops[1], json!({"op": "remove", "path": "/spec/taints"}));
    }
}

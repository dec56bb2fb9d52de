//! Where the simulated scheduler puts a guest: which host Node a new instance runs on and
//! which one a live migration goes to. Pure, over the host's Node objects (plain objects in
//! the tests, with no kubelet behind them: a Node without conditions counts as ready).

use std::borrow::Borrow;

use k8s_openapi::api::core::v1::Node;

/// The Node's name.
fn name(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or_default()
}

/// Cordoned: `spec.unschedulable`.
pub(crate) fn cordoned(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

/// A guest may be placed on the Node: not cordoned, and its `Ready` condition (if it has
/// one) is not `False` or `Unknown`.
pub(crate) fn usable(node: &Node) -> bool {
    let not_ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status != "True");
    !cordoned(node) && !not_ready
}

/// The first usable Node by name, other than `except`.
fn first_usable<'a>(nodes: &'a [impl Borrow<Node>], except: Option<&str>) -> Option<&'a str> {
    nodes
        .iter()
        .map(Borrow::<Node>::borrow)
        .filter(|n| usable(n) && Some(name(n)) != except && !name(n).is_empty())
        .map(name)
        .min()
}

/// The host node a new instance runs on: `default` (the simulator's host node name), unless
/// the host has a Node of that name that is cordoned — then the first usable Node by name;
/// None when there is none (the instance waits in `Scheduling`, as a real scheduler leaves
/// a pod pending).
pub(crate) fn place(default: &str, nodes: &[impl Borrow<Node>]) -> Option<String> {
    let default_cordoned = nodes
        .iter()
        .map(Borrow::<Node>::borrow)
        .any(|n| name(n) == default && cordoned(n));
    if !default_cordoned {
        return Some(default.to_string());
    }
    first_usable(nodes, None).map(str::to_string)
}

/// The host node a live migration off `source` goes to: the first usable Node by name
/// other than `source`; None when there is none.
pub(crate) fn migration_target(source: &str, nodes: &[impl Borrow<Node>]) -> Option<String> {
    first_usable(nodes, Some(source)).map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn node(name: &str, unschedulable: bool, ready: Option<&str>) -> Node {
        let conditions: Vec<Value> = ready
            .map(|s| json!({"type": "Ready", "status": s}))
            .into_iter()
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"unschedulable": unschedulable},
            "status": {"conditions": conditions},
        }))
        .expect("a Node")
    }

    #[test]
    fn a_new_instance_runs_on_the_default_host_node_when_it_is_not_cordoned_or_not_there() {
        assert_eq!(place("h0", &Vec::<Node>::new()).as_deref(), Some("h0"));
        let nodes = [node("h1", false, Some("True"))];
        assert_eq!(place("h0", &nodes).as_deref(), Some("h0"));
        // Not ready but not cordoned: the default stays (only a cordon moves it).
        let nodes = [node("h0", false, Some("False")), node("h1", false, None)];
        assert_eq!(place("h0", &nodes).as_deref(), Some("h0"));
    }

    #[test]
    fn a_new_instance_goes_to_the_first_usable_node_by_name_when_the_default_is_cordoned() {
        let nodes = [
            node("h3", false, Some("True")),
            node("h0", true, Some("True")),
            node("h1", false, Some("Unknown")),
            node("h2", false, None),
        ];
        assert_eq!(place("h0", &nodes).as_deref(), Some("h2"));
    }

    #[test]
    fn a_new_instance_waits_when_every_host_node_is_cordoned_or_not_ready() {
        let nodes = [node("h0", true, None), node("h1", true, Some("True"))];
        assert_eq!(place("h0", &nodes), None);
        let nodes = [node("h0", true, None), node("h1", false, Some("False"))];
        assert_eq!(place("h0", &nodes), None);
    }

    #[test]
    fn a_migration_goes_to_the_first_usable_node_other_than_its_source() {
        let nodes = [
            node("h0", false, Some("True")),
            node("h2", false, Some("True")),
            node("h1", true, Some("True")),
        ];
        assert_eq!(migration_target("h0", &nodes).as_deref(), Some("h2"));
        assert_eq!(migration_target("h2", &nodes).as_deref(), Some("h0"));
        let alone = [node("h0", true, None)];
        assert_eq!(migration_target("h0", &alone), None);
    }
}

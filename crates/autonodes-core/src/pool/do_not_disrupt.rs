//! `do-not-disrupt`: the annotation a user puts on a pod, a tenant Node or a NodeClaim to
//! keep voluntary disruption (consolidation, roll-outs after a template change) away from
//! that node, as Karpenter's `karpenter.sh/do-not-disrupt: "true"`. autonodes reads its
//! own spelling and Karpenter's. Expiry and repair are not held (as in Karpenter); a drain
//! leaves such pods alone until the pool's `terminationGracePeriod` has passed.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::{Node, Pod};

use crate::api::NodeClaim;

use super::pack::non_daemon_running;

/// autonodes' spelling of the annotation.
pub(crate) const ANNOTATION_DO_NOT_DISRUPT: &str = "autonodes.io/do-not-disrupt";
/// Karpenter's spelling, read as well.
pub(crate) const KARPENTER_DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";

/// Whether annotations carry either spelling with the value `"true"`.
pub fn marked(annotations: Option<&BTreeMap<String, String>>) -> bool {
    annotations.is_some_and(|a| {
        [ANNOTATION_DO_NOT_DISRUPT, KARPENTER_DO_NOT_DISRUPT]
            .iter()
            .any(|k| a.get(*k).is_some_and(|v| v == "true"))
    })
}

/// Whether the pod holds its node: it is marked and still keeps the node busy (not a
/// DaemonSet's or a mirror pod, not finished).
pub fn pod_holds_node(p: &Pod) -> bool {
    marked(p.metadata.annotations.as_ref()) && non_daemon_running(p)
}

/// The claims (by name) voluntary disruption leaves alone: the claim is marked, or its
/// Node (by `status.nodeName`) is, or a pod on that Node holds it.
pub fn protected<'a>(
    claims: impl IntoIterator<Item = &'a NodeClaim>,
    nodes: &[Node],
    pods: &[Pod],
) -> BTreeSet<String> {
    let marked_nodes: BTreeSet<&str> = nodes
        .iter()
        .filter(|n| marked(n.metadata.annotations.as_ref()))
        .filter_map(|n| n.metadata.name.as_deref())
        .collect();
    let mut held: HashMap<&str, usize> = HashMap::new();
    for p in pods.iter().filter(|p| pod_holds_node(p)) {
        if let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
            *held.entry(node).or_default() += 1;
        }
    }
    claims
        .into_iter()
        .filter(|c| {
            let node = c.status.as_ref().and_then(|s| s.node_name.as_deref());
            marked(c.metadata.annotations.as_ref())
                || node.is_some_and(|n| marked_nodes.contains(n) || held.contains_key(n))
        })
        .filter_map(|c| c.metadata.name.clone())
        .collect()
}

/// Whether planning reads the pod or Node annotation `key` (do-not-disrupt in both
/// spellings, the mirror-pod mark): what a dynamic pool keeps of a tenant's pods and
/// nodes' annotations, all others being dropped as they are listed.
pub fn annotation_read_by_planning(key: &str) -> bool {
    [
        ANNOTATION_DO_NOT_DISRUPT,
        KARPENTER_DO_NOT_DISRUPT,
        super::pack::MIRROR_POD_ANNOTATION,
    ]
    .contains(&key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(annotations: serde_json::Value, node: &str, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "annotations": annotations},
            "spec": {"nodeName": node, "containers": []},
            "status": {"phase": phase},
        }))
        .expect("pod")
    }

    #[test]
    fn the_annotations_a_pool_keeps_of_a_tenant_s_pods_still_hold_a_marked_node() {
        let mut p = pod(
            json!({KARPENTER_DO_NOT_DISRUPT: "true", "kubectl.kubernetes.io/last-applied-configuration": "{}"}),
            "n1",
            "Running",
        );
        if let Some(a) = p.metadata.annotations.as_mut() {
            a.retain(|k, _| annotation_read_by_planning(k));
        }
        assert_eq!(p.metadata.annotations.as_ref().map(|a| a.len()), Some(1));
        assert!(pod_holds_node(&p));
    }

    fn claim(name: &str, node: &str, annotations: serde_json::Value) -> NodeClaim {
        serde_json::from_value(json!({
            "apiVersion": "autonodes.io/v1alpha1", "kind": "NodeClaim",
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"vClusterRef": {"name": "t"}},
            "status": {"nodeName": node},
        }))
        .expect("claim")
    }

    #[test]
    fn either_spelling_with_the_value_true_marks_and_nothing_else_does() {
        let a = |k: &str, v: &str| BTreeMap::from([(k.to_string(), v.to_string())]);
        assert!(marked(Some(&a(KARPENTER_DO_NOT_DISRUPT, "true"))));
        assert!(marked(Some(&a(ANNOTATION_DO_NOT_DISRUPT, "true"))));
        assert!(!marked(Some(&a(ANNOTATION_DO_NOT_DISRUPT, "false"))));
        assert!(!marked(Some(&a(ANNOTATION_DO_NOT_DISRUPT, "yes"))));
        assert!(!marked(Some(&a("example.com/do-not-disrupt", "true"))));
        assert!(!marked(None));
    }

    #[test]
    fn a_claim_is_protected_by_its_own_mark_its_node_s_or_a_running_pod_s() {
        let claims = [
            claim("by-claim", "n1", json!({ANNOTATION_DO_NOT_DISRUPT: "true"})),
            claim("by-node", "n2", json!({})),
            claim("by-pod", "n3", json!({})),
            claim("finished-pod", "n4", json!({})),
            claim("plain", "n5", json!({})),
        ];
        let nodes: Vec<Node> = vec![serde_json::from_value(json!({
            "metadata": {"name": "n2", "annotations": {KARPENTER_DO_NOT_DISRUPT: "true"}}
        }))
        .expect("node")];
        let pods = vec![
            pod(json!({KARPENTER_DO_NOT_DISRUPT: "true"}), "n3", "Running"),
            pod(json!({KARPENTER_DO_NOT_DISRUPT: "true"}), "n4", "Succeeded"),
            pod(json!({}), "n5", "Running"),
        ];
        let got = protected(claims.iter(), &nodes, &pods);
        assert_eq!(
            got.iter().map(String::as_str).collect::<Vec<_>>(),
            ["by-claim", "by-node", "by-pod"]
        );
    }
}

//! `do-not-disrupt`: the annotation a user puts on a pod, a tenant Node or a NodeClaim to
//! keep voluntary disruption (consolidation, roll-outs after a template change) away from
//! that node, as Karpenter's `karpenter.sh/do-not-disrupt`. autonodes reads its own
//! spelling and Karpenter's. The value `"true"` protects for as long as it is there; a Go
//! duration (`"1h"`, `"90m"`) protects for that long after the pod started (its
//! `status.startTime`), or after the Node or the claim was created; any other value does
//! not protect. Expiry and repair are not held (as in Karpenter); a drain leaves such pods
//! alone until the pool's `terminationGracePeriod` has passed.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use autonodes_api::{parse_go_duration, NodeClaim};

use super::pack::non_daemon_running;

/// autonodes' spelling of the annotation.
pub(crate) const ANNOTATION_DO_NOT_DISRUPT: &str = "autonodes.io/do-not-disrupt";
/// Karpenter's spelling, read as well.
pub(crate) const KARPENTER_DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";

/// How long an object's annotation protects it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    /// `"true"`: as long as the annotation is there.
    Always,
    /// A duration: until this time (the object's start plus the duration).
    Until(Timestamp),
}

impl Hold {
    /// Whether the hold still protects at `now`.
    pub fn holds_at(self, now: Timestamp) -> bool {
        match self {
            Hold::Always => true,
            Hold::Until(t) => now < t,
        }
    }
}

/// The hold annotations give an object that started at `started`: `"true"` always, a Go
/// duration until `started` plus it (an object without a start time is held as if it
/// started now: it has not run yet), anything else none. With both spellings, the longer.
pub fn hold(
    annotations: Option<&BTreeMap<String, String>>,
    started: Option<Timestamp>,
    now: Timestamp,
) -> Option<Hold> {
    let annotations = annotations?;
    [ANNOTATION_DO_NOT_DISRUPT, KARPENTER_DO_NOT_DISRUPT]
        .iter()
        .filter_map(|k| annotations.get(*k))
        .filter_map(|v| {
            if v == "true" {
                return Some(Hold::Always);
            }
            let d = parse_go_duration(v).ok()?;
            let d = SignedDuration::try_from(d).ok()?;
            let since = started.unwrap_or(now);
            Some(since.checked_add(d).map_or(Hold::Always, Hold::Until))
        })
        .max_by_key(|h| match h {
            Hold::Always => Timestamp::MAX,
            Hold::Until(t) => *t,
        })
}

/// The hold annotations give an object at `now` if it still holds.
fn holding(
    annotations: Option<&BTreeMap<String, String>>,
    started: Option<&Time>,
    now: Timestamp,
) -> Option<Hold> {
    hold(annotations, started.map(|t| t.0), now).filter(|h| h.holds_at(now))
}

/// When the pod started: `status.startTime`, else its creation.
fn pod_started(p: &Pod) -> Option<&Time> {
    p.status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .or(p.metadata.creation_timestamp.as_ref())
}

/// Whether the pod holds its node at `now`: its mark still holds and it still keeps the
/// node busy (not a DaemonSet's or a mirror pod, not finished).
pub fn pod_holds_node(p: &Pod, now: Timestamp) -> bool {
    pod_hold(p, now).is_some()
}

/// The hold the pod puts on its node at `now`, if any ([`pod_holds_node`]).
pub fn pod_hold(p: &Pod, now: Timestamp) -> Option<Hold> {
    non_daemon_running(p)
        .then(|| holding(p.metadata.annotations.as_ref(), pod_started(p), now))
        .flatten()
}

/// The hold a Node's own mark puts on it at `now` (counted from its creation), if any.
pub fn node_hold(n: &k8s_openapi::api::core::v1::Node, now: Timestamp) -> Option<Hold> {
    holding(
        n.metadata.annotations.as_ref(),
        n.metadata.creation_timestamp.as_ref(),
        now,
    )
}

/// The claims voluntary disruption leaves alone at `now`, and when the first hold of a
/// duration ends (a plan looks again then).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Protected {
    /// The claims (by name) that are held: the claim is marked, or its Node (by
    /// `status.nodeName`) is, or a pod on that Node holds it.
    pub claims: BTreeSet<String>,
    /// The earliest time a hold that protects a claim now ends.
    pub until: Option<Timestamp>,
}

impl Protected {
    /// Whether the claim `name` is held.
    pub fn contains(&self, name: &str) -> bool {
        self.claims.contains(name)
    }
}

/// The claims voluntary disruption leaves alone at `now`: the claim is marked, or its Node
/// (by `status.nodeName`) is, or a pod on that Node holds it.
pub fn protected<'a>(
    claims: impl IntoIterator<Item = &'a NodeClaim>,
    nodes: &[Node],
    pods: &[Pod],
    now: Timestamp,
) -> Protected {
    let mut until: Option<Timestamp> = None;
    let mut note = |h: Hold| {
        if let Hold::Until(t) = h {
            until = Some(until.map_or(t, |u| u.min(t)));
        }
    };
    let mut marked_nodes: BTreeSet<&str> = BTreeSet::new();
    for n in nodes {
        let meta = &n.metadata;
        if let Some(h) = holding(
            meta.annotations.as_ref(),
            meta.creation_timestamp.as_ref(),
            now,
        ) {
            note(h);
            marked_nodes.extend(meta.name.as_deref());
        }
    }
    let mut held: HashMap<&str, usize> = HashMap::new();
    for p in pods.iter().filter(|p| non_daemon_running(p)) {
        let Some(h) = holding(p.metadata.annotations.as_ref(), pod_started(p), now) else {
            continue;
        };
        if let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
            note(h);
            *held.entry(node).or_default() += 1;
        }
    }
    let mut out = BTreeSet::new();
    for c in claims {
        let meta = &c.metadata;
        let own = holding(
            meta.annotations.as_ref(),
            meta.creation_timestamp.as_ref(),
            now,
        );
        if let Some(h) = own {
            note(h);
        }
        let node = c.status.as_ref().and_then(|s| s.node_name.as_deref());
        // A powered-off claim's node serves nothing and is kept as its user left it.
        let off = crate::claim::powered_off(c);
        if off
            || own.is_some()
            || node.is_some_and(|n| marked_nodes.contains(n) || held.contains_key(n))
        {
            out.extend(meta.name.clone());
        }
    }
    Protected { claims: out, until }
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

    const NOW: &str = "2026-11-28T12:00:00Z";

    fn at(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    fn pod(annotations: serde_json::Value, node: &str, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "annotations": annotations},
            "spec": {"nodeName": node, "containers": []},
            "status": {"phase": phase, "startTime": "2026-11-28T11:30:00Z"},
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
        assert!(pod_holds_node(&p, at(NOW)));
    }

    fn claim(name: &str, node: &str, annotations: serde_json::Value) -> NodeClaim {
        serde_json::from_value(json!({
            "apiVersion": "autonodes.io/v1alpha1", "kind": "NodeClaim",
            "metadata": {"name": name, "annotations": annotations,
                         "creationTimestamp": "2026-11-28T11:00:00Z"},
            "spec": {"vClusterRef": {"name": "t"}},
            "status": {"nodeName": node},
        }))
        .expect("claim")
    }

    #[test]
    fn either_spelling_marks_with_true_or_a_go_duration_and_nothing_else_does() {
        let a = |k: &str, v: &str| BTreeMap::from([(k.to_string(), v.to_string())]);
        let started = Some(at("2026-11-28T11:30:00Z"));
        let h = |k: &str, v: &str| hold(Some(&a(k, v)), started, at(NOW));
        assert_eq!(h(KARPENTER_DO_NOT_DISRUPT, "true"), Some(Hold::Always));
        assert_eq!(h(ANNOTATION_DO_NOT_DISRUPT, "true"), Some(Hold::Always));
        assert_eq!(
            h(ANNOTATION_DO_NOT_DISRUPT, "1h"),
            Some(Hold::Until(at("2026-11-28T12:30:00Z")))
        );
        assert_eq!(
            h(KARPENTER_DO_NOT_DISRUPT, "1h30m"),
            Some(Hold::Until(at("2026-11-28T13:00:00Z")))
        );
        for bad in ["false", "yes", "", "-1h", "1d", "1e400h"] {
            assert_eq!(h(ANNOTATION_DO_NOT_DISRUPT, bad), None, "{bad:?}");
        }
        assert_eq!(h("example.com/do-not-disrupt", "true"), None);
        assert_eq!(hold(None, started, at(NOW)), None);
        // Both spellings: the longer hold.
        let both = BTreeMap::from([
            (ANNOTATION_DO_NOT_DISRUPT.to_string(), "10m".to_string()),
            (KARPENTER_DO_NOT_DISRUPT.to_string(), "2h".to_string()),
        ]);
        assert_eq!(
            hold(Some(&both), started, at(NOW)),
            Some(Hold::Until(at("2026-11-28T13:30:00Z")))
        );
    }

    #[test]
    fn a_pod_marked_for_a_duration_holds_its_node_until_that_long_after_it_started() {
        let p = pod(json!({KARPENTER_DO_NOT_DISRUPT: "45m"}), "n1", "Running");
        assert!(pod_holds_node(&p, at("2026-11-28T12:14:59Z")));
        assert!(!pod_holds_node(&p, at("2026-11-28T12:15:00Z")));
        let got = protected(std::iter::empty(), &[], std::slice::from_ref(&p), at(NOW));
        assert_eq!(got.until, Some(at("2026-11-28T12:15:00Z")));
    }

    #[test]
    fn a_claim_is_protected_by_its_own_mark_its_node_s_or_a_running_pod_s() {
        let claims = [
            claim("by-claim", "n1", json!({ANNOTATION_DO_NOT_DISRUPT: "true"})),
            claim(
                "claim-hold-over",
                "n6",
                json!({ANNOTATION_DO_NOT_DISRUPT: "30m"}),
            ),
            claim(
                "claim-for-2h",
                "n7",
                json!({ANNOTATION_DO_NOT_DISRUPT: "2h"}),
            ),
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
        let got = protected(claims.iter(), &nodes, &pods, at(NOW));
        assert_eq!(
            got.claims.iter().map(String::as_str).collect::<Vec<_>>(),
            ["by-claim", "by-node", "by-pod", "claim-for-2h"]
        );
        // The claim made at 11:00 with 2h: looked at again at 13:00.
        assert_eq!(got.until, Some(at("2026-11-28T13:00:00Z")));
    }
}

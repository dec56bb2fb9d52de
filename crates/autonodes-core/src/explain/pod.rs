//! `autonodes explain pod`: which of the tenant's pools could make a node for a pending
//! pod and why each has not, and whom the pod must share its node with (required pod
//! affinity on the hostname): the node of the running pods it follows, or the pending
//! pods it goes with and the node types of each pool that hold them all.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

use super::{key_of, Explanation, Finding};
use crate::catalogue::Catalogue;
use crate::pool::daemonsets::daemon_pods;
use crate::pool::dynamic::{candidates, Tenant};
use crate::pool::pack::groups::{sharing, Sharing};
use crate::pool::pack::{
    accepts, is_unschedulable, non_daemon_running, selects_node, Amount, Candidate, PendingPod,
};
use crate::requirements::tolerates_taints;
use crate::scheduling::ClaimRequest;
use autonodes_api::conditions;
use autonodes_api::{NodePool, Overhead};

/// What [`pod`] reads besides the pod.
#[derive(Clone, Copy, Debug)]
pub struct PodInput<'a> {
    /// The tenant's NodePools.
    pub pools: &'a [NodePool],
    /// The node types.
    pub catalogue: &'a Catalogue,
    /// Live claims per node type.
    pub claimed: &'a BTreeMap<String, i64>,
    /// The node types' `spec.overhead`, by name.
    pub overheads: &'a BTreeMap<String, Overhead>,
    /// The tenant's DaemonSets.
    pub daemonsets: &'a [DaemonSet],
    /// The tenant's pods (whom the pod must share a node with); empty when they could not
    /// be read.
    pub tenant_pods: &'a [Pod],
    /// Now.
    pub now: Timestamp,
}

/// The most pods of a group named in one line.
const SHOWN: usize = 5;

/// `a, b, c and 2 more`.
fn names(keys: impl Iterator<Item = String>) -> String {
    let keys: Vec<String> = keys.collect();
    let shown = keys
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    match keys.len().saturating_sub(SHOWN) {
        0 => shown,
        more => format!("{shown} and {more} more"),
    }
}

/// Whom the pod must share its node with, from the tenant's pending and running pods.
fn sharing_of(pod: &Pod, pending: PendingPod, tenant_pods: &[Pod]) -> Sharing {
    let own = pending.key.clone();
    let mut pods = vec![pending];
    pods.extend(
        tenant_pods
            .iter()
            .filter(|p| is_unschedulable(p) && p.metadata.uid != pod.metadata.uid)
            .map(PendingPod::from_pod)
            .filter(|p| p.key != own),
    );
    let running: Vec<(String, PendingPod)> = tenant_pods
        .iter()
        .filter(|p| non_daemon_running(p))
        .filter_map(|p| {
            let node = p.spec.as_ref()?.node_name.clone()?;
            Some((node, PendingPod::from_pod(p)))
        })
        .collect();
    sharing(0, &pods, &running)
}

/// The summary line of how the pod must share a node.
fn sharing_line(s: &Sharing, own: &str) -> Option<String> {
    match s {
        Sharing::Alone => None,
        Sharing::Follows { nodes } if nodes.is_empty() => Some(
            "its required pod affinity on the hostname selects running pods that share no node: no node meets every term".to_string(),
        ),
        Sharing::Follows { nodes } => Some(format!(
            "must share a node with the running pods its required pod affinity on the hostname selects: it can go only to node {}",
            names(nodes.iter().cloned())
        )),
        Sharing::Group { pods, request } => Some(format!(
            "must share one node with {} (required pod affinity on the hostname): together they ask for {}, so the first of them goes only where all of them have room",
            names(pods.iter().map(|p| p.key.clone()).filter(|k| k != own)),
            amount_text(request)
        )),
    }
}

/// For a group that must share a node: which of a pool's candidate types hold it (one
/// line), and whether one does.
fn group_fit(candidates: &[Candidate], pods: &[PendingPod], request: &Amount) -> (bool, String) {
    let takes_all = |c: &&Candidate| pods.iter().all(|p| accepts(&c.shape, p));
    let mut holding: Vec<&Candidate> = candidates
        .iter()
        .filter(takes_all)
        .filter(|c| c.allocatable.covers(request) && c.room.is_none_or(|r| r > 0))
        .collect();
    holding.sort_by_key(|c| c.cost);
    if let Some(c) = holding.first() {
        let alone = candidates
            .iter()
            .filter(|c| accepts(&c.shape, &pods[0]) && c.allocatable.covers(&pods[0].request))
            .min_by_key(|c| c.cost);
        let larger = match alone {
            Some(a) if a.node_type != c.node_type => format!(
                " (larger than {}, which would take the first pod alone but leaves {})",
                a.node_type,
                amount_text(&a.allocatable)
            ),
            _ => String::new(),
        };
        return (
            true,
            format!(
                "the group needs a node that holds all its pods: the cheapest type that does is {}, leaving {}{larger}",
                c.node_type,
                amount_text(&c.allocatable)
            ),
        );
    }
    let largest = candidates
        .iter()
        .filter(takes_all)
        .max_by_key(|c| (c.allocatable.cpu, c.allocatable.memory));
    let why = match largest {
        Some(c) => format!(
            "the largest type that takes them all, {}, leaves {}",
            c.node_type,
            amount_text(&c.allocatable)
        ),
        None => "no type takes every pod of it".to_string(),
    };
    (
        false,
        format!("no node type of the pool holds the group ({why}): none of its pods gets a node"),
    )
}

/// Which of the tenant's `pools` could make a node for `pod`, and why each has not: a
/// static pool makes none; a dynamic pool's node types are checked as its packing checks
/// them (the pool's requirements, the pod's node selector, required node affinity and
/// tolerations against the node's labels and taints, its requests against what the type
/// leaves after `kubeReserved` and the tenant's `daemonsets`, `maxCapacity`); for a pool
/// with such a type, its conditions say what holds it (limits, registration back-off, pod
/// rules it cannot meet). A pod bound to others by required pod affinity on the hostname
/// is told with them: the node of the running pods it follows, or the pending pods it must
/// share a node with, and which type of each pool holds them all.
pub fn pod(pod: &Pod, input: &PodInput) -> Explanation {
    let PodInput {
        pools,
        catalogue,
        claimed,
        overheads,
        daemonsets,
        tenant_pods,
        now,
    } = *input;
    let pending = PendingPod::from_pod(pod);
    let shared = sharing_of(pod, pending.clone(), tenant_pods);
    let status = pod.status.clone().unwrap_or_default();
    let mut summary = vec![format!(
        "phase {}{}",
        status.phase.as_deref().unwrap_or("Pending"),
        pod.spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .map(|n| format!(", on node {n}"))
            .unwrap_or_default()
    )];
    for c in status
        .conditions
        .iter()
        .flatten()
        .filter(|c| c.type_ == "PodScheduled")
    {
        summary.push(format!(
            "PodScheduled={} ({}): {}",
            c.status,
            c.reason.as_deref().unwrap_or_default(),
            c.message.as_deref().unwrap_or_default()
        ));
    }
    summary.extend(sharing_line(&shared, &pending.key));
    summary.push(if is_unschedulable(pod) {
        "the kube-scheduler found no node for it: dynamic pools plan for it".to_string()
    } else {
        "not waiting for a node (dynamic pools plan only for pods the kube-scheduler marked unschedulable)".to_string()
    });
    let mut ordered: Vec<&NodePool> = pools.iter().collect();
    ordered.sort_by_key(|p| {
        (
            std::cmp::Reverse(p.spec.weight.unwrap_or(0)),
            p.metadata.name.clone(),
        )
    });
    let tenant = Tenant {
        pods: &[],
        nodes: &[],
        others: &[],
        claimed,
        overheads,
        daemonsets,
        pools: &[],
    };
    let daemons = daemon_pods(daemonsets);
    let mut findings = Vec::new();
    for p in ordered {
        let subject = format!(
            "pool {} (weight {})",
            key_of(&p.metadata),
            p.spec.weight.unwrap_or(0)
        );
        if p.spec.replicas.is_some() {
            findings.push(Finding::new(
                subject,
                "static",
                vec![
                    "a static pool keeps its replicas; it makes no node for pending pods"
                        .to_string(),
                ],
            ));
            continue;
        }
        let template = crate::pool::template_spec(&p.spec);
        let Ok(request) = ClaimRequest::new(&template, None) else {
            findings.push(Finding::new(
                subject,
                "cannot serve it",
                vec!["its requirements cannot be read".to_string()],
            ));
            continue;
        };
        let mut reasons = Vec::new();
        let mut serves = false;
        let cands = candidates(&template, &request, &tenant, &daemons, catalogue);
        for c in &cands {
            let zone = c
                .requirements
                .iter()
                .map(|r| format!(" in {}", r.values.join(",")))
                .collect::<String>();
            let name = format!("{}{zone}", c.node_type);
            if !selects_node(&c.shape.labels, &pending) {
                reasons.push(format!(
                    "{name}: the pod's nodeSelector or required node affinity does not match the node's labels"
                ));
            } else if let Some(t) = c.shape.taints.iter().find(|t| {
                (t.effect == "NoSchedule" || t.effect == "NoExecute")
                    && !tolerates_taints(&pending.tolerations, std::slice::from_ref(*t))
            }) {
                reasons.push(format!(
                    "{name}: the pod does not tolerate the taint {}={}:{}",
                    t.key,
                    t.value.as_deref().unwrap_or_default(),
                    t.effect
                ));
            } else if !c.allocatable.covers(&pending.request) {
                reasons.push(format!(
                    "{name}: too small: the pod asks for {}, a node leaves {} after kubeReserved and DaemonSets",
                    amount_text(&pending.request),
                    amount_text(&c.allocatable)
                ));
            } else if c.room.is_some_and(|r| r <= 0) {
                reasons.push(format!("{name}: at maxCapacity"));
            } else {
                serves = true;
                reasons.push(format!("{name}: takes it"));
            }
        }
        if reasons.is_empty() {
            reasons.push("none of the pool's node types fits its requirements".to_string());
        }
        if let (true, Sharing::Group { pods, request }) = (serves, &shared) {
            let (holds, line) = group_fit(&cands, pods, request);
            serves = holds;
            reasons.push(line);
        }
        if serves {
            let cs = p
                .status
                .as_ref()
                .map(|s| s.conditions.as_slice())
                .unwrap_or_default();
            for c in cs.iter().filter(|c| match c.type_.as_str() {
                "Ready" => c.status != conditions::TRUE,
                "LimitReached" => c.status == conditions::TRUE,
                "NodeRegistrationHealthy" => c.status != conditions::TRUE,
                _ => false,
            }) {
                reasons.push(format!(
                    "the pool says {}={} ({}): {}",
                    c.type_, c.status, c.reason, c.message
                ));
            }
            if let Some(t) = p
                .status
                .as_ref()
                .and_then(|s| s.registration.as_ref())
                .and_then(|r| r.backoff_until.as_ref())
                .filter(|t| t.0 > now)
            {
                reasons.push(format!(
                    "backing off after failed nodes: creates no node until {}",
                    t.0
                ));
            }
        }
        let verdict = if serves {
            "could serve it"
        } else {
            "cannot serve it"
        };
        findings.push(Finding::new(subject, verdict, reasons));
    }
    if findings.is_empty() {
        findings.push(Finding::new(
            "pools",
            "none",
            vec!["the tenant has no NodePool".to_string()],
        ));
    }
    Explanation {
        kind: "Pod",
        name: key_of(&pod.metadata),
        summary,
        findings,
    }
}

/// `cpu 1500m, memory 2Gi, …` of an amount (pods left out).
fn amount_text(a: &Amount) -> String {
    let mut parts = vec![
        format!("cpu {}", crate::resources::format_cpu(a.cpu)),
        format!("memory {}", crate::resources::format_memory(a.memory)),
    ];
    for (name, milli) in &a.extended {
        parts.push(format!("{name} {}", crate::resources::format_cpu(*milli)));
    }
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::reconcile::tests::catalogue_of;
    use serde_json::json;

    fn at(s: &str) -> Timestamp {
        s.parse().expect("time")
    }

    static NONE_CLAIMED: BTreeMap<String, i64> = BTreeMap::new();
    static NO_OVERHEADS: BTreeMap<String, Overhead> = BTreeMap::new();

    /// What a pod is explained with: `pools`, `catalogue` and `tenant_pods`, nothing
    /// claimed, no overheads or DaemonSets.
    fn input<'a>(
        pools: &'a [NodePool],
        catalogue: &'a Catalogue,
        tenant_pods: &'a [Pod],
    ) -> PodInput<'a> {
        PodInput {
            pools,
            catalogue,
            claimed: &NONE_CLAIMED,
            overheads: &NO_OVERHEADS,
            daemonsets: &[],
            tenant_pods,
            now: at("2026-11-25T10:05:00Z"),
        }
    }

    #[test]
    fn a_pending_pod_names_the_pools_that_could_serve_it_and_what_holds_them() {
        let catalogue = catalogue_of(json!([
            {"name": "small", "resources": {"cpu": "2", "memory": "4Gi"}, "cost": 1},
            {"name": "big", "resources": {"cpu": "8", "memory": "16Gi"}, "cost": 4},
        ]));
        let pool = |name: &str, extra: serde_json::Value| -> NodePool {
            let mut p = json!({
                "metadata": {"name": name, "namespace": "t"},
                "spec": {"vClusterRef": {"name": "t"}, "limits": {"cpu": "100"}},
            });
            for part in ["spec", "status"] {
                if let Some(fields) = extra.get(part).and_then(|v| v.as_object()) {
                    for (k, v) in fields {
                        p[part][k] = v.clone();
                    }
                }
            }
            serde_json::from_value(p).expect("pool")
        };
        let pools = vec![
            pool(
                "tainted",
                json!({"spec": {"weight": 50,
                "taints": [{"key": "team", "value": "a", "effect": "NoSchedule"}]}}),
            ),
            pool(
                "open",
                json!({"status": {"conditions": [{"type": "LimitReached", "status": "True",
                "reason": "LimitReached", "message": "cpu 100 of 100 used", "lastTransitionTime": "2026-11-25T10:00:00Z"}]}}),
            ),
            pool("fixed", json!({"spec": {"replicas": 2, "limits": null}})),
        ];
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "pause",
                "resources": {"requests": {"cpu": "4"}}}]},
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                "reason": "Unschedulable", "message": "0/0 nodes are available"}]},
        }))
        .expect("pod");
        let e = super::pod(&pod, &input(&pools, &catalogue, &[]));
        let text = e.text();
        assert!(text.contains("pool t/tainted (weight 50): cannot serve it\n    - p.small: the pod does not tolerate the taint team=a:NoSchedule"), "{text}");
        assert!(text.contains("pool t/open (weight 0): could serve it\n    - p.small: too small: the pod asks for cpu 4"), "{text}");
        assert!(text.contains("    - p.big: takes it\n    - the pool says LimitReached=True (LimitReached): cpu 100 of 100 used"), "{text}");
        assert!(text.contains("pool t/fixed (weight 0): static"), "{text}");
        assert!(
            text.contains("the kube-scheduler found no node for it"),
            "{text}"
        );
    }

    /// A pod asking for 1.5 CPU, labelled `app=<app>`, with required pod affinity on the
    /// hostname to `app=<partner>` if given; pending, or running on `node`.
    fn affine(name: &str, app: &str, partner: Option<&str>, node: Option<&str>) -> Pod {
        let mut spec = json!({"containers": [{"name": "c", "image": "pause",
            "resources": {"requests": {"cpu": "1500m"}}}]});
        if let Some(partner) = partner {
            spec["affinity"] = json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": partner}}}]}});
        }
        let status = match node {
            Some(n) => {
                spec["nodeName"] = json!(n);
                json!({"phase": "Running"})
            }
            None => json!({"phase": "Pending", "conditions": [{"type": "PodScheduled",
                "status": "False", "reason": "Unschedulable", "message": "0/1 nodes are available"}]}),
        };
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "uid": name, "labels": {"app": app}},
            "spec": spec, "status": status,
        }))
        .expect("pod")
    }

    fn explain_with(pod: &Pod, tenant_pods: &[Pod], cpus: &[(&str, &str)]) -> String {
        let catalogue = catalogue_of(serde_json::Value::Array(
            cpus.iter()
                .enumerate()
                .map(|(i, (name, cpu))| {
                    json!({"name": name, "cost": 10 * (i + 1),
                    "resources": {"cpu": cpu, "memory": "8Gi"}})
                })
                .collect(),
        ));
        let pools: Vec<NodePool> = vec![serde_json::from_value(json!({
            "metadata": {"name": "pair", "namespace": "t"},
            "spec": {"vClusterRef": {"name": "t"}},
        }))
        .expect("pool")];
        super::pod(pod, &input(&pools, &catalogue, tenant_pods)).text()
    }

    #[test]
    fn a_pending_pod_that_must_share_a_node_is_told_with_its_group_and_the_type_that_holds_it() {
        let cache = affine("cache", "cache", None, None);
        let web = affine("web", "web", Some("cache"), None);
        let tenant = [cache.clone(), web.clone()];
        let text = explain_with(&web, &tenant, &[("two", "2"), ("four", "4")]);
        assert!(
            text.contains("must share one node with default/cache (required pod affinity on the hostname): together they ask for cpu 3"),
            "{text}"
        );
        assert!(
            text.contains("the cheapest type that does is p.four, leaving cpu 4, memory 8Gi (larger than p.two, which would take the first pod alone but leaves cpu 2, memory 8Gi)"),
            "{text}"
        );
        assert!(
            text.contains("pool t/pair (weight 0): could serve it"),
            "{text}"
        );
        // The cache is told the same from its side.
        let text = explain_with(&cache, &tenant, &[("two", "2"), ("four", "4")]);
        assert!(
            text.contains("must share one node with default/web"),
            "{text}"
        );
        // With no type that holds both, the pool cannot serve either of them.
        let text = explain_with(&web, &tenant, &[("two", "2")]);
        assert!(
            text.contains("pool t/pair (weight 0): cannot serve it"),
            "{text}"
        );
        assert!(
            text.contains("no node type of the pool holds the group (the largest type that takes them all, p.two, leaves cpu 2, memory 8Gi): none of its pods gets a node"),
            "{text}"
        );
    }

    #[test]
    fn a_pending_pod_whose_partner_runs_already_is_told_the_node_it_can_go_to() {
        let cache = affine("cache", "cache", None, Some("tenant-pair-a"));
        let web = affine("web", "web", Some("cache"), None);
        let text = explain_with(&web, &[cache, web.clone()], &[("two", "2"), ("four", "4")]);
        assert!(
            text.contains("must share a node with the running pods its required pod affinity on the hostname selects: it can go only to node tenant-pair-a"),
            "{text}"
        );
        // A pod bound to nobody says nothing of it.
        let alone = affine("solo", "solo", None, None);
        let text = explain_with(&alone, std::slice::from_ref(&alone), &[("two", "2")]);
        assert!(!text.contains("must share"), "{text}");
    }
}

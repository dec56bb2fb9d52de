//! `autonodes explain nodepool` and `explain node`: what each disruption reason may
//! disrupt now under a pool's budgets, its repair policy, and for each of its claims (or
//! the one claim of a tenant Node) what holds, consolidates, rolls or repairs it.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::pool::budget::allowed_disruptions;
use crate::pool::do_not_disrupt::{hold, node_hold, pod_hold, Hold};
use crate::pool::plan::{is_draining, is_live};
use crate::pool::repair::{self, Policy};
use crate::pool::{ANNOTATION_EMPTY_SINCE, ANNOTATION_UNDERUTILIZED_SINCE};
use crate::requirements::label_selector_matches;
use autonodes_api::conditions;
use autonodes_api::reasons::ClaimCondition;
use autonodes_api::{
    DisruptionReason, NodeClaim, NodeClaimPhase, NodePool, Repair as RepairSpec,
    ANNOTATION_KEEP_UNTIL, ANNOTATION_RESTART,
};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::{condition_lines, key_of, Explanation, Finding};

/// How a pool's disruptions, repair and registration stand at `now`, and for each of its
/// `claims` whether it is being (or may be) consolidated, rolled, expired or repaired — and
/// what holds it: its own do-not-disrupt mark, the budgets, a restart under way.
/// `provider_repair` is the `spec.repair` of the pool's provider, `repair_after` the
/// controller's `--node-repair-after`.
pub fn nodepool(
    pool: &NodePool,
    claims: &[NodeClaim],
    provider_repair: Option<&RepairSpec>,
    repair_after: Option<Duration>,
    now: Timestamp,
) -> Explanation {
    let spec = &pool.spec;
    let status = pool.status.clone().unwrap_or_default();
    let mut summary = vec![match (spec.replicas, &spec.limits) {
        (Some(r), _) => format!("static pool of {r} replicas"),
        (None, Some(_)) => "dynamic pool (limits)".to_string(),
        (None, None) => "dynamic pool".to_string(),
    }];
    summary.extend(condition_lines(&status.conditions));
    if let Some(r) = &status.registration {
        let until = r
            .backoff_until
            .as_ref()
            .filter(|t| t.0 > now)
            .map(|t| format!("; creates no claim until {}", t.0))
            .unwrap_or_default();
        summary.push(format!(
            "registration: {} failure(s) in a row{}{until}",
            r.consecutive_failures,
            r.last_failure_reason
                .as_deref()
                .map(|x| format!(", the last {x}"))
                .unwrap_or_default()
        ));
    }
    let live: Vec<&NodeClaim> = claims.iter().filter(|c| is_live(c)).collect();
    let draining = claims.iter().filter(|c| is_draining(c)).count();
    let mut findings = Vec::new();

    // Budgets: what each reason may disrupt now.
    let reasons: [(Option<DisruptionReason>, &str); 5] = [
        (Some(DisruptionReason::Empty), "Empty"),
        (Some(DisruptionReason::Underutilized), "Underutilized"),
        (Some(DisruptionReason::Drifted), "Drifted"),
        (Some(DisruptionReason::HostMaintenance), "HostMaintenance"),
        (None, "expiry and scale-down"),
    ];
    let budget_reasons: Vec<String> = reasons
        .iter()
        .map(|(r, name)| {
            let allowed = allowed_disruptions(spec, live.len(), now, *r);
            if allowed >= live.len().max(1) * 1000 {
                return format!("{name}: no active budget limits it");
            }
            format!(
                "{name}: {} of {} node(s) may be disrupted now ({allowed} allowed, {draining} draining)",
                allowed.saturating_sub(draining),
                live.len()
            )
        })
        .collect();
    findings.push(Finding::new("disruption budgets", "", budget_reasons));

    // Repair: the policy, and where the pool stands against maxUnhealthy.
    let policy = repair::policy(spec.repair.as_ref(), provider_repair, repair_after);
    findings.push(Finding::new(
        "repair policy",
        if policy.disabled() { "off" } else { "on" },
        policy_lines(&policy),
    ));

    let assessed = repair::assess(claims, &policy, now);
    for c in claims {
        findings.push(claim_finding(c, &policy, &assessed, now));
    }
    Explanation {
        kind: "NodePool",
        name: key_of(&pool.metadata),
        summary,
        findings,
    }
}

/// A PodDisruptionBudget as `explain` reads it (from `policy/v1` or `v1beta1`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DisruptionBudget {
    /// `namespace/name`.
    pub key: String,
    /// Its namespace (it covers pods there only).
    pub namespace: String,
    /// `spec.selector` (absent: it selects nothing).
    pub selector: Option<LabelSelector>,
    /// `status.disruptionsAllowed`.
    pub disruptions_allowed: i32,
}

/// What is on a tenant Node, as `explain` reads it from the tenant.
#[derive(Clone, Copy, Debug, Default)]
pub struct OnNode<'a> {
    /// The Node, if it could be read.
    pub node: Option<&'a Node>,
    /// The pods bound to it.
    pub pods: &'a [Pod],
    /// The tenant's PodDisruptionBudgets.
    pub budgets: &'a [DisruptionBudget],
}

/// What holds the node in the tenant: its own do-not-disrupt mark, pods marked so (as
/// [`crate::pool::do_not_disrupt`] counts them), and PodDisruptionBudgets that allow no
/// eviction of a pod on it now (the drain's evictions wait for them).
fn on_node_finding(on: &OnNode, now: Timestamp) -> Finding {
    let mut reasons = Vec::new();
    let hold_text = |h: Hold| match h {
        Hold::Always => "for good".to_string(),
        Hold::Until(t) => format!("until {t}"),
    };
    if let Some(h) = on.node.and_then(|n| node_hold(n, now)) {
        reasons.push(format!("do-not-disrupt on the Node {}", hold_text(h)));
    }
    for p in on.pods {
        let key = key_of(&p.metadata);
        if let Some(h) = pod_hold(p, now) {
            reasons.push(format!(
                "do-not-disrupt pod {key} {}: consolidation and roll-outs leave the node alone",
                hold_text(h)
            ));
        }
        let labels = p.metadata.labels.clone().unwrap_or_default();
        let ns = p.metadata.namespace.as_deref().unwrap_or_default();
        for b in on.budgets.iter().filter(|b| {
            b.namespace == ns
                && b.disruptions_allowed <= 0
                && b.selector
                    .as_ref()
                    .is_some_and(|s| label_selector_matches(s, &labels))
        }) {
            reasons.push(format!(
                "PodDisruptionBudget {} allows no eviction of pod {key} now: a drain waits for it (up to terminationGracePeriod)",
                b.key
            ));
        }
    }
    let verdict = if reasons.is_empty() {
        "nothing holds it"
    } else {
        "held"
    };
    if reasons.is_empty() {
        reasons.push(format!(
            "{} pod(s) on it; none marked do-not-disrupt, no PodDisruptionBudget at 0",
            on.pods.len()
        ));
    }
    Finding::new("in the tenant", verdict, reasons)
}

/// Why the tenant Node `node` of `claim` is or is not being consolidated, rolled or
/// repaired: its pool's budgets and repair policy and what the pool makes of its claim
/// ([`nodepool`]; `pool` is the claim's pool and the pool's claims), or for a claim of no
/// pool, that nothing disrupts it; and what holds it in the tenant (`on`).
#[allow(clippy::too_many_arguments)]
pub fn node(
    node: &str,
    claim: &NodeClaim,
    pool: Option<(&NodePool, &[NodeClaim])>,
    on: &OnNode,
    provider_repair: Option<&RepairSpec>,
    repair_after: Option<Duration>,
    now: Timestamp,
) -> Explanation {
    let claim_name = claim.metadata.name.clone().unwrap_or_default();
    let mut summary = vec![format!("the node of NodeClaim {}", key_of(&claim.metadata))];
    let mut findings = match pool {
        Some((p, claims)) => {
            let e = nodepool(p, claims, provider_repair, repair_after, now);
            summary.push(format!("of NodePool {}", e.name));
            let mine = format!("claim {claim_name} ");
            let own = format!("claim {claim_name}");
            e.findings
                .into_iter()
                .filter(|f| {
                    !f.subject.starts_with("claim ")
                        || f.subject.starts_with(&mine)
                        || f.subject == own
                })
                .collect()
        }
        None => vec![Finding::new(
            format!("claim {claim_name}"),
            "in no pool",
            vec!["only deleting the claim removes the node; no pool consolidates, rolls or repairs it".to_string()],
        )],
    };
    findings.push(on_node_finding(on, now));
    Explanation {
        kind: "Node",
        name: node.to_string(),
        summary,
        findings,
    }
}

fn policy_lines(p: &Policy) -> Vec<String> {
    let mut out: Vec<String> = p
        .conditions
        .iter()
        .map(|c| {
            format!(
                "unhealthy: {}={} for {}",
                c.type_,
                c.status,
                c.toleration
                    .map_or("never".to_string(), |d| format!("{}s", d.as_secs()))
            )
        })
        .collect();
    out.push(match p.restart_timeout {
        Some(d) => format!(
            "restart first; replace if still unhealthy {}s after",
            d.as_secs()
        ),
        None => "replace without a restart".to_string(),
    });
    out.push(format!("maxUnhealthy {}", p.max_text()));
    if let Some(k) = p.keep_failed_for {
        out.push(format!("a replaced VM is kept halted for {}s", k.as_secs()));
    }
    out
}

/// What the pool does, or may do, with one claim, and why.
fn claim_finding(
    c: &NodeClaim,
    policy: &Policy,
    assessed: &repair::Repair,
    now: Timestamp,
) -> Finding {
    let name = c.metadata.name.clone().unwrap_or_default();
    let status = c.status.clone().unwrap_or_default();
    let node = status
        .node_name
        .as_deref()
        .map(|n| format!(" (node {n})"))
        .unwrap_or_default();
    let subject = format!("claim {name}{node}");
    let annotations = c.metadata.annotations.as_ref();
    let mut reasons = Vec::new();
    if c.metadata.deletion_timestamp.is_some() {
        let kept = repair::keep_until(c, now).filter(|t| *t > now);
        let verdict = match kept {
            Some(t) => {
                reasons.push(format!("its VM is kept halted for debugging until {t}"));
                "kept for debugging"
            }
            None => "being deleted",
        };
        return Finding::new(subject, verdict, reasons);
    }
    if status.phase == Some(NodeClaimPhase::Failed) {
        reasons.push(status.reason.clone().unwrap_or_default());
        return Finding::new(subject, "failed (the pool replaces it)", reasons);
    }
    let mut verdict = match status.phase {
        Some(NodeClaimPhase::Available) => "available",
        _ => "coming up",
    };
    if crate::claim::powered_off(c) {
        verdict = "powered off";
        reasons.push(format!(
            "powered off (spec.power: Off, the VM is {}): its Node is kept cordoned; nothing consolidates, rolls or repairs it, a scale-down removes it first",
            status
                .power
                .map_or("not stopped yet".to_string(), |p| format!("{p:?}"))
        ));
    }
    let started = c.metadata.creation_timestamp.as_ref().map(|t| t.0);
    match hold(annotations, started, now) {
        Some(Hold::Always) => reasons.push(
            "do-not-disrupt on the claim: consolidation and roll-outs leave it alone".to_string(),
        ),
        Some(Hold::Until(t)) if t > now => reasons.push(format!(
            "do-not-disrupt on the claim until {t}: consolidation and roll-outs leave it alone until then"
        )),
        _ => {}
    }
    for (key, what) in [
        (ANNOTATION_EMPTY_SINCE, "empty"),
        (ANNOTATION_UNDERUTILIZED_SINCE, "underutilized"),
    ] {
        if let Some(since) = annotations.and_then(|a| a.get(key)) {
            reasons.push(format!(
                "{what} since {since}: consolidated after consolidateAfter, within the budgets"
            ));
        }
    }
    if let Some(d) =
        conditions::get(&status.conditions, "Drifted").filter(|d| d.status == conditions::TRUE)
    {
        reasons.push(format!(
            "drifted ({}): {}; rolled within the Drifted budgets",
            d.reason, d.message
        ));
    }
    if let Some(h) = conditions::get(&status.conditions, ClaimCondition::HostMaintenance) {
        let host = status
            .host_node
            .as_deref()
            .map(|n| format!(" (its VM runs on host node {n})"))
            .unwrap_or_default();
        let what = if crate::host_maintenance::needs_replacement(
            h.status == conditions::TRUE,
            &h.reason,
        ) {
            verdict = "leaving a drained host";
            "replaced within the HostMaintenance budgets, a new node first"
        } else if h.status == conditions::TRUE {
            verdict = "migrating";
            "its tenant Node stays as it is"
        } else {
            "its VM was live-migrated; the tenant Node was not drained"
        };
        reasons.push(format!(
            "host maintenance ({}, since {}): {}; {what}{host}",
            h.reason, h.last_transition_time.0, h.message
        ));
    }
    if let Some(u) = repair::unhealthy(c, policy) {
        verdict = "unhealthy";
        let due = u
            .due_at
            .map_or("never due".to_string(), |t| format!("due at {t}"));
        reasons.push(format!(
            "unhealthy since {}: {}; {due}",
            u.since,
            u.what.join(", ")
        ));
        if assessed.blocked {
            reasons.push(format!(
                "repair is blocked: {} of {} nodes are unhealthy, more than maxUnhealthy ({})",
                assessed.unhealthy, assessed.live, assessed.max_text
            ));
        } else if assessed.restart.iter().any(|(n, _)| *n == name) {
            reasons.push("due: its VM is restarted now".to_string());
        } else if assessed.due.contains(&name) {
            reasons.push("due: replaced now, a new node first".to_string());
        }
    }
    if annotations.is_some_and(|a| a.contains_key(ANNOTATION_RESTART)) {
        let last = status
            .last_restart
            .as_ref()
            .map_or("not carried out yet".to_string(), |r| {
                format!("last restarted at {}", r.time.0)
            });
        reasons.push(format!("a VM restart was asked for; {last}"));
    }
    if annotations.is_some_and(|a| a.contains_key(ANNOTATION_KEEP_UNTIL)) {
        reasons.push("marked to keep its VM for debugging once deleted".to_string());
    }
    if reasons.is_empty() {
        reasons.push("nothing disrupts or repairs it now".to_string());
    }
    Finding::new(subject, verdict, reasons)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn at(s: &str) -> Timestamp {
        s.parse().expect("time")
    }

    /// Merges `extra` into `base` (objects key by key, anything else replaced).
    fn merge(base: &mut serde_json::Value, extra: serde_json::Value) {
        match (base, extra) {
            (serde_json::Value::Object(b), serde_json::Value::Object(e)) => {
                for (k, v) in e {
                    merge(b.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (b, e) => *b = e,
        }
    }

    #[test]
    fn a_pool_tells_its_budgets_its_repair_policy_and_what_holds_or_repairs_each_claim() {
        let pool: NodePool = serde_json::from_value(json!({
            "metadata": {"name": "workers", "namespace": "t"},
            "spec": {"vClusterRef": {"name": "t"}, "replicas": 3,
                     "disruption": {"budgets": [{"nodes": "0", "reasons": ["Drifted"]}]}},
        }))
        .expect("pool");
        let claim = |name: &str, extra: serde_json::Value| -> NodeClaim {
            let mut c = json!({
                "metadata": {"name": name, "namespace": "t", "creationTimestamp": "2026-11-25T09:00:00Z"},
                "spec": {"vClusterRef": {"name": "t"}},
                "status": {"phase": "Available", "nodeName": name, "conditions": [
                    {"type": "Initialized", "status": "True", "reason": "Initialized", "message": "",
                     "lastTransitionTime": "2026-11-25T09:00:00Z"},
                    {"type": "Ready", "status": "True", "reason": "NodeReady", "message": "",
                     "lastTransitionTime": "2026-11-25T09:00:00Z"}]},
            });
            merge(&mut c, extra);
            serde_json::from_value(c).expect("claim")
        };
        let claims = vec![
            claim(
                "held",
                json!({"metadata": {"annotations": {"karpenter.sh/do-not-disrupt": "true"}}}),
            ),
            claim(
                "sick",
                json!({"status": {"nodeConditions": [
                {"type": "Ready", "status": "False", "since": "2026-11-25T10:00:00Z"}]}}),
            ),
            claim("fine", json!({})),
            claim(
                "leaving",
                json!({"status": {"hostNode": "host-0", "conditions": [
                    {"type": "Initialized", "status": "True", "reason": "Initialized", "message": "",
                     "lastTransitionTime": "2026-11-25T09:00:00Z"},
                    {"type": "Ready", "status": "True", "reason": "NodeReady", "message": "",
                     "lastTransitionTime": "2026-11-25T09:00:00Z"},
                    {"type": "HostMaintenance", "status": "True", "reason": "HostDraining",
                     "message": "host node host-0 is being drained and the VM cannot live-migrate (eviction strategy None)",
                     "lastTransitionTime": "2026-11-25T10:01:00Z"}]}}),
            ),
            claim(
                "moved",
                json!({"status": {"hostNode": "host-1", "conditions": [
                    {"type": "Initialized", "status": "True", "reason": "Initialized", "message": "",
                     "lastTransitionTime": "2026-11-25T09:00:00Z"},
                    {"type": "Ready", "status": "True", "reason": "NodeReady", "message": "",
                     "lastTransitionTime": "2026-11-25T09:00:00Z"},
                    {"type": "HostMaintenance", "status": "False", "reason": "Migrated",
                     "message": "the VM was live-migrated from host node host-0 to host-1",
                     "lastTransitionTime": "2026-11-25T10:02:00Z"}]}}),
            ),
            claim(
                "parked",
                json!({"spec": {"power": "Off"}, "status": {"phase": "PoweredOff", "power": "Off"}}),
            ),
        ];
        let e = nodepool(
            &pool,
            &claims,
            None,
            Some(Duration::from_secs(600)),
            at("2026-11-25T10:05:00Z"),
        );
        let text = e.text();
        assert!(
            text.contains("Drifted: 0 of 6 node(s) may be disrupted now"),
            "{text}"
        );
        assert!(
            text.contains("claim leaving (node leaving): leaving a drained host\n    - host maintenance (HostDraining, since 2026-11-25T10:01:00Z): host node host-0 is being drained"),
            "{text}"
        );
        assert!(
            text.contains("replaced within the HostMaintenance budgets, a new node first (its VM runs on host node host-0)"),
            "{text}"
        );
        assert!(
            text.contains("claim parked (node parked): powered off\n    - powered off (spec.power: Off, the VM is Off): its Node is kept cordoned"),
            "{text}"
        );
        assert!(
            text.contains("claim moved (node moved): available\n    - host maintenance (Migrated, since 2026-11-25T10:02:00Z): the VM was live-migrated from host node host-0 to host-1"),
            "{text}"
        );
        assert!(text.contains("Empty: no active budget limits it"), "{text}");
        assert!(
            text.contains("claim held (node held): available\n    - do-not-disrupt on the claim"),
            "{text}"
        );
        assert!(text.contains("claim sick (node sick): unhealthy\n    - unhealthy since 2026-11-25T10:00:00Z: Ready=False; due at 2026-11-25T10:10:00Z"), "{text}");
        assert!(
            text.contains(
                "claim fine (node fine): available\n    - nothing disrupts or repairs it now"
            ),
            "{text}"
        );
        let held_pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "db", "namespace": "default", "labels": {"app": "db"},
                         "annotations": {"karpenter.sh/do-not-disrupt": "1h"}},
            "spec": {"nodeName": "sick", "containers": []},
            "status": {"phase": "Running", "startTime": "2026-11-25T10:00:00Z"},
        }))
        .expect("pod");
        let budgets = [DisruptionBudget {
            key: "default/db".into(),
            namespace: "default".into(),
            selector: Some(
                serde_json::from_value(json!({"matchLabels": {"app": "db"}})).expect("selector"),
            ),
            disruptions_allowed: 0,
        }];
        let on = OnNode {
            node: None,
            pods: std::slice::from_ref(&held_pod),
            budgets: &budgets,
        };
        let n = node(
            "sick",
            &claims[1],
            Some((&pool, &claims)),
            &on,
            None,
            Some(Duration::from_secs(600)),
            at("2026-11-25T10:05:00Z"),
        );
        let text = n.text();
        assert!(text.contains("in the tenant: held\n    - do-not-disrupt pod default/db until 2026-11-25T11:00:00Z"), "{text}");
        assert!(
            text.contains(
                "PodDisruptionBudget default/db allows no eviction of pod default/db now"
            ),
            "{text}"
        );
        let subjects: Vec<&str> = n.findings.iter().map(|f| f.subject.as_str()).collect();
        assert_eq!(
            subjects,
            [
                "disruption budgets",
                "repair policy",
                "claim sick (node sick)",
                "in the tenant"
            ]
        );
        let json = serde_json::to_value(&e).expect("json");
        assert_eq!(json["kind"], "NodePool");
        assert_eq!(json["findings"][1]["subject"], "repair policy");
    }
}

//! `autonodes explain`: why a claim is where it is, why a pool's nodes are or are not
//! being disrupted or repaired, and which pool could make a node for a pending pod — told
//! from the functions the controller decides with ([`crate::scheduling`] for node types,
//! [`crate::pool::budget`], [`crate::pool::repair`], [`crate::pool::do_not_disrupt`], the
//! dynamic pools' candidate types and [`crate::pool::pack`]'s pod checks), never a second
//! copy of their rules. Pure: the caller reads the objects and prints [`Explanation::text`] or its JSON.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use crate::access::{provider_admits, TenantNamespace};
use crate::api::conditions;
use crate::api::{
    DisruptionReason, NodeClaim, NodeClaimPhase, NodePool, NodeTypeHost, NodeTypeWarm,
    Repair as RepairSpec, ANNOTATION_KEEP_UNTIL, ANNOTATION_RESTART,
};
use crate::catalogue::Catalogue;
use crate::pool::budget::allowed_disruptions;
use crate::pool::do_not_disrupt::{hold, node_hold, pod_hold, Hold};
use crate::pool::plan::{is_draining, is_live};
use crate::pool::repair::{self, Policy};
use crate::pool::{ANNOTATION_EMPTY_SINCE, ANNOTATION_UNDERUTILIZED_SINCE};
use crate::quota::{PreparedQuota, Usage};
use crate::requirements::label_selector_matches;
use crate::scheduling::{fits, mismatches, ClaimRequest};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// What `autonodes explain` prints about one object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Explanation {
    /// `NodeClaim`, `NodePool` or `Node`.
    pub kind: &'static str,
    /// `namespace/name` (a Node: its name).
    pub name: String,
    /// One line each: the object's state as its status says it.
    pub summary: Vec<String>,
    /// One entry per thing looked at (a node type, a claim of the pool, a budget).
    pub findings: Vec<Finding>,
}

/// One thing `explain` looked at, and what it found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// What was looked at (`node type small.tiny`, `claim workers-abcde`).
    pub subject: String,
    /// The outcome in a word or two (`chosen`, `does not fit`, `held`, `unhealthy`).
    pub verdict: String,
    /// Why, one reason a line.
    pub reasons: Vec<String>,
}

/// `text` with every control character (line breaks, escape sequences, C1 controls) and
/// every bidirectional override written as a Rust escape (`\u{1b}`), so that it prints as
/// one inert line.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    let inert = |c: char| {
        c.is_control()
            || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{2028}' | '\u{2029}')
    };
    if !text.chars().any(inert) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if inert(c) {
            out.push_str(&c.escape_unicode().to_string());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

impl Finding {
    fn new(subject: impl Into<String>, verdict: impl Into<String>, reasons: Vec<String>) -> Self {
        Finding {
            subject: subject.into(),
            verdict: verdict.into(),
            reasons,
        }
    }
}

impl Explanation {
    /// The explanation as text, for people. Every part is shown on its own line with its
    /// control characters escaped ([`printable`]): much of it quotes what a tenant wrote
    /// (condition messages, names), which must neither drive the reader's terminal nor
    /// forge a line.
    pub fn text(&self) -> String {
        let mut out = format!("{} {}\n", self.kind, printable(&self.name));
        for line in &self.summary {
            out.push_str(&format!("  {}\n", printable(line)));
        }
        for f in &self.findings {
            let subject = printable(&f.subject);
            match f.verdict.as_str() {
                "" => out.push_str(&format!("{subject}:\n")),
                v => out.push_str(&format!("{subject}: {}\n", printable(v))),
            }
            for r in &f.reasons {
                out.push_str(&format!("    - {}\n", printable(r)));
            }
        }
        out
    }
}

/// `Type=Status (Reason): message` of each condition.
fn condition_lines(cs: &[Condition]) -> Vec<String> {
    cs.iter()
        .map(|c| {
            let message = if c.message.is_empty() {
                String::new()
            } else {
                format!(": {}", c.message)
            };
            format!("{}={} ({}){message}", c.type_, c.status, c.reason)
        })
        .collect()
}

/// `namespace/name` of an object.
pub(crate) fn key_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
}

/// What scheduling admits a type by, for the claim's namespace: the providers'
/// `tenantNamespaceSelector` and the NodeQuotas covering the namespace.
#[derive(Clone, Debug)]
pub struct Admission<'a> {
    /// The claim's namespace and its labels.
    pub namespace: TenantNamespace<'a>,
    /// The NodeQuotas covering it.
    pub quotas: &'a [PreparedQuota],
    /// What the namespace's claims hold.
    pub used: Usage,
    /// Each node type's room on its host as the controller last reported it
    /// (`status.host` of the NodeType, by name).
    pub hosts: BTreeMap<String, NodeTypeHost>,
    /// Each node type's warm VMs as the controller last reported them (`status.warm` of
    /// the NodeType, by name).
    pub warm: BTreeMap<String, NodeTypeWarm>,
    /// The warm VMs of the claim's pool as the controller last reported them (`status.warm`
    /// of the NodePool), if it keeps any.
    pub pool_warm: Option<crate::api::NodePoolWarm>,
}

/// The warm-VM line of a type the claim fits: whether a warm VM served it, or why none did
/// or would ([`crate::warm::servable`] decides, as when the claim is scheduled): of its
/// pool's own warm VMs when the pool keeps them on this type (`pool_warm`), else of the
/// type's. `None` when neither keeps warm VMs and the claim took none.
fn warm_line(
    t: &crate::catalogue::PreparedType,
    pool: Option<&crate::api::NodePoolSpec>,
    claim: &NodeClaim,
    warm: Option<&NodeTypeWarm>,
    pool_warm: Option<&crate::api::NodePoolWarm>,
    chosen: bool,
) -> Option<String> {
    let status = claim.status.as_ref();
    if let (true, Some(b)) = (chosen, status.and_then(|s| s.warm.as_ref())) {
        return Some(format!(
            "served by warm VM {} (taken at {}; binding {})",
            status.and_then(|s| s.vm_name.as_deref()).unwrap_or("?"),
            b.bound_at.0,
            match (b.written, b.released) {
                (_, true) => "read and deleted",
                (true, false) => "written",
                (false, false) => "not written yet",
            }
        ));
    }
    let launched = chosen && status.and_then(|s| s.vm_name.as_ref()).is_some();
    let pool_keeps = pool.zip(pool_warm).filter(|(p, w)| {
        crate::warm::pool::replicas(p) > 0 && w.node_type.as_deref() == Some(t.name.as_str())
    });
    if let Some((p, w)) = pool_keeps {
        let kept = format!(
            "its pool keeps {} warm VM(s) of this type, {} ready now",
            w.replicas, w.ready
        );
        return Some(
            match crate::warm::servable(&crate::warm::pool::pool_type(t, p), None, claim) {
                Err(why) => format!("{kept}; none can serve this claim: {why}"),
                Ok(()) if launched => format!(
                    "{kept}; none was ready when this claim was scheduled, so it was served cold"
                ),
                Ok(()) => format!("{kept}; a ready one would serve this claim"),
            },
        );
    }
    if t.warm_replicas <= 0 {
        return None;
    }
    let kept = match warm {
        Some(w) => format!(
            "the type keeps {} warm VM(s), {} ready now",
            t.warm_replicas, w.ready
        ),
        None => format!("the type keeps {} warm VM(s)", t.warm_replicas),
    };
    Some(match crate::warm::servable(t, pool, claim) {
        Err(why) => format!("{kept}; none can serve this claim: {why}"),
        Ok(()) if launched => {
            format!("{kept}; none was ready when this claim was scheduled (or the type kept none then), so it was served cold")
        }
        Ok(()) => format!("{kept}; a ready one would serve this claim"),
    })
}

/// The host-room line of a type, and whether the host has no room left for it (in the zone
/// the claim asks for, when it asks for one and the type lists zones).
fn host_room(host: Option<&NodeTypeHost>, zones: &[String]) -> (String, bool) {
    let Some(h) = host else {
        return ("the host's room is not reported".to_string(), false);
    };
    let why = h
        .message
        .as_deref()
        .map(|m| format!(" ({m})"))
        .unwrap_or_default();
    let asked: Vec<(&String, &i64)> = h.zones.iter().filter(|(z, _)| zones.contains(z)).collect();
    if !asked.is_empty() {
        let text: Vec<String> = asked.iter().map(|(z, n)| format!("{n} in {z}")).collect();
        let full = asked.iter().all(|(_, n)| **n <= 0);
        return (
            format!("host room for {} more VM(s){why}", text.join(", ")),
            full,
        );
    }
    match h.headroom {
        Some(n) => (format!("host room for {n} more VM(s){why}"), n <= 0),
        None => (format!("the host's room is not known{why}"), false),
    }
}

/// Why the claim got (or would get) each node type of `catalogue`: not considered (another
/// provider, another pinned type), does not fit (each requirement, resource or extended
/// resource that fails, as scheduling checks them), full at `maxCapacity` (`claimed` counts
/// each type's claims), not allowed (the provider does not serve the namespace), over a
/// quota, no room on its host (in the claim's zone) as the NodeType last reported it, or
/// fits — the cheapest fitting type left is the one scheduling picks (the claim's
/// `Scheduled` condition says what the controller decided). `pool` is the claim's pool's
/// spec, whose requirements it also meets.
pub fn nodeclaim(
    claim: &NodeClaim,
    pool: Option<&crate::api::NodePoolSpec>,
    catalogue: &Catalogue,
    claimed: &BTreeMap<String, i64>,
    admission: &Admission,
) -> Explanation {
    let status = claim.status.clone().unwrap_or_default();
    let mut summary = vec![format!(
        "phase {}{}",
        status
            .phase
            .map_or("Pending".to_string(), |p| format!("{p:?}")),
        status
            .reason
            .as_deref()
            .map(|r| format!(", reason {r}"))
            .unwrap_or_default()
    )];
    if let Some(t) = &status.type_ref {
        summary.push(format!("scheduled to node type {t}"));
    }
    summary.extend(condition_lines(&status.conditions));
    let mut findings = Vec::new();
    let req = match ClaimRequest::new(&claim.spec, pool) {
        Ok(r) => r,
        Err(e) => {
            findings.push(Finding::new(
                "requirements",
                "cannot be read",
                vec![e.to_string()],
            ));
            return Explanation {
                kind: "NodeClaim",
                name: key_of(&claim.metadata),
                summary,
                findings,
            };
        }
    };
    let mut cheapest_seen = false;
    for t in catalogue.types() {
        let subject = format!("node type {} (cost {})", t.name, t.cost);
        if !req.considers(t) {
            let why = match (&claim.spec.type_ref, &claim.spec.provider_ref) {
                (Some(pinned), _) => format!("the claim asks for node type {pinned}"),
                (None, Some(p)) => format!("the claim asks for provider {p}"),
                (None, None) => "its pool's provider or type differs".to_string(),
            };
            findings.push(Finding::new(subject, "not considered", vec![why]));
            continue;
        }
        if !fits(t, &req) {
            let reasons = mismatches(t, &req)
                .iter()
                .map(ToString::to_string)
                .collect();
            findings.push(Finding::new(subject, "does not fit", reasons));
            continue;
        }
        let zones: Vec<String> = claim
            .spec
            .requirements
            .iter()
            .chain(pool.map(|p| p.requirements.as_slice()).unwrap_or_default())
            .filter(|r| r.key == "topology.kubernetes.io/zone")
            .flat_map(|r| r.values.clone())
            .chain(status.zone.clone())
            .collect();
        let count = claimed.get(&t.name).copied().unwrap_or(0);
        if !t.has_capacity(count) {
            let reasons = vec![format!(
                "{count} of maxCapacity {} claimed",
                t.max_capacity.unwrap_or_default()
            )];
            findings.push(Finding::new(subject, "full", reasons));
            continue;
        }
        if let Err(refused) = provider_admits(t, &admission.namespace) {
            findings.push(Finding::new(subject, "not allowed", vec![refused.message]));
            continue;
        }
        if let Err(message) = crate::quota::admits(
            admission.quotas,
            admission.namespace.name,
            &admission.used,
            t,
        ) {
            findings.push(Finding::new(subject, "over quota", vec![message]));
            continue;
        }
        let (room, host_full) = host_room(admission.hosts.get(&t.name), &zones);
        if host_full {
            findings.push(Finding::new(subject, "no host room", vec![room]));
            continue;
        }
        let verdict = if status.type_ref.as_deref() == Some(t.name.as_str()) {
            "chosen"
        } else if !cheapest_seen {
            "fits (cheapest with room)"
        } else {
            "fits (a cheaper type comes first)"
        };
        cheapest_seen = true;
        let mut reasons = vec![
            "requirements and resources met; below maxCapacity; allowed and within quota"
                .to_string(),
            room,
        ];
        reasons.extend(warm_line(
            t,
            pool,
            claim,
            admission.warm.get(&t.name),
            admission.pool_warm.as_ref(),
            verdict == "chosen",
        ));
        if verdict.starts_with("fits (cheapest") {
            if let Some(s) = conditions::get(&status.conditions, "Scheduled")
                .filter(|c| c.status == conditions::FALSE)
            {
                reasons.push(format!("not chosen yet: {} ({})", s.reason, s.message));
            }
        }
        findings.push(Finding::new(subject, verdict, reasons));
    }
    Explanation {
        kind: "NodeClaim",
        name: key_of(&claim.metadata),
        summary,
        findings,
    }
}

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
    let reasons: [(Option<DisruptionReason>, &str); 4] = [
        (Some(DisruptionReason::Empty), "Empty"),
        (Some(DisruptionReason::Underutilized), "Underutilized"),
        (Some(DisruptionReason::Drifted), "Drifted"),
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

pub mod pod;

#[cfg(test)]
mod printable_tests {
    use super::*;

    #[test]
    fn what_a_tenant_wrote_prints_as_inert_text_on_its_own_line() {
        let e = Explanation {
            kind: "Pod",
            name: "default/web".into(),
            summary: vec![
                "PodScheduled=False (x): \u{1b}]0;owned\u{7}\u{1b}[2Jred\nNodeClaim forged".into(),
            ],
            findings: vec![Finding::new(
                "pool tenant/\u{202e}krow",
                "could\rserve it",
                vec!["ok".into(), "\u{9b}31m".into()],
            )],
        };
        let text = e.text();
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "{text:?}"
        );
        assert!(!text.contains('\u{202e}'), "{text:?}");
        assert_eq!(text.lines().count(), 5, "{text}");
        assert!(
            text.contains("\\u{1b}]0;owned\\u{7}\\u{1b}[2Jred\\u{a}NodeClaim forged"),
            "{text}"
        );
        assert_eq!(printable("plain: 0/3 nodes"), "plain: 0/3 nodes");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::reconcile::tests::catalogue_of;
    use serde_json::json;

    fn at(s: &str) -> Timestamp {
        s.parse().expect("time")
    }

    /// What admits types in namespace `t` (with `labels`): no quotas, nothing used, no
    /// host room or warm VMs reported.
    fn admission_in_t(labels: &BTreeMap<String, String>) -> Admission<'_> {
        Admission {
            namespace: TenantNamespace {
                name: "t",
                labels: Some(labels),
            },
            quotas: &[],
            used: Usage::default(),
            hosts: BTreeMap::new(),
            warm: BTreeMap::new(),
            pool_warm: None,
        }
    }

    #[test]
    fn a_pending_claim_names_each_node_type_and_why_it_was_not_chosen() {
        let catalogue = catalogue_of(json!([
            {"name": "small", "resources": {"cpu": "2", "memory": "4Gi"}, "cost": 1, "maxCapacity": 1},
            {"name": "big", "resources": {"cpu": "8", "memory": "16Gi"}, "cost": 4},
            {"name": "gpu", "resources": {"cpu": "8", "memory": "16Gi", "nvidia.com/gpu": "1"}, "cost": 9},
        ]));
        let claim: NodeClaim = serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "t"},
            "spec": {"vClusterRef": {"name": "t"}, "desiredCapacity": {"cpu": "2"}},
            "status": {"conditions": [{"type": "Scheduled", "status": "False", "reason": "QuotaExceeded",
                "message": "quota q allows 0 more", "lastTransitionTime": "2026-11-25T10:00:00Z"}]},
        }))
        .expect("claim");
        let claimed = BTreeMap::from([("p.small".to_string(), 1)]);
        let labels = BTreeMap::new();
        let admission = Admission {
            hosts: BTreeMap::from([(
                "p.big".to_string(),
                NodeTypeHost {
                    headroom: Some(3),
                    ..NodeTypeHost::default()
                },
            )]),
            ..admission_in_t(&labels)
        };
        let e = nodeclaim(&claim, None, &catalogue, &claimed, &admission);
        let verdicts: Vec<(&str, &str)> = e
            .findings
            .iter()
            .map(|f| (f.subject.as_str(), f.verdict.as_str()))
            .collect();
        assert_eq!(
            verdicts,
            [
                ("node type p.small (cost 1)", "full"),
                ("node type p.big (cost 4)", "fits (cheapest with room)"),
                ("node type p.gpu (cost 9)", "does not fit"),
            ]
        );
        assert!(e.findings[2].reasons[0].contains("nvidia.com/gpu"), "{e:?}");
        assert_eq!(
            e.findings[1].reasons[1], "host room for 3 more VM(s)",
            "{e:?}"
        );
        assert!(e.findings[1].reasons[2].contains("QuotaExceeded"), "{e:?}");
        assert!(e
            .text()
            .contains("node type p.small (cost 1): full\n    - 1 of maxCapacity 1 claimed"));
        // A quota of 4 CPUs for the namespace: the big type is over it.
        let spec: crate::api::NodeQuotaSpec =
            serde_json::from_value(json!({"limits": {"cpu": "4"}})).expect("quota");
        let quotas = [PreparedQuota::new("q", &spec)];
        let admission = Admission {
            quotas: &quotas,
            ..admission
        };
        let e = nodeclaim(&claim, None, &catalogue, &claimed, &admission);
        assert_eq!(e.findings[1].verdict, "over quota", "{e:?}");
        // Without a quota, a host with no room left for the big type.
        let admission = Admission {
            quotas: &[],
            hosts: BTreeMap::from([(
                "p.big".to_string(),
                NodeTypeHost {
                    headroom: Some(0),
                    message: Some("every eligible host node is full".into()),
                    ..NodeTypeHost::default()
                },
            )]),
            ..admission
        };
        let e = nodeclaim(&claim, None, &catalogue, &claimed, &admission);
        assert_eq!(e.findings[1].verdict, "no host room", "{e:?}");
        assert!(
            e.findings[1].reasons[0].contains("host room for 0 more"),
            "{e:?}"
        );
    }

    #[test]
    fn a_claim_says_whether_a_warm_vm_served_it_and_why_none_could() {
        let catalogue = catalogue_of(json!([
            {"name": "small", "resources": {"cpu": "2", "memory": "4Gi"}, "cost": 1, "warm": {"replicas": 2}},
        ]));
        let labels = BTreeMap::new();
        let admission = Admission {
            warm: BTreeMap::from([(
                "p.small".to_string(),
                NodeTypeWarm {
                    replicas: 2,
                    current: 2,
                    ready: 1,
                    ..NodeTypeWarm::default()
                },
            )]),
            ..admission_in_t(&labels)
        };
        let claim = |spec: serde_json::Value, status: serde_json::Value| -> NodeClaim {
            serde_json::from_value(json!({
                "metadata": {"name": "c", "namespace": "t"},
                "spec": spec,
                "status": status,
            }))
            .expect("claim")
        };
        let warm_reason = |c: &NodeClaim| {
            let e = nodeclaim(c, None, &catalogue, &BTreeMap::new(), &admission);
            e.findings[0]
                .reasons
                .iter()
                .find(|r| r.contains("warm"))
                .cloned()
                .unwrap_or_default()
        };
        let spec = json!({"vClusterRef": {"name": "t"}});
        let taken = claim(
            spec.clone(),
            json!({"typeRef": "p.small", "vmName": "warm-small-abcde",
                "warm": {"boundAt": "2026-11-25T10:00:00Z", "written": true}}),
        );
        assert_eq!(
            warm_reason(&taken),
            "served by warm VM warm-small-abcde (taken at 2026-11-25T10:00:00Z; binding written)"
        );
        let cold = claim(
            spec.clone(),
            json!({"typeRef": "p.small", "vmName": "t-c-12345"}),
        );
        assert_eq!(
            warm_reason(&cold),
            "the type keeps 2 warm VM(s), 1 ready now; none was ready when this claim was scheduled (or the type kept none then), so it was served cold"
        );
        let pending = claim(spec, json!({}));
        assert!(
            warm_reason(&pending).ends_with("a ready one would serve this claim"),
            "{}",
            warm_reason(&pending)
        );
        let own_image = claim(
            json!({"vClusterRef": {"name": "t"},
                "properties": {"kubevirt.vcluster.com/image-url": "docker://example/own:1"}}),
            json!({}),
        );
        let why = warm_reason(&own_image);
        assert!(
            why.contains("none can serve this claim") && why.contains("image-url"),
            "{why}"
        );
        let first_boot = claim(
            json!({"vClusterRef": {"name": "t"},
                "properties": {"autonodes.io/user-data": "#cloud-config\npackages: [htop]\n"}}),
            json!({}),
        );
        let why = warm_reason(&first_boot);
        assert!(
            why.contains("none can serve this claim") && why.contains("\"packages\""),
            "{why}"
        );
    }

    #[test]
    fn a_pools_claim_says_whether_its_pools_warm_vms_can_serve_it() {
        // The type keeps none; the pool keeps its own (its claims get its SSH key with their
        // binding).
        let catalogue = catalogue_of(json!([
            {"name": "small", "resources": {"cpu": "2", "memory": "4Gi"}, "cost": 1},
        ]));
        let pool: crate::api::NodePoolSpec = serde_json::from_value(json!({
            "vClusterRef": {"name": "t"},
            "properties": {"autonodes.io/ssh-keys": "ssh-ed25519 AAAA pool"},
            "warm": {"replicas": 2},
        }))
        .expect("pool");
        let labels = BTreeMap::new();
        let admission = Admission {
            pool_warm: Some(crate::api::NodePoolWarm {
                node_type: Some("p.small".into()),
                replicas: 2,
                current: 2,
                ready: 2,
            }),
            ..admission_in_t(&labels)
        };
        let warm_reason = |properties: serde_json::Value| {
            let c: NodeClaim = serde_json::from_value(json!({
                "metadata": {"name": "c", "namespace": "t"},
                "spec": {"vClusterRef": {"name": "t"}, "properties": properties},
            }))
            .expect("claim");
            nodeclaim(&c, Some(&pool), &catalogue, &BTreeMap::new(), &admission).findings[0]
                .reasons
                .iter()
                .find(|r| r.contains("warm"))
                .cloned()
                .unwrap_or_default()
        };
        // A claim of the pool carries its properties.
        assert_eq!(
            warm_reason(json!({"autonodes.io/ssh-keys": "ssh-ed25519 AAAA pool"})),
            "its pool keeps 2 warm VM(s) of this type, 2 ready now; a ready one would serve this claim"
        );
        // SSH keys of its own come with the binding too.
        assert_eq!(
            warm_reason(json!({"autonodes.io/ssh-keys": "ssh-ed25519 BBBB own"})),
            "its pool keeps 2 warm VM(s) of this type, 2 ready now; a ready one would serve this claim"
        );
        let why = warm_reason(json!({"autonodes.io/preference": "own"}));
        assert!(
            why.starts_with("its pool keeps 2 warm VM(s) of this type, 2 ready now; none can serve this claim: property autonodes.io/preference"),
            "{why}"
        );
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
            text.contains("Drifted: 0 of 3 node(s) may be disrupted now"),
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

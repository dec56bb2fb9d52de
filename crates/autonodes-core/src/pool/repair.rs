//! Node repair: a pool's claim whose Node was initialized and then shows one of the
//! repair policy's conditions (by default `Ready` `False` or `Unknown`) for that
//! condition's toleration is repaired. The first step restarts its VM (the
//! [`ANNOTATION_RESTART`] annotation, which the claim controller carries out); a node still
//! unhealthy [`Policy::restart_timeout`] after its restart, or unhealthy again later, is
//! replaced — a new claim first, the broken one removed once its replacement is Available
//! ([`super::plan::plan_claims`]), whatever the disruption budgets say. When more of a
//! pool's live claims are unhealthy at once than `maxUnhealthy` allows (20 % by default: a
//! network partition, a broken host, a bad image), no claim is repaired: the cause is not
//! the nodes, and replacing them all would only add load.
//!
//! The policy is the pool's `spec.repair`, field by field over its provider's, over the
//! defaults ([`policy`]).

use std::borrow::Borrow;
use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use autonodes_api::conditions;
use autonodes_api::reasons::{ClaimCondition, ClaimReason, PoolReason};
use autonodes_api::{
    NodeClaim, ObservedNodeCondition, Repair as RepairSpec, ANNOTATION_KEEP_UNTIL,
    ANNOTATION_RESTART,
};

use super::budget::{budget_nodes, BudgetNodes};
use super::plan::is_live;
use super::plan::Verdict;

/// `maxUnhealthy` when neither the pool nor its provider sets it (20%, as Karpenter).
pub const DEFAULT_MAX_UNHEALTHY: BudgetNodes = BudgetNodes::Percent(20);
/// `restartTimeout` when neither the pool nor its provider sets it.
pub const DEFAULT_RESTART_TIMEOUT: Duration = Duration::from_secs(300);
/// The longest `keepFailedFor`: a kept VM holds host disk, so it does not stay for long.
pub const MAX_KEEP_FAILED_FOR: Duration = Duration::from_secs(24 * 3600);
/// The most VMs one pool keeps halted for debugging at a time; a claim repaired beyond it is
/// removed at once.
pub const MAX_KEPT_PER_POOL: usize = 3;

/// A Node condition that makes a node unhealthy once it held for `toleration`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnhealthyCondition {
    /// The condition's type.
    pub type_: String,
    /// The unhealthy status (`True`, `False`, `Unknown`).
    pub status: String,
    /// How long it may hold (`None`: never repaired for it).
    pub toleration: Option<Duration>,
}

/// A pool's repair policy, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// The conditions that make a node unhealthy (none: repair is off).
    pub conditions: Vec<UnhealthyCondition>,
    /// How long a restarted node may take to become healthy (`None`: no restart, replace at
    /// once).
    pub restart_timeout: Option<Duration>,
    /// How many unhealthy nodes the pool may have for repair to go on.
    pub max_unhealthy: BudgetNodes,
    /// How long a replaced node's VM is kept halted (`None`: not kept).
    pub keep_failed_for: Option<Duration>,
}

/// The policy of a pool whose `spec.repair` is `pool` and whose provider's is `provider`:
/// each field from the pool, else the provider, else the default — for `conditions`,
/// `Ready` `False` or `Unknown` for `ready_after` (the controller's `--node-repair-after`;
/// `None`: no default conditions).
pub fn policy(
    pool: Option<&RepairSpec>,
    provider: Option<&RepairSpec>,
    ready_after: Option<Duration>,
) -> Policy {
    let pick = |f: fn(&RepairSpec) -> bool| pool.filter(|r| f(r)).or(provider.filter(|r| f(r)));
    let conditions = match pick(|r| !r.conditions.is_empty()) {
        Some(r) => r
            .conditions
            .iter()
            .map(|c| UnhealthyCondition {
                type_: c.type_.clone(),
                status: c.status.as_str().to_string(),
                toleration: c.toleration_duration.after(),
            })
            .collect(),
        None => ready_after
            .map(|after| {
                ["False", "Unknown"]
                    .map(|status| UnhealthyCondition {
                        type_: "Ready".into(),
                        status: status.into(),
                        toleration: Some(after),
                    })
                    .to_vec()
            })
            .unwrap_or_default(),
    };
    let restart_timeout = match pick(|r| r.restart_timeout.is_some()) {
        Some(r) => r.restart_timeout.and_then(|d| d.after()),
        None => Some(DEFAULT_RESTART_TIMEOUT),
    };
    let max_unhealthy = pick(|r| r.max_unhealthy.is_some())
        .and_then(|r| r.max_unhealthy.as_deref())
        .and_then(budget_nodes)
        .unwrap_or(DEFAULT_MAX_UNHEALTHY);
    let keep_failed_for = pick(|r| r.keep_failed_for.is_some())
        .and_then(|r| r.keep_failed_for)
        .and_then(|d| d.after())
        .filter(|d| !d.is_zero())
        .map(|d| d.min(MAX_KEEP_FAILED_FOR));
    Policy {
        conditions,
        restart_timeout,
        max_unhealthy,
        keep_failed_for,
    }
}

impl Policy {
    /// Whether repair is off: no conditions, or `maxUnhealthy: "0"`.
    pub fn disabled(&self) -> bool {
        self.conditions.is_empty() || self.max_unhealthy == BudgetNodes::Count(0)
    }

    /// Whether `unhealthy` of `live` nodes is more than the pool may have.
    fn over(&self, unhealthy: usize, live: usize) -> bool {
        let (unhealthy, live) = (unhealthy as u64, live as u64);
        match self.max_unhealthy {
            BudgetNodes::Count(n) => unhealthy > n,
            BudgetNodes::Percent(p) => unhealthy * 100 > u64::from(p) * live,
        }
    }

    /// `maxUnhealthy` as the user wrote it.
    pub fn max_text(&self) -> String {
        match self.max_unhealthy {
            BudgetNodes::Count(n) => n.to_string(),
            BudgetNodes::Percent(p) => format!("{p} %"),
        }
    }
}

/// The Node conditions the claim's controller last saw, while it could read the Node: a
/// claim not initialized yet, or whose tenant cannot be reached (its `Ready` reason says so),
/// has none here. A claim written before `nodeConditions` existed shows its `Ready`
/// condition as the Node's.
fn node_conditions(claim: &NodeClaim) -> Option<Vec<ObservedNodeCondition>> {
    let status = claim.status.as_ref()?;
    let cs = &status.conditions;
    if !conditions::is_true(cs, ClaimCondition::Initialized) {
        return None;
    }
    let ready = conditions::get(cs, ClaimCondition::Ready.as_str())?;
    let read = [ClaimReason::NodeReady, ClaimReason::NodeNotReady];
    if !read.iter().any(|r| ready.reason == r.as_str()) {
        return None;
    }
    if !status.node_conditions.is_empty() {
        return Some(status.node_conditions.clone());
    }
    (ready.status == conditions::FALSE).then(|| {
        vec![ObservedNodeCondition {
            type_: "Ready".into(),
            status: "False".into(),
            reason: String::new(),
            since: ready.last_transition_time.clone(),
        }]
    })
}

/// How a claim's node is unhealthy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unhealthy {
    /// Since when (the earliest of its matching conditions).
    pub since: Timestamp,
    /// When the first of them has held for its toleration (`None`: never).
    pub due_at: Option<Timestamp>,
    /// The matching conditions, as `Type=Status`.
    pub what: Vec<String>,
}

/// Whether the claim's node is unhealthy under `policy`, and since when.
pub fn unhealthy(claim: &NodeClaim, policy: &Policy) -> Option<Unhealthy> {
    // A powered-off node is not Ready on purpose.
    if crate::claim::powered_off(claim) {
        return None;
    }
    let seen = node_conditions(claim)?;
    let mut out: Option<Unhealthy> = None;
    for rule in &policy.conditions {
        let Some(c) = seen
            .iter()
            .find(|c| c.type_ == rule.type_ && c.status == rule.status)
        else {
            continue;
        };
        let since = c.since.0;
        let due_at = rule.toleration.and_then(|t| {
            since
                .checked_add(k8s_openapi::jiff::SignedDuration::try_from(t).ok()?)
                .ok()
        });
        let u = out.get_or_insert(Unhealthy {
            since,
            due_at: None,
            what: Vec::new(),
        });
        u.since = u.since.min(since);
        u.due_at = match (u.due_at, due_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        u.what.push(format!("{}={}", c.type_, c.status));
    }
    out
}

/// The restart the claim's controller carried out last, if any: when.
fn restarted_at(claim: &NodeClaim) -> Option<Timestamp> {
    Some(claim.status.as_ref()?.last_restart.as_ref()?.time.0)
}

/// Whether a restart was asked for that the claim's controller has not carried out yet.
fn restart_pending(claim: &NodeClaim) -> bool {
    let Some(asked) = claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_RESTART))
    else {
        return false;
    };
    let done = claim
        .status
        .as_ref()
        .and_then(|s| s.last_restart.as_ref())
        .map(|r| r.requested.as_str());
    done != Some(restart_value(asked).as_str())
}

/// What the claim's controller records of an [`ANNOTATION_RESTART`] value: its first 64
/// characters.
pub fn restart_value(annotation: &str) -> String {
    annotation.chars().take(64).collect()
}

/// What repair decided for a pool.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Repair {
    /// Claims to replace now.
    pub due: BTreeSet<String>,
    /// Claims whose VM to restart now, with the [`ANNOTATION_RESTART`] value to set.
    pub restart: Vec<(String, String)>,
    /// Live claims whose Node is unhealthy.
    pub unhealthy: usize,
    /// Live claims.
    pub live: usize,
    /// More unhealthy than `maxUnhealthy` allows: nothing is repaired.
    pub blocked: bool,
    /// Repair is off for the pool.
    pub disabled: bool,
    /// `maxUnhealthy` as text, for the condition.
    pub max_text: String,
    /// When to look again (the next toleration or restart timeout that ends).
    pub next_check: Option<Duration>,
}

impl Repair {
    /// The pool's `NodeRepair` condition: False (`RepairDisabled`, or
    /// `TooManyUnhealthyNodes` while blocked), else True (`RepairAllowed`).
    pub(crate) fn verdict(&self) -> Verdict {
        if self.disabled {
            Verdict::new(
                false,
                PoolReason::RepairDisabled,
                "repair is off: no unhealthy condition is configured, or maxUnhealthy is 0",
            )
        } else if self.blocked {
            Verdict::new(
                false,
                PoolReason::TooManyUnhealthyNodes,
                format!(
                    "{} of {} nodes are unhealthy, more than maxUnhealthy ({}): no node is repaired until fewer are",
                    self.unhealthy, self.live, self.max_text
                ),
            )
        } else {
            Verdict::new(
                true,
                PoolReason::RepairAllowed,
                format!(
                    "{} of {} nodes are unhealthy; a node unhealthy for its toleration is restarted, then replaced if that does not help",
                    self.unhealthy, self.live
                ),
            )
        }
    }
}

/// Until when a deleted claim's VM is kept: its [`ANNOTATION_KEEP_UNTIL`], at most
/// [`MAX_KEEP_FAILED_FOR`] after its deletion (a later time, or text that is no time, is
/// read as that bound or as not kept); a claim not deleted yet counts from `now`.
pub fn keep_until(claim: &NodeClaim, now: Timestamp) -> Option<Timestamp> {
    let asked: Timestamp = claim
        .metadata
        .annotations
        .as_ref()?
        .get(ANNOTATION_KEEP_UNTIL)?
        .parse()
        .ok()?;
    let bound = claim
        .metadata
        .deletion_timestamp
        .as_ref()
        .map_or(now, |t| t.0)
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(
            MAX_KEEP_FAILED_FOR.as_secs() as i64,
        ))
        .ok()?;
    Some(asked.min(bound))
}

/// Which of the claims `delete` deletes for repair keep their VM, until when: as many as
/// keep [`MAX_KEPT_PER_POOL`] VMs of the pool kept at once (those kept already count).
pub(crate) fn kept<C: Borrow<NodeClaim>>(
    claims: &[C],
    delete: &[(String, super::plan::DeleteReason)],
    keep: Duration,
    now: Timestamp,
) -> Vec<(String, Timestamp)> {
    let keeping = claims
        .iter()
        .map(Borrow::borrow)
        .filter(|c| c.metadata.deletion_timestamp.is_some())
        .filter(|c| keep_until(c, now).is_some_and(|t| t > now))
        .count();
    let Ok(keep) = k8s_openapi::jiff::SignedDuration::try_from(keep) else {
        return Vec::new();
    };
    let Ok(until) = now.checked_add(keep) else {
        return Vec::new();
    };
    delete
        .iter()
        .filter(|(_, r)| *r == super::plan::DeleteReason::Repaired)
        .take(MAX_KEPT_PER_POOL.saturating_sub(keeping))
        .map(|(name, _)| (name.clone(), until))
        .collect()
}

/// Milliseconds from `now` to `t` (zero when past).
fn until(now: Timestamp, t: Timestamp) -> Duration {
    Duration::from_millis(u64::try_from(t.as_millisecond() - now.as_millisecond()).unwrap_or(0))
}

/// Which of the pool's `claims` to restart or replace at `now` under `policy`.
pub(crate) fn assess<C: Borrow<NodeClaim>>(
    claims: &[C],
    policy: &Policy,
    now: Timestamp,
) -> Repair {
    let live: Vec<&NodeClaim> = claims
        .iter()
        .map(Borrow::borrow)
        .filter(|c| is_live(c))
        .collect();
    let unhealthy: Vec<(&NodeClaim, Unhealthy)> = live
        .iter()
        .filter_map(|c| unhealthy(c, policy).map(|u| (*c, u)))
        .collect();
    let mut out = Repair {
        unhealthy: unhealthy.len(),
        live: live.len(),
        disabled: policy.disabled(),
        blocked: policy.over(unhealthy.len(), live.len()),
        max_text: policy.max_text(),
        ..Repair::default()
    };
    if out.disabled || out.blocked {
        return out;
    }
    let mut look_at = |t: Timestamp| {
        let left = until(now, t) + Duration::from_millis(100);
        out.next_check = Some(out.next_check.map_or(left, |n| n.min(left)));
    };
    let mut due = BTreeSet::new();
    let mut restart = Vec::new();
    for (c, u) in unhealthy {
        let name = c.metadata.name.clone().unwrap_or_default();
        if restart_pending(c) {
            continue;
        }
        let restart_timeout = policy.restart_timeout;
        // Restarted once: replaced once the restart timeout is over and the node is still
        // unhealthy (since before the timeout ended), or unhealthy again for its toleration.
        if let (Some(r), Some(rt)) = (restarted_at(c), restart_timeout) {
            let over = r
                .checked_add(k8s_openapi::jiff::SignedDuration::try_from(rt).unwrap_or_default())
                .unwrap_or(r);
            if now < over {
                look_at(over);
                continue;
            }
            if u.since <= over || u.due_at.is_some_and(|d| d <= now) {
                due.insert(name);
            } else if let Some(d) = u.due_at {
                look_at(d);
            }
            continue;
        }
        match u.due_at {
            Some(d) if d <= now => match restart_timeout {
                // The value names the episode: a second write of it (from a stale copy of
                // the claim) asks for no second restart.
                Some(_) => restart.push((name, format!("repair {}", u.since))),
                None => {
                    due.insert(name);
                }
            },
            Some(d) => look_at(d),
            None => {}
        }
    }
    out.due = due;
    out.restart = restart;
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use autonodes_api::{ConditionStatus, DurationOrNever, RepairCondition};
    use serde_json::json;

    /// A claim initialized at 09:00 whose Node shows `node` (type, status, since).
    fn claim(name: &str, initialized: bool, node: &[(&str, &str, &str)]) -> NodeClaim {
        let mut conditions = vec![];
        if initialized {
            conditions.push(
                json!({"type": "Initialized", "status": "True", "reason": "Initialized",
                "message": "", "lastTransitionTime": "2026-11-25T09:00:00Z"}),
            );
        }
        let ready = node
            .iter()
            .find(|(t, _, _)| *t == "Ready")
            .map_or("True", |(_, s, _)| *s);
        let reason = if ready == "True" {
            "NodeReady"
        } else {
            "NodeNotReady"
        };
        conditions.push(
            json!({"type": "Ready", "status": if ready == "True" { "True" } else { "False" },
            "reason": reason, "message": "", "lastTransitionTime": "2026-11-25T09:00:00Z"}),
        );
        let seen: Vec<_> = node
            .iter()
            .map(|(t, s, since)| json!({"type": t, "status": s, "since": since}))
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"vClusterRef": {"name": "t"}},
            "status": {"phase": "Joining", "conditions": conditions, "nodeConditions": seen},
        }))
        .expect("claim")
    }

    fn healthy(name: &str) -> NodeClaim {
        claim(name, true, &[("Ready", "True", "2026-11-25T09:00:00Z")])
    }

    fn not_ready(name: &str, since: &str) -> NodeClaim {
        claim(name, true, &[("Ready", "False", since)])
    }

    fn restarted(mut c: NodeClaim, at: &str) -> NodeClaim {
        let asked = "repair 1".to_string();
        c.metadata.annotations = Some([(ANNOTATION_RESTART.to_string(), asked.clone())].into());
        c.status.as_mut().expect("status").last_restart = Some(autonodes_api::Restart {
            requested: asked,
            time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at.parse().expect("time")),
        });
        c
    }

    fn at(s: &str) -> Timestamp {
        s.parse().expect("time")
    }

    fn ready_policy(after: u64, restart: Option<u64>) -> Policy {
        let spec = RepairSpec {
            restart_timeout: Some(match restart {
                Some(s) => DurationOrNever::After(Duration::from_secs(s)),
                None => DurationOrNever::Never,
            }),
            ..RepairSpec::default()
        };
        policy(Some(&spec), None, Some(Duration::from_secs(after)))
    }

    fn names(r: &Repair) -> (Vec<&str>, Vec<&str>) {
        (
            r.due.iter().map(String::as_str).collect(),
            r.restart.iter().map(|(n, _)| n.as_str()).collect(),
        )
    }

    #[test]
    fn a_node_not_ready_for_the_repair_time_is_restarted_first_and_one_not_ready_since_less_is_looked_at_again_then(
    ) {
        let mut claims = vec![
            not_ready("broken", "2026-11-25T10:00:00Z"),
            not_ready("wobbly", "2026-11-25T10:08:00Z"),
        ];
        claims.extend(["a", "b", "c", "d", "e", "f", "g", "h"].map(healthy));
        let r = assess(
            &claims,
            &ready_policy(600, Some(300)),
            at("2026-11-25T10:10:00Z"),
        );
        assert_eq!(names(&r), (vec![], vec!["broken"]));
        assert_eq!((r.unhealthy, r.live, r.blocked), (2, 10, false));
        assert_eq!(r.next_check, Some(Duration::from_millis(480_100)));
        assert!(r.verdict().status);
        // Without a restart the node is replaced at once.
        let r = assess(
            &claims,
            &ready_policy(600, None),
            at("2026-11-25T10:10:00Z"),
        );
        assert_eq!(names(&r), (vec!["broken"], vec![]));
        // Repair off: --node-repair-after=0s and no conditions of the pool's own.
        let off = policy(None, None, None);
        let r = assess(&claims, &off, at("2026-11-25T11:00:00Z"));
        assert!(r.due.is_empty() && r.restart.is_empty());
        assert_eq!(r.verdict().reason, PoolReason::RepairDisabled);
    }

    #[test]
    fn a_restarted_node_still_unhealthy_after_the_restart_timeout_is_replaced_and_one_healthy_again_is_kept(
    ) {
        let p = ready_policy(600, Some(300));
        let mut others: Vec<NodeClaim> = ["a", "b", "c", "d", "e"].map(healthy).to_vec();
        // Restarted at 10:10; Unknown since the reboot (10:10:05), 10 min toleration.
        let rebooting = restarted(
            claim("x", true, &[("Ready", "Unknown", "2026-11-25T10:10:05Z")]),
            "2026-11-25T10:10:00Z",
        );
        others.push(rebooting.clone());
        let r = assess(&others, &p, at("2026-11-25T10:12:00Z"));
        assert_eq!(names(&r), (vec![], vec![]), "within the restart timeout");
        assert_eq!(r.next_check, Some(Duration::from_millis(180_100)));
        let r = assess(&others, &p, at("2026-11-25T10:15:01Z"));
        assert_eq!(names(&r), (vec!["x"], vec![]), "still unhealthy after it");
        // Healthy after the restart, unhealthy again later: replaced after the toleration,
        // not restarted a second time.
        others.pop();
        others.push(restarted(
            not_ready("x", "2026-11-25T12:00:00Z"),
            "2026-11-25T10:10:00Z",
        ));
        let r = assess(&others, &p, at("2026-11-25T12:05:00Z"));
        assert_eq!(names(&r), (vec![], vec![]));
        let r = assess(&others, &p, at("2026-11-25T12:10:00Z"));
        assert_eq!(names(&r), (vec!["x"], vec![]));
        // A restart asked for and not carried out yet: nothing more is done.
        let mut asked = not_ready("y", "2026-11-25T10:00:00Z");
        asked.metadata.annotations = Some([(ANNOTATION_RESTART.to_string(), "soon".into())].into());
        let r = assess(
            &[asked],
            &ready_policy(60, Some(300)),
            at("2026-11-25T11:00:00Z"),
        );
        assert_eq!(names(&r), (vec![], vec![]));
    }

    #[test]
    fn node_conditions_of_the_pools_policy_override_the_providers_and_each_has_its_toleration() {
        let provider = RepairSpec {
            conditions: vec![RepairCondition {
                type_: "Ready".into(),
                status: ConditionStatus::False,
                toleration_duration: DurationOrNever::After(Duration::from_secs(60)),
            }],
            max_unhealthy: Some("1".into()),
            keep_failed_for: Some(DurationOrNever::After(Duration::from_secs(7 * 24 * 3600))),
            ..RepairSpec::default()
        };
        let pool = RepairSpec {
            conditions: vec![RepairCondition {
                type_: "KernelDeadlock".into(),
                status: ConditionStatus::True,
                toleration_duration: DurationOrNever::After(Duration::from_secs(300)),
            }],
            restart_timeout: Some(DurationOrNever::Never),
            ..RepairSpec::default()
        };
        let p = policy(Some(&pool), Some(&provider), Some(Duration::from_secs(1)));
        assert_eq!(p.conditions.len(), 1);
        assert_eq!(p.max_unhealthy, BudgetNodes::Count(1), "from the provider");
        assert_eq!(p.keep_failed_for, Some(MAX_KEEP_FAILED_FOR), "capped");
        let claims = vec![
            claim(
                "deadlocked",
                true,
                &[
                    ("Ready", "True", "2026-11-25T09:00:00Z"),
                    ("KernelDeadlock", "True", "2026-11-25T10:00:00Z"),
                ],
            ),
            not_ready("not-ready", "2026-11-25T09:00:00Z"),
            healthy("fine"),
        ];
        let r = assess(&claims, &p, at("2026-11-25T10:04:00Z"));
        assert_eq!((names(&r), r.unhealthy), ((vec![], vec![]), 1));
        let r = assess(&claims, &p, at("2026-11-25T10:05:00Z"));
        assert_eq!(names(&r), (vec!["deadlocked"], vec![]));
        let u = unhealthy(&claims[0], &p).expect("unhealthy");
        assert_eq!(u.what, ["KernelDeadlock=True"]);
    }

    #[test]
    fn more_unhealthy_nodes_than_max_unhealthy_blocks_every_repair() {
        let mut claims: Vec<NodeClaim> = vec![
            not_ready("x", "2026-11-25T10:00:00Z"),
            not_ready("y", "2026-11-25T10:00:00Z"),
        ];
        claims.extend(["a", "b", "c"].map(healthy));
        let p = ready_policy(60, None);
        let r = assess(&claims, &p, at("2026-11-25T11:00:00Z"));
        assert!(r.blocked && r.due.is_empty(), "{r:?}");
        assert_eq!(r.verdict().reason, PoolReason::TooManyUnhealthyNodes);
        // One of five is a fifth, not more: repaired.
        claims.remove(1);
        claims.push(healthy("d"));
        let r = assess(&claims, &p, at("2026-11-25T11:00:00Z"));
        assert_eq!(r.due, BTreeSet::from(["x".to_string()]));
        // maxUnhealthy "0" turns repair off.
        let off = policy(
            Some(&RepairSpec {
                max_unhealthy: Some("0".into()),
                ..RepairSpec::default()
            }),
            None,
            Some(Duration::from_secs(60)),
        );
        let r = assess(&claims, &off, at("2026-11-25T11:00:00Z"));
        assert!(r.due.is_empty());
        assert_eq!(r.verdict().reason, PoolReason::RepairDisabled);
    }

    #[test]
    fn a_node_that_never_initialized_or_whose_tenant_cannot_be_read_is_not_repaired() {
        let new = claim("new", false, &[("Ready", "False", "2026-11-25T10:00:00Z")]);
        let mut unreachable = not_ready("far", "2026-11-25T10:00:00Z");
        let cs = &mut unreachable.status.as_mut().expect("status").conditions;
        cs.iter_mut()
            .filter(|c| c.type_ == "Ready")
            .for_each(|c| c.reason = "TenantUnreachable".into());
        let r = assess(
            &[new, unreachable],
            &ready_policy(1, None),
            at("2026-11-25T11:00:00Z"),
        );
        assert_eq!((r.unhealthy, r.due.len()), (0, 0));
    }

    #[test]
    fn a_claim_written_before_node_conditions_existed_is_read_by_its_ready_condition() {
        let mut old = not_ready("old", "2026-11-25T10:00:00Z");
        old.status.as_mut().expect("status").node_conditions.clear();
        let mut claims = vec![old];
        claims.extend(["a", "b", "c", "d"].map(healthy));
        let r = assess(&claims, &ready_policy(60, None), at("2026-11-25T10:01:00Z"));
        // Its claim condition changed at 09:00, so it is due.
        assert_eq!(names(&r), (vec!["old"], vec![]));
    }

    #[test]
    fn a_kept_vm_s_claim_no_longer_counts_as_draining_against_the_budgets() {
        let mut c = healthy("gone");
        c.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            at("2026-11-25T09:30:00Z"),
        ));
        c.status.as_mut().expect("status").node_name = Some("n".into());
        assert!(
            super::super::plan::is_draining(&c),
            "draining while it drains"
        );
        for cond in &mut c.status.as_mut().expect("status").conditions {
            if cond.type_ == "Ready" {
                cond.reason = "KeptForDebugging".into();
            }
        }
        assert!(
            !super::super::plan::is_draining(&c),
            "kept: drained already"
        );
    }

    #[test]
    fn repaired_claims_keep_their_vms_up_to_three_per_pool_and_at_most_a_day() {
        use super::super::plan::DeleteReason;
        let now = at("2026-11-25T10:00:00Z");
        let mut kept_already = healthy("kept");
        kept_already.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at("2026-11-25T09:30:00Z")),
        );
        kept_already.metadata.annotations = Some(
            [(
                ANNOTATION_KEEP_UNTIL.to_string(),
                "2026-11-25T10:30:00Z".into(),
            )]
            .into(),
        );
        let delete: Vec<(String, DeleteReason)> = ["r1", "r2", "r3"]
            .map(|n| (n.to_string(), DeleteReason::Repaired))
            .into_iter()
            .chain([("s".to_string(), DeleteReason::ScaleDown)])
            .collect();
        let k = kept(
            &[kept_already.clone()],
            &delete,
            Duration::from_secs(3600),
            now,
        );
        assert_eq!(
            k,
            [
                ("r1".to_string(), at("2026-11-25T11:00:00Z")),
                ("r2".to_string(), at("2026-11-25T11:00:00Z"))
            ]
        );
        // A keep-until beyond a day after the deletion is read as a day.
        kept_already.metadata.annotations = Some(
            [(
                ANNOTATION_KEEP_UNTIL.to_string(),
                "2030-01-01T00:00:00Z".into(),
            )]
            .into(),
        );
        assert_eq!(
            keep_until(&kept_already, now),
            Some(at("2026-11-26T09:30:00Z"))
        );
        kept_already.metadata.annotations =
            Some([(ANNOTATION_KEEP_UNTIL.to_string(), "soon".into())].into());
        assert_eq!(keep_until(&kept_already, now), None);
    }
}

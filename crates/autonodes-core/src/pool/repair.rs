//! Node repair: a pool's claim whose Node was initialized and has not been Ready since for
//! `--node-repair-after` is replaced — a new claim first, the broken one removed once its
//! replacement is Available ([`super::plan::plan_claims`]), whatever the disruption budgets
//! say. When more than [`UNHEALTHY_LIMIT_PERCENT`] % of a pool's live claims are unhealthy
//! at once (a network partition, a broken host, a bad image), no claim is repaired: the
//! cause is not the nodes, and replacing them all would only add load.

use std::borrow::Borrow;
use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::api::conditions;
use crate::api::reasons::{ClaimCondition, ClaimReason, PoolReason};
use crate::api::NodeClaim;

use super::plan::is_live;
use super::plan::Verdict;

/// Above this share of unhealthy live claims (in percent) a pool repairs none, as Karpenter.
pub(crate) const UNHEALTHY_LIMIT_PERCENT: usize = 20;

/// Since when the claim's Node has been unhealthy: it was initialized once
/// (`Initialized=True`) and is not Ready now (`Ready=False` with `NodeNotReady`, which the
/// claim controller writes when the Node is NotReady or Unknown). A tenant that cannot be
/// reached is no node's fault and counts as healthy here.
pub(crate) fn unhealthy_since(claim: &NodeClaim) -> Option<Timestamp> {
    let cs = &claim.status.as_ref()?.conditions;
    if !conditions::is_true(cs, ClaimCondition::Initialized) {
        return None;
    }
    let ready = conditions::get(cs, ClaimCondition::Ready.as_str())?;
    (ready.status == conditions::FALSE && ready.reason == ClaimReason::NodeNotReady.as_str())
        .then_some(ready.last_transition_time.0)
}

/// What repair decided for a pool.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Repair {
    /// Claims to replace now.
    pub due: BTreeSet<String>,
    /// Live claims whose Node is unhealthy.
    pub unhealthy: usize,
    /// Live claims.
    pub live: usize,
    /// More than [`UNHEALTHY_LIMIT_PERCENT`] % unhealthy: nothing is repaired.
    pub blocked: bool,
    /// When the next unhealthy claim falls due.
    pub next_check: Option<Duration>,
}

impl Repair {
    /// The pool's `NodeRepair` condition: False (`TooManyUnhealthyNodes`) while blocked,
    /// else True (`RepairAllowed`).
    pub fn verdict(&self) -> Verdict {
        if self.blocked {
            Verdict::new(
                false,
                PoolReason::TooManyUnhealthyNodes,
                format!(
                    "{} of {} nodes are not Ready, more than {UNHEALTHY_LIMIT_PERCENT} %: no node is repaired until fewer are",
                    self.unhealthy, self.live
                ),
            )
        } else {
            Verdict::new(
                true,
                PoolReason::RepairAllowed,
                format!(
                    "{} of {} nodes are not Ready; nodes not Ready for the repair time are replaced",
                    self.unhealthy, self.live
                ),
            )
        }
    }
}

/// Which of the pool's `claims` to repair at `now`, with nodes unhealthy for `after` due
/// (`None`: repair is off).
pub(crate) fn assess<C: Borrow<NodeClaim>>(
    claims: &[C],
    after: Option<Duration>,
    now: Timestamp,
) -> Repair {
    let live: Vec<&NodeClaim> = claims
        .iter()
        .map(Borrow::borrow)
        .filter(|c| is_live(c))
        .collect();
    let unhealthy: Vec<(&NodeClaim, Timestamp)> = live
        .iter()
        .filter_map(|c| unhealthy_since(c).map(|t| (*c, t)))
        .collect();
    let mut out = Repair {
        unhealthy: unhealthy.len(),
        live: live.len(),
        blocked: unhealthy.len() * 100 > UNHEALTHY_LIMIT_PERCENT * live.len(),
        ..Repair::default()
    };
    let Some(after) = after else {
        return out;
    };
    if out.blocked {
        return out;
    }
    let after_ms = i64::try_from(after.as_millis()).unwrap_or(i64::MAX);
    for (c, since) in unhealthy {
        let waited = now.as_millisecond() - since.as_millisecond();
        if waited >= after_ms {
            out.due.insert(c.metadata.name.clone().unwrap_or_default());
        } else {
            let left = Duration::from_millis((after_ms - waited).unsigned_abs());
            out.next_check = Some(out.next_check.map_or(left, |n| n.min(left)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(name: &str, initialized: bool, ready: Option<&str>) -> NodeClaim {
        let mut conditions = vec![];
        if initialized {
            conditions.push(
                json!({"type": "Initialized", "status": "True", "reason": "Initialized",
                                   "message": "", "lastTransitionTime": "2026-11-25T09:00:00Z"}),
            );
        }
        match ready {
            Some(since) => conditions.push(json!({"type": "Ready", "status": "False",
                "reason": "NodeNotReady", "message": "", "lastTransitionTime": since})),
            None => conditions.push(
                json!({"type": "Ready", "status": "True", "reason": "NodeReady",
                "message": "", "lastTransitionTime": "2026-11-25T09:00:00Z"}),
            ),
        }
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"vClusterRef": {"name": "t"}},
            "status": {"phase": "Joining", "conditions": conditions},
        }))
        .expect("claim")
    }

    fn at(s: &str) -> Timestamp {
        s.parse().expect("time")
    }

    #[test]
    fn a_node_not_ready_for_the_repair_time_is_due_and_one_not_ready_since_less_is_looked_at_again_then(
    ) {
        let claims: Vec<NodeClaim> = vec![
            claim("broken", true, Some("2026-11-25T10:00:00Z")),
            claim("wobbly", true, Some("2026-11-25T10:08:00Z")),
            claim("a", true, None),
            claim("b", true, None),
            claim("c", true, None),
            claim("d", true, None),
            claim("e", true, None),
            claim("f", true, None),
            claim("g", true, None),
            claim("h", true, None),
        ];
        let r = assess(
            &claims,
            Some(Duration::from_secs(600)),
            at("2026-11-25T10:10:00Z"),
        );
        assert_eq!(r.due, BTreeSet::from(["broken".to_string()]));
        assert_eq!((r.unhealthy, r.live, r.blocked), (2, 10, false));
        assert_eq!(r.next_check, Some(Duration::from_secs(480)));
        assert!(r.verdict().status);
        assert!(assess(&claims, None, at("2026-11-25T11:00:00Z"))
            .due
            .is_empty());
    }

    #[test]
    fn more_than_a_fifth_of_the_pool_unhealthy_blocks_every_repair() {
        let mut claims: Vec<NodeClaim> = vec![
            claim("x", true, Some("2026-11-25T10:00:00Z")),
            claim("y", true, Some("2026-11-25T10:00:00Z")),
        ];
        claims.extend(["a", "b", "c"].map(|n| claim(n, true, None)));
        let r = assess(
            &claims,
            Some(Duration::from_secs(60)),
            at("2026-11-25T11:00:00Z"),
        );
        assert!(r.blocked && r.due.is_empty(), "{r:?}");
        assert_eq!(r.verdict().reason, PoolReason::TooManyUnhealthyNodes);
        // One of five is a fifth, not more: repaired.
        claims.remove(1);
        claims.push(claim("d", true, None));
        let r = assess(
            &claims,
            Some(Duration::from_secs(60)),
            at("2026-11-25T11:00:00Z"),
        );
        assert_eq!(r.due, BTreeSet::from(["x".to_string()]));
    }

    #[test]
    fn a_node_that_never_initialized_is_not_repaired_the_initialization_timeout_handles_it() {
        let claims = vec![claim("new", false, Some("2026-11-25T10:00:00Z"))];
        let r = assess(
            &claims,
            Some(Duration::from_secs(1)),
            at("2026-11-25T11:00:00Z"),
        );
        assert_eq!((r.unhealthy, r.due.len()), (0, 0));
    }
}

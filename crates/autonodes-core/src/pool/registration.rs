//! Registration health: whether a pool's claims come up. A claim that fails before its node
//! was ever initialized — its VM did not run within the launch timeout, its Node did not
//! join or become Ready within the registration or initialization timeout, or its VM was
//! lost on the way — counts as a failure of the pool. After [`FAILURES_BEFORE_BACKOFF`]
//! failures in a row the pool's `NodeRegistrationHealthy` condition is False with the last
//! failure's reason, and the pool creates no claims for a back-off that doubles with each
//! further failure ([`backoff`]); the first claim of the pool that becomes Available after
//! the last failure clears the count.
//!
//! The count lives in the pool's `status.registration`: each failed claim is counted in
//! the reconcile that deletes it (a Failed claim not yet being deleted), so once.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use autonodes_api::conditions;
use autonodes_api::reasons::{ClaimCondition, PoolReason};
use autonodes_api::{NodeClaim, NodeClaimPhase, RegistrationStatus};

use super::plan::Verdict;

/// Failures in a row after which a pool backs off and says so.
pub const FAILURES_BEFORE_BACKOFF: i32 = 3;
/// The first back-off.
pub const BACKOFF_BASE: Duration = Duration::from_secs(30);
/// The longest back-off.
pub const BACKOFF_MAX: Duration = Duration::from_secs(600);

/// How long a pool waits before creating claims after `failures` failures in a row: nothing
/// below [`FAILURES_BEFORE_BACKOFF`], then [`BACKOFF_BASE`] doubling with each further
/// failure, at most [`BACKOFF_MAX`].
pub fn backoff(failures: i32) -> Option<Duration> {
    let beyond = failures.checked_sub(FAILURES_BEFORE_BACKOFF)?;
    let beyond = u32::try_from(beyond).ok()?;
    let factor = 2u32.checked_pow(beyond.min(16)).unwrap_or(u32::MAX);
    Some(BACKOFF_BASE.saturating_mul(factor).min(BACKOFF_MAX))
}

/// What one reconcile makes of the pool's registration health.
#[derive(Clone, Debug, PartialEq)]
pub struct Registration {
    /// The pool's `status.registration` after this reconcile.
    pub status: RegistrationStatus,
    /// `NodeRegistrationHealthy`.
    pub verdict: Verdict,
    /// How long the pool still waits before it creates claims (`None`: it may now).
    pub backing_off: Option<Duration>,
}

/// Whether the claim failed before its node was ever initialized, and why (the reason of
/// its `Ready` condition).
fn failed_before_ready(c: &NodeClaim) -> Option<String> {
    let s = c.status.as_ref()?;
    if s.phase != Some(NodeClaimPhase::Failed)
        || conditions::is_true(&s.conditions, ClaimCondition::Initialized)
    {
        return None;
    }
    Some(
        conditions::get(&s.conditions, ClaimCondition::Ready)
            .map(|c| c.reason.clone())
            .unwrap_or_default(),
    )
}

/// When the claim became Available (its `Ready` condition turned True), if it is.
fn available_since(c: &NodeClaim) -> Option<Timestamp> {
    let s = c.status.as_ref()?;
    if s.phase != Some(NodeClaimPhase::Available) {
        return None;
    }
    conditions::get(&s.conditions, ClaimCondition::Ready).map(|c| c.last_transition_time.0)
}

/// The pool's registration health at `now`, from what it recorded last (`recorded`) and its
/// claims: Failed claims not yet being deleted are counted (the pool deletes them in this
/// reconcile), and a claim Available since the last failure clears the count.
pub fn assess(
    recorded: Option<&RegistrationStatus>,
    claims: &[Arc<NodeClaim>],
    now: Timestamp,
) -> Registration {
    let mut status = recorded.cloned().unwrap_or_default();
    let last_failure = status.last_failure_time.as_ref().map(|t| t.0);
    let recovered = status.consecutive_failures > 0
        && claims
            .iter()
            .filter_map(|c| available_since(c))
            .any(|since| last_failure.is_none_or(|f| since >= f));
    if recovered {
        status = RegistrationStatus::default();
    }
    let mut failed: Vec<(&NodeClaim, String)> = claims
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .filter_map(|c| failed_before_ready(c).map(|r| (&**c, r)))
        .collect();
    // The newest failure last: its reason is the one the pool shows.
    failed.sort_by_key(|(c, _)| {
        let ready = c.status.as_ref().and_then(|s| {
            conditions::get(&s.conditions, ClaimCondition::Ready).map(|r| r.last_transition_time.0)
        });
        (ready, c.metadata.name.clone())
    });
    if let Some((_, reason)) = failed.last() {
        let n = i32::try_from(failed.len()).unwrap_or(i32::MAX);
        status.consecutive_failures = status.consecutive_failures.saturating_add(n);
        status.last_failure_reason = Some(reason.clone());
        status.last_failure_time = Some(Time(now));
        status.backoff_until = backoff(status.consecutive_failures)
            .and_then(|d| SignedDuration::try_from(d).ok())
            .and_then(|d| now.checked_add(d).ok())
            .map(Time);
    }
    let backing_off = status.backoff_until.as_ref().and_then(|until| {
        let left = until.0.as_millisecond() - now.as_millisecond();
        u64::try_from(left)
            .ok()
            .filter(|l| *l > 0)
            .map(Duration::from_millis)
    });
    let verdict = verdict(&status, backing_off);
    Registration {
        status,
        verdict,
        backing_off,
    }
}

/// `NodeRegistrationHealthy` for `status`: False with the last failure's reason from the
/// threshold on, else True.
fn verdict(status: &RegistrationStatus, backing_off: Option<Duration>) -> Verdict {
    let n = status.consecutive_failures;
    if n < FAILURES_BEFORE_BACKOFF {
        let message = match n {
            0 => "the pool's latest claims came up".to_string(),
            n => format!(
                "{n} claim(s) in a row failed before their node was ready, fewer than {FAILURES_BEFORE_BACKOFF}"
            ),
        };
        return Verdict::new(true, PoolReason::NodesRegistered, message);
    }
    let last = status.last_failure_reason.as_deref().unwrap_or_default();
    let reason = match PoolReason::parse(last) {
        Some(
            r @ (PoolReason::LaunchTimeout
            | PoolReason::RegistrationTimeout
            | PoolReason::InitializationTimeout
            | PoolReason::VirtualMachineLost),
        ) => r,
        _ => PoolReason::RegistrationTimeout,
    };
    let wait = match backing_off {
        Some(d) => format!("no new claim for {}s", d.as_secs().max(1)),
        None => "the back-off is over: the next claim is being tried".to_string(),
    };
    Verdict::new(
        false,
        reason,
        format!(
            "{n} claims in a row failed before their node was ready, the last with {last}; {wait}"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).expect("time")
    }

    fn claim(
        name: &str,
        phase: &str,
        ready_reason: &str,
        initialized: bool,
        since: i64,
    ) -> Arc<NodeClaim> {
        let t = at(since).to_string();
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "autonodes.io/v1alpha1", "kind": "NodeClaim",
                "metadata": {"name": name},
                "spec": {"vClusterRef": {"name": "t"}},
                "status": {"phase": phase, "conditions": [
                    {"type": "Initialized", "status": if initialized {"True"} else {"False"},
                     "reason": "R", "message": "", "lastTransitionTime": t},
                    {"type": "Ready", "status": if phase == "Available" {"True"} else {"False"},
                     "reason": ready_reason, "message": "", "lastTransitionTime": t},
                ]},
            }))
            .expect("claim"),
        )
    }

    #[test]
    fn the_back_off_starts_at_the_third_failure_in_a_row_and_doubles_up_to_ten_minutes() {
        assert_eq!(backoff(0), None);
        assert_eq!(backoff(2), None);
        assert_eq!(backoff(3), Some(Duration::from_secs(30)));
        assert_eq!(backoff(4), Some(Duration::from_secs(60)));
        assert_eq!(backoff(6), Some(Duration::from_secs(240)));
        assert_eq!(backoff(8), Some(BACKOFF_MAX));
        assert_eq!(backoff(i32::MAX), Some(BACKOFF_MAX));
    }

    #[test]
    fn failures_in_a_row_make_the_pool_unhealthy_with_the_last_reason_and_back_off() {
        let mut recorded = None;
        let mut now = 0;
        for (i, reason) in [
            "LaunchTimeout",
            "RegistrationTimeout",
            "InitializationTimeout",
        ]
        .iter()
        .enumerate()
        {
            now += 100;
            let failed = claim(&format!("c{i}"), "Failed", reason, false, now - 1);
            let r = assess(recorded.as_ref(), &[failed], at(now));
            recorded = Some(r.status.clone());
            if i < 2 {
                assert!(r.verdict.status, "{r:?}");
                assert_eq!(r.backing_off, None);
            } else {
                assert!(!r.verdict.status);
                assert_eq!(r.verdict.reason, PoolReason::InitializationTimeout);
                assert_eq!(r.backing_off, Some(Duration::from_secs(30)));
                assert!(
                    r.verdict.message.contains("3 claims in a row"),
                    "{}",
                    r.verdict.message
                );
            }
        }
        // The claim being deleted is not counted again; the back-off runs out.
        let mut going = (*claim("c2", "Failed", "InitializationTimeout", false, now - 1)).clone();
        going.metadata.deletion_timestamp = Some(Time(at(now)));
        let r = assess(recorded.as_ref(), &[Arc::new(going)], at(now + 31));
        assert_eq!(r.status.consecutive_failures, 3);
        assert_eq!(r.backing_off, None);
        assert!(!r.verdict.status, "still unhealthy until a claim comes up");
        // A fourth failure: twice as long.
        let r = assess(
            Some(&r.status),
            &[claim("c3", "Failed", "VirtualMachineLost", false, now + 40)],
            at(now + 41),
        );
        assert_eq!(r.verdict.reason, PoolReason::VirtualMachineLost);
        assert_eq!(r.backing_off, Some(Duration::from_secs(60)));
        // A claim Available since the last failure: healthy again.
        let r = assess(
            Some(&r.status),
            &[claim("c4", "Available", "NodeReady", true, now + 200)],
            at(now + 201),
        );
        assert_eq!(r.status, RegistrationStatus::default());
        assert!(r.verdict.status);
        assert_eq!(r.verdict.reason, PoolReason::NodesRegistered);
    }

    #[test]
    fn a_claim_that_fails_after_its_node_was_ready_or_a_node_available_before_the_failure_changes_nothing(
    ) {
        let lost_later = claim("old", "Failed", "VirtualMachineLost", true, 5);
        let r = assess(None, &[lost_later], at(10));
        assert_eq!(r.status.consecutive_failures, 0);
        let recorded = RegistrationStatus {
            consecutive_failures: 3,
            last_failure_reason: Some("RegistrationTimeout".into()),
            last_failure_time: Some(Time(at(100))),
            backoff_until: Some(Time(at(130))),
        };
        let long_available = claim("long", "Available", "NodeReady", true, 50);
        let r = assess(Some(&recorded), &[long_available], at(110));
        assert_eq!(
            r.status.consecutive_failures, 3,
            "Available since before the failure"
        );
        assert_eq!(r.backing_off, Some(Duration::from_secs(20)));
        assert_eq!(r.verdict.reason, PoolReason::RegistrationTimeout);
    }
}

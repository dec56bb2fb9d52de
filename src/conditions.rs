//! `metav1.Condition` bookkeeping (pure): set a condition, keeping `lastTransitionTime`
//! unless the status flips.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// Condition status `True`.
pub const TRUE: &str = "True";
/// Condition status `False`.
pub const FALSE: &str = "False";
/// Condition status `Unknown`.
pub const UNKNOWN: &str = "Unknown";

/// Sets the condition `type_` in `conditions`. `lastTransitionTime` becomes `now` only when
/// the condition is new or its status changes. Returns true when anything changed.
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: &str,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
    now: Timestamp,
) -> bool {
    let message = message.into();
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            let changed = c.status != status
                || c.reason != reason
                || c.message != message
                || c.observed_generation != generation;
            if c.status != status {
                c.last_transition_time = Time(now);
            }
            c.status = status.to_string();
            c.reason = reason.to_string();
            c.message = message;
            c.observed_generation = generation;
            changed
        }
        None => {
            conditions.push(Condition {
                type_: type_.to_string(),
                status: status.to_string(),
                reason: reason.to_string(),
                message,
                observed_generation: generation,
                last_transition_time: Time(now),
            });
            true
        }
    }
}

/// The condition `type_`, if present.
pub fn get<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// True when the condition `type_` is present with status `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    get(conditions, type_).is_some_and(|c| c.status == TRUE)
}

/// When the condition `type_` last became `True`, if it is True.
pub fn true_since(conditions: &[Condition], type_: &str) -> Option<Timestamp> {
    get(conditions, type_)
        .filter(|c| c.status == TRUE)
        .map(|c| c.last_transition_time.0)
}

/// Condition status text for a boolean.
pub fn status_of(ok: bool) -> &'static str {
    if ok {
        TRUE
    } else {
        FALSE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).expect("valid timestamp")
    }

    #[test]
    fn transition_time_changes_only_when_the_status_flips() {
        let mut cs = Vec::new();
        assert!(set(
            &mut cs,
            "Ready",
            FALSE,
            "Booting",
            "vm starting",
            Some(1),
            at(10)
        ));
        assert!(set(
            &mut cs,
            "Ready",
            FALSE,
            "Joining",
            "waiting for node",
            Some(1),
            at(20)
        ));
        assert_eq!(
            cs[0].last_transition_time.0,
            at(10),
            "same status keeps the time"
        );
        assert_eq!(cs[0].reason, "Joining");
        assert!(set(
            &mut cs,
            "Ready",
            TRUE,
            "NodeReady",
            "ok",
            Some(1),
            at(30)
        ));
        assert_eq!(cs[0].last_transition_time.0, at(30));
        assert_eq!(true_since(&cs, "Ready"), Some(at(30)));
    }

    #[test]
    fn setting_the_same_condition_twice_reports_no_change() {
        let mut cs = Vec::new();
        set(
            &mut cs,
            "Scheduled",
            TRUE,
            "Scheduled",
            "to a.b",
            Some(2),
            at(1),
        );
        assert!(!set(
            &mut cs,
            "Scheduled",
            TRUE,
            "Scheduled",
            "to a.b",
            Some(2),
            at(5)
        ));
        assert_eq!(cs.len(), 1);
        assert!(is_true(&cs, "Scheduled"));
        assert!(!is_true(&cs, "Ready"));
    }
}

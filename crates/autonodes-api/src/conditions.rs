//! `metav1.Condition` bookkeeping (pure): set a condition, keeping `lastTransitionTime`
//! unless the status flips.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use crate::reasons::ClaimReason;

/// Condition status `True`.
pub const TRUE: &str = "True";
/// Condition status `False`.
pub const FALSE: &str = "False";

/// The longest condition message written, in bytes (the API allows 32768; a longer one
/// would make the whole status write fail). Longer messages are cut with `…`.
pub const MAX_MESSAGE_BYTES: usize = 4096;

/// True for a NodeClaim reason that means "on its way" ([`ClaimReason::is_progress`]).
pub fn is_progress(reason: &str) -> bool {
    ClaimReason::parse(reason).is_some_and(ClaimReason::is_progress)
}

/// `message` cut to at most [`MAX_MESSAGE_BYTES`] ([`cut`]).
pub fn bounded_message(message: String) -> String {
    if message.len() <= MAX_MESSAGE_BYTES {
        return message;
    }
    cut(&message, MAX_MESSAGE_BYTES)
}

/// The one way autonodes shortens text it writes or shows (condition messages, Event
/// fields, a remote server's words): at most `max_bytes` bytes, cut on a character
/// boundary, a `…` marking a cut (within the bound). Text that fits is returned as it is.
pub fn cut(text: &str, max_bytes: usize) -> String {
    if text.len() <= max_bytes {
        return text.to_string();
    }
    let ellipsis = '…'.len_utf8();
    if max_bytes < ellipsis {
        return String::new();
    }
    let mut end = max_bytes - ellipsis;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// `text` on one line: every control character (newlines, tabs, escapes) becomes a space.
pub fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// "`n` of `total` `what` invalid: " and the first few problems, so a message stays short
/// however many entries are broken (each entry's own status says the rest).
pub fn summarize(problems: &[String], total: usize, what: &str) -> String {
    const SHOWN: usize = 3;
    let shown = problems
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join("; ");
    let n = problems.len();
    if n <= SHOWN {
        return format!("{n} of {total} {what} invalid: {shown}");
    }
    format!(
        "{n} of {total} {what} invalid: {shown}; and {} more",
        n - SHOWN
    )
}

/// Sets the condition `type_` in `conditions`. `lastTransitionTime` becomes `now` only when
/// the condition is new or its status changes. The message is bounded
/// ([`bounded_message`]). Returns true when anything changed.
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: impl AsRef<str>,
    status: &str,
    reason: impl AsRef<str>,
    message: impl Into<String>,
    generation: Option<i64>,
    now: Timestamp,
) -> bool {
    let (type_, reason) = (type_.as_ref(), reason.as_ref());
    let message = bounded_message(message.into());
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
pub fn get(conditions: &[Condition], type_: impl AsRef<str>) -> Option<&Condition> {
    let type_ = type_.as_ref();
    conditions.iter().find(|c| c.type_ == type_)
}

/// True when the condition `type_` is present with status `True`.
pub fn is_true(conditions: &[Condition], type_: impl AsRef<str>) -> bool {
    get(conditions, type_).is_some_and(|c| c.status == TRUE)
}

/// When the condition `type_` last became `True`, if it is True.
pub fn true_since(conditions: &[Condition], type_: impl AsRef<str>) -> Option<Timestamp> {
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
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn cut_text_fits_its_bound_and_keeps_a_prefix(text in ".{0,200}", max in 0usize..300) {
            let out = cut(&text, max);
            prop_assert!(out.len() <= max || (text.len() <= max && out == text));
            if text.len() <= max {
                prop_assert_eq!(&out, &text);
            } else if !out.is_empty() {
                let kept = out.strip_suffix('…').expect("a cut is marked");
                prop_assert!(text.starts_with(kept));
            }
        }
    }

    #[test]
    fn one_line_turns_control_characters_into_spaces() {
        assert_eq!(one_line("a\nb\tc\u{1b}[31m"), "a b c [31m");
    }

    #[test]
    fn a_long_message_is_cut_on_a_character_boundary_with_an_ellipsis() {
        let long = "é".repeat(5000);
        let cut = bounded_message(long);
        assert!(cut.len() <= MAX_MESSAGE_BYTES, "{}", cut.len());
        assert!(cut.ends_with('…'));
        let short = "fine".to_string();
        assert_eq!(bounded_message(short.clone()), short);
        let mut cs = Vec::new();
        set(
            &mut cs,
            "Ready",
            FALSE,
            "Bad",
            "x".repeat(100_000),
            None,
            at(1),
        );
        assert!(cs[0].message.len() <= MAX_MESSAGE_BYTES);
    }

    #[test]
    fn many_problems_are_summarised_with_the_first_three() {
        let problems: Vec<String> = (0..500)
            .map(|i| format!("node type t{i}: broken"))
            .collect();
        let s = summarize(&problems, 500, "node types");
        assert!(
            s.starts_with("500 of 500 node types invalid: node type t0: broken; node type t1: broken; node type t2: broken; and 497 more"),
            "{s}"
        );
        assert_eq!(
            summarize(&problems[..2], 9, "node types"),
            "2 of 9 node types invalid: node type t0: broken; node type t1: broken"
        );
    }

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

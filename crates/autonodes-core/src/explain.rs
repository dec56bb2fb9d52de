//! `autonodes explain`: why a claim is where it is, why a pool's nodes are or are not
//! being disrupted or repaired, and which pool could make a node for a pending pod — told
//! from the functions the controller decides with ([`crate::scheduling`] for node types,
//! [`crate::pool::budget`], [`crate::pool::repair`], [`crate::pool::do_not_disrupt`], the
//! dynamic pools' candidate types and [`crate::pool::pack`]'s pod checks), never a second
//! copy of their rules. Pure: the caller reads the objects and prints [`Explanation::text`]
//! or its JSON. One module per kind: [`claim`], [`pool`] (a pool and a tenant Node, told as
//! its pool's claim) and [`pod`].

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde::Serialize;

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
    pub(crate) fn new(
        subject: impl Into<String>,
        verdict: impl Into<String>,
        reasons: Vec<String>,
    ) -> Self {
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
pub(crate) fn condition_lines(cs: &[Condition]) -> Vec<String> {
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

pub mod claim;
pub mod pod;
pub mod pool;

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

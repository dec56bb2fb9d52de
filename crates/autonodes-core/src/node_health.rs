//! The Node conditions a claim keeps in `status.nodeConditions` for node repair: what the
//! Node reports, bounded, each with the time the controller first saw its current status
//! (the controller's clock, not the tenant's).

use k8s_openapi::api::core::v1::NodeCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use autonodes_api::{ObservedNodeCondition, MAX_NODE_CONDITIONS};

/// Longest reason kept.
const MAX_REASON: usize = 128;
/// Longest condition type kept (a qualified name); longer ones are skipped.
const MAX_TYPE: usize = 316;

/// Whether the Node reports `Ready=True`.
pub fn node_ready(node: &k8s_openapi::api::core::v1::Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The claim's `nodeConditions` after seeing the Node's `conditions` at `now`: `Ready` first,
/// then the others by type, at most [`MAX_NODE_CONDITIONS`]; a condition whose status is
/// unchanged keeps the time of `previous`, one new or changed gets `now`.
pub fn observe(
    previous: &[ObservedNodeCondition],
    conditions: &[NodeCondition],
    now: Timestamp,
) -> Vec<ObservedNodeCondition> {
    let mut seen: Vec<&NodeCondition> = conditions
        .iter()
        .filter(|c| !c.type_.is_empty() && c.type_.len() <= MAX_TYPE && c.status.len() <= 16)
        .collect();
    seen.sort_by(|a, b| (a.type_ != "Ready", &a.type_).cmp(&(b.type_ != "Ready", &b.type_)));
    seen.dedup_by(|a, b| a.type_ == b.type_);
    seen.into_iter()
        .take(MAX_NODE_CONDITIONS)
        .map(|c| {
            let since = previous
                .iter()
                .find(|p| p.type_ == c.type_ && p.status == c.status)
                .map_or_else(|| Time(now), |p| p.since.clone());
            ObservedNodeCondition {
                type_: c.type_.clone(),
                status: c.status.clone(),
                reason: c
                    .reason
                    .as_deref()
                    .unwrap_or_default()
                    .chars()
                    .take(MAX_REASON)
                    .collect(),
                since,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn condition(type_: &str, status: &str) -> NodeCondition {
        NodeCondition {
            type_: type_.into(),
            status: status.into(),
            reason: Some("R".repeat(300)),
            ..NodeCondition::default()
        }
    }

    fn at(s: &str) -> Timestamp {
        s.parse().expect("time")
    }

    #[test]
    fn ready_comes_first_and_an_unchanged_status_keeps_when_it_was_first_seen() {
        let first = observe(
            &[],
            &[
                condition("KernelDeadlock", "False"),
                condition("Ready", "True"),
            ],
            at("2026-11-25T10:00:00Z"),
        );
        assert_eq!(
            first
                .iter()
                .map(|c| (c.type_.as_str(), c.status.as_str()))
                .collect::<Vec<_>>(),
            [("Ready", "True"), ("KernelDeadlock", "False")]
        );
        assert_eq!(first[0].reason.len(), MAX_REASON);
        let later = observe(
            &first,
            &[
                condition("Ready", "True"),
                condition("KernelDeadlock", "True"),
            ],
            at("2026-11-25T10:05:00Z"),
        );
        assert_eq!(later[0].since.0, at("2026-11-25T10:00:00Z"));
        assert_eq!(later[1].since.0, at("2026-11-25T10:05:00Z"));
    }

    #[test]
    fn a_node_with_many_conditions_keeps_at_most_sixteen_and_skips_malformed_ones() {
        let mut many: Vec<NodeCondition> = (0..40)
            .map(|i| condition(&format!("example.com/c{i:02}"), "False"))
            .collect();
        many.push(condition("", "True"));
        many.push(condition("Ready", "True"));
        many.push(condition("Ready", "False"));
        let kept = observe(&[], &many, at("2026-11-25T10:00:00Z"));
        assert_eq!(kept.len(), MAX_NODE_CONDITIONS);
        assert_eq!(kept[0].type_, "Ready");
        assert_eq!(kept.iter().filter(|c| c.type_ == "Ready").count(), 1);
        assert!(kept.iter().all(|c| !c.type_.is_empty()));
    }
}

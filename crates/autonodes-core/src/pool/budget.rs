//! Disruption budgets: how many of a pool's nodes may be disrupted — drained for
//! consolidation, a roll-out of a changed template or expiry — at one moment.
//!
//! `disruption.budgets` read as Karpenter's: each allows `nodes` (a count, or a percentage
//! of the pool's nodes rounded up); a budget with a `schedule` (five cron fields or a macro,
//! UTC) is active for `duration` after each time its schedule fires, one without is always
//! active; the most restrictive active budget wins, and with none active nothing limits.
//! Without budgets the older `disruption.budget` (a count) applies, and without that
//! [`DEFAULT_BUDGET`]. Nodes draining already count against what a budget allows.
//!
//! A budget with `reasons` limits only those disruptions (`Empty`, `Underutilized`,
//! `Drifted`); one without limits them all, and also expiry and the pace of a scale-down,
//! which no reason names. Whatever disrupts a node, every draining node counts against
//! every budget, as in Karpenter.

use std::time::Duration;

use croner::parser::{CronParser, Seconds};
use croner::Cron;
use k8s_openapi::jiff::{tz::TimeZone, Timestamp};

use autonodes_api::{Budget, DisruptionReason, NodePoolSpec};

/// The budget of a pool that sets neither `disruption.budgets` nor `disruption.budget`:
/// 10 % of its nodes (at least one node of a pool that has any), as Karpenter defaults it.
pub(crate) const DEFAULT_BUDGET: BudgetNodes = BudgetNodes::Percent(10);

/// How many of the pool's `pool_nodes` nodes may be disrupted for `reason` at `now` (before
/// the nodes draining already are subtracted): the least any active budget that applies
/// allows. `None` is a disruption no reason names (expiry, a scale-down): only budgets
/// without `reasons` apply to it.
pub(crate) fn allowed_disruptions(
    pool: &NodePoolSpec,
    pool_nodes: usize,
    now: Timestamp,
    reason: Option<DisruptionReason>,
) -> usize {
    let nodes = u64::try_from(pool_nodes).unwrap_or(u64::MAX);
    let disruption = pool.disruption.as_ref();
    let budgets = disruption.map(|d| d.budgets.as_slice()).unwrap_or_default();
    let allowed = if budgets.is_empty() {
        match disruption.and_then(|d| d.budget) {
            Some(count) => u64::try_from(count).unwrap_or(0).max(1),
            None => DEFAULT_BUDGET.of(nodes),
        }
    } else {
        budgets
            .iter()
            .filter(|b| applies(b, reason) && is_active(b, now))
            .filter_map(|b| budget_nodes(&b.nodes))
            .map(|b| b.of(nodes))
            .min()
            .unwrap_or(u64::MAX)
    };
    usize::try_from(allowed).unwrap_or(usize::MAX)
}

/// Whether `budget` limits disruptions for `reason`: a budget without reasons limits all.
fn applies(budget: &Budget, reason: Option<DisruptionReason>) -> bool {
    budget.reasons.is_empty() || reason.is_some_and(|r| budget.reasons.contains(&r))
}

/// How many nodes a scale-down (a lower `replicas`, `kubectl scale`, the cluster-autoscaler)
/// may drain at once: what the budgets without reasons allow, but at least one — the user
/// asked for fewer nodes, so a budget of `"0"` slows a scale-down to one node at a time
/// instead of refusing it.
pub(crate) fn scale_down_pace(pool: &NodePoolSpec, pool_nodes: usize, now: Timestamp) -> usize {
    allowed_disruptions(pool, pool_nodes, now, None).max(1)
}

/// Whether `budget` is active at `now`: always without a schedule; with one, from each time
/// the schedule fires (UTC) for `duration`. A budget that does not read is not active (the
/// pool's condition says why, [`disruption_problem`]).
pub(crate) fn is_active(budget: &Budget, now: Timestamp) -> bool {
    let (Some(schedule), Some(duration)) = (&budget.schedule, &budget.duration) else {
        return budget.schedule.is_none() && budget.duration.is_none();
    };
    let (Some(cron), Some(duration)) = (budget_schedule(schedule), budget_duration(duration))
    else {
        return false;
    };
    let zoned = now.to_zoned(TimeZone::UTC);
    let Ok(fired) = cron.find_previous_occurrence(&zoned, true) else {
        return false;
    };
    let since = now.as_millisecond() - fired.timestamp().as_millisecond();
    u128::try_from(since).is_ok_and(|since| since < duration.as_millis())
}

/// Reads a budget's `schedule`: five cron fields (minute hour day-of-month month
/// day-of-week) or a macro such as `@daily`; `None` for anything else.
pub(crate) fn budget_schedule(s: &str) -> Option<Cron> {
    let fields = s.split_whitespace().count();
    let five_or_macro = fields == 5 || (fields == 1 && s.trim_start().starts_with('@'));
    if !five_or_macro {
        return None;
    }
    CronParser::builder()
        .seconds(Seconds::Disallowed)
        .build()
        .parse(s)
        .ok()
}

/// A budget's `nodes`: a count, or a percentage of the pool (`10%`, at most 100).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetNodes {
    /// At most this many nodes.
    Count(u64),
    /// At most this share of the pool's nodes, rounded up.
    Percent(u8),
}

impl BudgetNodes {
    /// How many of `pool_nodes` nodes the budget allows to be disrupted at once.
    pub fn of(self, pool_nodes: u64) -> u64 {
        match self {
            BudgetNodes::Count(n) => n,
            BudgetNodes::Percent(p) => (pool_nodes * u64::from(p)).div_ceil(100),
        }
    }
}

/// Reads a budget's `nodes` (`3`, `10%`); `None` for anything else.
pub fn budget_nodes(s: &str) -> Option<BudgetNodes> {
    match s.strip_suffix('%') {
        Some(p) => p
            .parse::<u8>()
            .ok()
            .filter(|p| *p <= 100 && !s.starts_with('+'))
            .map(BudgetNodes::Percent),
        None => s
            .bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| s.parse::<u64>().ok().map(BudgetNodes::Count))
            .flatten(),
    }
}

/// Reads a budget's `duration`: hours and minutes (`8h`, `1h30m`, `90m`) as Karpenter
/// accepts; `None` for anything else, or nothing at all.
pub(crate) fn budget_duration(s: &str) -> Option<Duration> {
    if s.is_empty() {
        return None;
    }
    let (hours, rest) = match s.split_once('h') {
        Some((h, rest)) => (Some(h), rest),
        None => (None, s),
    };
    let minutes = match rest {
        "" => None,
        m => Some(m.strip_suffix('m')?),
    };
    let number = |n: Option<&str>| -> Option<u64> {
        match n {
            None => Some(0),
            Some(n) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => n.parse().ok(),
            Some(_) => None,
        }
    };
    let total = number(hours)?
        .checked_mul(3600)?
        .checked_add(number(minutes)?.checked_mul(60)?)?;
    Some(Duration::from_secs(total))
}

/// What is wrong with the pool's `spec.disruption`: a budget whose `schedule` and
/// `duration` do not come together, or whose fields do not read (the schema refuses most).
pub(crate) fn disruption_problem(pool: &NodePoolSpec) -> Option<String> {
    let budgets = pool.disruption.as_ref().map(|d| d.budgets.as_slice());
    for (i, b) in budgets.unwrap_or_default().iter().enumerate() {
        let at = format!("spec.disruption.budgets[{i}]");
        if budget_nodes(&b.nodes).is_none() {
            return Some(format!(
                "{at}.nodes: {:?} is neither a count nor a percentage",
                b.nodes
            ));
        }
        match (&b.schedule, &b.duration) {
            (Some(s), _) if budget_schedule(s).is_none() => {
                return Some(format!(
                    "{at}.schedule: {s:?} is not five cron fields or a macro such as @daily"
                ))
            }
            (Some(_), None) => return Some(format!("{at}: a schedule needs a duration")),
            (None, Some(_)) => return Some(format!("{at}: a duration needs a schedule")),
            (_, Some(d)) if budget_duration(d).is_none() => {
                return Some(format!(
                    "{at}.duration: {d:?} is not hours and minutes such as 8h or 30m"
                ))
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(disruption: serde_json::Value) -> NodePoolSpec {
        serde_json::from_value(json!({"vClusterRef": {"name": "t"}, "disruption": disruption}))
            .expect("spec")
    }

    fn at(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    #[test]
    fn without_budgets_a_pool_may_disrupt_ten_percent_of_its_nodes_rounded_up() {
        let now = at("2026-11-25T10:00:00Z");
        let pool = spec(json!({}));
        assert_eq!(allowed_disruptions(&pool, 0, now, None), 0);
        assert_eq!(allowed_disruptions(&pool, 3, now, None), 1);
        assert_eq!(allowed_disruptions(&pool, 25, now, None), 3);
        assert_eq!(
            allowed_disruptions(&spec(json!({"budget": 4})), 25, now, None),
            4
        );
    }

    #[test]
    fn the_most_restrictive_active_budget_wins_and_a_window_of_zero_blocks_only_inside_it() {
        let pool = spec(json!({"budgets": [
            {"nodes": "50%"},
            {"nodes": "0", "schedule": "0 9 * * 1-5", "duration": "8h"},
        ]}));
        // Wednesday 2026-11-25: inside 09:00–17:00, then after it.
        assert_eq!(
            allowed_disruptions(&pool, 10, at("2026-11-25T09:00:00Z"), None),
            0
        );
        assert_eq!(
            allowed_disruptions(&pool, 10, at("2026-11-25T16:59:59Z"), None),
            0
        );
        assert_eq!(
            allowed_disruptions(&pool, 10, at("2026-11-25T17:00:00Z"), None),
            5
        );
        assert_eq!(
            allowed_disruptions(&pool, 10, at("2026-11-25T08:59:00Z"), None),
            5
        );
        // Saturday: the window's schedule does not fire.
        assert_eq!(
            allowed_disruptions(&pool, 10, at("2026-11-28T10:00:00Z"), None),
            5
        );
        // A scale-down still goes one node at a time inside the window.
        assert_eq!(scale_down_pace(&pool, 10, at("2026-11-25T10:00:00Z")), 1);
    }

    #[test]
    fn a_budget_with_reasons_limits_only_those_and_one_without_limits_every_disruption() {
        let now = at("2026-11-25T10:00:00Z");
        let pool = spec(json!({"budgets": [
            {"nodes": "0", "reasons": ["Drifted"]},
            {"nodes": "2", "reasons": ["Empty", "Underutilized"]},
            {"nodes": "50%"},
        ]}));
        let allowed = |r| allowed_disruptions(&pool, 10, now, r);
        assert_eq!(allowed(Some(DisruptionReason::Drifted)), 0);
        assert_eq!(allowed(Some(DisruptionReason::Empty)), 2);
        assert_eq!(allowed(Some(DisruptionReason::Underutilized)), 2);
        // Expiry and a scale-down: only the budget without reasons.
        assert_eq!(allowed(None), 5);
        assert_eq!(scale_down_pace(&pool, 10, now), 5);
        // Only budgets with reasons: what they do not name is not limited.
        let pool = spec(json!({"budgets": [{"nodes": "1", "reasons": ["Drifted"]}]}));
        assert_eq!(
            allowed_disruptions(&pool, 10, now, Some(DisruptionReason::Drifted)),
            1
        );
        assert_eq!(
            allowed_disruptions(&pool, 10, now, Some(DisruptionReason::Empty)),
            usize::MAX
        );
        assert_eq!(allowed_disruptions(&pool, 10, now, None), usize::MAX);
    }

    #[test]
    fn with_only_scheduled_budgets_nothing_limits_outside_their_windows() {
        let pool = spec(json!({"budgets": [
            {"nodes": "1", "schedule": "@daily", "duration": "1h"},
        ]}));
        assert_eq!(
            allowed_disruptions(&pool, 10, at("2026-11-25T00:30:00Z"), None),
            1
        );
        assert_eq!(
            allowed_disruptions(&pool, 10, at("2026-11-25T01:00:00Z"), None),
            usize::MAX
        );
    }

    #[test]
    fn budget_schedules_are_five_cron_fields_or_a_macro() {
        for good in [
            "0 9 * * 1-5",
            "*/15 * * * *",
            "@daily",
            "@hourly",
            "0 0 1 JAN *",
        ] {
            assert!(budget_schedule(good).is_some(), "{good:?}");
        }
        for bad in [
            "",
            "* * * *",
            "0 0 9 * * 1-5",
            "@often",
            "61 * * * *",
            "a b c d e",
        ] {
            assert!(budget_schedule(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn budget_nodes_read_as_counts_or_percentages_of_the_pool_rounded_up() {
        assert_eq!(budget_nodes("3"), Some(BudgetNodes::Count(3)));
        assert_eq!(budget_nodes("0"), Some(BudgetNodes::Count(0)));
        assert_eq!(budget_nodes("10%").map(|b| b.of(15)), Some(2));
        assert_eq!(budget_nodes("100%").map(|b| b.of(7)), Some(7));
        for bad in ["", "%", "101%", "-1", "+3", "1.5", "ten", "3 "] {
            assert_eq!(budget_nodes(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn budget_durations_are_hours_and_minutes() {
        assert_eq!(budget_duration("8h"), Some(Duration::from_secs(8 * 3600)));
        assert_eq!(budget_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(budget_duration("90m"), Some(Duration::from_secs(5400)));
        for bad in ["", "h", "m", "30s", "1h30", "1.5h", "h30m"] {
            assert_eq!(budget_duration(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_budget_schedule_without_a_duration_is_a_disruption_problem() {
        let spec = |budgets: serde_json::Value| -> NodePoolSpec {
            serde_json::from_value(
                json!({"vClusterRef": {"name": "t"}, "disruption": {"budgets": budgets}}),
            )
            .expect("spec")
        };
        assert_eq!(disruption_problem(&spec(json!([{"nodes": "10%"}]))), None);
        assert_eq!(
            disruption_problem(&spec(
                json!([{"nodes": "0", "schedule": "0 9 * * 1-5", "duration": "8h"}])
            )),
            None
        );
        let problem = disruption_problem(&spec(
            json!([{"nodes": "1"}, {"nodes": "0", "schedule": "@daily"}]),
        ));
        assert_eq!(
            problem.as_deref(),
            Some("spec.disruption.budgets[1]: a schedule needs a duration")
        );
        let problem = disruption_problem(&spec(
            json!([{"nodes": "0", "schedule": "0 25 * * *", "duration": "1h"}]),
        ));
        assert!(
            problem
                .as_deref()
                .is_some_and(|p| p.contains("budgets[0].schedule")),
            "{problem:?}"
        );
    }
}

//! A pod's preferences, dropped one term at a time: packing first looks for a node that
//! meets every preference of a pod (preferred node affinity, preferred pod affinity and
//! anti-affinity, `ScheduleAnyway` topology spread), and for a pod that fits nowhere with
//! them tries again without one more term each time ([`stages`]) until it fits or none is
//! left.
//!
//! The order follows how the kube-scheduler weighs them: a node's score adds up the
//! weights of the preferred terms it meets, so a node meeting the heavier terms is the one
//! it would pick. The lightest weighted term goes first (on equal weights: pod affinity,
//! then pod anti-affinity, then node affinity, each in the order the pod lists them), and
//! `ScheduleAnyway` spread constraints, which have no weight, go last. (Karpenter drops
//! the same kinds one at a time too, but by kind and the heaviest first.) A pod is written
//! by the tenant, so its tries are bounded: after [`MAX_SINGLE_DROPS`] terms dropped one
//! by one, the next try drops all that are left.

use super::PendingPod;

/// The most preferences dropped one at a time; a pod with more tries once more without
/// any (so at most this many + 2 tries, whatever the pod lists).
pub(crate) const MAX_SINGLE_DROPS: usize = 8;

/// One preference of a pod, by its index in the pod's list of that kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Term {
    /// `rules.preferred_affinity[i]`.
    Affinity(usize),
    /// `rules.preferred_anti_affinity[i]`.
    Anti(usize),
    /// `preferred_terms[i]` (node affinity).
    Node(usize),
    /// `rules.spread[i]`, a `ScheduleAnyway` constraint.
    Spread(usize),
}

/// Which of a pod's preferences a placement honours, by index in each list; an index
/// out of range is not honoured (so [`Honoured::default`] honours none).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Honoured {
    affinity: Vec<bool>,
    anti: Vec<bool>,
    node: Vec<bool>,
    spread: Vec<bool>,
}

fn at(list: &[bool], i: usize) -> bool {
    list.get(i).copied().unwrap_or(false)
}

impl Honoured {
    /// Whether preferred pod affinity term `i` is honoured.
    pub(crate) fn affinity(&self, i: usize) -> bool {
        at(&self.affinity, i)
    }

    /// Whether preferred pod anti-affinity term `i` is honoured.
    pub(crate) fn anti(&self, i: usize) -> bool {
        at(&self.anti, i)
    }

    /// Whether preferred node affinity term `i` is honoured.
    pub(crate) fn node(&self, i: usize) -> bool {
        at(&self.node, i)
    }

    /// Whether spread constraint `i` (a `ScheduleAnyway` one) is honoured.
    pub(crate) fn spread(&self, i: usize) -> bool {
        at(&self.spread, i)
    }

    fn set(&mut self, term: Term, on: bool) {
        let (list, i) = match term {
            Term::Affinity(i) => (&mut self.affinity, i),
            Term::Anti(i) => (&mut self.anti, i),
            Term::Node(i) => (&mut self.node, i),
            Term::Spread(i) => (&mut self.spread, i),
        };
        if list.len() <= i {
            list.resize(i + 1, false);
        }
        list[i] = on;
    }
}

/// The pod's preferences in the order they are dropped: weighted terms lightest first
/// (pod affinity, pod anti-affinity, node affinity on equal weights, each in its listed
/// order), then the `ScheduleAnyway` spread constraints.
fn drop_order(pod: &PendingPod) -> Vec<Term> {
    let rules = &pod.rules;
    let mut weighted: Vec<(i32, Term)> = rules
        .preferred_affinity
        .iter()
        .enumerate()
        .map(|(i, p)| (p.weight, Term::Affinity(i)))
        .chain(
            rules
                .preferred_anti_affinity
                .iter()
                .enumerate()
                .map(|(i, p)| (p.weight, Term::Anti(i))),
        )
        .chain(
            pod.preferred_terms
                .iter()
                .enumerate()
                .map(|(i, t)| (t.weight, Term::Node(i))),
        )
        .collect();
    // A stable sort keeps the kinds' order on equal weights.
    weighted.sort_by_key(|(w, _)| *w);
    weighted
        .into_iter()
        .map(|(_, t)| t)
        .chain(
            rules
                .spread
                .iter()
                .enumerate()
                .filter(|(_, s)| !s.hard)
                .map(|(i, _)| Term::Spread(i)),
        )
        .collect()
}

/// What each try of placing the pod honours: every preference, then one fewer each time in
/// the [`drop_order`] (at most [`MAX_SINGLE_DROPS`] times), and last none. A pod without
/// preferences has one stage.
pub(crate) fn stages(pod: &PendingPod) -> Vec<Honoured> {
    let order = drop_order(pod);
    let mut all = Honoured::default();
    for t in &order {
        all.set(*t, true);
    }
    let mut out = Vec::with_capacity(order.len().min(MAX_SINGLE_DROPS) + 2);
    out.push(all.clone());
    for t in order.iter().take(MAX_SINGLE_DROPS) {
        all.set(*t, false);
        out.push(all.clone());
    }
    if order.len() > MAX_SINGLE_DROPS {
        out.push(Honoured::default());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> PendingPod {
        let mut s = json!({"containers": [{"name": "c"}]});
        if let (Some(s), Some(extra)) = (s.as_object_mut(), spec.as_object()) {
            s.extend(extra.clone());
        }
        PendingPod::from_pod(
            &serde_json::from_value(json!({
                "metadata": {"name": "p", "namespace": "default", "labels": {"app": "p"}},
                "spec": s,
            }))
            .expect("pod"),
        )
    }

    fn pod_term(weight: i32, app: &str) -> serde_json::Value {
        json!({"weight": weight, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
            "labelSelector": {"matchLabels": {"app": app}}}})
    }

    #[test]
    fn preferences_are_dropped_lightest_first_and_schedule_anyway_spread_last() {
        let p = pod(json!({
            "affinity": {
                "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                    pod_term(50, "cache")]},
                "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                    pod_term(10, "p"), pod_term(50, "db")]},
                "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 80, "preference": {"matchExpressions": [
                        {"key": "disk", "operator": "In", "values": ["ssd"]}]}}]},
            },
            "topologySpreadConstraints": [
                {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                 "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": {"app": "p"}}},
                {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                 "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "p"}}}
            ],
        }));
        assert_eq!(
            drop_order(&p),
            [
                Term::Anti(0),
                Term::Affinity(0),
                Term::Anti(1),
                Term::Node(0),
                Term::Spread(0)
            ]
        );
        let stages = stages(&p);
        assert_eq!(stages.len(), 6);
        let first = &stages[0];
        assert!(first.affinity(0) && first.anti(0) && first.anti(1) && first.node(0));
        assert!(first.spread(0));
        // The second stage drops the lightest (anti-affinity to its own kind, weight 10)
        // and keeps the rest.
        assert!(!stages[1].anti(0) && stages[1].anti(1) && stages[1].node(0));
        // Only the spread is left before the last stage, which honours nothing.
        assert!(stages[4].spread(0) && !stages[4].node(0));
        let last = &stages[5];
        assert!(!(last.affinity(0) || last.anti(0) || last.anti(1) || last.node(0)));
        assert!(!last.spread(0));
    }

    #[test]
    fn a_pod_listing_many_preferences_is_tried_a_bounded_number_of_times() {
        let terms: Vec<serde_json::Value> = (0..500).map(|i| pod_term(1 + i % 100, "p")).collect();
        let p = pod(json!({"affinity": {"podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": terms}}}));
        let stages = stages(&p);
        assert_eq!(stages.len(), MAX_SINGLE_DROPS + 2);
        assert!((0..500).all(|i| stages[0].anti(i)));
        assert!(!(0..500).any(|i| stages[MAX_SINGLE_DROPS + 1].anti(i)));
        // The ones dropped first are the lightest (weight 1).
        assert!(!stages[1].anti(0) && stages[1].anti(1));
    }

    #[test]
    fn a_pod_without_preferences_has_one_stage_that_honours_nothing() {
        assert_eq!(stages(&pod(json!({}))), [Honoured::default()]);
        let ignored = pod(json!({"affinity": {"podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [pod_term(10, "p")]}}}))
        .without_preferences();
        assert_eq!(stages(&ignored), [Honoured::default()]);
    }
}

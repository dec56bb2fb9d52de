//! A pod's placement rules as the kube-scheduler reads them, parsed once for packing: pod
//! affinity and anti-affinity terms (required and preferred) on any topology key, and
//! topology spread constraints on any key (`DoNotSchedule` and `ScheduleAnyway`,
//! `minDomains`, `nodeAffinityPolicy`, `nodeTaintsPolicy`, `matchLabelKeys`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PodAffinityTerm, PodSpec, TopologySpreadConstraint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

use crate::requirements;

/// The namespaces a pod affinity term looks at.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Namespaces {
    /// These namespaces (the pod's own when the term names none).
    Listed(Vec<String>),
    /// Every namespace: a term with a `namespaceSelector`. Packing has no namespace
    /// labels, so a selector counts pods of every namespace (for anti-affinity the
    /// cautious reading: it keeps more pods apart).
    All,
}

impl Namespaces {
    /// Whether pods of `namespace` are looked at.
    pub fn contains(&self, namespace: &str) -> bool {
        match self {
            Namespaces::Listed(ns) => ns.iter().any(|n| n == namespace),
            Namespaces::All => true,
        }
    }
}

/// A pod affinity or anti-affinity term: pods its selector selects in its namespaces, in
/// the same domain of `key` (one node for `kubernetes.io/hostname`, one zone for
/// `topology.kubernetes.io/zone`, any node label otherwise).
#[derive(Clone, Debug, PartialEq)]
pub struct PodTerm {
    /// The topology key.
    pub key: String,
    /// Which pods it selects.
    pub selector: LabelSelector,
    /// Their namespaces.
    pub namespaces: Namespaces,
}

impl PodTerm {
    /// Whether it selects a pod of `namespace` with `labels`.
    pub fn selects(&self, namespace: &str, labels: &BTreeMap<String, String>) -> bool {
        self.namespaces.contains(namespace)
            && requirements::label_selector_matches(&self.selector, labels)
    }
}

/// A preferred pod affinity or anti-affinity term and its weight.
#[derive(Clone, Debug, PartialEq)]
pub struct Preferred {
    /// `weight` (1 to 100): what a node that meets the term adds to its score.
    pub weight: i32,
    /// The term.
    pub term: PodTerm,
}

/// A topology spread constraint.
#[derive(Clone, Debug, PartialEq)]
pub struct Spread {
    /// Counts pods of the pod's namespace that this term selects, per domain of its key.
    pub term: PodTerm,
    /// `maxSkew` (at least 1).
    pub max_skew: i64,
    /// `whenUnsatisfiable: DoNotSchedule` (else `ScheduleAnyway`, a preference).
    pub hard: bool,
    /// `minDomains`: with fewer eligible domains, the least count is taken as zero.
    pub min_domains: Option<i64>,
    /// `nodeAffinityPolicy: Honor` (the default): only nodes the pod's node selector and
    /// required node affinity accept are domains.
    pub honor_node_affinity: bool,
    /// `nodeTaintsPolicy: Honor` (default `Ignore`): only nodes whose taints the pod
    /// tolerates are domains.
    pub honor_taints: bool,
}

/// A pod's rules on other pods.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodRules {
    /// Required pod affinity: some selected pod runs in the same domain.
    pub affinity: Vec<PodTerm>,
    /// Required pod anti-affinity: no selected pod runs in the same domain (and, the other
    /// way round, the pod goes nowhere a running pod's term selects it).
    pub anti_affinity: Vec<PodTerm>,
    /// Preferred pod affinity.
    pub preferred_affinity: Vec<Preferred>,
    /// Preferred pod anti-affinity.
    pub preferred_anti_affinity: Vec<Preferred>,
    /// Topology spread constraints, hard and preferred.
    pub spread: Vec<Spread>,
}

impl PodRules {
    /// The rules of a pod of `namespace` with `labels` and `spec`.
    pub fn of(namespace: &str, labels: &BTreeMap<String, String>, spec: &PodSpec) -> PodRules {
        let affinity = spec.affinity.as_ref();
        let pod_affinity = affinity.and_then(|a| a.pod_affinity.as_ref());
        let pod_anti = affinity.and_then(|a| a.pod_anti_affinity.as_ref());
        let terms = |list: Option<&Vec<PodAffinityTerm>>| -> Vec<PodTerm> {
            list.into_iter()
                .flatten()
                .filter_map(|t| term(namespace, labels, t))
                .collect()
        };
        let preferred =
            |list: Option<&Vec<k8s_openapi::api::core::v1::WeightedPodAffinityTerm>>| {
                list.into_iter()
                    .flatten()
                    .filter_map(|w| {
                        Some(Preferred {
                            weight: w.weight,
                            term: term(namespace, labels, &w.pod_affinity_term)?,
                        })
                    })
                    .collect()
            };
        PodRules {
            affinity: terms(pod_affinity.and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })),
            anti_affinity: terms(pod_anti.and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })),
            preferred_affinity: preferred(pod_affinity.and_then(|a| {
                a.preferred_during_scheduling_ignored_during_execution
                    .as_ref()
            })),
            preferred_anti_affinity: preferred(pod_anti.and_then(|a| {
                a.preferred_during_scheduling_ignored_during_execution
                    .as_ref()
            })),
            spread: spec
                .topology_spread_constraints
                .iter()
                .flatten()
                .filter_map(|c| spread(namespace, labels, c))
                .collect(),
        }
    }
}

/// `key In [the pod's value]` for each of `keys` the pod has a label for (`matchLabelKeys`),
/// and `key NotIn [value]` for `mismatchLabelKeys`.
fn label_key_requirements(
    labels: &BTreeMap<String, String>,
    keys: Option<&Vec<String>>,
    operator: &str,
) -> Vec<LabelSelectorRequirement> {
    keys.into_iter()
        .flatten()
        .filter_map(|k| {
            Some(LabelSelectorRequirement {
                key: k.clone(),
                operator: operator.to_string(),
                values: Some(vec![labels.get(k)?.clone()]),
            })
        })
        .collect()
}

/// `selector` with `extra` expressions added.
fn narrowed(selector: &LabelSelector, extra: Vec<LabelSelectorRequirement>) -> LabelSelector {
    if extra.is_empty() {
        return selector.clone();
    }
    let mut out = selector.clone();
    out.match_expressions
        .get_or_insert_with(Vec::new)
        .extend(extra);
    out
}

/// A pod affinity term of a pod in `namespace` with `labels`; `None` for a term without a
/// selector (it selects no pod).
fn term(
    namespace: &str,
    labels: &BTreeMap<String, String>,
    t: &PodAffinityTerm,
) -> Option<PodTerm> {
    let selector = t.label_selector.as_ref()?;
    let mut extra = label_key_requirements(labels, t.match_label_keys.as_ref(), "In");
    extra.extend(label_key_requirements(
        labels,
        t.mismatch_label_keys.as_ref(),
        "NotIn",
    ));
    let namespaces = if t.namespace_selector.is_some() {
        Namespaces::All
    } else {
        match t.namespaces.as_ref() {
            Some(ns) if !ns.is_empty() => Namespaces::Listed(ns.clone()),
            _ => Namespaces::Listed(vec![namespace.to_string()]),
        }
    };
    Some(PodTerm {
        key: t.topology_key.clone(),
        selector: narrowed(selector, extra),
        namespaces,
    })
}

/// A topology spread constraint of a pod in `namespace` with `labels`; `None` for one
/// without a selector (it counts no pod: nothing to spread).
fn spread(
    namespace: &str,
    labels: &BTreeMap<String, String>,
    c: &TopologySpreadConstraint,
) -> Option<Spread> {
    let selector = c.label_selector.as_ref()?;
    let extra = label_key_requirements(labels, c.match_label_keys.as_ref(), "In");
    Some(Spread {
        term: PodTerm {
            key: c.topology_key.clone(),
            selector: narrowed(selector, extra),
            namespaces: Namespaces::Listed(vec![namespace.to_string()]),
        },
        max_skew: i64::from(c.max_skew.max(1)),
        hard: c.when_unsatisfiable != "ScheduleAnyway",
        min_domains: c.min_domains.map(i64::from).filter(|n| *n > 0),
        honor_node_affinity: c.node_affinity_policy.as_deref() != Some("Ignore"),
        honor_taints: c.node_taints_policy.as_deref() == Some("Honor"),
    })
}

//! Counting pods per topology domain while packing: every distinct pod term (of affinity,
//! anti-affinity and spread) keeps how many placed pods it selects in each domain of its
//! key, and how many placed pods carry it as required anti-affinity, so that each check of
//! a pod against a node is a few map lookups rather than a walk over every placed pod.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use super::constraints::{PodTerm, Spread};
use super::preferences::Honoured;
use super::{PendingPod, HOSTNAME_TOPOLOGY};

/// A domain of one topology key: an interned label value, or one node for the hostname.
pub(crate) type Domain = u32;

/// The term ids of one pod, and which terms select it.
#[derive(Clone, Debug, Default)]
pub(crate) struct PodView {
    /// Terms that select this pod (it counts towards them once placed).
    pub matches: Vec<usize>,
    /// Its required pod affinity terms.
    pub affinity: Vec<usize>,
    /// Its required pod anti-affinity terms.
    pub anti: Vec<usize>,
    /// Its preferred pod affinity terms.
    pub preferred_affinity: Vec<usize>,
    /// Its preferred pod anti-affinity terms.
    pub preferred_anti: Vec<usize>,
    /// Its spread constraints: the index in `rules.spread` and the term id.
    pub spread: Vec<(usize, usize)>,
    /// Required anti-affinity terms (of any pod) that select this pod.
    pub repelled_by: Vec<usize>,
}

/// A hash of everything that tells terms apart: key, namespaces and selector.
fn term_hash(term: &PodTerm) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    term.key.hash(&mut h);
    term.namespaces.hash(&mut h);
    term.selector.match_labels.hash(&mut h);
    for e in term.selector.match_expressions.iter().flatten() {
        (&e.key, &e.operator, &e.values).hash(&mut h);
    }
    h.finish()
}

/// The preferred `terms` of a pod that `honours` (by `is`) keeps.
fn honoured<'v>(
    terms: &'v [usize],
    honours: &'v Honoured,
    is: fn(&Honoured, usize) -> bool,
) -> impl Iterator<Item = &'v usize> + 'v {
    terms
        .iter()
        .enumerate()
        .filter(move |(k, _)| is(honours, *k))
        .map(|(_, t)| t)
}

/// The counts of every term, by domain.
#[derive(Debug, Default)]
pub(crate) struct Topology {
    keys: Vec<String>,
    terms: Vec<PodTerm>,
    term_key: Vec<usize>,
    /// Term ids by [`term_hash`] (equal hashes are told apart by comparing the terms).
    by_hash: HashMap<u64, Vec<usize>>,
    counts: Vec<HashMap<Domain, i32>>,
    totals: Vec<i32>,
    owners: Vec<HashMap<Domain, i32>>,
    values: HashMap<(usize, String), Domain>,
    next: Domain,
}

impl Topology {
    /// The topology of `pods`: the first `placing` are to be placed, the rest are already
    /// on nodes. The terms of the pods to place and the required anti-affinity of all, and
    /// each pod's view of them.
    pub(crate) fn new(pods: &[&PendingPod], placing: usize) -> (Topology, Vec<PodView>) {
        let mut t = Topology::default();
        let mut views: Vec<PodView> = pods
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let r = &p.rules;
                let mut ids = |terms: &[PodTerm]| terms.iter().map(|x| t.intern(x)).collect();
                if i >= placing {
                    // A pod already placed constrains the others only by its required
                    // anti-affinity (as the kube-scheduler checks an incoming pod).
                    return PodView {
                        anti: ids(&r.anti_affinity),
                        ..PodView::default()
                    };
                }
                PodView {
                    affinity: ids(&r.affinity),
                    anti: ids(&r.anti_affinity),
                    preferred_affinity: r
                        .preferred_affinity
                        .iter()
                        .map(|p| t.intern(&p.term))
                        .collect(),
                    preferred_anti: r
                        .preferred_anti_affinity
                        .iter()
                        .map(|p| t.intern(&p.term))
                        .collect(),
                    spread: r
                        .spread
                        .iter()
                        .enumerate()
                        .map(|(i, s)| (i, t.intern(&s.term)))
                        .collect(),
                    ..PodView::default()
                }
            })
            .collect();
        let mut required_anti = vec![false; t.terms.len()];
        for v in &views {
            for a in &v.anti {
                required_anti[*a] = true;
            }
        }
        for (p, v) in pods.iter().zip(views.iter_mut()) {
            v.matches = (0..t.terms.len())
                .filter(|i| t.terms[*i].selects(&p.namespace, &p.labels))
                .collect();
            v.repelled_by = v
                .matches
                .iter()
                .copied()
                .filter(|i| required_anti[*i])
                .collect();
        }
        t.counts = vec![HashMap::new(); t.terms.len()];
        t.owners = vec![HashMap::new(); t.terms.len()];
        t.totals = vec![0; t.terms.len()];
        (t, views)
    }

    fn intern(&mut self, term: &PodTerm) -> usize {
        let hash = term_hash(term);
        if let Some(i) = self
            .by_hash
            .get(&hash)
            .and_then(|ids| ids.iter().find(|i| self.terms[**i] == *term))
        {
            return *i;
        }
        let key = match self.keys.iter().position(|k| *k == term.key) {
            Some(k) => k,
            None => {
                self.keys.push(term.key.clone());
                self.keys.len() - 1
            }
        };
        self.terms.push(term.clone());
        self.term_key.push(key);
        self.by_hash
            .entry(hash)
            .or_default()
            .push(self.terms.len() - 1);
        self.terms.len() - 1
    }

    /// The topology keys the terms use.
    pub(crate) fn keys(&self) -> &[String] {
        &self.keys
    }

    /// The key id of a term.
    pub(crate) fn key_of(&self, term: usize) -> usize {
        self.term_key[term]
    }

    /// The domains of a node with `labels` for every key (a new one for the hostname).
    pub(crate) fn domains(
        &mut self,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> Vec<Option<Domain>> {
        (0..self.keys.len())
            .map(|k| {
                if self.keys[k] == HOSTNAME_TOPOLOGY {
                    Some(self.fresh())
                } else {
                    labels.get(&self.keys[k]).map(|v| self.value(k, v))
                }
            })
            .collect()
    }

    /// The domain of `value` of key `k`.
    pub(crate) fn value(&mut self, k: usize, value: &str) -> Domain {
        if let Some(d) = self.values.get(&(k, value.to_string())) {
            return *d;
        }
        let d = self.fresh();
        self.values.insert((k, value.to_string()), d);
        d
    }

    fn fresh(&mut self) -> Domain {
        self.next += 1;
        self.next
    }

    /// Whether key `k` is the hostname (every node its own domain).
    pub(crate) fn is_hostname(&self, k: usize) -> bool {
        self.keys[k] == HOSTNAME_TOPOLOGY
    }

    /// Placed pods `term` selects in `domain`.
    pub(crate) fn count(&self, term: usize, domain: Domain) -> i32 {
        self.counts[term].get(&domain).copied().unwrap_or(0)
    }

    /// For each pod of `views`: whether it has required pod affinity, or a required
    /// affinity term of some pod selects it.
    pub(crate) fn affinity_bound(&self, views: &[PodView]) -> Vec<bool> {
        let mut affinity = vec![false; self.terms.len()];
        for v in views {
            for t in &v.affinity {
                affinity[*t] = true;
            }
        }
        views
            .iter()
            .map(|v| !v.affinity.is_empty() || v.matches.iter().any(|t| affinity[*t]))
            .collect()
    }

    /// Records a pod placed on a node of `domains`.
    pub(crate) fn place(&mut self, view: &PodView, domains: &[Option<Domain>]) {
        for t in &view.matches {
            self.totals[*t] += 1;
            if let Some(d) = domains[self.term_key[*t]] {
                *self.counts[*t].entry(d).or_insert(0) += 1;
            }
        }
        for t in &view.anti {
            if let Some(d) = domains[self.term_key[*t]] {
                *self.owners[*t].entry(d).or_insert(0) += 1;
            }
        }
    }

    /// Whether the pod's pod affinity and anti-affinity allow a node of `domains`
    /// (the preferred terms it still `honours` too): no pod its anti-affinity selects there, none
    /// there whose anti-affinity selects it, and a pod each affinity term selects there —
    /// or, as the kube-scheduler allows, no such pod anywhere and the pod selected by its
    /// own term.
    pub(crate) fn pod_terms_allow(
        &self,
        view: &PodView,
        domains: &[Option<Domain>],
        honours: &Honoured,
    ) -> bool {
        let anti = view
            .anti
            .iter()
            .chain(honoured(&view.preferred_anti, honours, Honoured::anti));
        for t in anti {
            if let Some(d) = domains[self.term_key[*t]] {
                if self.count(*t, d) > 0 {
                    return false;
                }
            }
        }
        for t in &view.repelled_by {
            if let Some(d) = domains[self.term_key[*t]] {
                if self.owners[*t].get(&d).copied().unwrap_or(0) > 0 {
                    return false;
                }
            }
        }
        let affinity = view.affinity.iter().chain(honoured(
            &view.preferred_affinity,
            honours,
            Honoured::affinity,
        ));
        for t in affinity {
            let first = self.totals[*t] == 0 && view.matches.contains(t);
            match domains[self.term_key[*t]] {
                Some(d) if self.count(*t, d) > 0 || first => {}
                None if first => {}
                _ => return false,
            }
        }
        true
    }

    /// Whether one more pod on a node of `domains` keeps the pod's spread constraints
    /// within their skew (the preferred ones it still `honours` too), given the least count of
    /// each constraint over its eligible domains (`least`, by index in `rules.spread`).
    pub(crate) fn spread_allows(
        &self,
        view: &PodView,
        spreads: &[Spread],
        domains: &[Option<Domain>],
        least: &[i32],
        honours: &Honoured,
    ) -> bool {
        view.spread.iter().all(|(i, t)| {
            let s = &spreads[*i];
            if !s.hard && !honours.spread(*i) {
                return true;
            }
            let Some(d) = domains[self.term_key[*t]] else {
                // A node without the key is no domain of the constraint.
                return false;
            };
            let own = i32::from(view.matches.contains(t));
            i64::from(self.count(*t, d) + own - least[*i]) <= s.max_skew
        })
    }

    /// How many placed pods the pod's spread constraints count in the domains of a node:
    /// lower is where they would rather go.
    pub(crate) fn spread_load(&self, view: &PodView, domains: &[Option<Domain>]) -> i64 {
        view.spread
            .iter()
            .map(|(_, t)| {
                domains[self.term_key[*t]]
                    .map(|d| i64::from(self.count(*t, d)))
                    .unwrap_or(0)
            })
            .sum()
    }
}

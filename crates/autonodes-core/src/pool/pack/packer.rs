//! The packing: each pod onto the first node that takes it
//! — the room of existing and in-flight nodes, then new nodes opened in this packing —
//! else onto a new node.
//!
//! A new node is not one node type but the set of candidates that could still be it
//! (cheapest first): each pod added keeps only those that accept it and hold everything
//! packed so far, and the node is the cheapest of them in the end. A node grows into a
//! dearer type only when that type is no dearer for its pods (cost over how often their
//! cpu and memory fit it) or costs no more than a node of its own for the new pod — which
//! a pod that must share one node with its group ([`super::groups`]) cannot have, so for
//! it the node grows into the cheapest type that holds them all — and only within the pool's
//! limits and the types' room. Pods are taken largest and smallest
//! in turn, so that nodes fill their cpu and their pod slots together; pods with required pod
//! affinity and the pods their terms select go before the others.
//!
//! A pod goes only where its node selector, node affinity, tolerations, pod affinity,
//! pod anti-affinity (its own terms and those of pods already there) and topology spread
//! allow ([`super::topology`]). Preferences (preferred affinity terms, `ScheduleAnyway`
//! spread) are honoured first and dropped when the pod fits nowhere with them. Pods whose
//! affinity waits for other pods are tried again once those are placed.

use std::collections::HashMap;

use super::groups::Groups;
use super::preferences::{self, Honoured};
use super::topology::{Domain, PodView, Topology};
use super::{
    accepts, opens_for, selects_node, Amount, Bin, BlockedGroup, Candidate, Limits, NewNode,
    NodeShape, Packing, PendingPod,
};
use crate::requirements;

/// Why a pod found no node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Blocked {
    Limits,
    Capacity,
    Constraints,
    MinValues,
}

/// A node pods are packed onto: an existing or in-flight one (a [`Bin`]), or a new one.
struct Place {
    /// The bin, for an existing node.
    bin: Option<usize>,
    /// Room left (existing nodes).
    free: Amount,
    /// What the pods packed onto it ask for (new nodes).
    total: Amount,
    /// The candidates it could still be, cheapest first (new nodes).
    options: Vec<usize>,
    /// The candidate it is now: the cheapest option that holds `total`.
    chosen: usize,
    /// The most any option allows, per resource (a quick "does not fit").
    ceiling: Amount,
    /// Its domain of every topology key.
    domains: Vec<Option<Domain>>,
    /// The pods packed onto it.
    pods: Vec<String>,
}

/// Whether `a + b` fits into `room`, without building the sum.
fn fits_sum(room: &Amount, a: &Amount, b: &Amount) -> bool {
    room.cpu >= a.cpu + b.cpu
        && room.memory >= a.memory + b.memory
        && room.pods >= a.pods + b.pods
        && (a.extended.is_empty() && b.extended.is_empty() || room.covers(&a.plus(b)))
}

/// Whether a node of `shape` takes the pod, with the preferred node affinity terms it
/// still `honours`.
fn takes(shape: &NodeShape, pod: &PendingPod, honours: &Honoured) -> bool {
    accepts(shape, pod)
        && pod.preferred_terms.iter().enumerate().all(|(k, t)| {
            !honours.node(k) || requirements::term_matches(&t.preference, &shape.labels)
        })
}

/// Whether a node of `shape` is a domain of a spread constraint of the pod
/// (`nodeAffinityPolicy`, `nodeTaintsPolicy`).
fn counts_for(
    shape: &NodeShape,
    pod: &PendingPod,
    honor_affinity: bool,
    honor_taints: bool,
) -> bool {
    let affine = !honor_affinity || selects_node(&shape.labels, pod);
    let tolerated =
        !honor_taints || requirements::tolerates_taints(&pod.tolerations, &shape.taints);
    affine && tolerated
}

/// How much dearer (for the packed pods) a type a new node grows into may be than the one
/// it is: 1 %, so that a catalogue priced by the core and the GiB grows for all its ties.
const GROWTH_TOLERANCE: f64 = 1.01;

/// What a node of `c` costs per copy of `total` it holds: its cost times how many of it
/// `total` needs by its scarcer resource (cpu or memory).
fn price_for(c: &Candidate, total: &Amount) -> f64 {
    let share = |want: i128, have: i128| {
        if want <= 0 {
            0.0
        } else if have <= 0 {
            f64::INFINITY
        } else {
            want as f64 / have as f64
        }
    };
    // Pod slots are no priced resource (every type has as many): they do not count.
    let need = share(total.cpu, c.allocatable.cpu).max(share(total.memory, c.allocatable.memory));
    c.cost as f64 * need
}

/// The domain a node that does not exist yet has of the hostname: no pod is counted there.
const NEW_NODE: Domain = 0;

struct Packer<'a> {
    pods: &'a [&'a PendingPod],
    views: Vec<PodView>,
    bins: &'a [Bin],
    candidates: &'a [Candidate],
    /// Candidate indices, cheapest first.
    by_cost: Vec<usize>,
    /// Each candidate's domains (the hostname as [`NEW_NODE`]).
    candidate_domains: Vec<Vec<Option<Domain>>>,
    limits: &'a Limits,
    nodes: i64,
    used: Amount,
    room: HashMap<&'a str, Option<i64>>,
    topology: Topology,
    places: Vec<Place>,
    /// The pods that must share one node ([`super::groups`]).
    groups: Groups,
    /// Where the first pod of each group went (a place), once it is placed.
    group_place: Vec<Option<usize>>,
}

impl<'a> Packer<'a> {
    /// What pod `i` needs room for where it goes: the whole group's requests for the first
    /// pod of a group that must share a node (the others can only follow it), else its own.
    fn need(&self, i: usize) -> Amount {
        match self.groups.of[i] {
            Some(g) if self.group_place[g].is_none() => self.groups.total[g].clone(),
            _ => self.pods[i].request.clone(),
        }
    }

    fn shape(&self, place: &Place) -> &'a NodeShape {
        match place.bin {
            Some(b) => &self.bins[b].shape,
            None => &self.candidates[place.chosen].shape,
        }
    }

    /// The least count of each spread constraint of pod `i` over its eligible domains:
    /// the nodes and the candidates (a new node of the hostname counts nothing) that the
    /// constraint's policies let count; zero with fewer domains than `minDomains`.
    fn least(&self, i: usize) -> Vec<i32> {
        let pod = self.pods[i];
        let mut out = vec![0; pod.rules.spread.len()];
        for (si, t) in &self.views[i].spread {
            let s = &pod.rules.spread[*si];
            let k = self.topology.key_of(*t);
            let eligible =
                |shape: &NodeShape| counts_for(shape, pod, s.honor_node_affinity, s.honor_taints);
            let mut domains: Vec<Domain> = self
                .places
                .iter()
                .filter(|p| eligible(self.shape(p)))
                .filter_map(|p| p.domains[k])
                .collect();
            let new_node = self.candidates.iter().enumerate().filter(|(_, c)| {
                eligible(&c.shape) && opens_for(c, pod) && c.allocatable.covers(&pod.request)
            });
            if self.topology.is_hostname(k) {
                if new_node.clone().next().is_some() {
                    continue;
                }
            } else {
                domains.extend(new_node.filter_map(|(ci, _)| self.candidate_domains[ci][k]));
            }
            domains.sort_unstable();
            domains.dedup();
            let few = s.min_domains.is_some_and(|m| (domains.len() as i64) < m);
            out[*si] = if few {
                0
            } else {
                domains
                    .iter()
                    .map(|d| self.topology.count(*t, *d))
                    .min()
                    .unwrap_or(0)
            };
        }
        out
    }

    fn allows(
        &self,
        i: usize,
        domains: &[Option<Domain>],
        least: &[i32],
        honours: &Honoured,
    ) -> bool {
        let view = &self.views[i];
        self.topology.pod_terms_allow(view, domains, honours)
            && self.topology.spread_allows(
                view,
                &self.pods[i].rules.spread,
                domains,
                least,
                honours,
            )
    }

    /// The cheapest a node of its own costs pod `i` (its selectors, requests, and its
    /// required pod affinity: a pod that may go only where the pods its terms select are
    /// has no node of its own, `i64::MAX`, so the node of those pods grows for it).
    fn cost_alone(
        &self,
        i: usize,
        take: &[bool],
        least: &[i32],
        honours: &Honoured,
        need: &Amount,
    ) -> i64 {
        let pod = self.pods[i];
        // Only a pod that must share one node with its group is sure to have no node of
        // its own; one whose partners may be on several nodes keeps the usual measure, so
        // that it does not grow the first of them into the largest type.
        let bound = self.groups.of[i].is_some() && !self.views[i].affinity.is_empty();
        self.by_cost
            .iter()
            .find(|ci| {
                let c = &self.candidates[**ci];
                take[**ci]
                    && opens_for(c, pod)
                    && c.allocatable.covers(need)
                    && (!bound || self.allows(i, &self.candidate_domains[**ci], least, honours))
            })
            .map(|ci| self.candidates[*ci].cost)
            .unwrap_or(i64::MAX)
    }

    /// Whether the candidates `options` offer as many values as the pool's `minValues`
    /// ask for.
    fn flexible<'o>(&self, options: impl Iterator<Item = &'o usize> + Clone) -> bool {
        self.limits.min_values.iter().all(|r| {
            r.min_values_met(options.clone().map(|ci| &self.candidates[*ci].shape.labels))
                .is_ok()
        })
    }

    fn room_left(&self, ci: usize) -> bool {
        self.room
            .get(self.candidates[ci].node_type.as_str())
            .copied()
            .flatten()
            .is_none_or(|r| r > 0)
    }

    fn take_room(&mut self, ci: usize, n: i64) {
        if let Some(Some(r)) = self.room.get_mut(self.candidates[ci].node_type.as_str()) {
            *r -= n;
        }
    }

    /// Adds pod `i` to the new node `n` if some option holds it: `(options, chosen)`, the
    /// options narrowed to those that take the pod (`take`; `None`: all do). The node stays
    /// the type it is while that holds the pods; else it grows into the cheapest option
    /// that does, if that is no dearer (within [`GROWTH_TOLERANCE`]) for these pods than the type it is (its cost over
    /// how many times the pods' requests fit it, by cpu or memory) or costs no
    /// more than a node of its own for the pod (`alone`). The node must hold `need` besides
    /// its pods (the pod's request, or its group's: [`Packer::need`]).
    fn grow(
        &self,
        n: usize,
        take: Option<&[bool]>,
        alone: i64,
        need: &Amount,
    ) -> Option<(Option<Vec<usize>>, usize)> {
        let place = &self.places[n];
        let total = place.total.plus(need);
        let takes = |ci: usize| take.is_none_or(|t| t[ci]);
        let narrowed = take.map(|_| {
            place
                .options
                .iter()
                .copied()
                .filter(|ci| takes(*ci))
                .collect::<Vec<usize>>()
        });
        let current = &self.candidates[place.chosen];
        if !self.limits.min_values.is_empty() {
            let holding = narrowed
                .as_ref()
                .unwrap_or(&place.options)
                .iter()
                .filter(|ci| self.candidates[**ci].allocatable.covers(&total));
            if !self.flexible(holding) {
                return None;
            }
        }
        if takes(place.chosen) && current.allocatable.covers(&total) {
            return Some((narrowed, place.chosen));
        }
        let options = narrowed.as_ref().unwrap_or(&place.options);
        let price = |c: &Candidate| price_for(c, &total);
        let chosen = *options.iter().find(|ci| {
            let c = &self.candidates[**ci];
            if !c.allocatable.covers(&total) {
                return false;
            }
            let used = self.used.minus(&current.resources).plus(&c.resources);
            (price(c) <= price(current) * GROWTH_TOLERANCE
                || c.cost <= current.cost.saturating_add(alone))
                && (c.node_type == current.node_type || self.room_left(**ci))
                && self.limits.allow(self.nodes, &used)
        })?;
        Some((narrowed, chosen))
    }

    /// Places pod `i`, with the preferences it still `honours`.
    fn try_place(&mut self, i: usize, honours: &Honoured, need: &Amount) -> Result<(), Blocked> {
        let pod = self.pods[i];
        let take: Vec<bool> = self
            .candidates
            .iter()
            .map(|c| takes(&c.shape, pod, honours))
            .collect();
        let least = self.least(i);
        let alone = self.cost_alone(i, &take, &least, honours, need);
        // Options need narrowing only for a pod some candidate does not take.
        let take_some = (!take.iter().all(|t| *t)).then_some(take.as_slice());
        for n in 0..self.places.len() {
            let place = &self.places[n];
            match place.bin {
                Some(b) => {
                    if !place.free.covers(need)
                        || !takes(&self.bins[b].shape, pod, honours)
                        || !self.allows(i, &place.domains, &least, honours)
                    {
                        continue;
                    }
                    let place = &mut self.places[n];
                    place.free = place.free.minus(&pod.request);
                    self.put(n, i);
                    return Ok(());
                }
                None => {
                    if !fits_sum(&place.ceiling, &place.total, need)
                        || !self.allows(i, &place.domains, &least, honours)
                    {
                        continue;
                    }
                    let Some((options, chosen)) = self.grow(n, take_some, alone, need) else {
                        continue;
                    };
                    let before = self.places[n].chosen;
                    if chosen != before {
                        let old = self.candidates[before].resources.clone();
                        self.used = self
                            .used
                            .minus(&old)
                            .plus(&self.candidates[chosen].resources);
                        self.take_room(before, -1);
                        self.take_room(chosen, 1);
                    }
                    if let Some(options) = options {
                        self.places[n].ceiling = self.ceiling(&options);
                        self.places[n].options = options;
                    }
                    let place = &mut self.places[n];
                    place.total = place.total.plus(&pod.request);
                    place.chosen = chosen;
                    self.put(n, i);
                    return Ok(());
                }
            }
        }
        self.open(i, &take, &least, honours, need)
    }

    fn ceiling(&self, options: &[usize]) -> Amount {
        let mut out = Amount::default();
        for ci in options {
            let a = &self.candidates[*ci].allocatable;
            out.cpu = out.cpu.max(a.cpu);
            out.memory = out.memory.max(a.memory);
            out.pods = out.pods.max(a.pods);
            for (name, v) in &a.extended {
                let have = out.extended.entry(name.clone()).or_insert(0);
                *have = (*have).max(*v);
            }
        }
        out
    }

    /// Places pod `i`, with all its preferences first, then one term fewer each time
    /// ([`preferences::stages`]); the first pod of a group where its whole group fits, else
    /// (the limits or the types' room hold the group back) where it fits itself, as the
    /// kube-scheduler would bind it.
    fn attempt(&mut self, i: usize) -> Result<(), Blocked> {
        let pod = self.pods[i];
        let stages = preferences::stages(pod);
        let group = self.need(i);
        let needs: &[&Amount] = if group == pod.request {
            &[&pod.request]
        } else {
            &[&group, &pod.request]
        };
        let mut last = Blocked::Capacity;
        for need in needs {
            for honours in &stages {
                match self.try_place(i, honours, need) {
                    Ok(()) => return Ok(()),
                    Err(b) => last = b,
                }
            }
        }
        Err(last)
    }

    /// After pod `i` was placed: tries the pods waiting on a term that selects it (and,
    /// as those are placed, the pods waiting on them).
    fn wake_waiters(
        &mut self,
        i: usize,
        waiting: &mut HashMap<usize, Vec<usize>>,
        placed: &mut [bool],
    ) {
        let mut queue = vec![i];
        while let Some(j) = queue.pop() {
            for t in self.views[j].matches.clone() {
                let Some(waiters) = waiting.remove(&t) else {
                    continue;
                };
                for w in waiters {
                    if placed[w] {
                        continue;
                    }
                    if self.attempt(w).is_ok() {
                        placed[w] = true;
                        queue.push(w);
                    }
                }
            }
        }
    }

    /// Opens a new node for pod `i`.
    fn open(
        &mut self,
        i: usize,
        take: &[bool],
        least: &[i32],
        honours: &Honoured,
        need: &Amount,
    ) -> Result<(), Blocked> {
        let pod = self.pods[i];
        let (mut limited, mut full, mut ruled_out) = (false, false, false);
        let mut allowed: Vec<usize> = Vec::new();
        for ci in self.by_cost.clone() {
            let c = &self.candidates[ci];
            if !take[ci] || !opens_for(c, pod) || !c.allocatable.covers(need) {
                continue;
            }
            if !self.room_left(ci) {
                full = true;
                continue;
            }
            if !self
                .limits
                .allow(self.nodes + 1, &self.used.plus(&c.resources))
            {
                limited = true;
                continue;
            }
            if !self.allows(i, &self.candidate_domains[ci], least, honours) {
                ruled_out = true;
                continue;
            }
            allowed.push(ci);
        }
        let view = &self.views[i];
        let Some(best) = allowed.iter().copied().min_by_key(|ci| {
            self.topology
                .spread_load(view, &self.candidate_domains[*ci])
        }) else {
            return Err(if limited {
                Blocked::Limits
            } else if full {
                Blocked::Capacity
            } else if ruled_out {
                Blocked::Constraints
            } else {
                Blocked::Capacity
            });
        };
        // The node's domains are the chosen candidate's: its options keep them.
        let same = |ci: &usize| {
            self.candidate_domains[*ci]
                .iter()
                .zip(&self.candidate_domains[best])
                .all(|(a, b)| a == b)
        };
        let options: Vec<usize> = allowed.iter().copied().filter(same).collect();
        if !self.flexible(options.iter()) {
            return Err(Blocked::MinValues);
        }
        let domains = self.topology.domains(&self.candidates[best].shape.labels);
        let ceiling = self.ceiling(&options);
        self.nodes += 1;
        self.used = self.used.plus(&self.candidates[best].resources);
        self.take_room(best, 1);
        self.places.push(Place {
            bin: None,
            free: Amount::default(),
            total: pod.request.clone(),
            options,
            chosen: best,
            ceiling,
            domains,
            pods: Vec::new(),
        });
        self.put(self.places.len() - 1, i);
        Ok(())
    }

    /// Records pod `i` on place `n`.
    fn put(&mut self, n: usize, i: usize) {
        if let Some(g) = self.groups.of[i] {
            self.group_place[g].get_or_insert(n);
        }
        self.topology.place(&self.views[i], &self.places[n].domains);
        self.places[n].pods.push(self.pods[i].key.clone());
    }
}

/// `sorted` (largest first) taken from both ends in turn: largest, smallest, second
/// largest, second smallest, ... Large pods alone fill a node's cpu long before its pod
/// slots; taken with small ones, nodes fill both together and fewer are needed.
fn largest_and_smallest(sorted: Vec<usize>) -> Vec<usize> {
    let mut out = Vec::with_capacity(sorted.len());
    let (mut front, mut back) = (0, sorted.len());
    while front < back {
        out.push(sorted[front]);
        front += 1;
        if front < back {
            back -= 1;
            out.push(sorted[back]);
        }
    }
    out
}

/// The report of a group of `pods` (`members`, asking `total`) that no node holds: no
/// existing node (`bins`) or candidate that takes every member has room for them all.
/// `None` when one does.
fn blocked_group(
    pods: &[&PendingPod],
    members: &[usize],
    total: &Amount,
    bins: &[Bin],
    candidates: &[Candidate],
) -> Option<BlockedGroup> {
    let all = |shape: &NodeShape| members.iter().all(|m| accepts(shape, pods[*m]));
    let takes_all = |c: &&Candidate| all(&c.shape);
    if bins.iter().any(|b| all(&b.shape) && b.free.covers(total))
        || candidates
            .iter()
            .filter(takes_all)
            .any(|c| c.allocatable.covers(total))
    {
        return None;
    }
    let largest = candidates
        .iter()
        .filter(takes_all)
        .max_by(|a, b| {
            (a.allocatable.cpu, a.allocatable.memory)
                .cmp(&(b.allocatable.cpu, b.allocatable.memory))
        })
        .map(|c| (c.node_type.clone(), c.allocatable.clone()));
    Some(BlockedGroup {
        pods: members.iter().map(|m| pods[*m].key.clone()).collect(),
        request: total.clone(),
        largest,
    })
}

/// Packs `pods` (all of them: the caller decides which are the pool's) onto the room of
/// `bins`, then onto new nodes of `candidates` within `limits` given the pool's `usage`
/// (nodes, resources).
pub(crate) fn place(
    pods: &[&PendingPod],
    bins: &[Bin],
    candidates: &[Candidate],
    limits: &Limits,
    usage: (i64, Amount),
) -> Packing {
    let residents: Vec<&PendingPod> = bins.iter().flat_map(|b| b.residents.iter()).collect();
    let everyone: Vec<&PendingPod> = pods.iter().copied().chain(residents).collect();
    let (mut topology, mut views) = Topology::new(&everyone, pods.len());
    let resident_views = views.split_off(pods.len());
    let groups = super::groups::must_share(pods, &views, &resident_views, &topology);
    let mut places = Vec::new();
    let mut r = 0;
    for (b, bin) in bins.iter().enumerate() {
        let domains = topology.domains(&bin.shape.labels);
        for _ in &bin.residents {
            topology.place(&resident_views[r], &domains);
            r += 1;
        }
        places.push(Place {
            bin: Some(b),
            free: bin.free.clone(),
            total: Amount::default(),
            options: Vec::new(),
            chosen: 0,
            ceiling: Amount::default(),
            domains,
            pods: Vec::new(),
        });
    }
    let candidate_domains = candidates
        .iter()
        .map(|c| {
            (0..topology.keys().len())
                .map(|k| {
                    if topology.is_hostname(k) {
                        Some(NEW_NODE)
                    } else {
                        let key = topology.keys()[k].clone();
                        c.shape.labels.get(&key).map(|v| topology.value(k, v))
                    }
                })
                .collect()
        })
        .collect();
    let mut by_cost: Vec<usize> = (0..candidates.len()).collect();
    by_cost.sort_by_key(|ci| candidates[*ci].cost);
    let mut packer = Packer {
        pods,
        views,
        bins,
        candidates,
        by_cost,
        candidate_domains,
        limits,
        nodes: usage.0,
        used: usage.1,
        room: candidates
            .iter()
            .map(|c| (c.node_type.as_str(), c.room))
            .collect(),
        topology,
        places,
        group_place: vec![None; groups.members.len()],
        groups,
    };
    // Pods with required pod affinity, and the pods such terms select, go first: placed
    // after the rest, they would find their partners' nodes full.
    let affine = packer.topology.affinity_bound(&packer.views);
    let mut order = Vec::with_capacity(pods.len());
    for group in [true, false] {
        let mut members: Vec<usize> = (0..pods.len()).filter(|i| affine[*i] == group).collect();
        members.sort_by(|a, b| {
            let (a, b) = (pods[*a], pods[*b]);
            (b.request.cpu, b.request.memory)
                .cmp(&(a.request.cpu, a.request.memory))
                .then_with(|| a.key.cmp(&b.key))
        });
        order.extend(largest_and_smallest(members));
    }
    // The pods of a group that must share a node go one after the other, where the first
    // of them would go, the one the others follow first; a group no node type holds is
    // reported and none of it placed.
    let mut out = Packing::default();
    let mut placed = vec![false; pods.len()];
    let mut seen = vec![false; packer.groups.members.len()];
    let mut grouped = Vec::with_capacity(order.len());
    for i in order {
        let Some(g) = packer.groups.of[i] else {
            grouped.push(i);
            continue;
        };
        if std::mem::replace(&mut seen[g], true) {
            continue;
        }
        let members = &packer.groups.members[g];
        match blocked_group(pods, members, &packer.groups.total[g], bins, candidates) {
            Some(report) => {
                for m in members {
                    placed[*m] = true;
                }
                out.blocked_groups.push(report);
            }
            None => grouped.extend(members.iter().copied()),
        }
    }
    let mut order = grouped;
    // Pods whose required affinity found no partner yet, by the term they wait on: tried
    // again as soon as a pod the term selects is placed, while its partner's node has room.
    let mut waiting: HashMap<usize, Vec<usize>> = HashMap::new();
    loop {
        let mut failed: Vec<(usize, Blocked)> = Vec::new();
        let mut progress = false;
        for i in order {
            if placed[i] {
                continue;
            }
            match packer.attempt(i) {
                Ok(()) => {
                    placed[i] = true;
                    progress = true;
                    packer.wake_waiters(i, &mut waiting, &mut placed);
                }
                Err(why) => {
                    if why == Blocked::Constraints {
                        for t in &packer.views[i].affinity {
                            waiting.entry(*t).or_default().push(i);
                        }
                    }
                    failed.push((i, why));
                }
            }
        }
        failed.retain(|(i, _)| !placed[*i]);
        // Pods waiting for the pods of their affinity go again once those found a node.
        if failed.is_empty() || !progress {
            for (i, why) in failed {
                let key = pods[i].key.clone();
                match why {
                    Blocked::Limits => out.blocked_by_limits.push(key),
                    Blocked::Capacity => out.blocked_by_capacity.push(key),
                    Blocked::Constraints => out.blocked_by_constraints.push(key),
                    Blocked::MinValues => out.blocked_by_min_values.push(key),
                }
            }
            break;
        }
        order = failed.into_iter().map(|(i, _)| i).collect();
    }
    out.outgrown = outgrown(&packer, bins);
    for place in packer.places {
        match place.bin {
            Some(b) if !place.pods.is_empty() => {
                out.placed.insert(bins[b].claim.clone(), place.pods);
            }
            Some(_) => {}
            None => {
                let c = &candidates[place.chosen];
                out.new_nodes.push(NewNode {
                    node_type: c.node_type.clone(),
                    request: place.total,
                    pods: place.pods,
                    requirements: c.requirements.clone(),
                });
            }
        }
    }
    out
}

/// The replaceable bins ([`Bin::replaceable`]) that a group's new node takes the place
/// of: each group that went to a new node takes the first such bin that got no pod and
/// would have taken the group's first pod alone (its partners came after it), by claim
/// with the index the new node will have in `new_nodes`.
fn outgrown(packer: &Packer, bins: &[Bin]) -> Vec<(String, usize)> {
    let new_index: Vec<Option<usize>> = packer
        .places
        .iter()
        .scan(0, |next, p| {
            Some(p.bin.is_none().then(|| {
                *next += 1;
                *next - 1
            }))
        })
        .collect();
    let mut taken = vec![false; bins.len()];
    let mut out = Vec::new();
    for (g, members) in packer.groups.members.iter().enumerate() {
        let Some(n) = packer.group_place[g].and_then(|p| new_index[p]) else {
            continue;
        };
        let first = packer.pods[members[0]];
        let spare = bins.iter().enumerate().position(|(b, bin)| {
            bin.replaceable
                && !taken[b]
                && packer.places[b].pods.is_empty()
                && accepts(&bin.shape, first)
                && bin.free.covers(&first.request)
        });
        if let Some(b) = spare {
            taken[b] = true;
            out.push((bins[b].claim.clone(), n));
        }
    }
    out
}

/// Packs the pending pods a node of the pool would take (some candidate accepts the pod,
/// may open for it and holds its requests; others are not the pool's business) onto the
/// room of existing and in-flight nodes, then onto new nodes of the candidates within
/// `limits` given the pool's `usage` (nodes, resources).
pub fn pack(
    pods: &[PendingPod],
    bins: &[Bin],
    candidates: &[Candidate],
    limits: &Limits,
    usage: (i64, Amount),
) -> Packing {
    let wanted: Vec<&PendingPod> = pods
        .iter()
        .filter(|p| {
            candidates.iter().any(|c| {
                accepts(&c.shape, p) && opens_for(c, p) && c.allocatable.covers(&p.request)
            })
        })
        .collect();
    let mut out = place(&wanted, bins, candidates, limits, usage);
    out.wanted = wanted.len();
    out
}

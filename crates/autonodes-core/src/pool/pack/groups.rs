//! Pods that must share one node: those bound to each other by required pod affinity on
//! the hostname, as the kube-scheduler places them. Each pod of such a group may go only
//! to a node that runs a pod its terms select, and a new node runs none; so once the
//! first of them is bound, every other one can only follow it to its node. The packer
//! therefore finds that first pod a node with room for the whole group ([`must_share`]),
//! and reports a group no node type holds instead of placing part of it.
//!
//! A group is a set of pending pods connected by one such term (the pods that have it and
//! the pods it selects), of which at most one has no such term of its own (the one the
//! others follow, a `cache` its `web` pods need; or none, three replicas that each need
//! another). Left out are pods whose terms select a pod already running (they follow that
//! pod's node); sets joined by two or more terms, which may start on as many nodes (pods
//! that select `a`, and pods that select `b`, each of which may be the first of its kind);
//! and sets with two or more pods free to go anywhere (ten `web` pods that each need one of
//! ten `cache` pods may spread over ten nodes).

use std::collections::{HashMap, HashSet};

use super::topology::{PodView, Topology};
use super::{Amount, PendingPod};

/// The groups of pending pods that must share a node.
#[derive(Debug, Default)]
pub(crate) struct Groups {
    /// Each pod's group, if it has one.
    pub of: Vec<Option<usize>>,
    /// Each group's pods: the one the others follow first, then by key.
    pub members: Vec<Vec<usize>>,
    /// What each group's pods ask for together.
    pub total: Vec<Amount>,
}

/// The required affinity terms of `view` on the hostname.
fn host_terms<'v>(view: &'v PodView, topology: &'v Topology) -> impl Iterator<Item = usize> + 'v {
    view.affinity
        .iter()
        .copied()
        .filter(|t| topology.is_hostname(topology.key_of(*t)))
}

fn root(parent: &mut [usize], mut i: usize) -> usize {
    while parent[i] != i {
        parent[i] = parent[parent[i]];
        i = parent[i];
    }
    i
}

/// The groups of `pods` (with their `views`) that must share one node, given the pods
/// already running (`residents`).
pub(crate) fn must_share(
    pods: &[&PendingPod],
    views: &[PodView],
    residents: &[PodView],
    topology: &Topology,
) -> Groups {
    let mut out = Groups {
        of: vec![None; pods.len()],
        ..Groups::default()
    };
    let wanted: HashSet<usize> = views.iter().flat_map(|v| host_terms(v, topology)).collect();
    if wanted.is_empty() {
        return out;
    }
    // The pending pods each such term selects, and the terms a running pod meets.
    let mut selected: HashMap<usize, Vec<usize>> = HashMap::new();
    for (j, v) in views.iter().enumerate() {
        for t in v.matches.iter().filter(|t| wanted.contains(t)) {
            selected.entry(*t).or_default().push(j);
        }
    }
    let running: HashSet<usize> = residents
        .iter()
        .flat_map(|v| v.matches.iter().copied())
        .filter(|t| wanted.contains(t))
        .collect();
    let mut parent: Vec<usize> = (0..pods.len()).collect();
    let mut follows_running = vec![false; pods.len()];
    for (i, v) in views.iter().enumerate() {
        for t in host_terms(v, topology) {
            if running.contains(&t) {
                follows_running[i] = true;
            }
            for j in selected.get(&t).into_iter().flatten() {
                let (a, b) = (root(&mut parent, i), root(&mut parent, *j));
                parent[a] = b;
            }
        }
    }
    let mut sets: HashMap<usize, Vec<usize>> = HashMap::new();
    for i in 0..pods.len() {
        let r = root(&mut parent, i);
        sets.entry(r).or_default().push(i);
    }
    let mut sets: Vec<Vec<usize>> = sets.into_values().filter(|s| s.len() > 1).collect();
    sets.sort();
    for mut set in sets {
        let free = |i: &usize| host_terms(&views[*i], topology).next().is_none();
        let terms: HashSet<usize> = set
            .iter()
            .flat_map(|i| host_terms(&views[*i], topology))
            .collect();
        if terms.len() != 1
            || set.iter().filter(|i| free(i)).count() > 1
            || set.iter().any(|i| follows_running[*i])
        {
            continue;
        }
        set.sort_by(|a, b| {
            free(b)
                .cmp(&free(a))
                .then_with(|| pods[*a].key.cmp(&pods[*b].key))
        });
        let g = out.members.len();
        let mut total = Amount::default();
        for i in &set {
            out.of[*i] = Some(g);
            total = total.plus(&pods[*i].request);
        }
        out.total.push(total);
        out.members.push(set);
    }
    out
}

/// Whom a pod must share its node with, by required pod affinity on the hostname (its own
/// and that of the pods around it), as the packer sees it.
#[derive(Clone, Debug, PartialEq)]
pub enum Sharing {
    /// Its terms select pods that run already: it may go only to a node of theirs (these
    /// nodes run a pod each term selects).
    Follows {
        /// The nodes, by name.
        nodes: Vec<String>,
    },
    /// It is one of pending pods that must share one node ([`must_share`]).
    Group {
        /// The group's pods, itself among them, the one the others follow first.
        pods: Vec<PendingPod>,
        /// What they ask for together.
        request: Amount,
    },
    /// No such rule binds it to other pods.
    Alone,
}

/// How pending pod `pods[i]` must share a node, given the other pending pods and the
/// pods running on the tenant's nodes (`running`: node name and pod).
pub fn sharing(i: usize, pods: &[PendingPod], running: &[(String, PendingPod)]) -> Sharing {
    let Some(pod) = pods.get(i) else {
        return Sharing::Alone;
    };
    let host_terms: Vec<_> = pod
        .rules
        .affinity
        .iter()
        .filter(|t| t.key == super::HOSTNAME_TOPOLOGY)
        .collect();
    let nodes_of = |term: &super::PodTerm| -> HashSet<&str> {
        running
            .iter()
            .filter(|(_, p)| term.selects(&p.namespace, &p.labels))
            .map(|(n, _)| n.as_str())
            .collect()
    };
    let mut nodes: Option<HashSet<&str>> = None;
    for term in &host_terms {
        let on = nodes_of(term);
        if on.is_empty() {
            continue;
        }
        nodes = Some(match nodes {
            Some(n) => n.intersection(&on).copied().collect(),
            None => on,
        });
    }
    if let Some(nodes) = nodes {
        let mut nodes: Vec<String> = nodes.into_iter().map(str::to_string).collect();
        nodes.sort();
        return Sharing::Follows { nodes };
    }
    let everyone: Vec<&PendingPod> = pods.iter().chain(running.iter().map(|(_, p)| p)).collect();
    let (topology, mut views) = Topology::new(&everyone, pods.len());
    let resident_views = views.split_off(pods.len());
    let groups = must_share(&everyone[..pods.len()], &views, &resident_views, &topology);
    match groups.of[i] {
        Some(g) => Sharing::Group {
            pods: groups.members[g].iter().map(|m| pods[*m].clone()).collect(),
            request: groups.total[g].clone(),
        },
        None => Sharing::Alone,
    }
}

//! The warm VMs of each node type as the NodeType controller last saw them
//! ([`crate::controller::nodetype::warm_pool`]), which claims take from (`nodeclaim::take_warm`), and what each NodePool
//! asks of warm VMs of its own, as its last reconcile decided (the NodeType controller keeps
//! them).
//!
//! Warm VMs are kept in groups: a type's own under the type's name, a pool's under
//! [`autonodes_core::warm::pool::group_key`].

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use k8s_openapi::jiff::Timestamp;

use autonodes_api::NodePoolSpec;
use autonodes_core::warm::{self, WarmVm};

/// What a NodePool asks of warm VMs of its own.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PoolWant {
    /// The pool's namespace.
    pub namespace: String,
    /// The pool's name.
    pub name: String,
    /// The type its warm VMs are of (none: it keeps none).
    pub node_type: Option<String>,
    /// How many it keeps, within its namespace's room.
    pub replicas: i64,
    /// The pool's spec (its properties boot the warm VMs).
    pub spec: NodePoolSpec,
}

/// One group of warm VMs as its last reconcile left it.
#[derive(Default)]
struct Group {
    vms: Vec<WarmVm>,
    /// How many the type's `maxCapacity` let the group keep.
    granted: i64,
}

/// The warm VMs of each group as its type's last reconcile saw them (what claims take), how
/// many claims each type's warm VMs served, and what each pool asks for.
#[derive(Default)]
pub(crate) struct WarmIndex {
    groups: Mutex<HashMap<String, Group>>,
    bound: Mutex<HashMap<String, i64>>,
    pools: Mutex<HashMap<String, PoolWant>>,
    /// The heartbeats of each type's warm VMs as last seen, by VM name.
    beats: Mutex<HashMap<String, BTreeMap<String, warm::Beat>>>,
}

pub(crate) use autonodes_core::warm::pool::GroupCounts;

impl WarmIndex {
    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records the Leases of the warm VMs of `node_type` as listed at `now` (`renewTime` by
    /// VM name) and returns each VM's heartbeat ([`warm::observe_beat`]); VMs whose Lease
    /// is gone are forgotten.
    pub(crate) fn observe_beats(
        &self,
        node_type: &str,
        leases: &BTreeMap<String, Option<Timestamp>>,
        now: Timestamp,
    ) -> BTreeMap<String, warm::Beat> {
        let mut all = Self::lock(&self.beats);
        let before = all.remove(node_type).unwrap_or_default();
        let seen: BTreeMap<String, warm::Beat> = leases
            .iter()
            .filter_map(|(vm, renewed)| {
                let beat = warm::observe_beat(before.get(vm).copied(), *renewed, now)?;
                Some((vm.clone(), beat))
            })
            .collect();
        all.insert(node_type.to_string(), seen.clone());
        seen
    }

    /// The warm VMs of the group `key` a claim may take now, the oldest first.
    pub(crate) fn ready(&self, key: &str, now: Timestamp) -> Vec<String> {
        let mut vms: Vec<WarmVm> = Self::lock(&self.groups)
            .get(key)
            .map(|g| g.vms.clone())
            .unwrap_or_default();
        let mut out = Vec::new();
        while let Some(v) = warm::pick(&vms, now).cloned() {
            vms.retain(|x| x.name != v.name);
            out.push(v.name);
        }
        out
    }

    /// Records that a claim took the warm VM `vm` of the group `key` of `node_type`.
    pub(crate) fn taken(&self, key: &str, node_type: &str, vm: &str) {
        if let Some(g) = Self::lock(&self.groups).get_mut(key) {
            g.vms.retain(|v| v.name != vm);
        }
        *Self::lock(&self.bound)
            .entry(node_type.to_string())
            .or_default() += 1;
    }

    /// Records the warm VMs of the group `key` a reconcile kept, and how many it may keep;
    /// returns the group's counts before.
    pub(crate) fn set(
        &self,
        key: &str,
        vms: Vec<WarmVm>,
        granted: i64,
        now: Timestamp,
    ) -> GroupCounts {
        let mut groups = Self::lock(&self.groups);
        let before = groups.get(key).map(|g| counts(g, now)).unwrap_or_default();
        groups.insert(key.to_string(), Group { vms, granted });
        before
    }

    /// The counts of the group `key` (zeros for a group never kept).
    pub(crate) fn counts(&self, key: &str, now: Timestamp) -> GroupCounts {
        Self::lock(&self.groups)
            .get(key)
            .map(|g| counts(g, now))
            .unwrap_or_default()
    }

    /// How many claims the warm VMs of `node_type` served since the controller started.
    pub(crate) fn bound(&self, node_type: &str) -> i64 {
        Self::lock(&self.bound).get(node_type).copied().unwrap_or(0)
    }

    /// Records what the pool with UID `uid` asks for; returns what it asked before.
    pub(crate) fn want(&self, uid: &str, want: PoolWant) -> Option<PoolWant> {
        Self::lock(&self.pools).insert(uid.to_string(), want)
    }

    /// Forgets the pool with UID `uid` (it keeps no warm VMs and has none left).
    pub(crate) fn forget_pool(&self, uid: &str) -> Option<PoolWant> {
        Self::lock(&self.pools).remove(uid)
    }

    /// What the pool with UID `uid` asks for, if its reconcile said.
    pub(crate) fn pool_want(&self, uid: &str) -> Option<PoolWant> {
        Self::lock(&self.pools).get(uid).cloned()
    }

    /// The pools that ask for warm VMs of `node_type`, by UID.
    pub(crate) fn pools_of_type(&self, node_type: &str) -> BTreeMap<String, PoolWant> {
        Self::lock(&self.pools)
            .iter()
            .filter(|(_, w)| w.node_type.as_deref() == Some(node_type))
            .map(|(uid, w)| (uid.clone(), w.clone()))
            .collect()
    }

    /// The warm VMs the pools of `namespace` other than `except` (a UID) ask for, by type.
    pub(crate) fn namespace_warm(&self, namespace: &str, except: &str) -> BTreeMap<String, i64> {
        let mut out = BTreeMap::new();
        for (uid, w) in Self::lock(&self.pools).iter() {
            if uid == except || w.namespace != namespace {
                continue;
            }
            if let Some(t) = &w.node_type {
                *out.entry(t.clone()).or_default() += w.replicas;
            }
        }
        out
    }
}

fn counts(g: &Group, now: Timestamp) -> GroupCounts {
    GroupCounts {
        current: g.vms.len() as i64,
        ready: g.vms.iter().filter(|v| v.ready(now)).count() as i64,
        granted: g.granted,
        kept: true,
    }
}

//! The stores of remote watches ([`Watched`]): what one watch last delivered, and this
//! process's own writes the watch has not delivered yet, read in its place. The watches
//! themselves start in [`super::watches`].

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::runtime::reflector::{Lookup, ObjectRef, Store};

use autonodes_api::kubevirt::{ObservedDataVolume, ObservedVm, ObservedVmi};

/// Namespace of bootstrap-token Secrets in a tenant.
pub(crate) const TOKEN_NAMESPACE: &str = "kube-system";

/// Objects this process wrote that the watch has not delivered yet, by key: when, and the
/// object as the API server returned it (`None` for a delete).
type WrittenMap<K> = HashMap<ObjectRef<K>, (Instant, Option<Arc<K>>)>;

/// How long a write of this process is read instead of the watch's copy at most (a safety
/// net: the watch delivers it long before, also when a burst of thousands of claims makes
/// it lag by seconds).
pub(crate) const WRITTEN_TTL: Duration = Duration::from_secs(60);

/// How many of an object's latest versions the watch delivered are remembered.
const DELIVERED_KEPT: usize = 8;

/// This process's writes the watch has not delivered yet, and the versions of each object
/// the watch delivered lately: a write whose version the watch delivered before the write
/// was remembered (the watch can be that quick) must not be kept, or it would hide every
/// later version.
pub(super) struct Own<K: kube::runtime::reflector::Lookup + Clone + 'static>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    pending: WrittenMap<K>,
    /// The versions of each object the watch delivered lately, and when the last came;
    /// entries older than [`WRITTEN_TTL`] are pruned (a write is remembered moments after
    /// its version could have been delivered, never a minute).
    delivered: HashMap<ObjectRef<K>, (Instant, VecDeque<String>)>,
    /// When `delivered` was last pruned.
    pruned: Instant,
}

impl<K> Own<K>
where
    K: kube::runtime::reflector::Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    pub(super) fn new() -> Self {
        Own {
            pending: HashMap::new(),
            delivered: HashMap::new(),
            pruned: Instant::now(),
        }
    }

    /// The watch delivered version `version` of `key`.
    pub(super) fn delivered(&mut self, key: ObjectRef<K>, version: Option<String>) {
        let Some(version) = version else { return };
        let ours = self
            .pending
            .get(&key)
            .and_then(|(_, o)| o.as_ref())
            .and_then(|o| resource_version(&**o));
        if ours.as_deref() == Some(version.as_str()) {
            self.pending.remove(&key);
        }
        let (at, seen) = self
            .delivered
            .entry(key)
            .or_insert_with(|| (Instant::now(), VecDeque::new()));
        *at = Instant::now();
        seen.push_back(version);
        if seen.len() > DELIVERED_KEPT {
            seen.pop_front();
        }
        if self.delivered.len() > 256 && self.pruned.elapsed() > WRITTEN_TTL / 6 {
            self.delivered
                .retain(|_, (at, _)| at.elapsed() < WRITTEN_TTL);
            self.pruned = Instant::now();
        }
    }

    /// The watch delivered the deletion of `key`.
    pub(super) fn gone(&mut self, key: &ObjectRef<K>) {
        self.pending.remove(key);
        self.delivered.remove(key);
    }

    /// Remembers this process's write of `key` (`None`: a delete), unless the watch
    /// delivered that version already.
    fn remember(&mut self, key: ObjectRef<K>, obj: Option<Arc<K>>) {
        if let Some(version) = obj.as_deref().and_then(resource_version) {
            if self
                .delivered
                .get(&key)
                .is_some_and(|(_, seen)| seen.contains(&version))
            {
                return;
            }
        }
        if self.pending.len() > 256 {
            self.pending.retain(|_, (at, _)| at.elapsed() < WRITTEN_TTL);
        }
        self.pending.insert(key, (Instant::now(), obj));
    }
}

/// The `resourceVersion` of an object.
pub(super) fn resource_version<K: kube::runtime::reflector::Lookup>(k: &K) -> Option<String> {
    Lookup::resource_version(k).map(|v| v.into_owned())
}

/// [`Own`], shared with the watch task that clears what it delivers.
pub(super) type Written<K> = Arc<Mutex<Own<K>>>;

/// A store filled by one watch, and whether that watch is live.
///
/// The watch delivers this process's own writes a moment after they return; a reconcile
/// in between must not read the older copy (it would create the object again or patch a
/// stale one). What this process wrote is kept aside ([`Watched::wrote`],
/// [`Watched::deleted`]) and read instead of the store's copy until the watch delivers that
/// very version (or the deletion). A watch delivers every version in order, so whatever it
/// shows before ours is older than ours, and whatever comes after finds ours gone. A write
/// the watch delivered before it was remembered is dropped once the store shows that
/// version, and any after [`WRITTEN_TTL`].
pub(crate) struct Watched<K: kube::runtime::reflector::Lookup + Clone + 'static>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    pub(super) store: Store<K>,
    pub(super) dyntype: K::DynamicType,
    pub(super) live: Arc<AtomicBool>,
    pub(super) written: Written<K>,
    pub(super) trim: fn(&mut K),
}

impl<K> Watched<K>
where
    K: kube::runtime::reflector::Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    /// The object `namespace/name` as the watch last saw it (or as this process wrote it
    /// since): `Some(None)` when the live watch has no such object, `None` when the watch is
    /// not live (ask the API server).
    pub(crate) fn get(&self, namespace: Option<&str>, name: &str) -> Option<Option<Arc<K>>> {
        if !self.is_live() {
            return None;
        }
        let key = self.key(namespace, name);
        let stored = self.store.get(&key);
        Some(self.newer(&key, stored))
    }

    /// The objects that match `keep` (with this process's own writes the watch has not
    /// delivered yet), or `None` when the watch is not live.
    pub(crate) fn filter(&self, keep: impl Fn(&K) -> bool) -> Option<Vec<Arc<K>>> {
        if !self.is_live() {
            return None;
        }
        let mut found: HashMap<ObjectRef<K>, Arc<K>> = self
            .store
            .state_filter(|o: &K| keep(o))
            .into_iter()
            .map(|o| (o.to_object_ref(self.dyntype.clone()), o))
            .collect();
        if let Ok(written) = self.written.lock() {
            for key in written.pending.keys() {
                match self.newer_locked(&written.pending, key, self.store.get(key)) {
                    Some(o) if keep(&o) => {
                        found.insert(key.clone(), o);
                    }
                    _ => {
                        found.remove(key);
                    }
                }
            }
        }
        Some(found.into_values().collect())
    }

    /// Remembers an object this process just created or changed, as the API server
    /// returned it, until the watch delivers that version.
    pub(crate) fn wrote(&self, mut obj: K) {
        (self.trim)(&mut obj);
        let key = obj.to_object_ref(self.dyntype.clone());
        if let Ok(mut written) = self.written.lock() {
            written.remember(key, Some(Arc::new(obj)));
        }
    }

    /// Remembers that this process deleted `obj` until the watch delivers the deletion.
    pub(crate) fn deleted(&self, obj: &K) {
        let key = obj.to_object_ref(self.dyntype.clone());
        if let Ok(mut written) = self.written.lock() {
            written.remember(key, None);
        }
    }

    /// True once the watch listed everything and has seen no error since.
    pub(crate) fn is_live(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }

    fn key(&self, namespace: Option<&str>, name: &str) -> ObjectRef<K> {
        let mut key = ObjectRef::new_with(name, self.dyntype.clone());
        if let Some(ns) = namespace {
            key = key.within(ns);
        }
        key
    }

    fn newer(&self, key: &ObjectRef<K>, stored: Option<Arc<K>>) -> Option<Arc<K>> {
        match self.written.lock() {
            Ok(written) => self.newer_locked(&written.pending, key, stored),
            Err(_) => stored,
        }
    }

    /// This process's write of `key` until the watch delivered it, else the store's copy.
    fn newer_locked(
        &self,
        written: &WrittenMap<K>,
        key: &ObjectRef<K>,
        stored: Option<Arc<K>>,
    ) -> Option<Arc<K>> {
        let version = |k: &K| Lookup::resource_version(k).map(|v| v.into_owned());
        match written.get(key) {
            Some((at, ours)) if at.elapsed() < WRITTEN_TTL => match (ours, &stored) {
                // The store shows our very version already.
                (Some(o), Some(s)) if version(o).is_some() && version(o) == version(s) => stored,
                _ => ours.clone(),
            },
            _ => stored,
        }
    }
}

/// Watch caches of a host cluster.
pub(crate) struct HostCache {
    /// VirtualMachines labelled `managed-by=autonodes`, as [`ObservedVm`]s.
    pub vms: Watched<ObservedVm>,
    /// Their VirtualMachineInstances, as [`ObservedVmi`]s.
    pub vmis: Watched<ObservedVmi>,
    /// DataVolumes labelled `managed-by=autonodes` (the VMs' `dataVolumeTemplates`), of
    /// which only the metadata is read; never live on a host without CDI.
    pub data_volumes: Watched<ObservedDataVolume>,
    /// Every Node of the host: labels, taints, cordon, allocatable and readiness only.
    pub nodes: Watched<Node>,
    /// Every pod bound to a host node that has not ended, reduced to its node, its
    /// request ([`autonodes_core::host_capacity::pod_request`]) and its claim and group labels; never live
    /// when autonodes may not watch the host's pods (then host capacity is unknown).
    pub pods: Watched<Pod>,
}

/// Watch caches of a tenant cluster.
pub(crate) struct TenantWatches {
    /// Nodes carrying a claim label (metadata, spec, conditions and addresses).
    pub nodes: Watched<Node>,
    /// autonodes' bootstrap-token Secrets in `kube-system`.
    pub tokens: Watched<Secret>,
}

/// Starts a tenant's watches: the caches, and the tasks that fill them.
pub(crate) type StartTenantWatches =
    Box<dyn Fn() -> (TenantWatches, Vec<tokio::task::JoinHandle<()>>) + Send + Sync>;

/// A tenant cluster's [`TenantWatches`], started the first time a claim reads them: a
/// tenant only its pools use (no claim yet) holds no watch of its Nodes or tokens. The
/// watches stop with the client (when this is dropped).
pub(crate) struct TenantCache {
    watches: std::sync::OnceLock<TenantWatches>,
    start: StartTenantWatches,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl TenantCache {
    /// Caches that `start` starts when first read.
    pub(crate) fn lazy(start: StartTenantWatches) -> TenantCache {
        TenantCache {
            watches: std::sync::OnceLock::new(),
            start,
            tasks: Mutex::new(Vec::new()),
        }
    }

    /// The watches, started now if they were not (their stores answer once they listed;
    /// until then readers ask the API server).
    pub(crate) fn watches(&self) -> &TenantWatches {
        self.watches.get_or_init(|| {
            let (watches, tasks) = (self.start)();
            if let Ok(mut t) = self.tasks.lock() {
                t.extend(tasks);
            }
            watches
        })
    }
}

impl Drop for TenantCache {
    fn drop(&mut self) {
        if let Ok(tasks) = self.tasks.get_mut() {
            for t in tasks.iter() {
                t.abort();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(version: &str) -> Arc<Node> {
        let mut n = Node::default();
        n.metadata.name = Some("n".into());
        n.metadata.resource_version = Some(version.into());
        Arc::new(n)
    }

    fn key() -> ObjectRef<Node> {
        ObjectRef::new("n")
    }

    #[test]
    fn delivered_versions_older_than_the_written_ttl_are_forgotten_once_hundreds_pile_up() {
        let mut own = Own::<Node>::new();
        let Some(long_ago) = Instant::now().checked_sub(WRITTEN_TTL * 2) else {
            return; // a machine up for less than two minutes: nothing can be that old
        };
        for i in 0..300 {
            let k = ObjectRef::new(&format!("old-{i}"));
            own.delivered
                .insert(k, (long_ago, VecDeque::from(["1".to_string()])));
        }
        own.pruned = long_ago;
        own.delivered(key(), Some("7".into()));
        assert_eq!(own.delivered.len(), 1, "only the fresh delivery is left");
        // A write of a version delivered just now is still recognised as delivered.
        own.remember(key(), Some(node("7")));
        assert!(!own.pending.contains_key(&key()));
    }

    #[test]
    fn a_write_is_read_until_the_watch_delivers_its_version_not_before() {
        let mut own = Own::<Node>::new();
        own.remember(key(), Some(node("5")));
        own.delivered(key(), Some("4".into()));
        assert!(
            own.pending.contains_key(&key()),
            "an older version came first"
        );
        own.delivered(key(), Some("5".into()));
        assert!(!own.pending.contains_key(&key()), "ours arrived");
    }

    #[test]
    fn a_write_the_watch_delivered_before_it_was_remembered_is_not_kept() {
        let mut own = Own::<Node>::new();
        own.delivered(key(), Some("5".into()));
        own.delivered(key(), Some("6".into()));
        own.remember(key(), Some(node("5")));
        assert!(
            !own.pending.contains_key(&key()),
            "it would hide version 6 and everything after"
        );
    }

    #[test]
    fn a_delete_is_remembered_until_the_watch_delivers_it() {
        let mut own = Own::<Node>::new();
        own.remember(key(), None);
        own.delivered(key(), Some("7".into()));
        assert!(own.pending.contains_key(&key()));
        own.gone(&key());
        assert!(!own.pending.contains_key(&key()));
    }
}

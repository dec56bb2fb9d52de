//! The simulator's watch caches: one reflector per kind it reads, each drained by a task
//! of its own (so the API server never drops its watch as a slow consumer, however busy
//! the reconciles are), listing from the API server's watch cache (`resourceVersion=0`).
//!
//! A cache also remembers what the simulator's own writes returned and what it deleted,
//! until its watch has caught up: a reconcile woken by one object's event then does not
//! act on a copy of another from before its own last write (a second boot, a second
//! status patch, a create answered 409). Which copy is newer is decided by the
//! `resourceVersion`s as numbers: the etcd revisions a kube-apiserver hands out; the
//! simulator only ever runs against real API servers.

use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{Lookup, ObjectRef, Store};
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::Resource;
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;

/// What the simulator itself did to an object the watch may not have shown yet.
enum Own<K> {
    /// A write (or a read from the API server) returned this copy.
    Wrote(Arc<K>),
    /// The object with this uid was deleted.
    Deleted(String),
}

/// A store filled by one watch, overlaid with the simulator's own writes.
pub(crate) struct Cache<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    store: Store<K>,
    dyntype: K::DynamicType,
    live: AtomicBool,
    own: Mutex<HashMap<ObjectRef<K>, Own<K>>>,
}

/// `a` is older than `b` (both `resourceVersion`s known).
fn is_older<K: Resource>(a: &K, b: &K) -> bool {
    let revision = |o: &K| {
        o.meta()
            .resource_version
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok())
    };
    matches!((revision(a), revision(b)), (Some(a), Some(b)) if a < b)
}

fn uid_is<K: Resource>(obj: &K, uid: &str) -> bool {
    obj.meta().uid.as_deref() == Some(uid)
}

impl<K> Cache<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    fn own(&self) -> MutexGuard<'_, HashMap<ObjectRef<K>, Own<K>>> {
        self.own.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn key(&self, namespace: Option<&str>, name: &str) -> ObjectRef<K> {
        let key = ObjectRef::new_with(name, self.dyntype.clone());
        match namespace {
            Some(ns) => key.within(ns),
            None => key,
        }
    }

    fn key_of(&self, obj: &K) -> ObjectRef<K> {
        obj.to_object_ref(self.dyntype.clone())
    }

    /// The kind's dynamic type.
    pub(crate) fn dyntype(&self) -> K::DynamicType {
        self.dyntype.clone()
    }

    /// The store the watch fills (without the simulator's own writes).
    pub(crate) fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// True once the watch listed everything and has seen no error since.
    pub(crate) fn is_live(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }

    /// The newer of the watch's copy and the one the simulator's own last write returned;
    /// None for an object the simulator deleted.
    fn freshest(&self, key: &ObjectRef<K>, stored: Option<Arc<K>>) -> Option<Arc<K>> {
        match self.own().get(key) {
            None => stored,
            Some(Own::Wrote(mine)) => match stored {
                Some(seen) if !is_older(seen.as_ref(), mine.as_ref()) => Some(seen),
                _ => Some(mine.clone()),
            },
            Some(Own::Deleted(uid)) => stored.filter(|seen| !uid_is(seen.as_ref(), uid)),
        }
    }

    /// The freshest copy of `namespace/name` known (whether or not the watch is live).
    pub(crate) fn get(&self, namespace: Option<&str>, name: &str) -> Option<Arc<K>> {
        let key = self.key(namespace, name);
        let stored = self.store.get(&key);
        self.freshest(&key, stored)
    }

    /// Every object the watch holds, each as its freshest copy.
    pub(crate) fn objects(&self) -> Vec<Arc<K>> {
        self.store
            .state()
            .into_iter()
            .filter_map(|seen| self.freshest(&self.key_of(&seen), Some(seen)))
            .collect()
    }

    /// Remembers what a write (or a read) returned; returns the freshest copy.
    pub(crate) fn wrote(&self, obj: K) -> Arc<K> {
        let key = self.key_of(&obj);
        let obj = Arc::new(obj);
        if let Some(seen) = self.store.get(&key) {
            if !is_older(seen.as_ref(), obj.as_ref()) {
                return seen;
            }
        }
        let mut own = self.own();
        match own.get(&key) {
            Some(Own::Wrote(mine)) if !is_older(mine.as_ref(), obj.as_ref()) => mine.clone(),
            _ => {
                own.insert(key, Own::Wrote(obj.clone()));
                obj
            }
        }
    }

    /// Remembers that the simulator deleted `obj`.
    pub(crate) fn deleted(&self, obj: &K) {
        if let Some(uid) = obj.meta().uid.clone() {
            let key = self.key_of(obj);
            self.own().insert(key, Own::Deleted(uid));
        }
    }

    /// Forgets the simulator's own copies the watch has caught up with.
    fn observed(&self, event: &Event<K>) {
        let mut own = self.own();
        if own.is_empty() {
            return;
        }
        match event {
            Event::Apply(seen) | Event::Delete(seen) => {
                let key = self.key_of(seen);
                let caught_up = match own.get(&key) {
                    Some(Own::Wrote(mine)) => !is_older(seen, mine.as_ref()),
                    Some(Own::Deleted(uid)) => {
                        matches!(event, Event::Delete(_)) || !uid_is(seen, uid)
                    }
                    None => false,
                };
                if caught_up {
                    own.remove(&key);
                }
            }
            // A new list replaced the store: keep only what is still ahead of it.
            Event::InitDone => own.retain(|key, entry| match (entry, self.store.get(key)) {
                (Own::Wrote(mine), Some(seen)) => is_older(seen.as_ref(), mine.as_ref()),
                (Own::Deleted(uid), Some(seen)) => uid_is(seen.as_ref(), uid),
                (_, None) => false,
            }),
            Event::Init | Event::InitApply(_) => {}
        }
    }
}

/// Reads that fall back to the API server.
impl<K> Cache<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    /// From the cache while its watch is live, else from the API server.
    pub(crate) async fn read(
        &self,
        api: &Api<K>,
        name: &str,
    ) -> Result<Option<Arc<K>>, kube::Error> {
        if self.is_live() {
            return Ok(self.get(api.namespace(), name));
        }
        self.fetch(api, name).await
    }

    /// From the cache if it has the object, else from the API server: for an object the
    /// API server just said exists, or one that must exist.
    pub(crate) async fn read_existing(
        &self,
        api: &Api<K>,
        name: &str,
    ) -> Result<Option<Arc<K>>, kube::Error> {
        match self.get(api.namespace(), name) {
            Some(obj) => Ok(Some(obj)),
            None => self.fetch(api, name).await,
        }
    }

    /// From the API server (after a conflict), remembered as the freshest copy.
    pub(crate) async fn fetch(
        &self,
        api: &Api<K>,
        name: &str,
    ) -> Result<Option<Arc<K>>, kube::Error> {
        Ok(api.get_opt(name).await?.map(|obj| self.wrote(obj)))
    }
}

/// Starts the watch of `api` (objects trimmed by `trim`) and the task that drains it;
/// `on_change` sees every object the store changed for, after the store holds the change
/// (after a complete list: every object).
pub(crate) fn spawn<K>(
    what: String,
    api: Api<K>,
    config: watcher::Config,
    dyntype: K::DynamicType,
    trim: fn(&mut K),
    on_change: impl Fn(&K) + Send + 'static,
) -> (Arc<Cache<K>>, JoinHandle<()>)
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    let mut writer = Writer::new(dyntype.clone());
    let cache = Arc::new(Cache {
        store: writer.as_reader(),
        dyntype,
        live: AtomicBool::new(false),
        own: Mutex::new(HashMap::new()),
    });
    let task = tokio::spawn({
        let cache = cache.clone();
        async move {
            let mut events = watcher(api, config.any_semantic())
                .default_backoff()
                .modify(trim)
                .boxed();
            while let Some(event) = events.next().await {
                let event = match event {
                    Ok(event) => event,
                    Err(e) => {
                        cache.live.store(false, Ordering::Release);
                        tracing::debug!(watch = %what, error = %e, "watch error (retrying)");
                        continue;
                    }
                };
                writer.apply_watcher_event(&event);
                cache.observed(&event);
                match &event {
                    Event::Apply(obj) | Event::Delete(obj) => on_change(obj),
                    Event::InitDone => {
                        cache.live.store(true, Ordering::Release);
                        for obj in cache.store.state() {
                            on_change(&obj);
                        }
                    }
                    Event::Init | Event::InitApply(_) => {}
                }
            }
        }
    });
    (cache, task)
}

/// Drops `managedFields` (never read, often the largest part of an object).
pub(crate) fn trim_meta<K: Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn config_map(name: &str, uid: &str, rv: &str, value: &str) -> ConfigMap {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": rv},
            "data": {"v": value},
        }))
        .expect("valid")
    }

    fn value(cm: &ConfigMap) -> &str {
        cm.data
            .as_ref()
            .and_then(|d| d.get("v"))
            .map(String::as_str)
            .unwrap_or_default()
    }

    fn cache() -> (Cache<ConfigMap>, Writer<ConfigMap>) {
        let writer = Writer::default();
        let cache = Cache {
            store: writer.as_reader(),
            dyntype: (),
            live: AtomicBool::new(true),
            own: Mutex::new(HashMap::new()),
        };
        (cache, writer)
    }

    /// The watch shows `[name, uid, resourceVersion, value]`.
    fn see(cache: &Cache<ConfigMap>, writer: &mut Writer<ConfigMap>, what: [&str; 4]) {
        let [name, uid, rv, v] = what;
        let event = Event::Apply(config_map(name, uid, rv, v));
        writer.apply_watcher_event(&event);
        cache.observed(&event);
    }

    fn read(cache: &Cache<ConfigMap>, name: &str) -> Option<String> {
        cache.get(Some("ns"), name).map(|cm| value(&cm).to_string())
    }

    #[test]
    fn an_own_write_is_read_back_until_the_watch_shows_it_or_something_newer() {
        let (cache, mut writer) = cache();
        see(&cache, &mut writer, ["a", "u1", "10", "seen"]);
        let mine = cache.wrote(config_map("a", "u1", "12", "mine"));
        assert_eq!(value(&mine), "mine");
        assert_eq!(read(&cache, "a").as_deref(), Some("mine"));
        // An older event (from before the write) does not hide the write.
        see(&cache, &mut writer, ["a", "u1", "11", "older"]);
        assert_eq!(read(&cache, "a").as_deref(), Some("mine"));
        // The watch catches up: its copy is read, the own one forgotten.
        see(&cache, &mut writer, ["a", "u1", "13", "newer"]);
        assert_eq!(read(&cache, "a").as_deref(), Some("newer"));
        assert!(cache.own().is_empty());
        // A write that returns an older copy than the watch shows is not remembered.
        let kept = cache.wrote(config_map("a", "u1", "12", "stale"));
        assert_eq!(value(&kept), "newer");
        assert!(cache.own().is_empty());
    }

    #[test]
    fn a_created_object_is_read_before_its_watch_event_and_a_deleted_one_is_not() {
        let (cache, mut writer) = cache();
        cache.wrote(config_map("new", "u2", "20", "created"));
        assert_eq!(read(&cache, "new").as_deref(), Some("created"));
        see(&cache, &mut writer, ["new", "u2", "20", "created"]);
        assert!(cache.own().is_empty());
        cache.deleted(&config_map("new", "u2", "20", "created"));
        assert_eq!(read(&cache, "new"), None);
        assert!(cache.objects().is_empty());
        // A new object of the same name is visible at once.
        see(&cache, &mut writer, ["new", "u3", "25", "again"]);
        assert_eq!(read(&cache, "new").as_deref(), Some("again"));
        assert!(cache.own().is_empty());
    }

    #[test]
    fn a_relist_forgets_own_copies_of_objects_that_are_gone() {
        let (cache, mut writer) = cache();
        cache.wrote(config_map("x", "u4", "30", "mine"));
        for event in [Event::Init, Event::InitDone] {
            writer.apply_watcher_event(&event);
            cache.observed(&event);
        }
        assert_eq!(read(&cache, "x"), None);
        assert!(cache.own().is_empty());
    }
}

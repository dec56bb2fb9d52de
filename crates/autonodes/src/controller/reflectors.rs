//! One watch and one store per kind, shared by every controller.
//!
//! Each of autonodes' kinds is watched once: the watch fills one store (the cache every
//! controller reads) and hands each change to the controllers that asked for it. Without
//! this, every `Controller::watches`/`owns` opened a watch of its own — NodeClaims were
//! watched five times, NodeTypes four — and each decoded every object again, and the
//! stores each controller kept could disagree with the one a wake-up came from.
//!
//! Subscribers choose what they get:
//! - [`Reflector::applied`]: objects created or changed (the trigger of the kind's own
//!   controller; a deleted object has nothing left to reconcile);
//! - [`Reflector::touched`]: changes and deletions, as [`Touched`] (what secondary
//!   watches map to the objects they wake).
//!
//! A subscriber that comes after the first list gets every cached object at once, so the
//! order in which controllers start does not matter. A subscriber's channel is unbounded:
//! a slow controller never holds up the others or the cache.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::channel::mpsc;
use futures::{Stream, StreamExt};
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, Resource};

use autonodes_api::capi::{Machine, MachinePool};
use autonodes_api::{NodeClaim, NodePool, NodeProvider, NodeQuota, NodeType};

use super::lenient::{self, Reports};
use crate::remote::watches::Kind;

/// A change of the store as an observer ([`Reflector::observe`]) sees it, in the watch's
/// own task, before any subscriber and before [`Reflector::wait_synced`] resolves.
pub(crate) enum Observed<'a, K> {
    /// The object as the store now holds it.
    Applied(&'a K),
    /// The object left the store.
    Deleted(&'a K),
    /// The store was listed (again): this is everything it holds now.
    Listed(&'a [Arc<K>]),
}

/// What [`Reflector::observe`] takes.
type Observer<K> = Box<dyn FnMut(Observed<'_, K>) + Send>;

/// A change a [`Reflector::touched`] subscriber sees.
#[derive(Debug, Clone)]
pub(crate) enum Touched<K> {
    /// The object was created or changed (or listed).
    Applied(Arc<K>),
    /// The object was deleted.
    Deleted(Arc<K>),
}

impl<K> Touched<K> {
    /// The object, changed or deleted.
    pub(crate) fn object(self) -> Arc<K> {
        match self {
            Touched::Applied(k) | Touched::Deleted(k) => k,
        }
    }
}

struct Subscribers<K> {
    applied: Vec<mpsc::UnboundedSender<Arc<K>>>,
    touched: Vec<mpsc::UnboundedSender<Touched<K>>>,
}

impl<K> Subscribers<K> {
    fn applied(&mut self, obj: &Arc<K>) {
        self.applied
            .retain(|tx| tx.unbounded_send(obj.clone()).is_ok());
        self.touched
            .retain(|tx| tx.unbounded_send(Touched::Applied(obj.clone())).is_ok());
    }

    fn deleted(&mut self, obj: &Arc<K>) {
        self.touched
            .retain(|tx| tx.unbounded_send(Touched::Deleted(obj.clone())).is_ok());
    }
}

/// The one watch of kind `K`: its store, whether it has listed everything once, and the
/// subscribers its changes go to.
pub(crate) struct Reflector<K: Resource<DynamicType = ()> + Clone + 'static> {
    store: Store<K>,
    writer: Mutex<Option<Writer<K>>>,
    subscribers: Arc<Mutex<Subscribers<K>>>,
    synced_tx: tokio::sync::watch::Sender<bool>,
    synced: tokio::sync::watch::Receiver<bool>,
    changes: AtomicU64,
    observer: Mutex<Option<Observer<K>>>,
}

impl<K: Kind> Reflector<K> {
    /// A reflector whose watch has not started yet ([`Reflector::run`] starts it).
    pub(crate) fn new() -> Self {
        let writer = Writer::<K>::default();
        let (synced_tx, synced) = tokio::sync::watch::channel(false);
        Reflector {
            store: writer.as_reader(),
            writer: Mutex::new(Some(writer)),
            subscribers: Arc::new(Mutex::new(Subscribers {
                applied: Vec::new(),
                touched: Vec::new(),
            })),
            synced_tx,
            synced,
            changes: AtomicU64::new(0),
            observer: Mutex::new(None),
        }
    }

    /// Calls `observer` with every change of the store, synchronously in the watch's task:
    /// what it keeps is up to date whenever the store is, including when
    /// [`Reflector::wait_synced`] resolves (a subscriber's channel may still be behind).
    /// Set it before [`Reflector::run`]; it must not block.
    pub(crate) fn observe(&self, observer: impl FnMut(Observed<'_, K>) + Send + 'static) {
        if let Ok(mut o) = self.observer.lock() {
            *o = Some(Box::new(observer));
        }
    }

    /// The cache every controller reads.
    pub(crate) fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// The store, borrowed.
    pub(crate) fn cache(&self) -> &Store<K> {
        &self.store
    }

    /// What marks the store synced (unit tests, whose stores no watch fills).
    #[cfg(test)]
    pub(crate) fn synced_sender(&self) -> &tokio::sync::watch::Sender<bool> {
        &self.synced_tx
    }

    /// Objects as they are created or changed (and every object after each full list).
    ///
    /// A subscriber that comes after the first full list gets every cached object first.
    pub(crate) fn applied(&self) -> impl Stream<Item = Arc<K>> + Send + 'static {
        let (tx, rx) = mpsc::unbounded();
        if let Ok(mut s) = self.subscribers.lock() {
            if *self.synced.borrow() {
                for obj in self.store.state() {
                    let _ = tx.unbounded_send(obj);
                }
            }
            s.applied.push(tx);
        }
        rx
    }

    /// Changes and deletions. A subscriber that comes after the first full list gets every
    /// cached object first.
    pub(crate) fn touched(&self) -> impl Stream<Item = Touched<K>> + Send + 'static {
        let (tx, rx) = mpsc::unbounded();
        if let Ok(mut s) = self.subscribers.lock() {
            if *self.synced.borrow() {
                for obj in self.store.state() {
                    let _ = tx.unbounded_send(Touched::Applied(obj));
                }
            }
            s.touched.push(tx);
        }
        rx
    }

    /// Changes and deletions as objects (for `Controller::watches_shared_stream`).
    pub(crate) fn touched_objects(&self) -> impl Stream<Item = Arc<K>> + Send + 'static {
        self.touched().map(Touched::object)
    }

    /// A number that grows with every change the store took: equal numbers mean an
    /// unchanged store, so what was derived from it may be reused.
    pub(crate) fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// Objects whose spec changed (a new `metadata.generation`), that are marked for
    /// deletion, or that were deleted: what owners of `K` react to, without the status
    /// writes in between.
    pub(crate) fn spec_touched(&self) -> impl Stream<Item = Arc<K>> + Send + 'static {
        let mut seen: HashMap<String, (Option<i64>, bool)> = HashMap::new();
        self.touched().filter_map(move |t| {
            let out = match t {
                Touched::Deleted(k) => {
                    seen.remove(&key_of(&*k));
                    Some(k)
                }
                Touched::Applied(k) => {
                    let meta = k.meta();
                    let state = (meta.generation, meta.deletion_timestamp.is_some());
                    (seen.insert(key_of(&*k), state) != Some(state)).then_some(k)
                }
            };
            futures::future::ready(out)
        })
    }

    /// Whether the store holds its first full list.
    pub(crate) fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Resolves once the store holds its first full list.
    pub(crate) async fn wait_synced(&self) {
        let mut rx = self.synced.clone();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// Runs the watch until the process ends: fills the store and hands every change to
    /// the subscribers. Objects that do not decode are reported to `reports` (when given)
    /// and left out ([`lenient`]). Runs once; a second call returns at once.
    pub(crate) async fn run(&self, client: Client, reports: Option<Reports>) {
        let Some(mut writer) = self.writer.lock().ok().and_then(|mut w| w.take()) else {
            return;
        };
        let reader = writer.as_reader();
        let mut observer = self.observer.lock().ok().and_then(|mut o| o.take());
        let mut events = std::pin::pin!(lenient::events::<K>(&client, reader.clone(), reports));
        while let Some(event) = events.next().await {
            // No controller reads `managedFields`, and with server-side apply they are
            // most of a small object: the cache keeps none.
            let event = match event {
                Ok(e) => e.modify(|o| o.meta_mut().managed_fields = None),
                Err(e) => {
                    tracing::debug!(kind = %K::kind(&()), error = %e, "watch error (retrying)");
                    continue;
                }
            };
            writer.apply_watcher_event(&event);
            if !matches!(event, watcher::Event::Init | watcher::Event::InitApply(_)) {
                self.changes.fetch_add(1, Ordering::AcqRel);
            }
            if let Some(observe) = observer.as_mut() {
                match &event {
                    watcher::Event::Apply(obj) => observe(Observed::Applied(obj)),
                    watcher::Event::Delete(obj) => observe(Observed::Deleted(obj)),
                    watcher::Event::InitDone => observe(Observed::Listed(&reader.state())),
                    watcher::Event::Init | watcher::Event::InitApply(_) => {}
                }
            }
            let Ok(mut subscribers) = self.subscribers.lock() else {
                continue;
            };
            match &event {
                watcher::Event::Apply(obj) => {
                    if let Some(stored) = reader.get(&ObjectRef::from_obj(obj)) {
                        subscribers.applied(&stored);
                    }
                }
                watcher::Event::Delete(obj) => subscribers.deleted(&Arc::new(obj.clone())),
                watcher::Event::InitDone => {
                    for obj in reader.state() {
                        subscribers.applied(&obj);
                    }
                    // Under the subscribers' lock: a subscriber comes either before this
                    // (and got every object above) or after (and replays the store).
                    self.synced_tx.send_replace(true);
                }
                watcher::Event::Init | watcher::Event::InitApply(_) => {}
            }
        }
    }
}

/// The key an object is remembered by: its UID (names are reused), else its name.
fn key_of<K: Resource>(obj: &K) -> String {
    let meta = obj.meta();
    meta.uid
        .clone()
        .or_else(|| meta.name.clone())
        .unwrap_or_default()
}

impl<K: Kind> Default for Reflector<K> {
    fn default() -> Self {
        Self::new()
    }
}

/// The one watch and store of each of autonodes' kinds (this module).
pub(crate) struct Reflectors {
    /// NodeClaims.
    pub claims: Reflector<NodeClaim>,
    /// NodeTypes.
    pub types: Reflector<NodeType>,
    /// NodeProviders.
    pub providers: Reflector<NodeProvider>,
    /// NodePools.
    pub pools: Reflector<NodePool>,
    /// `capi.autonodes.io` MachinePools.
    pub machine_pools: Reflector<MachinePool>,
    /// `capi.autonodes.io` Machines.
    pub machines: Reflector<Machine>,
    /// NodeQuotas.
    pub quotas: Reflector<NodeQuota>,
}

impl Default for Reflectors {
    fn default() -> Self {
        Self::new()
    }
}

impl Reflectors {
    /// Reflectors with empty stores, their watches not started ([`Reflectors::run`]).
    pub(crate) fn new() -> Self {
        Reflectors {
            claims: Reflector::new(),
            types: Reflector::new(),
            providers: Reflector::new(),
            pools: Reflector::new(),
            machine_pools: Reflector::new(),
            machines: Reflector::new(),
            quotas: Reflector::new(),
        }
    }

    /// Runs every watch, those of the Cluster API mirror only with `capi_mirror`.
    /// Undecodable objects are reported (a Machine is only ever written by autonodes and
    /// gets no condition).
    pub(crate) async fn run(&self, client: Client, reports: lenient::Reports, capi_mirror: bool) {
        let capi = async {
            if capi_mirror {
                tokio::join!(
                    self.machine_pools
                        .run(client.clone(), Some(reports.clone())),
                    self.machines.run(client.clone(), None),
                );
            }
        };
        tokio::join!(
            self.claims.run(client.clone(), Some(reports.clone())),
            self.types.run(client.clone(), Some(reports.clone())),
            self.providers.run(client.clone(), Some(reports.clone())),
            self.pools.run(client.clone(), Some(reports.clone())),
            capi,
            self.quotas.run(client.clone(), Some(reports.clone())),
        );
    }
}

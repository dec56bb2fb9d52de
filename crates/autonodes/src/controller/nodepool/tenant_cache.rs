//! Watch caches of a tenant's pods, nodes and DaemonSets for its dynamic pools: one watch
//! per kind and tenant, shared by every pool of the tenant, each object trimmed to what
//! planning reads ([`autonodes_core::pool::tenant_view`]) as it arrives. A reconcile reads
//! the cache, never the tenant.
//!
//! Bounded: a kind with more than [`MAX_TENANT_OBJECTS`] objects empties its cache and
//! stops its watch (`TenantTooLarge`; it starts again after [`RETRY_TOO_LARGE`]). A watch
//! failing within the last [`STALE_AFTER`] makes the tenant `TenantUnreachable`; one that
//! has not listed its kind yet is waited for up to [`FIRST_LIST_WAIT`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use autonodes_api::reasons::PoolReason;
use autonodes_core::pool::plan::Verdict;
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::watcher;
use kube::runtime::WatchStreamExt;

use crate::remote::clients::{remote_error_text, status_message};

/// The most objects of one kind a tenant's cache holds; a tenant with more gets
/// `TenantTooLarge` instead of being planned for.
pub(crate) const MAX_TENANT_OBJECTS: usize = 20_000;
/// How long a cache that has not listed its kind yet is waited for.
pub(crate) const FIRST_LIST_WAIT: Duration = Duration::from_secs(10);
/// How long a watch failure keeps the tenant `TenantUnreachable` without a new one.
pub(crate) const STALE_AFTER: Duration = Duration::from_secs(60);
/// How long a cache stopped for too many objects waits before it watches again.
pub(crate) const RETRY_TOO_LARGE: Duration = Duration::from_secs(300);
/// The longest watch error message kept.
const MAX_MESSAGE: usize = 512;

/// What one cache holds.
struct State<K> {
    /// The objects, by namespace/name.
    objects: HashMap<String, Arc<K>>,
    /// A relist under way: the objects seen so far.
    building: Option<HashMap<String, Arc<K>>>,
    /// Whether the kind was listed once.
    synced: bool,
    /// When the kind went over [`MAX_TENANT_OBJECTS`].
    too_large: Option<Instant>,
    /// The last watch failure, if none succeeded since.
    error: Option<(Instant, String)>,
}

/// A watch cache of one kind of one tenant.
pub(crate) struct Cache<K> {
    kind: &'static str,
    /// A tenant that may not list the kind, or does not serve it, has none of it
    /// (DaemonSets) instead of being unreachable.
    optional: bool,
    state: Mutex<State<K>>,
}

impl<K: Clone> Cache<K> {
    fn new(kind: &'static str, optional: bool) -> Cache<K> {
        Cache {
            kind,
            optional,
            state: Mutex::new(State {
                objects: HashMap::new(),
                building: None,
                synced: false,
                too_large: None,
                error: None,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<K>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the watch stopped for too many objects long enough ago to start again.
    pub(crate) fn wants_restart(&self) -> bool {
        self.lock()
            .too_large
            .is_some_and(|at| at.elapsed() > RETRY_TOO_LARGE)
    }

    /// The objects, once listed; or why they cannot be planned for.
    pub(crate) async fn snapshot(&self) -> Result<Vec<K>, Verdict> {
        let started = Instant::now();
        loop {
            {
                let s = self.lock();
                if s.too_large.is_some() {
                    return Err(Verdict::problem(
                        PoolReason::TenantTooLarge,
                        format!(
                            "the tenant has more than {MAX_TENANT_OBJECTS} {}; dynamic pools plan only for tenants with fewer",
                            self.kind
                        ),
                    ));
                }
                if let Some((at, message)) = &s.error {
                    if at.elapsed() < STALE_AFTER || !s.synced {
                        return Err(Verdict::problem(
                            PoolReason::TenantUnreachable,
                            format!("the tenant's {}: {message}", self.kind),
                        ));
                    }
                }
                if s.synced {
                    return Ok(s.objects.values().map(|o| (**o).clone()).collect());
                }
            }
            if started.elapsed() > FIRST_LIST_WAIT {
                return Err(Verdict::problem(
                    PoolReason::TenantUnreachable,
                    format!(
                        "the tenant's {} were not listed within {} s",
                        self.kind,
                        FIRST_LIST_WAIT.as_secs()
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The inner client error of a watch error.
fn client_error(e: &watcher::Error) -> Option<&kube::Error> {
    match e {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => Some(e),
        _ => None,
    }
}

/// What the pool shows of a watch failure: the tenant's answer as for every tenant call
/// ([`remote_error_text`]: before an answer, only refused, TLS or unreachable).
fn error_text(e: &watcher::Error) -> String {
    match e {
        watcher::Error::InitialListFailed(k) => format!("listing: {}", remote_error_text(k)),
        watcher::Error::WatchStartFailed(k) | watcher::Error::WatchFailed(k) => {
            format!("watching: {}", remote_error_text(k))
        }
        watcher::Error::WatchError(s) => {
            format!("watching: HTTP {}: {}", s.code, status_message(s))
        }
        watcher::Error::NoResourceVersion => "the answer had no resourceVersion".to_string(),
    }
}

/// Whether the tenant refused (401, 403) or does not serve (404) the kind.
fn refused_or_not_served(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::WatchError(s) => [401, 403, 404].contains(&s.code),
        other => client_error(other).is_some_and(|e| {
            crate::remote::clients::forbidden(e)
                || matches!(e, kube::Error::Api(s) if s.code == 404)
        }),
    }
}

/// `namespace/name` of an object.
fn key_of<K: kube::Resource>(o: &K) -> String {
    let m = o.meta();
    format!(
        "{}/{}",
        m.namespace.as_deref().unwrap_or_default(),
        m.name.as_deref().unwrap_or_default()
    )
}

/// Runs the watch of `api` into `cache`, each object trimmed by `trim`, calling `wake`
/// when the objects change or the watch starts or stops failing. Ends when the kind goes
/// over [`MAX_TENANT_OBJECTS`].
pub(crate) fn spawn<K>(
    cluster: String,
    cache: Arc<Cache<K>>,
    api: Api<K>,
    trim: fn(K) -> K,
    wake: impl Fn() + Send + 'static,
) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    tokio::spawn(async move {
        {
            let mut s = cache.lock();
            s.too_large = None;
        }
        let mut stream = watcher(
            api,
            watcher::Config::default().page_size(500).any_semantic(),
        )
        .default_backoff()
        .boxed();
        while let Some(event) = stream.next().await {
            let mut s = cache.lock();
            let mut changed = true;
            match event {
                Ok(watcher::Event::Init) => {
                    s.building = Some(HashMap::new());
                    changed = false;
                }
                Ok(watcher::Event::InitApply(o)) => {
                    let o = trim(o);
                    if let Some(b) = s.building.as_mut() {
                        b.insert(key_of(&o), Arc::new(o));
                    }
                    changed = false;
                }
                Ok(watcher::Event::InitDone) => {
                    if let Some(b) = s.building.take() {
                        s.objects = b;
                    }
                    s.synced = true;
                    s.error = None;
                }
                Ok(watcher::Event::Apply(o)) => {
                    let o = trim(o);
                    s.objects.insert(key_of(&o), Arc::new(o));
                    s.error = None;
                }
                Ok(watcher::Event::Delete(o)) => {
                    s.objects.remove(&key_of(&o));
                    s.error = None;
                }
                Err(e) if cache.optional && refused_or_not_served(&e) => {
                    tracing::debug!(%cluster, kind = cache.kind, error = %e, "autonodes cannot watch the tenant's {}; dynamic pools plan without them", cache.kind);
                    changed = !s.synced || !s.objects.is_empty();
                    s.objects.clear();
                    s.building = None;
                    s.synced = true;
                    s.error = None;
                }
                Err(e) => {
                    tracing::debug!(%cluster, kind = cache.kind, error = %e, "tenant watch error (retrying)");
                    let message: String = error_text(&e).chars().take(MAX_MESSAGE).collect();
                    changed = s.error.is_none();
                    s.error = Some((Instant::now(), message));
                }
            }
            let size = s
                .objects
                .len()
                .max(s.building.as_ref().map_or(0, HashMap::len));
            if size > MAX_TENANT_OBJECTS {
                tracing::warn!(%cluster, kind = cache.kind, "the tenant has more than {MAX_TENANT_OBJECTS} {}; its dynamic pools stop planning and the watch stops", cache.kind);
                s.objects.clear();
                s.building = None;
                s.too_large = Some(Instant::now());
                drop(s);
                wake();
                return;
            }
            drop(s);
            if changed {
                wake();
            }
        }
    })
}

/// The caches of one tenant.
pub(crate) struct TenantCaches {
    /// Its pods.
    pub pods: Arc<Cache<k8s_openapi::api::core::v1::Pod>>,
    /// Its nodes.
    pub nodes: Arc<Cache<k8s_openapi::api::core::v1::Node>>,
    /// Its DaemonSets (none where the tenant may not list them).
    pub daemonsets: Arc<Cache<k8s_openapi::api::apps::v1::DaemonSet>>,
}

impl TenantCaches {
    /// Empty caches, not listed yet.
    pub(crate) fn new() -> TenantCaches {
        TenantCaches {
            pods: Arc::new(Cache::new("pods", false)),
            nodes: Arc::new(Cache::new("nodes", false)),
            daemonsets: Arc::new(Cache::new("daemonsets", true)),
        }
    }

    /// Whether a watch stopped for too many objects may start again.
    pub(crate) fn wants_restart(&self) -> bool {
        self.pods.wants_restart() || self.nodes.wants_restart() || self.daemonsets.wants_restart()
    }
}

impl Default for TenantCaches {
    fn default() -> Self {
        Self::new()
    }
}

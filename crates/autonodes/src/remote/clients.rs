//! Clients for the remote clusters autonodes talks to, built from kubeconfig Secrets and
//! cached until the Secret changes.
//!
//! Secrets are read from exactly two places:
//! - host clusters: the Secret `<clusterRef.cluster>` (key `kubeconfig`) in the service
//!   namespace, or the management cluster itself for `local`;
//! - tenant clusters: the Secret `vc-<vcluster>` (key `config`) in the claim's namespace.
//!
//! Their bytes are untrusted: they go through [`autonodes_core::kubeconfig::check`] and only what it
//! accepts becomes a client (built field by field here, never by kube's kubeconfig loader,
//! which would run `exec` plugins, read files and follow proxies). A refused Secret is a
//! [`ClientError::InvalidKubeconfig`] naming the field, logged once per Secret version.
//!
//! A client is rebuilt when the Secret's `resourceVersion` changes. The Secret is read at
//! most once per [`SECRET_RECHECK`] per cluster (one reader at a time; the others use the
//! cached client), not once per reconcile: RBAC grants only `get` on it, so there is no
//! watch, and a changed or deleted Secret takes effect within that interval. Whoever needs
//! to react to a new client (the watch caches of the remote cluster) registers a
//! [`OnConnect`] hook; the tasks it returns are aborted when the client is replaced or
//! dropped, and the caches it returns travel with the client ([`Remote::cache`]).

use autonodes_api::reasons::ClusterReason;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::Api;
use kube::config::{AuthInfo, Kubeconfig};
use kube::{Client, Config};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

use crate::remote::request_metrics::ClusterKind;
use autonodes_core::kubeconfig::{self, vcluster_service, CheckedKubeconfig, KubeconfigPolicy};

use autonodes_api::{HOST_KUBECONFIG_KEY, LOCAL_HOST_CLUSTER, TENANT_KUBECONFIG_KEY};
/// How long a remote API call may take before the cluster counts as unreachable.
pub(crate) const REMOTE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a kubeconfig Secret read stays good before the next use reads it again.
pub const SECRET_RECHECK: Duration = Duration::from_secs(5);

/// Which cluster a client reaches.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ClusterKey {
    /// A KubeVirt host cluster, by its `clusterRef.cluster` name (`local` included).
    Host(String),
    /// A tenant cluster, by the claim's namespace and the vCluster's name.
    Tenant {
        /// Namespace of the claims (and of the `vc-<name>` Secret).
        namespace: String,
        /// Name of the vCluster.
        vcluster: String,
    },
}

impl ClusterKey {
    /// The `kind`, `namespace` and `cluster` labels of this cluster in metrics: `host`, an
    /// empty namespace and the host's name, or `tenant`, the tenant's namespace and its
    /// vCluster's name.
    pub(crate) fn metric_labels(&self) -> [&str; 3] {
        match self {
            ClusterKey::Host(name) => ["host", "", name],
            ClusterKey::Tenant {
                namespace,
                vcluster,
            } => ["tenant", namespace, vcluster],
        }
    }
}

impl fmt::Display for ClusterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClusterKey::Host(name) => write!(f, "host cluster {name}"),
            ClusterKey::Tenant {
                namespace,
                vcluster,
            } => write!(f, "tenant cluster {namespace}/{vcluster}"),
        }
    }
}

/// Why a client for a remote cluster could not be had.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig Secret does not exist.
    #[error("Secret {namespace}/{name} with the kubeconfig of the {cluster} does not exist")]
    SecretNotFound {
        /// The cluster.
        cluster: ClusterKey,
        /// Namespace of the Secret.
        namespace: String,
        /// Name of the Secret.
        name: String,
    },
    /// The Secret lacks the key, or its kubeconfig cannot be used.
    #[error("Secret {namespace}/{name} holds no usable kubeconfig for the {cluster}: {reason}")]
    InvalidKubeconfig {
        /// The cluster.
        cluster: ClusterKey,
        /// Namespace of the Secret.
        namespace: String,
        /// Name of the Secret.
        name: String,
        /// What is wrong (never the Secret's content).
        reason: String,
    },
    /// The namespace names more tenant clusters than one namespace may.
    #[error("namespace {namespace} already uses {max} tenant clusters, the most one namespace may (--max-tenant-clusters-per-namespace); the {cluster} is not connected")]
    TooManyTenantClusters {
        /// The cluster refused.
        cluster: ClusterKey,
        /// The namespace.
        namespace: String,
        /// The cap.
        max: usize,
    },
    /// Reading the Secret failed.
    #[error("reading Secret {namespace}/{name}: {source}")]
    ReadSecret {
        /// Namespace of the Secret.
        namespace: String,
        /// Name of the Secret.
        name: String,
        /// The API error.
        source: kube::Error,
    },
}

impl ClientError {
    /// The condition reason for this error.
    pub(crate) fn reason(&self) -> ClusterReason {
        match self {
            ClientError::SecretNotFound { .. } => ClusterReason::KubeconfigSecretNotFound,
            ClientError::InvalidKubeconfig { .. } => ClusterReason::InvalidKubeconfig,
            ClientError::ReadSecret { .. } => ClusterReason::KubeconfigSecretUnreadable,
            ClientError::TooManyTenantClusters { .. } => ClusterReason::TooManyTenantClusters,
        }
    }
}

/// A client for one remote cluster, with what autonodes needs to know about it.
#[derive(Clone)]
pub struct Remote {
    /// Which cluster this is.
    pub key: ClusterKey,
    /// The client.
    pub client: Client,
    /// The API server URL from the kubeconfig (`https://host:port`).
    pub server: String,
    /// PEM of the cluster's CA certificate(s) from the kubeconfig, when it has them.
    pub ca_pem: Option<Vec<u8>>,
    /// How a tenant whose kubeconfig names a loopback server is reached instead: through
    /// its vCluster's Service ([`vcluster_service`]); `None` when the server is used as it
    /// is.
    pub via: Option<String>,
    /// The watch caches of this cluster (empty until the [`OnConnect`] hook filled them).
    pub(crate) cache: RemoteCache,
}

/// The watch caches a remote client carries (see [`super::watches`]).
#[derive(Clone, Default)]
pub(crate) enum RemoteCache {
    /// No caches: every read goes to the API server.
    #[default]
    None,
    /// A host cluster's VirtualMachines and VirtualMachineInstances.
    Host(Arc<crate::remote::caches::HostCache>),
    /// A tenant cluster's Nodes and bootstrap tokens.
    Tenant(Arc<crate::remote::caches::TenantCache>),
}

impl Remote {
    /// The host caches, if this is a host client with caches.
    pub(crate) fn host_cache(&self) -> Option<&crate::remote::caches::HostCache> {
        match &self.cache {
            RemoteCache::Host(c) => Some(c),
            _ => None,
        }
    }

    /// The tenant caches, if this is a tenant client with caches (started by this call if
    /// they were not).
    pub(crate) fn tenant_cache(&self) -> Option<&crate::remote::caches::TenantWatches> {
        match &self.cache {
            RemoteCache::Tenant(c) => Some(c.watches()),
            _ => None,
        }
    }
}

impl fmt::Debug for Remote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print credentials: only the cluster and its URL.
        f.debug_struct("Remote")
            .field("key", &self.key)
            .field("server", &self.server)
            .finish()
    }
}

impl Remote {
    /// The API server endpoint as `host:port`, as kubeadm's `apiServerEndpoint` wants it
    /// (see [`endpoint_of`]).
    pub(crate) fn endpoint(&self) -> Result<String, String> {
        endpoint_of(&self.server)
    }
}

/// What an [`OnConnect`] hook started for a new client.
pub(crate) struct Connected {
    /// Tasks that live as long as the client.
    pub tasks: Vec<JoinHandle<()>>,
    /// The caches those tasks fill, handed out with the client.
    pub(crate) cache: RemoteCache,
}

/// Called with every newly built remote client.
pub(crate) type OnConnect = Arc<dyn Fn(&Remote) -> Connected + Send + Sync>;

struct Cached {
    resource_version: String,
    /// When the Secret was last read (`None` for the management cluster itself).
    checked: Option<std::time::Instant>,
    remote: Arc<Remote>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Cached {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// The default of `--max-tenant-clusters-per-namespace`.
pub const DEFAULT_MAX_TENANT_CLUSTERS_PER_NAMESPACE: usize = 10;

/// What the tenant clusters of one namespace, and of all namespaces, may hold of this
/// process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TenantLimits {
    /// The most tenant clusters one namespace's claims and pools are connected to
    /// (`--max-tenant-clusters-per-namespace`).
    pub clusters_per_namespace: usize,
    /// The memory budget of tenant answers ([`crate::remote::budget`]).
    pub(crate) answer_budget: crate::remote::budget::BudgetSize,
}

impl Default for TenantLimits {
    fn default() -> Self {
        TenantLimits {
            clusters_per_namespace: DEFAULT_MAX_TENANT_CLUSTERS_PER_NAMESPACE,
            answer_budget: Default::default(),
        }
    }
}

/// The management cluster as the host of its own VMs (`local`): where warm VMs' agents reach
/// its API server and the CA they verify it with, from the controller's own configuration
/// (its kubeconfig, or the in-cluster service account's).
#[derive(Clone, Debug, Default)]
pub struct LocalHost {
    /// The API server's URL as the controller reaches it (a provider's `guestApiServer`
    /// wins for the guests).
    pub server: String,
    /// PEM of the CA the controller trusts for it (`None`: warm VMs cannot run there).
    pub ca_pem: Option<Vec<u8>>,
}

/// Builds and caches clients for host and tenant clusters.
pub struct ClusterClients {
    mgmt: Client,
    local_host: LocalHost,
    service_namespace: String,
    policy: KubeconfigPolicy,
    cache: Mutex<HashMap<ClusterKey, Cached>>,
    /// The Secret version last refused per cluster, so a refusal is logged once.
    refused: Mutex<HashMap<ClusterKey, String>>,
    /// One lock per cluster, held while its Secret is read.
    readers: Mutex<HashMap<ClusterKey, Arc<Mutex<()>>>>,
    on_connect: std::sync::RwLock<Option<OnConnect>>,
    egress: crate::remote::egress::Egress,
    clusters_per_namespace: usize,
    budget: Arc<crate::remote::budget::AnswerBudget>,
    /// The tenant connections in use, shared by namespaces with the same kubeconfig.
    transports: crate::remote::egress::Transports,
}

impl ClusterClients {
    /// A cache reading host kubeconfigs from `service_namespace` on the management cluster,
    /// accepting kubeconfig Secrets under `policy`, whose clients connect only where
    /// `egress` allows and hold of tenants no more than `limits` allow.
    pub fn new(
        mgmt: Client,
        service_namespace: impl Into<String>,
        policy: KubeconfigPolicy,
        egress: crate::remote::egress::Egress,
        limits: TenantLimits,
    ) -> Self {
        ClusterClients {
            mgmt,
            local_host: LocalHost::default(),
            service_namespace: service_namespace.into(),
            policy,
            cache: Mutex::new(HashMap::new()),
            refused: Mutex::new(HashMap::new()),
            readers: Mutex::new(HashMap::new()),
            on_connect: std::sync::RwLock::new(None),
            egress,
            clusters_per_namespace: limits.clusters_per_namespace,
            budget: Arc::new(crate::remote::budget::AnswerBudget::new(
                limits.answer_budget,
            )),
            transports: Default::default(),
        }
    }

    /// The same, with the management cluster's URL and CA for a `local` host.
    pub fn with_local_host(mut self, local_host: LocalHost) -> Self {
        self.local_host = local_host;
        self
    }

    /// The refusal of a tenant cluster `key` that is not connected yet while its namespace
    /// is connected to as many as one namespace may be.
    fn over_cluster_cap(
        &self,
        cache: &HashMap<ClusterKey, Cached>,
        key: &ClusterKey,
    ) -> Option<ClientError> {
        let ClusterKey::Tenant { namespace, .. } = key else {
            return None;
        };
        if cache.contains_key(key) {
            return None;
        }
        let connected = cache
            .keys()
            .filter(|k| matches!(k, ClusterKey::Tenant { namespace: n, .. } if n == namespace))
            .count();
        (connected >= self.clusters_per_namespace).then(|| ClientError::TooManyTenantClusters {
            cluster: key.clone(),
            namespace: namespace.clone(),
            max: self.clusters_per_namespace,
        })
    }

    /// Registers the hook run for every new client (replacing any earlier hook).
    pub(crate) fn set_on_connect(&self, hook: OnConnect) {
        if let Ok(mut slot) = self.on_connect.write() {
            *slot = Some(hook);
        }
    }

    /// The client of a host cluster (`clusterRef.cluster`).
    pub async fn host(&self, cluster: &str) -> Result<Arc<Remote>, ClientError> {
        let key = ClusterKey::Host(cluster.to_string());
        if cluster == LOCAL_HOST_CLUSTER {
            return self
                .cached_or_build(key, None, || {
                    Ok(Remote {
                        key: ClusterKey::Host(LOCAL_HOST_CLUSTER.into()),
                        client: self.mgmt.clone(),
                        server: self.local_host.server.clone(),
                        ca_pem: self.local_host.ca_pem.clone(),
                        via: None,
                        cache: RemoteCache::None,
                    })
                })
                .await;
        }
        let (ns, name) = (self.service_namespace.clone(), cluster.to_string());
        self.load_from_secret(key, &ns, &name, HOST_KUBECONFIG_KEY)
            .await
    }

    /// The client of the tenant cluster `vcluster` whose claims live in `namespace`.
    pub(crate) async fn tenant(
        &self,
        namespace: &str,
        vcluster: &str,
    ) -> Result<Arc<Remote>, ClientError> {
        let key = ClusterKey::Tenant {
            namespace: namespace.to_string(),
            vcluster: vcluster.to_string(),
        };
        let name = format!("vc-{vcluster}");
        self.load_from_secret(key, namespace, &name, TENANT_KUBECONFIG_KEY)
            .await
    }

    /// Clients currently cached (for watches and sweeps).
    pub async fn cached(&self) -> Vec<Arc<Remote>> {
        self.cache
            .lock()
            .await
            .values()
            .map(|c| c.remote.clone())
            .collect()
    }

    /// Forgets the clients of tenants `keep` does not keep (no claim or pool names them any
    /// more), stopping their watches; returns how many were forgotten. Host clients stay.
    pub(crate) async fn retain_tenants(&self, keep: impl Fn(&ClusterKey) -> bool) -> usize {
        let gone = |k: &ClusterKey| matches!(k, ClusterKey::Tenant { .. }) && !keep(k);
        let mut cache = self.cache.lock().await;
        let before = cache.len();
        cache.retain(|k, _| !gone(k));
        let forgotten = before - cache.len();
        drop(cache);
        self.refused.lock().await.retain(|k, _| !gone(k));
        self.readers.lock().await.retain(|k, _| !gone(k));
        forgotten
    }

    /// Forgets a cached client (e.g. after it turned out unreachable), stopping its tasks.
    pub(crate) async fn forget(&self, key: &ClusterKey) {
        self.cache.lock().await.remove(key);
    }

    async fn load_from_secret(
        &self,
        key: ClusterKey,
        namespace: &str,
        name: &str,
        data_key: &str,
    ) -> Result<Arc<Remote>, ClientError> {
        if let Some(remote) = self.recently_checked(&key).await {
            return Ok(remote);
        }
        // Past the namespace's cap, not even its Secret is read.
        if let Some(refused) = self.over_cluster_cap(&*self.cache.lock().await, &key) {
            return Err(refused);
        }
        // One reader per cluster: the others wait for it and take its client.
        let reader = {
            let mut readers = self.readers.lock().await;
            readers.entry(key.clone()).or_default().clone()
        };
        let _reading = reader.lock().await;
        if let Some(remote) = self.recently_checked(&key).await {
            return Ok(remote);
        }
        let secrets: Api<Secret> = Api::namespaced(self.mgmt.clone(), namespace);
        let secret = match secrets.get_opt(name).await {
            Ok(Some(s)) => s,
            Ok(None) => {
                self.cache.lock().await.remove(&key);
                return Err(ClientError::SecretNotFound {
                    cluster: key,
                    namespace: namespace.into(),
                    name: name.into(),
                });
            }
            Err(source) => {
                return Err(ClientError::ReadSecret {
                    namespace: namespace.into(),
                    name: name.into(),
                    source,
                })
            }
        };
        let rv = secret.metadata.resource_version.clone().unwrap_or_default();
        if let Some(remote) = self.cached_if_current(&key, &rv).await {
            return Ok(remote);
        }
        let invalid = |reason: String| ClientError::InvalidKubeconfig {
            cluster: key.clone(),
            namespace: namespace.into(),
            name: name.into(),
            reason,
        };
        let Some(bytes) = secret.data.as_ref().and_then(|d| d.get(data_key)) else {
            self.refuse(&key, &rv, namespace, name, data_key, "is missing")
                .await;
            return Err(invalid(format!("the Secret has no key `{data_key}`")));
        };
        let checked = match kubeconfig::check(&bytes.0, &self.policy) {
            Ok(c) => c,
            Err(refusal) => {
                self.refuse(&key, &rv, namespace, name, &refusal.field, &refusal.problem)
                    .await;
                return Err(invalid(refusal.to_string()));
            }
        };
        let (checked, via) = match self.through_vcluster_service(&key, checked).await {
            Ok(c) => c,
            Err(why) => {
                self.refuse(&key, &rv, namespace, name, "the server", &why)
                    .await;
                return Err(invalid(why));
            }
        };
        let share = match &key {
            ClusterKey::Tenant { namespace, .. } => Some(self.budget.share(namespace)),
            ClusterKey::Host(_) => None,
        };
        let remote = match build_remote(
            key.clone(),
            &checked,
            via,
            &self.egress,
            share,
            &self.transports,
        ) {
            Ok(r) => r,
            Err(why) => {
                // E.g. a client certificate TLS cannot use (X.509 v1, an unknown key type).
                self.refuse(&key, &rv, namespace, name, "the kubeconfig", &why)
                    .await;
                return Err(invalid(why));
            }
        };
        self.cached_or_build(key, Some(rv), || Ok(remote)).await
    }

    /// A tenant kubeconfig whose server is a loopback address (what the vCluster chart
    /// exports), redirected to the vCluster's Service in the claim's namespace when there
    /// is one ([`vcluster_service::through_service`]); anything else as it is. The error
    /// says why a loopback server cannot be used: a Service of that name that is not a
    /// vCluster's, or none while the tenant address policy refuses loopback.
    async fn through_vcluster_service(
        &self,
        key: &ClusterKey,
        checked: CheckedKubeconfig,
    ) -> Result<(CheckedKubeconfig, Option<String>), String> {
        let ClusterKey::Tenant {
            namespace,
            vcluster,
        } = key
        else {
            return Ok((checked, None));
        };
        if !vcluster_service::server_is_loopback(&checked.server) {
            return Ok((checked, None));
        }
        let services: Api<Service> = Api::namespaced(self.mgmt.clone(), namespace);
        let service = match services.get_opt(vcluster).await {
            Ok(s) => s,
            Err(e) => {
                // E.g. forbidden where the chart's RBAC predates the Service read: the
                // server is then used as it is, and the address policy decides.
                tracing::warn!(cluster = %key, error = %e, "reading the vCluster's Service failed");
                None
            }
        };
        match service {
            Some(svc) => vcluster_service::through_service(&checked, vcluster, namespace, &svc)
                .map(|r| (r.kubeconfig, Some(r.via)))
                .map_err(|why| {
                    format!(
                        "its server {} is a loopback address and {why}",
                        checked.server
                    )
                }),
            None if self.egress.tenant.refuses_loopback() => Err(format!(
                "its server {} is a loopback address (the vCluster chart's default) and there is no vCluster Service {namespace}/{vcluster} to reach it through; set the vCluster's exportKubeConfig.server to an address the controller reaches",
                checked.server
            )),
            None => Ok((checked, None)),
        }
    }

    /// The cached client of a cluster whose Secret was read less than [`SECRET_RECHECK`] ago.
    async fn recently_checked(&self, key: &ClusterKey) -> Option<Arc<Remote>> {
        let cache = self.cache.lock().await;
        cache
            .get(key)
            .filter(|c| c.checked.is_some_and(|t| t.elapsed() < SECRET_RECHECK))
            .map(|c| c.remote.clone())
    }

    /// Drops the cached client of a cluster whose Secret was refused and logs the refusal
    /// once per Secret version: the Secret and the field, never the value.
    async fn refuse(
        &self,
        key: &ClusterKey,
        rv: &str,
        namespace: &str,
        name: &str,
        field: &str,
        problem: &str,
    ) {
        self.cache.lock().await.remove(key);
        let mut refused = self.refused.lock().await;
        if refused.get(key).map(String::as_str) != Some(rv) {
            tracing::warn!(
                cluster = %key,
                secret = %format!("{namespace}/{name}"),
                %field,
                %problem,
                "kubeconfig Secret refused"
            );
            refused.insert(key.clone(), rv.to_string());
        }
    }

    /// The cached client if it was built from Secret version `rv` (now checked again).
    async fn cached_if_current(&self, key: &ClusterKey, rv: &str) -> Option<Arc<Remote>> {
        let mut cache = self.cache.lock().await;
        let c = cache.get_mut(key).filter(|c| c.resource_version == rv)?;
        c.checked = Some(std::time::Instant::now());
        Some(c.remote.clone())
    }

    async fn cached_or_build(
        &self,
        key: ClusterKey,
        rv: Option<String>,
        build: impl FnOnce() -> Result<Remote, ClientError>,
    ) -> Result<Arc<Remote>, ClientError> {
        let checked = rv.as_ref().map(|_| std::time::Instant::now());
        let rv = rv.unwrap_or_default();
        let mut cache = self.cache.lock().await;
        if let Some(c) = cache.get(&key).filter(|c| c.resource_version == rv) {
            return Ok(c.remote.clone());
        }
        if let Some(refused) = self.over_cluster_cap(&cache, &key) {
            return Err(refused);
        }
        let mut remote = build()?;
        let hook = self.on_connect.read().ok().and_then(|h| h.clone());
        let tasks = match hook {
            Some(h) => {
                let connected = h(&remote);
                remote.cache = connected.cache;
                connected.tasks
            }
            None => Vec::new(),
        };
        let remote = Arc::new(remote);
        match &remote.via {
            Some(via) => {
                tracing::info!(cluster = %key, server = %remote.server, %via, "connected to remote cluster")
            }
            None => {
                tracing::info!(cluster = %key, server = %remote.server, "connected to remote cluster")
            }
        }
        cache.insert(
            key,
            Cached {
                resource_version: rv,
                checked,
                remote: remote.clone(),
                tasks,
            },
        );
        Ok(remote)
    }
}

/// Builds a client from a checked kubeconfig, field by field: the server, the inline CA,
/// the inline token or client certificate. No file is read, no command run, no proxy used;
/// every connection goes only where `egress` allows ([`crate::remote::egress`]).
fn build_remote(
    key: ClusterKey,
    kc: &CheckedKubeconfig,
    via: Option<String>,
    egress: &crate::remote::egress::Egress,
    share: Option<Arc<crate::remote::budget::Share>>,
    transports: &crate::remote::egress::Transports,
) -> Result<Remote, String> {
    let config = client_config(kc)?;
    let (kind, policy) = match &key {
        ClusterKey::Host(_) => (ClusterKind::Host, egress.host.clone()),
        ClusterKey::Tenant { .. } => (ClusterKind::Tenant, egress.tenant.clone()),
    };
    let client = crate::remote::egress::guarded_client(
        &config,
        policy,
        egress.management.clone(),
        kind,
        share,
        transports,
    )
    .map_err(|e| format!("cannot build a client: {}", redact(&e.to_string())))?;
    Ok(Remote {
        key,
        client,
        server: kc.server.clone(),
        ca_pem: kc.ca_pem.clone(),
        via,
        cache: RemoteCache::None,
    })
}

/// The kube client configuration of a checked kubeconfig.
pub(crate) fn client_config(kc: &CheckedKubeconfig) -> Result<Config, String> {
    let url: http::Uri = kc
        .server
        .parse()
        .map_err(|_| "the server is not a URL".to_string())?;
    let mut config = Config::new(url);
    config.root_cert = (!kc.ca_der.is_empty()).then(|| kc.ca_der.clone());
    config.accept_invalid_certs = kc.insecure_skip_tls_verify;
    config.tls_server_name = kc.tls_server_name.clone();
    config.proxy_url = None;
    config.read_timeout = None;
    let b64 = base64::engine::general_purpose::STANDARD;
    config.auth_info = AuthInfo {
        token: kc.token.clone().map(secrecy::SecretString::from),
        client_certificate_data: kc
            .client_identity
            .as_ref()
            .map(|id| b64.encode(&id.certificate_pem)),
        client_key_data: kc
            .client_identity
            .as_ref()
            .map(|id| secrecy::SecretString::from(b64.encode(&id.key_pem))),
        ..AuthInfo::default()
    };
    Ok(config)
}

/// The most of a remote server's text that goes into a condition or Event.
const MAX_REMOTE_TEXT: usize = 300;

/// What a failed remote call shows in conditions, Events and logs: the HTTP status and,
/// when the server answered with a Kubernetes `Status`, its reason and (bounded)
/// `message`; for failures before an answer, the local error. Never a response body that
/// is not a `Status`, never a header, never text a decoder quoted from the response.
pub(crate) fn remote_error_text(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.reason == "Failed to parse error data" => {
            format!("HTTP {} (the answer was not a Kubernetes Status)", s.code)
        }
        kube::Error::Api(s) => {
            let message = status_message(s);
            if s.reason.is_empty() {
                format!("HTTP {}: {message}", s.code)
            } else {
                format!("HTTP {} {}: {message}", s.code, bounded(&s.reason, 64))
            }
        }
        kube::Error::SerdeError(de) => format!(
            "the answer could not be decoded (line {}, column {})",
            de.line(),
            de.column()
        ),
        kube::Error::FromUtf8(_) => "the answer was not UTF-8".to_string(),
        // Before an answer: only whether the address was refused, TLS failed, or the
        // server could not be reached (a tenant must not learn which ports are open).
        other => crate::remote::egress::coarse_error(other).to_string(),
    }
}

/// The `message` of a Kubernetes `Status` a remote server sent, bounded and on one line
/// (empty when the answer was not a `Status`).
pub(crate) fn status_message(s: &kube::core::Status) -> String {
    if s.reason == "Failed to parse error data" {
        return String::new();
    }
    bounded(&s.message, MAX_REMOTE_TEXT)
}

/// `text` on one line, at most `max` bytes (an ellipsis marks a cut).
fn bounded(text: &str, max: usize) -> String {
    autonodes_api::conditions::cut(&autonodes_api::conditions::one_line(text), max)
}

/// The server URL and CA PEM of the current context of a kubeconfig *file the operator
/// names* (`autonodes render --tenant-kubeconfig`). The CA comes from
/// `certificate-authority-data`, or, when `base_dir` is given, from the
/// `certificate-authority` file relative to it. Never used for kubeconfig Secrets: those go
/// through [`autonodes_core::kubeconfig::check`].
pub(crate) fn server_and_ca(
    kc: &Kubeconfig,
    base_dir: Option<&std::path::Path>,
) -> Result<(String, Option<Vec<u8>>), String> {
    let context_name = kc
        .current_context
        .clone()
        .or_else(|| kc.contexts.first().map(|c| c.name.clone()))
        .ok_or("it has no current-context and no contexts")?;
    let context = kc
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .and_then(|c| c.context.as_ref())
        .ok_or_else(|| format!("context `{context_name}` is missing"))?;
    let cluster = kc
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)
        .and_then(|c| c.cluster.as_ref())
        .ok_or_else(|| format!("cluster `{}` is missing", context.cluster))?;
    let server = cluster
        .server
        .clone()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| format!("clusters[{}].cluster.server is not set", context.cluster))?;
    let ca = match (
        &cluster.certificate_authority_data,
        &cluster.certificate_authority,
        base_dir,
    ) {
        (Some(data), _, _) => Some(
            base64::engine::general_purpose::STANDARD
                .decode(data.trim())
                .map_err(|_| {
                    format!(
                        "clusters[{}].cluster.certificate-authority-data is not base64",
                        context.cluster
                    )
                })?,
        ),
        (None, Some(file), Some(dir)) => {
            let file = dir.join(file);
            Some(std::fs::read(&file).map_err(|e| format!("reading {}: {e}", file.display()))?)
        }
        _ => None,
    };
    Ok((server, ca))
}

/// The `host:port` of an API server URL, as kubeadm's `apiServerEndpoint` wants it: port
/// 443 when the URL has none, an IPv6 host in brackets.
pub(crate) fn endpoint_of(server: &str) -> Result<String, String> {
    let uri: http::Uri = server
        .parse()
        .map_err(|_| format!("server {server:?} is not a URL"))?;
    let host = uri
        .host()
        .ok_or_else(|| format!("server {server:?} has no host"))?;
    let port = uri.port_u16().unwrap_or(443);
    let host = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_string()
    };
    Ok(format!("{host}:{port}"))
}

/// Replaces every word longer than 40 characters (a token or key could be one) by
/// `<redacted>`.
fn redact(text: &str) -> String {
    text.split_whitespace()
        .map(|w| if w.len() > 40 { "<redacted>" } else { w })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A 401 or 403 from a cluster.
pub(crate) fn forbidden(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 401 || s.code == 403)
}

/// A client that reaches nothing (port 9 on loopback): unit tests' management client, and
/// what in-memory clusters carry (never called).
#[cfg(test)]
pub(crate) fn unreachable_client() -> Client {
    let url = "http://127.0.0.1:9".parse().expect("a valid URL");
    Client::try_from(kube::Config::new(url)).expect("a client can be built")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kubeconfig(server: &str) -> Kubeconfig {
        Kubeconfig::from_yaml(&format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority-data: aGVsbG8=\nusers:\n- name: u\n  user:\n    token: abc\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
        ))
        .expect("valid kubeconfig")
    }

    #[test]
    fn server_and_ca_come_from_the_current_context() {
        let (server, ca) = server_and_ca(&kubeconfig("https://10.1.2.3:6443"), None).expect("ok");
        assert_eq!(server, "https://10.1.2.3:6443");
        assert_eq!(ca.as_deref(), Some(&b"hello"[..]));
    }

    #[test]
    fn endpoint_keeps_the_port_or_defaults_to_443() {
        assert_eq!(
            endpoint_of("https://127.0.0.1:6443").as_deref(),
            Ok("127.0.0.1:6443")
        );
        assert_eq!(
            endpoint_of("https://api.example/").as_deref(),
            Ok("api.example:443")
        );
        assert_eq!(endpoint_of("https://[::1]").as_deref(), Ok("[::1]:443"));
        assert!(endpoint_of("not a url").is_err());
    }

    #[test]
    fn remote_errors_show_the_status_but_never_a_body_that_is_not_a_status() {
        let body = kube::core::Status::failure(
            "<html>Authorization: Bearer s3cr3t-token-echoed</html>",
            "Failed to parse error data",
        )
        .with_code(502);
        let text = remote_error_text(&kube::Error::Api(body.boxed()));
        assert_eq!(text, "HTTP 502 (the answer was not a Kubernetes Status)");

        let status = kube::core::Status::failure(
            "nodes is forbidden: User \"x\" cannot list resource \"nodes\"\nsecond line",
            "Forbidden",
        )
        .with_code(403);
        let text = remote_error_text(&kube::Error::Api(status.boxed()));
        assert!(
            text.starts_with("HTTP 403 Forbidden: nodes is forbidden"),
            "{text}"
        );
        assert!(!text.contains('\n'), "{text}");

        let long = kube::core::Status::failure(&"x".repeat(5000), "BadRequest").with_code(400);
        let text = remote_error_text(&kube::Error::Api(long.boxed()));
        assert!(text.chars().count() < 400, "{}", text.len());

        let de = serde_json::from_str::<u32>("\"s3cr3t-token-echoed\"").expect_err("not a number");
        let text = remote_error_text(&kube::Error::SerdeError(de));
        assert!(!text.contains("s3cr3t"), "{text}");
    }

    #[test]
    fn a_client_config_carries_only_what_the_checked_kubeconfig_holds() {
        let ca = include_str!("../../../autonodes-core/src/kubeconfig/testdata/ca.pem");
        let b64 = base64::engine::general_purpose::STANDARD;
        let text = format!(
            "clusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443\n    certificate-authority-data: {}\nusers:\n- name: u\n  user:\n    token: abc\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n",
            b64.encode(ca)
        );
        let checked =
            autonodes_core::kubeconfig::check(text.as_bytes(), &KubeconfigPolicy::default())
                .expect("accepted");
        let config = client_config(&checked).expect("config");
        assert_eq!(config.cluster_url.to_string(), "https://127.0.0.1:6443/");
        assert_eq!(config.root_cert.as_ref().map(Vec::len), Some(1));
        assert!(!config.accept_invalid_certs);
        assert!(config.proxy_url.is_none());
        assert!(config.auth_info.token_file.is_none());
        assert!(config.auth_info.exec.is_none());
        assert!(config.auth_info.auth_provider.is_none());
        assert!(config.auth_info.impersonate.is_none());
        assert!(config.root_cert_file.is_none());
    }

    #[tokio::test]
    async fn a_vcluster_shaped_client_certificate_kubeconfig_builds_a_client() {
        let b64 = base64::engine::general_purpose::STANDARD;
        let text = format!(
            "clusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443\n    certificate-authority-data: {}\nusers:\n- name: u\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n",
            b64.encode(include_str!("../../../autonodes-core/src/kubeconfig/testdata/ca.pem")),
            b64.encode(include_str!("../../../autonodes-core/src/kubeconfig/testdata/client.pem")),
            b64.encode(include_str!("../../../autonodes-core/src/kubeconfig/testdata/client.key")),
        );
        let checked =
            autonodes_core::kubeconfig::check(text.as_bytes(), &KubeconfigPolicy::default())
                .expect("accepted");
        let remote = build_remote(
            ClusterKey::Host("c".into()),
            &checked,
            None,
            &crate::remote::egress::Egress::default(),
            None,
            &crate::remote::egress::Transports::default(),
        );
        assert!(remote.is_ok(), "{:?}", remote.err());
    }

    #[test]
    fn a_kubeconfig_without_server_is_rejected_with_a_reason() {
        let kc = Kubeconfig::from_yaml(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {}\ncontexts:\n- name: x\n  context:\n    cluster: c\ncurrent-context: x\n",
        )
        .expect("parses");
        let err = server_and_ca(&kc, None).expect_err("no server");
        assert!(err.contains("server is not set"), "{err}");
    }
}

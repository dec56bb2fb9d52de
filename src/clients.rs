//! Clients for the remote clusters autonodes talks to, built from kubeconfig Secrets and
//! cached until the Secret changes.
//!
//! Secrets are read from exactly two places (DESIGN §1):
//! - host clusters: the Secret `<clusterRef.cluster>` (key `kubeconfig`) in the service
//!   namespace, or the management cluster itself for `local`;
//! - tenant clusters: the Secret `vc-<vcluster>` (key `config`) in the claim's namespace.
//!
//! A client is rebuilt when the Secret's `resourceVersion` changes. Whoever needs to react
//! to a new client (e.g. to start watches on the remote cluster) registers a [`OnConnect`]
//! hook; the tasks it returns are aborted when the client is replaced or dropped.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

/// The name that makes a provider's VMs go to the management cluster itself.
pub const LOCAL_CLUSTER: &str = "local";
/// Key of the host kubeconfig in its Secret.
pub const HOST_KUBECONFIG_KEY: &str = "kubeconfig";
/// Key of the tenant kubeconfig in the `vc-<name>` Secret.
pub const TENANT_KUBECONFIG_KEY: &str = "config";
/// How long a remote API call may take before the cluster counts as unreachable.
pub const REMOTE_TIMEOUT: Duration = Duration::from_secs(10);

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
    /// The value of the `cluster` label in metrics: `host/<name>` or
    /// `tenant/<namespace>/<vcluster>`.
    pub fn metric_label(&self) -> String {
        match self {
            ClusterKey::Host(name) => format!("host/{name}"),
            ClusterKey::Tenant {
                namespace,
                vcluster,
            } => format!("tenant/{namespace}/{vcluster}"),
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
    pub fn reason(&self) -> &'static str {
        match self {
            ClientError::SecretNotFound { .. } => "KubeconfigSecretNotFound",
            ClientError::InvalidKubeconfig { .. } => "InvalidKubeconfig",
            ClientError::ReadSecret { .. } => "KubeconfigSecretUnreadable",
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
    pub fn endpoint(&self) -> Result<String, String> {
        endpoint_of(&self.server)
    }
}

/// Called with every newly built remote client; returns tasks that live as long as the client.
pub type OnConnect = Arc<dyn Fn(&Remote) -> Vec<JoinHandle<()>> + Send + Sync>;

struct Cached {
    resource_version: String,
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

/// Builds and caches clients for host and tenant clusters.
pub struct ClusterClients {
    mgmt: Client,
    service_namespace: String,
    cache: Mutex<HashMap<ClusterKey, Cached>>,
    on_connect: std::sync::RwLock<Option<OnConnect>>,
}

impl ClusterClients {
    /// A cache reading host kubeconfigs from `service_namespace` on the management cluster.
    pub fn new(mgmt: Client, service_namespace: impl Into<String>) -> Self {
        ClusterClients {
            mgmt,
            service_namespace: service_namespace.into(),
            cache: Mutex::new(HashMap::new()),
            on_connect: std::sync::RwLock::new(None),
        }
    }

    /// Registers the hook run for every new client (replacing any earlier hook).
    pub fn set_on_connect(&self, hook: OnConnect) {
        if let Ok(mut slot) = self.on_connect.write() {
            *slot = Some(hook);
        }
    }

    /// The namespace holding host-cluster kubeconfig Secrets.
    pub fn service_namespace(&self) -> &str {
        &self.service_namespace
    }

    /// The client of a host cluster (`clusterRef.cluster`).
    pub async fn host(&self, cluster: &str) -> Result<Arc<Remote>, ClientError> {
        let key = ClusterKey::Host(cluster.to_string());
        if cluster == LOCAL_CLUSTER {
            return self
                .cached_or_build(key, None, || {
                    Ok(Remote {
                        key: ClusterKey::Host(LOCAL_CLUSTER.into()),
                        client: self.mgmt.clone(),
                        server: String::new(),
                        ca_pem: None,
                    })
                })
                .await;
        }
        let (ns, name) = (self.service_namespace.clone(), cluster.to_string());
        self.load_from_secret(key, &ns, &name, HOST_KUBECONFIG_KEY)
            .await
    }

    /// The client of the tenant cluster `vcluster` whose claims live in `namespace`.
    pub async fn tenant(
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

    /// Forgets a cached client (e.g. after it turned out unreachable), stopping its tasks.
    pub async fn forget(&self, key: &ClusterKey) {
        self.cache.lock().await.remove(key);
    }

    async fn load_from_secret(
        &self,
        key: ClusterKey,
        namespace: &str,
        name: &str,
        data_key: &str,
    ) -> Result<Arc<Remote>, ClientError> {
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
        let invalid = |reason: String| ClientError::InvalidKubeconfig {
            cluster: key.clone(),
            namespace: namespace.into(),
            name: name.into(),
            reason,
        };
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(data_key))
            .map(|b| b.0.clone())
            .ok_or_else(|| invalid(format!("the Secret has no key `{data_key}`")))?;
        let text = String::from_utf8(bytes)
            .map_err(|_| invalid(format!("key `{data_key}` is not UTF-8 text")))?;
        let kubeconfig = Kubeconfig::from_yaml(&text)
            .map_err(|e| invalid(format!("key `{data_key}` is not a kubeconfig: {e}")))?;
        let build_key = key.clone();
        let cached = self.cached_if_current(&key, &rv).await;
        if let Some(remote) = cached {
            return Ok(remote);
        }
        let remote = build_remote(build_key, kubeconfig).await.map_err(invalid)?;
        self.cached_or_build(key, Some(rv), || Ok(remote)).await
    }

    async fn cached_if_current(&self, key: &ClusterKey, rv: &str) -> Option<Arc<Remote>> {
        let cache = self.cache.lock().await;
        cache
            .get(key)
            .filter(|c| c.resource_version == rv)
            .map(|c| c.remote.clone())
    }

    async fn cached_or_build(
        &self,
        key: ClusterKey,
        rv: Option<String>,
        build: impl FnOnce() -> Result<Remote, ClientError>,
    ) -> Result<Arc<Remote>, ClientError> {
        let rv = rv.unwrap_or_default();
        let mut cache = self.cache.lock().await;
        if let Some(c) = cache.get(&key).filter(|c| c.resource_version == rv) {
            return Ok(c.remote.clone());
        }
        let remote = Arc::new(build()?);
        let hook = self.on_connect.read().ok().and_then(|h| h.clone());
        let tasks = hook.map(|h| h(&remote)).unwrap_or_default();
        tracing::info!(cluster = %key, server = %remote.server, "connected to remote cluster");
        cache.insert(
            key,
            Cached {
                resource_version: rv,
                remote: remote.clone(),
                tasks,
            },
        );
        Ok(remote)
    }
}

/// Builds a client from a kubeconfig; the error text never contains credentials.
async fn build_remote(key: ClusterKey, kubeconfig: Kubeconfig) -> Result<Remote, String> {
    let (server, ca_pem) = server_and_ca(&kubeconfig, None)?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| format!("cannot load it: {}", redact(&e.to_string())))?;
    let client = Client::try_from(config)
        .map_err(|e| format!("cannot build a client: {}", redact(&e.to_string())))?;
    Ok(Remote {
        key,
        client,
        server,
        ca_pem,
    })
}

/// The server URL and CA PEM of a kubeconfig's current context. The CA comes from
/// `certificate-authority-data`, or, when `base_dir` is given (a kubeconfig file), from the
/// `certificate-authority` file relative to it; kubeconfigs in Secrets cannot name files.
pub fn server_and_ca(
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
pub fn endpoint_of(server: &str) -> Result<String, String> {
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

/// Drops anything after a colon that looks like a token from an error text.
fn redact(text: &str) -> String {
    text.split_whitespace()
        .map(|w| if w.len() > 40 { "<redacted>" } else { w })
        .collect::<Vec<_>>()
        .join(" ")
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
    fn a_kubeconfig_without_server_is_rejected_with_a_reason() {
        let kc = Kubeconfig::from_yaml(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {}\ncontexts:\n- name: x\n  context:\n    cluster: c\ncurrent-context: x\n",
        )
        .expect("parses");
        let err = server_and_ca(&kc, None).expect_err("no server");
        assert!(err.contains("server is not set"), "{err}");
    }
}

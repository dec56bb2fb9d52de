//! A tenant during a run ([`TenantEntry`]): what a guest compares its join against (the
//! endpoint, the CA pins) and the tenant's watch caches (its Nodes, its bootstrap tokens).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Secret};
use kube::api::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher;
use kube::{Client, Config, ResourceExt};
use serde_json::json;
use tokio::task::JoinHandle;

use super::cache::{self, Cache};
use super::guest;
use super::tenant::Tenant;

/// Namespace of the bootstrap-token Secrets.
pub(crate) const TOKEN_NAMESPACE: &str = "kube-system";
/// The type of a bootstrap-token Secret.
const TOKEN_TYPE: &str = "bootstrap.kubernetes.io/token";

/// A tenant with what the guest compares against, and its watch caches.
pub(crate) struct TenantEntry {
    pub(crate) tenant: Tenant,
    pub(crate) endpoint: Option<(String, u16)>,
    pub(crate) ca_hashes: Result<Vec<String>, String>,
    /// The tenant's Nodes (all of them: in a simulated tenant the guests make every one).
    pub(crate) nodes: Arc<Cache<Node>>,
    /// Node names by `status.nodeInfo.bootID`, as the Node watch delivered them: which
    /// guest a Node belongs to without a scan of every Node per guest (O(N²) over a burst of
    /// N VMs). An entry can outlive its Node; [`TenantEntry::node_booted_by`] checks it
    /// against the cache and drops it then.
    boot_ids: Arc<Mutex<HashMap<String, String>>>,
    /// Bootstrap-token Secrets in `kube-system`.
    pub(crate) tokens: Arc<Cache<Secret>>,
    /// The tenant's version, read once (the kubelet's and kube-proxy's version).
    version: tokio::sync::OnceCell<String>,
    /// A client with the tenant's CA and no credentials of its own: each request carries
    /// the bootstrap token it checks in its `Authorization` header. The API server
    /// authenticates every request on its own, so this checks what a kubelet's first request
    /// does, over one reused connection instead of a TLS handshake per guest.
    anonymous: tokio::sync::OnceCell<Client>,
    /// `kube-system/kubeadm-config` as last read, and when.
    kubeadm_config: std::sync::Mutex<Option<(std::time::Instant, Option<Arc<ConfigMap>>)>>,
}

impl TenantEntry {
    /// The entry and its caches' tasks (the caller stops them).
    pub(crate) fn start(tenant: Tenant) -> (Self, Vec<JoinHandle<()>>) {
        let endpoint = guest::endpoint_of_url(&tenant.url);
        if endpoint.is_none() {
            tracing::warn!(url = %tenant.url, "tenant URL is not https://host:port; no guest can join it");
        }
        let ca_hashes = guest::ca_cert_hashes(&tenant.ca_pem).map_err(|e| e.0);
        let boot_ids: Arc<Mutex<HashMap<String, String>>> = Arc::default();
        let (nodes, node_task) = cache::spawn(
            format!("Nodes of {}", tenant.url),
            Api::<Node>::all(tenant.client.clone()),
            watcher::Config::default(),
            (),
            trim_node,
            {
                let boot_ids = boot_ids.clone();
                move |node: &Node| {
                    if let Some(boot_id) = boot_id(node).filter(|b| !b.is_empty()) {
                        boot_ids
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .insert(boot_id.to_string(), node.name_any());
                    }
                }
            },
        );
        let (tokens, token_task) = cache::spawn(
            format!("bootstrap tokens of {}", tenant.url),
            Api::<Secret>::namespaced(tenant.client.clone(), TOKEN_NAMESPACE),
            watcher::Config::default().fields(&format!("type={TOKEN_TYPE}")),
            (),
            cache::trim_meta,
            |_: &Secret| {},
        );
        let entry = TenantEntry {
            tenant,
            endpoint,
            ca_hashes,
            nodes,
            boot_ids,
            tokens,
            version: tokio::sync::OnceCell::new(),
            anonymous: tokio::sync::OnceCell::new(),
            kubeadm_config: Default::default(),
        };
        (entry, vec![node_task, token_task])
    }

    pub(crate) fn nodes_api(&self) -> Api<Node> {
        Api::all(self.tenant.client.clone())
    }

    /// The client without credentials (built once).
    pub(crate) async fn anonymous_client(&self) -> Result<Client, String> {
        self.anonymous
            .get_or_try_init(|| anonymous_client(&self.tenant))
            .await
            .cloned()
    }

    /// The Node of the guest whose VMI has UID `vmi_uid`, from the cache: the one whose
    /// boot ID is that UID (found by the boot-ID index, checked against the cache).
    pub(crate) fn node_booted_by(&self, vmi_uid: &str) -> Option<String> {
        let mut index = self.boot_ids.lock().unwrap_or_else(PoisonError::into_inner);
        let name = index.get(vmi_uid)?.clone();
        let current = self.nodes.get(None, &name);
        if current.as_deref().and_then(boot_id) == Some(vmi_uid) {
            Some(name)
        } else {
            // The Node went, or was registered again by another boot.
            index.remove(vmi_uid);
            None
        }
    }

    /// The tenant's `gitVersion` (asked once).
    pub(crate) async fn version(&self) -> Result<String, kube::Error> {
        self.version
            .get_or_try_init(|| async {
                let info = self.tenant.client.apiserver_version().await?;
                Ok(info.git_version)
            })
            .await
            .cloned()
    }

    /// The tenant's `kube-system/kubeadm-config`, read at most every 2 seconds.
    async fn kubeadm_config(&self) -> Option<Arc<ConfigMap>> {
        if let Ok(cached) = self.kubeadm_config.lock() {
            if let Some((at, cm)) = cached.as_ref() {
                if at.elapsed() < Duration::from_secs(2) {
                    return cm.clone();
                }
            }
        }
        let api: Api<ConfigMap> = Api::namespaced(self.tenant.client.clone(), "kube-system");
        let cm = api
            .get_opt("kubeadm-config")
            .await
            .ok()
            .flatten()
            .map(Arc::new);
        if let Ok(mut cached) = self.kubeadm_config.lock() {
            *cached = Some((std::time::Instant::now(), cm.clone()));
        }
        cm
    }

    /// The join address the tenant publishes (`controlPlaneEndpoint`), if any.
    pub(crate) async fn published(&self) -> Option<(String, u16)> {
        let cm = self.kubeadm_config().await?;
        let text = cm.data.as_ref()?.get("ClusterConfiguration")?;
        guest::published_endpoint(text)
    }

    /// The join script URL the tenant publishes (vCluster's annotation), if any.
    pub(crate) async fn published_script_url(&self) -> Option<String> {
        let cm = self.kubeadm_config().await?;
        cm.annotations()
            .get("vcluster.loft.sh/join-script-endpoint")
            .cloned()
    }

    pub(crate) fn endpoint_string(&self) -> String {
        match &self.endpoint {
            Some((host, port)) => format!("{host}:{port}"),
            None => self.tenant.url.clone(),
        }
    }
}

/// A client that trusts the tenant's CA and authenticates with nothing.
async fn anonymous_client(tenant: &Tenant) -> Result<Client, String> {
    let ca = base64::engine::general_purpose::STANDARD.encode(&tenant.ca_pem);
    let kc: Kubeconfig = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "tenant", "cluster": {"server": tenant.url, "certificate-authority-data": ca}}],
        "users": [{"name": "anonymous", "user": {}}],
        "contexts": [{"name": "anonymous", "context": {"cluster": "tenant", "user": "anonymous"}}],
        "current-context": "anonymous",
    }))
    .map_err(|e| e.to_string())?;
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    Client::try_from(config).map_err(|e| e.to_string())
}

/// A Node's `status.nodeInfo.bootID`.
fn boot_id(node: &Node) -> Option<&str> {
    node.status
        .as_ref()?
        .node_info
        .as_ref()
        .map(|i| i.boot_id.as_str())
}

/// Drops what the simulator never reads of a Node: images and volumes.
fn trim_node(node: &mut Node) {
    cache::trim_meta(node);
    if let Some(status) = node.status.as_mut() {
        status.images = None;
        status.volumes_attached = None;
        status.volumes_in_use = None;
    }
}

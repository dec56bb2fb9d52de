//! A tenant cluster the simulated guests may join, as the simulator is given it: an admin
//! client, the API server's URL and its CA.

use std::path::{Path, PathBuf};

use base64::Engine;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use super::error::SimError;

/// A tenant cluster the simulated guests may join.
#[derive(Clone)]
pub struct Tenant {
    /// A client with admin rights (stands in for the kubelet once it has its certificate).
    pub client: Client,
    /// The API server URL (`https://host:port`), matched against `apiServerEndpoint`.
    pub url: String,
    /// PEM of the tenant's CA bundle (what kubeadm pins with `caCertHashes`).
    pub ca_pem: Vec<u8>,
}

impl std::fmt::Debug for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenant").field("url", &self.url).finish()
    }
}

impl Tenant {
    /// A tenant from its parts.
    pub fn new(client: Client, url: impl Into<String>, ca_pem: impl Into<Vec<u8>>) -> Self {
        Tenant {
            client,
            url: url.into(),
            ca_pem: ca_pem.into(),
        }
    }

    /// A tenant from an admin kubeconfig file: its current context's server and CA.
    pub async fn from_kubeconfig_file(path: &Path) -> Result<Self, SimError> {
        let kc = Kubeconfig::read_from(path).map_err(|e| SimError::Kubeconfig {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Self::from_kubeconfig(kc, &path.display().to_string(), path.parent()).await
    }

    /// A tenant from a parsed admin kubeconfig; `origin` names it in errors, `base_dir`
    /// resolves a relative `certificate-authority` path.
    pub async fn from_kubeconfig(
        kc: Kubeconfig,
        origin: &str,
        base_dir: Option<&Path>,
    ) -> Result<Self, SimError> {
        let err = |message: String| SimError::Kubeconfig {
            path: origin.to_string(),
            message,
        };
        let context_name = kc
            .current_context
            .clone()
            .or_else(|| kc.contexts.first().map(|c| c.name.clone()))
            .ok_or_else(|| err("no context".into()))?;
        let cluster_name = kc
            .contexts
            .iter()
            .find(|c| c.name == context_name)
            .and_then(|c| c.context.as_ref())
            .map(|c| c.cluster.clone())
            .ok_or_else(|| err(format!("context {context_name} not found")))?;
        let cluster = kc
            .clusters
            .iter()
            .find(|c| c.name == cluster_name)
            .and_then(|c| c.cluster.as_ref())
            .ok_or_else(|| err(format!("cluster {cluster_name} not found")))?;
        let url = cluster
            .server
            .clone()
            .ok_or_else(|| err(format!("cluster {cluster_name} has no server")))?;
        let ca_pem = if let Some(data) = &cluster.certificate_authority_data {
            base64::engine::general_purpose::STANDARD
                .decode(data.trim())
                .map_err(|e| err(format!("certificate-authority-data: {e}")))?
        } else if let Some(file) = &cluster.certificate_authority {
            let file = PathBuf::from(file);
            let file = match base_dir {
                Some(dir) if file.is_relative() => dir.join(file),
                _ => file,
            };
            std::fs::read(&file).map_err(|e| err(format!("reading {}: {e}", file.display())))?
        } else {
            return Err(err(format!(
                "cluster {cluster_name} has no certificate authority: the guest needs it to check caCertHashes"
            )));
        };
        let client = client_from(kc, origin).await?;
        Ok(Tenant::new(client, url, ca_pem))
    }
}

/// A client from a kubeconfig; `origin` names it in errors.
pub(crate) async fn client_from(kc: Kubeconfig, origin: &str) -> Result<Client, SimError> {
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| SimError::Kubeconfig {
            path: origin.to_string(),
            message: e.to_string(),
        })?;
    Client::try_from(config).map_err(SimError::kube(format!("building a client for {origin}")))
}

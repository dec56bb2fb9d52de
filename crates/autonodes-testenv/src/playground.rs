//! The playground's clusters: management, host and tenant API servers (real etcd +
//! kube-apiserver, see [`crate::testenv`]) wired like a real installation — the CRDs
//! installed, the host and tenant kubeconfigs stored as Secrets, the provider applied.
//! `autonodes-dev dev` and the integration tests start from here.

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use kube::api::{Api, Patch, PatchParams};
use kube::Client;

use crate::api::NodeProvider;
use crate::testenv::{install_crds, ApiServer, TestEnv};

/// The service namespace autonodes uses in the playground.
pub const SERVICE_NAMESPACE: &str = "autonodes-system";

/// Creates namespace `name` unless it exists (server-side apply).
pub async fn ensure_namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    api.patch(
        name,
        &PatchParams::apply("autonodes-dev").force(),
        &Patch::Apply(&ns),
    )
    .await
    .with_context(|| format!("creating namespace {name}"))?;
    Ok(())
}

/// Stores `kubeconfig` in Secret `namespace/name` under `key`.
pub async fn put_kubeconfig_secret(
    client: &Client,
    namespace: &str,
    name: &str,
    key: &str,
    kubeconfig: &str,
) -> anyhow::Result<()> {
    ensure_namespace(client, namespace).await?;
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        data: Some([(key.to_string(), ByteString(kubeconfig.as_bytes().to_vec()))].into()),
        ..Default::default()
    };
    api.patch(
        name,
        &PatchParams::apply("autonodes-dev").force(),
        &Patch::Apply(&secret),
    )
    .await
    .with_context(|| format!("writing Secret {namespace}/{name}"))?;
    Ok(())
}

/// What the playground set up, for printing and for tests.
pub struct Playground {
    /// The clusters.
    pub env: TestEnv,
    /// The applied provider.
    pub provider: NodeProvider,
}

impl Playground {
    /// The management cluster.
    pub fn mgmt(&self) -> anyhow::Result<&ApiServer> {
        self.env
            .apiserver("mgmt")
            .context("management cluster missing")
    }
    /// The host cluster.
    pub fn host(&self) -> anyhow::Result<&ApiServer> {
        self.env.apiserver("host").context("host cluster missing")
    }
    /// The tenant cluster.
    pub fn tenant(&self) -> anyhow::Result<&ApiServer> {
        self.env
            .apiserver("tenant")
            .context("tenant cluster missing")
    }
}

/// Starts the clusters in `env` (already running) and wires them like a real installation:
/// CRDs on management, KubeVirt CRDs and the VM namespace on the host, the host kubeconfig
/// Secret in the service namespace, the tenant kubeconfig Secret `vc-<vcluster>`, and the
/// provider applied.
pub async fn wire(
    env: TestEnv,
    provider_yaml: &str,
    tenant_namespace: &str,
    vcluster: &str,
) -> anyhow::Result<Playground> {
    let provider: NodeProvider = autonodes_core::yaml::from_str(provider_yaml)
        .context("the provider file is not a NodeProvider")?;
    let mgmt = env
        .apiserver("mgmt")
        .context("management cluster missing")?;
    let host = env.apiserver("host").context("host cluster missing")?;
    let tenant = env.apiserver("tenant").context("tenant cluster missing")?;
    let mgmt_client = mgmt.client().await?;
    let host_client = host.client().await?;

    install_crds(&mgmt_client, &crate::api::crds()).await?;
    install_crds(&host_client, &crate::simulator::kubevirt_crds()).await?;
    install_crds(&host_client, &crate::simulator::instancetype_crds()).await?;
    ensure_namespace(&host_client, &provider.spec.kube_virt.cluster_ref.namespace).await?;
    put_kubeconfig_secret(
        &mgmt_client,
        SERVICE_NAMESPACE,
        &provider.spec.kube_virt.cluster_ref.cluster,
        crate::api::HOST_KUBECONFIG_KEY,
        &host.kubeconfig_yaml()?,
    )
    .await?;
    put_kubeconfig_secret(
        &mgmt_client,
        tenant_namespace,
        &format!("vc-{vcluster}"),
        crate::api::TENANT_KUBECONFIG_KEY,
        &tenant.kubeconfig_yaml()?,
    )
    .await?;
    let api: Api<NodeProvider> = Api::all(mgmt_client);
    let name = provider
        .metadata
        .name
        .clone()
        .context("the provider has no name")?;
    api.patch(
        &name,
        &PatchParams::apply("autonodes-dev").force(),
        &Patch::Apply(&provider),
    )
    .await
    .with_context(|| format!("applying NodeProvider {name}"))?;
    Ok(Playground { env, provider })
}

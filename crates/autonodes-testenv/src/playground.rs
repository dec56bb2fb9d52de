//! The playground's clusters: management, host and tenant API servers (real etcd +
//! kube-apiserver, see [`crate::testenv`]) wired like a real installation — the CRDs
//! installed, the host's worker nodes registered, the host and tenant kubeconfigs stored as
//! Secrets, the provider applied.
//! `autonodes-dev dev` and the integration tests start from here.

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use kube::api::{Api, Patch, PatchParams};
use kube::Client;

use crate::testenv::{install_crds, ApiServer, TestEnv};
use autonodes_api::NodeProvider;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

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

/// The host's stand-in worker nodes (name, zone): Node objects without a kubelet, each
/// `Ready`, labelled `node-role.kubernetes.io/kubevirt` and with room for thousands of
/// VMs ([`HOST_NODE_ALLOCATABLE`]), so autonodes' host capacity check has nodes to place VMs
/// on: one without a zone (the one the simulator reports VMIs running on), one in each of
/// the example zones.
pub const HOST_NODES: [(&str, Option<&str>); 3] = [
    ("kubevirt-host-0", None),
    ("kubevirt-host-zone-a", Some("zone-a")),
    ("kubevirt-host-zone-b", Some("zone-b")),
];

/// The allocatable cpu, memory and pods of each of [`HOST_NODES`].
pub const HOST_NODE_ALLOCATABLE: [(&str, &str); 3] =
    [("cpu", "100k"), ("memory", "64Ti"), ("pods", "100k")];

/// Registers a host node `name` (in `zone`, with `labels` and `allocatable`) that is
/// `Ready` and untainted, as a kubelet and the node-lifecycle controller would leave it.
pub async fn put_host_node(
    client: &Client,
    name: &str,
    zone: Option<&str>,
    labels: &[(&str, &str)],
    allocatable: &[(&str, &str)],
) -> anyhow::Result<()> {
    let mut all: serde_json::Map<String, serde_json::Value> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
        .collect();
    all.insert("kubernetes.io/hostname".into(), name.into());
    if let Some(z) = zone {
        all.insert("topology.kubernetes.io/zone".into(), z.into());
    }
    let allocatable: serde_json::Map<String, serde_json::Value> = allocatable
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
        .collect();
    let node = serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": all},
        "status": {
            "allocatable": allocatable,
            "capacity": allocatable,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    });
    let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let params = PatchParams::apply("autonodes-dev").force();
    api.patch(name, &params, &Patch::Apply(&node))
        .await
        .with_context(|| format!("registering host node {name}"))?;
    api.patch_status(name, &params, &Patch::Apply(&node))
        .await
        .with_context(|| format!("writing the status of host node {name}"))?;
    // The API server taints a new Node `node.kubernetes.io/not-ready` and no node-lifecycle
    // controller runs to take it off: these nodes are as ready as a kubelet's.
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"taints": null}})),
    )
    .await
    .with_context(|| format!("untainting host node {name}"))?;
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

/// The CRDs of a management cluster: autonodes' own.
pub fn mgmt_crds() -> Vec<CustomResourceDefinition> {
    autonodes_api::crds()
}

/// The CRDs of a host cluster: KubeVirt's (as the simulator plays it) and its instance
/// types'.
pub fn host_crds() -> Vec<CustomResourceDefinition> {
    let mut crds = crate::simulator::kubevirt_crds();
    crds.extend(crate::simulator::instancetype_crds());
    crds
}

/// Starts the clusters in `env` (already running) and wires them like a real installation:
/// CRDs on management, KubeVirt CRDs, [`HOST_NODES`] and the VM namespace on the host, the
/// host kubeconfig
/// Secret in the service namespace, the tenant kubeconfig Secret `vc-<vcluster>`, and the
/// provider applied. Where `host` stands for the management server
/// ([`TestEnv::alias`]), autonodes runs in its host cluster: no host kubeconfig Secret is
/// written and the provider's `clusterRef.cluster` becomes [`autonodes_api::LOCAL_HOST_CLUSTER`].
pub async fn wire(
    env: TestEnv,
    provider_yaml: &str,
    tenant_namespace: &str,
    vcluster: &str,
) -> anyhow::Result<Playground> {
    let mut provider: NodeProvider = autonodes_core::yaml::from_str(provider_yaml)
        .context("the provider file is not a NodeProvider")?;
    let mgmt = env
        .apiserver("mgmt")
        .context("management cluster missing")?;
    let host = env.apiserver("host").context("host cluster missing")?;
    let local = host.url == mgmt.url;
    if local {
        provider.spec.kube_virt.cluster_ref.cluster = autonodes_api::LOCAL_HOST_CLUSTER.to_string();
    }
    let tenant = env.apiserver("tenant").context("tenant cluster missing")?;
    let mgmt_client = mgmt.client().await?;
    let host_client = host.client().await?;

    // (Nothing to do where the servers started with them: `ServerOptions::crds`.)
    install_crds(&mgmt_client, &mgmt_crds()).await?;
    install_crds(&host_client, &host_crds()).await?;
    for (name, zone) in HOST_NODES {
        let role = [("node-role.kubernetes.io/kubevirt", "")];
        put_host_node(&host_client, name, zone, &role, &HOST_NODE_ALLOCATABLE).await?;
    }
    ensure_namespace(&host_client, &provider.spec.kube_virt.cluster_ref.namespace).await?;
    // The controller's own namespace, as its installation makes it.
    ensure_namespace(&mgmt_client, SERVICE_NAMESPACE).await?;
    if !local {
        put_kubeconfig_secret(
            &mgmt_client,
            SERVICE_NAMESPACE,
            &provider.spec.kube_virt.cluster_ref.cluster,
            autonodes_api::HOST_KUBECONFIG_KEY,
            &host.kubeconfig_yaml()?,
        )
        .await?;
    }
    put_kubeconfig_secret(
        &mgmt_client,
        tenant_namespace,
        &format!("vc-{vcluster}"),
        autonodes_api::TENANT_KUBECONFIG_KEY,
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

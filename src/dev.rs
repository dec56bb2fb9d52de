//! `autonodes dev`: a local playground. Starts management, host and tenant API servers
//! (real etcd + kube-apiserver, see [`crate::testenv`]), installs the CRDs, registers the
//! host and tenant kubeconfigs as Secrets the way a real installation would, applies the
//! example provider, and runs the controller and the KubeVirt simulator until Ctrl-C.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use kube::api::{Api, Patch, PatchParams};
use kube::Client;

use crate::api::NodeProvider;
use crate::controller::ControllerConfig;
use crate::testenv::{install_crds, ApiServer, TestEnv};

/// Flags of `autonodes dev`.
#[derive(Clone, Debug, Args)]
pub struct DevArgs {
    /// Directory for the clusters' data, logs and kubeconfigs (recreated on start).
    #[arg(long, default_value = ".dev")]
    pub dir: PathBuf,
    /// NodeProvider to apply (its clusterRef.cluster names the host Secret to create).
    #[arg(long, default_value = "examples/nodeprovider-advanced.yaml")]
    pub provider: PathBuf,
    /// Namespace of the tenant's claims on the management cluster.
    #[arg(long, default_value = "tenant")]
    pub tenant_namespace: String,
    /// Name of the tenant vCluster (its kubeconfig goes into Secret `vc-<name>`).
    #[arg(long, default_value = "tenant")]
    pub vcluster: String,
    /// How long the simulated VMs take to boot.
    #[arg(long, default_value = "2s", value_parser = crate::run::parse_duration)]
    pub boot_time: Duration,
    /// Address of the controller's metrics server.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub metrics_addr: SocketAddr,
    /// Launch timeout of the controller.
    #[arg(long, default_value = "10m", value_parser = crate::run::parse_duration)]
    pub launch_timeout: Duration,
    /// Registration timeout of the controller.
    #[arg(long, default_value = "15m", value_parser = crate::run::parse_duration)]
    pub registration_timeout: Duration,
}

/// The service namespace autonodes uses in the playground.
pub const SERVICE_NAMESPACE: &str = "autonodes-system";

async fn ensure_namespace(client: &Client, name: &str) -> anyhow::Result<()> {
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
    let provider: NodeProvider =
        serde_yaml::from_str(provider_yaml).context("the provider file is not a NodeProvider")?;
    let mgmt = env
        .apiserver("mgmt")
        .context("management cluster missing")?;
    let host = env.apiserver("host").context("host cluster missing")?;
    let tenant = env.apiserver("tenant").context("tenant cluster missing")?;
    let mgmt_client = mgmt.client().await?;
    let host_client = host.client().await?;

    install_crds(&mgmt_client, &crate::api::crds()).await?;
    install_crds(&host_client, &crate::simulator::kubevirt_crds()).await?;
    ensure_namespace(&host_client, &provider.spec.kube_virt.cluster_ref.namespace).await?;
    put_kubeconfig_secret(
        &mgmt_client,
        SERVICE_NAMESPACE,
        &provider.spec.kube_virt.cluster_ref.cluster,
        crate::clients::HOST_KUBECONFIG_KEY,
        &host.kubeconfig_yaml()?,
    )
    .await?;
    put_kubeconfig_secret(
        &mgmt_client,
        tenant_namespace,
        &format!("vc-{vcluster}"),
        crate::clients::TENANT_KUBECONFIG_KEY,
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

fn print_banner(p: &Playground, args: &DevArgs, root: &Path) -> anyhow::Result<()> {
    let mgmt = p.mgmt()?;
    let host = p.host()?;
    let tenant = p.tenant()?;
    let kubectl = p.env.bins.kubectl.display().to_string();
    println!(
        "\nautonodes playground is up.\n\n\
         kubeconfigs:\n  management: {}\n  host:       {}\n  tenant:     {}\n\
         kubectl:      {kubectl}\n\
         metrics:      http://{}/metrics\n\
         logs:         {}\n\n\
         Try:\n  export KUBECONFIG={}\n  kubectl get nprov,ntype\n  kubectl apply -f {}/examples/nodeclaim.yaml\n  kubectl get nclaim -n {} -w\n  kubectl --kubeconfig {} get nodes\n  kubectl --kubeconfig {} get vm,vmi -A\n\n\
         Ctrl-C stops everything and removes {}.\n",
        mgmt.kubeconfig_path.display(),
        host.kubeconfig_path.display(),
        tenant.kubeconfig_path.display(),
        args.metrics_addr,
        p.env.dir.display(),
        mgmt.kubeconfig_path.display(),
        root.display(),
        args.tenant_namespace,
        tenant.kubeconfig_path.display(),
        host.kubeconfig_path.display(),
        p.env.dir.display(),
    );
    Ok(())
}

/// Runs the playground until Ctrl-C.
pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    // The API servers answer /readyz with 500 while they start; kube's client logs each.
    crate::run::init_tracing_with(
        crate::run::LogFormat::Text,
        "info,kube_client::client::builder=off",
    );
    let root = std::env::current_dir().context("reading the current directory")?;
    let provider_yaml = std::fs::read_to_string(&args.provider)
        .with_context(|| format!("reading {}", args.provider.display()))?;
    if args.dir.exists() {
        std::fs::remove_dir_all(&args.dir)
            .with_context(|| format!("clearing {}", args.dir.display()))?;
    }
    eprintln!(
        "starting etcd and the management, host and tenant API servers in {} ...",
        args.dir.display()
    );
    let env = TestEnv::start_in(&args.dir, &["mgmt", "host", "tenant"]).await?;
    let playground = wire(env, &provider_yaml, &args.tenant_namespace, &args.vcluster).await?;

    let mgmt_client = playground.mgmt()?.client().await?;
    let host_client = playground.host()?.client().await?;
    let tenant =
        crate::simulator::Tenant::from_kubeconfig_file(&playground.tenant()?.kubeconfig_path)
            .await?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|v| *v).await;
        }
    };
    let sim_opts = crate::simulator::SimOptions {
        mode: crate::simulator::SimMode::SlowBoot(args.boot_time),
        ..Default::default()
    };
    let simulator = tokio::spawn(crate::simulator::run(
        host_client,
        vec![tenant],
        sim_opts,
        stopped(),
    ));
    let config = ControllerConfig {
        namespace: SERVICE_NAMESPACE.into(),
        launch_timeout: args.launch_timeout,
        registration_timeout: args.registration_timeout,
        ..Default::default()
    };
    let controller = tokio::spawn(crate::run::run_with(
        mgmt_client,
        config,
        args.metrics_addr,
        stopped(),
    ));
    print_banner(&playground, &args, &root)?;

    crate::run::shutdown_signal().await;
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(10), controller).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), simulator).await;
    let dir = playground.env.dir.clone();
    drop(playground);
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("stopped; removed {}", dir.display());
    Ok(())
}

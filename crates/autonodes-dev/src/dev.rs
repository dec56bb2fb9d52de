//! `autonodes-dev dev`: a local playground. Starts management, host and tenant API servers
//! (real etcd + kube-apiserver), wires them like a real installation (see
//! [`autonodes_testenv::playground`]), and runs the controller and the KubeVirt simulator
//! until Ctrl-C.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use autonodes::controller::config::ControllerConfig;
use autonodes_testenv::playground::{wire, Playground, SERVICE_NAMESPACE};
use autonodes_testenv::simulator;
use autonodes_testenv::testenv::{Binaries, TestEnv, TestEnvError};
use clap::Args;

/// Flags of `autonodes-dev dev`.
#[derive(Clone, Debug, Args)]
pub(crate) struct DevArgs {
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
    #[arg(long, default_value = "2s", value_parser = autonodes::run::parse_duration)]
    pub boot_time: Duration,
    /// Address of the controller's metrics server.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub metrics_addr: SocketAddr,
    /// Launch timeout of the controller.
    #[arg(long, default_value = "10m", value_parser = autonodes::run::parse_duration)]
    pub launch_timeout: Duration,
    /// Registration timeout of the controller.
    #[arg(long, default_value = "15m", value_parser = autonodes::run::parse_duration)]
    pub registration_timeout: Duration,
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

/// Installs what the playground runs (etcd, kube-apiserver, kube-scheduler, kubectl) with
/// the same `scripts/test-env.sh` the tests use, when a binary is missing: on a fresh
/// machine the playground is one command. The script prints its progress (building the
/// Kubernetes binaries takes minutes the first time).
fn install_test_env(root: &Path) -> anyhow::Result<()> {
    let missing = match Binaries::locate() {
        Ok(_) => return Ok(()),
        Err(TestEnvError::MissingBinary { name, path }) => {
            format!("{name} is not at {}", path.display())
        }
        Err(e) => return Err(e.into()),
    };
    let script = root.join("scripts/test-env.sh");
    anyhow::ensure!(
        script.is_file(),
        "{missing}; {} is not here (run the playground from the repository's root)",
        script.display()
    );
    eprintln!("{missing}: installing the playground's binaries with scripts/test-env.sh (once; building Kubernetes takes several minutes)");
    let status = std::process::Command::new("bash")
        .arg(&script)
        // The playground runs no real kubelets: the three binaries it runs are enough.
        .env(
            "AUTONODES_K8S_WANT",
            "kube-apiserver kube-scheduler kubectl",
        )
        .current_dir(root)
        .stdout(std::process::Stdio::null())
        .status()
        .with_context(|| format!("running {}", script.display()))?;
    anyhow::ensure!(status.success(), "scripts/test-env.sh failed ({status})");
    Binaries::locate().context("after scripts/test-env.sh")?;
    Ok(())
}

/// Runs the playground until Ctrl-C.
pub(crate) async fn run(args: DevArgs) -> anyhow::Result<()> {
    // The API servers answer /readyz with 500 while they start; kube's client logs each.
    autonodes::run::init_tracing_with(
        autonodes::run::LogFormat::Text,
        "info,kube_client::client::builder=off",
    );
    let root = std::env::current_dir().context("reading the current directory")?;
    install_test_env(&root)?;
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
        simulator::Tenant::from_kubeconfig_file(&playground.tenant()?.kubeconfig_path).await?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|v| *v).await;
        }
    };
    let sim_opts = simulator::SimOptions {
        mode: simulator::SimMode::SlowBoot(args.boot_time),
        ..Default::default()
    };
    let simulator = tokio::spawn(simulator::run(
        host_client,
        vec![tenant],
        sim_opts,
        stopped(),
    ));
    let config = ControllerConfig {
        namespace: SERVICE_NAMESPACE.into(),
        launch_timeout: args.launch_timeout,
        registration_timeout: args.registration_timeout,
        // The playground's clusters listen on loopback, which the address policy refuses
        // by default; the management API server stays refused.
        egress: autonodes::remote::egress::Egress::allowing_list("127.0.0.1")
            .map_err(|e| anyhow::anyhow!(e))?,
        management_server: playground
            .mgmt()
            .map(|m| format!("127.0.0.1:{}", m.port))
            .ok(),
        ..Default::default()
    };
    let controller = tokio::spawn(autonodes::run::run_with(
        mgmt_client,
        config,
        args.metrics_addr,
        stopped(),
    ));
    print_banner(&playground, &args, &root)?;

    autonodes::run::shutdown_signal().await;
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(10), controller).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), simulator).await;
    let dir = playground.env.dir.clone();
    drop(playground);
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("stopped; removed {}", dir.display());
    Ok(())
}

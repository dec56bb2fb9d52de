//! `autonodes run`: the controller process.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::controller;
use crate::controller::config::ControllerConfig;
use crate::controller::shards::Shards;
use crate::leader::{LeaderConfig, LeaderElector};
use crate::metrics::Metrics;
use crate::remote::clients::LocalHost;
use crate::remote::egress::Egress;
use crate::remote::request_metrics::{ClusterKind, CountRequests};
use crate::server::{self, ServerState};
use autonodes_core::address_policy::{AddressPolicy, Cidr};

/// Log output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line (for log collectors).
    Json,
}

/// Flags of `autonodes run`.
#[derive(Clone, Debug, Args)]
pub(crate) struct RunArgs {
    /// Kubeconfig of the management cluster (default: in-cluster config, else $KUBECONFIG).
    #[arg(long, env = "AUTONODES_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Namespace of autonodes: host-cluster kubeconfig Secrets live here.
    #[arg(long, env = "AUTONODES_NAMESPACE", default_value = "autonodes-system")]
    pub namespace: String,
    /// How long a VM may take to run before its claim fails (e.g. 10m, 90s).
    #[arg(long, env = "AUTONODES_LAUNCH_TIMEOUT", default_value = "10m", value_parser = parse_duration)]
    pub launch_timeout: Duration,
    /// How long a running VM's Node may take to join before its claim fails.
    #[arg(long, env = "AUTONODES_REGISTRATION_TIMEOUT", default_value = "15m", value_parser = parse_duration)]
    pub registration_timeout: Duration,
    /// How long a joined Node may take to be Ready with no startup taint left before its
    /// claim fails.
    #[arg(long, env = "AUTONODES_INITIALIZATION_TIMEOUT", default_value = "15m", value_parser = parse_duration)]
    pub initialization_timeout: Duration,
    /// How long a pool's Node may stay not Ready (after it was Ready once) before the pool
    /// replaces it; `0s` turns repair off.
    #[arg(long, env = "AUTONODES_NODE_REPAIR_AFTER", default_value = "10m", value_parser = parse_duration)]
    pub node_repair_after: Duration,
    /// How long draining a Node may take before it is deleted anyway.
    #[arg(long, env = "AUTONODES_DRAIN_TIMEOUT", default_value = "2m", value_parser = parse_duration)]
    pub drain_timeout: Duration,
    /// The longest any drain waits, also one whose pool's `terminationGracePeriod` is
    /// longer or `Never`: past it the Node and the VM are deleted anyway, with a Warning
    /// Event (`DrainTimeout`). A tenant's PodDisruptionBudget cannot keep a VM running for
    /// ever after its claim was deleted.
    #[arg(long, env = "AUTONODES_MAX_DRAIN_DURATION", default_value = "24h", value_parser = parse_duration)]
    pub max_drain_duration: Duration,
    /// A dynamic pool makes the nodes for a burst of pending pods once no pod was newly
    /// marked unschedulable for this long (longer packs more pods together).
    #[arg(long, env = "AUTONODES_BATCH_IDLE_DURATION", default_value = "2s", value_parser = parse_duration)]
    pub batch_idle_duration: Duration,
    /// ... or once a pod that needs a new node has waited this long, however long the burst
    /// (longer packs more pods together, shorter starts nodes sooner).
    #[arg(long, env = "AUTONODES_BATCH_MAX_DURATION", default_value = "10s", value_parser = parse_duration)]
    pub batch_max_duration: Duration,
    /// How often to look for (and remove) VMs, Secrets, DataVolumes and tokens whose claim
    /// no longer exists.
    #[arg(long, env = "AUTONODES_ORPHAN_SWEEP_INTERVAL", default_value = "5m", value_parser = parse_duration)]
    pub orphan_sweep_interval: Duration,
    /// Which namespaces' vCluster configurations (`vc-config-<name>` Secrets next to a
    /// `vc-<name>` kubeconfig Secret) become NodePools: `*` every namespace, a
    /// comma-separated list, or `off`.
    #[arg(long, env = "AUTONODES_VCLUSTER_CONFIG_NAMESPACES", default_value = "*",
          value_parser = crate::controller::config::ImportScope::parse)]
    pub vcluster_config_namespaces: crate::controller::config::ImportScope,
    /// Address of the /metrics, /healthz and /readyz server.
    #[arg(long, env = "AUTONODES_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
    /// Serve /metrics only to callers with a bearer token the management cluster's API
    /// server authenticates (TokenReview) and authorizes to `get` the non-resource URL
    /// `/metrics` (SubjectAccessReview), over HTTPS with a self-signed certificate;
    /// /healthz and /readyz stay open (on the same HTTPS port).
    #[arg(long, env = "AUTONODES_METRICS_AUTH")]
    pub metrics_auth: bool,
    /// Log format.
    #[arg(long, env = "AUTONODES_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Elect a leader among replicas on a coordination.k8s.io/v1 Lease in --namespace; only
    /// the leader runs the controllers (`--leader-elect` or `--leader-elect=true|false`).
    #[arg(long, env = "AUTONODES_LEADER_ELECT", default_value_t = false, num_args = 0..=1,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Share the tenant namespaces among the replicas (needs `--leader-elect`): each replica
    /// renews a member Lease of its own and acts for the namespaces rendezvous hashing
    /// gives it; the leader runs providers, node types, quotas and the host sweep, and
    /// makes every scheduling decision.
    #[arg(long, env = "AUTONODES_SHARD_TENANTS", default_value_t = false, num_args = 0..=1,
          default_missing_value = "true", action = clap::ArgAction::Set, requires = "leader_elect")]
    pub shard_tenants: bool,
    /// Name of the leader-election Lease.
    #[arg(
        long,
        env = "AUTONODES_LEADER_ELECTION_LEASE_NAME",
        default_value = "autonodes"
    )]
    pub leader_election_lease_name: String,
    /// How long the Lease holds after its last renewal; a follower takes over once it
    /// expires. The renew deadline (2/3) and retry period (2/15) derive from it.
    #[arg(long, env = "AUTONODES_LEADER_ELECTION_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub leader_election_lease_duration: Duration,
    /// Accept `insecure-skip-tls-verify: true` in host and tenant kubeconfig Secrets (off:
    /// such a Secret is refused with reason `InvalidKubeconfig`). Whoever can write those
    /// Secrets could then point autonodes at a server that is not what it claims.
    #[arg(long, env = "AUTONODES_ALLOW_INSECURE_SKIP_TLS_VERIFY", default_value_t = false, num_args = 0..=1,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    pub allow_insecure_skip_tls_verify: bool,
    /// Where nodes of stock images download the kubelet and kubeadm of the tenant's version
    /// (`<url>/<version>/bin/linux/<arch>/<binary>` with a `.sha256` beside each, the layout
    /// of dl.k8s.io); point it at a mirror for air-gapped sites. A node type's
    /// `autonodes.io/kubernetes-download-url` property wins.
    #[arg(long, env = "AUTONODES_KUBERNETES_DOWNLOAD_URL", default_value = autonodes_core::userdata::DEFAULT_DOWNLOAD_URL,
          value_parser = autonodes_core::userdata::parse_download_url)]
    pub kubernetes_download_url: String,
    /// The most NodeClaims pools may bring one namespace to, those being deleted included
    /// until their VM is gone (Failed ones aside); a pool at the cap
    /// reports `LimitReached=True` (reason `NamespaceClaimLimit`) and creates no more.
    /// Claims written by hand are bounded by a Kubernetes ResourceQuota on
    /// `count/nodeclaims.autonodes.io`.
    #[arg(long, env = "AUTONODES_MAX_CLAIMS_PER_NAMESPACE",
          default_value_t = autonodes_core::pool::limits::DEFAULT_MAX_CLAIMS_PER_NAMESPACE)]
    pub max_claims_per_namespace: usize,
    /// The most tenant clusters one namespace's claims and pools may use at once (distinct
    /// `vc-<name>` Secrets); a claim or pool naming one more gets the reason
    /// `TooManyTenantClusters` and no connection is opened to it.
    #[arg(long, env = "AUTONODES_MAX_TENANT_CLUSTERS_PER_NAMESPACE",
          default_value_t = crate::remote::clients::DEFAULT_MAX_TENANT_CLUSTERS_PER_NAMESPACE,
          value_parser = parse_positive)]
    pub max_tenant_clusters_per_namespace: usize,
    /// The most bytes of tenant API servers' answers (lists being read, watch events being
    /// received) this process holds at once, all tenants together (a Kubernetes quantity:
    /// `64Mi`). An answer that finds no room within 5 s fails and is read again later.
    #[arg(long, env = "AUTONODES_TENANT_ANSWER_BUDGET", default_value = "64Mi", value_parser = parse_bytes)]
    pub tenant_answer_budget: u64,
    /// The share of `--tenant-answer-budget` the tenant clusters of one namespace may hold
    /// at once (`16Mi`: two of the largest answers autonodes accepts).
    #[arg(long, env = "AUTONODES_TENANT_ANSWER_BUDGET_PER_NAMESPACE", default_value = "16Mi", value_parser = parse_bytes)]
    pub tenant_answer_budget_per_namespace: u64,
    /// Let a namespace claim nodes only while a NodeQuota covers it: claims elsewhere stay
    /// `Scheduled=False` (reason `NoQuota`) and pools create none (`LimitReached=True`,
    /// reason `NoQuota`). Off: a namespace no quota covers is not limited.
    #[arg(long, env = "AUTONODES_REQUIRE_QUOTA")]
    pub require_quota: bool,
    /// Run the Cluster API mirror: serve every NodePool with `spec.autoscaling` as a
    /// `capi.autonodes.io` MachinePool (and its claims as Machines) for the stock
    /// cluster-autoscaler. Needs the CRDs of `crds/capi/`. Off: those kinds are neither
    /// watched nor written.
    #[arg(long, env = "AUTONODES_CAPI_MIRROR")]
    pub capi_mirror: bool,
    /// This installation's id: every VM, Secret, DataVolume, token and Node autonodes
    /// creates carries it in the label `autonodes.io/installation`, and only this
    /// installation sweeps, adopts or deletes what carries it. Give installations that share
    /// a host namespace different ids. Empty: the UID of `--namespace`.
    #[arg(long, env = "AUTONODES_INSTALLATION_ID", default_value = "",
          value_parser = parse_installation_id)]
    pub installation_id: String,
    /// Addresses (comma-separated networks such as `10.0.0.0/8` or single addresses)
    /// tenant kubeconfigs may point at although the built-in list refuses them (loopback,
    /// unspecified, link-local, multicast, `100.64.0.0/10`, `fd00:ec2::254`). The
    /// management API server stays refused.
    #[arg(long, env = "AUTONODES_TENANT_ALLOW_CIDRS", default_value = "",
          value_parser = Cidr::parse_list)]
    pub tenant_allow_cidrs: CidrList,
    /// Addresses tenant kubeconfigs may never point at, beyond the built-in list.
    #[arg(long, env = "AUTONODES_TENANT_DENY_CIDRS", default_value = "",
          value_parser = Cidr::parse_list)]
    pub tenant_deny_cidrs: CidrList,
    /// As `--tenant-allow-cidrs`, for host (KubeVirt) kubeconfigs.
    #[arg(long, env = "AUTONODES_HOST_ALLOW_CIDRS", default_value = "",
          value_parser = Cidr::parse_list)]
    pub host_allow_cidrs: CidrList,
    /// As `--tenant-deny-cidrs`, for host (KubeVirt) kubeconfigs.
    #[arg(long, env = "AUTONODES_HOST_DENY_CIDRS", default_value = "",
          value_parser = Cidr::parse_list)]
    pub host_deny_cidrs: CidrList,
}

/// A list of networks, as a flag takes it.
pub(crate) type CidrList = Vec<Cidr>;

/// Accepts an installation id: empty (the namespace's UID), or a label value (at most 63
/// letters, digits, `-`, `_` or `.`, starting and ending with a letter or digit).
pub(crate) fn parse_installation_id(s: &str) -> Result<String, String> {
    if s.is_empty() || autonodes_core::names::is_label_value(s) {
        Ok(s.to_string())
    } else {
        Err("expected a label value: at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit".to_string())
    }
}

/// The longest duration a flag takes: a year. Longer ones mean "never" in practice and
/// overflow the clock arithmetic they feed.
pub(crate) const MAX_FLAG_DURATION: Duration = Duration::from_secs(366 * 24 * 3600);

/// Parses a whole number of at least 1.
pub(crate) fn parse_positive(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("`{s}` is not a whole number of at least 1")),
    }
}

/// Parses a byte size given as a Kubernetes quantity (`64Mi`, `100M`, `1048576`): at
/// least 1 MiB, at most 64 GiB.
pub(crate) fn parse_bytes(s: &str) -> Result<u64, String> {
    let millis = autonodes_core::resources::parse_quantity(s).map_err(|e| e.to_string())?;
    let bytes = millis.div_euclid(1000);
    if !(1 << 20..=64 << 30).contains(&bytes) {
        return Err(format!("`{s}` is not between 1Mi and 64Gi"));
    }
    u64::try_from(bytes).map_err(|_| format!("`{s}` is not a size"))
}

/// Parses `90s`, `10m`, `1h30m`, `500ms` or plain seconds, at most [`MAX_FLAG_DURATION`].
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = parse_any_duration(s)?;
    if d > MAX_FLAG_DURATION {
        return Err(format!(
            "`{s}` is longer than the most a duration flag takes, 8784h (a year)"
        ));
    }
    Ok(d)
}

fn parse_any_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if let Ok(secs) = t.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    if t.starts_with('-') {
        return Err(format!("`{s}` must not be negative"));
    }
    // The API crate's parser never panics (a value too large for a Duration is an error).
    autonodes_api::parse_go_duration(t)
        .map_err(|why| format!("`{s}` is not a duration such as 90s, 10m or 1h: {why}"))
}

/// Sets up logging (text or JSON, level from RUST_LOG, default `default_filter`).
pub fn init_tracing_with(format: LogFormat, default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Sets up logging (text or JSON, level from RUST_LOG, default info).
pub(crate) fn init_tracing(format: LogFormat) {
    init_tracing_with(format, "info");
}

/// A management-cluster client from a kubeconfig path, else the environment.
pub async fn management_client(kubeconfig: Option<&PathBuf>) -> anyhow::Result<Client> {
    Ok(management_client_and_server(kubeconfig).await?.0)
}

/// A management-cluster client, and its API server as `host:port` (which host and tenant
/// clients are never let connect to).
pub(crate) async fn management_client_and_server(
    kubeconfig: Option<&PathBuf>,
) -> anyhow::Result<(Client, Option<String>, LocalHost)> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("loading kubeconfig {}", path.display()))?
        }
        None => Config::infer()
            .await
            .context("no --kubeconfig, no in-cluster config and no usable $KUBECONFIG")?,
    };
    let server = server_address(&config.cluster_url);
    let local_host = LocalHost {
        server: config
            .cluster_url
            .to_string()
            .trim_end_matches('/')
            .to_string(),
        ca_pem: config.root_cert.as_deref().map(pem_of_der_certificates),
    };
    let client = kube::client::ClientBuilder::try_from(config)
        .context("building the management-cluster client")?
        .with_layer(&CountRequests(ClusterKind::Management))
        .build();
    Ok((client, server, local_host))
}

/// PEM text of DER certificates (as kube's `Config::root_cert` holds them), one block
/// after the other.
fn pem_of_der_certificates(certs: &[Vec<u8>]) -> Vec<u8> {
    let lf = pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF);
    certs
        .iter()
        .map(|der| pem::encode_config(&pem::Pem::new("CERTIFICATE", der.as_slice()), lf))
        .collect::<String>()
        .into_bytes()
}

/// `host:port` of a server URL (the scheme's port when none is written).
pub(crate) fn server_address(url: &http::Uri) -> Option<String> {
    let host = url.host()?;
    let port = url
        .port_u16()
        .unwrap_or(if url.scheme_str() == Some("http") {
            80
        } else {
            443
        });
    Some(format!("{host}:{port}"))
}

/// Resolves when SIGTERM or Ctrl-C arrives.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutdown signal received; finishing reconciles in flight");
}

/// Runs the controller until SIGTERM or Ctrl-C.
pub(crate) async fn run(args: RunArgs) -> anyhow::Result<()> {
    init_tracing(args.log_format);
    if args.shard_tenants && !args.leader_elect {
        anyhow::bail!("--shard-tenants needs --leader-elect: the leader schedules every claim");
    }
    let (client, management_server, local_host) =
        management_client_and_server(args.kubeconfig.as_ref()).await?;
    let egress = Egress {
        host: Arc::new(AddressPolicy {
            allow: args.host_allow_cidrs.clone(),
            deny: args.host_deny_cidrs.clone(),
            protected: Vec::new(),
        }),
        tenant: Arc::new(AddressPolicy {
            allow: args.tenant_allow_cidrs.clone(),
            deny: args.tenant_deny_cidrs.clone(),
            protected: Vec::new(),
        }),
        // Read before the controllers start, and again while they run.
        management: Arc::new(crate::remote::egress::ManagementAddresses::unknown()),
    };
    let config = ControllerConfig {
        namespace: args.namespace.clone(),
        launch_timeout: args.launch_timeout,
        registration_timeout: args.registration_timeout,
        initialization_timeout: args.initialization_timeout,
        node_repair_after: (!args.node_repair_after.is_zero()).then_some(args.node_repair_after),
        drain_timeout: args.drain_timeout,
        max_drain_duration: args.max_drain_duration,
        batch: autonodes_core::pool::dynamic::Batch {
            idle: args.batch_idle_duration,
            max: args.batch_max_duration,
        },
        orphan_sweep_interval: args.orphan_sweep_interval,
        vcluster_import: args.vcluster_config_namespaces.clone(),
        kubeconfig_policy: autonodes_core::kubeconfig::KubeconfigPolicy {
            allow_insecure_skip_tls_verify: args.allow_insecure_skip_tls_verify,
        },
        kubernetes_download_url: args.kubernetes_download_url.clone(),
        max_claims_per_namespace: args.max_claims_per_namespace,
        require_quota: args.require_quota,
        capi_mirror: args.capi_mirror,
        tenant_limits: crate::remote::clients::TenantLimits {
            clusters_per_namespace: args.max_tenant_clusters_per_namespace,
            answer_budget: crate::remote::budget::BudgetSize {
                total: args.tenant_answer_budget,
                per_namespace: args.tenant_answer_budget_per_namespace,
            },
        },
        installation: args.installation_id.clone(),
        egress,
        management_server,
        local_host,
    };
    let leader = args.leader_elect.then(|| LeaderConfig {
        shard_tenants: args.shard_tenants,
        ..LeaderConfig::new(
            &args.namespace,
            &args.leader_election_lease_name,
            args.leader_election_lease_duration,
        )
    });
    let options = RunOptions {
        metrics_addr: args.metrics_addr,
        metrics_auth: args.metrics_auth,
        leader,
        bound: None,
    };
    run_with_options(client, config, options, shutdown_signal()).await
}

/// How [`run_with_options`] serves and whether it elects a leader.
#[derive(Debug)]
pub struct RunOptions {
    /// Address of the /metrics, /healthz and /readyz server (port 0 picks a free port).
    pub metrics_addr: SocketAddr,
    /// Authenticate and authorize `/metrics` callers, over HTTPS (`--metrics-auth`).
    pub metrics_auth: bool,
    /// Leader election; `None` runs the controllers at once.
    pub leader: Option<LeaderConfig>,
    /// Receives the address the server bound (useful with port 0).
    pub bound: Option<tokio::sync::oneshot::Sender<SocketAddr>>,
}

/// Runs the controller with a given client until `shutdown` resolves (used by `dev` too),
/// without leader election.
pub async fn run_with(
    client: Client,
    config: ControllerConfig,
    metrics_addr: SocketAddr,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let options = RunOptions {
        metrics_addr,
        metrics_auth: false,
        leader: None,
        bound: None,
    };
    run_with_options(client, config, options, shutdown).await
}

/// Runs the controller until `shutdown` resolves: serves /metrics, /healthz and /readyz,
/// waits for the leader Lease when `options.leader` is set, then runs the controllers.
///
/// Shutdown stops taking new work, lets the reconciles in flight finish, then releases the
/// Lease so a follower takes over at once. A leader that loses its Lease stops its
/// controllers and returns an error (the process exits non-zero and restarts as a follower).
///
/// `/readyz`: a follower is ready once it has read the Lease (a healthy standby, so rolling
/// updates and PodDisruptionBudgets count it); the leader is ready once its watches synced.
pub async fn run_with_options(
    client: Client,
    config: ControllerConfig,
    options: RunOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let metrics_addr = options.metrics_addr;
    let metrics = Arc::new(Metrics::new().context("registering metrics")?);
    let ready = Arc::new(AtomicBool::new(false));
    let alive = Arc::new(AtomicBool::new(true));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|v| *v).await;
        }
    };
    let state = ServerState {
        metrics: metrics.clone(),
        ready: ready.clone(),
        alive: alive.clone(),
        auth: options
            .metrics_auth
            .then(|| Arc::new(crate::metrics_auth::MetricsAuth::new(client.clone()))),
    };
    let listener = tokio::net::TcpListener::bind(metrics_addr)
        .await
        .with_context(|| format!("binding the metrics server to {metrics_addr}"))?;
    let bound = listener.local_addr().unwrap_or(metrics_addr);
    let tls = if options.metrics_auth {
        Some(crate::metrics_tls::self_signed_acceptor()?)
    } else {
        None
    };
    tracing::info!(addr = %bound, authenticated = tls.is_some(), "serving /metrics, /healthz, /readyz");
    if let Some(tx) = options.bound {
        let _ = tx.send(bound);
    }
    let http = tokio::spawn({
        let stop = stopped();
        async move {
            match tls {
                Some(acceptor) => {
                    let listener = crate::metrics_tls::TlsListener::new(listener, acceptor)?;
                    axum::serve(listener, server::router(state))
                        .with_graceful_shutdown(stop)
                        .await
                }
                None => {
                    axum::serve(listener, server::router(state))
                        .with_graceful_shutdown(stop)
                        .await
                }
            }
        }
    });
    tracing::info!(namespace = %config.namespace, "autonodes controller starting");
    let result = match options.leader {
        None => {
            let shared = shared_stop(stopped());
            let single = Arc::new(Shards::single());
            let run = controller::run(client, config, metrics, shared, ready, single);
            bounded_by_grace(run, stopped()).await
        }
        Some(leader) if leader.shard_tenants => {
            shard_then_run(client, config, leader, metrics, ready, stopped).await
        }
        Some(leader) => lead_then_run(client, config, leader, metrics, ready, stopped).await,
    };
    alive.store(false, Ordering::SeqCst);
    let _ = http.await;
    tracing::info!("autonodes controller stopped");
    result
}

/// How long the reconciles in flight get to finish after shutdown began. Less than the
/// chart's terminationGracePeriodSeconds (30), so the Lease is still released in time.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

/// Runs `run`; once `stop` resolved, waits at most [`SHUTDOWN_GRACE`] for it to finish (a
/// controller whose watches never synced cannot drain on its own).
async fn bounded_by_grace(
    run: impl std::future::Future<Output = anyhow::Result<()>>,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    tokio::pin!(run);
    tokio::select! {
        result = &mut run => return result,
        _ = stop => {},
    }
    match tokio::time::timeout(SHUTDOWN_GRACE, run).await {
        Ok(result) => result,
        Err(_) => {
            tracing::warn!(
                grace = ?SHUTDOWN_GRACE,
                "the controllers did not stop within the shutdown grace; stopping anyway"
            );
            Ok(())
        }
    }
}

type SharedStop =
    futures::future::Shared<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + Sync>>>;

fn shared_stop(f: impl std::future::Future<Output = ()> + Send + Sync + 'static) -> SharedStop {
    use futures::FutureExt;
    let stop: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + Sync>> = Box::pin(f);
    stop.shared()
}

/// Waits for the Lease, runs the controllers while holding it, releases it on shutdown.
async fn lead_then_run<S, F>(
    client: Client,
    config: ControllerConfig,
    leader: LeaderConfig,
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
    stopped: S,
) -> anyhow::Result<()>
where
    S: Fn() -> F,
    F: std::future::Future<Output = ()> + Send + Sync + 'static,
{
    let mut elector = LeaderElector::new(client.clone(), leader);
    tracing::info!(
        lease = %format!("{}/{}", elector.config().namespace, elector.config().lease_name),
        identity = %elector.config().identity,
        "leader election: waiting for the Lease"
    );
    metrics.leader.set(0);
    let follower_ready = ready.clone();
    let acquired = elector
        .acquire(stopped(), || follower_ready.store(true, Ordering::SeqCst))
        .await;
    if !acquired {
        return Ok(());
    }
    // The leader is ready again once its own watches synced.
    ready.store(false, Ordering::SeqCst);
    metrics.leader.set(1);

    let (lost_tx, mut lost_rx) = tokio::sync::watch::channel(false);
    let (done_tx, mut done_rx) = tokio::sync::watch::channel(false);
    let holder = tokio::spawn(async move {
        let held = elector
            .hold(async move {
                let _ = done_rx.wait_for(|v| *v).await;
            })
            .await;
        if let Err(e) = &held {
            tracing::error!(error = %e, "stopping the controllers: this replica is no longer the leader");
            let _ = lost_tx.send(true);
        }
        (elector, held)
    });
    let stop = stopped();
    let controllers_stop = shared_stop(async move {
        tokio::select! {
            _ = stop => {},
            _ = lost_rx.wait_for(|v| *v) => {},
        }
    });
    let stopping = controllers_stop.clone();
    let single = Arc::new(Shards::single());
    let run = controller::run(
        client,
        config,
        metrics.clone(),
        controllers_stop,
        ready,
        single,
    );
    let result = bounded_by_grace(run, stopping).await;
    let _ = done_tx.send(true);
    metrics.leader.set(0);
    let (mut elector, held) = holder.await.context("the Lease renewal task panicked")?;
    held.context("leader election")?;
    if let Err(e) = elector.release().await {
        tracing::warn!(error = %e, "releasing the leader Lease failed; it expires by itself");
    }
    result
}

/// Runs the controllers as one member of several (`--shard-tenants`): renews this
/// replica's member Lease and acts for the namespaces it owns from the start, and runs
/// what is cluster-wide once it holds the leader Lease. Losing either Lease stops the
/// controllers and returns an error (the process restarts as a new member); a graceful
/// stop releases both.
async fn shard_then_run<S, F>(
    client: Client,
    config: ControllerConfig,
    leader: LeaderConfig,
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
    stopped: S,
) -> anyhow::Result<()>
where
    S: Fn() -> F,
    F: std::future::Future<Output = ()> + Send + Sync + 'static,
{
    let member = crate::membership::member_name(&leader.identity);
    let shards = Arc::new(Shards::member(
        &member,
        leader.lease_duration,
        leader.renew_deadline,
    ));
    tracing::info!(%member, identity = %leader.identity, "sharing the tenant namespaces with the other replicas");
    metrics.leader.set(0);
    let (lost_tx, mut lost_rx) = tokio::sync::watch::channel(false);
    let (done_tx, done_rx) = tokio::sync::watch::channel(false);
    let done = move || {
        let mut rx = done_rx.clone();
        async move {
            let _ = rx.wait_for(|v| *v).await;
        }
    };
    let membership = tokio::spawn({
        let (client, leader, shards, metrics) = (
            client.clone(),
            leader.clone(),
            shards.clone(),
            metrics.clone(),
        );
        let (lost_tx, done) = (lost_tx.clone(), done());
        async move {
            let kept = crate::membership::keep(client, leader, shards, metrics, done).await;
            if let Err(e) = &kept {
                tracing::error!(error = %e, "stopping the controllers: this replica is no longer a member");
                let _ = lost_tx.send(true);
            }
            kept
        }
    });
    let election = tokio::spawn({
        let (client, shards, metrics) = (client.clone(), shards.clone(), metrics.clone());
        let done = done();
        async move {
            let mut elector = LeaderElector::new(client, leader);
            let stop = futures::FutureExt::shared(Box::pin(done));
            if !elector.acquire(stop.clone(), || {}).await {
                return Ok(());
            }
            tracing::info!("leading: running providers, node types, quotas and the host sweep, and scheduling claims");
            shards.set_leading(true);
            metrics.leader.set(1);
            let held = elector.hold(stop).await;
            shards.set_leading(false);
            metrics.leader.set(0);
            if let Err(e) = &held {
                tracing::error!(error = %e, "stopping the controllers: this replica is no longer the leader");
                let _ = lost_tx.send(true);
                return held;
            }
            if let Err(e) = elector.release().await {
                tracing::warn!(error = %e, "releasing the leader Lease failed; it expires by itself");
            }
            Ok(())
        }
    });
    let stop = stopped();
    let controllers_stop = shared_stop(async move {
        tokio::select! {
            _ = stop => {},
            _ = lost_rx.wait_for(|v| *v) => {},
        }
    });
    let stopping = controllers_stop.clone();
    let run = controller::run(client, config, metrics, controllers_stop, ready, shards);
    let result = bounded_by_grace(run, stopping).await;
    let _ = done_tx.send(true);
    membership
        .await
        .context("the member Lease task panicked")?
        .context("membership")?;
    election
        .await
        .context("the leader Lease task panicked")?
        .context("leader election")?;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn der_certificates_become_pem_blocks_that_decode_back_to_the_same_bytes() {
        use base64::Engine as _;
        let first: Vec<u8> = (0..=255u8).collect();
        let second = vec![7u8; 10];
        let pem = String::from_utf8(pem_of_der_certificates(&[first.clone(), second.clone()]))
            .expect("PEM is text");
        let blocks: Vec<Vec<u8>> = pem
            .split("-----END CERTIFICATE-----\n")
            .filter(|b| !b.is_empty())
            .map(|b| {
                let body = b
                    .strip_prefix("-----BEGIN CERTIFICATE-----\n")
                    .expect("a BEGIN line");
                assert!(body.lines().all(|l| l.len() <= 64), "{body}");
                base64::engine::general_purpose::STANDARD
                    .decode(body.replace('\n', ""))
                    .expect("base64")
            })
            .collect();
        assert_eq!(blocks, vec![first, second]);
    }

    #[tokio::test]
    async fn sharing_the_tenants_without_leader_election_is_refused_before_anything_starts() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Flags {
            #[command(flatten)]
            run: RunArgs,
        }
        assert!(
            Flags::try_parse_from(["autonodes", "--shard-tenants"]).is_err(),
            "refused without --leader-elect"
        );
        let flags = Flags::try_parse_from(["autonodes", "--leader-elect=false", "--shard-tenants"])
            .expect("parses");
        let refused = run(flags.run).await.expect_err("refused");
        assert!(
            refused.to_string().contains("needs --leader-elect"),
            "{refused}"
        );
    }

    #[test]
    fn durations_parse_in_go_syntax_and_plain_seconds() {
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("45"), Ok(Duration::from_secs(45)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn an_absurd_duration_is_refused_with_a_message_instead_of_a_panic() {
        for absurd in [
            "99999999999h",
            "999999999999999999999s",
            "9223372036854775807h",
            "8785h",
            "18446744073709551615",
        ] {
            let e = parse_duration(absurd).expect_err(absurd);
            assert!(e.contains(absurd), "{e}");
        }
        assert_eq!(parse_duration("8784h"), Ok(MAX_FLAG_DURATION));
    }
}

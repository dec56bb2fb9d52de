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

use crate::controller::{self, ControllerConfig};
use crate::metrics::Metrics;
use crate::server::{self, ServerState};

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
pub struct RunArgs {
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
    /// How long draining a Node may take before it is deleted anyway.
    #[arg(long, env = "AUTONODES_DRAIN_TIMEOUT", default_value = "2m", value_parser = parse_duration)]
    pub drain_timeout: Duration,
    /// Address of the /metrics, /healthz and /readyz server.
    #[arg(long, env = "AUTONODES_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
    /// Log format.
    #[arg(long, env = "AUTONODES_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

/// Parses `90s`, `10m`, `1h30m`, `500ms` or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    if s.trim_start().starts_with('-') {
        return Err(format!("`{s}` must not be negative"));
    }
    let d: kube::core::Duration = s
        .parse()
        .map_err(|e| format!("`{s}` is not a duration such as 90s, 10m or 1h: {e}"))?;
    Ok(d.into())
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
pub fn init_tracing(format: LogFormat) {
    init_tracing_with(format, "info");
}

/// A management-cluster client from a kubeconfig path, else the environment.
pub async fn management_client(kubeconfig: Option<&PathBuf>) -> anyhow::Result<Client> {
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
    Client::try_from(config).context("building the management-cluster client")
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
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    init_tracing(args.log_format);
    let client = management_client(args.kubeconfig.as_ref()).await?;
    let config = ControllerConfig {
        namespace: args.namespace.clone(),
        launch_timeout: args.launch_timeout,
        registration_timeout: args.registration_timeout,
        drain_timeout: args.drain_timeout,
    };
    run_with(client, config, args.metrics_addr, shutdown_signal()).await
}

/// Runs the controller with a given client until `shutdown` resolves (used by `dev` too).
pub async fn run_with(
    client: Client,
    config: ControllerConfig,
    metrics_addr: SocketAddr,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
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
    };
    let listener = tokio::net::TcpListener::bind(metrics_addr)
        .await
        .with_context(|| format!("binding the metrics server to {metrics_addr}"))?;
    tracing::info!(addr = %listener.local_addr().unwrap_or(metrics_addr), "serving /metrics, /healthz, /readyz");
    let http = tokio::spawn({
        let stop = stopped();
        async move {
            axum::serve(listener, server::router(state))
                .with_graceful_shutdown(stop)
                .await
        }
    });
    tracing::info!(namespace = %config.namespace, "autonodes controller starting");
    let shared = {
        use futures::FutureExt;
        let stop: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + Sync>> =
            Box::pin(stopped());
        stop.shared()
    };
    let result = controller::run(client, config, metrics, shared, ready).await;
    alive.store(false, Ordering::SeqCst);
    let _ = http.await;
    tracing::info!("autonodes controller stopped");
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_in_go_syntax_and_plain_seconds() {
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("45"), Ok(Duration::from_secs(45)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert!(parse_duration("soon").is_err());
    }
}

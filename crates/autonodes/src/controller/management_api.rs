//! The management cluster's own API server, refused to every host and tenant connection:
//! its addresses are read before the controllers start (they wait until that succeeds)
//! and again every [`READ_AGAIN_EVERY`] while they run. A read that fails keeps what was
//! known; one that finds other addresses replaces them and drops the clients connected
//! meanwhile, so the next call of each connects under the new list.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Endpoints, Service};
use kube::{Api, Client};

use crate::remote::clients::ClusterClients;
use crate::remote::egress::ManagementAddresses;

/// How often the addresses are read again while the controllers run.
pub(crate) const READ_AGAIN_EVERY: Duration = Duration::from_secs(60);
/// The longest wait between two reads that failed before the controllers start.
const RETRY_AT_MOST: Duration = Duration::from_secs(10);

/// The addresses of the management cluster's API server: `server` (`host:port`, as the
/// controller's kubeconfig names it, resolved) and the `default/kubernetes` Service's
/// cluster IPs and endpoints, each with its ports. `Err` says what could not be read: a
/// partial list is never returned.
pub async fn read(client: &Client, server: Option<&str>) -> Result<Vec<SocketAddr>, String> {
    let mut out = Vec::new();
    if let Some(server) = server {
        let addrs = tokio::net::lookup_host(server)
            .await
            .map_err(|e| format!("resolving the management API server {server}: {e}"))?;
        out.extend(addrs);
    }
    let svc = Api::<Service>::namespaced(client.clone(), "default")
        .get("kubernetes")
        .await
        .map_err(|e| format!("reading the default/kubernetes Service: {e}"))?;
    let spec = svc.spec.unwrap_or_default();
    let ips = spec.cluster_ips.unwrap_or_default();
    for port in spec.ports.unwrap_or_default() {
        for ip in &ips {
            if let (Ok(ip), Ok(port)) = (ip.parse(), u16::try_from(port.port)) {
                out.push(SocketAddr::new(ip, port));
            }
        }
    }
    let ep = Api::<Endpoints>::namespaced(client.clone(), "default")
        .get("kubernetes")
        .await
        .map_err(|e| format!("reading the default/kubernetes Endpoints: {e}"))?;
    for subset in ep.subsets.unwrap_or_default() {
        let ports: Vec<u16> = subset
            .ports
            .unwrap_or_default()
            .iter()
            .filter_map(|p| u16::try_from(p.port).ok())
            .collect();
        for a in subset.addresses.unwrap_or_default() {
            if let Ok(ip) = a.ip.parse() {
                out.extend(ports.iter().map(|p| SocketAddr::new(ip, *p)));
            }
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// Reads the addresses into `known` until a read succeeds (waiting 1 s, then twice as
/// long up to 10 s, between failures, each logged), or `shutdown` resolves (`false`).
pub async fn read_before_start(
    client: &Client,
    server: Option<&str>,
    known: &ManagementAddresses,
    shutdown: impl std::future::Future<Output = ()>,
) -> bool {
    let mut wait = Duration::from_secs(1);
    tokio::pin!(shutdown);
    loop {
        match read(client, server).await {
            Ok(addrs) => {
                tracing::info!(addresses = ?addrs, "host and tenant clients never connect to the management API server");
                known.replace(addrs);
                return true;
            }
            Err(why) => {
                tracing::warn!(error = %why, retry_in = ?wait, "the management API server's addresses cannot be read; no host or tenant is connected to until they are")
            }
        }
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = &mut shutdown => return false,
        }
        wait = (wait * 2).min(RETRY_AT_MOST);
    }
}

/// Reads the addresses again every [`READ_AGAIN_EVERY`] until `shutdown` ([`read_again`]).
pub(crate) async fn keep_reading(
    client: Client,
    server: Option<String>,
    known: Arc<ManagementAddresses>,
    clients: Arc<ClusterClients>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = tokio::time::sleep(READ_AGAIN_EVERY) => {}
            () = &mut shutdown => return,
        }
        read_again(&client, server.as_deref(), &known, &clients).await;
    }
}

/// One read while the controllers run: what was known stays when it fails; addresses that
/// changed replace it, and every cached host and tenant client is dropped (its next call
/// connects, and is checked, again). Returns whether they changed.
pub async fn read_again(
    client: &Client,
    server: Option<&str>,
    known: &ManagementAddresses,
    clients: &ClusterClients,
) -> bool {
    match read(client, server).await {
        Ok(addrs) => {
            if !known.replace(addrs.clone()) {
                return false;
            }
            tracing::info!(addresses = ?addrs, "the management API server's addresses changed: connecting to hosts and tenants again");
            for remote in clients.cached().await {
                clients.forget(&remote.key).await;
            }
            true
        }
        Err(why) => {
            tracing::warn!(error = %why, "the management API server's addresses cannot be read again; the last ones read are still refused");
            false
        }
    }
}

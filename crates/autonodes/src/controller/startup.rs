//! What `run` reads from the management cluster before the controllers start: the
//! installation id and the management API server's own addresses (refused to host and
//! tenant clients).

use kube::Client;

/// The addresses of the management cluster's API server: `server` (`host:port`, resolved)
/// and the `default/kubernetes` Service's cluster IPs and endpoints, each with its ports.
/// What cannot be read is logged and left out.
pub async fn management_api_server(
    client: &Client,
    server: Option<&str>,
) -> Vec<std::net::SocketAddr> {
    use k8s_openapi::api::core::v1::{Endpoints, Service};
    let mut out = Vec::new();
    if let Some(server) = server {
        match tokio::net::lookup_host(server).await {
            Ok(addrs) => out.extend(addrs),
            Err(e) => {
                tracing::warn!(%server, error = %e, "cannot resolve the management API server")
            }
        }
    }
    match kube::Api::<Service>::namespaced(client.clone(), "default")
        .get("kubernetes")
        .await
    {
        Ok(svc) => {
            let spec = svc.spec.unwrap_or_default();
            let ips = spec.cluster_ips.unwrap_or_default();
            for port in spec.ports.unwrap_or_default() {
                for ip in &ips {
                    if let (Ok(ip), Ok(port)) = (ip.parse(), u16::try_from(port.port)) {
                        out.push(std::net::SocketAddr::new(ip, port));
                    }
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot read the default/kubernetes Service"),
    }
    match kube::Api::<Endpoints>::namespaced(client.clone(), "default")
        .get("kubernetes")
        .await
    {
        Ok(ep) => {
            for subset in ep.subsets.unwrap_or_default() {
                let ports: Vec<u16> = subset
                    .ports
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|p| u16::try_from(p.port).ok())
                    .collect();
                for a in subset.addresses.unwrap_or_default() {
                    if let Ok(ip) = a.ip.parse() {
                        out.extend(ports.iter().map(|p| std::net::SocketAddr::new(ip, *p)));
                    }
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot read the default/kubernetes Endpoints"),
    }
    out.sort();
    out.dedup();
    out
}

/// The default installation id: the UID of the controller's namespace, unique to this
/// management cluster and namespace and stable for as long as the installation lives.
pub async fn installation_of_namespace(client: &Client, namespace: &str) -> anyhow::Result<String> {
    use anyhow::Context as _;
    let api: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client.clone());
    let ns = api.get(namespace).await.with_context(|| {
        format!("reading namespace {namespace} for the installation id (set --installation-id, or let autonodes get that namespace)")
    })?;
    ns.metadata
        .uid
        .with_context(|| format!("namespace {namespace} has no UID"))
}

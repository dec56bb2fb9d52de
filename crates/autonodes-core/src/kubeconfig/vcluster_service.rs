//! A vCluster's own kubeconfig, reached through its Service.
//!
//! The vCluster chart exports `vc-<name>` with the server `https://localhost:8443`
//! (`exportKubeConfig.server` is empty by default): right for a port-forward on the
//! vCluster's pod, wrong anywhere else. The chart also creates a Service named like the
//! vCluster in the same namespace (labels `app: vcluster`, `release: <name>`, port `https`
//! 443 → 8443), and the vCluster's serving certificate carries its ClusterIP and the name
//! `<name>.<namespace>` by default. So a tenant kubeconfig whose server is a loopback
//! address is reached at that Service's ClusterIP and port, with the certificate checked
//! for `<name>.<namespace>` against the kubeconfig's own CA ([`through_service`]). The
//! address so reached passes the tenant address policy like any other; a loopback server
//! with no such Service next to it is not redirected (and the default policy refuses it).

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;

use super::CheckedKubeconfig;

/// The label the vCluster chart puts on its Services, and its value.
pub const APP_LABEL: (&str, &str) = ("app", "vcluster");
/// The label naming the vCluster (the Helm release) on its Services.
pub const RELEASE_LABEL: &str = "release";
/// The name of the vCluster Service's port that serves its API.
pub const HTTPS_PORT_NAME: &str = "https";
/// The port the vCluster chart serves its API on when no port is named `https`.
pub const HTTPS_PORT: i32 = 443;

/// A tenant kubeconfig redirected to its vCluster's Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Redirect {
    /// The kubeconfig with the Service's address as its server and the name its
    /// certificate is checked for.
    pub kubeconfig: CheckedKubeconfig,
    /// What was done, for conditions and `explain`: the Service, the address and the
    /// name the certificate is checked for (no credentials).
    pub via: String,
}

/// Whether `server` (an `https://` URL that passed [`super::check`]) names a loopback
/// address: `localhost` (or a name under it), `127.0.0.0/8` or `::1`.
pub fn server_is_loopback(server: &str) -> bool {
    let Ok(uri) = server.parse::<http::Uri>() else {
        return false;
    };
    let Some(host) = uri.host() else {
        return false;
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    if host == "localhost" || host.ends_with(".localhost") {
        return true;
    }
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<IpAddr>() {
        Ok(IpAddr::V4(v4)) => v4.is_loopback(),
        Ok(IpAddr::V6(v6)) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
        Err(_) => false,
    }
}

/// `kc` (whose server is a loopback address) as reached through `service`, the Service
/// `vcluster` in `namespace`: its ClusterIP and its `https` port (else 443), the path of
/// the kubeconfig's server kept, the certificate checked for `<vcluster>.<namespace>`
/// unless the kubeconfig names a `tls-server-name` itself, and its CA and credentials
/// unchanged. The error says why the Service is not a vCluster's that can be used.
pub fn through_service(
    kc: &CheckedKubeconfig,
    vcluster: &str,
    namespace: &str,
    service: &Service,
) -> Result<Redirect, String> {
    let shown = format!("Service {namespace}/{vcluster}");
    let labels = service.metadata.labels.clone().unwrap_or_default();
    let is_vclusters = labels.get(APP_LABEL.0).map(String::as_str) == Some(APP_LABEL.1)
        && labels.get(RELEASE_LABEL).map(String::as_str) == Some(vcluster);
    if !is_vclusters {
        return Err(format!(
            "{shown} is not the vCluster chart's (labels {}={} and {RELEASE_LABEL}={vcluster})",
            APP_LABEL.0, APP_LABEL.1
        ));
    }
    let spec = service.spec.clone().unwrap_or_default();
    if spec.type_.as_deref() == Some("ExternalName") {
        return Err(format!("{shown} is of type ExternalName"));
    }
    let ip: IpAddr = spec
        .cluster_ip
        .as_deref()
        .filter(|ip| !ip.is_empty() && *ip != "None")
        .ok_or_else(|| format!("{shown} has no ClusterIP"))?
        .parse()
        .map_err(|_| format!("{shown} has a ClusterIP that is not an address"))?;
    let ports = spec.ports.unwrap_or_default();
    let port = ports
        .iter()
        .find(|p| p.name.as_deref() == Some(HTTPS_PORT_NAME))
        .or_else(|| ports.iter().find(|p| p.port == HTTPS_PORT))
        .map(|p| p.port)
        .ok_or_else(|| {
            format!("{shown} has no port named {HTTPS_PORT_NAME} and no port {HTTPS_PORT}")
        })?;
    if !(1..=65535).contains(&port) {
        return Err(format!("{shown} has port {port}, not a TCP port"));
    }
    let host = match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    };
    let path = kc
        .server
        .parse::<http::Uri>()
        .ok()
        .map(|u| u.path().trim_end_matches('/').to_string())
        .unwrap_or_default();
    let server = format!("https://{host}:{port}{path}");
    let name = kc
        .tls_server_name
        .clone()
        .unwrap_or_else(|| format!("{vcluster}.{namespace}"));
    let via = format!(
        "the kubeconfig's server {} is the vCluster's own address, so it is reached through {shown} at {host}:{port} (certificate checked for {name})",
        kc.server
    );
    Ok(Redirect {
        kubeconfig: CheckedKubeconfig {
            server,
            tls_server_name: Some(name),
            ..kc.clone()
        },
        via,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn kubeconfig(server: &str) -> CheckedKubeconfig {
        CheckedKubeconfig {
            server: server.into(),
            ca_pem: Some(b"ca".to_vec()),
            ca_der: vec![b"der".to_vec()],
            tls_server_name: None,
            insecure_skip_tls_verify: false,
            token: None,
            client_identity: None,
        }
    }

    fn service(v: serde_json::Value) -> Service {
        serde_json::from_value(v).expect("service")
    }

    /// The Service the vCluster chart creates for `vc1` in `team-a`.
    fn chart_service() -> Service {
        service(json!({
            "metadata": {"name": "vc1", "namespace": "team-a",
                "labels": {"app": "vcluster", "release": "vc1", "heritage": "Helm"}},
            "spec": {"type": "ClusterIP", "clusterIP": "10.96.12.7", "ports": [
                {"name": "https", "port": 443, "targetPort": 8443, "protocol": "TCP"},
                {"name": "kubelet", "port": 10250, "targetPort": 8443, "protocol": "TCP"}]}
        }))
    }

    #[test]
    fn localhost_loopback_addresses_and_names_under_localhost_are_loopback_and_others_are_not() {
        for s in [
            "https://localhost:8443",
            "https://LOCALHOST.:8443",
            "https://vc.localhost",
            "https://127.0.0.1:8443",
            "https://127.1.2.3",
            "https://[::1]:8443",
            "https://[::ffff:127.0.0.1]:8443",
        ] {
            assert!(server_is_loopback(s), "{s}");
        }
        for s in [
            "https://10.0.0.1:443",
            "https://localhost.example.com",
            "https://mylocalhost:8443",
            "https://[::2]",
            "not a url",
        ] {
            assert!(!server_is_loopback(s), "{s}");
        }
    }

    #[test]
    fn a_vcluster_kubeconfig_goes_to_its_services_cluster_ip_and_https_port_checked_for_its_name() {
        let r = through_service(
            &kubeconfig("https://localhost:8443"),
            "vc1",
            "team-a",
            &chart_service(),
        )
        .expect("redirect");
        assert_eq!(r.kubeconfig.server, "https://10.96.12.7:443");
        assert_eq!(r.kubeconfig.tls_server_name.as_deref(), Some("vc1.team-a"));
        assert_eq!(r.kubeconfig.ca_pem.as_deref(), Some(&b"ca"[..]));
        assert!(
            r.via.contains("Service team-a/vc1 at 10.96.12.7:443"),
            "{}",
            r.via
        );
        assert!(r.via.contains("https://localhost:8443"), "{}", r.via);
    }

    #[test]
    fn the_kubeconfigs_own_server_name_and_path_are_kept_and_an_ipv6_address_is_bracketed() {
        let mut kc = kubeconfig("https://localhost:8443/api-prefix/");
        kc.tls_server_name = Some("vc1.example".into());
        let mut s = chart_service();
        if let Some(spec) = s.spec.as_mut() {
            spec.cluster_ip = Some("fd00::12".into());
            if let Some(ports) = spec.ports.as_mut() {
                ports[0].name = None;
            }
        }
        let r = through_service(&kc, "vc1", "team-a", &s).expect("redirect");
        assert_eq!(r.kubeconfig.server, "https://[fd00::12]:443/api-prefix");
        assert_eq!(r.kubeconfig.tls_server_name.as_deref(), Some("vc1.example"));
    }

    #[test]
    fn a_service_that_is_not_the_vcluster_charts_or_has_no_address_or_port_is_refused() {
        let kc = kubeconfig("https://localhost:8443");
        let with = |edit: &dyn Fn(&mut serde_json::Value)| {
            let mut v = serde_json::to_value(chart_service()).expect("json");
            edit(&mut v);
            through_service(&kc, "vc1", "team-a", &service(v)).expect_err("refused")
        };
        assert!(with(&|v| v["metadata"]["labels"]["app"] = json!("web"))
            .contains("not the vCluster chart's"));
        assert!(
            with(&|v| v["metadata"]["labels"]["release"] = json!("other"))
                .contains("not the vCluster chart's")
        );
        assert!(with(&|v| v["spec"]["clusterIP"] = json!("None")).contains("no ClusterIP"));
        assert!(with(&|v| v["spec"]["type"] = json!("ExternalName")).contains("ExternalName"));
        assert!(
            with(&|v| v["spec"]["ports"] = json!([{"name": "metrics", "port": 9090}]))
                .contains("no port named https")
        );
    }
}

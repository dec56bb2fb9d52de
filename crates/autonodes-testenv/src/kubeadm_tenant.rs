//! A tenant API server prepared the way `kubeadm init` prepares a control plane, so real
//! kubelets can join it with `kubeadm join`: real `kubeadm init phase` steps upload the
//! cluster and kubelet configuration (`kube-system/kubeadm-config`,
//! `kube-system/kubelet-config-1.20`) and create the bootstrap-token RBAC and
//! `kube-public/cluster-info`; a `kube-controller-manager` from the same tree runs the
//! controllers a join needs (CSR approving, signing and cleaning, the bootstrap signer that
//! signs `cluster-info` for each token, the token cleaner) and the node lifecycle
//! controller, which marks a Node whose kubelet stopped posting `Ready=Unknown` (after a
//! grace period of [`NODE_MONITOR_GRACE_PERIOD`], shorter than its 40 s default to keep the
//! tests short), as every kubeadm cluster and vCluster do. The API server's serving
//! certificate is valid for the address guests use (see
//! [`TestEnv::add_apiserver_serving`]), and that address is the published
//! `controlPlaneEndpoint`.

use std::fs;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, DeleteParams, PostParams};

use crate::testenv::{io_err, ManagedProcess, TestEnv, TestEnvError};

/// How long the node lifecycle controller waits for a kubelet's report before it marks the
/// Node `Ready=Unknown` (`--node-monitor-grace-period`).
pub const NODE_MONITOR_GRACE_PERIOD: Duration = Duration::from_secs(20);

/// The kubeadm control plane of one tenant API server.
#[derive(Debug)]
pub struct KubeadmControlPlane {
    /// `host:port` guests join at (the published `controlPlaneEndpoint`).
    pub guest_endpoint: String,
    /// The `kubernetesVersion` uploaded (the API server's own).
    pub kubernetes_version: String,
    /// What the `kubeadm init phase` commands printed.
    pub kubeadm_output: String,
    controller_manager: ManagedProcess,
}

impl KubeadmControlPlane {
    /// The controller manager's log file.
    pub fn controller_manager_log(&self) -> PathBuf {
        self.controller_manager.log_path().to_path_buf()
    }

    /// The process id of the controller manager.
    pub fn controller_manager_pid(&self) -> Option<u32> {
        self.controller_manager.pid()
    }
}

pub use crate::testenv::k8s_binary;

/// Prepares the API server `name` (started with [`TestEnv::add_apiserver_serving`] for
/// `guest_host`) as a kubeadm control plane that guests reach at `guest_host`.
pub async fn prepare(
    env: &TestEnv,
    name: &str,
    guest_host: &str,
) -> Result<KubeadmControlPlane, TestEnvError> {
    let server = env
        .apiserver(name)
        .ok_or_else(|| TestEnvError::Kubeconfig {
            name: name.to_string(),
            message: "no API server of that name".into(),
        })?;
    let kubeadm = k8s_binary(env, "kubeadm")?;
    let kcm = k8s_binary(env, "kube-controller-manager")?;
    let client = server.client().await?;
    let version = client
        .apiserver_version()
        .await
        .map_err(|e| TestEnvError::Kubeconfig {
            name: name.to_string(),
            message: format!("reading /version: {e}"),
        })?
        .git_version;
    let guest_endpoint = format!("{guest_host}:{}", server.port);
    let control_plane_node = format!("{name}-control-plane");
    let config_path = server.dir.join("kubeadm-config.yaml");
    let config = format!(
        "apiVersion: kubeadm.k8s.io/v1beta2
kind: InitConfiguration
nodeRegistration:
  name: {control_plane_node}
  criSocket: /run/containerd/containerd.sock
localAPIEndpoint:
  advertiseAddress: {guest_host}
  bindPort: {port}
---
apiVersion: kubeadm.k8s.io/v1beta2
kind: ClusterConfiguration
clusterName: {name}
kubernetesVersion: {version}
controlPlaneEndpoint: {guest_endpoint}
networking:
  serviceSubnet: 10.0.0.0/24
  podSubnet: 10.244.0.0/16
---
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: systemd
",
        port = server.port
    );
    fs::write(&config_path, &config)
        .map_err(io_err(format!("writing {}", config_path.display())))?;

    // `upload-config kubelet` annotates the control-plane Node with its CRI socket, as
    // after `kubeadm init` (where that node's kubelet registered it). This tenant's control
    // plane runs no kubelet: the Node is registered for the phase and removed after it.
    let nodes: Api<Node> = Api::all(client.clone());
    let placeholder: Node = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        // kubeadm waits for the hostname label a kubelet sets before it patches a Node.
        "metadata": {
            "name": control_plane_node,
            "labels": {"kubernetes.io/hostname": control_plane_node},
        },
    }))
    .map_err(|e| TestEnvError::Kubeconfig {
        name: name.to_string(),
        message: format!("building the control-plane Node: {e}"),
    })?;
    nodes
        .create(&PostParams::default(), &placeholder)
        .await
        .map_err(|e| TestEnvError::Kubeconfig {
            name: name.to_string(),
            message: format!("creating Node {control_plane_node}: {e}"),
        })?;

    let mut output = String::new();
    for phase in [
        &["upload-config", "kubeadm"][..],
        &["upload-config", "kubelet"][..],
        &["bootstrap-token"][..],
    ] {
        let mut cmd = Command::new(&kubeadm);
        cmd.args(["init", "phase"])
            .args(phase)
            .arg(format!("--config={}", config_path.display()))
            .arg(format!("--kubeconfig={}", server.kubeconfig_path.display()))
            .arg("--v=1");
        if phase == ["bootstrap-token"] {
            cmd.arg("--skip-token-print");
        }
        let out = cmd.output().map_err(io_err(format!(
            "running kubeadm init phase {}",
            phase.join(" ")
        )))?;
        let shown = format!(
            "$ kubeadm init phase {}\n{}{}",
            phase.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        output.push_str(&shown);
        if !out.status.success() {
            return Err(TestEnvError::Io {
                context: format!("kubeadm init phase {}", phase.join(" ")),
                source: std::io::Error::other(shown),
            });
        }
    }
    let _ = nodes
        .delete(&control_plane_node, &DeleteParams::default())
        .await;

    // kubeadm writes cluster-info from the kubeconfig it is given, whose server is, after a
    // real `kubeadm init`, the control-plane endpoint; a joining kubeadm then talks to that
    // server. The host reaches this API server at 127.0.0.1 only, so the phase ran with that
    // address, and cluster-info gets the endpoint guests use, as after `kubeadm init`. (The
    // bootstrap signer signs the content as it is now.)
    let public: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-public");
    let mut cluster_info =
        public
            .get("cluster-info")
            .await
            .map_err(|e| TestEnvError::Kubeconfig {
                name: name.to_string(),
                message: format!("reading kube-public/cluster-info: {e}"),
            })?;
    let local = format!("server: https://127.0.0.1:{}", server.port);
    let guest = format!("server: https://{guest_endpoint}");
    if let Some(kubeconfig) = cluster_info
        .data
        .as_mut()
        .and_then(|d| d.get_mut("kubeconfig"))
    {
        *kubeconfig = kubeconfig.replace(&local, &guest);
    }
    public
        .replace("cluster-info", &PostParams::default(), &cluster_info)
        .await
        .map_err(|e| TestEnvError::Kubeconfig {
            name: name.to_string(),
            message: format!("writing kube-public/cluster-info: {e}"),
        })?;

    let cert_dir = server.dir.join("certs");
    let mut args = vec![
        format!("--kubeconfig={}", server.kubeconfig_path.display()),
        "--controllers=csrapproving,csrsigning,csrcleaner,bootstrapsigner,tokencleaner,nodelifecycle"
            .to_string(),
        format!(
            "--node-monitor-grace-period={}s",
            NODE_MONITOR_GRACE_PERIOD.as_secs()
        ),
        format!(
            "--cluster-signing-cert-file={}",
            cert_dir.join("client-ca.crt").display()
        ),
        format!(
            "--cluster-signing-key-file={}",
            cert_dir.join("client-ca.key").display()
        ),
        "--leader-elect=false".to_string(),
        "--use-service-account-credentials=false".to_string(),
        "--secure-port=0".to_string(),
        "--v=2".to_string(),
    ];
    args.extend(crate::testenv::insecure_port_off(&kcm));
    let log = server.dir.join("kube-controller-manager.log");
    let mut controller_manager = ManagedProcess::spawn(
        &format!("kube-controller-manager {name}"),
        &kcm,
        &args,
        &log,
    )?;

    // The bootstrap signer has signed cluster-info for the tokens once a `jws-kubeconfig-`
    // key shows up; until then no guest could validate it.
    let started = Instant::now();
    loop {
        controller_manager.check_running()?;
        let signed = public
            .get_opt("cluster-info")
            .await
            .ok()
            .flatten()
            .and_then(|cm| cm.data)
            .is_some_and(|d| d.keys().any(|k| k.starts_with("jws-kubeconfig-")));
        if signed {
            break;
        }
        if started.elapsed() > Duration::from_secs(120) {
            return Err(TestEnvError::Timeout {
                name: format!("kube-controller-manager {name} (signing cluster-info)"),
                secs: 120,
                log_tail: controller_manager.log_tail(30),
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(KubeadmControlPlane {
        guest_endpoint,
        kubernetes_version: version,
        kubeadm_output: output,
        controller_manager,
    })
}

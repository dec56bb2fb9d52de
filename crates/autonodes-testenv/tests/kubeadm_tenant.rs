//! The tenant prepared as a kubeadm control plane does what `kubeadm join` needs: the
//! uploaded configuration names the guests' address, `cluster-info` is signed for the
//! tokens, and a kubelet's bootstrap CSR made with a bootstrap token is approved and
//! signed by the real kube-controller-manager.

use std::process::Command;
use std::time::{Duration, Instant};

use autonodes_testenv::kubeadm_tenant::{self, k8s_binary};
use autonodes_testenv::testenv::{client_from_kubeconfig, TestEnv};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::Kubeconfig;

const GUEST_HOST: &str = "10.0.2.2";

#[tokio::test]
async fn a_bootstrap_token_csr_is_approved_and_signed_and_the_join_address_is_published() {
    let mut env = TestEnv::start(&[]).await.expect("etcd");
    env.add_apiserver_serving("tenant", &[GUEST_HOST])
        .await
        .expect("tenant API server");
    let cp = kubeadm_tenant::prepare(&env, "tenant", GUEST_HOST)
        .await
        .expect("kubeadm control plane");
    println!("{}", cp.kubeadm_output);
    let server = env.apiserver("tenant").expect("tenant");
    let admin = server.client().await.expect("client");

    // The published join address and the kubelet configuration of kubeadm's phases.
    let system: Api<ConfigMap> = Api::namespaced(admin.clone(), "kube-system");
    let kubeadm_config = system.get("kubeadm-config").await.expect("kubeadm-config");
    let cluster_config = &kubeadm_config.data.expect("data")["ClusterConfiguration"];
    assert!(
        cluster_config.contains(&format!(
            "controlPlaneEndpoint: {GUEST_HOST}:{}",
            server.port
        )),
        "{cluster_config}"
    );
    let kubelet = system
        .get("kubelet-config-1.20")
        .await
        .expect("kubelet-config-1.20");
    assert!(kubelet.data.expect("data")["kubelet"].contains("cgroupDriver: systemd"));

    // A bootstrap token from real kubeadm, as autonodes mints one (a Secret in kube-system).
    let out = Command::new(k8s_binary(&env, "kubeadm").expect("kubeadm"))
        .args(["token", "create", "--ttl", "10m"])
        .arg(format!("--kubeconfig={}", server.kubeconfig_path.display()))
        .output()
        .expect("kubeadm token create");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let id = token.split('.').next().expect("token id").to_string();

    // cluster-info is signed for it (the bootstrap signer), so discovery can validate it.
    let public: Api<ConfigMap> = Api::namespaced(admin.clone(), "kube-public");
    let info = public.get("cluster-info").await.expect("cluster-info");
    assert!(
        info.data.unwrap_or_default()["kubeconfig"]
            .contains(&format!("server: https://{GUEST_HOST}:{}", server.port)),
        "cluster-info names the guests' endpoint"
    );
    let started = Instant::now();
    loop {
        let data = public
            .get("cluster-info")
            .await
            .expect("cluster-info")
            .data
            .unwrap_or_default();
        if data.contains_key(&format!("jws-kubeconfig-{id}")) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "cluster-info never signed for {id}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // A kubelet's bootstrap CSR, posted with the token: approved and signed.
    let dir = tempfile::tempdir().expect("dir");
    let key = dir.path().join("k.key");
    let csr = dir.path().join("k.csr");
    let status = Command::new("openssl")
        .args([
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .args(["-nodes", "-subj", "/O=system:nodes/CN=system:node:guest-1"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&csr)
        .status()
        .expect("openssl");
    assert!(status.success());
    let pem = std::fs::read(&csr).expect("csr");
    let mut kc = server.kubeconfig().expect("kubeconfig");
    for user in &mut kc.auth_infos {
        if let Some(info) = user.auth_info.as_mut() {
            info.token = Some(token.clone().into());
        }
    }
    let bootstrap = client_from_kubeconfig("tenant", Kubeconfig { ..kc })
        .await
        .expect("bootstrap client");
    let csrs: Api<CertificateSigningRequest> = Api::all(bootstrap);
    let object: CertificateSigningRequest = serde_json::from_value(serde_json::json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": "node-csr-guest-1"},
        "spec": {
            "request": base64_encode(&pem),
            "signerName": "kubernetes.io/kube-apiserver-client-kubelet",
            "usages": ["digital signature", "key encipherment", "client auth"],
        },
    }))
    .expect("csr object");
    csrs.create(&PostParams::default(), &object)
        .await
        .expect("the bootstrap token may create a CSR");
    let admin_csrs: Api<CertificateSigningRequest> = Api::all(admin.clone());
    let started = Instant::now();
    let issued = loop {
        let got = admin_csrs.get("node-csr-guest-1").await.expect("csr");
        if let Some(cert) = got.status.and_then(|s| s.certificate) {
            break cert;
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "the CSR was not approved and signed; controller-manager log: {}",
            std::fs::read_to_string(cp.controller_manager_log()).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let issued = String::from_utf8_lossy(&issued.0).to_string();
    assert!(issued.contains("BEGIN CERTIFICATE"), "{issued}");
    println!("kubeadm tenant: CSR node-csr-guest-1 approved and signed by the cluster CA");

    // A Node whose kubelet stopped posting (it said Ready once, then nothing): the node
    // lifecycle controller marks it Unknown, as in every kubeadm cluster.
    let nodes: Api<Node> = Api::all(admin);
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": "gone-quiet"}}))
                .expect("a Node"),
        )
        .await
        .expect("a Node");
    let then = "2026-01-01T00:00:00Z";
    nodes
        .patch_status(
            "gone-quiet",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"conditions": [{
                "type": "Ready", "status": "True", "reason": "KubeletReady",
                "lastHeartbeatTime": then, "lastTransitionTime": then,
            }]}})),
        )
        .await
        .expect("Ready, once");
    let started = Instant::now();
    loop {
        let ready = nodes
            .get("gone-quiet")
            .await
            .expect("node")
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| c.status);
        if ready.as_deref() == Some("Unknown") {
            break;
        }
        assert!(
            started.elapsed() < kubeadm_tenant::NODE_MONITOR_GRACE_PERIOD + Duration::from_secs(60),
            "the Node still says {ready:?}; controller-manager log: {}",
            std::fs::read_to_string(cp.controller_manager_log()).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "kubeadm tenant: a Node whose kubelet went quiet marked Ready=Unknown after {} s",
        started.elapsed().as_secs()
    );
}

fn base64_encode(data: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(data)
}

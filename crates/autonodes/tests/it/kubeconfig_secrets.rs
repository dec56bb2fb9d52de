//! Kubeconfig Secrets are untrusted input: on real API servers, every refused form, in a
//! host Secret and in a tenant `vc-<name>` Secret, ends in reason `InvalidKubeconfig`, an
//! Event and a log line naming the field — and runs no command, uses no local file (not
//! even one holding a valid admin token of the target cluster) and sends nothing to the
//! server it names. The shapes vCluster and `kubectl config view --flatten` export still
//! work, and everything else keeps being served.
use crate::common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use autonodes_testenv::playground::{put_kubeconfig_secret, SERVICE_NAMESPACE};
use autonodes_testenv::simulator::SimMode;
use autonodes_testenv::testenv::{admin_kubeconfig, client_cert_kubeconfig, ApiServer};
use base64::Engine;
use common::world::*;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(90);

/// Everything the controller logs in this test binary (the subscriber is global).
fn logs() -> Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = buf.clone();
        let _ = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                "warn,kube_client::client::builder=off",
            ))
            .with_writer(move || Capture(sink.clone()))
            .try_init();
        buf
    })
    .clone()
}

struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut b) = self.0.lock() {
            b.extend_from_slice(data);
        }
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn log_text() -> String {
    String::from_utf8_lossy(&logs().lock().expect("logs").clone()).into_owned()
}

/// A TCP listener on loopback that counts every connection made to it.
struct Listener {
    port: u16,
    connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Listener {
    async fn start() -> Listener {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback listener");
        let port = listener.local_addr().expect("address").port();
        let connections = Arc::new(AtomicUsize::new(0));
        let counter = connections.clone();
        let task = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                drop(socket);
            }
        });
        Listener {
            port,
            connections,
            task,
        }
    }

    fn count(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One refused kubeconfig: its name, the field its refusal must name, the kubeconfig, the
/// values that must never show up in a condition, Event or log, and files that an
/// executed command would have created.
struct Case {
    name: &'static str,
    field: &'static str,
    kubeconfig: String,
    never_shown: Vec<String>,
    markers: Vec<PathBuf>,
}

/// What the cases point at: the real target API server (with a valid admin token, so a
/// kubeconfig that was used would work), the counting listener, and a scratch directory.
struct Target<'a> {
    server: &'a ApiServer,
    listener_port: u16,
    dir: &'a Path,
}

fn b64(d: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(d)
}

fn kc(cluster: &str, user: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n{cluster}\nusers:\n- name: u\n  user:\n{user}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
    )
}

fn write_file(dir: &Path, name: &str, data: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, data).expect("write a scratch file");
    p
}

fn cases(t: &Target<'_>, side: &str) -> Vec<Case> {
    let real = &t.server.url;
    let ca = format!("    certificate-authority-data: {}", b64(&t.server.ca_pem));
    let real_cluster = format!("    server: {real}\n{ca}");
    let listener_cluster = format!("    server: https://127.0.0.1:{}\n{ca}", t.listener_port);
    let token = &t.server.admin_token;
    let valid_user = format!("    token: {token}");
    let exec_marker = t.dir.join(format!("{side}-exec-ran"));
    let plugin_marker = t.dir.join(format!("{side}-auth-provider-ran"));
    let token_file = write_file(t.dir, &format!("{side}-token"), token.as_bytes());
    let ca_file = write_file(t.dir, &format!("{side}-ca.pem"), &t.server.ca_pem);
    let cert_file = write_file(
        t.dir,
        &format!("{side}-client.crt"),
        &t.server.admin_client_cert_pem,
    );
    let key_file = write_file(
        t.dir,
        &format!("{side}-client.key"),
        &t.server.admin_client_key_pem,
    );
    let path = |p: &Path| p.display().to_string();
    let case = |name, field, kubeconfig: String, never_shown: Vec<String>| Case {
        name,
        field,
        kubeconfig,
        never_shown,
        markers: vec![],
    };
    vec![
        Case {
            markers: vec![exec_marker.clone()],
            ..case(
                "exec",
                "users[u].user.exec",
                kc(
                    &listener_cluster,
                    &format!(
                        "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /usr/bin/touch\n      args: [{}]\n      interactiveMode: Never",
                        path(&exec_marker)
                    ),
                ),
                vec![path(&exec_marker)],
            )
        },
        Case {
            markers: vec![plugin_marker.clone()],
            ..case(
                "auth-provider",
                "users[u].user.auth-provider",
                kc(
                    &listener_cluster,
                    &format!(
                        "    auth-provider:\n      name: gcp\n      config:\n        cmd-path: /usr/bin/touch\n        cmd-args: {}",
                        path(&plugin_marker)
                    ),
                ),
                vec![path(&plugin_marker)],
            )
        },
        // A file holding a valid admin token of the target: it would work if it were read.
        case(
            "token-file",
            "users[u].user.tokenFile",
            kc(&real_cluster, &format!("    tokenFile: {}", path(&token_file))),
            vec![path(&token_file), token.clone()],
        ),
        case(
            "basic-auth",
            "users[u].user.username",
            kc(&real_cluster, "    username: admin\n    password: pw-never-shown"),
            vec!["pw-never-shown".into()],
        ),
        // The real CA as a file, with a valid token: it would work if the file were read.
        case(
            "ca-file",
            "clusters[c].cluster.certificate-authority",
            kc(
                &format!("    server: {real}\n    certificate-authority: {}", path(&ca_file)),
                &valid_user,
            ),
            vec![path(&ca_file), token.clone()],
        ),
        case(
            "client-cert-file",
            "users[u].user.client-certificate",
            kc(
                &real_cluster,
                &format!(
                    "    client-certificate: {}\n    client-key: {}",
                    path(&cert_file),
                    path(&key_file)
                ),
            ),
            vec![path(&cert_file), path(&key_file)],
        ),
        case(
            "client-key-file",
            "users[u].user.client-key",
            kc(
                &real_cluster,
                &format!(
                    "    client-certificate-data: {}\n    client-key: {}",
                    b64(&t.server.admin_client_cert_pem),
                    path(&key_file)
                ),
            ),
            vec![path(&key_file)],
        ),
        case(
            "proxy",
            "clusters[c].cluster.proxy-url",
            kc(
                &format!("{real_cluster}\n    proxy-url: http://127.0.0.1:{}", t.listener_port),
                &valid_user,
            ),
            vec![token.clone()],
        ),
        case(
            "impersonate",
            "users[u].user.as",
            kc(&real_cluster, &format!("{valid_user}\n    as: system:kube-controller-manager")),
            vec![token.clone()],
        ),
        case(
            "impersonate-groups",
            "users[u].user.as-groups",
            kc(&real_cluster, &format!("{valid_user}\n    as-groups: [system:masters]")),
            vec![token.clone()],
        ),
        case(
            "impersonate-uid",
            "users[u].user.as-uid",
            kc(&real_cluster, &format!("{valid_user}\n    as-uid: uid-never-shown")),
            vec![token.clone(), "uid-never-shown".into()],
        ),
        case(
            "impersonate-extra",
            "users[u].user.as-user-extra",
            kc(
                &real_cluster,
                &format!("{valid_user}\n    as-user-extra: {{scopes: [extra-never-shown]}}"),
            ),
            vec![token.clone(), "extra-never-shown".into()],
        ),
        case(
            "metadata-server",
            "clusters[c].cluster.server",
            kc(
                &format!("    server: https://169.254.169.254\n{ca}"),
                &valid_user,
            ),
            vec![token.clone()],
        ),
        case(
            "plain-http",
            "clusters[c].cluster.server",
            kc(
                &format!("    server: http://127.0.0.1:{}\n{ca}", t.listener_port),
                &valid_user,
            ),
            vec![token.clone()],
        ),
        case(
            "insecure",
            "clusters[c].cluster.insecure-skip-tls-verify",
            kc(
                &format!(
                    "    server: https://127.0.0.1:{}\n    insecure-skip-tls-verify: true",
                    t.listener_port
                ),
                &valid_user,
            ),
            vec![token.clone()],
        ),
    ]
}

/// Checks what every refused case must show: the message names the field and none of
/// the values, and the log line names the Secret and the field.
fn assert_refusal_shown(case: &Case, message: &str, secret: &str) {
    assert!(
        message.contains(case.field),
        "{}: the message does not name {}: {message}",
        case.name,
        case.field
    );
    for v in &case.never_shown {
        assert!(
            !message.contains(v.as_str()),
            "{}: the message shows {v}: {message}",
            case.name
        );
    }
    let logs = log_text();
    assert!(
        logs.lines().any(|l| l.contains("kubeconfig Secret refused")
            && l.contains(&format!("secret={secret} "))
            && l.contains(&format!("field={}", case.field))),
        "{}: no log line names Secret {secret} and field {}",
        case.name,
        case.field
    );
}

/// Waits for a Warning Event `InvalidKubeconfig` about `name` and checks that no Event
/// about it shows a value of the case.
async fn assert_event_without_values(world: &World, namespace: &str, name: &str, case: &Case) {
    let events = common::eventually(&format!("an Event for {name}"), WAIT, || async {
        let e = match namespace {
            // A cluster-scoped object's: in `default` or `kube-system` (1.20).
            "" => world.cluster_events_for(name).await,
            ns => world.events_for(ns, name).await,
        };
        e.iter()
            .any(|e| e.starts_with("InvalidKubeconfig"))
            .then_some(e)
    })
    .await;
    for v in &case.never_shown {
        assert!(
            events.iter().all(|e| !e.contains(v.as_str())),
            "{name}: an Event shows {v}: {events:?}"
        );
    }
}

/// Nothing ran, nothing reached the listener, no value of any case was logged.
fn assert_nothing_leaked(cases: &[Case], listener: &Listener) {
    for case in cases {
        for m in &case.markers {
            assert!(
                !m.exists(),
                "{}: the command named in the kubeconfig ran ({} exists)",
                case.name,
                m.display()
            );
        }
    }
    assert_eq!(
        listener.count(),
        0,
        "the listener named as server or proxy was contacted"
    );
    let logs = log_text();
    for case in cases {
        for v in &case.never_shown {
            assert!(
                !logs.contains(v.as_str()),
                "{}: the log shows {v}",
                case.name
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_host_kubeconfigs_fail_the_provider_and_run_read_or_send_nothing() {
    logs();
    // Host kubeconfig Secrets of every shape, aimed at a host of its own.
    let world = World::start(WorldOptions {
        separate_host: true,
        ..WorldOptions::default()
    })
    .await;
    let listener = Listener::start().await;
    let scratch = tempfile::tempdir().expect("scratch dir");
    let host = world.playground.host().expect("host");
    let cases = cases(
        &Target {
            server: host,
            listener_port: listener.port,
            dir: scratch.path(),
        },
        "host",
    );
    for case in &cases {
        let name = format!("kc-{}", case.name);
        put_kubeconfig_secret(
            &world.mgmt,
            SERVICE_NAMESPACE,
            &name,
            "kubeconfig",
            &case.kubeconfig,
        )
        .await
        .expect("secret");
        world
            .apply_provider(&provider_yaml(
                &name,
                &name,
                "1",
                "1Gi",
                "      - name: small\n",
            ))
            .await;
    }
    // Everything else keeps being served.
    world.claim_type("good", "standard-node").await;

    for case in &cases {
        let name = format!("kc-{}", case.name);
        let p = world
            .wait_provider(&name, "HostReachable=InvalidKubeconfig", |p| {
                provider_condition(p, "HostReachable")
                    .is_some_and(|c| c.0 == "False" && c.1 == "InvalidKubeconfig")
            })
            .await;
        let (_, _, message) = provider_condition(&p, "HostReachable").expect("condition");
        let ready = provider_condition(&p, "Ready").expect("Ready");
        assert_eq!(
            (ready.0.as_str(), ready.1.as_str()),
            ("False", "InvalidKubeconfig"),
            "{name}"
        );
        assert_refusal_shown(case, &message, &format!("{SERVICE_NAMESPACE}/{name}"));
        assert_event_without_values(&world, "", &name, case).await;
    }
    world.wait_phase("good", "Available", WAIT).await;
    // Providers are looked at again every 30 s; give a refused one time to misbehave.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_nothing_leaked(&cases, &listener);
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_tenant_kubeconfigs_fail_claims_and_pools_and_run_read_or_send_nothing() {
    logs();
    let world = World::start(WorldOptions::default()).await;
    let listener = Listener::start().await;
    let scratch = tempfile::tempdir().expect("scratch dir");
    let tenant = world.playground.tenant().expect("tenant");
    let cases = cases(
        &Target {
            server: tenant,
            listener_port: listener.port,
            dir: scratch.path(),
        },
        "tenant",
    );
    for case in &cases {
        let vcluster = format!("kc-{}", case.name);
        put_kubeconfig_secret(
            &world.mgmt,
            NS,
            &format!("vc-{vcluster}"),
            "config",
            &case.kubeconfig,
        )
        .await
        .expect("secret");
        world
            .create_claim(json!({"metadata": {"name": vcluster}, "spec": {"vClusterRef": {"name": vcluster}}}))
            .await;
    }
    // A static and a dynamic pool whose tenants' Secrets run a command / read a file.
    world
        .create_pool(
            "static-exec",
            json!({"vClusterRef": {"name": "kc-exec"}, "replicas": 1}),
        )
        .await;
    world
        .create_pool(
            "dynamic-token-file",
            json!({"vClusterRef": {"name": "kc-token-file"}, "limits": {"nodes": 3}}),
        )
        .await;
    world.claim_type("good", "standard-node").await;

    for case in &cases {
        let name = format!("kc-{}", case.name);
        let claim = world
            .wait_claim(&name, "Scheduled=InvalidKubeconfig", WAIT, |c| {
                condition(c, "Scheduled")
                    .is_some_and(|x| x.0 == "False" && x.1 == "InvalidKubeconfig")
            })
            .await;
        let (_, _, message) = condition(&claim, "Scheduled").expect("Scheduled");
        assert_refusal_shown(case, &message, &format!("{NS}/vc-{name}"));
        assert_event_without_values(&world, NS, &name, case).await;
    }
    for (pool, field) in [
        ("static-exec", "users[u].user.exec"),
        ("dynamic-token-file", "users[u].user.tokenFile"),
    ] {
        let p = world
            .wait_pool(pool, "Ready=InvalidKubeconfig", |p| {
                pool_condition(p, "Ready")
                    .is_some_and(|c| c.0 == "False" && c.1 == "InvalidKubeconfig")
            })
            .await;
        let (_, _, message) = pool_condition(&p, "Ready").expect("Ready");
        assert!(message.contains(field), "{pool}: {message}");
        common::eventually(&format!("an Event for pool {pool}"), WAIT, || async {
            let e = world.events_for(NS, pool).await;
            e.iter()
                .any(|e| e.starts_with("InvalidKubeconfig"))
                .then_some(())
        })
        .await;
    }
    world.wait_phase("good", "Available", WAIT).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_nothing_leaked(&cases, &listener);
    // No claim of a refused tenant got a VM: only the good claim's is there.
    assert_eq!(world.vms().await.len(), 1);
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vcluster_shaped_client_certificate_kubeconfigs_serve_hosts_and_tenants_and_insecure_needs_the_opt_in(
) {
    logs();
    // The host's kubeconfig Secret is replaced: a host of its own.
    let mut world = World::start_clusters(&WorldOptions {
        separate_host: true,
        ..WorldOptions::default()
    })
    .await;
    world
        .config
        .kubeconfig_policy
        .allow_insecure_skip_tls_verify = true;
    let host = world.playground.host().expect("host");
    let tenant = world.playground.tenant().expect("tenant");
    // Replace both Secrets the playground wrote (token kubeconfigs) by the shape a vCluster
    // exports: inline CA, client certificate and key.
    put_kubeconfig_secret(
        &world.mgmt,
        SERVICE_NAMESPACE,
        "test-kubevirt-1",
        "kubeconfig",
        &client_cert_kubeconfig(
            "host",
            &host.url,
            &host.ca_pem,
            &host.admin_client_cert_pem,
            &host.admin_client_key_pem,
        ),
    )
    .await
    .expect("host secret");
    put_kubeconfig_secret(
        &world.mgmt,
        NS,
        "vc-tenant",
        "config",
        &client_cert_kubeconfig(
            "my-vcluster",
            &tenant.url,
            &tenant.ca_pem,
            &tenant.admin_client_cert_pem,
            &tenant.admin_client_key_pem,
        ),
    )
    .await
    .expect("tenant secret");
    // With the opt-in, a kubeconfig that skips the certificate check is accepted.
    let insecure = admin_kubeconfig("host", &host.url, &host.ca_pem, &host.admin_token).replace(
        &format!("certificate-authority-data: {}", b64(&host.ca_pem)),
        "insecure-skip-tls-verify: true",
    );
    assert!(insecure.contains("insecure-skip-tls-verify: true"));
    put_kubeconfig_secret(
        &world.mgmt,
        SERVICE_NAMESPACE,
        "insecure-host",
        "kubeconfig",
        &insecure,
    )
    .await
    .expect("insecure secret");
    world
        .apply_provider(&provider_yaml(
            "insecure-host",
            "insecure-host",
            "1",
            "1Gi",
            "      - name: small\n",
        ))
        .await;
    world.start_simulator(SimMode::Normal).await;
    world.start_controller();

    world.claim_type("vcluster-shaped", "standard-node").await;
    let claim = world.wait_phase("vcluster-shaped", "Available", WAIT).await;
    assert!(claim.status.and_then(|s| s.node_name).is_some());
    let p = world
        .wait_provider("kubevirt-provider-advanced", "Ready", |p| {
            provider_condition(p, "Ready").is_some_and(|c| c.0 == "True")
        })
        .await;
    assert_eq!(
        provider_condition(&p, "HostReachable").map(|c| c.1),
        Some("HostReachable".into())
    );
    world
        .wait_provider("insecure-host", "Ready with the opt-in", |p| {
            provider_condition(p, "HostReachable").is_some_and(|c| c.0 == "True")
        })
        .await;
    world.shutdown().await;
}

/// The kubeconfig a vCluster exports in `vc-<name>` (key `config`), as its chart writes it
/// by default: the server is the vCluster's own `https://localhost:8443`, with its CA, the
/// super-admin's client certificate and key inline, under kubeadm's entry names.
fn stock_vcluster_kubeconfig(tenant: &ApiServer) -> String {
    format!(
        "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: {}\n    server: https://localhost:8443\n  name: kubernetes\ncontexts:\n- context:\n    cluster: kubernetes\n    user: kubernetes-super-admin\n  name: kubernetes-super-admin@kubernetes\ncurrent-context: kubernetes-super-admin@kubernetes\nkind: Config\npreferences: {{}}\nusers:\n- name: kubernetes-super-admin\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\n",
        b64(&tenant.ca_pem),
        b64(&tenant.admin_client_cert_pem),
        b64(&tenant.admin_client_key_pem),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stock_vcluster_kubeconfig_naming_localhost_is_reached_through_the_vclusters_service_and_a_loopback_server_without_one_stays_refused(
) {
    use autonodes::remote::egress::Egress;
    use autonodes_core::address_policy::{AddressPolicy, Cidr};
    use autonodes_testenv::testenv::{ServerOptions, TestEnv};
    use k8s_openapi::api::core::v1::{Secret, Service};
    use kube::api::{Api, Patch, PatchParams};

    logs();
    // The management cluster hands out Services loopback ClusterIPs (nothing routes them
    // here), and the tenant — the vCluster `tenant` in namespace `tenant` — listens on
    // 127.0.0.2 with a certificate for that address and `tenant.tenant`, as a vCluster's
    // certificate carries its Service's ClusterIP and `<name>.<namespace>`.
    let mut env = TestEnv::start(&["host"]).await.expect("host");
    env.add_apiserver_with(
        "mgmt",
        &ServerOptions {
            service_cluster_ip_range: Some("127.0.0.0/24".into()),
            ..ServerOptions::default()
        },
    )
    .await
    .expect("mgmt");
    env.add_apiserver_with(
        "tenant",
        &ServerOptions {
            bind_address: Some("127.0.0.2".into()),
            serving_dns_names: vec![format!("tenant.{NS}")],
            ..ServerOptions::default()
        },
    )
    .await
    .expect("tenant");
    let mut world = World::on(env, &WorldOptions::default()).await;
    // Tenants may be reached at 127.0.0.2 only: `localhost` (127.0.0.1) stays refused.
    let only = |cidr: &str| {
        std::sync::Arc::new(AddressPolicy {
            allow: vec![Cidr::parse(cidr).expect("cidr")],
            ..AddressPolicy::default()
        })
    };
    world.config.egress = Egress {
        host: only("127.0.0.1"),
        tenant: only("127.0.0.2"),
        ..Egress::default()
    };
    let tenant = world.playground.tenant().expect("tenant");
    let port = tenant.port;
    assert_eq!(tenant.url, format!("https://127.0.0.2:{port}"));
    // The Secret exactly as the vCluster chart writes it.
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "vc-tenant", "namespace": NS,
                     "labels": {"app": "vcluster", "vcluster-name": "tenant"}},
        "type": "Opaque",
        "data": {
            "config": b64(stock_vcluster_kubeconfig(tenant).as_bytes()),
            "certificate-authority": b64(&tenant.ca_pem),
            "client-certificate": b64(&tenant.admin_client_cert_pem),
            "client-key": b64(&tenant.admin_client_key_pem),
        }
    }))
    .expect("secret");
    let apply = PatchParams::apply("vcluster").force();
    Api::<Secret>::namespaced(world.mgmt.clone(), NS)
        .patch("vc-tenant", &apply, &Patch::Apply(&secret))
        .await
        .expect("vc-tenant");
    world.start_simulator(SimMode::Normal).await;
    world.start_controller();

    // No vCluster Service: the loopback server stays refused, and the condition says why.
    world.claim_type("stock-1", "standard-node").await;
    let claim = world
        .wait_claim("stock-1", "Scheduled=InvalidKubeconfig", WAIT, |c| {
            condition(c, "Scheduled").is_some_and(|x| {
                x.0 == "False" && x.1 == "InvalidKubeconfig" && x.2.contains("no vCluster Service")
            })
        })
        .await;
    let (_, _, message) = condition(&claim, "Scheduled").expect("Scheduled");
    assert!(
        message.contains("https://localhost:8443 is a loopback address")
            && message.contains("exportKubeConfig.server"),
        "{message}"
    );

    // A Service of that name that is not the vCluster chart's is not followed.
    let services: Api<Service> = Api::namespaced(world.mgmt.clone(), NS);
    let service = |labels: serde_json::Value| -> Service {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "tenant", "namespace": NS, "labels": labels},
            "spec": {"type": "ClusterIP", "clusterIP": "127.0.0.2",
                     "selector": {"app": "vcluster", "release": "tenant"},
                     "ports": [{"name": "https", "port": port, "targetPort": 8443, "protocol": "TCP"},
                               {"name": "kubelet", "port": 10250, "targetPort": 8443, "protocol": "TCP"}]}
        }))
        .expect("service")
    };
    services
        .patch(
            "tenant",
            &apply,
            &Patch::Apply(&service(json!({"app": "web"}))),
        )
        .await
        .expect("service");
    world
        .wait_claim("stock-1", "the Service refused by its labels", WAIT, |c| {
            condition(c, "Scheduled").is_some_and(|x| {
                x.1 == "InvalidKubeconfig" && x.2.contains("is not the vCluster chart's")
            })
        })
        .await;

    // The chart's Service: the claim is served through it.
    services
        .patch(
            "tenant",
            &apply,
            &Patch::Apply(&service(
                json!({"app": "vcluster", "release": "tenant", "heritage": "Helm"}),
            )),
        )
        .await
        .expect("service");
    let claim = world.wait_phase("stock-1", "Available", WAIT).await;
    let (_, _, joined) = condition(&claim, "Joined").expect("Joined");
    assert!(
        joined.contains(&format!("through Service {NS}/tenant at 127.0.0.2:{port}"))
            && joined.contains(&format!("certificate checked for tenant.{NS}")),
        "{joined}"
    );
    let node = world.nodes().await;
    assert_eq!(node.len(), 1, "the claim's node joined the vCluster");
    println!("stock vCluster: {joined}");
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_management_api_server_s_addresses_are_read_again_and_a_client_made_before_they_were_known_is_dropped_and_then_refused(
) {
    use autonodes::controller::management_api;
    use autonodes::remote::clients::{ClusterClients, TenantLimits};
    use autonodes::remote::egress::{Egress, ManagementAddresses};
    use autonodes_testenv::testenv::TestEnv;
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::{Api, ListParams};

    logs();
    let env = TestEnv::start(&["mgmt"]).await.expect("mgmt");
    let server = env.apiserver("mgmt").expect("mgmt");
    let mgmt = server.client().await.expect("client");
    let endpoint = format!("127.0.0.1:{}", server.port);

    // Read from the real API server: the server itself and the `kubernetes` Service (its
    // Endpoints are written a moment after the server starts).
    let read = common::eventually("the management API server's addresses", WAIT, || async {
        management_api::read(&mgmt, Some(&endpoint)).await.ok()
    })
    .await;
    let own: std::net::SocketAddr = endpoint.parse().expect("addr");
    assert!(read.contains(&own), "{read:?}");
    assert!(
        read.iter().any(|a| a.port() == 443),
        "the Service's ClusterIP: {read:?}"
    );

    // A host Secret naming the management API server itself, served by a client made while
    // the addresses were not known as they are (a list read before the server moved).
    put_kubeconfig_secret(
        &mgmt,
        SERVICE_NAMESPACE,
        "itself",
        autonodes_api::HOST_KUBECONFIG_KEY,
        &server.kubeconfig_yaml().expect("kubeconfig"),
    )
    .await
    .expect("secret");
    let known = Arc::new(ManagementAddresses::known(Vec::new()));
    let egress = Egress {
        management: known.clone(),
        ..Egress::allowing_list("127.0.0.1").expect("cidr")
    };
    let clients = ClusterClients::new(
        mgmt.clone(),
        SERVICE_NAMESPACE,
        Default::default(),
        egress,
        TenantLimits::default(),
    );
    let stale = clients.host("itself").await.expect("client");
    Api::<Namespace>::all(stale.client.clone())
        .list(&ListParams::default().limit(1))
        .await
        .expect("connected, with the stale list");
    assert_eq!(clients.cached().await.len(), 1);

    // Read again: the addresses changed, the cached client is dropped, and the next one is
    // refused before it connects.
    assert!(management_api::read_again(&mgmt, Some(&endpoint), &known, &clients).await);
    assert!(clients.cached().await.is_empty(), "cached clients dropped");
    let fresh = clients.host("itself").await.expect("client");
    let refused = Api::<Namespace>::all(fresh.client.clone())
        .list(&ListParams::default().limit(1))
        .await
        .expect_err("the management API server is refused");
    let chain: Vec<String> = autonodes::remote::egress::causes(&refused)
        .map(|e| e.to_string())
        .collect();
    assert!(
        chain
            .iter()
            .any(|e| e.contains("it is the management cluster's API server")),
        "{chain:?}"
    );
    assert!(
        !management_api::read_again(&mgmt, Some(&endpoint), &known, &clients).await,
        "unchanged"
    );

    // An identity that may read neither the Service nor the Endpoints reads nothing (no
    // partial list): what was known stays, and before the first read nothing is known, so
    // nothing is connected to.
    let mut config = kube::Config::from_custom_kubeconfig(
        server.kubeconfig().expect("kubeconfig"),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .expect("config");
    config.auth_info.impersonate = Some("nobody".into());
    let nobody = kube::Client::try_from(config).expect("client");
    let why = management_api::read(&nobody, Some(&endpoint))
        .await
        .expect_err("forbidden");
    assert!(why.contains("default/kubernetes Service"), "{why}");
    let before = known.current();
    assert!(!management_api::read_again(&nobody, None, &known, &clients).await);
    assert_eq!(known.current(), before, "the last addresses read are kept");
    let unknown = ManagementAddresses::unknown();
    assert!(
        !management_api::read_before_start(
            &nobody,
            None,
            &unknown,
            tokio::time::sleep(Duration::from_secs(3)),
        )
        .await,
        "still waiting when shut down"
    );
    assert_eq!(unknown.current(), None);
    assert_eq!(
        unknown.check(own),
        Err(autonodes_core::address_policy::Refusal::ManagementApiServerUnknown)
    );
}

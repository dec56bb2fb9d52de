//! Real guests join: one claim of a prepared image and one of a stock image go from
//! creation to a Ready Node with a real kubelet. The host runs the simulator's KubeVirt
//! stand-in with real guests (QEMU with KVM, a NoCloud seed from the user-data Secret as
//! KubeVirt makes it, user-mode network reaching only the tenant's API server and a
//! download mirror on the host's loopback); the tenant is a kube-apiserver prepared as a
//! kubeadm control plane (real `kubeadm init phase` steps and a kube-controller-manager
//! signing the kubelets' certificates). The guests run Debian's cloud-init and
//! containerd, and kubeadm and the kubelet v1.20.2 built from the same tree as the API
//! server: preinstalled on the prepared image, downloaded by autonodes' user data on the
//! stock one. The prepared type also keeps a warm VM: its agent (the real
//! `warm-agent.py`, with the VM's own token) reaches the host's API server at `10.0.2.2`;
//! once both cold claims are Ready, a third claim takes the warm VM, whose agent reads
//! the binding, revokes its own credential, has cloud-init apply the claim's own SSH key,
//! file and command, and joins; the type refills, and keeping no warm VM from then on
//! removes the refill before its guest has booted. The guests themselves are checked too:
//! cloud-init read the NoCloud seed and ended `done`, the stock guest reaches no host port
//! it was not given, and it powers itself off at the ACPI button when its VM goes. The stock
//! type's nodes get static addresses (cloud-init network data): the stock node is powered
//! off and on again and comes back Ready with the same address. Skipped,
//! with the reason, where KVM or the guest images are missing.

use crate::common;

use std::time::{Duration, Instant};

use autonodes::controller::config::ControllerConfig;
use autonodes_testenv::download_mirror::DownloadMirror;
use autonodes_testenv::kubeadm_tenant;
use autonodes_testenv::qemu::{self, BootOptions, GuestImage, GuestNetwork, Variant};
use autonodes_testenv::simulator::{real_guest::RealGuests, SimOptions};
use autonodes_testenv::testenv::TestEnv;
use common::world::*;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DynamicObject, ListParams};
use kube::ResourceExt;

const VM_NS: &str = "vcluster-platform";
/// The warm claim's own SSH key.
const CLAIM_KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIClaimKeyOfTheWarmClaim warm-1@example";
/// The warm claim's own user data: a file, and a command that reads it and counts the
/// claim's key among the authorized ones, on the console.
const CLAIM_USER_DATA: &str = "#cloud-config
write_files:
  - path: /etc/autonodes-claim
    content: from-the-binding
runcmd:
  - [sh, -c, 'echo \"autonodes-claim-runcmd: file=$(cat /etc/autonodes-claim) keys=$(cat /root/.ssh/authorized_keys /home/*/.ssh/authorized_keys 2>/dev/null | grep -c ClaimKeyOfTheWarmClaim)\" > /dev/console']
";
const READY: Duration = Duration::from_secs(900);

/// The stock claim's own user data: in the background (its `runcmd` goes before the join),
/// it tries a host loopback port the guests were not given and prints what came back.
fn probe_user_data(port: u16) -> String {
    format!(
        "#cloud-config
runcmd:
  - [sh, -c, '(out=$(curl -sS --max-time 15 http://{}:{port}/ 2>&1); echo \"autonodes-probe: exit=$? $out\" > /dev/console) &']
",
        qemu::HOST_ADDRESS
    )
}

/// A listener on the host's loopback that the guests are not given: counts connections.
fn unreachable_listener() -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding a loopback port");
    let port = listener.local_addr().expect("its address").port();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    std::thread::spawn(move || {
        for _ in listener.incoming() {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    (port, accepted)
}

/// The stock type's address pool: the guests' user-mode network (`10.0.2.0/24`), without
/// its gateway (moved to `.254` when the guest is restricted), its DNS server, the host's
/// address and the address its DHCP would hand out.
const STOCK_ADDRESS_POOL: &str = "        addressPool:
          cidr: 10.0.2.0/24
          gateway: 10.0.2.254
          dnsServers: [10.0.2.3]
          exclude: [10.0.2.1, 10.0.2.2, 10.0.2.15]
";

fn provider(host_port: u16, warm: u32) -> String {
    let node_type = |name: &str, prepared: bool| {
        // The prepared type keeps a warm VM; the stock type's nodes get static addresses
        // (network data, on the first interface).
        let (warm, addresses, interfaces, networks) = if prepared {
            (
                format!("        warm:\n          replicas: {warm}\n"),
                "",
                "",
                "",
            )
        } else {
            (
                String::new(),
                STOCK_ADDRESS_POOL,
                "                    interfaces:\n                      - name: default\n                        bridge: {}\n",
                "                networks:\n                  - name: default\n                    pod: {}\n",
            )
        };
        format!(
            "      - name: {name}
        displayName: {name}
        maxCapacity: 3
{warm}{addresses}        properties:
          autonodes.io/image-prepared: \"{prepared}\"
        virtualMachineTemplate:
          spec:
            template:
              spec:
{networks}                domain:
                  devices:
{interfaces}                    disks:
                      - name: rootdisk
                        disk:
                          bus: virtio
                  resources:
                    requests:
                      cpu: \"2\"
                      memory: 2Gi
                volumes:
                  - name: rootdisk
                    containerDisk:
                      image: autonodes.test/guest:{name}
"
        )
    };
    format!(
        "apiVersion: autonodes.io/v1alpha1
kind: NodeProvider
metadata:
  name: real-guests
spec:
  kubeVirt:
    clusterRef:
      cluster: test-kubevirt-1
      namespace: {VM_NS}
    guestApiServer: https://{}:{host_port}
    nodeTypes:
{}{}",
        qemu::HOST_ADDRESS,
        node_type("prepared", true),
        node_type("stock", false)
    )
}

/// The address a claim holds (`status.address`, without its prefix length).
fn claim_address(c: &autonodes_api::NodeClaim) -> Option<String> {
    let a = c.status.as_ref()?.address.as_deref()?;
    Some(a.split('/').next()?.to_string())
}

/// A Node's InternalIP addresses and whether it is Ready and cordoned.
fn node_state(n: &Node) -> (Vec<String>, bool, bool) {
    let status = n.status.clone().unwrap_or_default();
    let internal = status
        .addresses
        .unwrap_or_default()
        .into_iter()
        .filter(|a| a.type_ == "InternalIP")
        .map(|a| a.address)
        .collect();
    let ready = status
        .conditions
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let cordoned = n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
    (internal, ready, cordoned)
}

/// Powers claim `name` off and on again (see the call).
async fn power_cycle(world: &World, real: &RealGuests, name: &str) {
    use autonodes_api::{NodeClaimPhase, PowerState};
    use kube::api::{Patch, PatchParams};
    let claims = world.claims();
    let nodes: Api<Node> = Api::all(world.tenant.clone());
    let before = claims.get(name).await.expect("claim");
    let status = before.status.clone().unwrap_or_default();
    let (vm, node_name) = (
        status.vm_name.clone().unwrap_or_default(),
        status.node_name.clone().unwrap_or_default(),
    );
    let address = claim_address(&before).expect("the stock claim holds an address");
    let node = nodes.get(&node_name).await.expect("node");
    let (internal, _, _) = node_state(&node);
    assert_eq!(
        internal,
        vec![address.clone()],
        "the Node reports its claim's address"
    );
    let set_power = |power: serde_json::Value| {
        let claims = claims.clone();
        async move {
            claims
                .patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(&serde_json::json!({"spec": {"power": power}})),
                )
                .await
                .expect("setting spec.power");
        }
    };
    let wait = |what: &'static str, done: fn(&autonodes_api::NodeClaim) -> bool| {
        let claims = claims.clone();
        async move {
            let started = Instant::now();
            loop {
                let c = claims.get(name).await.expect("claim");
                if done(&c) {
                    return started.elapsed();
                }
                assert!(
                    started.elapsed() < READY,
                    "{name} not {what} within {READY:?}: {:?}",
                    c.status
                );
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    };

    set_power(serde_json::json!("Off")).await;
    let took = wait("powered off", |c| {
        let s = c.status.as_ref();
        s.and_then(|s| s.phase) == Some(NodeClaimPhase::PoweredOff)
            && s.and_then(|s| s.power) == Some(PowerState::Off)
    })
    .await;
    let started = Instant::now();
    while real.power_off(VM_NS, &vm).is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the guest did not power off"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let kept = nodes.get(&node_name).await.expect("the Node is kept");
    assert_eq!(kept.uid(), node.uid(), "the same Node");
    let (_, _, cordoned) = node_state(&kept);
    assert!(cordoned, "the powered-off Node is cordoned");
    println!(
        "real-guest: {name} powered off after {} s: guest {:?}, Node {node_name} kept and cordoned",
        took.as_secs(),
        real.power_off(VM_NS, &vm)
    );

    set_power(serde_json::Value::Null).await;
    // The VM starts once the tenant no longer reports the Node Ready (its node lifecycle
    // controller marks it Unknown): how long the claim said it waited for that.
    let started = Instant::now();
    let mut waited_for_stale_ready = None;
    loop {
        let c = claims.get(name).await.expect("claim");
        let message = c
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.message.clone())
            .unwrap_or_default();
        if message.contains("no longer reports Node") {
            waited_for_stale_ready = Some(started.elapsed());
        } else if c.status.as_ref().and_then(|s| s.power) != Some(PowerState::Off) {
            break;
        }
        assert!(
            started.elapsed() < READY,
            "{name} never started: {:?}",
            c.status
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "real-guest: {name} powered on: waited {} for the tenant to stop reporting the Node Ready",
        waited_for_stale_ready.map_or("not at all".to_string(), |d| format!("{} s", d.as_secs()))
    );
    let took = wait("On and Available", |c| {
        let s = c.status.as_ref();
        s.and_then(|s| s.phase) == Some(NodeClaimPhase::Available)
            && s.and_then(|s| s.power) == Some(PowerState::On)
    })
    .await;
    let after = claims.get(name).await.expect("claim");
    assert_eq!(claim_address(&after).as_deref(), Some(address.as_str()));
    let node = nodes.get(&node_name).await.expect("node");
    let (internal, ready, cordoned) = node_state(&node);
    assert!(
        ready && !cordoned,
        "Ready and schedulable: {:?}",
        node.status
    );
    assert_eq!(internal, vec![address.clone()], "the same address");
    // A new guest booted (a fresh disk): its own cloud-init read the seed and finished.
    let serial = real.serial_text(VM_NS, &vm);
    let verdict = cloud_init_result(&serial);
    assert!(
        verdict.starts_with("done"),
        "the new guest: cloud-init {verdict}"
    );
    assert!(
        world.tokens().await.is_empty(),
        "the power-on's token is deleted once the Node is Ready"
    );
    println!(
        "real-guest: {name} powered on: Node {node_name} Ready again after {} s with the same address {address}; cloud-init {verdict}",
        took.as_secs()
    );
}

/// The guest's cloud-init verdict from its serial console.
fn cloud_init_result(serial: &str) -> String {
    let finished = serial
        .lines()
        .rev()
        .find(|l| l.contains("Cloud-init v.") && l.contains("finished"))
        .map(|l| l.trim().to_string());
    let failed = serial
        .lines()
        .filter(|l| l.contains("autonodes: FAILED") || l.contains("Failed to run module"))
        .map(|l| l.trim().to_string())
        .collect::<Vec<_>>();
    match (finished, failed.is_empty()) {
        (Some(f), true) => format!("done ({f})"),
        (Some(f), false) => format!("error ({f}; {})", failed.join("; ")),
        (None, _) => "not finished".to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_and_a_stock_image_join_the_tenant_with_a_real_kubelet_and_leave_nothing() {
    match qemu::accelerator() {
        Ok(accel) => println!("real-guest: accelerator {accel:?}"),
        Err(why) => {
            eprintln!("SKIPPED: real guests cannot run here: {why}");
            return;
        }
    }
    for variant in [Variant::Prepared, Variant::Stock] {
        if let Err(e) = GuestImage::cached(variant) {
            eprintln!("SKIPPED: {e}");
            return;
        }
    }
    let mut env = TestEnv::start(&["mgmt"]).await.expect("clusters");
    // The guests reach the host's API server (warm VMs' agents) and the tenant's (kubelets)
    // at 10.0.2.2.
    env.add_apiserver_serving("host", &[qemu::HOST_ADDRESS])
        .await
        .expect("host");
    env.add_apiserver_serving("tenant", &[qemu::HOST_ADDRESS])
        .await
        .expect("tenant");
    let host_port = env.apiserver("host").expect("host").port;
    let control_plane = kubeadm_tenant::prepare(&env, "tenant", qemu::HOST_ADDRESS)
        .await
        .expect("kubeadm control plane");
    let tenant_port = env.apiserver("tenant").expect("tenant").port;
    let bin_dir = env
        .bins
        .kube_apiserver
        .parent()
        .expect("bin dir")
        .to_path_buf();
    let version = control_plane.kubernetes_version.clone();
    let mirror = DownloadMirror::start(&bin_dir, &version, &["kubelet", "kubeadm"])
        .await
        .expect("download mirror");
    // The controller's own timeouts: a real guest boots and joins in minutes.
    let defaults = ControllerConfig::default();
    let mut world = World::on(
        env,
        &WorldOptions {
            provider: provider(host_port, 1),
            launch_timeout: defaults.launch_timeout,
            registration_timeout: READY,
            initialization_timeout: defaults.initialization_timeout,
            ..WorldOptions::default()
        },
    )
    .await;
    world.config.kubernetes_download_url = format!("http://{}:{}", qemu::HOST_ADDRESS, mirror.port);
    let real = RealGuests::new(
        world.playground.env.dir.join("guests"),
        BootOptions {
            network: GuestNetwork::HostPorts(vec![tenant_port, mirror.port, host_port]),
            ..BootOptions::default()
        },
    );
    // The guests' own kubelets join the tenant: the simulator plays KubeVirt only.
    world.start_simulator_with(
        Vec::new(),
        SimOptions {
            real_guests: Some(real.clone()),
            ..SimOptions::default()
        },
    );
    world.start_controller();

    let claims = world.claims();
    let nodes: Api<Node> = Api::all(world.tenant.clone());
    let created = Instant::now();
    // (The prepared type's warm VM boots meanwhile; these claims find none ready and are
    // served cold.)
    // The stock guest also tries a host port it was not given (the guests reach only the
    // tenant's, the mirror's and the host's API server ports).
    let (other_port, other_accepted) = unreachable_listener();
    for (name, node_type) in [("prepared-1", "prepared"), ("stock-1", "stock")] {
        let properties = if node_type == "stock" {
            serde_json::json!({"autonodes.io/user-data": probe_user_data(other_port)})
        } else {
            serde_json::json!({})
        };
        world
            .create_claim(serde_json::json!({
                "metadata": {"name": name},
                "spec": {
                    "providerRef": "real-guests",
                    "requirements": [{"key": "autonodes.io/node-type", "operator": "In", "values": [node_type]}],
                    "properties": properties,
                },
            }))
            .await;
    }
    let mut ready_after = std::collections::BTreeMap::new();
    while ready_after.len() < 2 {
        for name in ["prepared-1", "stock-1"] {
            if ready_after.contains_key(name) {
                continue;
            }
            let c = claims.get(name).await.expect("claim");
            let node = c.status.as_ref().and_then(|s| s.node_name.clone());
            let node_ready = match &node {
                Some(n) => nodes.get_opt(n).await.ok().flatten().is_some_and(|n| {
                    n.status
                        .and_then(|s| s.conditions)
                        .unwrap_or_default()
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
                }),
                None => false,
            };
            if node_ready {
                ready_after.insert(name, created.elapsed());
            }
        }
        if created.elapsed() > READY {
            let mut shown = String::new();
            for name in ["prepared-1", "stock-1"] {
                let c = claims.get(name).await.expect("claim");
                let vm = c
                    .status
                    .as_ref()
                    .and_then(|s| s.vm_name.clone())
                    .unwrap_or_default();
                let serial = real.serial_text(VM_NS, &vm);
                let tail: Vec<&str> = serial.lines().rev().take(60).collect();
                shown.push_str(&format!(
                    "== {name}: {:?}\n{}\n",
                    c.status,
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                ));
            }
            panic!(
                "not every Node turned Ready within {READY:?}:\n{shown}\nmirror: {:?}",
                mirror.requests()
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }

    // Each claim turns Available and its bootstrap token is deleted.
    for (name, image) in [("prepared-1", "prepared"), ("stock-1", "stock")] {
        let started = Instant::now();
        let claim = loop {
            let c = claims.get(name).await.expect("claim");
            if c.status.as_ref().and_then(|s| s.phase)
                == Some(autonodes_api::NodeClaimPhase::Available)
            {
                break c;
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "{name} not Available: {:?}",
                c.status
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        };
        let status = claim.status.clone().unwrap_or_default();
        let vm = status.vm_name.clone().unwrap_or_default();
        let node = nodes
            .get(status.node_name.as_deref().unwrap_or_default())
            .await
            .expect("node");
        assert_eq!(
            node.spec.as_ref().and_then(|s| s.provider_id.as_deref()),
            Some(format!("kubevirt://{vm}").as_str())
        );
        // The kubelet registered with the JoinConfiguration's labels (`--node-labels`) and
        // taints; autonodes removed the registration taint once the Node joined.
        let labels = node.labels();
        assert_eq!(
            labels
                .get(autonodes_api::LABEL_NODECLAIM)
                .map(String::as_str),
            Some(name)
        );
        assert_eq!(
            labels.get("autonodes.io/node-type").map(String::as_str),
            Some(image),
            "{labels:?}"
        );
        let taints = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        assert!(
            !taints.iter().any(|t| t.key == "autonodes.io/unregistered"),
            "{taints:?}"
        );
        let serial = real.serial_text(VM_NS, &vm);
        // The image's (prepared) or the mirror's (stock) kubelet, of the control plane's
        // version: a Ready Node also shows containerd, the sysctls and cgroup v1 it needs.
        let kubelet = node
            .status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .map(|i| i.kubelet_version.clone())
            .unwrap_or_default();
        assert_eq!(kubelet, version, "the kubelet of the {image} image");
        // Debian's cloud-init read the NoCloud seed made as KubeVirt makes it, and finished
        // without a failed module.
        let verdict = cloud_init_result(&serial);
        assert!(
            verdict.starts_with("done") && verdict.contains("DataSourceNoCloud"),
            "{image}: cloud-init {verdict}"
        );
        println!(
            "real-guest: {image} image, claim {name} → Node {} Ready after {} s, Ready; kubelet {kubelet}; cloud-init {}",
            node.name_any(),
            ready_after[name].as_secs(),
            verdict
        );
    }
    let stock_vm = claims
        .get("stock-1")
        .await
        .expect("claim")
        .status
        .and_then(|s| s.vm_name)
        .unwrap_or_default();
    let stock_serial = real.serial_text(VM_NS, &stock_vm);
    let probe = stock_serial
        .lines()
        .rev()
        .find_map(|l| {
            l.split_once("autonodes-probe: ")
                .map(|(_, p)| p.trim().to_string())
        })
        .unwrap_or_else(|| panic!("the stock guest's probe printed nothing:\n{stock_serial}"));
    println!("real-guest: stock guest, a host port it was not given: {probe}");
    assert!(
        probe.starts_with("exit=") && !probe.starts_with("exit=0 "),
        "the guest reached a host port it was not given: {probe}"
    );
    assert_eq!(
        other_accepted.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "a connection reached the port the guests were not given"
    );
    let started = Instant::now();
    loop {
        let left = world.tokens().await.len();
        if left == 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{left} bootstrap tokens left"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    println!("mirror requests: {:?}", mirror.requests());

    // The stock node's address is its claim's, from the pool, and survives a power cycle:
    // powered off, its Node is cordoned and kept and its guest powers off; powered on, a
    // new guest boots from a fresh disk (a container disk), joins again with the fresh
    // token, and its Node is Ready and schedulable with the same address.
    power_cycle(&world, &real, "stock-1").await;

    // The prepared type's warm VM booted beside the cold ones; once its agent reports to
    // the host's API server, a third claim takes it.
    let warm_vms = || async {
        world
            .vms()
            .await
            .iter()
            .filter(|v| v.labels().contains_key(autonodes_api::LABEL_WARM_NODETYPE))
            .map(|v| v.name_any())
            .collect::<std::collections::BTreeSet<String>>()
    };
    let types: Api<autonodes_api::NodeType> = Api::all(world.mgmt.clone());
    let started = Instant::now();
    loop {
        let t = types.get("real-guests.prepared").await.expect("type");
        let warm = t
            .status
            .as_ref()
            .and_then(|s| s.warm.clone())
            .unwrap_or_default();
        if warm.ready >= 1 {
            break;
        }
        if started.elapsed() > READY {
            let mut shown = String::new();
            for vm in warm_vms().await {
                let serial = real.serial_text(VM_NS, &vm);
                let tail: Vec<&str> = serial.lines().rev().take(60).collect();
                shown.push_str(&format!(
                    "== {vm}\n{}\n",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                ));
            }
            panic!(
                "no warm VM ready within {READY:?}: {:?}\n{shown}",
                t.status.map(|s| s.conditions)
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    // The cold claims go first, so the warm join is measured beside one booting guest (the
    // refill), as the cold ones were beside each other.
    for name in ["prepared-1", "stock-1"] {
        world.delete_claim(name).await;
    }
    let started = Instant::now();
    while real.running() > warm_vms().await.len() || real.power_off(VM_NS, &stock_vm).is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "the cold guests did not power off"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // The stock guest powered itself off at the ACPI power button, within its grace period.
    assert_eq!(
        real.power_off(VM_NS, &stock_vm),
        Some(autonodes_testenv::qemu::PowerOff::Clean),
        "the stock guest was killed, not powered off"
    );
    let warm_before = warm_vms().await;
    let created = Instant::now();
    // The claim brings an SSH key, a file and a command of its own: the warm VM booted
    // without them, and gets them with its binding once it revoked its host credential.
    world
        .create_claim(serde_json::json!({
            "metadata": {"name": "warm-1"},
            "spec": {
                "providerRef": "real-guests",
                "requirements": [{"key": "autonodes.io/node-type", "operator": "In", "values": ["prepared"]}],
                "properties": {
                    "autonodes.io/ssh-keys": CLAIM_KEY,
                    "autonodes.io/user-data": CLAIM_USER_DATA,
                },
            },
        }))
        .await;
    // The type refills at once: a new warm VM in place of the one taken. Then it keeps none:
    // the refill goes before its guest has booted (it would only compete with the join), and
    // the taken VM, the claim's now, joins undisturbed.
    let started = Instant::now();
    let refill = loop {
        if let Some(v) = warm_vms()
            .await
            .into_iter()
            .find(|v| !warm_before.contains(v))
        {
            break v;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no warm VM made in place of the one taken: {warm_before:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    println!("real-guest: the prepared type refilled with warm VM {refill}");
    world.apply_provider(&provider(host_port, 0)).await;
    let (node, warm_ready_after) = loop {
        let c = claims.get("warm-1").await.expect("claim");
        let node = c.status.as_ref().and_then(|s| s.node_name.clone());
        if let Some(n) = &node {
            if let Some(n) = nodes.get_opt(n).await.ok().flatten() {
                let ready = n
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.clone())
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                if ready {
                    break (n, created.elapsed());
                }
            }
        }
        if created.elapsed() > READY {
            let vm = c
                .status
                .as_ref()
                .and_then(|s| s.vm_name.clone())
                .unwrap_or_default();
            let serial = real.serial_text(VM_NS, &vm);
            let tail: Vec<&str> = serial.lines().rev().take(80).collect();
            panic!(
                "the warm claim's Node not Ready within {READY:?}: {:?}\n{}",
                c.status,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let claim = claims.get("warm-1").await.expect("claim");
    let status = claim.status.clone().unwrap_or_default();
    let vm = status.vm_name.clone().unwrap_or_default();
    assert!(
        status.warm.is_some() && warm_before.contains(&vm),
        "{vm} was warm: {warm_before:?}"
    );
    assert_eq!(
        node.spec.as_ref().and_then(|s| s.provider_id.as_deref()),
        Some(format!("kubevirt://{vm}").as_str())
    );
    assert_eq!(
        node.labels()
            .get(autonodes_api::LABEL_NODECLAIM)
            .map(String::as_str),
        Some("warm-1")
    );
    let serial = real.serial_text(VM_NS, &vm);
    for line in serial.lines().filter(|l| l.contains("autonodes-warm:")) {
        println!("real-guest: warm agent: {}", line.trim());
    }
    // The agent revoked its credential, then cloud-init wrote the claim's file, added its
    // key and ran its command, before the join.
    let revoked = serial
        .find("its credential revoked")
        .expect("the agent revoked its credential");
    let ran = serial
        .lines()
        .find(|l| l.contains("autonodes-claim-runcmd:"))
        .unwrap_or_else(|| panic!("the claim's command ran:\n{serial}"));
    println!(
        "real-guest: warm VM with the claim's user data: {}",
        ran.trim()
    );
    assert!(ran.contains("file=from-the-binding"), "{ran}");
    let keys: usize = ran
        .split("keys=")
        .nth(1)
        .and_then(|k| k.trim().parse().ok())
        .unwrap_or(0);
    assert!(keys >= 1, "the claim's key installed: {ran}");
    assert!(
        serial
            .find("autonodes-claim-runcmd:")
            .is_some_and(|i| i > revoked),
        "after the revocation"
    );
    // The agent made the kubelet's serving certificate while warm.
    assert!(
        !serial.contains("kubelet serving certificate not made"),
        "{serial}"
    );
    // The prepare script made the node's name resolve to a loopback address in the hosts
    // file; the kubelet passed over it for the VM's own address.
    let internal: Vec<String> = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|a| a.type_ == "InternalIP")
        .map(|a| a.address)
        .collect();
    assert!(
        !internal.is_empty() && internal.iter().all(|a| !a.starts_with("127.")),
        "the warm node's InternalIP addresses: {internal:?}"
    );
    println!(
        "real-guest: prepared image, warm VM, claim warm-1 → Node {} Ready after {} s, Ready; kubelet {}; cloud-init {}",
        node.name_any(),
        warm_ready_after.as_secs(),
        node.status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .map(|i| i.kubelet_version.clone())
            .unwrap_or_default(),
        cloud_init_result(&serial)
    );
    // Deleting the claim removes everything and powers the guests off.
    world.delete_claim("warm-1").await;
    let vms: Api<DynamicObject> = Api::namespaced_with(
        world.host.clone(),
        VM_NS,
        &autonodes_api::kubevirt::virtual_machine(),
    );
    let started = Instant::now();
    loop {
        let claims_left = claims
            .list(&ListParams::default())
            .await
            .expect("claims")
            .items
            .len();
        let vms_left = vms
            .list(&ListParams::default())
            .await
            .expect("vms")
            .items
            .len();
        let secrets_left = world.host_secrets().await.len();
        let nodes_left = world.nodes().await.len();
        let guests_left = real.running() + real.qemu_alive().len();
        if claims_left + vms_left + secrets_left + nodes_left + guests_left == 0 {
            println!("real-guest: after deletion: 0 claims, 0 VirtualMachines, 0 user-data Secrets, 0 Nodes, 0 guests running");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "left: {claims_left} claims, {vms_left} VMs, {secrets_left} Secrets, {nodes_left} Nodes, {guests_left} guests"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    world.shutdown().await;
    drop(control_plane);
}

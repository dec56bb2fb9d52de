//! Throughput against real API servers, measured in one run on the same clusters (one etcd,
//! management, host and tenant kube-apiservers), printed, never asserted:
//!
//! (a) the **Secret write bound**: 2,000 creates of 2 KiB Secrets, 32 in flight;
//! (b) the **replay bound**: the same clusters taking N claims' minimal call set from a
//!     plain client, 32 claims in flight — the claim, its finalizer, 3 status writes,
//!     4 Events, the user-data Secret, the VM, the bootstrap token, the simulator's VMI, VM
//!     status and Node, the Node's labels and the token's deletion — and, second, the same
//!     with the two writes the simulator makes per claim as KubeVirt and the node lifecycle
//!     controller do (KubeVirt's finalizer on the VM, the not-ready taint's removal), which
//!     the minimal call set leaves out; each with the servers' and the client's CPU per claim.
//!     The replayed objects are those of one claim the product ran on these clusters first
//!     (its status, Events, user-data Secret, VM, VMI and Node), renamed per claim, so each
//!     replayed call carries what the product's carries; the small stand-in objects this
//!     bench replayed before are replayed once more for comparison;
//! (c) the **product**: N claims created at once with the real `autonodes run` binary and
//!     the KubeVirt simulator booting VMs at once: time until all are Available, claims/s,
//!     requests per claim (the API servers' `apiserver_request_total`, and the controller's
//!     own `autonodes_kube_requests_total`), API-server + etcd CPU per claim,
//!     creation → Ready percentiles, the controller's peak RSS and CPU, then deleting them
//!     all at once: time and peak API-server memory.
//!
//! After each product run: `product ÷` both bounds, and the ceiling a controller that cost
//! no CPU at all would reach (the replay's CPU per claim over the servers' and simulator's
//! in the product run: both are CPU-bound on the same cores). Then the minimal replay once
//! more, after the product runs (the clusters' cost per call drifts over a run, and the
//! product always comes after the first replays), and for each N `product ÷` the replay
//! bound before, after, and their mean. The last line is `product claims/s ÷ replay
//! claims/s` at the largest N, against that mean.
//!
//! `cargo bench --bench throughput`; `AUTONODES_BENCH_CLAIMS=200,1000,10000` sets the sizes
//! (default `200,1000`). Under `cargo test` it only says it was skipped.

#[path = "../tests/it/common/mod.rs"]
mod common;
#[path = "../tests/it/opscommon/mod.rs"]
mod opscommon;

/// CPU seconds (user + system) a process used so far.
fn cpu_seconds(pid: u32) -> f64 {
    process_cpu_seconds(pid).unwrap_or(0.0)
}

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use autonodes_api::NodeClaim;
use autonodes_testenv::playground::ensure_namespace;
use autonodes_testenv::simulator::SimMode;
use autonodes_testenv::testenv::{process_cpu_seconds, process_memory};
use common::world::{condition, provider_yaml, World, WorldOptions, NS};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use opscommon::measure::{
    breakdown, diff, mb, server_requests, MeteredController as Controller, Totals,
};

/// jemalloc, as in the `autonodes` and `autonodes-dev` binaries: this process runs the
/// simulator of the product run, whose CPU counts (with glibc's allocator a fifth of it went
/// to `malloc` and `free`).
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Requests in flight in the bounds (a) and (b).
const IN_FLIGHT: usize = 32;
/// Secrets created for the Secret write bound.
const SECRETS: usize = 2_000;
/// Namespace of the replayed claims (management) and their VMs and Secrets (host).
const REPLAY_NS: &str = "replay";

fn provider() -> String {
    provider_yaml(
        "bench",
        "test-kubevirt-1",
        "1",
        "1Gi",
        "      - name: small",
    )
}

/// CPU seconds of etcd and of each API server, by name.
fn server_cpu_by_process(world: &World) -> BTreeMap<String, f64> {
    let env = &world.playground.env;
    let mut out = BTreeMap::new();
    if let Some(&etcd) = env.pids().first() {
        out.insert("etcd".to_string(), cpu_seconds(etcd));
    }
    for server in env.apiservers() {
        if let Some(pid) = server.pid() {
            out.insert(server.name.clone(), cpu_seconds(pid));
        }
    }
    out
}

/// CPU seconds each server process used between two readings of
/// [`server_cpu_by_process`].
fn cpu_used(
    after: &BTreeMap<String, f64>,
    before: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(name, s)| (name.clone(), s - before.get(name).copied().unwrap_or(0.0)))
        .collect()
}

/// "etcd 12.0, host 20.1, …": milliseconds of CPU per claim of each server process.
fn cpu_split(used: &BTreeMap<String, f64>, per: f64) -> String {
    used.iter()
        .map(|(name, s)| format!("{name} {:.1}", s * 1000.0 / per))
        .collect::<Vec<_>>()
        .join(", ")
}

/// With `AUTONODES_APISERVER_PROFILING=1` (the test environment then serves Go's pprof),
/// takes a CPU profile of `seconds` from every API server into
/// `target/bench-pprof/<run>-<server>.pprof` (read it with `go tool pprof -top FILE`).
fn profile_servers(world: &World, run: &str, seconds: u64) -> Vec<std::process::Child> {
    if std::env::var("AUTONODES_APISERVER_PROFILING").as_deref() != Ok("1") {
        return Vec::new();
    }
    let dir = common::repo().join("target/bench-pprof");
    let _ = std::fs::create_dir_all(&dir);
    world
        .playground
        .env
        .apiservers()
        .filter_map(|server| {
            std::process::Command::new("curl")
                .arg("-sk")
                .arg("-H")
                .arg(format!("Authorization: Bearer {}", server.admin_token))
                .arg("-o")
                .arg(dir.join(format!("{run}-{}.pprof", server.name)))
                .arg(format!(
                    "{}/debug/pprof/profile?seconds={seconds}",
                    server.url
                ))
                .spawn()
                .ok()
        })
        .collect()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

// ---------------------------------------------------------------------------------------
// (a) The Secret write bound.

async fn secret_bound(world: &World) -> f64 {
    ensure_namespace(&world.host, "bound")
        .await
        .expect("namespace bound");
    let api: Api<Secret> = Api::namespaced(world.host.clone(), "bound");
    let payload = "x".repeat(2048);
    let started = Instant::now();
    futures::stream::iter(0..SECRETS)
        .map(|i| {
            let api = api.clone();
            let payload = payload.clone();
            async move {
                let s: Secret = serde_json::from_value(serde_json::json!({
                    "metadata": {"name": format!("bound-{i:05}"), "labels": {"bench": "bound"}},
                    "stringData": {"data": payload},
                }))
                .expect("secret");
                api.create(&PostParams::default(), &s)
                    .await
                    .expect("secret created");
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect::<Vec<_>>()
        .await;
    let rate = SECRETS as f64 / started.elapsed().as_secs_f64();
    api.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .expect("secrets deleted");
    rate
}

// ---------------------------------------------------------------------------------------
// (b) The replay bound.

/// A VirtualMachine of the size the product writes (containerDisk, cloud-init Secret).
fn replay_vm(name: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {
            "name": name,
            "labels": {
                "app.kubernetes.io/managed-by": "autonodes-replay",
                "autonodes.io/nodeclaim": name,
                "autonodes.io/nodeclaim-namespace": REPLAY_NS,
                "autonodes.io/nodeclaim-uid": "00000000-0000-0000-0000-000000000000",
                "autonodes.io/node-type": "bench.small",
                "autonodes.io/provider": "bench",
            },
        },
        "spec": {
            "runStrategy": "Always",
            "template": {
                "metadata": {"labels": {"autonodes.io/nodeclaim": name, "kubevirt.io/domain": name}},
                "spec": {
                    "domain": {
                        "cpu": {"cores": 1},
                        "devices": {
                            "disks": [
                                {"name": "root", "disk": {"bus": "virtio"}},
                                {"name": "cloudinit", "disk": {"bus": "virtio"}},
                            ],
                            "interfaces": [{"name": "default", "masquerade": {}}],
                        },
                        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
                    },
                    "networks": [{"name": "default", "pod": {}}],
                    "terminationGracePeriodSeconds": 30,
                    "volumes": [
                        {"name": "root", "containerDisk": {"image": "quay.io/containerdisks/ubuntu:22.04"}},
                        {"name": "cloudinit", "cloudInitNoCloud": {"secretRef": {"name": format!("{name}-userdata")}}},
                    ],
                },
            },
        },
    })
}

fn status_patch(phase: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "autonodes.io/v1alpha1",
        "kind": "NodeClaim",
        "status": {
            "phase": phase,
            "conditions": [{
                "type": "Ready",
                "status": if phase == "Available" { "True" } else { "False" },
                "reason": phase,
                "message": format!("replayed {phase}"),
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }],
        },
    })
}

fn event(name: &str, reason: &str, i: usize) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": format!("{name}.{i}"), "namespace": REPLAY_NS},
        "eventTime": "2026-01-01T00:00:00.000000Z",
        "reportingController": "autonodes.io/replay",
        "reportingInstance": "replay",
        "action": "Reconcile",
        "reason": reason,
        "note": format!("replayed {reason}"),
        "type": "Normal",
        "regarding": {"apiVersion": "autonodes.io/v1alpha1", "kind": "NodeClaim", "namespace": REPLAY_NS, "name": name},
    })
}

/// The placeholder name in the stand-in objects, replaced by each replayed claim's name.
const STAND_IN: &str = "stand-in-claim";

/// What a replayed claim writes: one set of objects, renamed for each claim.
///
/// [`Templates::sampled`] takes them from one claim the product ran on these clusters (its
/// status, Events, user-data Secret and VM as the controller wrote them, the VMI, VM status
/// and Node as the simulator wrote them), so that each replayed call carries what the
/// product's call carries. [`Templates::stand_in`] are the small objects this bench replayed
/// before it sampled the product's (a 2 KiB user-data Secret, a Node without status, a
/// one-condition status), still printed for comparison.
struct Templates {
    /// Which objects these are, for the printed lines.
    what: &'static str,
    /// The names in the objects that become the replayed claim's name, longest first.
    names: Vec<String>,
    /// The claim's `status`, applied three times with the phase changed.
    claim_status: serde_json::Value,
    /// Events (each one's metadata, `regarding`, note and reason), replayed round robin.
    events: Vec<serde_json::Value>,
    /// The user-data Secret.
    user_data: serde_json::Value,
    /// The VirtualMachine as created (no finalizer).
    vm: serde_json::Value,
    /// The VirtualMachine's `status` as the simulator patches it.
    vm_status: serde_json::Value,
    /// The VirtualMachineInstance as the simulator creates it.
    vmi: serde_json::Value,
    /// The Node as registered (no taints: the API server adds the not-ready one).
    node: serde_json::Value,
    /// The labels the controller's Node patch writes.
    node_labels: serde_json::Value,
}

/// `v` as JSON.
fn json(v: impl serde::Serialize) -> serde_json::Value {
    serde_json::to_value(v).expect("an object serializes to JSON")
}

/// Metadata a replayed object keeps of a sampled one: name, labels (with `bench: replay`,
/// and `managed-by` no longer `autonodes`, so no product sweep or test helper counts it)
/// and annotations.
fn replay_meta(meta: &serde_json::Value) -> serde_json::Value {
    let mut labels = meta["labels"].as_object().cloned().unwrap_or_default();
    if labels.contains_key("app.kubernetes.io/managed-by") {
        labels.insert(
            "app.kubernetes.io/managed-by".into(),
            "autonodes-replay".into(),
        );
    }
    labels.insert("bench".into(), "replay".into());
    let mut out = serde_json::json!({"name": meta["name"], "labels": labels});
    if meta["annotations"].is_object() {
        out["annotations"] = meta["annotations"].clone();
    }
    out
}

impl Templates {
    /// The small stand-in objects of earlier versions of this bench.
    fn stand_in() -> Templates {
        let name = STAND_IN;
        let status = status_patch("Pending")["status"].clone();
        let node = serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"bench": "replay", "kubernetes.io/hostname": name}},
            "spec": {"providerID": format!("kubevirt://{name}")},
        });
        let vm = replay_vm(name);
        Templates {
            what: "small stand-in objects",
            names: vec![name.to_string()],
            claim_status: status,
            events: ["Scheduled", "Launched", "Joined", "Available"]
                .iter()
                .map(|r| event(name, r, 0))
                .collect(),
            user_data: serde_json::json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": format!("{name}-userdata"), "labels": {"bench": "replay"}},
                "stringData": {"userdata": "#cloud-config\n".to_string() + &"x".repeat(2000)},
            }),
            vmi: serde_json::json!({
                "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                "metadata": {"name": name, "labels": {"bench": "replay"}},
                "spec": vm["spec"]["template"]["spec"].clone(),
                "status": {"phase": "Running", "nodeName": "kubevirt-host-0",
                           "interfaces": [{"name": "default", "ipAddress": "10.0.0.1"}]},
            }),
            vm,
            vm_status: serde_json::json!({"ready": true, "printableStatus": "Running"}),
            node,
            node_labels: serde_json::json!({
                "autonodes.io/nodeclaim": name, "autonodes.io/node-type": "bench.small"}),
        }
    }

    /// The objects of one claim the product ran on these clusters: a controller and the
    /// simulator are started, the claim is created, read back once Available with
    /// everything it made, then deleted; both stop again before any replay.
    async fn sampled(world: &mut World) -> Templates {
        let claim_name = "replay-sample";
        world.start_simulator(SimMode::Normal).await;
        let controller = Controller::start(world, 0).await;
        world
            .create_claim(serde_json::json!({"metadata": {"name": claim_name}, "spec": {}}))
            .await;
        let claim = world
            .wait_phase(claim_name, "Available", Duration::from_secs(120))
            .await;
        let status = claim.status.clone().expect("status");
        let vm_ns = status.vm_namespace.clone().expect("VM namespace");
        let vm_name = status.vm_name.clone().expect("VM name");
        let node_name = status.node_name.clone().expect("Node name");
        let dynamic = |client: &kube::Client, ar: &kube::api::ApiResource| {
            Api::<DynamicObject>::namespaced_with(client.clone(), &vm_ns, ar)
        };
        let vm = json(
            dynamic(&world.host, &autonodes_api::kubevirt::virtual_machine())
                .get(&vm_name)
                .await
                .expect("the sample's VM"),
        );
        let vmi = json(
            dynamic(
                &world.host,
                &autonodes_api::kubevirt::virtual_machine_instance(),
            )
            .get(&vm_name)
            .await
            .expect("the sample's VMI"),
        );
        let secret = json(
            Api::<Secret>::namespaced(world.host.clone(), &vm_ns)
                .get(&autonodes_core::template::names::user_data_secret_name(
                    &vm_name,
                ))
                .await
                .expect("the sample's user-data Secret"),
        );
        let node = json(
            Api::<Node>::all(world.tenant.clone())
                .get(&node_name)
                .await
                .expect("the sample's Node"),
        );
        let events: Vec<serde_json::Value> =
            Api::<k8s_openapi::api::events::v1::Event>::namespaced(world.mgmt.clone(), NS)
                .list(&ListParams::default())
                .await
                .expect("events listed")
                .items
                .into_iter()
                .filter(|e| {
                    e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(claim_name)
                })
                .map(|e| {
                    let mut v = json(e);
                    v["metadata"] = serde_json::json!({});
                    v["regarding"]["namespace"] = REPLAY_NS.into();
                    v
                })
                .collect();
        assert!(!events.is_empty(), "the sample claim got no Event");
        world.delete_claim(claim_name).await;
        world
            .wait_claim_gone(claim_name, Duration::from_secs(120))
            .await;
        drop(controller);
        world.stop_simulator().await;

        let mut node_meta = replay_meta(&node["metadata"]);
        let labels = node_meta["labels"].as_object_mut().expect("labels");
        let node_labels: serde_json::Map<String, serde_json::Value> = labels
            .iter()
            .filter(|(k, _)| k.starts_with("autonodes.io/"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        labels.retain(|k, _| !k.starts_with("autonodes.io/"));
        let mut node_spec = node["spec"].clone();
        if let Some(spec) = node_spec.as_object_mut() {
            spec.remove("taints");
        }
        let mut names = vec![vm_name.clone(), node_name, claim_name.to_string()];
        names.sort_by_key(|n| std::cmp::Reverse(n.len()));
        names.dedup();
        Templates {
            what: "the objects of a product claim",
            names,
            claim_status: json(&status),
            events,
            user_data: serde_json::json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": replay_meta(&secret["metadata"]),
                "type": secret["type"], "data": secret["data"],
            }),
            vm: serde_json::json!({
                "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                "metadata": replay_meta(&vm["metadata"]), "spec": vm["spec"],
            }),
            vm_status: vm["status"].clone(),
            vmi: serde_json::json!({
                "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                "metadata": replay_meta(&vmi["metadata"]),
                "spec": vmi["spec"], "status": vmi["status"],
            }),
            node: serde_json::json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": node_meta, "spec": node_spec, "status": node["status"],
            }),
            node_labels: serde_json::Value::Object(node_labels),
        }
    }

    /// `v` with the sample's names replaced by `name`.
    fn for_claim<T: serde::de::DeserializeOwned>(&self, v: &serde_json::Value, name: &str) -> T {
        let mut text = v.to_string();
        for n in &self.names {
            text = text.replace(n.as_str(), name);
        }
        serde_json::from_str(&text).expect("a renamed object")
    }

    /// The claim's status apply with `phase`.
    fn status(&self, phase: &str) -> serde_json::Value {
        let mut status = self.claim_status.clone();
        status["phase"] = phase.into();
        serde_json::json!({
            "apiVersion": "autonodes.io/v1alpha1", "kind": "NodeClaim", "status": status,
        })
    }

    /// The `k`th Event of the claim `name`.
    fn event(&self, name: &str, k: usize) -> DynamicObject {
        let mut e: serde_json::Value = self.for_claim(&self.events[k % self.events.len()], name);
        e["apiVersion"] = "events.k8s.io/v1".into();
        e["kind"] = "Event".into();
        e["metadata"] = serde_json::json!({"name": format!("{name}.{k}"), "namespace": REPLAY_NS});
        serde_json::from_value(e).expect("an Event")
    }

    /// The byte sizes of what one replayed claim writes, for the printed line.
    fn sizes(&self) -> String {
        let len = |v: &serde_json::Value| v.to_string().len();
        format!(
            "user-data Secret {} B, VM {} B, VMI {} B, Node {} B, status {} B, Event {} B",
            len(&self.user_data),
            len(&self.vm),
            len(&self.vmi),
            len(&self.node),
            len(&self.claim_status),
            self.events.iter().map(len).sum::<usize>() / self.events.len().max(1),
        )
    }
}

/// Which calls a replayed claim makes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum CallSet {
    /// The minimal call set (the module's documentation lists it).
    Minimal,
    /// The minimal call set and the two writes the simulator makes for every claim because
    /// the systems it stands in for make them: KubeVirt's finalizer on the VM
    /// (`kubevirt.io/virtualMachineControllerFinalize`, a JSON patch as virt-controller's)
    /// and the node lifecycle controller's removal of the `node.kubernetes.io/not-ready`
    /// taint the API server puts on every new Node.
    WithSimulatorDuties,
}

impl CallSet {
    fn label(self) -> &'static str {
        match self {
            CallSet::Minimal => "replay bound",
            CallSet::WithSimulatorDuties => "replay + simulator duties",
        }
    }
}

/// KubeVirt's finalizer on VirtualMachines (what the simulator puts on each VM).
const KUBEVIRT_FINALIZER: &str = "kubevirt.io/virtualMachineControllerFinalize";

/// One claim's call set, in order.
async fn replay_claim(world: &World, i: usize, calls: CallSet, t: &Templates) {
    let name = format!("r-{i:05}");
    let pp = PostParams::default();
    let claims: Api<DynamicObject> = Api::namespaced_with(
        world.mgmt.clone(),
        REPLAY_NS,
        &kube::api::ApiResource::erase::<NodeClaim>(&()),
    );
    let events: Api<DynamicObject> = Api::namespaced_with(
        world.mgmt.clone(),
        REPLAY_NS,
        &kube::api::ApiResource::erase::<k8s_openapi::api::events::v1::Event>(&()),
    );
    let host_secrets: Api<Secret> = Api::namespaced(world.host.clone(), REPLAY_NS);
    let tokens: Api<Secret> = Api::namespaced(world.tenant.clone(), "kube-system");
    let vms: Api<DynamicObject> = Api::namespaced_with(
        world.host.clone(),
        REPLAY_NS,
        &autonodes_api::kubevirt::virtual_machine(),
    );
    let vmis: Api<DynamicObject> = Api::namespaced_with(
        world.host.clone(),
        REPLAY_NS,
        &autonodes_api::kubevirt::virtual_machine_instance(),
    );
    let nodes: Api<Node> = Api::all(world.tenant.clone());
    let apply = PatchParams::apply("autonodes-replay").force();
    let dynamic =
        |v: serde_json::Value| -> DynamicObject { serde_json::from_value(v).expect("object") };

    claims
        .create(
            &pp,
            &dynamic(serde_json::json!({
                "apiVersion": "autonodes.io/v1alpha1", "kind": "NodeClaim",
                "metadata": {"name": name, "labels": {"bench": "replay"}},
                "spec": {"vClusterRef": {"name": "tenant"}},
            })),
        )
        .await
        .expect("claim");
    // The finalizer's write (a label here, so the replayed claims delete without a controller).
    claims
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"replay": "finalized"}}})),
        )
        .await
        .expect("finalizer patch");
    claims
        .patch_status(&name, &apply, &Patch::Apply(t.status("Pending")))
        .await
        .expect("status 1");
    events
        .create(&pp, &t.event(&name, 0))
        .await
        .expect("event 1");
    let userdata: Secret = t.for_claim(&t.user_data, &name);
    host_secrets
        .create(&pp, &userdata)
        .await
        .expect("user data");
    let token_id = format!("{:06x}", i % 0xff_ffff);
    let token: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("bootstrap-token-{token_id}"), "labels": {"bench": "replay"}},
        "type": "bootstrap.kubernetes.io/token",
        "stringData": {
            "token-id": token_id, "token-secret": "0123456789abcdef",
            "usage-bootstrap-authentication": "true", "usage-bootstrap-signing": "true",
            "auth-extra-groups": "system:bootstrappers:kubeadm:default-node-token",
            "expiration": "2099-01-01T00:00:00Z",
        },
    }))
    .expect("token");
    tokens.create(&pp, &token).await.expect("token");
    let vm: DynamicObject = t.for_claim(&t.vm, &name);
    vms.create(&pp, &vm).await.expect("vm");
    if calls == CallSet::WithSimulatorDuties {
        let add: json_patch::Patch = serde_json::from_value(serde_json::json!([
            {"op": "add", "path": "/metadata/finalizers", "value": [KUBEVIRT_FINALIZER]},
        ]))
        .expect("finalizer patch");
        vms.patch(&name, &PatchParams::default(), &Patch::Json::<()>(add))
            .await
            .expect("vm finalizer");
    }
    claims
        .patch_status(&name, &apply, &Patch::Apply(t.status("Provisioning")))
        .await
        .expect("status 2");
    events
        .create(&pp, &t.event(&name, 1))
        .await
        .expect("event 2");
    // The simulator: the VMI, the VM's status, the Node.
    let vmi: DynamicObject = t.for_claim(&t.vmi, &name);
    vmis.create(&pp, &vmi).await.expect("vmi");
    let vm_status: serde_json::Value = t.for_claim(&t.vm_status, &name);
    vms.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "status": vm_status })),
    )
    .await
    .expect("vm status");
    let node: Node = t.for_claim(&t.node, &name);
    nodes.create(&pp, &node).await.expect("node");
    if calls == CallSet::WithSimulatorDuties {
        // The API server put the not-ready taint on the new Node (its only taint here).
        let remove: json_patch::Patch = serde_json::from_value(serde_json::json!([
            {"op": "test", "path": "/spec/taints/0/key", "value": "node.kubernetes.io/not-ready"},
            {"op": "remove", "path": "/spec/taints/0"},
        ]))
        .expect("taint patch");
        nodes
            .patch(&name, &PatchParams::default(), &Patch::Json::<()>(remove))
            .await
            .expect("not-ready taint removed");
    }
    // The controller: the Node's labels, the token's deletion, Ready.
    let labels: serde_json::Value = t.for_claim(&t.node_labels, &name);
    nodes
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "metadata": { "labels": labels } })),
        )
        .await
        .expect("node labels");
    tokens
        .delete(
            &format!("bootstrap-token-{token_id}"),
            &DeleteParams::default(),
        )
        .await
        .expect("token deleted");
    claims
        .patch_status(&name, &apply, &Patch::Apply(t.status("Available")))
        .await
        .expect("status 3");
    events
        .create(&pp, &t.event(&name, 2))
        .await
        .expect("event 3");
    events
        .create(&pp, &t.event(&name, 3))
        .await
        .expect("event 4");
}

/// A replay's rate and the CPU it cost per claim (servers and etcd, and the client).
#[derive(Clone, Copy)]
struct Replay {
    claims_per_s: f64,
    cpu_ms_per_claim: f64,
}

async fn replay_bound(world: &World, n: usize, calls: CallSet, t: &Templates) -> Replay {
    for client in [&world.mgmt, &world.host] {
        ensure_namespace(client, REPLAY_NS)
            .await
            .expect("replay namespace");
    }
    let cpu_before = server_cpu_by_process(world);
    let bench_cpu_before = cpu_seconds(std::process::id());
    let started = Instant::now();
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
    let run = format!(
        "replay{}-{n}-{}-{}",
        RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        if calls == CallSet::Minimal {
            "minimal"
        } else {
            "duties"
        },
        if t.names.iter().any(|n| n == STAND_IN) {
            "stand-in"
        } else {
            "sampled"
        },
    );
    let mut profiles = profile_servers(world, &run, (n as u64 / 50).clamp(5, 30));
    futures::stream::iter(0..n)
        .map(|i| replay_claim(world, i, calls, t))
        .buffer_unordered(IN_FLIGHT)
        .collect::<Vec<_>>()
        .await;
    let rate = n as f64 / started.elapsed().as_secs_f64();
    let used = cpu_used(&server_cpu_by_process(world), &cpu_before);
    for p in profiles.iter_mut() {
        let _ = p.wait();
    }
    let bench_cpu = cpu_seconds(std::process::id()) - bench_cpu_before;
    let server_ms = used.values().sum::<f64>() * 1000.0 / n as f64;
    println!(
        "    {} ({}), N = {n}: API-server + etcd CPU {server_ms:.0} ms per claim ({}), client {:.1} ms per claim",
        calls.label(),
        t.what,
        cpu_split(&used, n as f64),
        bench_cpu * 1000.0 / n as f64
    );
    let replay = Replay {
        claims_per_s: rate,
        cpu_ms_per_claim: server_ms + bench_cpu * 1000.0 / n as f64,
    };
    // Leave nothing for the product's run to trip over: KubeVirt's finalizer off first (no
    // one else would take it off).
    if calls == CallSet::WithSimulatorDuties {
        let vms: Api<DynamicObject> = Api::namespaced_with(
            world.host.clone(),
            REPLAY_NS,
            &autonodes_api::kubevirt::virtual_machine(),
        );
        futures::stream::iter(0..n)
            .map(|i| {
                let vms = vms.clone();
                async move {
                    let remove: json_patch::Patch = serde_json::from_value(
                        serde_json::json!([{"op": "remove", "path": "/metadata/finalizers"}]),
                    )
                    .expect("finalizer removal");
                    let _ = vms
                        .patch(
                            &format!("r-{i:05}"),
                            &PatchParams::default(),
                            &Patch::Json::<()>(remove),
                        )
                        .await;
                }
            })
            .buffer_unordered(IN_FLIGHT)
            .collect::<Vec<_>>()
            .await;
    }
    let dp = DeleteParams::default();
    let all = ListParams::default();
    let bench = ListParams::default().labels("bench=replay");
    let claims: Api<DynamicObject> = Api::namespaced_with(
        world.mgmt.clone(),
        REPLAY_NS,
        &kube::api::ApiResource::erase::<NodeClaim>(&()),
    );
    let _ = claims.delete_collection(&dp, &all).await;
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(world.mgmt.clone(), REPLAY_NS);
    let _ = events.delete_collection(&dp, &all).await;
    for api in [
        Api::<DynamicObject>::namespaced_with(
            world.host.clone(),
            REPLAY_NS,
            &autonodes_api::kubevirt::virtual_machine(),
        ),
        Api::<DynamicObject>::namespaced_with(
            world.host.clone(),
            REPLAY_NS,
            &autonodes_api::kubevirt::virtual_machine_instance(),
        ),
    ] {
        let _ = api.delete_collection(&dp, &all).await;
    }
    let _ = Api::<Secret>::namespaced(world.host.clone(), REPLAY_NS)
        .delete_collection(&dp, &all)
        .await;
    let _ = Api::<Node>::all(world.tenant.clone())
        .delete_collection(&dp, &bench)
        .await;
    replay
}

// ---------------------------------------------------------------------------------------
// (c) The product.

#[derive(Default)]
struct Seen {
    ready: HashMap<String, Instant>,
    gone: HashMap<String, Instant>,
}

/// Watches the claims of [`NS`], noting when each turned Ready and when it was gone.
fn watch_claims(world: &World) -> (Arc<Mutex<Seen>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let api: Api<NodeClaim> = Api::namespaced(world.mgmt.clone(), NS);
    let task = tokio::spawn({
        let seen = seen.clone();
        async move {
            let mut stream = watcher(api, watcher::Config::default()).boxed();
            while let Ok(Some(event)) = stream.try_next().await {
                let now = Instant::now();
                let mut seen = seen.lock().expect("lock");
                match event {
                    watcher::Event::Apply(c) | watcher::Event::InitApply(c) => {
                        let name = c.metadata.name.clone().unwrap_or_default();
                        if condition(&c, "Ready").is_some_and(|r| r.0 == "True") {
                            seen.ready.entry(name).or_insert(now);
                        }
                    }
                    watcher::Event::Delete(c) => {
                        let name = c.metadata.name.clone().unwrap_or_default();
                        seen.gone.entry(name).or_insert(now);
                    }
                    _ => {}
                }
            }
        }
    });
    (seen, task)
}

/// Creation → Ready of single claims on idle clusters, one after the other.
async fn single_claim_latency(world: &World, seen: &Arc<Mutex<Seen>>, runs: usize) -> Vec<f64> {
    let mut out = Vec::new();
    for i in 0..runs {
        let name = format!("single-{i}");
        let started = Instant::now();
        world
            .create_claim(serde_json::json!({"metadata": {"name": name}, "spec": {}}))
            .await;
        let ready = common::eventually("a single claim Ready", Duration::from_secs(120), || {
            let seen = seen.clone();
            let name = name.clone();
            async move { seen.lock().expect("lock").ready.get(&name).copied() }
        })
        .await;
        out.push(ready.duration_since(started).as_secs_f64());
        world.delete_claim(&name).await;
        world.wait_claim_gone(&name, Duration::from_secs(120)).await;
    }
    out.sort_by(f64::total_cmp);
    out
}

struct ProductRun {
    claims_per_s: f64,
}

/// How many Events the claims named `<prefix>-…` got, by type and reason.
async fn events_by_reason(world: &World, prefix: &str) -> BTreeMap<String, usize> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(world.mgmt.clone(), NS);
    let mut counts = BTreeMap::new();
    let listed = api
        .list(&ListParams::default())
        .await
        .expect("events listed");
    for e in listed.items {
        let regarding = e.regarding.and_then(|r| r.name).unwrap_or_default();
        if regarding.starts_with(&format!("{prefix}-")) {
            let key = format!(
                "{}/{}",
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default()
            );
            *counts.entry(key).or_default() += 1;
        }
    }
    counts
}

async fn product_run(
    world: &World,
    seen: &Arc<Mutex<Seen>>,
    run: u32,
    n: usize,
    replays: [Replay; 2],
) -> ProductRun {
    let [replay, with_duties] = replays;
    let controller = Controller::start(world, run).await;
    let singles = if run == 1 {
        Some(single_claim_latency(world, seen, 5).await)
    } else {
        None
    };
    let prefix = format!("p{run}");
    let server_before = server_requests(world).await;
    let controller_before = controller.requests().await;
    let split_before = server_cpu_by_process(world);
    let ctl_cpu_before = cpu_seconds(controller.pid());
    let bench_cpu_before = cpu_seconds(std::process::id());

    let started = Instant::now();
    let mut created: HashMap<String, Instant> = HashMap::new();
    let creates = (0..n).map(|i| {
        let name = format!("{prefix}-{i:05}");
        let at = Instant::now();
        let fut = world.create_claim(serde_json::json!({"metadata": {"name": name}, "spec": {}}));
        created.insert(name, at);
        fut
    });
    let mut profiles = profile_servers(world, &prefix, (n as u64 / 50).clamp(5, 30));
    futures::stream::iter(creates)
        .buffer_unordered(256)
        .collect::<Vec<_>>()
        .await;
    let all_ready = |seen: &Seen| {
        created
            .keys()
            .filter(|k| seen.ready.contains_key(*k))
            .count()
    };
    let limit = Duration::from_secs(300 + n as u64);
    loop {
        let ready = all_ready(&seen.lock().expect("lock"));
        if ready == n {
            break;
        }
        if started.elapsed() > limit {
            panic!("only {ready} of {n} claims Ready after {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took = started.elapsed().as_secs_f64();
    let server_after = server_requests(world).await;
    let controller_after = controller.requests().await;
    let split = cpu_used(&server_cpu_by_process(world), &split_before);
    let server_cpu_used: f64 = split.values().sum();
    for p in profiles.iter_mut() {
        let _ = p.wait();
    }
    let ctl_cpu = cpu_seconds(controller.pid()) - ctl_cpu_before;
    let bench_cpu = cpu_seconds(std::process::id()) - bench_cpu_before;
    let ctl_peak = process_memory(controller.pid()).map_or(0, |(_, peak)| peak);
    let mut to_ready: Vec<f64> = {
        let seen = seen.lock().expect("lock");
        created
            .iter()
            .filter_map(|(k, at)| Some(seen.ready.get(k)?.duration_since(*at).as_secs_f64()))
            .collect()
    };
    to_ready.sort_by(f64::total_cmp);
    let events = events_by_reason(world, &prefix).await;

    // Deleting them all at once.
    let del_started = Instant::now();
    let del_split_before = server_cpu_by_process(world);
    let del_server_before = server_requests(world).await;
    let del_controller_before = controller.requests().await;
    // One DELETE of the collection; with many thousand claims the API server may give up
    // on it (etcd deadline, 500) part way: then the rest are deleted one by one, 64 at once.
    if let Err(e) = world
        .claims()
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
    {
        println!("    (deleting the collection: {e}; deleting the rest one by one)");
        let left = world
            .claims()
            .list_metadata(&ListParams::default())
            .await
            .expect("claims listed");
        futures::stream::iter(left.items.into_iter().map(|c| {
            let claims = world.claims();
            async move {
                let name = c.metadata.name.unwrap_or_default();
                let _ = claims.delete(&name, &DeleteParams::default()).await;
            }
        }))
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await;
    }
    let mut peak_server_rss = 0u64;
    loop {
        for pid in world.playground.env.pids() {
            peak_server_rss = peak_server_rss.max(process_memory(pid).map_or(0, |(rss, _)| rss));
        }
        let gone = {
            let seen = seen.lock().expect("lock");
            created
                .keys()
                .filter(|k| seen.gone.contains_key(*k))
                .count()
        };
        if gone == n && world.vms().await.is_empty() {
            break;
        }
        if del_started.elapsed() > limit {
            panic!("only {gone} of {n} claims gone after {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let deleted_in = del_started.elapsed().as_secs_f64();
    let del_used = cpu_used(&server_cpu_by_process(world), &del_split_before);
    let del_cpu: f64 = del_used.values().sum();
    let del_split = cpu_split(&del_used, n as f64);
    let del_server = diff(&server_requests(world).await, &del_server_before);
    let del_controller = diff(&controller.requests().await, &del_controller_before);

    let per = n as f64;
    let server = diff(&server_after, &server_before);
    let ctl = diff(&controller_after, &controller_before);
    let rate = per / took;
    println!();
    println!("(c) product, N = {n} claims created at once (controller process #{run})");
    if let Some(s) = singles {
        println!(
            "    single claim on idle clusters, creation → Ready: p50 {:.2}s  max {:.2}s ({} runs)",
            percentile(&s, 0.5),
            percentile(&s, 1.0),
            s.len()
        );
    }
    println!("    time until all Available:      {took:.1}s  ({rate:.1} claims/s)");
    println!(
        "    creation → Ready:              p50 {:.2}s  p90 {:.2}s  max {:.2}s",
        percentile(&to_ready, 0.5),
        percentile(&to_ready, 0.9),
        percentile(&to_ready, 1.0)
    );
    println!(
        "    API servers, per claim:        {}",
        Totals::per_claim(&server, per).line()
    );
    println!(
        "    controller, per claim:         {}",
        Totals::per_claim(&ctl, per).line()
    );
    println!(
        "    API-server + etcd CPU:         {:.0} ms per claim ({server_cpu_used:.1}s)",
        server_cpu_used * 1000.0 / per
    );
    println!(
        "      of which (ms per claim):    {}",
        cpu_split(&split, per)
    );
    println!(
        "    controller:                    peak RSS {:.0} MB, CPU {ctl_cpu:.1}s ({:.1} ms per claim)",
        mb(ctl_peak),
        ctl_cpu * 1000.0 / per
    );
    println!(
        "    simulator and bench process:   CPU {bench_cpu:.1}s ({:.0} % of the servers')",
        100.0 * bench_cpu / server_cpu_used.max(0.001)
    );
    println!(
        "    deleting all:                  {deleted_in:.1}s ({:.1} claims/s, {:.0} % of the creation rate), peak API-server RSS {:.0} MB, server CPU {del_cpu:.1}s",
        per / deleted_in,
        100.0 * (per / deleted_in) / rate,
        mb(peak_server_rss)
    );
    println!("      server CPU of the deletion (ms per claim): {del_split}");
    println!(
        "      deletion, API servers, per claim: {}",
        Totals::per_claim(&del_server, per).line()
    );
    println!(
        "      deletion, controller, per claim:  {}",
        Totals::per_claim(&del_controller, per).line()
    );
    println!("{}", breakdown(&del_server, per));
    println!(
        "    Events per claim by reason:    {}",
        events
            .iter()
            .map(|(reason, count)| format!("{reason} {:.2}", *count as f64 / per))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("    requests per claim at the API servers (cluster, verb, resource):");
    println!("{}", breakdown(&server, per));
    if !ctl.is_empty() {
        println!("    of them the controller's:");
        println!("{}", breakdown(&ctl, per));
    }
    println!(
        "    product ÷ replay bound:        {:.2}",
        rate / replay.claims_per_s.max(f64::MIN_POSITIVE)
    );
    println!(
        "    product ÷ replay + simulator duties: {:.2}",
        rate / with_duties.claims_per_s.max(f64::MIN_POSITIVE)
    );
    // Both sides are CPU-bound on the same cores, so the rates go as the inverse of the CPU
    // per claim: what the product would reach if the controller cost nothing.
    let without_controller = (server_cpu_used + bench_cpu) * 1000.0 / per;
    println!(
        "    ceiling with a controller that costs no CPU: {:.2} of the replay bound ({:.1} ms per claim replayed, {without_controller:.1} ms servers + simulator)",
        replay.cpu_ms_per_claim / without_controller.max(f64::MIN_POSITIVE),
        replay.cpu_ms_per_claim
    );
    drop(controller);
    ProductRun { claims_per_s: rate }
}

fn sizes() -> Vec<usize> {
    opscommon::measure::bench_sizes("AUTONODES_BENCH_CLAIMS", &[200, 1000])
}

fn main() {
    let Some(rt) = opscommon::measure::bench_runtime("throughput") else {
        return;
    };
    rt.block_on(async {
        let mut world = World::start_clusters(&WorldOptions {
            provider: provider(),
            ..Default::default()
        })
        .await;
        let sizes = sizes();
        println!("throughput on real API servers (one etcd; management, host and tenant kube-apiservers), 2 cores");
        let secrets = secret_bound(&world).await;
        println!();
        println!("(a) Secret write bound:            {secrets:.0} creates/s (2 KiB, {IN_FLIGHT} in flight, {SECRETS})");
        let sampled = Templates::sampled(&mut world).await;
        let stand_in = Templates::stand_in();
        println!("    replayed objects, {}: {}", sampled.what, sampled.sizes());
        println!("    ({} of earlier versions of this bench: {})", stand_in.what, stand_in.sizes());
        let mut replays = Vec::new();
        let mut small = Vec::new();
        for &n in &sizes {
            let mut pair = Vec::new();
            for calls in [CallSet::Minimal, CallSet::WithSimulatorDuties] {
                let r = replay_bound(&world, n, calls, &sampled).await;
                println!(
                    "(b) {}, N = {n}:{}{:.1} claims/s ({:.0} Secret-creates' worth per claim)",
                    calls.label(),
                    " ".repeat(10usize.saturating_sub(n.to_string().len())),
                    r.claims_per_s,
                    secrets / r.claims_per_s
                );
                pair.push(r);
            }
            replays.push([pair[0], pair[1]]);
            let r = replay_bound(&world, n, CallSet::Minimal, &stand_in).await;
            println!(
                "    for comparison, the replay bound with {}, N = {n}: {:.1} claims/s",
                stand_in.what, r.claims_per_s
            );
            small.push(r.claims_per_s);
        }
        world.start_simulator(SimMode::Normal).await;
        let (seen, watch) = watch_claims(&world);
        let mut products = Vec::new();
        for (i, (&n, &pair)) in sizes.iter().zip(&replays).enumerate() {
            let run = product_run(&world, &seen, i as u32 + 1, n, pair).await;
            products.push(run.claims_per_s);
        }
        watch.abort();
        // The minimal replay once more, after the product runs and without the simulator,
        // as before them: the clusters' cost per call drifts over a run (etcd's history
        // grows, the API servers' heaps too), and the product always runs after the
        // replays; the mean of the two replays takes that order out of the ratio.
        world.stop_simulator().await;
        println!();
        let mut after = Vec::new();
        for &n in &sizes {
            let r = replay_bound(&world, n, CallSet::Minimal, &sampled).await;
            println!(
                "(b) replay bound again, after the product runs, N = {n}: {:.1} claims/s",
                r.claims_per_s
            );
            after.push(r);
        }
        world.shutdown().await;
        println!();
        let mut last = None;
        for ((((&n, pair), after), product), small) in
            sizes.iter().zip(&replays).zip(&after).zip(&products).zip(&small)
        {
            let before = pair[0].claims_per_s;
            let mean = (before + after.claims_per_s) / 2.0;
            println!(
                "N = {n}: product {product:.1} claims/s; ÷ replay bound before {:.2}, after {:.2}, \
                 mean {:.2}; ÷ replay + simulator duties {:.2}; ÷ the replay of {} {:.2}",
                product / before,
                product / after.claims_per_s,
                product / mean,
                product / pair[1].claims_per_s,
                stand_in.what,
                product / small,
            );
            last = Some((n, product / mean, product / pair[1].claims_per_s));
        }
        if let Some((n, ratio, with_duties)) = last {
            println!();
            println!("product claims/s ÷ replay + simulator duties claims/s (N = {n}): {with_duties:.2}");
            println!(
                "product claims/s ÷ replay claims/s (N = {n}, replay: mean of before and after): {ratio:.2}"
            );
        }
    });
}

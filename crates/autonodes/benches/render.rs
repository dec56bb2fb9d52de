//! Benchmarks of the pure core: full renders (type choice + VirtualMachine + user data) for
//! the reference "advanced" provider expanded to 50 node types, each part of a render on
//! its own, and the strategic merge of a 50 KB template.
//!
//! `cargo bench --bench render` first prints a plain summary (renders per second on one
//! thread, and the cost of each part), then runs the criterion measurements.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use autonodes_api::{NodeClaim, NodeProvider};
use autonodes_core::catalogue::Catalogue;
use autonodes_core::render::{plan_node, render_node};
use autonodes_core::scheduling::{self, ClaimRequest};
use autonodes_core::template;
use autonodes_core::template::merge::strategic_merge;
use autonodes_core::template::names::VmIdentity;
use autonodes_core::userdata::{self, JoinParams, JoinTemplate, UserDataInput};
use criterion::{criterion_group, Criterion, Throughput};
use serde_json::{json, Value};

const ADVANCED: &str = include_str!("../../../examples/nodeprovider-advanced.yaml");

/// The advanced provider with 50 node types: sizes from 1 to 32 CPUs, a zone property,
/// every third type with a merged template (label, taint, extra disk), capacities.
fn provider_with_50_types() -> NodeProvider {
    let mut p: NodeProvider =
        autonodes_core::yaml::from_str(ADVANCED).expect("advanced example parses");
    let template = p.spec.kube_virt.node_types[1].clone();
    p.spec.kube_virt.node_types = (0..50)
        .map(|i| {
            let mut t = template.clone();
            t.name = format!("type-{i:02}");
            t.display_name = Some(format!("Type {i}"));
            let cpu = 1 + (i % 32);
            let mem = 2 * (1 + (i % 24));
            t.resources = BTreeMap::from([
                ("cpu".to_string(), serde_json::from_value(json!(cpu.to_string())).expect("q")),
                ("memory".to_string(), serde_json::from_value(json!(format!("{mem}Gi"))).expect("q")),
            ]);
            t.properties = BTreeMap::from([
                ("topology.kubernetes.io/zone".to_string(), format!("zone-{}", i % 3)),
                ("example.com/generation".to_string(), (i % 5).to_string()),
            ]);
            t.max_capacity = Some(10 + i as i64);
            t.merge_virtual_machine_template = (i % 3 == 0).then(|| {
                json!({
                    "metadata": {"labels": {"workload": format!("w{i}")}},
                    "spec": {"template": {"spec": {
                        "taints": [{"key": "workload", "value": format!("w{i}"), "effect": "NoSchedule"}],
                        "domain": {"devices": {"disks": [{"name": "scratch", "disk": {"bus": "virtio"}}]}},
                        "volumes": [{"name": "scratch", "emptyDisk": {"capacity": "10Gi"}}]
                    }}}
                })
            });
            t
        })
        .collect();
    p
}

/// A claim that has to look through the catalogue: zone, generation (Gt), and a size that
/// only mid-sized types have.
fn claim() -> NodeClaim {
    autonodes_core::yaml::from_str(
        r#"
apiVersion: autonodes.io/v1alpha1
kind: NodeClaim
metadata: {name: bench-1, namespace: tenant, uid: 6f1c1b8e-0d5e-4c1a-9a57-2b7f0c3e9d11}
spec:
  vClusterRef: {name: tenant}
  requirements:
    - {key: topology.kubernetes.io/zone, operator: In, values: [zone-1, zone-2]}
    - {key: example.com/generation, operator: Gt, values: ["1"]}
  desiredCapacity: {cpu: "6", memory: 20Gi}
  labels: {team: payments}
  startupTaints: [{key: example.com/cni-not-ready, effect: NoSchedule}]
"#,
    )
    .expect("claim parses")
}

fn join() -> JoinParams {
    JoinParams {
        api_server_endpoint: "10.96.0.1:443".into(),
        join_script_url: None,
        ca_pem: None,
        token: "abcdef.0123456789abcdef".into(),
        ca_cert_hashes: vec![
            "sha256:2917f5ab7ab656c6c2585c6a715cfb777c242f7a357a5ba18a4c21849d401d6a".into(),
        ],
        ..JoinParams::placeholder()
    }
}

/// A template of about 50 KB: 120 disks and volumes, 40 interfaces/networks, annotations.
fn big_template() -> (Value, Value) {
    let disks: Vec<Value> = (0..240)
        .map(|i| json!({"name": format!("disk-{i}"), "disk": {"bus": "virtio"}, "serial": format!("SER{i:08}")}))
        .collect();
    let volumes: Vec<Value> = (0..240)
        .map(|i| json!({"name": format!("disk-{i}"), "dataVolume": {"name": format!("dv-{i}")}}))
        .collect();
    let interfaces: Vec<Value> = (0..80)
        .map(|i| json!({"name": format!("net-{i}"), "bridge": {}}))
        .collect();
    let networks: Vec<Value> = (0..80)
        .map(
            |i| json!({"name": format!("net-{i}"), "multus": {"networkName": format!("vlan-{i}")}}),
        )
        .collect();
    let annotations: serde_json::Map<String, Value> = (0..120)
        .map(|i| {
            (
                format!("example.com/annotation-{i}"),
                json!("x".repeat(100)),
            )
        })
        .collect();
    let base = json!({
        "metadata": {"labels": {"provider": "kubevirt"}, "annotations": annotations},
        "spec": {"template": {"spec": {
            "domain": {"devices": {"disks": disks, "interfaces": interfaces},
                       "resources": {"requests": {"cpu": "2", "memory": "4Gi"}}},
            "networks": networks, "volumes": volumes
        }}}
    });
    let patch = json!({
        "metadata": {"labels": {"workload": "big"}, "annotations": {"example.com/annotation-3": null}},
        "spec": {"template": {"spec": {
            "domain": {"devices": {
                "disks": [{"name": "disk-239", "bootOrder": 1}, {"name": "disk-new", "disk": {"bus": "sata"}}],
                "interfaces": [{"name": "net-0", "$patch": "delete"}]}},
            "volumes": [{"name": "disk-new", "emptyDisk": {"capacity": "1Gi"}}]
        }}}
    });
    (base, patch)
}

/// Times `f` over `iterations` calls; returns microseconds per call.
fn time_per_call(iterations: u32, mut f: impl FnMut()) -> f64 {
    for _ in 0..iterations / 10 {
        f();
    }
    let start = Instant::now();
    for _ in 0..iterations {
        f();
    }
    start.elapsed().as_secs_f64() * 1e6 / f64::from(iterations)
}

/// Plain figures, one thread, before criterion's statistics.
fn summary() {
    let provider = provider_with_50_types();
    let catalogue = Catalogue::from_provider(&provider);
    let claim = claim();
    let join = join();
    let claimed = BTreeMap::new();
    let chosen = plan_node(
        &catalogue,
        &claim,
        None,
        &claimed,
        "tenant-bench-1-abcdef",
        &join,
        "bench",
    )
    .expect("the bench claim fits");
    let t = catalogue
        .get(&chosen.node_type)
        .expect("chosen type exists");
    let n = 20_000;

    let full = time_per_call(n, || {
        black_box(
            plan_node(
                &catalogue,
                &claim,
                None,
                &claimed,
                "tenant-bench-1-abcdef",
                &join,
                "bench",
            )
            .expect("renders"),
        );
    });
    let choose = time_per_call(n, || {
        let req = ClaimRequest::new(&claim.spec, None).expect("valid");
        black_box(scheduling::choose(&catalogue, &req, &claimed).expect("fits"));
    });
    let labels =
        autonodes_core::template::names::managed_labels("bench-1", "tenant", "uid", "bench");
    let vm = time_per_call(n, || {
        black_box(
            template::finalize_vm(
                &t.template,
                &VmIdentity {
                    name: "tenant-bench-1-abcdef",
                    namespace: "ns",
                    labels: &labels,
                },
                &t.name,
            )
            .expect("vm"),
        );
    });
    let node_labels = chosen.labels.join.clone();
    let taints = chosen.taints.registration();
    let args = BTreeMap::new();
    let user_data = time_per_call(n, || {
        black_box(
            userdata::render_user_data(&UserDataInput {
                template: JoinTemplate::Kubeadm,
                node_name: "tenant-bench-1-abcdef",
                join: &join,
                node_labels: &node_labels,
                taints: &taints,
                kubelet_args: &args,
                user_cloud_config: None,
                ssh_keys: &[],
                image_prepared: false,
                download_url: None,
            })
            .expect("user data"),
        );
    });
    let render_only = time_per_call(n, || {
        black_box(
            render_node(t, &claim, None, "tenant-bench-1-abcdef", &join, "bench").expect("renders"),
        );
    });
    let prepare = time_per_call(200, || {
        black_box(Catalogue::from_provider(&provider));
    });
    let (base, patch) = big_template();
    let size = serde_json::to_string(&base).map(|s| s.len()).unwrap_or(0);
    let merge = time_per_call(2_000, || {
        black_box(strategic_merge(&base, &patch).expect("merges"));
    });

    println!(
        "autonodes render benchmark (one thread; {} node types; chosen {})",
        catalogue.types().len(),
        chosen.node_type
    );
    println!(
        "  full render (choice + VM + user data): {full:8.2} us  = {:>8.0} renders/s",
        1e6 / full
    );
    println!(
        "    type choice (request + 50 types):   {choose:8.2} us  ({:4.1}%)",
        100.0 * choose / full
    );
    println!(
        "    render_node (for the chosen type):  {render_only:8.2} us  ({:4.1}%)",
        100.0 * render_only / full
    );
    println!(
        "      VirtualMachine (forced fields):   {vm:8.2} us  ({:4.1}%)",
        100.0 * vm / full
    );
    println!(
        "      user data (handlebars):           {user_data:8.2} us  ({:4.1}%)",
        100.0 * user_data / full
    );
    println!("  prepare catalogue (50 types, once):   {prepare:8.2} us");
    println!(
        "  strategic merge of a {:.1} KB template: {merge:8.2} us  = {:>8.0} merges/s",
        size as f64 / 1000.0,
        1e6 / merge
    );
}

fn benches(c: &mut Criterion) {
    let provider = provider_with_50_types();
    let catalogue = Catalogue::from_provider(&provider);
    let claim = claim();
    let join = join();
    let claimed = BTreeMap::new();

    let mut g = c.benchmark_group("render");
    g.throughput(Throughput::Elements(1));
    g.bench_function("full render, 50 types", |b| {
        b.iter(|| {
            plan_node(
                &catalogue,
                black_box(&claim),
                None,
                &claimed,
                "tenant-bench-1-abcdef",
                &join,
                "bench",
            )
            .expect("renders")
        })
    });
    g.bench_function("type choice, 50 types", |b| {
        b.iter(|| {
            let req = ClaimRequest::new(black_box(&claim.spec), None).expect("valid");
            scheduling::choose(&catalogue, &req, &claimed).map(|t| t.cost)
        })
    });
    g.bench_function("prepare catalogue, 50 types", |b| {
        b.iter(|| Catalogue::from_provider(black_box(&provider)))
    });
    g.finish();

    let (base, patch) = big_template();
    let size = serde_json::to_string(&base)
        .map(|s| s.len() as u64)
        .unwrap_or(0);
    let mut g = c.benchmark_group("merge");
    g.throughput(Throughput::Bytes(size));
    g.bench_function("strategic merge, 50 KB template", |b| {
        b.iter(|| strategic_merge(black_box(&base), black_box(&patch)))
    });
    g.finish();
}

criterion_group! {
    name = criterion_benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30);
    targets = benches
}

fn main() {
    summary();
    criterion_benches();
    Criterion::default().configure_from_args().final_summary();
}

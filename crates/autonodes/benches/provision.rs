//! How fast claims turn Available against real API servers: 200 claims created at once on
//! the playground (management, host and tenant kube-apiservers, the in-process controller
//! and the KubeVirt simulator booting VMs at once). Prints figures; asserts nothing timed.
//!
//! `cargo bench --bench provision` (under `cargo test` it only says it was skipped).

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::world::{condition, provider_yaml, World, WorldOptions};

const CLAIMS: usize = 200;

fn provider() -> String {
    provider_yaml(
        "bench",
        "test-kubevirt-1",
        "1",
        "1Gi",
        "      - name: small",
    )
}

fn seconds_between(
    a: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    b: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> f64 {
    (b.0.as_millisecond() - a.0.as_millisecond()) as f64 / 1000.0
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("provision bench skipped (run it with `cargo bench --bench provision`)");
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let world = World::start(WorldOptions {
            provider: provider(),
            ..Default::default()
        })
        .await;
        // Let the provider and its type become Available first.
        world
            .wait_node_type("bench.small", "Available", |t| {
                t.status
                    .as_ref()
                    .and_then(|s| s.phase)
                    .map(|p| format!("{p:?}"))
                    == Some("Available".into())
            })
            .await;
        let started = Instant::now();
        let creates = (0..CLAIMS).map(|i| {
            world.create_claim(
                serde_json::json!({"metadata": {"name": format!("b-{i:03}")}, "spec": {}}),
            )
        });
        futures::future::join_all(creates).await;
        let created = started.elapsed();
        let claims =
            common::eventually("all claims Available", Duration::from_secs(900), || async {
                let list = world.claims().list(&Default::default()).await.ok()?;
                let available = list
                    .items
                    .iter()
                    .filter(|c| condition(c, "Ready").is_some_and(|x| x.0 == "True"))
                    .count();
                (available == CLAIMS).then_some(list.items)
            })
            .await;
        let total = started.elapsed();
        let mut to_ready: Vec<f64> = Vec::new();
        let mut boot_to_ready: Vec<f64> = Vec::new();
        for c in &claims {
            let created = c.metadata.creation_timestamp.as_ref().expect("created");
            let conds = &c.status.as_ref().expect("status").conditions;
            let at = |t: &str| {
                conds
                    .iter()
                    .find(|x| x.type_ == t)
                    .map(|x| &x.last_transition_time)
            };
            if let (Some(ready), Some(provisioned)) = (at("Ready"), at("Provisioned")) {
                to_ready.push(seconds_between(created, ready));
                boot_to_ready.push(seconds_between(provisioned, ready));
            }
        }
        to_ready.sort_by(f64::total_cmp);
        boot_to_ready.sort_by(f64::total_cmp);
        println!("claims:                              {CLAIMS}");
        println!(
            "time to create them (API calls):     {:.2}s",
            created.as_secs_f64()
        );
        println!(
            "time until all are Available:        {:.2}s",
            total.as_secs_f64()
        );
        println!(
            "throughput:                          {:.1} claims/s",
            CLAIMS as f64 / total.as_secs_f64()
        );
        println!(
            "creation → Ready per claim (1s res.): p50 {:.0}s  p90 {:.0}s  max {:.0}s",
            percentile(&to_ready, 0.5),
            percentile(&to_ready, 0.9),
            percentile(&to_ready, 1.0)
        );
        println!(
            "VM running → Ready per claim:         p50 {:.0}s  p90 {:.0}s  max {:.0}s",
            percentile(&boot_to_ready, 0.5),
            percentile(&boot_to_ready, 0.9),
            percentile(&boot_to_ready, 1.0)
        );
        assert_eq!(world.vms().await.len(), CLAIMS, "one VM per claim");
        world.shutdown().await;
    });
}

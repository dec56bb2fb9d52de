//! The core stays pure: nothing in its dependency tree talks to a network, runs an async
//! runtime or is a Kubernetes client. (`kube-core`, the types half of kube, comes in through
//! `autonodes-api` and is allowed: it has no client and no I/O.)

use std::collections::BTreeSet;
use std::process::Command;

/// Crates that mean I/O, an async runtime or a Kubernetes client.
const FORBIDDEN: &[&str] = &[
    "kube",
    "kube-client",
    "kube-runtime",
    "tokio",
    "mio",
    "hyper",
    "hyper-util",
    "hyper-rustls",
    "rustls",
    "reqwest",
    "tower",
    "axum",
    "socket2",
    "prometheus",
];

#[test]
fn the_core_depends_on_no_client_runtime_or_io_crate() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "tree",
            "--offline",
            "--package",
            "autonodes-core",
            "--edges",
            "normal",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8_lossy(&out.stdout);
    let crates: BTreeSet<&str> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(
        crates.contains("autonodes-core") && crates.contains("autonodes-api"),
        "unexpected cargo tree output:\n{tree}"
    );
    let found: Vec<&&str> = FORBIDDEN.iter().filter(|c| crates.contains(**c)).collect();
    assert!(
        found.is_empty(),
        "autonodes-core depends on {found:?}; its tree:\n{tree}"
    );
    println!(
        "autonodes-core depends on {} crates, none of {FORBIDDEN:?}",
        crates.len()
    );
}

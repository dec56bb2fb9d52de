//! Helpers shared by the integration tests: real API servers from `autonodes_testenv::testenv`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use autonodes_testenv::testenv::{ApiServer, TestEnv};

/// The repository root (the workspace; this crate lives in `crates/autonodes`).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// Starts etcd and the named API servers; fails the test with the reason if it cannot.
pub async fn start(names: &[&str]) -> TestEnv {
    match TestEnv::start(names).await {
        Ok(env) => env,
        Err(e) => panic!("starting the test environment: {e}"),
    }
}

/// Adds API server `name` to `env`, with `crds` established.
pub async fn add_server(
    env: &mut TestEnv,
    name: &str,
    crds: Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>,
) {
    let opts = autonodes_testenv::testenv::ServerOptions {
        crds,
        ..Default::default()
    };
    if let Err(e) = env.add_apiserver_with(name, &opts).await {
        panic!("starting API server {name}: {e}");
    }
}

/// Runs kubectl against `server` and returns its output, whatever the exit code.
pub fn kubectl(env: &TestEnv, server: &ApiServer, args: &[&str]) -> Output {
    server
        .kubectl(&env.bins)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running kubectl {args:?}: {e}"))
}

/// Runs kubectl and returns stdout; fails the test when kubectl fails.
pub fn kubectl_ok(env: &TestEnv, server: &ApiServer, args: &[&str]) -> String {
    let out = kubectl(env, server, args);
    assert!(
        out.status.success(),
        "kubectl {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The cell of `kubectl get`'s table `table` in the row whose first column is `row` and the
/// column headed `header` (cells are cut at the header's column starts, as kubectl aligns
/// them).
#[allow(dead_code)]
pub fn column(table: &str, row: &str, header: &str) -> String {
    let mut lines = table.lines();
    let head = lines.next().unwrap_or_default();
    let starts: Vec<usize> = head
        .char_indices()
        .filter(|&(i, c)| c != ' ' && (i == 0 || head.as_bytes()[i - 1] == b' '))
        .map(|(i, _)| i)
        .collect();
    let at = starts
        .iter()
        .position(|&i| head[i..].split(' ').next() == Some(header))
        .unwrap_or_else(|| panic!("no column {header}: {table}"));
    let line = lines
        .find(|l| l.split_whitespace().next() == Some(row))
        .unwrap_or_else(|| panic!("no row {row}: {table}"));
    let end = starts
        .get(at + 1)
        .copied()
        .unwrap_or(line.len())
        .min(line.len());
    line.get(starts[at]..end)
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Applies every CRD in `crds/` with kubectl and waits until they are Established.
pub fn apply_crds_dir(env: &TestEnv, server: &ApiServer) {
    let dir = repo().join("crds");
    // The CRDs carry CEL rules, which kubectl 1.20's client-side validation refuses (the
    // server drops them); `--validate=false` as Helm does.
    kubectl_ok(
        env,
        server,
        &["apply", "--validate=false", "-f", path_str(&dir)],
    );
    wait_established(
        env,
        server,
        &[
            "crd/nodeclaims.autonodes.io",
            "crd/nodepools.autonodes.io",
            "crd/nodeproviders.autonodes.io",
            "crd/nodetypes.autonodes.io",
        ],
    );
}

/// Waits (`kubectl wait`, up to 60 s) until each of `crds` (`crd/NAME`) is Established.
pub fn wait_established(env: &TestEnv, server: &ApiServer, crds: &[&str]) {
    let mut args = vec!["wait", "--for=condition=Established", "--timeout=60s"];
    args.extend_from_slice(crds);
    kubectl_ok(env, server, &args);
}

/// A path as &str (test paths are UTF-8).
pub fn path_str(p: &Path) -> &str {
    p.to_str()
        .unwrap_or_else(|| panic!("non-UTF-8 path {}", p.display()))
}

/// Retries `f` until it returns Some or `timeout` passes.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until `api` has no object `name`; `what` names the wait when it times out.
pub async fn wait_gone<K>(what: &str, api: &kube::Api<K>, name: &str, timeout: Duration)
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    eventually(what, timeout, || async move {
        matches!(api.get_opt(name).await, Ok(None)).then_some(())
    })
    .await
}

/// True while a process with this pid exists (and is not a zombie).
pub fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.trim_start().starts_with('Z'))
            .unwrap_or(false),
        Err(_) => false,
    }
}

/// A command's stdout and stderr, one after the other.
pub fn output_text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Where `scripts/image.sh` (run by the image and release tests) gets its static binary:
/// the one the test command built before the tests (`AUTONODES_STATIC_BINARY`, from
/// `scripts/image.sh --binary-only`), or, in a test run on its own, a build of its own in
/// `target/image-build`, whose lock the running `cargo test` does not hold.
pub fn static_binary_for_image_sh(cmd: &mut Command) -> &mut Command {
    if std::env::var_os("AUTONODES_STATIC_BINARY").is_none() {
        cmd.env("CARGO_TARGET_DIR", repo().join("target/image-build"));
    }
    cmd
}

/// Why buildah cannot build a `FROM scratch` image on this machine (`None`: it can): builds
/// a one-file probe image in `dir`, tagged `<tag>:<this process's id>`, and removes it.
pub fn buildah_cannot_build(dir: &Path, tag: &str) -> Option<String> {
    std::fs::write(dir.join("probe"), "probe\n").expect("probe file");
    std::fs::write(dir.join("Dockerfile"), "FROM scratch\nCOPY probe /probe\n")
        .expect("probe Dockerfile");
    let tag = format!("{tag}:{}", std::process::id());
    let out = std::process::Command::new("buildah")
        .args(["build", "--quiet", "--isolation", "chroot", "--tag", &tag])
        .arg(dir)
        .output()
        .expect("buildah runs");
    let _ = std::process::Command::new("buildah")
        .args(["rmi", "--force", &tag])
        .output();
    (!out.status.success()).then(|| {
        format!(
            "buildah cannot build a FROM scratch image on this machine: {}",
            output_text(&out).trim()
        )
    })
}

pub mod pools;
pub mod world;

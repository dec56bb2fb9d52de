//! The release (issue 35): the crates, the chart, the image and the CHANGELOG carry one
//! version, and `scripts/release.sh` pushes the image, an SBOM of the binary's dependencies
//! and the chart to a real OCI registry (Debian's `docker-registry` on a loopback port).
//! What was pushed is read back through the registry's HTTP API, and the chart is pulled
//! with Helm's library and installed into a real API server with the pushed image. The API
//! server has no kubelet, so no pod runs: the image and the SBOM are checked in the registry.
//! The registry test is skipped, with the reason, where docker-registry or buildah cannot run.

use crate::common;
use crate::opscommon;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{kubectl, kubectl_ok, path_str, repo};
use opscommon::{documents, helm_python};
use serde_json::{json, Value};

/// The version every part of the release carries.
const VERSION: &str = env!("CARGO_PKG_VERSION");

fn read(file: &str) -> String {
    std::fs::read_to_string(repo().join(file)).unwrap_or_else(|e| panic!("reading {file}: {e}"))
}

fn text(out: &Output) -> String {
    common::output_text(out)
}

/// The `version` of `[workspace.package]` in the workspace's Cargo.toml.
fn workspace_version(cargo_toml: &str) -> Option<String> {
    cargo_toml
        .lines()
        .skip_while(|l| l.trim() != "[workspace.package]")
        .skip(1)
        .take_while(|l| !l.trim_start().starts_with('['))
        .find_map(|l| {
            let (key, value) = l.split_once('=')?;
            (key.trim() == "version").then(|| value.trim().trim_matches('"').to_string())
        })
}

/// The version of the CHANGELOG's latest released section: its first `## [x.y.z] - date`.
fn changelog_release(changelog: &str) -> Option<(String, String)> {
    changelog.lines().find_map(|l| {
        let rest = l.strip_prefix("## [")?;
        let (version, date) = rest.split_once(']')?;
        (version != "Unreleased").then(|| {
            (
                version.to_string(),
                date.trim_start_matches(" - ").trim().to_string(),
            )
        })
    })
}

/// The versions Cargo.lock records for the workspace's own packages.
fn locked_versions(lock: &str, names: &[String]) -> BTreeMap<String, String> {
    let mut found = BTreeMap::new();
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        let Some(name) = line
            .strip_prefix("name = \"")
            .and_then(|n| n.strip_suffix('"'))
        else {
            continue;
        };
        if !names.iter().any(|n| n == name) {
            continue;
        }
        if let Some(v) = lines.next().and_then(|l| {
            l.strip_prefix("version = \"")
                .and_then(|v| v.strip_suffix('"'))
        }) {
            found.insert(name.to_string(), v.to_string());
        }
    }
    found
}

#[test]
fn the_crates_the_chart_the_image_and_the_changelog_carry_one_version() {
    let version = workspace_version(&read("Cargo.toml")).expect("[workspace.package] version");
    assert_eq!(
        version, VERSION,
        "the crate is built with the workspace's version"
    );

    // Every crate takes the workspace's version, and Cargo.lock agrees.
    let mut crates = Vec::new();
    for entry in std::fs::read_dir(repo().join("crates")).expect("crates/") {
        let dir = entry.expect("entry").path();
        let manifest = dir.join("Cargo.toml");
        let Ok(toml) = std::fs::read_to_string(&manifest) else {
            continue;
        };
        assert!(
            toml.lines().any(|l| l.trim() == "version.workspace = true"),
            "{} does not take the workspace's version (version.workspace = true)",
            manifest.display()
        );
        let name = toml
            .lines()
            .find_map(|l| l.strip_prefix("name = \""))
            .and_then(|n| n.strip_suffix('"'))
            .expect("package name");
        crates.push(name.to_string());
    }
    assert!(crates.len() >= 5, "the workspace's crates: {crates:?}");
    let locked = locked_versions(&read("Cargo.lock"), &crates);
    assert_eq!(locked.len(), crates.len(), "Cargo.lock lists {locked:?}");
    for (name, v) in &locked {
        assert_eq!(v, &version, "Cargo.lock's {name}");
    }

    // The charts: the controller's and the CRDs'.
    for file in [
        "charts/autonodes/Chart.yaml",
        "charts/autonodes-crd/Chart.yaml",
    ] {
        let chart: Value = autonodes_core::yaml::from_str(&read(file)).expect("Chart.yaml");
        assert_eq!(chart["version"], version.as_str(), "{file} version");
        assert_eq!(chart["appVersion"], version.as_str(), "{file} appVersion");
    }

    // The image: scripts/image.sh tags it with Cargo.toml's version; the Dockerfile's own
    // default (a `docker build .` without build arguments) says the same.
    let out = Command::new("bash")
        .arg(repo().join("scripts/image.sh"))
        .arg("--print-name")
        .env_remove("AUTONODES_IMAGE")
        .output()
        .expect("image.sh runs");
    assert!(
        out.status.success(),
        "image.sh --print-name: {}",
        text(&out)
    );
    let name = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(
        name.rsplit_once(':').map(|(_, tag)| tag),
        Some(version.as_str()),
        "the image scripts/image.sh builds: {name}"
    );
    let dockerfile = read("Dockerfile");
    assert!(
        dockerfile
            .lines()
            .any(|l| l.trim() == format!("ARG VERSION={version}")),
        "the Dockerfile's ARG VERSION default is {version}"
    );

    // The CHANGELOG: an Unreleased section, then this version with a date, and its link.
    let changelog = read("CHANGELOG.md");
    assert!(
        changelog.lines().any(|l| l == "## [Unreleased]"),
        "CHANGELOG.md has an `## [Unreleased]` section"
    );
    let (released, date) = changelog_release(&changelog).expect("a released section");
    assert_eq!(released, version, "CHANGELOG.md's latest release");
    let ymd: Vec<&str> = date.split('-').collect();
    assert!(
        ymd.len() == 3
            && [4, 2, 2]
                .iter()
                .zip(&ymd)
                .all(|(n, p)| p.len() == *n && p.bytes().all(|b| b.is_ascii_digit())),
        "the release's date is YYYY-MM-DD: {date}"
    );
    assert!(
        changelog
            .lines()
            .any(|l| l.starts_with(&format!("[{version}]: "))),
        "CHANGELOG.md links [{version}]"
    );
}

#[test]
fn release_sh_pushes_nothing_while_the_chart_and_the_crates_disagree_on_the_version() {
    // A copy of what the script reads first, with the chart one version ahead.
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path();
    std::fs::create_dir_all(root.join("scripts")).expect("scripts/");
    std::fs::create_dir_all(root.join("charts/autonodes")).expect("charts/");
    std::fs::create_dir_all(root.join("charts/autonodes-crd")).expect("charts/");
    for file in [
        "Cargo.toml",
        "CHANGELOG.md",
        "scripts/release.sh",
        "charts/autonodes-crd/Chart.yaml",
    ] {
        std::fs::copy(repo().join(file), root.join(file)).expect("copy");
    }
    let chart = read("charts/autonodes/Chart.yaml")
        .replace(&format!("\nversion: {VERSION}\n"), "\nversion: 99.0.0\n");
    std::fs::write(root.join("charts/autonodes/Chart.yaml"), chart).expect("Chart.yaml");

    let out = Command::new("bash")
        .arg(root.join("scripts/release.sh"))
        .args(["--registry", "127.0.0.1:1", "--plain-http"])
        .output()
        .expect("release.sh runs");
    let shown = text(&out);
    assert!(!out.status.success(), "release.sh went on:\n{shown}");
    assert!(
        shown.contains(&format!(
            "Chart.yaml version is '99.0.0', Cargo.toml's version is '{VERSION}'"
        )),
        "release.sh names the disagreement:\n{shown}"
    );
    assert!(!shown.contains("building"), "nothing is built:\n{shown}");
}

/// Why buildah cannot build a `FROM scratch` image here, or `None` when it can.
fn builder_unusable(dir: &Path) -> Option<String> {
    if Command::new("buildah").arg("--version").output().is_err() {
        return Some(
            "buildah is not installed (scripts/test-tools.sh installs Debian's buildah)".into(),
        );
    }
    common::buildah_cannot_build(dir, "localhost/autonodes-release-probe")
}

/// Debian's registry binary (package `docker-registry`, distribution 2.8).
fn registry_binary() -> Option<PathBuf> {
    let path = PathBuf::from("/usr/bin/docker-registry");
    path.exists().then_some(path)
}

/// A response of the registry: status, headers (names in lower case), body.
struct Response {
    status: u16,
    headers: BTreeMap<String, String>,
    body: Vec<u8>,
}

impl Response {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body[..self.body.len().min(400)])
            )
        })
    }
}

/// GETs `path` from the registry at `addr` (plain HTTP/1.0; `accept` for manifests).
fn get(addr: SocketAddr, path: &str, accept: &str) -> std::io::Result<Response> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    stream.write_all(
        format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: {accept}\r\n\r\n").as_bytes(),
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no end of headers"))?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Ok(Response {
        status,
        headers,
        body: raw[split + 4..].to_vec(),
    })
}

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";

/// GETs `path` and fails the test unless the registry answers 200.
fn get_ok(addr: SocketAddr, path: &str, accept: &str) -> Response {
    let r = get(addr, path, accept).unwrap_or_else(|e| panic!("GET {path}: {e}"));
    assert_eq!(
        r.status,
        200,
        "GET {path}: {}",
        String::from_utf8_lossy(&r.body)
    );
    r
}

/// The blob `digest` of repository `name`.
fn blob(addr: SocketAddr, name: &str, digest: &Value) -> Response {
    let digest = digest.as_str().expect("a digest");
    get_ok(addr, &format!("/v2/{name}/blobs/{digest}"), "*/*")
}

/// A `docker-registry` of the test's own on a free loopback port, storing into a temporary
/// directory; killed and reaped when dropped (also when the test panics), with the local
/// image the release tagged for it.
struct Registry {
    child: Child,
    addr: SocketAddr,
    dir: tempfile::TempDir,
    local_image: Option<String>,
}

impl Registry {
    fn start(binary: &Path) -> Registry {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n",
                dir.path().join("storage").display()
            ),
        )
        .expect("registry config");
        let log = std::fs::File::create(dir.path().join("registry.log")).expect("log file");
        let child = Command::new(binary)
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .expect("docker-registry starts");
        autonodes_testenv::testenv::record_pid(child.id(), "docker-registry");
        let mut registry = Registry {
            child,
            addr,
            dir,
            local_image: None,
        };
        let started = Instant::now();
        loop {
            if let Ok(r) = get(addr, "/v2/", "*/*") {
                if r.status == 200 {
                    break;
                }
            }
            if let Ok(Some(status)) = registry.child.try_wait() {
                panic!("docker-registry exited ({status}):\n{}", registry.log());
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "docker-registry never answered /v2/ on {addr}:\n{}",
                registry.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        registry
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(image) = &self.local_image {
            let _ = Command::new("buildah").args(["rmi", image]).output();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_sh_pushes_the_image_its_sbom_the_chart_and_the_command_line_which_install_from_the_registry(
) {
    let Some(binary) = registry_binary() else {
        eprintln!(
            "SKIPPED: /usr/bin/docker-registry is not installed (scripts/test-tools.sh installs Debian's docker-registry)"
        );
        return;
    };
    let probe = tempfile::tempdir().expect("temp dir");
    if let Some(why) = builder_unusable(probe.path()) {
        eprintln!("SKIPPED: {why}");
        return;
    }
    let mut registry = Registry::start(&binary);
    let addr = registry.addr;
    let image = format!("{addr}/autonodes:{VERSION}");
    registry.local_image = Some(image.clone());
    println!("== docker-registry on {addr}");

    // The release, with the binary in the dev profile (the release profile takes twice as
    // long and is the same script): the static binary the test command built.
    let repo = repo();
    let out_dir = tempfile::tempdir().expect("temp dir");
    let started = Instant::now();
    let out = common::static_binary_for_image_sh(
        Command::new("bash")
            .arg(repo.join("scripts/release.sh"))
            .args([
                "--registry",
                &addr.to_string(),
                "--profile",
                "dev",
                "--plain-http",
            ])
            .arg("--out")
            .arg(out_dir.path())
            .env("AUTONODES_HELM_PYTHON", helm_python())
            .current_dir(&repo),
    )
    .output()
    .expect("release.sh runs");
    let shown = text(&out);
    println!("{shown}");
    println!("== release.sh took {} s", started.elapsed().as_secs());
    assert!(out.status.success(), "scripts/release.sh failed:\n{shown}");

    // The image: an OCI image manifest under the version, labelled with it.
    let tags = get_ok(addr, "/v2/autonodes/tags/list", "*/*").json();
    let tags: Vec<&str> = tags["tags"]
        .as_array()
        .expect("tags")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let sbom_tag = format!("{VERSION}.sbom");
    assert!(
        tags.contains(&VERSION) && tags.contains(&sbom_tag.as_str()),
        "autonodes' tags: {tags:?}"
    );
    let manifest = get_ok(
        addr,
        &format!("/v2/autonodes/manifests/{VERSION}"),
        OCI_MANIFEST,
    );
    let image_digest = manifest
        .headers
        .get("docker-content-digest")
        .cloned()
        .expect("the manifest's digest");
    let image_manifest = manifest.json();
    assert_eq!(image_manifest["mediaType"], OCI_MANIFEST);
    assert_eq!(
        image_manifest["layers"].as_array().map(Vec::len),
        Some(1),
        "one layer: the binary"
    );
    let config = blob(addr, "autonodes", &image_manifest["config"]["digest"]).json();
    let labels = &config["config"]["Labels"];
    assert_eq!(labels["org.opencontainers.image.version"], VERSION);
    assert_eq!(labels["org.opencontainers.image.title"], "autonodes");
    assert_eq!(labels["org.opencontainers.image.licenses"], "Apache-2.0");
    println!("== image {image}@{image_digest}: labels {labels}");

    // The SBOM: a CycloneDX artifact whose subject is that image, listed as its referrer.
    let sbom_manifest = get_ok(
        addr,
        &format!("/v2/autonodes/manifests/{sbom_tag}"),
        OCI_MANIFEST,
    );
    let sbom_digest = sbom_manifest
        .headers
        .get("docker-content-digest")
        .cloned()
        .expect("the SBOM manifest's digest");
    let sbom_manifest = sbom_manifest.json();
    assert_eq!(
        sbom_manifest["artifactType"],
        "application/vnd.cyclonedx+json"
    );
    assert_eq!(sbom_manifest["subject"]["digest"], image_digest.as_str());
    assert_eq!(
        sbom_manifest["layers"][0]["mediaType"],
        "application/vnd.cyclonedx+json"
    );
    let referrers_tag = image_digest.replacen(':', "-", 1);
    let referrers = get_ok(
        addr,
        &format!("/v2/autonodes/manifests/{referrers_tag}"),
        OCI_INDEX,
    )
    .json();
    assert!(
        referrers["manifests"]
            .as_array()
            .expect("manifests")
            .iter()
            .any(|m| m["digest"] == sbom_digest.as_str()
                && m["artifactType"] == "application/vnd.cyclonedx+json"),
        "the referrers index {referrers_tag} lists the SBOM: {referrers}"
    );
    let sbom = blob(addr, "autonodes", &sbom_manifest["layers"][0]["digest"]).json();
    assert_eq!(sbom["bomFormat"], "CycloneDX");
    assert_eq!(sbom["metadata"]["component"]["name"], "autonodes");
    assert_eq!(sbom["metadata"]["component"]["version"], VERSION);
    let components: BTreeMap<&str, &str> = sbom["components"]
        .as_array()
        .expect("components")
        .iter()
        .filter_map(|c| Some((c["name"].as_str()?, c["version"].as_str().unwrap_or("?"))))
        .collect();
    for linked in [
        "kube",
        "kube-client",
        "tokio",
        "rustls",
        "autonodes-core",
        "autonodes-api",
    ] {
        assert!(
            components.contains_key(linked),
            "the SBOM lists {linked}: {components:?}"
        );
    }
    for dev_only in [
        "autonodes-testenv",
        "proptest",
        "criterion",
        "pulldown-cmark",
    ] {
        assert!(
            !components.contains_key(dev_only),
            "the SBOM lists the dev-dependency {dev_only}"
        );
    }
    println!(
        "== SBOM {sbom_tag} ({sbom_digest}): {} components ({} crates), kube {}, tokio {}",
        sbom["components"].as_array().map_or(0, Vec::len),
        components.len(),
        components["kube"],
        components["tokio"]
    );

    // The command line: pulled back as an OCI client would, its checksum right, the
    // binary static and runnable as `autonodes` and as kubectl's plugin.
    let cli = tempfile::tempdir().expect("temp dir");
    let out = Command::new("python3")
        .arg(repo.join("scripts/lib/release-oci.py"))
        .arg("pull-artifact")
        .arg(format!("{addr}/autonodes-cli:{VERSION}"))
        .arg("--plain-http")
        .arg("--out")
        .arg(cli.path())
        .output()
        .expect("release-oci.py pull-artifact runs");
    assert!(out.status.success(), "pulling the CLI: {}", text(&out));
    let tarball = format!("autonodes-{VERSION}-linux-amd64.tar.gz");
    let sums = Command::new("sha256sum")
        .args(["-c", "SHA256SUMS"])
        .current_dir(cli.path())
        .output()
        .expect("sha256sum runs");
    assert!(sums.status.success(), "SHA256SUMS: {}", text(&sums));
    assert!(
        cli.path()
            .join(format!("autonodes-{VERSION}.cdx.json"))
            .exists(),
        "the SBOM is in the CLI artifact"
    );
    let untar = Command::new("tar")
        .arg("-xzf")
        .arg(&tarball)
        .current_dir(cli.path())
        .output()
        .expect("tar runs");
    assert!(untar.status.success(), "tar: {}", text(&untar));
    let file = Command::new("file")
        .arg(cli.path().join("autonodes"))
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    if !file.is_empty() {
        assert!(
            file.contains("statically linked") || file.contains("static-pie"),
            "{file}"
        );
    }
    for name in ["autonodes", "kubectl-autonodes"] {
        let version = Command::new(cli.path().join(name))
            .arg("--version")
            .output()
            .expect("the pulled binary runs");
        assert!(
            version.status.success() && text(&version).contains(VERSION),
            "{name} --version: {}",
            text(&version)
        );
    }
    println!(
        "== CLI {addr}/autonodes-cli:{VERSION}: {tarball} (sha256sum -c: {}), runs as autonodes and kubectl-autonodes",
        String::from_utf8_lossy(&sums.stdout).trim()
    );

    // The CRD chart beside it, under the same version.
    let crd_chart = get_ok(
        addr,
        &format!("/v2/charts/autonodes-crd/manifests/{VERSION}"),
        OCI_MANIFEST,
    )
    .json();
    let crd_config = blob(addr, "charts/autonodes-crd", &crd_chart["config"]["digest"]).json();
    assert_eq!(crd_config["name"], "autonodes-crd");
    assert_eq!(crd_config["version"], VERSION);

    // The chart: Helm's media types, pulled back with Helm's library.
    let chart_manifest = get_ok(
        addr,
        &format!("/v2/charts/autonodes/manifests/{VERSION}"),
        OCI_MANIFEST,
    )
    .json();
    assert_eq!(
        chart_manifest["config"]["mediaType"],
        "application/vnd.cncf.helm.config.v1+json"
    );
    assert_eq!(
        chart_manifest["layers"][0]["mediaType"],
        "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
    );
    let chart_config = blob(
        addr,
        "charts/autonodes",
        &chart_manifest["config"]["digest"],
    )
    .json();
    assert_eq!(chart_config["name"], "autonodes");
    assert_eq!(chart_config["version"], VERSION);
    let pulled = tempfile::tempdir().expect("temp dir");
    let out = Command::new(helm_python())
        .arg(repo.join("scripts/lib/release-oci.py"))
        .arg("pull-chart")
        .arg(format!("oci://{addr}/charts/autonodes"))
        .args(["--version", VERSION, "--plain-http", "--out"])
        .arg(pulled.path())
        .output()
        .expect("release-oci.py pull-chart runs");
    assert!(out.status.success(), "pulling the chart: {}", text(&out));
    let chart_dir = pulled.path().join("autonodes");
    let pulled_chart: Value = autonodes_core::yaml::from_str(
        &std::fs::read_to_string(chart_dir.join("Chart.yaml")).expect("the pulled Chart.yaml"),
    )
    .expect("Chart.yaml");
    assert_eq!(pulled_chart["version"], VERSION);
    println!("== pulled oci://{addr}/charts/autonodes --version {VERSION}");

    // The pulled chart's default image is the one pushed beside it.
    let pulled_values: Value = autonodes_core::yaml::from_str(
        &std::fs::read_to_string(chart_dir.join("values.yaml")).expect("the pulled values.yaml"),
    )
    .expect("values.yaml");
    assert_eq!(
        pulled_values["image"]["repository"],
        format!("{addr}/autonodes"),
        "the published chart defaults to the published image"
    );

    // Installed from the pulled chart into a real API server with no image value: the
    // image from the registry.
    let values = json!({
        // A v1.20 API server serves PodDisruptionBudgets as policy/v1beta1 only.
        "podDisruptionBudget": {"apiVersion": "policy/v1beta1"},
    });
    let out = Command::new(helm_python())
        .arg(repo.join("scripts/helm-chart.py"))
        .arg("render")
        .arg(&chart_dir)
        .arg("--values")
        .arg(values.to_string())
        .args(["--namespace", "autonodes-system"])
        .output()
        .expect("helm-chart.py runs");
    assert!(
        out.status.success(),
        "rendering the pulled chart: {}",
        text(&out)
    );
    let rendered = String::from_utf8_lossy(&out.stdout).into_owned();
    let docs = documents(&rendered);
    let manifest_file = pulled.path().join("rendered.yaml");
    std::fs::write(&manifest_file, &rendered).expect("write");

    let env = common::start(&["mgmt"]).await;
    // kubectl finds the plugin on PATH: `kubectl autonodes …` is the same binary.
    let path = format!(
        "{}:{}",
        cli.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let plugin = Command::new(&env.bins.kubectl)
        .args(["autonodes", "--version"])
        .env("PATH", path)
        .output()
        .expect("kubectl runs");
    assert!(
        plugin.status.success() && text(&plugin).contains(VERSION),
        "kubectl autonodes --version: {}",
        text(&plugin)
    );
    println!("$ kubectl autonodes --version\n{}", text(&plugin).trim());
    let mgmt = env.apiserver("mgmt").expect("mgmt");
    kubectl_ok(&env, mgmt, &["create", "namespace", "autonodes-system"]);
    // As `helm install` does: the chart's crds/ first, created without client-side
    // validation (a 1.20 server drops their CEL rules; its server-side apply refuses them).
    let crds = chart_dir.join("crds");
    kubectl_ok(
        &env,
        mgmt,
        &["create", "--validate=false", "-f", path_str(&crds)],
    );
    common::wait_established(
        &env,
        mgmt,
        &["crd/nodeclaims.autonodes.io", "crd/nodepools.autonodes.io"],
    );
    let out = kubectl(&env, mgmt, &["apply", "-f", path_str(&manifest_file)]);
    let applied = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("== kubectl apply -f (the pulled chart, rendered)\n{applied}");
    assert!(out.status.success(), "kubectl apply: {}", text(&out));
    assert_eq!(
        applied.lines().count(),
        docs.len(),
        "every object is created"
    );

    let deployments: Value = serde_json::from_str(&kubectl_ok(
        &env,
        mgmt,
        &["-n", "autonodes-system", "get", "deployments", "-o", "json"],
    ))
    .expect("JSON");
    let items = deployments["items"].as_array().expect("items");
    assert_eq!(items.len(), 1, "one Deployment: {deployments}");
    let deployed = items[0]["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .expect("the container's image");
    assert_eq!(deployed, image, "the Deployment runs the pushed image");
    // ... which the registry serves under that reference.
    let (repository, tag) = deployed
        .strip_prefix(&format!("{addr}/"))
        .and_then(|r| r.rsplit_once(':'))
        .expect("REGISTRY/REPOSITORY:TAG");
    let served = get_ok(
        addr,
        &format!("/v2/{repository}/manifests/{tag}"),
        OCI_MANIFEST,
    );
    assert_eq!(
        served.headers.get("docker-content-digest"),
        Some(&image_digest)
    );
    println!(
        "== Deployment {} runs {deployed}",
        items[0]["metadata"]["name"]
    );
    drop(env);
    drop(registry);
}

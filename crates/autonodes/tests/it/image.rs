//! The container image: `scripts/image.sh --check --profile dev` builds it from the Dockerfile with
//! Debian's buildah (a static binary handed in as the `build` stage, `FROM scratch`) and
//! runs `autonodes --version` and `autonodes run --help` inside it with podman. Skipped,
//! with the reason, where buildah cannot build an image on the machine.

use crate::common;

use std::path::Path;
use std::process::{Command, Output};

use common::repo;

fn text(out: &Output) -> String {
    common::output_text(out)
}

/// Why buildah cannot build a `FROM scratch` image here, or `None` when it can.
fn builder_unusable(dir: &Path) -> Option<String> {
    for tool in ["buildah", "podman"] {
        if Command::new(tool).arg("--version").output().is_err() {
            return Some(format!(
                "{tool} is not installed (scripts/test-env.sh installs Debian's buildah, podman and runc)"
            ));
        }
    }
    common::buildah_cannot_build(dir, "localhost/autonodes-probe")
}

fn inspect(name: &str, format: &str) -> String {
    let out = Command::new("buildah")
        .args(["inspect", "--type", "image", "--format", format, name])
        .output()
        .expect("buildah inspect runs");
    assert!(out.status.success(), "buildah inspect: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `scripts/image.sh --print-name`.
fn script_image_name() -> String {
    let out = Command::new("bash")
        .arg(repo().join("scripts/image.sh"))
        .arg("--print-name")
        .output()
        .expect("image.sh runs");
    assert!(
        out.status.success(),
        "image.sh --print-name: {}",
        text(&out)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn the_chart_refuses_the_local_name_scripts_image_sh_builds_unless_asked_and_then_runs_that_image()
{
    let built = script_image_name();
    let (repository, tag) = built.rsplit_once(':').expect("name:tag");
    assert_eq!(
        tag,
        env!("CARGO_PKG_VERSION"),
        "image.sh tags the crate's version"
    );
    assert!(repository.starts_with("localhost/"), "{built}");
    // The chart's default is a placeholder to replace, not the local name.
    let default =
        crate::opscommon::documents(&crate::opscommon::render_chart(&serde_json::json!({})));
    let image = default
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .map(|d| d["spec"]["template"]["spec"]["containers"][0]["image"].clone())
        .expect("a Deployment");
    assert_eq!(
        image,
        format!(
            "registry.example.com/autonodes:{}",
            env!("CARGO_PKG_VERSION")
        )
    );
    // The local name is refused with a message that says what to do ...
    let refused = crate::opscommon::helm_chart(
        "render",
        &serde_json::json!({"image": {"repository": repository}}),
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("image.allowLocalhost=true"),
        "{stderr}"
    );
    // ... and taken when asked: the chart's tag (its appVersion) is what image.sh builds.
    let allowed = crate::opscommon::documents(&crate::opscommon::render_chart(&serde_json::json!(
        {"image": {"repository": repository, "allowLocalhost": true}}
    )));
    let image = allowed
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .map(|d| d["spec"]["template"]["spec"]["containers"][0]["image"].clone())
        .expect("a Deployment");
    assert_eq!(image, built);
}

#[test]
fn the_image_builds_from_scratch_runs_as_non_root_and_answers_version_and_help_inside() {
    let probe = tempfile::tempdir().expect("temp dir");
    if let Some(why) = builder_unusable(probe.path()) {
        eprintln!("SKIPPED: {why}");
        return;
    }
    let repo = repo();
    let script = repo.join("scripts/image.sh");
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        script_image_name(),
        format!("localhost/autonodes:{version}")
    );
    // The binary in the dev profile (the release build is the same script and Dockerfile
    // and takes twice as long), so under another name than the chart's default image.
    let name = format!("localhost/autonodes-check:{version}");

    // The static binary the test command built beside the tests, or a build of its own.
    let out = common::static_binary_for_image_sh(
        Command::new("bash")
            .arg(&script)
            .args(["--check", "--profile", "dev"])
            .env("AUTONODES_IMAGE", "localhost/autonodes-check")
            .current_dir(&repo),
    )
    .output()
    .expect("image.sh runs");
    let shown = text(&out);
    println!("{shown}");
    assert!(
        out.status.success(),
        "scripts/image.sh --check failed:\n{shown}"
    );
    assert!(
        shown.contains(&format!("autonodes {version}")),
        "`autonodes --version` inside the image:\n{shown}"
    );
    assert!(
        shown.contains("--metrics-addr") && shown.contains("Usage: autonodes run"),
        "`autonodes run --help` inside the image:\n{shown}"
    );

    // FROM scratch: one layer holding the binary; non-root; labelled with the version.
    assert_eq!(inspect(&name, "{{len .OCIv1.RootFS.DiffIDs}}"), "1");
    assert_eq!(inspect(&name, "{{.OCIv1.Config.User}}"), "65532:65532");
    assert_eq!(
        inspect(&name, "{{.OCIv1.Config.Entrypoint}} {{.OCIv1.Config.Cmd}}"),
        "[/autonodes] [run]"
    );
    assert_eq!(
        inspect(
            &name,
            "{{index .OCIv1.Config.Labels \"org.opencontainers.image.version\"}}"
        ),
        version
    );
    assert_eq!(
        inspect(
            &name,
            "{{index .OCIv1.Config.Labels \"org.opencontainers.image.title\"}}"
        ),
        "autonodes"
    );
    // No shell: the image holds nothing but the binary.
    let shell = Command::new("podman")
        .args([
            "run",
            "--rm",
            "--network=none",
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=1024:1024",
            "--entrypoint",
            "/bin/sh",
            &name,
            "-c",
            "true",
        ])
        .output()
        .expect("podman runs");
    assert!(
        !shell.status.success(),
        "the image has a shell:\n{}",
        text(&shell)
    );
}

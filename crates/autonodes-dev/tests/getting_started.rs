//! The book's getting-started page, run as a user would: `autonodes-dev dev` in a fresh
//! directory, then every `sh` block of `docs/src/getting-started.md` in order in one shell,
//! with the playground's metrics port replaced by a free one. The page's flag list is
//! checked against `autonodes-dev dev --help`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use autonodes_testenv::testenv::{free_port, record_pid, Binaries};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn page() -> String {
    std::fs::read_to_string(root().join("docs/src/getting-started.md")).unwrap()
}

/// The `sh` code blocks of a Markdown page, in order.
fn shell_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match (&mut current, line.trim_end()) {
            (None, "```sh") => current = Some(String::new()),
            (Some(_), "```") => blocks.extend(current.take()),
            (Some(b), l) => {
                b.push_str(l);
                b.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

#[test]
fn every_flag_of_the_playground_is_on_the_getting_started_page() {
    let out = Command::new(env!("CARGO_BIN_EXE_autonodes-dev"))
        .args(["dev", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    let flags: Vec<&str> = help
        .split_whitespace()
        .filter(|w| w.starts_with("--") && *w != "--help")
        .collect();
    assert!(flags.len() >= 8, "too few flags in:\n{help}");
    let page = page();
    let missing: Vec<&&str> = flags
        .iter()
        .filter(|f| !page.contains(&format!("`{f}")))
        .collect();
    assert!(
        missing.is_empty(),
        "flags of `autonodes-dev dev` the page does not mention: {missing:?}"
    );
}

#[test]
fn the_getting_started_commands_run_against_the_playground() {
    let bins = match Binaries::locate() {
        Ok(b) => b,
        Err(e) => {
            panic!("the test environment's binaries are missing ({e}); run scripts/test-env.sh")
        }
    };
    let bin_dir = bins.kubectl.parent().unwrap().to_path_buf();
    let blocks = shell_blocks(&page());
    assert_eq!(
        blocks.first().map(|b| b.trim()),
        Some("cargo run -- dev"),
        "the page starts the playground first"
    );
    let port = free_port().unwrap();
    let metrics = format!("127.0.0.1:{port}");
    let script = blocks[1..].join("").replace("127.0.0.1:8080", &metrics);
    assert!(script.contains("kubectl apply -f examples/nodeclaim.yaml"));

    let work = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(root().join("examples"), work.path().join("examples")).unwrap();
    let mut playground = Command::new(env!("CARGO_BIN_EXE_autonodes-dev"))
        .args(["dev", "--metrics-addr", &metrics])
        .current_dir(work.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    record_pid(playground.id(), "autonodes-dev dev");
    let (tx, rx) = mpsc::channel();
    let stdout = playground.stdout.take().unwrap();
    let stderr = playground.stderr.take().unwrap();
    let tx2 = tx.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx2.send(line);
        }
    });
    let mut log = Vec::new();
    let up = loop {
        match rx.recv_timeout(Duration::from_secs(300)) {
            Ok(line) => {
                let done = line.contains("autonodes playground is up");
                log.push(line);
                if done {
                    break true;
                }
            }
            Err(_) => break false,
        }
    };
    let result = if up {
        let path = format!(
            "{}:{}",
            bin_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        Some(
            Command::new("bash")
                .args(["-euo", "pipefail", "-x", "-c", &script])
                .current_dir(work.path())
                .env("PATH", path)
                // kubectl's discovery cache lives under $HOME, keyed by host and port; one
                // left by an earlier server on the playground's port hides its short names.
                .env("HOME", work.path())
                .env_remove("KUBECONFIG")
                .output()
                .unwrap(),
        )
    } else {
        None
    };
    // Ctrl-C, as the page says: the playground stops everything and removes .dev/.
    let _ = Command::new("kill")
        .args(["-INT", &playground.id().to_string()])
        .status();
    let mut stopped = false;
    for _ in 0..60 {
        if playground.try_wait().unwrap().is_some() {
            stopped = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    if !stopped {
        let _ = playground.kill();
        let _ = playground.wait();
    }
    log.extend(rx.try_iter());
    let log = log.join("\n");
    assert!(up, "the playground did not come up:\n{log}");
    let out = result.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stderr}\n{stdout}");
    assert!(
        out.status.success(),
        "the page's commands failed:\n{stderr}\n{stdout}\nplayground:\n{log}"
    );
    assert!(stopped, "the playground did not stop on Ctrl-C:\n{log}");
    assert!(
        !work.path().join(".dev").exists(),
        "Ctrl-C left .dev/ behind"
    );
    // What the page says the commands show.
    for expected in [
        "nodeclaim.autonodes.io/high-memory-1 condition met",
        "nodepool.autonodes.io/standard condition met",
        "nodetype.autonodes.io/kubevirt-provider-advanced.standard-node condition met",
        "nodeclaim.autonodes.io/standard-1 condition met",
        // The claim's VM is the warm VM it took, and its binding was written.
        "warm-standard-node-",
        "\"written\":true",
        // The claim's VM, counted by namespace, pool (none) and node type.
        "autonodes_nodeclaims_created_total{namespace=\"tenant\",nodepool=\"\",nodetype=\"kubevirt-provider-advanced.",
        "No resources found",
    ] {
        assert!(
            stdout.contains(expected) || stderr.contains(expected),
            "{expected:?} not in the output:\n{stdout}\n{stderr}"
        );
    }
}

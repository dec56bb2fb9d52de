//! Helpers of the operations tests (metrics, HA, chart): HTTP scrapes, the Helm SDK,
//! controller processes that never outlive a test.
#![allow(dead_code)]

pub mod at_scale;
pub mod measure;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// GETs `path` from `addr` over plain HTTP/1.0: (status code, body).
pub async fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let path = path.to_string();
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw)?;
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let code = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        Ok((code, body.to_string()))
    })
    .await
    .map_err(std::io::Error::other)?
}

/// The value of the first sample line of `scrape` that starts with `series` (name plus
/// labels exactly as Prometheus prints them).
pub fn sample(scrape: &str, series: &str) -> Option<f64> {
    scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            (name == series).then(|| value.parse().ok())?
        })
}

/// The python of the Helm SDK venv (installed by `scripts/helm-env.sh` once per run).
pub fn helm_python() -> &'static Path {
    static PY: OnceLock<PathBuf> = OnceLock::new();
    PY.get_or_init(|| {
        if let Ok(p) = std::env::var("AUTONODES_HELM_PYTHON") {
            return PathBuf::from(p);
        }
        let out = Command::new("bash")
            .arg(super::common::repo().join("scripts/helm-env.sh"))
            .stderr(Stdio::inherit())
            .output()
            .expect("running scripts/helm-env.sh");
        assert!(out.status.success(), "scripts/helm-env.sh failed");
        let stdout = String::from_utf8_lossy(&out.stdout);
        PathBuf::from(
            stdout
                .lines()
                .last()
                .expect("helm-env prints the python")
                .trim(),
        )
    })
}

/// Runs `scripts/helm-chart.py <command> charts/autonodes` with `values` (JSON).
pub fn helm_chart(command: &str, values: &serde_json::Value) -> std::process::Output {
    let repo = super::common::repo();
    Command::new(helm_python())
        .arg(repo.join("scripts/helm-chart.py"))
        .arg(command)
        .arg(repo.join("charts/autonodes"))
        .arg("--values")
        .arg(values.to_string())
        .arg("--namespace")
        .arg("autonodes-system")
        .output()
        .expect("running helm-chart.py")
}

/// The chart rendered with `values`, as a YAML stream; fails the test on a render error.
pub fn render_chart(values: &serde_json::Value) -> String {
    let out = helm_chart("render", values);
    assert!(
        out.status.success(),
        "helm render failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The documents of a YAML stream.
pub fn documents(yaml: &str) -> Vec<serde_json::Value> {
    autonodes_core::yaml::from_multiple::<serde_json::Value>(yaml)
        .expect("rendered YAML parses")
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

/// A child process killed (SIGKILL) and reaped when dropped, so no test leaves one behind.
pub struct Proc {
    /// The process.
    pub child: Child,
    /// Its combined log.
    pub log: PathBuf,
    /// A name for messages.
    pub name: String,
}

impl Proc {
    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal with `kill(1)`.
    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{sig} {} failed", self.pid());
    }

    /// Waits up to `timeout` for the process to exit; its exit code (None: killed by a
    /// signal, or still running at the timeout).
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<Option<i32>> {
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status.code());
            }
            if start.elapsed() > timeout {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The address the metrics server bound, read from the JSON log line that reports it.
    pub async fn metrics_addr(&self) -> SocketAddr {
        let start = Instant::now();
        loop {
            for line in self.log_text().lines() {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(line) {
                    if v["fields"]["message"] == "serving /metrics, /healthz, /readyz" {
                        if let Some(addr) = v["fields"]["addr"].as_str() {
                            return addr.parse().expect("socket address");
                        }
                    }
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{} never reported its metrics address; log:\n{}",
                self.name,
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `autonodes run` (the real binary) with `args`, logging JSON to a file in `dir`.
pub fn spawn_controller(dir: &Path, name: &str, args: &[&str]) -> Proc {
    let log = dir.join(format!("{name}.log"));
    let file = std::fs::File::create(&log).expect("log file");
    let child = Command::new(env!("CARGO_BIN_EXE_autonodes"))
        .arg("run")
        .args(args)
        .args([
            "--tenant-allow-cidrs=127.0.0.1",
            "--host-allow-cidrs=127.0.0.1",
        ])
        .env("POD_NAME", name)
        .env("RUST_LOG", "info,kube_client::client::builder=off")
        .stdin(Stdio::null())
        .stdout(file.try_clone().expect("log file"))
        .stderr(file)
        .spawn()
        .expect("autonodes run starts");
    autonodes_testenv::testenv::record_pid(child.id(), "autonodes run");
    Proc {
        child,
        log,
        name: name.into(),
    }
}

//! Measuring a run on real API servers: requests counted by the API servers
//! (`apiserver_request_total`) and by the controller (`autonodes_kube_requests_total`), per
//! claim, and the controller as a process of its own whose CPU and memory can be read.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use autonodes_testenv::testenv::ManagedProcess;

use super::http_get;
use crate::common::world::World;

/// The runtime a benchmark runs on (two workers, as the machine has two cores), or `None`
/// when the binary was not started by `cargo bench` (then it says it was skipped).
pub fn bench_runtime(name: &str) -> Option<tokio::runtime::Runtime> {
    if !std::env::args().any(|a| a == "--bench") {
        println!("{name} bench skipped (run it with `cargo bench --bench {name}`)");
        return None;
    }
    Some(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime"),
    )
}

/// The sizes a benchmark runs at: environment variable `var` as comma-separated numbers,
/// else `default`.
pub fn bench_sizes(var: &str, default: &[usize]) -> Vec<usize> {
    std::env::var(var)
        .ok()
        .map(|v| {
            v.split(',')
                .filter_map(|s| s.trim().parse().ok())
                .collect::<Vec<usize>>()
        })
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_vec())
}

/// Bytes in MiB.
pub fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1024.0 / 1024.0
}

/// Parses `name{a="x",b="y"} value` lines of a Prometheus text exposition.
pub fn samples(text: &str, name: &str) -> Vec<(BTreeMap<String, String>, f64)> {
    let prefix = format!("{name}{{");
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(&prefix)?;
            let (labels, value) = rest.rsplit_once("} ")?;
            let value: f64 = value.trim().parse().ok()?;
            let mut map = BTreeMap::new();
            for pair in labels.split("\",") {
                let (k, v) = pair.split_once("=\"")?;
                map.insert(k.to_string(), v.trim_end_matches('"').to_string());
            }
            Some((map, value))
        })
        .collect()
}

/// The sum of an API server's metric samples (a gauge's) whose labels satisfy `keep`.
pub async fn server_gauge(
    client: &kube::Client,
    name: &str,
    keep: impl Fn(&BTreeMap<String, String>) -> bool,
) -> f64 {
    let req = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("request");
    let text = client.request_text(req).await.unwrap_or_default();
    samples(&text, name)
        .into_iter()
        .filter(|(labels, _)| keep(labels))
        .map(|(_, v)| v)
        .sum()
}

/// Established TCP connections of process `pid` to `port` (its socket file descriptors
/// matched with the kernel's TCP tables).
pub fn connections_to(pid: u32, port: u16) -> usize {
    let inodes: std::collections::HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            l.strip_prefix("socket:[")
                .and_then(|s| s.strip_suffix(']'))
                .map(str::to_string)
        })
        .collect();
    let mut n = 0;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let (Some(remote), Some(state), Some(inode)) = (cols.get(2), cols.get(3), cols.get(9))
            else {
                continue;
            };
            let remote_port = remote
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            // State 01: ESTABLISHED.
            if *state == "01" && remote_port == Some(port) && inodes.contains(*inode) {
                n += 1;
            }
        }
    }
    n
}

/// Request counts keyed by (cluster, VERB, resource[/subresource], code).
pub type Requests = BTreeMap<(String, String, String, String), f64>;

/// The API servers' `apiserver_request_total`, by cluster.
pub async fn server_requests(world: &World) -> Requests {
    let mut out = Requests::new();
    for (cluster, client) in [
        ("management", &world.mgmt),
        ("host", &world.host),
        ("tenant", &world.tenant),
    ] {
        let req = http::Request::get("/metrics")
            .body(Vec::new())
            .expect("request");
        let text = client.request_text(req).await.unwrap_or_default();
        for (labels, value) in samples(&text, "apiserver_request_total") {
            let get = |k: &str| labels.get(k).cloned().unwrap_or_default();
            let resource = match get("subresource").as_str() {
                "" => get("resource"),
                sub => format!("{}/{sub}", get("resource")),
            };
            *out.entry((cluster.into(), get("verb"), resource, get("code")))
                .or_default() += value;
        }
    }
    out
}

/// The controller's `autonodes_kube_requests_total` (verbs upper-cased like the servers').
pub async fn controller_requests(addr: SocketAddr) -> Requests {
    let text = match http_get(addr, "/metrics").await {
        Ok((200, body)) => body,
        _ => String::new(),
    };
    let mut out = Requests::new();
    for (labels, value) in samples(&text, "autonodes_kube_requests_total") {
        let get = |k: &str| labels.get(k).cloned().unwrap_or_default();
        *out.entry((
            get("cluster"),
            get("verb").to_uppercase(),
            get("resource"),
            get("code"),
        ))
        .or_default() += value;
    }
    out
}

/// The requests in `after` that were not yet in `before`.
pub fn diff(after: &Requests, before: &Requests) -> Requests {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

/// Whether `verb` (as the API servers count it) writes.
pub fn is_write(verb: &str) -> bool {
    matches!(
        verb,
        "POST" | "PUT" | "PATCH" | "APPLY" | "DELETE" | "DELETECOLLECTION" | "CREATE" | "UPDATE"
    )
}

/// Whether `verb` reads (GET or LIST).
pub fn is_read(verb: &str) -> bool {
    matches!(verb, "GET" | "LIST")
}

/// Per-claim totals of a request diff.
pub struct Totals {
    /// Writes (creates, updates, patches, deletes).
    pub writes: f64,
    /// Reads (GET and LIST).
    pub reads: f64,
    /// LISTs.
    pub lists: f64,
    /// WATCHes opened.
    pub watches: f64,
    /// Writes of Events.
    pub events: f64,
    /// Answers 409 (Conflict).
    pub conflicts: f64,
}

impl Totals {
    /// The totals of `r`, divided by `per` (the number of claims).
    pub fn per_claim(r: &Requests, per: f64) -> Totals {
        let mut t = Totals {
            writes: 0.0,
            reads: 0.0,
            lists: 0.0,
            watches: 0.0,
            events: 0.0,
            conflicts: 0.0,
        };
        for ((_, verb, resource, code), n) in r {
            let n = n / per;
            if is_write(verb) {
                t.writes += n;
                if resource == "events" {
                    t.events += n;
                }
            }
            if is_read(verb) {
                t.reads += n;
            }
            if verb == "LIST" {
                t.lists += n;
            }
            if verb == "WATCH" {
                t.watches += n;
            }
            if code == "409" {
                t.conflicts += n;
            }
        }
        t
    }

    /// "w writes (e Events), r reads (l LISTs), w watches, c conflicts (409)".
    pub fn line(&self) -> String {
        format!(
            "{:.1} writes ({:.1} Events), {:.1} reads ({:.1} LISTs), {:.2} watches, {:.2} conflicts (409)",
            self.writes, self.events, self.reads, self.lists, self.watches, self.conflicts
        )
    }
}

/// "verb resource n/claim" for the largest entries of a diff.
pub fn breakdown(r: &Requests, per: f64) -> String {
    let mut by: BTreeMap<(String, String, String), f64> = BTreeMap::new();
    for ((cluster, verb, resource, _), n) in r {
        *by.entry((cluster.clone(), verb.clone(), resource.clone()))
            .or_default() += n;
    }
    let mut rows: Vec<_> = by.into_iter().collect();
    rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    rows.iter()
        .filter(|(_, n)| n / per >= 0.05)
        .map(|((cluster, verb, resource), n)| {
            format!(
                "      {:<10} {:<16} {:<28} {:>7.2}",
                cluster,
                verb,
                resource,
                n / per
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `autonodes run` as its own process with its metrics on a known address, so its CPU, memory
/// and requests can be read.
pub struct MeteredController {
    /// The process.
    pub process: ManagedProcess,
    /// Its metrics address.
    pub addr: SocketAddr,
}

impl MeteredController {
    /// Starts controller process `n` and waits until it is ready.
    pub async fn start(world: &World, n: u32) -> MeteredController {
        MeteredController::start_with(world, n, &[]).await
    }

    /// [`MeteredController::start`] with more flags.
    pub async fn start_with(world: &World, n: u32, flags: &[&str]) -> MeteredController {
        let port = autonodes_testenv::testenv::free_port().expect("free port");
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let process = world.spawn_controller_process_with(
            n,
            env!("CARGO_BIN_EXE_autonodes"),
            &addr.to_string(),
            flags,
        );
        crate::common::eventually(
            "the controller ready",
            Duration::from_secs(120),
            || async move { matches!(http_get(addr, "/readyz").await, Ok((200, _))).then_some(()) },
        )
        .await;
        MeteredController { process, addr }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.process.pid().expect("controller running")
    }

    /// Its `autonodes_kube_requests_total`.
    pub async fn requests(&self) -> Requests {
        controller_requests(self.addr).await
    }
}

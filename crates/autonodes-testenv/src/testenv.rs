//! Real Kubernetes control planes on loopback: one `etcd` and any number of named
//! `kube-apiserver` processes sharing it (each under its own `--etcd-prefix`).
//!
//! Used by the integration tests and by `autonodes-dev dev`. Every process is started with
//! its output in a log file under the environment's directory and is killed when the
//! [`TestEnv`] (or the [`ApiServer`]) is dropped — also while a panicking test unwinds.
//! Where `setpriv` is available the processes also get `PDEATHSIG=KILL`, so they die with
//! the thread that started them even if the test process is killed outright.
//!
//! The binaries come from `scripts/test-env.sh`: `etcd` from Debian's `etcd-server`, and
//! `kube-apiserver`, `kube-scheduler`, `kubectl` v1.20.2 built from Debian's source package
//! into `$AUTONODES_K8S_BIN` (default [`DEFAULT_K8S_BIN`]).

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use base64::Engine;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

mod certs;
mod crd_seed;
mod error;
use certs::{
    generate_client_ca, generate_signing_key, last_certificate, sign_client_certificate,
    sign_serving_certificate, ClientCa,
};
pub(crate) use error::io_err;
pub use error::TestEnvError;

/// Where `scripts/test-env.sh` puts the Kubernetes binaries unless `AUTONODES_K8S_BIN` says otherwise.
pub const DEFAULT_K8S_BIN: &str = "/var/cache/autonodes/k8s-1.20.2/bin";

/// A Kubernetes binary next to the environment's kube-apiserver (built by
/// `scripts/test-env.sh`).
pub fn k8s_binary(env: &TestEnv, name: &str) -> Result<PathBuf, TestEnvError> {
    let path = env
        .bins
        .kube_apiserver
        .parent()
        .map(|dir| dir.join(name))
        .unwrap_or_else(|| PathBuf::from(name));
    if path.is_file() {
        Ok(path)
    } else {
        Err(TestEnvError::MissingBinary {
            name: name.to_string(),
            path,
        })
    }
}

/// How long a process may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// Paths of the binaries the environment runs.
#[derive(Clone, Debug)]
pub struct Binaries {
    /// `etcd`.
    pub etcd: PathBuf,
    /// `kube-apiserver`.
    pub kube_apiserver: PathBuf,
    /// `kube-scheduler`.
    pub kube_scheduler: PathBuf,
    /// `kubectl`.
    pub kubectl: PathBuf,
}

impl Binaries {
    /// Finds the binaries: `$AUTONODES_K8S_BIN` (else [`DEFAULT_K8S_BIN`]) for the Kubernetes
    /// ones, `$AUTONODES_ETCD` (else `/usr/bin/etcd`) for etcd.
    pub fn locate() -> Result<Self, TestEnvError> {
        let bin = std::env::var_os("AUTONODES_K8S_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_K8S_BIN));
        let etcd = std::env::var_os("AUTONODES_ETCD")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/usr/bin/etcd"));
        let found = Binaries {
            etcd,
            kube_apiserver: bin.join("kube-apiserver"),
            kube_scheduler: bin.join("kube-scheduler"),
            kubectl: bin.join("kubectl"),
        };
        for path in [
            &found.etcd,
            &found.kube_apiserver,
            &found.kube_scheduler,
            &found.kubectl,
        ] {
            if !path.is_file() {
                return Err(TestEnvError::MissingBinary {
                    name: path
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                    path: path.clone(),
                });
            }
        }
        Ok(found)
    }
}

/// The minor release (1.x) a Kubernetes binary reports with `--version`, asked once per
/// binary and process (a Go binary's start costs CPU); `None` when it does not read.
pub fn binary_minor(binary: &Path) -> Option<u32> {
    static MINORS: OnceLock<Mutex<HashMap<PathBuf, Option<u32>>>> = OnceLock::new();
    let minors = MINORS.get_or_init(Mutex::default);
    if let Some(minor) = minors.lock().ok().and_then(|m| m.get(binary).copied()) {
        return minor;
    }
    let minor = Command::new(binary)
        .arg("--version")
        .output()
        .ok()
        .and_then(|out| {
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .find_map(|w| w.strip_prefix("v1.").map(str::to_string))
        })
        .and_then(|rest| rest.split('.').next().and_then(|m| m.parse().ok()));
    if let Ok(mut m) = minors.lock() {
        m.insert(binary.to_path_buf(), minor);
    }
    minor
}

/// `--port=0` (no insecure port) for a kube-scheduler or kube-controller-manager that
/// still has the flag: releases before 1.24, and one whose `--version` does not read (the
/// 1.20 the scripts install has it); 1.24 and later removed the insecure port and refuse
/// the flag.
pub fn insecure_port_off(binary: &Path) -> Option<String> {
    match binary_minor(binary) {
        Some(m) if m >= 24 => None,
        _ => Some("--port=0".to_string()),
    }
}

/// The flags that make a test API server of release 1.`minor` lean: no beta or alpha API
/// versions (as servers from 1.24 on serve new ones), but PodDisruptionBudgets'
/// `policy/v1beta1` on releases that still have it (1.20 serves them only there); no API
/// Priority and Fairness. Measured on 1.20: a start takes 40 % less CPU and an idle server
/// half as much. `None` (a version that does not read) counts as the 1.20 the scripts
/// install.
pub fn lean_flags(minor: Option<u32>) -> Vec<String> {
    let mut runtime = "api/beta=false,api/alpha=false".to_string();
    if minor.is_none_or(|m| m < 25) {
        runtime.push_str(",policy/v1beta1=true");
    }
    vec![
        format!("--runtime-config={runtime}"),
        "--enable-priority-and-fairness=false".to_string(),
    ]
}

/// One child process, killed and reaped when dropped.
#[derive(Debug)]
pub struct ManagedProcess {
    name: String,
    child: Option<Child>,
    log: PathBuf,
}

/// The environment variable naming a directory where every started process is recorded
/// (`<pid>` holding `<start time> <name>`), so `scripts/test.sh` can tell whether a process
/// *the tests started* outlived them, without looking at anybody else's processes.
pub const PIDS_DIR_ENV: &str = "AUTONODES_TEST_PIDS";

/// Records a process the tests started in [`PIDS_DIR_ENV`], when set (best effort).
pub fn record_pid(pid: u32, name: &str) {
    // Unset or empty: nothing is recorded (an empty value must not mean the current
    // directory).
    let Some(dir) = std::env::var_os(PIDS_DIR_ENV).filter(|d| !d.is_empty()) else {
        return;
    };
    // Field 22 of /proc/<pid>/stat: the start time, which tells a reused pid apart.
    let start = fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(19).map(str::to_string))
        });
    if let Some(start) = start {
        let _ = fs::write(
            Path::new(&dir).join(pid.to_string()),
            format!("{start} {name}\n"),
        );
    }
}

/// The `GOGC` the Go processes the tests start run with, unless the environment sets one.
const TEST_GOGC: &str = "400";

impl ManagedProcess {
    /// Starts `program args…` with stdout and stderr appended to `log`.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        log: &Path,
    ) -> Result<Self, TestEnvError> {
        let out = fs::File::create(log).map_err(io_err(format!("creating {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(io_err(format!("opening {}", log.display())))?;
        let setpriv = Path::new("/usr/bin/setpriv");
        let mut cmd = if setpriv.is_file() {
            let mut c = Command::new(setpriv);
            c.arg("--pdeathsig").arg("KILL").arg("--").arg(program);
            c
        } else {
            Command::new(program)
        };
        // Go's collector runs less often (etcd, kube-apiserver and the other components):
        // the test clusters are small and short-lived, and their start is most of the
        // tests' CPU; about 15% less of it for more memory per process. `GOGC` in the
        // environment wins.
        if std::env::var_os("GOGC").is_none() {
            cmd.env("GOGC", TEST_GOGC);
        }
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err));
        let child = cmd
            .spawn()
            .map_err(io_err(format!("starting {name} ({})", program.display())))?;
        record_pid(child.id(), name);
        Ok(ManagedProcess {
            name: name.to_string(),
            child: Some(child),
            log: log.to_path_buf(),
        })
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The log file of the process.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The last `lines` lines of the process's log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Fails if the process has exited.
    pub fn check_running(&mut self) -> Result<(), TestEnvError> {
        if let Some(child) = self.child.as_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(TestEnvError::Exited {
                    name: self.name.clone(),
                    status: status.to_string(),
                    log_tail: self.log_tail(30),
                });
            }
        }
        Ok(())
    }

    /// Kills the process (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// How often a process is started again on other ports when the ones chosen were taken
/// meanwhile (another test environment on the machine bound them between
/// [`free_port`] and the process's own bind).
const PORT_ATTEMPTS: usize = 5;

/// A free TCP port on 127.0.0.1 (bound once and released).
pub fn free_port() -> Result<u16, TestEnvError> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(io_err("binding a free port"))?;
    let port = listener
        .local_addr()
        .map_err(io_err("reading a bound port"))?
        .port();
    Ok(port)
}

/// One running kube-apiserver with an admin kubeconfig.
#[derive(Debug)]
pub struct ApiServer {
    /// Its name in the environment (also the kubeconfig's cluster and context name).
    pub name: String,
    /// `https://<bind address>:<port>` (`127.0.0.1` unless started on another address).
    pub url: String,
    /// The secure port.
    pub port: u16,
    /// Path of the admin kubeconfig.
    pub kubeconfig_path: PathBuf,
    /// PEM of the cluster CA (the certificate that signed the serving certificate).
    pub ca_pem: Vec<u8>,
    /// The bearer token of the `admin` user (group `system:masters`).
    pub admin_token: String,
    /// Directory with its certificates, keys and log.
    pub dir: PathBuf,
    /// Path of the `--token-auth-file`.
    pub token_file: PathBuf,
    /// PEM of a client certificate of user `admin` in group `system:masters`, signed by the
    /// server's `--client-ca-file` (as in the kubeconfig a vCluster exports).
    pub admin_client_cert_pem: Vec<u8>,
    /// PEM of the private key of [`ApiServer::admin_client_cert_pem`].
    pub admin_client_key_pem: Vec<u8>,
    process: ManagedProcess,
    program: PathBuf,
    args: Vec<String>,
    starts: u32,
}

impl ApiServer {
    /// The admin kubeconfig.
    pub fn kubeconfig(&self) -> Result<Kubeconfig, TestEnvError> {
        Kubeconfig::read_from(&self.kubeconfig_path).map_err(|e| TestEnvError::Kubeconfig {
            name: self.name.clone(),
            message: e.to_string(),
        })
    }

    /// A client certificate and key (PEM) for `user` in `groups`, signed by this server's
    /// client CA: an identity with only the permissions RBAC gives it.
    pub fn client_certificate(
        &self,
        user: &str,
        groups: &[&str],
    ) -> Result<(Vec<u8>, Vec<u8>), TestEnvError> {
        sign_client_certificate(&self.dir.join("certs"), user, groups)
    }

    /// The admin kubeconfig as YAML text.
    pub fn kubeconfig_yaml(&self) -> Result<String, TestEnvError> {
        fs::read_to_string(&self.kubeconfig_path).map_err(io_err(format!(
            "reading {}",
            self.kubeconfig_path.display()
        )))
    }

    /// A client with admin rights.
    pub async fn client(&self) -> Result<Client, TestEnvError> {
        client_from_kubeconfig(&self.name, self.kubeconfig()?).await
    }

    /// A `kubectl` command pointed at this API server (binary from [`Binaries`]), with a
    /// discovery cache of its own: the shared `~/.kube/cache` is keyed by host and port, and
    /// an earlier server on the same port would leave kubectl blind to this one's short
    /// names (`npool`) until the cache expires.
    pub fn kubectl(&self, bins: &Binaries) -> Command {
        let mut cmd = Command::new(&bins.kubectl);
        cmd.arg("--kubeconfig").arg(&self.kubeconfig_path);
        cmd.arg("--cache-dir").arg(self.dir.join("kubectl-cache"));
        cmd
    }

    /// The process id of the API server.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// The API server's log file.
    pub fn log_path(&self) -> &Path {
        self.process.log_path()
    }

    /// Stops the API server (the cluster becomes unreachable; etcd keeps its data).
    pub fn stop(&mut self) {
        self.process.kill();
    }

    /// Starts the API server again after [`ApiServer::stop`]: same port, certificates and
    /// data (etcd kept them), a new log file; returns once it is ready.
    pub async fn restart(&mut self) -> Result<(), TestEnvError> {
        self.process.kill();
        self.starts += 1;
        let log = self.dir.join(format!("kube-apiserver-{}.log", self.starts));
        self.process = ManagedProcess::spawn(
            &format!("kube-apiserver {}", self.name),
            &self.program,
            &self.args,
            &log,
        )?;
        let client = self.client().await?;
        wait_ready(&self.name, &client, &mut self.process, Instant::now()).await
    }

    /// Resident and peak resident memory of the API server process, in bytes (Linux).
    pub fn memory(&self) -> Option<(u64, u64)> {
        process_memory(self.pid()?)
    }
}

/// Resident and peak resident memory (`VmRSS`, `VmHWM`) of process `pid`, in bytes (Linux).
pub fn process_memory(pid: u32) -> Option<(u64, u64)> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// CPU seconds (user + system) process `pid` used so far, from `/proc/<pid>/stat` (None when
/// it cannot be read).
pub fn process_cpu_seconds(pid: u32) -> Option<f64> {
    /// Clock ticks per second of `/proc/<pid>/stat` (USER_HZ, 100 on Linux).
    const TICKS: f64 = 100.0;
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the command: state is field 3; utime and stime are fields 14 and 15.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / TICKS)
}

/// Waits until the API server answers `/readyz` with `ok`.
async fn wait_ready(
    name: &str,
    client: &Client,
    process: &mut ManagedProcess,
    started: Instant,
) -> Result<(), TestEnvError> {
    loop {
        process.check_running()?;
        let ready = client
            .request_text(
                http_get("/readyz").map_err(|message| TestEnvError::Kubeconfig {
                    name: name.to_string(),
                    message,
                })?,
            )
            .await;
        if matches!(ready.as_deref(), Ok("ok")) {
            return Ok(());
        }
        if started.elapsed() > READY_TIMEOUT {
            return Err(TestEnvError::Timeout {
                name: format!("kube-apiserver {name}"),
                secs: READY_TIMEOUT.as_secs(),
                log_tail: process.log_tail(30),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Builds a client from a kubeconfig.
pub async fn client_from_kubeconfig(name: &str, kc: Kubeconfig) -> Result<Client, TestEnvError> {
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| TestEnvError::Kubeconfig {
            name: name.to_string(),
            message: e.to_string(),
        })?;
    Client::try_from(config).map_err(|source| TestEnvError::Kube {
        context: format!("building a client for {name}"),
        source,
    })
}

/// The environment: one etcd and named API servers.
#[derive(Debug)]
pub struct TestEnv {
    /// The binaries in use.
    pub bins: Binaries,
    /// The environment's directory (logs, certificates, kubeconfigs, etcd data).
    pub dir: PathBuf,
    /// etcd's client URL.
    pub etcd_url: String,
    servers: BTreeMap<String, ApiServer>,
    /// Names that stand for another server's ([`TestEnv::alias`]).
    aliases: BTreeMap<String, String>,
    /// Whether its API servers start with [`lean_flags`]: the tests' do; the playground's
    /// serve the whole API of their release, as a user's cluster would.
    lean: bool,
    // Field order matters for Drop: API servers stop before etcd, the directory goes last.
    etcd: ManagedProcess,
    _tempdir: Option<tempfile::TempDir>,
}

impl TestEnv {
    /// Starts etcd and one API server per name in a fresh temporary directory (removed on
    /// drop unless `AUTONODES_KEEP_ENV` is set).
    pub async fn start(names: &[&str]) -> Result<Self, TestEnvError> {
        let tempdir = tempfile::Builder::new()
            .prefix("autonodes-env-")
            .tempdir()
            .map_err(io_err("creating a temporary directory"))?;
        let dir = tempdir.path().to_path_buf();
        let keep = std::env::var_os("AUTONODES_KEEP_ENV").is_some();
        let holder = if keep {
            let _ = tempdir.keep();
            None
        } else {
            Some(tempdir)
        };
        let mut env = Self::start_etcd(dir, holder)?;
        for name in names {
            env.add_apiserver(name).await?;
        }
        Ok(env)
    }

    /// Starts etcd and API servers in `dir`, which is kept afterwards (for `autonodes-dev dev`);
    /// they serve every API of their release (not [`lean_flags`]).
    pub async fn start_in(dir: &Path, names: &[&str]) -> Result<Self, TestEnvError> {
        fs::create_dir_all(dir).map_err(io_err(format!("creating {}", dir.display())))?;
        let dir = fs::canonicalize(dir).map_err(io_err(format!("resolving {}", dir.display())))?;
        let mut env = Self::start_etcd(dir, None)?;
        env.lean = false;
        for name in names {
            env.add_apiserver(name).await?;
        }
        Ok(env)
    }

    fn start_etcd(dir: PathBuf, tempdir: Option<tempfile::TempDir>) -> Result<Self, TestEnvError> {
        let bins = Binaries::locate()?;
        let mut attempt = 0;
        let (etcd, etcd_url) = loop {
            attempt += 1;
            match Self::spawn_etcd(&bins, &dir) {
                Err(e) if e.port_taken() && attempt < PORT_ATTEMPTS => {
                    let _ = fs::remove_dir_all(dir.join("etcd-data"));
                }
                other => break other?,
            }
        };
        Ok(TestEnv {
            bins,
            dir,
            etcd_url,
            servers: BTreeMap::new(),
            aliases: BTreeMap::new(),
            lean: true,
            etcd,
            _tempdir: tempdir,
        })
    }

    /// Starts etcd on two free ports and waits until it serves; its URL.
    fn spawn_etcd(bins: &Binaries, dir: &Path) -> Result<(ManagedProcess, String), TestEnvError> {
        let client_port = free_port()?;
        let peer_port = free_port()?;
        let data = dir.join("etcd-data");
        let etcd_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let args = vec![
            "--name=autonodes".to_string(),
            format!("--data-dir={}", data.display()),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=autonodes={peer_url}"),
            "--log-level=warn".to_string(),
        ];
        let mut etcd = ManagedProcess::spawn("etcd", &bins.etcd, &args, &dir.join("etcd.log"))?;
        let started = Instant::now();
        loop {
            etcd.check_running()?;
            if TcpStream::connect(("127.0.0.1", client_port)).is_ok() {
                // The port answers; make sure it is this etcd's (another process may hold
                // the port, and this etcd then exits for want of it).
                std::thread::sleep(Duration::from_millis(200));
                etcd.check_running()?;
                break;
            }
            if started.elapsed() > READY_TIMEOUT {
                return Err(TestEnvError::Timeout {
                    name: "etcd".into(),
                    secs: READY_TIMEOUT.as_secs(),
                    log_tail: etcd.log_tail(30),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok((etcd, etcd_url))
    }

    /// Starts another API server named `name` (a DNS label) and waits until it is ready.
    pub async fn add_apiserver(&mut self, name: &str) -> Result<&ApiServer, TestEnvError> {
        self.add_apiserver_serving(name, &[]).await
    }

    /// Starts another API server whose serving certificate is also valid for `extra_ips`
    /// (e.g. `10.0.2.2`, the host's loopback as a QEMU guest on a user-mode network sees
    /// it). Like every server's, its serving certificate is signed by its client CA, so one
    /// CA (the kubeconfig's) signs the server, the admin and the certificates a
    /// kube-controller-manager issues to kubelets with that CA's key (`certs/client-ca.key`).
    pub async fn add_apiserver_serving(
        &mut self,
        name: &str,
        extra_ips: &[&str],
    ) -> Result<&ApiServer, TestEnvError> {
        let opts = ServerOptions {
            serving_ips: extra_ips.iter().map(|s| s.to_string()).collect(),
            ..ServerOptions::default()
        };
        self.add_apiserver_with(name, &opts).await
    }

    /// Starts another API server as `opts` say: on another loopback address, with a
    /// serving certificate for more addresses and names (signed by its client CA, as in
    /// [`TestEnv::add_apiserver_serving`]), or with another Service IP range.
    pub async fn add_apiserver_with(
        &mut self,
        name: &str,
        opts: &ServerOptions,
    ) -> Result<&ApiServer, TestEnvError> {
        if self.servers.contains_key(name) {
            return Err(TestEnvError::Duplicate(name.to_string()));
        }
        let dir = self.dir.join(name);
        let cert_dir = dir.join("certs");
        fs::create_dir_all(&cert_dir)
            .map_err(io_err(format!("creating {}", cert_dir.display())))?;
        let sa_key = dir.join("sa.key");
        generate_signing_key(&sa_key)?;
        let client_ca = generate_client_ca(&cert_dir)?;
        let mut sans: Vec<String> = opts
            .serving_ips
            .iter()
            .map(|ip| format!("IP:{ip}"))
            .collect();
        sans.extend(opts.bind_address.iter().map(|ip| format!("IP:{ip}")));
        sans.extend(opts.serving_dns_names.iter().map(|n| format!("DNS:{n}")));
        // Always a serving certificate of ours (an EC key): left to itself, the server
        // makes an RSA key at every start, a tenth of its start-up CPU.
        let serving = sign_serving_certificate(&cert_dir, &sans)?;
        let admin_token = uuid::Uuid::new_v4().simple().to_string();
        let token_file = dir.join("tokens.csv");
        fs::write(
            &token_file,
            format!("{admin_token},admin,admin-uid,\"system:masters\"\n"),
        )
        .map_err(io_err(format!("writing {}", token_file.display())))?;
        // The CRDs as an earlier server stored them, in its etcd before it starts.
        let seed = (!opts.crds.is_empty())
            .then(|| crd_seed::seed_key(&self.bins.kube_apiserver, &opts.crds));
        let seeded = match seed.as_deref().and_then(crd_seed::stored) {
            Some(values) => {
                crd_seed::put(&self.etcd_url, name, &values)?;
                true
            }
            None => false,
        };
        let mut attempt = 0;
        let server = loop {
            attempt += 1;
            let paths = ServerPaths {
                dir: &dir,
                cert_dir: &cert_dir,
                sa_key: &sa_key,
                token_file: &token_file,
                serving: &serving,
            };
            match self
                .spawn_apiserver(name, &paths, &client_ca, &admin_token, opts)
                .await
            {
                // The port was taken between choosing and binding it: another one.
                Err(e) if e.port_taken() && attempt < PORT_ATTEMPTS => {}
                other => break other?,
            }
        };
        if let Some(key) = seed {
            install_crds(&server.client().await?, &opts.crds).await?;
            if !seeded {
                let names: Vec<String> = opts
                    .crds
                    .iter()
                    .map(|c| c.metadata.name.clone().unwrap_or_default())
                    .collect();
                crd_seed::keep(&key, crd_seed::read(&self.etcd_url, name, &names)?)?;
            }
        }
        self.servers.insert(name.to_string(), server);
        self.servers
            .get(name)
            .ok_or_else(|| TestEnvError::NoServer(name.to_string()))
    }

    /// Starts one kube-apiserver `name` on a free port and waits until it is ready.
    async fn spawn_apiserver(
        &self,
        name: &str,
        paths: &ServerPaths<'_>,
        client_ca: &ClientCa,
        admin_token: &str,
        opts: &ServerOptions,
    ) -> Result<ApiServer, TestEnvError> {
        let port = free_port()?;
        let bind = opts.bind_address.as_deref().unwrap_or("127.0.0.1");
        let mut args = vec![
            format!("--etcd-servers={}", self.etcd_url),
            format!("--etcd-prefix=/{name}"),
            format!("--secure-port={port}"),
            format!("--bind-address={bind}"),
            format!("--cert-dir={}", paths.cert_dir.display()),
            format!("--token-auth-file={}", paths.token_file.display()),
            format!("--client-ca-file={}", client_ca.ca_path.display()),
            "--enable-bootstrap-token-auth".to_string(),
            "--authorization-mode=Node,RBAC".to_string(),
            format!("--service-account-key-file={}", paths.sa_key.display()),
            format!(
                "--service-account-signing-key-file={}",
                paths.sa_key.display()
            ),
            "--service-account-issuer=https://kubernetes.default.svc".to_string(),
            format!(
                "--service-cluster-ip-range={}",
                opts.service_cluster_ip_range
                    .as_deref()
                    .unwrap_or("10.0.0.0/24")
            ),
            "--disable-admission-plugins=ServiceAccount".to_string(),
            // `AUTONODES_APISERVER_PROFILING=1` serves Go's pprof at `/debug/pprof/` (for
            // finding where the API servers spend their CPU in a benchmark).
            format!(
                "--profiling={}",
                std::env::var("AUTONODES_APISERVER_PROFILING").is_ok_and(|v| v == "1")
            ),
            "--v=1".to_string(),
        ];
        let (crt, key) = paths.serving;
        args.push(format!("--tls-cert-file={}", crt.display()));
        args.push(format!("--tls-private-key-file={}", key.display()));
        if self.lean {
            args.extend(lean_flags(binary_minor(&self.bins.kube_apiserver)));
        }
        let log = paths.dir.join("kube-apiserver.log");
        let process = ManagedProcess::spawn(
            &format!("kube-apiserver {name}"),
            &self.bins.kube_apiserver,
            &args,
            &log,
        )?;
        let started = Instant::now();
        // Kubeconfigs carry only the CA that signed the serving certificate (the client
        // CA), as on a real cluster.
        let ca_pem = fs::read_to_string(&client_ca.ca_path)
            .ok()
            .as_deref()
            .and_then(last_certificate)
            .ok_or_else(|| TestEnvError::Io {
                context: format!("reading {}", client_ca.ca_path.display()),
                source: std::io::Error::other("no certificate"),
            })?
            .into_bytes();
        let url = format!("https://{bind}:{port}");
        let kubeconfig_path = paths.dir.join("kubeconfig");
        let kubeconfig = admin_kubeconfig(name, &url, &ca_pem, admin_token);
        fs::write(&kubeconfig_path, &kubeconfig)
            .map_err(io_err(format!("writing {}", kubeconfig_path.display())))?;
        let server = ApiServer {
            name: name.to_string(),
            url,
            port,
            kubeconfig_path,
            ca_pem,
            admin_token: admin_token.to_string(),
            dir: paths.dir.to_path_buf(),
            token_file: paths.token_file.to_path_buf(),
            admin_client_cert_pem: client_ca.admin_cert_pem.clone(),
            admin_client_key_pem: client_ca.admin_key_pem.clone(),
            process,
            program: self.bins.kube_apiserver.clone(),
            args,
            starts: 1,
        };
        let mut server = server;
        let client = server.client().await?;
        wait_ready(name, &client, &mut server.process, started).await?;
        Ok(server)
    }

    /// Makes `name` stand for the API server `server` (one cluster in two roles, as a
    /// management cluster that is also the host of the VMs): [`TestEnv::apiserver`] and
    /// [`TestEnv::apiserver_mut`] of `name` give that server; [`TestEnv::apiservers`] lists
    /// it once.
    pub fn alias(&mut self, name: &str, server: &str) -> Result<(), TestEnvError> {
        if self.servers.contains_key(name) || self.aliases.contains_key(name) {
            return Err(TestEnvError::Duplicate(name.to_string()));
        }
        if !self.servers.contains_key(server) {
            return Err(TestEnvError::NoServer(server.to_string()));
        }
        self.aliases.insert(name.to_string(), server.to_string());
        Ok(())
    }

    /// The API server named `name`.
    pub fn apiserver(&self, name: &str) -> Option<&ApiServer> {
        let name = self.aliases.get(name).map(String::as_str).unwrap_or(name);
        self.servers.get(name)
    }

    /// The API server named `name`, mutably (e.g. to stop it).
    pub fn apiserver_mut(&mut self, name: &str) -> Option<&mut ApiServer> {
        let name = self.aliases.get(name).map(String::as_str).unwrap_or(name);
        self.servers.get_mut(name)
    }

    /// Every API server, by name.
    pub fn apiservers(&self) -> impl Iterator<Item = &ApiServer> {
        self.servers.values()
    }

    /// Starts `kube-scheduler` against the API server `name` with its admin kubeconfig
    /// (`--leader-elect=false --port=0 --secure-port=0`), so pending pods are
    /// really bound to nodes. The process is killed when the returned handle is dropped.
    pub fn start_scheduler(&self, name: &str) -> Result<ManagedProcess, TestEnvError> {
        let binary = self.bins.kube_scheduler.clone();
        self.start_component(name, "kube-scheduler", &binary, Vec::new())
    }

    /// Starts `kube-controller-manager` against the API server `name` with its admin
    /// kubeconfig, running only `controllers` (e.g. `daemonset`), without leader election
    /// or serving ports. The process is killed when the returned handle is dropped.
    pub fn start_controller_manager(
        &self,
        name: &str,
        controllers: &str,
    ) -> Result<ManagedProcess, TestEnvError> {
        let binary = k8s_binary(self, "kube-controller-manager")?;
        let extra = vec![
            format!("--controllers={controllers}"),
            "--use-service-account-credentials=false".to_string(),
        ];
        self.start_component(name, "kube-controller-manager", &binary, extra)
    }

    /// Starts the control-plane `component` (`binary`) against the API server `name` with
    /// its admin kubeconfig, without leader election or serving ports, plus `extra`
    /// arguments; its log is `<component>.log` beside the server's.
    fn start_component(
        &self,
        name: &str,
        component: &str,
        binary: &Path,
        extra: Vec<String>,
    ) -> Result<ManagedProcess, TestEnvError> {
        let server = self
            .apiserver(name)
            .ok_or_else(|| TestEnvError::Kubeconfig {
                name: name.to_string(),
                message: "no API server of that name".into(),
            })?;
        let mut args = vec![format!("--kubeconfig={}", server.kubeconfig_path.display())];
        args.extend(extra);
        args.extend(["--leader-elect=false", "--secure-port=0", "--v=1"].map(String::from));
        args.extend(insecure_port_off(binary));
        let log = server.dir.join(format!("{component}.log"));
        let mut process =
            ManagedProcess::spawn(&format!("{component} {name}"), binary, &args, &log)?;
        // It has no port to probe: it is up once it stayed alive for a moment.
        std::thread::sleep(Duration::from_millis(300));
        process.check_running()?;
        Ok(process)
    }

    /// Process ids of every process the environment runs (etcd first).
    pub fn pids(&self) -> Vec<u32> {
        self.etcd
            .pid()
            .into_iter()
            .chain(self.servers.values().filter_map(ApiServer::pid))
            .collect()
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        // API servers first, then etcd (declared after `servers`), then the directory.
        for server in self.servers.values_mut() {
            server.stop();
        }
        self.etcd.kill();
    }
}

fn http_get(path: &str) -> Result<http::Request<Vec<u8>>, String> {
    http::Request::get(path)
        .body(Vec::new())
        .map_err(|e| e.to_string())
}

/// How [`TestEnv::add_apiserver_with`] starts an API server beyond the defaults.
#[derive(Clone, Debug, Default)]
pub struct ServerOptions {
    /// The loopback address it listens on (`127.0.0.1` when `None`); its serving
    /// certificate is then valid for it.
    pub bind_address: Option<String>,
    /// Addresses its serving certificate is valid for beyond `127.0.0.1` and `10.0.0.1`.
    pub serving_ips: Vec<String>,
    /// Names its serving certificate is valid for beyond `localhost` and `kubernetes…`.
    pub serving_dns_names: Vec<String>,
    /// Its `--service-cluster-ip-range` (`10.0.0.0/24` when `None`).
    pub service_cluster_ip_range: Option<String>,
    /// CRDs it has, established, when it is ready: applied through it, and found in its etcd
    /// at start when an earlier server of the same binary stored the same ones (`crd_seed`).
    pub crds: Vec<CustomResourceDefinition>,
}

/// Where one API server keeps its files.
struct ServerPaths<'a> {
    dir: &'a Path,
    cert_dir: &'a Path,
    sa_key: &'a Path,
    token_file: &'a Path,
    /// The serving certificate and key given to the server.
    serving: &'a (PathBuf, PathBuf),
}

/// A kubeconfig authenticating with a client certificate, shaped like the one a vCluster
/// exports (`certificate-authority-data`, `client-certificate-data`, `client-key-data`).
pub fn client_cert_kubeconfig(
    name: &str,
    url: &str,
    ca_pem: &[u8],
    cert_pem: &[u8],
    key_pem: &[u8],
) -> String {
    let b64 = |d: &[u8]| base64::engine::general_purpose::STANDARD.encode(d);
    format!(
        "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: {}\n    server: {url}\n  name: {name}\ncontexts:\n- context:\n    cluster: {name}\n    user: {name}\n  name: {name}\ncurrent-context: {name}\nkind: Config\npreferences: {{}}\nusers:\n- name: {name}\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\n",
        b64(ca_pem),
        b64(cert_pem),
        b64(key_pem)
    )
}

/// An admin kubeconfig (bearer token) for an API server.
pub fn admin_kubeconfig(name: &str, url: &str, ca_pem: &[u8], token: &str) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {name}\n  cluster:\n    server: {url}\n    certificate-authority-data: {ca}\nusers:\n- name: {name}-admin\n  user:\n    token: {token}\ncontexts:\n- name: {name}\n  context:\n    cluster: {name}\n    user: {name}-admin\ncurrent-context: {name}\n"
    )
}

/// The minor release (1.x) the API server of `client` reports (`/version`; 0 when it does
/// not read as a number).
pub async fn server_minor(client: &Client) -> Result<u32, TestEnvError> {
    let info = client
        .apiserver_version()
        .await
        .map_err(|source| TestEnvError::Kube {
            context: "reading the server's version".into(),
            source,
        })?;
    Ok(info.minor.trim_end_matches('+').parse().unwrap_or(0))
}

/// Whether `crd`'s status says it is `Established`.
pub fn crd_established(crd: &CustomResourceDefinition) -> bool {
    crd.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        })
}

/// Applies CRDs with server-side apply and waits until each is Established. A server
/// before 1.25 gets them without their CEL rules, which its server-side apply refuses
/// ([`autonodes_api::crdgen::without_cel_rules`]).
pub async fn install_crds(
    client: &Client,
    crds: &[CustomResourceDefinition],
) -> Result<(), TestEnvError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply("autonodes").force();
    let minor = server_minor(client).await?;
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let crd = if minor < autonodes_api::crdgen::FIRST_MINOR_WITH_CEL {
            autonodes_api::crdgen::without_cel_rules(crd)
        } else {
            crd.clone()
        };
        api.patch(&name, &params, &Patch::Apply(&crd))
            .await
            .map_err(|source| TestEnvError::Kube {
                context: format!("applying CRD {name}"),
                source,
            })?;
    }
    let started = Instant::now();
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        loop {
            let current = api.get(&name).await.map_err(|source| TestEnvError::Kube {
                context: format!("reading CRD {name}"),
                source,
            })?;
            if crd_established(&current) {
                break;
            }
            if started.elapsed() > READY_TIMEOUT {
                return Err(TestEnvError::Timeout {
                    name: format!("CRD {name}"),
                    secs: READY_TIMEOUT.as_secs(),
                    log_tail: String::new(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

#[cfg(test)]
mod lean_tests {
    use super::lean_flags;

    #[test]
    fn lean_servers_keep_pod_disruption_budgets_only_on_releases_that_serve_them_in_beta() {
        for minor in [None, Some(20), Some(24)] {
            let flags = lean_flags(minor);
            assert!(
                flags.contains(
                    &"--runtime-config=api/beta=false,api/alpha=false,policy/v1beta1=true"
                        .to_string()
                ),
                "{minor:?}: {flags:?}"
            );
        }
        // 1.25 removed policy/v1beta1: naming it would stop the server.
        for minor in [25, 31, 36] {
            let flags = lean_flags(Some(minor));
            assert!(
                flags.contains(&"--runtime-config=api/beta=false,api/alpha=false".to_string()),
                "{minor}: {flags:?}"
            );
        }
        assert!(lean_flags(Some(36)).contains(&"--enable-priority-and-fairness=false".to_string()));
    }
}

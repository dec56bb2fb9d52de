//! `autonodes-dev simulate`: a kwok-like stand-in for KubeVirt, CDI, the garbage collector and
//! the guest, for host clusters that have our KubeVirt CRDs ([`kubevirt_crds`]) but no
//! KubeVirt.
//!
//! For every VirtualMachine labelled `app.kubernetes.io/managed-by=autonodes` it:
//! - puts the finalizer `simulator.autonodes.io/teardown` on it (KubeVirt has one too);
//! - creates the DataVolumes of `spec.dataVolumeTemplates` (owned by the VM, phase
//!   `Succeeded`);
//! - when the VM should run (`runStrategy` Always, RerunOnFailure, Once or `running: true`)
//!   creates the VirtualMachineInstance `<vm>` (phase `Scheduling`), turns it `Running` with
//!   a `10.x.y.z` address and a host `nodeName` after the boot delay, and reports
//!   `ready`/`created`/`printableStatus` on the VM's status subresource;
//! - plays the guest: reads the `#cloud-config` from the Secret of the `cloudInitNoCloud`
//!   volume, checks the kubeadm `JoinConfiguration` it writes and the `kubeadm join` it runs,
//!   picks the tenant by `apiServerEndpoint`, checks the CA pin and that the bootstrap token
//!   authenticates, then registers the Node in the tenant with the tenant's admin client
//!   (standing in for the kubelet after its TLS bootstrap) and marks it Ready. Failures are
//!   recorded as a Warning Event `JoinFailed` on the VM and the annotation
//!   `simulator.autonodes.io/join-error` on the VMI; a VM annotated
//!   `simulator.autonodes.io/kubelet-stopped` has a kubelet that stopped posting: its Node
//!   turns `Ready=Unknown` until the annotation goes (node repair is tested so);
//! - on deletion deletes the VMI and the VM's DataVolumes, marks the Node NotReady
//!   (`Ready=Unknown`, as a stopped kubelet looks) and releases the finalizer; a periodic
//!   sweep deletes VMIs, DataVolumes and autonodes Secrets whose owning VirtualMachine is
//!   gone (what the garbage collector would do).
//!
//! Everything is idempotent and derived from cluster state, so a restarted simulator picks
//! up where it stopped without creating anything twice.
//!
//! It reads watch caches, not the API servers: one watch per kind (host VMs, VMIs,
//! DataVolumes and autonodes Secrets; per tenant its Nodes and bootstrap tokens), each
//! drained by its own task, and the VM reconciles are woken from the VM and VMI caches
//! rather than by watches of their own. What remains read per VM is the user-data Secret
//! (once per join attempt); the owners of an apparent orphan are read before it is
//! deleted, and an object is read again after a write on it conflicted.

mod cache;
mod crds;
pub mod guest;
mod kubelet;
pub mod real_guest;
mod reconcile;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{watcher, Controller};
use kube::{Client, Config, ResourceExt};
use serde_json::json;

use cache::Cache;

pub use crds::{
    data_volume_crd, instancetype_crds, kubevirt_crds, virtual_machine_crd,
    virtual_machine_instance_crd, RUN_STRATEGIES, VMI_PHASES,
};

/// The label selector of the VirtualMachines the simulator plays KubeVirt for.
pub const MANAGED_SELECTOR: &str = "app.kubernetes.io/managed-by=autonodes";
/// The finalizer the simulator keeps on VirtualMachines until it has torn them down.
pub const FINALIZER: &str = "simulator.autonodes.io/teardown";
/// VMI annotation: why the guest did not join (absent once it joined).
pub const JOIN_ERROR_ANNOTATION: &str = "simulator.autonodes.io/join-error";
/// VM annotation (set by tests, or by hand in the playground): the guest's kubelet has
/// stopped — its joined Node turns `Ready=Unknown` and stays so until the annotation goes.
pub const KUBELET_STOPPED_ANNOTATION: &str = "simulator.autonodes.io/kubelet-stopped";
/// Prefix of a join error the guest no longer retries.
pub const GAVE_UP_PREFIX: &str = "gave up: ";

/// Errors of the simulator.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A request to a cluster failed.
    #[error("{context}: {source}")]
    Kube {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: kube::Error,
    },
    /// A kubeconfig could not be read or used.
    #[error("kubeconfig {path}: {message}")]
    Kubeconfig {
        /// The file (or a description of the kubeconfig).
        path: String,
        /// What went wrong.
        message: String,
    },
    /// The host cluster does not serve a KubeVirt kind.
    #[error(
        "the host cluster does not serve {0}: install the KubeVirt CRDs (autonodes::simulator::kubevirt_crds) first"
    )]
    CrdsMissing(String),
    /// An object the simulator read is not what it expects.
    #[error("{0}")]
    Invalid(String),
}

impl SimError {
    pub(crate) fn kube(context: impl Into<String>) -> impl FnOnce(kube::Error) -> SimError {
        let context = context.into();
        move |source| SimError::Kube { context, source }
    }
}

/// How the simulated VMs behave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SimMode {
    /// Boot at once and join.
    #[default]
    Normal,
    /// Never boot: the VMI stays `Scheduling`, the VM never turns ready.
    NeverBoot,
    /// Boot (VMI `Running`, VM ready) but never register a Node.
    NeverJoin,
    /// Boot only after this long (counted from the VMI's creation), then join.
    SlowBoot(Duration),
}

impl SimMode {
    /// How long after its VMI is created a guest boots; None for never.
    pub fn boot_delay(&self) -> Option<Duration> {
        match self {
            SimMode::Normal | SimMode::NeverJoin => Some(Duration::ZERO),
            SimMode::NeverBoot => None,
            SimMode::SlowBoot(d) => Some(*d),
        }
    }
}

impl FromStr for SimMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "normal" => Ok(SimMode::Normal),
            "never-boot" => Ok(SimMode::NeverBoot),
            "never-join" => Ok(SimMode::NeverJoin),
            _ => {
                let delay = s.strip_prefix("slow-boot=").ok_or_else(|| {
                    format!(
                        "unknown mode {s:?}: use normal, never-boot, never-join or slow-boot=DURATION"
                    )
                })?;
                guest::parse_duration(delay)
                    .map(SimMode::SlowBoot)
                    .ok_or_else(|| {
                        format!("slow-boot: {delay:?} is not a duration like 20s or 1m30s")
                    })
            }
        }
    }
}

impl std::fmt::Display for SimMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SimMode::Normal => f.write_str("normal"),
            SimMode::NeverBoot => f.write_str("never-boot"),
            SimMode::NeverJoin => f.write_str("never-join"),
            SimMode::SlowBoot(d) => write!(f, "slow-boot={}ms", d.as_millis()),
        }
    }
}

/// Options of a simulator run.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// How the VMs behave.
    pub mode: SimMode,
    /// Only VMs in this namespace (default: all namespaces).
    pub namespace: Option<String>,
    /// The host node name reported in VMI `status.nodeName`.
    pub host_node_name: String,
    /// How often a failed join is retried until kubeadm's discovery timeout.
    pub join_retry_interval: Duration,
    /// How often running VMs are looked at again (Node still Ready, …).
    pub resync_interval: Duration,
    /// How often objects whose VirtualMachine is gone are swept (garbage collection).
    pub sweep_interval: Duration,
    /// Boot real guests with QEMU instead of playing the kubelet (`None`: simulated).
    pub real_guests: Option<Arc<real_guest::RealGuests>>,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            mode: SimMode::Normal,
            namespace: None,
            host_node_name: "kubevirt-host-0".to_string(),
            join_retry_interval: Duration::from_secs(1),
            resync_interval: Duration::from_secs(120),
            sweep_interval: Duration::from_secs(10),
            real_guests: None,
        }
    }
}

/// A tenant cluster the simulated guests may join.
#[derive(Clone)]
pub struct Tenant {
    /// A client with admin rights (stands in for the kubelet once it has its certificate).
    pub client: Client,
    /// The API server URL (`https://host:port`), matched against `apiServerEndpoint`.
    pub url: String,
    /// PEM of the tenant's CA bundle (what kubeadm pins with `caCertHashes`).
    pub ca_pem: Vec<u8>,
}

impl std::fmt::Debug for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenant").field("url", &self.url).finish()
    }
}

impl Tenant {
    /// A tenant from its parts.
    pub fn new(client: Client, url: impl Into<String>, ca_pem: impl Into<Vec<u8>>) -> Self {
        Tenant {
            client,
            url: url.into(),
            ca_pem: ca_pem.into(),
        }
    }

    /// A tenant from an admin kubeconfig file: its current context's server and CA.
    pub async fn from_kubeconfig_file(path: &Path) -> Result<Self, SimError> {
        let kc = Kubeconfig::read_from(path).map_err(|e| SimError::Kubeconfig {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Self::from_kubeconfig(kc, &path.display().to_string(), path.parent()).await
    }

    /// A tenant from a parsed admin kubeconfig; `origin` names it in errors, `base_dir`
    /// resolves a relative `certificate-authority` path.
    pub async fn from_kubeconfig(
        kc: Kubeconfig,
        origin: &str,
        base_dir: Option<&Path>,
    ) -> Result<Self, SimError> {
        let err = |message: String| SimError::Kubeconfig {
            path: origin.to_string(),
            message,
        };
        let context_name = kc
            .current_context
            .clone()
            .or_else(|| kc.contexts.first().map(|c| c.name.clone()))
            .ok_or_else(|| err("no context".into()))?;
        let cluster_name = kc
            .contexts
            .iter()
            .find(|c| c.name == context_name)
            .and_then(|c| c.context.as_ref())
            .map(|c| c.cluster.clone())
            .ok_or_else(|| err(format!("context {context_name} not found")))?;
        let cluster = kc
            .clusters
            .iter()
            .find(|c| c.name == cluster_name)
            .and_then(|c| c.cluster.as_ref())
            .ok_or_else(|| err(format!("cluster {cluster_name} not found")))?;
        let url = cluster
            .server
            .clone()
            .ok_or_else(|| err(format!("cluster {cluster_name} has no server")))?;
        let ca_pem = if let Some(data) = &cluster.certificate_authority_data {
            base64::engine::general_purpose::STANDARD
                .decode(data.trim())
                .map_err(|e| err(format!("certificate-authority-data: {e}")))?
        } else if let Some(file) = &cluster.certificate_authority {
            let file = PathBuf::from(file);
            let file = match base_dir {
                Some(dir) if file.is_relative() => dir.join(file),
                _ => file,
            };
            std::fs::read(&file).map_err(|e| err(format!("reading {}: {e}", file.display())))?
        } else {
            return Err(err(format!(
                "cluster {cluster_name} has no certificate authority: the guest needs it to check caCertHashes"
            )));
        };
        let client = client_from(kc, origin).await?;
        Ok(Tenant::new(client, url, ca_pem))
    }
}

async fn client_from(kc: Kubeconfig, origin: &str) -> Result<Client, SimError> {
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| SimError::Kubeconfig {
            path: origin.to_string(),
            message: e.to_string(),
        })?;
    Client::try_from(config).map_err(SimError::kube(format!("building a client for {origin}")))
}

/// Command-line arguments of `autonodes-dev simulate`.
#[derive(Debug, Clone, clap::Args)]
pub struct SimulateArgs {
    /// Kubeconfig of the host (KubeVirt) cluster; default: $KUBECONFIG or in-cluster.
    #[arg(long, env = "AUTONODES_SIM_HOST_KUBECONFIG")]
    pub host_kubeconfig: Option<PathBuf>,
    /// Admin kubeconfig of a tenant cluster the guests may join (repeat for several).
    #[arg(long = "tenant-kubeconfig", required = true)]
    pub tenant_kubeconfig: Vec<PathBuf>,
    /// How the VMs behave: normal, never-boot, never-join or slow-boot=DURATION (e.g. 20s).
    #[arg(long, default_value = "normal", env = "AUTONODES_SIM_MODE")]
    pub mode: SimMode,
    /// Only simulate VirtualMachines in this namespace (default: all namespaces).
    #[arg(long)]
    pub namespace: Option<String>,
}

/// Runs `autonodes-dev simulate` until Ctrl-C (or SIGTERM).
pub async fn run_cli(args: SimulateArgs) -> anyhow::Result<()> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .try_init();
    let host = match &args.host_kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path).map_err(|e| SimError::Kubeconfig {
                path: path.display().to_string(),
                message: e.to_string(),
            })?;
            client_from(kc, &path.display().to_string()).await?
        }
        None => Client::try_default().await.map_err(SimError::kube(
            "building the host client from the environment",
        ))?,
    };
    let mut tenants = Vec::new();
    for path in &args.tenant_kubeconfig {
        tenants.push(Tenant::from_kubeconfig_file(path).await?);
    }
    let opts = SimOptions {
        mode: args.mode,
        namespace: args.namespace.clone(),
        ..SimOptions::default()
    };
    run(host, tenants, opts, shutdown_signal()).await?;
    Ok(())
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Shared state of one simulator run.
pub(crate) struct Ctx {
    pub(crate) host: Client,
    pub(crate) tenants: Vec<kubelet::TenantEntry>,
    pub(crate) opts: SimOptions,
    pub(crate) recorder: Recorder,
    pub(crate) vm: ApiResource,
    pub(crate) vmi: ApiResource,
    pub(crate) dv: ApiResource,
    /// The managed VirtualMachines.
    pub(crate) vms: Arc<Cache<DynamicObject>>,
    /// VirtualMachineInstances (metadata and status).
    pub(crate) vmis: Arc<Cache<DynamicObject>>,
    /// DataVolumes (metadata and status).
    pub(crate) dvs: Arc<Cache<DynamicObject>>,
    /// autonodes' Secrets (the user data a guest reads; the sweep's and a foreground
    /// deletion's view).
    pub(crate) secrets: Arc<Cache<Secret>>,
    /// The guests that joined a tenant.
    pub(crate) joined: kubelet::Joined,
}

impl Ctx {
    pub(crate) fn api(&self, ar: &ApiResource, ns: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.host.clone(), ns, ar)
    }
}

/// The API over every namespace the simulator looks at.
fn api_scope(client: &Client, namespace: Option<&str>, ar: &ApiResource) -> Api<DynamicObject> {
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, ar),
        None => Api::all_with(client.clone(), ar),
    }
}

/// Keeps metadata and status of a KubeVirt or CDI object (the spec stays unread).
fn trim_to_status(obj: &mut DynamicObject) {
    cache::trim_meta(obj);
    let status = obj.data.get_mut("status").map(std::mem::take);
    obj.data = match status {
        Some(status) => json!({ "status": status }),
        None => json!({}),
    };
}

/// Plays KubeVirt, CDI, the garbage collector and the guests on `host` for the `tenants`
/// until `shutdown` resolves. Fails at once when the host does not serve the KubeVirt kinds.
pub async fn run(
    host: Client,
    tenants: Vec<Tenant>,
    opts: SimOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), SimError> {
    let vm = crate::kubevirt::virtual_machine();
    let vmi = crate::kubevirt::virtual_machine_instance();
    let dv = crate::kubevirt::data_volume();
    let namespace = opts.namespace.as_deref();
    for ar in [&vm, &vmi, &dv] {
        match api_scope(&host, namespace, ar)
            .list_metadata(&ListParams::default().limit(1))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {
                return Err(SimError::CrdsMissing(format!("{}.{}", ar.plural, ar.group)))
            }
            Err(source) => {
                return Err(SimError::Kube {
                    context: format!("listing {} on the host cluster", ar.plural),
                    source,
                })
            }
        }
    }

    // One watch per kind, each drained by its own task; changes of a VM or of the VMI it
    // owns wake the VM's reconcile once the cache holds them.
    let (wake, woken) = futures::channel::mpsc::unbounded::<ObjectRef<DynamicObject>>();
    type OnChange = Box<dyn Fn(&DynamicObject) + Send>;
    let kubevirt = |ar: &ApiResource, config: watcher::Config, trim, on_change: OnChange| {
        let api = api_scope(&host, namespace, ar);
        cache::spawn(
            format!("host {}", ar.plural),
            api,
            config,
            ar.clone(),
            trim,
            on_change,
        )
    };
    let wake_vm = {
        let (wake, vm) = (wake.clone(), vm.clone());
        move |obj: &DynamicObject| {
            let _ = wake.unbounded_send(ObjectRef::from_obj_with(obj, vm.clone()));
        }
    };
    let wake_owner = {
        let vm = vm.clone();
        move |obj: &DynamicObject| {
            let owner = obj
                .owner_references()
                .iter()
                .find(|o| o.controller == Some(true) && o.kind == vm.kind);
            if let (Some(ns), Some(owner)) = (obj.namespace(), owner) {
                let vm = ObjectRef::new_with(&owner.name, vm.clone()).within(&ns);
                let _ = wake.unbounded_send(vm);
            }
        }
    };
    let managed = watcher::Config::default().labels(MANAGED_SELECTOR);
    let (vms, vm_task) = kubevirt(&vm, managed, cache::trim_meta, Box::new(wake_vm));
    let all = watcher::Config::default();
    let (vmis, vmi_task) = kubevirt(&vmi, all.clone(), trim_to_status, Box::new(wake_owner));
    let (dvs, dv_task) = kubevirt(&dv, all, trim_to_status, Box::new(|_| {}));
    let mut tasks = vec![vm_task, vmi_task, dv_task];
    let (secrets, task) = cache::spawn(
        "host autonodes Secrets".into(),
        match namespace {
            Some(ns) => Api::<Secret>::namespaced(host.clone(), ns),
            None => Api::all(host.clone()),
        },
        watcher::Config::default().labels(MANAGED_SELECTOR),
        (),
        cache::trim_meta,
        |_: &Secret| {},
    );
    tasks.push(task);
    let mut entries = Vec::new();
    for tenant in tenants {
        let (entry, tenant_tasks) = kubelet::TenantEntry::start(tenant);
        entries.push(entry);
        tasks.extend(tenant_tasks);
    }
    let ctx = Arc::new(Ctx {
        recorder: Recorder::new(
            host.clone(),
            Reporter {
                controller: "autonodes-simulator".into(),
                instance: None,
            },
        ),
        tenants: entries,
        vm,
        vmi,
        dv,
        host,
        opts,
        vms,
        vmis,
        dvs,
        secrets,
        joined: kubelet::Joined::default(),
    });
    let result = serve(ctx, woken, shutdown).await;
    for task in tasks {
        task.abort();
    }
    tracing::info!("simulator stopped");
    result
}

/// Runs the controller and the sweep on the caches until `shutdown` resolves.
async fn serve(
    ctx: Arc<Ctx>,
    woken: futures::channel::mpsc::UnboundedReceiver<ObjectRef<DynamicObject>>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), SimError> {
    tokio::pin!(shutdown);
    // The first lists of the host's kinds before the first reconcile, so that nothing is
    // read from the API server for want of a cache.
    let host_ready = async {
        for store in [ctx.vms.store(), ctx.vmis.store(), ctx.dvs.store()] {
            let _ = store.wait_until_ready().await;
        }
        let _ = ctx.secrets.store().wait_until_ready().await;
    };
    tokio::select! {
        _ = host_ready => {}
        _ = &mut shutdown => return Ok(()),
    }
    tracing::info!(
        mode = %ctx.opts.mode,
        namespace = ctx.opts.namespace.as_deref().unwrap_or("<all>"),
        tenants = ?ctx.tenants.iter().map(|t| t.tenant.url.as_str()).collect::<Vec<_>>(),
        "simulator started"
    );

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut graceful = stop_rx.clone();
    // Triggered from the caches only: the controller opens no watch of its own.
    let controller =
        Controller::for_stream_with(futures::stream::pending(), ctx.vms.store(), ctx.vm.clone())
            .reconcile_on(woken)
            .graceful_shutdown_on(async move {
                let _ = graceful.wait_for(|stop| *stop).await;
            })
            .run(reconcile::reconcile, reconcile::error_policy, ctx.clone())
            .for_each(|result| async move {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "reconcile");
                }
            });
    let sweeper = reconcile::sweep_loop(ctx.clone(), stop_rx);
    let work = futures::future::join(controller, sweeper);
    tokio::pin!(work);
    tokio::select! {
        _ = &mut work => {}
        _ = &mut shutdown => {
            let _ = stop_tx.send(true);
            work.await;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_from_the_command_line() {
        assert_eq!("normal".parse::<SimMode>(), Ok(SimMode::Normal));
        assert_eq!("never-boot".parse::<SimMode>(), Ok(SimMode::NeverBoot));
        assert_eq!("never-join".parse::<SimMode>(), Ok(SimMode::NeverJoin));
        assert_eq!(
            "slow-boot=20s".parse::<SimMode>(),
            Ok(SimMode::SlowBoot(Duration::from_secs(20)))
        );
        assert!("slow-boot=soon".parse::<SimMode>().is_err());
        assert!("fast".parse::<SimMode>().is_err());
        assert_eq!(SimMode::NeverBoot.boot_delay(), None);
    }

    #[test]
    fn simulate_arguments_parse() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: SimulateArgs,
        }
        let cli = Cli::try_parse_from([
            "x",
            "--host-kubeconfig",
            "h",
            "--tenant-kubeconfig",
            "a",
            "--tenant-kubeconfig",
            "b",
            "--mode",
            "slow-boot=1m",
        ])
        .expect("parses");
        assert_eq!(cli.args.tenant_kubeconfig.len(), 2);
        assert_eq!(cli.args.mode, SimMode::SlowBoot(Duration::from_secs(60)));
        assert!(Cli::try_parse_from(["x", "--host-kubeconfig", "h"]).is_err());
    }
}

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
//!   a `10.x.y.z` address, conditions `Ready` and `LiveMigratable` and a host node after the
//!   boot delay, and reports `ready`/`created`/`printableStatus` on the VM's status
//!   subresource. The host node (`status.nodeName`, label `kubevirt.io/nodeName`) is
//!   `SimOptions::host_node_name`, unless the host has a cordoned Node of that name: then
//!   the first by name of its Nodes neither cordoned nor NotReady, and while there is none
//!   the VMI stays `Scheduling`. `LiveMigratable` is False (`DisksNotLiveMigratable`) for a
//!   `hostDisk`, or a DataVolume or claim that is not `ReadWriteMany`;
//! - plays KubeVirt's live migration for each VirtualMachineInstanceMigration naming the
//!   VMI, oldest first, one at a time: it fails at once (migration `Failed`, the VMI's
//!   `migrationState` `failed` with a `failureReason`) when the VMI is not Running or not
//!   LiveMigratable, when the VM is annotated `simulator.autonodes.io/migration-fails`
//!   (a value other than `true` is the reason), or when no other host Node is usable;
//!   else it runs (`Running`, `migrationState` with source and target) for the boot delay,
//!   at least a second, and completes: the VMI's `nodeName` and label name the target, `completed`,
//!   migration `Succeeded`. The guest, and its tenant Node, are untouched. A migration
//!   deleted while it runs is aborted;
//! - plays the guest: reads the `#cloud-config` from the Secret of the `cloudInitNoCloud`
//!   volume, checks the kubeadm `JoinConfiguration` it writes and the `kubeadm join` it runs,
//!   picks the tenant by `apiServerEndpoint`, checks that the tenant's kubeadm release (its
//!   `/version`) reads that JoinConfiguration's apiVersion, the CA pin and that the bootstrap token
//!   authenticates, then registers the Node in the tenant with the tenant's admin client
//!   (standing in for the kubelet after its TLS bootstrap) and marks it Ready. Failures are
//!   recorded as a Warning Event `JoinFailed` on the VM and the annotation
//!   `simulator.autonodes.io/join-error` on the VMI; a VM annotated
//!   `simulator.autonodes.io/kubelet-stopped` has a kubelet that stopped posting: its Node
//!   turns `Ready=Unknown` until the annotation goes (node repair is tested so); one
//!   annotated `simulator.autonodes.io/kubelet-version: v1.19.7` reports that kubelet
//!   version on its Node from then on (version drift is tested so);
//! - on deletion deletes the VMI, its migrations and the VM's DataVolumes, marks the Node
//!   NotReady (`Ready=Unknown`, as a stopped kubelet looks) and releases the finalizer; a
//!   periodic sweep deletes VMIs, migrations, DataVolumes and autonodes Secrets whose owning
//!   VirtualMachine is gone (what the garbage collector would do), and migrations of VMIs
//!   that are gone once they ended a while ago (what KubeVirt does).
//!
//! Everything is idempotent and derived from cluster state, so a restarted simulator picks
//! up where it stopped without creating anything twice.
//!
//! It reads watch caches, not the API servers: one watch per kind (host VMs, VMIs,
//! migrations, DataVolumes, Nodes and autonodes Secrets; per tenant its Nodes and bootstrap
//! tokens), each drained by its own task, and the VM reconciles are woken from the VM, VMI
//! and migration caches rather than by watches of their own. What remains read per VM is
//! the user-data Secret (once per join attempt) and, at boot, a claim no DataVolume template
//! makes; the owners of an apparent orphan are read before it is deleted, and an object is
//! read again after a write on it conflicted.
//!
//! This file declares the parts and starts a run. The parts import only what lies below
//! them, never this file: `reconcile` (KubeVirt, CDI and the garbage collector) uses
//! `kubelet` (the guest) and `migration` (live migration and `LiveMigratable`), all use
//! `context` (a run's shared state), which holds the `tenant_entry`s (a tenant's caches) of
//! each `tenant`, the `options`, and the `cache`s; `error`, `markers` (the label, finalizer
//! and annotations), `placement` (which host Node a guest goes to, pure), `guest` (what a
//! guest reads, pure, with `kubeadm` beneath it: which configuration APIs and fields a
//! kubeadm release reads) and `crds` are the leaves.

mod cache;
mod context;
mod crds;
mod error;
pub mod guest;
mod kubeadm;
mod kubelet;
mod markers;
mod migration;
mod options;
mod placement;
pub mod real_guest;
mod reconcile;
mod tenant;
mod tenant_entry;
pub mod warm_agent;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, NodeStatus, Secret};
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::config::Kubeconfig;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{watcher, Controller};
use kube::{Client, ResourceExt};
use serde_json::json;

use context::{Ctx, Joined};
use tenant::client_from;
use tenant_entry::TenantEntry;

pub use crds::{
    data_volume_crd, instancetype_crds, kubevirt_crds, virtual_machine_crd,
    virtual_machine_instance_crd, virtual_machine_instance_migration_crd, EVICTION_STRATEGIES,
    MIGRATION_PHASES, RUN_STRATEGIES, VMI_PHASES,
};
pub use error::SimError;
pub use markers::{
    FINALIZER, GAVE_UP_PREFIX, JOIN_ERROR_ANNOTATION, KUBELET_STOPPED_ANNOTATION,
    KUBELET_VERSION_ANNOTATION, MANAGED_SELECTOR, MIGRATION_FAILS_ANNOTATION,
};
pub use options::{SimMode, SimOptions};
pub use tenant::Tenant;

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

/// Keeps what placement reads of a host Node: its metadata, spec and conditions.
fn trim_host_node(node: &mut Node) {
    cache::trim_meta(node);
    node.status = node.status.take().map(|status| NodeStatus {
        conditions: status.conditions,
        ..NodeStatus::default()
    });
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
    let vmim = autonodes_api::kubevirt::virtual_machine_instance_migration();
    let namespace = opts.namespace.as_deref();
    for ar in [&vm, &vmi, &dv, &vmim] {
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
        let (wake, vm) = (wake.clone(), vm.clone());
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
    // A migration wakes the VM of the instance it names (named as the VM).
    let wake_migrated = {
        let vm = vm.clone();
        move |obj: &DynamicObject| {
            if let (Some(ns), Some(name)) = (obj.namespace(), migration::vmi_name(obj)) {
                let vm = ObjectRef::new_with(name, vm.clone()).within(&ns);
                let _ = wake.unbounded_send(vm);
            }
        }
    };
    let managed = watcher::Config::default().labels(MANAGED_SELECTOR);
    let (vms, vm_task) = kubevirt(&vm, managed, cache::trim_meta, Box::new(wake_vm));
    let all = watcher::Config::default();
    let (vmis, vmi_task) = kubevirt(&vmi, all.clone(), trim_to_status, Box::new(wake_owner));
    let (dvs, dv_task) = kubevirt(&dv, all.clone(), trim_to_status, Box::new(|_| {}));
    let (vmims, vmim_task) = kubevirt(&vmim, all, cache::trim_meta, Box::new(wake_migrated));
    let mut tasks = vec![vm_task, vmi_task, dv_task, vmim_task];
    // Host Nodes: where guests are placed (a new instance, a migration's target).
    let (host_nodes, task) = cache::spawn(
        "host Nodes".into(),
        Api::<Node>::all(host.clone()),
        watcher::Config::default(),
        (),
        trim_host_node,
        |_: &Node| {},
    );
    tasks.push(task);
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
        let (entry, tenant_tasks) = TenantEntry::start(tenant);
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
        vmim,
        host,
        opts,
        vms,
        vmis,
        dvs,
        vmims,
        host_nodes,
        secrets,
        joined: Joined::default(),
        beats: Default::default(),
        bindings: Default::default(),
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
        for store in [
            ctx.vms.store(),
            ctx.vmis.store(),
            ctx.dvs.store(),
            ctx.vmims.store(),
        ] {
            let _ = store.wait_until_ready().await;
        }
        let _ = ctx.secrets.store().wait_until_ready().await;
        let _ = ctx.host_nodes.store().wait_until_ready().await;
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
    use std::time::Duration;

    use super::*;

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

//! The shared state of one simulator run ([`Ctx`]): the host client and its caches, the
//! tenants, the options, the Event recorder and the guests that joined.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Client, Resource};

use super::cache::Cache;
use super::options::SimOptions;
use super::placement;
use super::tenant_entry::TenantEntry;

/// Shared state of one simulator run.
pub(crate) struct Ctx {
    pub(crate) host: Client,
    pub(crate) tenants: Vec<TenantEntry>,
    pub(crate) opts: SimOptions,
    pub(crate) recorder: Recorder,
    pub(crate) vm: ApiResource,
    pub(crate) vmi: ApiResource,
    pub(crate) dv: ApiResource,
    /// VirtualMachineInstanceMigration.
    pub(crate) vmim: ApiResource,
    /// The managed VirtualMachines.
    pub(crate) vms: Arc<Cache<DynamicObject>>,
    /// VirtualMachineInstances (metadata and status).
    pub(crate) vmis: Arc<Cache<DynamicObject>>,
    /// DataVolumes (metadata and status).
    pub(crate) dvs: Arc<Cache<DynamicObject>>,
    /// VirtualMachineInstanceMigrations (metadata, spec and status).
    pub(crate) vmims: Arc<Cache<DynamicObject>>,
    /// The host's Nodes (metadata, spec and conditions): where guests are placed.
    pub(crate) host_nodes: Arc<Cache<Node>>,
    /// autonodes' Secrets (the user data a guest reads; the sweep's and a foreground
    /// deletion's view).
    pub(crate) secrets: Arc<Cache<Secret>>,
    /// The guests that joined a tenant.
    pub(crate) joined: Joined,
    /// When each warm VM's simulated agent last renewed its Lease, by VM name.
    pub(crate) beats: Beats,
    /// What each bound warm VM's simulated agent read from its binding.
    pub(crate) bindings: Bindings,
}

impl Ctx {
    /// The host's API of the kind `ar` in namespace `ns`.
    pub(crate) fn api(&self, ar: &ApiResource, ns: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.host.clone(), ns, ar)
    }

    /// The host node a new instance runs on ([`placement::place`] over the host's Nodes);
    /// None while every host Node is cordoned or not ready.
    pub(crate) fn place_new_vmi(&self) -> Option<String> {
        placement::place(&self.opts.host_node_name, &self.host_nodes.objects())
    }
}

/// A map by name behind a mutex that a panicking holder does not poison.
pub(crate) struct Locked<V>(Mutex<HashMap<String, V>>);

impl<V> Default for Locked<V> {
    fn default() -> Self {
        Locked(Mutex::new(HashMap::new()))
    }
}

impl<V> Locked<V> {
    /// The map, whether or not a holder panicked.
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, V>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// When each warm VM's agent last renewed its Lease.
pub(crate) type Beats = Locked<std::time::Instant>;

/// The JoinConfiguration each bound warm VM's agent read from its binding (it revoked its
/// token then, so it never reads the host again), by VM name.
pub(crate) type Bindings = Locked<String>;

/// The guests that joined, by VMI UID: the tenant (its index in `Ctx::tenants`) and the
/// Node's name.
pub(crate) type Joined = Locked<(usize, String)>;

/// Records an Event of `type_` about the VirtualMachine `vm` (the note cut to 1000
/// characters); a failure is logged, not returned.
pub(crate) async fn publish(
    ctx: &Ctx,
    vm: &DynamicObject,
    type_: EventType,
    reason: &str,
    note: &str,
) {
    let reference = vm.object_ref(&ctx.vm);
    let note: String = note.chars().take(1000).collect();
    let event = Event {
        type_,
        reason: reason.to_string(),
        note: Some(note),
        action: reason.to_string(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &reference).await {
        tracing::warn!(error = %e, reason, "recording an Event failed");
    }
}

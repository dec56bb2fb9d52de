//! The NodePool controller's state beside the shared [`Context`].

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use futures::channel::mpsc::UnboundedSender;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::Mutex;

use crate::controller::context::Context;
use crate::remote::clients::{ClusterKey, Remote};
use autonodes_api::NodePool;

/// Shared state of the NodePool controller.
pub(crate) struct PoolContext {
    /// The controllers' shared context.
    pub ctx: Arc<Context>,
    /// Every NodePool (the controller's reflector).
    pub pools: Store<NodePool>,
    /// Wakes pools (tenant pod, node and DaemonSet changes).
    pub wake: UnboundedSender<ObjectRef<NodePool>>,
    /// Watches on tenant clusters, by tenant: the client they use and their tasks.
    pub(super) watches: Mutex<HashMap<ClusterKey, TenantWatch>>,
    /// Pools (namespace, name) whose gauges are set (to remove those of deleted pools).
    pub(super) gauges: std::sync::Mutex<BTreeSet<(String, String)>>,
}

/// The watches of one tenant: the client they use, their caches and their tasks (stopped
/// when dropped).
pub(crate) struct TenantWatch {
    /// The tenant client the watches use.
    pub(super) remote: Arc<Remote>,
    /// What they hold.
    pub(super) caches: Arc<super::tenant_cache::TenantCaches>,
    /// The watch tasks.
    pub(super) tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Whether the node and DaemonSet watches run (they start once a pool has something
    /// to plan with them; see [`super::tenant`]).
    pub(super) planning_started: bool,
}

impl Drop for TenantWatch {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

//! The warm VMs of each node type as the NodeType controller last saw them
//! ([`super::warm`]), which claims take from (`nodeclaim::warm`).

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::jiff::Timestamp;

use autonodes_core::warm::{self, WarmVm};

/// The warm VMs of each type as its last reconcile saw them (what claims take), and how
/// many claims each type's warm VMs served.
#[derive(Default)]
pub struct WarmIndex {
    vms: Mutex<HashMap<String, Vec<WarmVm>>>,
    bound: Mutex<HashMap<String, i64>>,
}

impl WarmIndex {
    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The warm VMs of `node_type` a claim may take now, the oldest first.
    pub fn ready(&self, node_type: &str, now: Timestamp) -> Vec<String> {
        let mut vms: Vec<WarmVm> = Self::lock(&self.vms)
            .get(node_type)
            .cloned()
            .unwrap_or_default();
        let mut out = Vec::new();
        while let Some(v) = warm::pick(&vms, now).cloned() {
            vms.retain(|x| x.name != v.name);
            out.push(v.name);
        }
        out
    }

    /// Records that a claim took the warm VM `vm` of `node_type`.
    pub fn taken(&self, node_type: &str, vm: &str) {
        if let Some(vms) = Self::lock(&self.vms).get_mut(node_type) {
            vms.retain(|v| v.name != vm);
        }
        *Self::lock(&self.bound)
            .entry(node_type.to_string())
            .or_default() += 1;
    }

    /// Records the warm VMs of `node_type` a reconcile saw.
    pub fn set(&self, node_type: &str, vms: Vec<WarmVm>) {
        Self::lock(&self.vms).insert(node_type.to_string(), vms);
    }

    /// How many claims the warm VMs of `node_type` served since the controller started.
    pub fn bound(&self, node_type: &str) -> i64 {
        Self::lock(&self.bound).get(node_type).copied().unwrap_or(0)
    }
}

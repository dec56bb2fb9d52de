//! The pure core of autonodes: every decision that needs no cluster. No Kubernetes client,
//! no async runtime, no I/O (`tests/no_io.rs` checks the dependency tree).
//!
//! - [`resources`]: quantities and resource lists;
//! - [`names`]: names and label values derived from user names, made to fit;
//! - [`requirements`]: the one matcher of requirements against labels or properties, and
//!   of tolerations against taints (claims and pods alike);
//! - [`scheduling`]: properties, requirements, cost, capacity, the choice of a node type;
//! - [`host_capacity`]: whether a type's VM fits a node of its host cluster, and the
//!   host's headroom;
//! - [`host_maintenance`]: what becomes of a VM whose host node is drained (live migration
//!   or replacement);
//! - [`ledger`]: the claimed capacity per node type, kept up to date as claims change;
//! - [`pool`]: node pools: claim template, claims to keep/delete/create, pending pods packed
//!   onto nodes;
//! - [`template`]: VirtualMachine composition;
//! - [`throttle`]: when a request an API server turned away for load (429) is sent again;
//! - [`userdata`]: cloud-init rendering;
//! - [`claim`]: the claim's phase ladder;
//! - [`explain`]: why a claim, a pool, a node or a pod is where it is (`autonodes explain`);
//! - [`join`]: what a joined Node still needs (labels, the registration taint gone);
//! - [`node_health`]: the Node conditions a claim keeps for node repair;
//! - [`access`]: which tenant namespaces may use a provider, and `--require-quota`;
//! - [`quota`]: tenant quotas (NodeQuota): the types a namespace may claim, its limits;
//! - [`capi`]: the `capi.autonodes.io` mirror (replicas both ways, MachinePool, Machines);
//! - [`kubeconfig`]: the check of kubeconfig Secrets;
//! - [`kubeversion`]: the tenant's Kubernetes version and the kubeadm API it implies;
//! - [`orphans`]: which objects belong to no claim any more;
//! - [`pod_requests`]: what a pod asks of its node, as the kube-scheduler counts it;
//! - [`vcluster`]: a vCluster's `vcluster.yaml` (`privateNodes.autoNodes`) as NodePools;
//! - [`yaml`]: YAML in and out, bounded for untrusted text;
//! - [`shards`]: which replica serves which tenant namespace (member Leases, rendezvous
//!   hashing, the wait before a namespace changes hands);
//! - [`zones`]: the zone a claim's node goes to.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]
// Documented for the workspace's developers (`cargo doc --document-private-items`): public
// items may name the private helpers they are made of.
#![allow(rustdoc::private_intra_doc_links)]

pub mod access;
pub mod address_policy;
pub mod address_pool;
pub mod capi;
pub mod catalogue;
pub mod claim;
pub mod explain;
pub mod host_capacity;
pub mod host_maintenance;
pub mod join;
pub mod kubeconfig;
pub mod kubelet_args;
pub mod kubeversion;
pub mod ledger;
pub mod names;
pub mod node_config;
pub mod node_health;
pub mod orphans;
pub mod pod_requests;
pub mod pool;
pub mod properties;
pub mod quota;
pub mod render;
pub mod requirements;
pub mod resources;
pub mod scheduling;
pub mod shards;
pub mod template;
pub mod throttle;
pub mod userdata;
pub mod vcluster;
pub mod warm;
pub mod yaml;
pub mod zones;

#[cfg(test)]
mod schema_walk;

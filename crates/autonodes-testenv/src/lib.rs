//! Everything the tests and the playground run beside the controller, never part of its
//! image:
//! - [`testenv`]: real etcd, kube-apiserver and kube-scheduler processes, each recorded so
//!   the test command can check that none outlives the tests;
//! - [`simulator`]: KubeVirt, CDI and the guests' kubelets, played on a host cluster
//!   (`autonodes-dev simulate`), and our KubeVirt test CRDs;
//! - [`playground`]: management, host and tenant clusters wired like a real installation;
//! - [`kubeadm_tenant`]: a tenant API server prepared as a kubeadm control plane, for real
//!   kubelets to join;
//! - [`download_mirror`]: dl.k8s.io's layout on loopback, for stock guests to install from;
//! - [`workloads`]: node types and pending pods in the shape of Karpenter's scheduling
//!   benchmark, and what the real kube-scheduler makes of packed nodes;
//! - [`qemu`]: real guests (QEMU, with KVM where it can boot them, else TCG) from the images `scripts/guest-image.sh` builds,
//!   with a NoCloud seed as KubeVirt makes it.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]
// Documented for the workspace's developers (`cargo doc --document-private-items`): public
// items may name the private helpers they are made of.
#![allow(rustdoc::private_intra_doc_links)]

use autonodes_api::kubevirt;
#[cfg(test)]
use autonodes_core::userdata;

pub mod download_mirror;
pub mod kubeadm_tenant;
pub mod playground;
pub mod qemu;
pub mod simulator;
pub mod testenv;
pub mod workloads;

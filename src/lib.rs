//! autonodes: KubeVirt virtual machines as worker nodes for tenant clusters.
//!
//! The crate is split the way the design reads:
//! - pure core, no I/O: [`api`] (the CRD types), [`template`] (VirtualMachine composition),
//!   [`scheduling`] (properties, requirements, cost, capacity, type choice),
//!   [`userdata`] (cloud-init rendering), [`kubeconfig`] (the check of kubeconfig Secrets),
//!   [`names`] (names and label values derived from user names, made to fit),
//!   [`orphans`] (which objects belong to no claim any more);
//! - [`crdgen`] writes `crds/`;
//! - [`testenv`] starts real etcd and kube-apiserver processes (tests and `autonodes dev`).
#![forbid(unsafe_code)]

pub mod api;
pub mod cli;
pub mod clients;
pub mod conditions;
pub mod controller;
pub mod crdgen;
pub mod dev;
pub mod kubeconfig;
pub mod kubevirt;
pub mod leader;
pub mod metrics;
pub mod names;
pub mod orphans;
pub mod render;
pub mod resources;
pub mod run;
pub mod scheduling;
pub mod server;
pub mod simulator;
pub mod template;
pub mod testenv;
pub mod userdata;

//! autonodes, the controller: the only code that talks to clusters.
//!
//! - [`controller`]: the controllers (provider, node type, claim, pool, Cluster-API mirror),
//!   remote watches, gauges, lenient watches;
//! - [`clients`]: the one place that builds and caches clients for host and tenant clusters;
//! - [`run`], [`leader`], [`server`], [`metrics`]: `autonodes run`;
//! - [`render`], [`cli`]: the other subcommands.
//!
//! The types and the pure core live in their own crates, re-exported here under the names
//! the controller's code uses: [`api`], [`conditions`], [`kubevirt`], [`crdgen`] from
//! `autonodes-api`; [`names`], [`resources`], [`scheduling`], [`template`], [`userdata`],
//! [`orphans`], [`kubeconfig`] from `autonodes-core`.
#![forbid(unsafe_code)]

pub use autonodes_api as api;
pub use autonodes_api::{conditions, crdgen, kubevirt};
pub use autonodes_core::{
    host_capacity, join, kubeconfig, kubeversion, ledger, names, orphans, quota, resources,
    scheduling, template, userdata, vcluster, yaml, zones,
};

pub mod cli;
pub mod controller;
pub mod import_vcluster;
pub mod leader;
pub mod metrics;
pub mod metrics_auth;
pub mod metrics_tls;
pub mod remote;
pub mod render;
pub mod run;
pub mod server;

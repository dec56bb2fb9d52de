//! autonodes, the controller: the only code that talks to clusters.
//!
//! - [`controller`]: the controllers (provider, node type, claim, pool, Cluster-API mirror,
//!   vCluster import), each wiring itself; the context they share; the generic reconcile
//!   wrapper; the one watch and store per kind;
//! - [`remote`]: everything that talks to host and tenant clusters (clients and their
//!   egress rules, watch caches, the calls a claim makes on its host and tenant);
//! - [`run`], [`leader`], [`server`], [`metrics`], [`metrics_auth`], [`metrics_tls`]:
//!   `autonodes run`;
//! - [`render`], [`vcluster_import`], [`explain`], [`cli`]: the other subcommands.
//!
//! The types live in `autonodes-api` and every decision in the pure `autonodes-core`; the
//! controller names them by those names.
#![forbid(unsafe_code)]
// What the binary, the tests and the other crates do not name is `pub(crate)`.
#![warn(unreachable_pub)]
// The crate documents itself for its developers (`cargo doc --document-private-items`):
// its public modules name the private stages and helpers they are made of.
#![allow(rustdoc::private_intra_doc_links)]

pub mod cli;
pub mod controller;
pub(crate) mod explain;
pub mod leader;
pub(crate) mod membership;
pub mod metrics;
pub mod metrics_auth;
pub(crate) mod metrics_tls;
pub(crate) mod random;
pub mod remote;
pub mod render;
pub mod run;
pub(crate) mod server;
pub(crate) mod vcluster_import;

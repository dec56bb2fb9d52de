//! Everything that talks to host and tenant clusters: the clients and their safety
//! ([`clients`], [`egress`], [`budget`], [`request_metrics`]), the watch caches ([`caches`],
//! [`watches`]), the calls a claim makes on its host ([`host`]) and its tenant
//! ([`tenant`]) with their shared helpers ([`calls`]), and the room on host nodes
//! ([`host_room`]).

pub(crate) mod api;
pub(crate) mod budget;
pub(crate) mod caches;
pub(crate) mod calls;
pub mod clients;
pub mod egress;
pub(crate) mod error;
pub(crate) mod host;
pub(crate) mod host_room;
#[cfg(test)]
pub(crate) mod memory;
pub(crate) mod request_metrics;
pub(crate) mod tenant;
pub(crate) mod warm_host;
pub(crate) mod watches;

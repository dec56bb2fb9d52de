//! Everything that talks to host and tenant clusters: the clients and their safety
//! ([`clients`], [`egress`], [`budget`], [`request_metrics`]), the watch caches ([`watched`],
//! [`watches`]), the calls a claim makes on its host ([`host`]) and its tenant
//! ([`tenant`]) with their shared helpers ([`calls`]), and the room on host nodes
//! ([`host_room`]).

pub mod api;
pub mod budget;
pub mod calls;
pub mod clients;
pub mod egress;
pub mod error;
pub mod host;
pub mod host_room;
#[cfg(test)]
pub mod memory;
pub mod request_metrics;
pub mod tenant;
pub mod warm;
pub mod watched;
pub mod watches;

//! What this process keeps in memory beside the stores, shared by the controllers: the
//! capacity ledger, the claims it expects the store to show, the prepared catalogue, the
//! warm VMs of each type, the vCluster imports' problems and each tenant's published join
//! address. Each is locked briefly, never across an await.

pub(crate) mod warm_vms;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use autonodes_core::ledger::ClaimedLedger;
use autonodes_core::pool::expectations::ClaimExpectations;

use crate::remote::tenant::PublishedJoins;
use warm_vms::WarmIndex;

/// A prepared catalogue and the versions of the type and provider stores it came from.
pub(crate) type PreparedCatalogue = ((u64, u64), Arc<autonodes_core::catalogue::Catalogue>);

/// The in-memory indexes the controllers share.
#[derive(Default)]
pub(crate) struct Indexes {
    /// The claimed capacity per NodeType, kept up to date by the claim store's watch
    /// (before the stores are synced) and by this process's scheduling decisions and
    /// releases ([`crate::controller::context::Context::ledger`]).
    pub claimed: Arc<Mutex<ClaimedLedger>>,
    /// Claims this process created, deleted or annotated that the claim store does not show
    /// yet ([`crate::controller::context::Context::claims_in`]).
    pub expected_claims: Mutex<ClaimExpectations>,
    /// The catalogue as last prepared, and the versions of the type and provider stores it
    /// was prepared from ([`crate::controller::catalogue::catalogue`]).
    pub catalogue: Mutex<Option<PreparedCatalogue>>,
    /// Each node type's warm VMs as last seen ([`crate::controller::nodetype::warm_pool`]).
    pub warm: WarmIndex,
    /// Per vCluster (`<namespace>/<name>`) and imported pool name, why its configuration
    /// could not be imported for that pool ([`crate::controller::vcluster_import`]); read by
    /// the pool controller for the pools' `VClusterConfig` condition.
    pub import_problems: Mutex<HashMap<String, BTreeMap<String, String>>>,
    /// Each tenant's published join address and version, and when they were read.
    pub published_joins: PublishedJoins,
}

impl Indexes {
    /// Empty indexes around the capacity `ledger` (which the claim store's watch already
    /// feeds).
    pub(crate) fn with_ledger(claimed: Arc<Mutex<ClaimedLedger>>) -> Self {
        Indexes {
            claimed,
            ..Default::default()
        }
    }
}

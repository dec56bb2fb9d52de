//! The catalogue every controller schedules from and the one count of claimed capacity,
//! both read from the shared stores (no API call): the node types as prepared for
//! scheduling — types whose provider cannot be used marked as problems — prepared once per
//! change of the NodeType and NodeProvider stores.

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;

use crate::controller::context::Context;
use autonodes_api::conditions;
use autonodes_api::{NodeProvider, NodeType, ProviderPhase};
use autonodes_core::catalogue::{Catalogue, ProviderContext};

/// The catalogue of every NodeType, with types whose provider cannot be used marked as
/// problems. It is prepared once per change of the NodeTypes or NodeProviders (every
/// reconcile of every claim reads it; preparing it parses every type's template).
pub(crate) fn catalogue(ctx: &Context) -> Arc<Catalogue> {
    let version = (
        ctx.reflectors.types.changes(),
        ctx.reflectors.providers.changes(),
    );
    if let Ok(cached) = ctx.index.catalogue.lock() {
        if let Some((v, c)) = cached.as_ref() {
            if *v == version {
                return c.clone();
            }
        }
    }
    let prepared = Arc::new(prepare_catalogue(ctx));
    if let Ok(mut cached) = ctx.index.catalogue.lock() {
        *cached = Some((version, prepared.clone()));
    }
    prepared
}

/// Prepares the catalogue from the NodeType and NodeProvider stores.
fn prepare_catalogue(ctx: &Context) -> Catalogue {
    let types = ctx.types().state();
    Catalogue::new(
        types
            .iter()
            .filter(|t| t.metadata.deletion_timestamp.is_none())
            .map(|t| {
                let provider = provider_of(ctx, t);
                let pctx = provider.as_deref().map(ProviderContext::from_provider);
                // A type's instance type was read from the host by its controller, which
                // wrote the resources into its status.
                let read = t
                    .status
                    .as_ref()
                    .map(|s| &s.resources)
                    .filter(|r| r.contains_key("cpu") && r.contains_key("memory"))
                    .ok_or("not read from the host yet");
                let mut prepared = autonodes_core::catalogue::prepare_type_with(
                    &t.name_any(),
                    &t.spec,
                    pctx.as_ref(),
                    read,
                );
                if prepared.problem.is_none() {
                    if let Some(message) = unusable(t, provider.as_deref()) {
                        prepared.problem =
                            Some(autonodes_core::catalogue::TypeProblem::ProviderNotReady {
                                node_type: t.name_any(),
                                message,
                            });
                    }
                }
                prepared
            })
            .collect(),
    )
}

/// Claims per NodeType that hold capacity, by the one rule ([`autonodes_core::catalogue::count_claimed`]),
/// with this process's reservations: the ledger's counts ([`autonodes_core::ledger`]).
pub(crate) fn claimed_counts(ctx: &Context) -> BTreeMap<String, i64> {
    ctx.ledger(|l| l.counts().clone())
}

/// The provider of a type, if it exists.
pub(crate) fn provider_of(ctx: &Context, t: &NodeType) -> Option<Arc<NodeProvider>> {
    ctx.providers().get(&ObjectRef::new(&t.spec.provider_ref))
}

/// Why a type's provider cannot take claims, if it cannot (the type then reports
/// `ProviderNotReady` with this message, or `ProviderNotFound` from its evaluation).
pub(crate) fn unusable(t: &NodeType, provider: Option<&NodeProvider>) -> Option<String> {
    let name = t.name_any();
    let Some(p) = provider else {
        return Some(format!(
            "NodeProvider {} of node type {name} does not exist",
            t.spec.provider_ref
        ));
    };
    if p.metadata.deletion_timestamp.is_some() {
        return Some(format!("NodeProvider {} is being deleted", p.name_any()));
    }
    match p.status.as_ref().and_then(|s| s.phase) {
        Some(ProviderPhase::Available) => None,
        _ => {
            let why = p
                .status
                .as_ref()
                .and_then(|s| conditions::get(&s.conditions, super::provider::READY))
                .map(|c| format!("{}: {}", c.reason, c.message))
                .unwrap_or_else(|| "not checked yet".into());
            Some(format!(
                "NodeProvider {} is not ready ({why})",
                p.name_any()
            ))
        }
    }
}

/// Every NodeQuota in the store, prepared (what claim scheduling and pools' claim room
/// check against).
pub(crate) fn prepared_quotas(ctx: &Context) -> Vec<autonodes_core::quota::PreparedQuota> {
    ctx.quotas()
        .state()
        .iter()
        .map(|q| autonodes_core::quota::PreparedQuota::new(&q.name_any(), &q.spec))
        .collect()
}

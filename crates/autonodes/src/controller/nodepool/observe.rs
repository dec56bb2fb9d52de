//! What one reconcile of a pool reads: the namespace's claims from the shared claim store
//! (with this process's writes the store does not show yet; no LIST), whether the pool's
//! template and tenant can be used, and a dynamic pool's tenant pods, nodes and DaemonSets
//! (from the tenant's watch caches; no LIST either).

use std::collections::BTreeMap;
use std::sync::Arc;

use autonodes_core::access::{provider_admits, quota_admits, TenantNamespace};
use autonodes_core::pool::dynamic::Tenant;
use autonodes_core::pool::limits::holds_a_place;
use autonodes_core::pool::limits::{claim_room, ClaimRoom, NamespaceClaims};
use autonodes_core::pool::owned_by;
use autonodes_core::pool::plan::Verdict;
use autonodes_core::pool::reconcile::template_problem;
use autonodes_core::quota::nodes_limit;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;

use super::context::PoolContext;
use super::tenant;
use crate::controller::context::Context;
use autonodes_api::reasons::PoolReason;
use autonodes_api::{NodeClaim, NodePool, Overhead};

/// The pool's claims and the namespace's other claims.
pub(super) struct Claims {
    /// Claims the pool controls.
    pub mine: Vec<Arc<NodeClaim>>,
    /// The namespace's other claims.
    pub others: Vec<Arc<NodeClaim>>,
}

/// The claims of the pool with UID `uid` in `ns`, and the namespace's others, as they are
/// ([`Context::claims_in`]).
pub(super) fn claims(ctx: &Context, ns: &str, uid: &str) -> Claims {
    let (mine, others) = ctx
        .claims_in(ns)
        .into_iter()
        .partition(|c| owned_by(c, uid));
    Claims { mine, others }
}

/// How many claims the pool may create now: the batch, the controller's cap on claims per
/// namespace, and the `nodes` limit of the namespace's NodeQuotas, against the
/// namespace's claims that hold a place, those being deleted included (`claims`: the
/// pool's and the others').
pub(super) fn room(ctx: &Context, ns: &str, claims: &Claims) -> ClaimRoom {
    let quotas = crate::controller::catalogue::prepared_quotas(ctx);
    let live = claims
        .mine
        .iter()
        .chain(&claims.others)
        .filter(|c| holds_a_place(c))
        .count();
    claim_room(&NamespaceClaims {
        namespace: ns,
        live,
        max: ctx.config.max_claims_per_namespace,
        quota_nodes: nodes_limit(&quotas, ns),
        quota_missing: quota_admits(ctx.config.require_quota, &quotas, ns).is_err(),
    })
}

/// Why the pool cannot be worked on: its template (provider, requirements, labels), a
/// provider that does not serve its namespace, or —
/// for a static pool, which needs no tenant watch — a tenant that cannot be reached (its
/// claims would only wait: say so on the pool and leave them as they are).
pub(super) async fn problem(ctx: &Context, pool: &NodePool) -> Option<Verdict> {
    let problem = template_problem(&pool.spec, |p| {
        ctx.providers().get(&ObjectRef::new(p)).is_some()
    });
    if problem.is_some() {
        return problem;
    }
    let ns = pool.namespace().unwrap_or_default();
    if let Some(refused) = provider_refusal(ctx, pool, &ns).await {
        return Some(refused);
    }
    // A dynamic pool reads its tenant in `tenant`.
    pool.spec.replicas?;
    let e = ctx
        .clients
        .tenant(&ns, &pool.spec.v_cluster_ref.name)
        .await
        .err()?;
    Some(Verdict::problem(e.reason(), e.to_string()))
}

/// `ProviderNotAllowed` when the pool's `providerRef` names a provider that does not serve
/// the pool's namespace.
async fn provider_refusal(ctx: &Context, pool: &NodePool, ns: &str) -> Option<Verdict> {
    let provider = pool.spec.provider_ref.as_deref()?;
    let catalogue = crate::controller::catalogue::catalogue(ctx);
    let labels = crate::controller::access::namespace_labels(ctx, &catalogue, ns).await;
    let tenant = TenantNamespace {
        name: ns,
        labels: labels.as_ref(),
    };
    let refusal = catalogue
        .types()
        .iter()
        .filter(|t| t.provider == provider)
        .find_map(|t| provider_admits(t, &tenant).err())?;
    Some(Verdict::problem(
        PoolReason::ProviderNotAllowed,
        refusal.message,
    ))
}

/// What a dynamic pool reads of its tenant, and of the node types.
pub(super) struct TenantState {
    pods: Vec<Pod>,
    nodes: Vec<Node>,
    daemonsets: Vec<DaemonSet>,
    claimed: BTreeMap<String, i64>,
    overheads: BTreeMap<String, Overhead>,
}

impl TenantState {
    /// The tenant as the planner sees it, with the namespace's `others` claims and its
    /// NodePools.
    pub(super) fn view<'a>(
        &'a self,
        others: &'a [Arc<NodeClaim>],
        pools: &'a [Arc<NodePool>],
    ) -> Tenant<'a> {
        Tenant {
            pods: &self.pods,
            nodes: &self.nodes,
            others,
            claimed: &self.claimed,
            overheads: &self.overheads,
            daemonsets: &self.daemonsets,
            pools,
        }
    }
}

/// A dynamic pool's tenant (its watches started), or why it cannot be read.
pub(super) async fn tenant(pctx: &PoolContext, pool: &NodePool) -> Result<TenantState, Verdict> {
    let ctx = &pctx.ctx;
    let ns = pool.namespace().unwrap_or_default();
    let remote = ctx
        .clients
        .tenant(&ns, &pool.spec.v_cluster_ref.name)
        .await
        .map_err(|e| Verdict::problem(e.reason(), e.to_string()))?;
    let (pods, nodes, daemonsets) = tenant::objects(pctx, &remote).await?;
    let claimed = crate::controller::catalogue::claimed_counts(ctx);
    let overheads = ctx
        .types()
        .state()
        .iter()
        .filter_map(|t| Some((t.name_any(), t.spec.overhead.clone()?)))
        .collect();
    Ok(TenantState {
        pods,
        nodes,
        daemonsets,
        claimed,
        overheads,
    })
}

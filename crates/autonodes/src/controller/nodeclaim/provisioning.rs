//! What the stages of one reconcile of a scheduled claim share ([`Provisioning`]), what a
//! stage decides ([`Step`]), and the small helpers they have in common.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::runtime::controller::Action;
use kube::ResourceExt;

use super::status::StatusWriter;
use crate::controller::config::ControllerConfig;
use crate::controller::context::{now, Context, Wakes};
use crate::controller::error::Error;
use crate::controller::events::Events;
use crate::controller::index::warm_vms::WarmIndex;
use crate::metrics::Metrics;
use crate::remote::api::{HostApi, TenantApi};
use autonodes_api::reasons::ClaimReason;
use autonodes_api::NodeClaim;
use autonodes_core::catalogue::PreparedType;

/// What the stages read of the controllers' context, and nothing more: settings, the
/// counters they move, the Event recorder, the warm VMs claims take from, and the wake-ups
/// of node types.
#[derive(Clone, Copy)]
pub(crate) struct StageContext<'a> {
    /// Settings (timeouts, installation, where nodes download Kubernetes).
    pub config: &'a ControllerConfig,
    /// Counters the stages move (claims created, warm VMs taken).
    pub metrics: &'a Metrics,
    /// The Event recorder.
    pub events: &'a Events,
    /// The warm VMs claims take from.
    pub warm: &'a WarmIndex,
    /// Wakes other controllers (a node type whose warm VM was taken).
    pub wakes: &'a Wakes,
}

impl<'a> StageContext<'a> {
    /// What the stages read of `ctx`.
    pub(crate) fn of(ctx: &'a Context) -> Self {
        StageContext {
            config: &ctx.config,
            metrics: &ctx.metrics,
            events: &ctx.events,
            warm: &ctx.index.warm,
            wakes: &ctx.wakes,
        }
    }
}

/// One reconcile of a scheduled claim: what its stages read, and the status they change.
pub(crate) struct Provisioning<'a, H, T> {
    /// The claim as this reconcile saw it.
    pub claim: &'a NodeClaim,
    /// What the stages read of the controllers' context.
    pub ctx: StageContext<'a>,
    /// The node type the claim was scheduled to.
    pub node_type: &'a PreparedType,
    /// The tenant cluster.
    pub tenant: T,
    /// The host cluster.
    pub host: H,
    /// The host cluster's name.
    pub host_cluster: String,
    /// The VM's namespace on the host.
    pub vm_ns: String,
    /// The VM's name.
    pub vm_name: String,
    /// The claim's status as this reconcile changes it.
    pub status: StatusWriter<'a>,
    /// The claim's Node, once [`super::register`] found it.
    pub node: Option<Arc<Node>>,
    /// Look at the claim again within this long, whatever the last stage said (a stage
    /// that does not stop the walk but waits on something, as a live migration).
    pub soon: Option<Duration>,
}

impl<H: HostApi, T: TenantApi> Provisioning<'_, H, T> {
    /// The host cluster, as the stages use it.
    pub(crate) fn host(&self) -> &H {
        &self.host
    }

    /// The tenant cluster, as the stages use it.
    pub(crate) fn tenant(&self) -> &T {
        &self.tenant
    }

    /// Asks for the claim to be looked at again within `d`.
    pub(crate) fn soon(&mut self, d: Duration) {
        self.soon = Some(self.soon.map_or(d, |s| s.min(d)));
    }

    /// The provider ID the claim's Node carries.
    pub(crate) fn provider_id(&self) -> String {
        format!("kubevirt://{}", self.vm_name)
    }
}

/// What a stage decided.
#[derive(Debug)]
pub(crate) enum Step {
    /// The stage is done: the next one runs.
    Next,
    /// The walk stops here: the status is written and the claim comes back as `Action` says
    /// (or sooner, when a watch sees a change).
    Stop(Action),
    /// The claim failed for good (a timeout, its VM gone): it is marked Failed and its
    /// remote objects are removed.
    Fail {
        /// The condition reason.
        reason: ClaimReason,
        /// What happened.
        message: String,
    },
}

/// The claim's UID (the API server always sets it).
pub(crate) fn uid(claim: &NodeClaim) -> Result<String, Error> {
    claim
        .uid()
        .ok_or_else(|| Error::Missing(format!("NodeClaim {}", claim.name_any()), "metadata.uid"))
}

/// How long ago `since` was (zero for a time in the future).
pub(crate) fn elapsed_since(since: k8s_openapi::jiff::Timestamp) -> Duration {
    let ms = now().as_millisecond() - since.as_millisecond();
    Duration::from_millis(ms.max(0) as u64)
}

/// How long to wait for a stage with `limit` after `waited`: what is left, at most `cap`, at least half a second.
pub(crate) fn remaining(limit: Duration, waited: Duration, cap: Duration) -> Duration {
    limit
        .saturating_sub(waited)
        .min(cap)
        .max(Duration::from_millis(500))
}

//! Launch: a warm VM of the claim's type when one serves it ([`super::take_warm`]), else the
//! tenant's bootstrap token, the host's user-data Secret, the golden volumes its type
//! clones, and the VirtualMachine (each only created, never rewritten; a create that finds the object exists is an
//! earlier attempt's and is kept), and `Provisioned` once the VM runs — or the launch
//! timeout fails the claim.

use std::sync::Arc;
use std::time::Duration;

use kube::api::DynamicObject;
use kube::runtime::controller::Action;
use kube::ResourceExt;

use super::join::{claim_join, render_reason};
use super::provisioning::{elapsed_since, remaining, Provisioning, Step};
use super::status::{PROVISIONED, SCHEDULED};
use crate::controller::context::now;
use crate::controller::error::Error;
use crate::remote::api::{HostApi, TenantApi};
use crate::remote::clients::status_message;
use crate::remote::host::VmCreate;
use autonodes_api::kubevirt::ObservedVm;
use autonodes_api::reasons::ClaimReason;
use autonodes_api::NodeClaim;
use autonodes_core::catalogue::PreparedType;
use autonodes_core::render::{self, RenderError, RenderedNode};
use autonodes_core::userdata::JoinParams;

/// The launch stage.
pub(super) async fn launch<H: HostApi, T: TenantApi>(
    p: &mut Provisioning<'_, H, T>,
) -> Result<Step, Error> {
    let uid = p.claim.uid().unwrap_or_default();
    let vm = match p.host().vm(&p.vm_ns, &p.vm_name).await? {
        Some(vm) if !autonodes_core::template::names::labelled_for_claim(vm.labels(), &uid) => {
            return Ok(name_taken(p, "VirtualMachine"))
        }
        Some(vm) => {
            // A warm VM taken earlier whose binding is not written yet.
            if let Some(step) = super::take_warm::bind(p).await? {
                return Ok(step);
            }
            vm
        }
        None if p.status.was_true(PROVISIONED) => {
            // The VM vanished after it ran: the claim failed.
            return Ok(Step::Fail {
                reason: ClaimReason::VirtualMachineLost,
                message: format!(
                    "VirtualMachine {}/{} disappeared from {}",
                    p.vm_ns, p.vm_name, p.host_cluster
                ),
            });
        }
        None => match super::take_warm::serve(p).await? {
            super::take_warm::Served::Warm(vm) => vm,
            super::take_warm::Served::Stop(step) => return Ok(step),
            super::take_warm::Served::Cold => match create_host_objects(p).await? {
                Ok(vm) => vm,
                Err(step) => return Ok(step),
            },
        },
    };
    let vmi = p.host().vmi(&p.vm_ns, &p.vm_name).await?;
    let running = vm.ready() || vmi.as_deref().and_then(|i| i.phase()) == Some("Running");
    let (vm_ns, vm_name) = (&p.vm_ns, &p.vm_name);
    if !running {
        // Counted from the schedule, or from the last restart (`restart`) or power-on of a
        // VM that ran.
        let restarted = p.status.new.last_restart.as_ref().map(|r| r.time.0);
        let powered_on = (p.status.new.power == Some(autonodes_api::PowerState::Starting))
            .then(|| p.status.since(PROVISIONED))
            .flatten();
        let since = p.status.true_since(SCHEDULED).unwrap_or_else(now);
        let since = restarted.map_or(since, |r| r.max(since));
        let since = powered_on.map_or(since, |r| r.max(since));
        let waited = elapsed_since(since);
        let limit = p.ctx.config.launch_timeout;
        if waited > limit {
            return Ok(Step::Fail {
                reason: ClaimReason::LaunchTimeout,
                message: format!(
                    "VirtualMachine {vm_ns}/{vm_name} did not run within {}s",
                    limit.as_secs()
                ),
            });
        }
        let phase = vmi
            .as_deref()
            .and_then(|i| i.phase())
            .unwrap_or("none yet")
            .to_string();
        p.status.set(
            PROVISIONED,
            false,
            ClaimReason::Booting,
            format!(
                "VirtualMachine {vm_ns}/{vm_name} is not running yet (instance phase: {phase})"
            ),
        );
        return Ok(Step::Stop(Action::requeue(remaining(
            limit,
            waited,
            Duration::from_secs(30),
        ))));
    }
    if !p.status.is_true(PROVISIONED) {
        let ip = vmi
            .as_deref()
            .and_then(|i| i.ip())
            .map(|ip| format!(" at {ip}"))
            .unwrap_or_default();
        let warm = if p.status.new.warm.is_some() {
            " (a warm VM)"
        } else {
            ""
        };
        let message = format!("VirtualMachine {vm_ns}/{vm_name} runs{ip}{warm}");
        p.status
            .set(PROVISIONED, true, ClaimReason::Running, message);
    }
    Ok(Step::Next)
}

/// Creates the token, the user-data Secret and the VM; returns the VM, or the step to stop
/// at when the claim's input cannot become a VM.
async fn create_host_objects<H: HostApi, T: TenantApi>(
    p: &mut Provisioning<'_, H, T>,
) -> Result<Result<Arc<ObservedVm>, Step>, Error> {
    let (join, fresh) = match claim_join(p).await? {
        Ok(j) => j,
        Err(step) => return Ok(Err(step)),
    };
    let installation = p.ctx.config.installation.as_str();
    let rendered = match render_for(
        p.claim,
        p.node_type,
        &p.vm_name,
        &p.vm_ns,
        &join,
        installation,
    ) {
        Ok(r) => r,
        Err(e) => {
            p.status
                .set(PROVISIONED, false, render_reason(&e), e.to_string());
            return Ok(Err(Step::Stop(Action::requeue(Duration::from_secs(60)))));
        }
    };
    // A provider placing VMs per tenant: the tenant's host namespace first.
    if let Some(per_tenant) = &p.node_type.per_tenant {
        let labels = namespace_labels(p.claim, installation);
        let present = p
            .host()
            .ensure_namespace(&p.vm_ns, &labels, per_tenant.create)
            .await?;
        if !present {
            let message = format!(
                "the provider places this tenant's VMs in host namespace {} (vmNamespacePerTenant, policy Existing), which does not exist on {}",
                p.vm_ns, p.host_cluster
            );
            p.status.set(
                PROVISIONED,
                false,
                ClaimReason::VMNamespaceNotFound,
                message,
            );
            return Ok(Err(Step::Stop(Action::requeue(Duration::from_secs(30)))));
        }
    }
    // The Secret before the VM, which names it. An existing one is an earlier attempt's:
    // it is kept with the token it carries — unless that token was replaced since (the
    // launch retried for longer than its life), when it is rewritten with the new one.
    // Another claim's Secret of that name is left alone.
    let ours = p
        .host()
        .create_user_data(&p.vm_ns, &rendered.secret, fresh)
        .await?;
    if !ours {
        return Ok(Err(name_taken(p, "user-data Secret")));
    }
    // The golden volumes the VM's disks clone, before the VM (a cache hit once made).
    for golden in &p.node_type.golden {
        p.host()
            .ensure_golden_volume(golden, &p.node_type.provider)
            .await?;
    }
    let vm_obj: DynamicObject = serde_json::from_value(rendered.vm)
        .map_err(|e| Error::Internal(format!("rendered VM is not an object: {e}")))?;
    let created = p.host().create_vm(&p.vm_ns, &vm_obj).await;
    let (vm_ns, vm_name, host_cluster) = (&p.vm_ns, &p.vm_name, &p.host_cluster);
    match created {
        Ok(VmCreate::Created(vm)) => {
            let [ns, pool, _] = crate::metrics::claim_labels(p.claim);
            p.ctx
                .metrics
                .nodeclaims_created
                .with_label_values(&[&ns, &pool, &p.node_type.name])
                .inc();
            tracing::info!(nodeclaim = %p.claim.name_any(), namespace = %p.claim.namespace().unwrap_or_default(), vm = %format!("{vm_ns}/{vm_name}"), cluster = %host_cluster, "created VirtualMachine");
            Ok(Ok(vm))
        }
        Ok(VmCreate::Existed(vm)) => Ok(Ok(vm)),
        Ok(VmCreate::Vanished) => Ok(Err(Step::Stop(Action::requeue(Duration::from_secs(1))))),
        Ok(VmCreate::Taken) => Ok(Err(name_taken(p, "VirtualMachine"))),
        // The API server refused the VM (e.g. an invalid template for this host).
        Err(e) if matches!(e.status_code(), Some(422 | 400)) => {
            let why = e.status().map(status_message).unwrap_or_default();
            p.status.set(
                PROVISIONED,
                false,
                ClaimReason::VirtualMachineRejected,
                format!("{host_cluster} rejected the VirtualMachine: {why}"),
            );
            Ok(Err(Step::Stop(Action::requeue(Duration::from_secs(60)))))
        }
        Err(e) => Err(e.into()),
    }
}

/// The labels of a host namespace autonodes creates for the VMs of a claim's tenant
/// namespace: managed by autonodes, this installation's, and the tenant namespace's.
pub(crate) fn namespace_labels(
    claim: &NodeClaim,
    installation: &str,
) -> std::collections::BTreeMap<String, String> {
    use autonodes_core::names::label_value;
    [
        (
            autonodes_api::LABEL_MANAGED_BY.to_string(),
            autonodes_api::MANAGED_BY.to_string(),
        ),
        (
            autonodes_api::LABEL_INSTALLATION.to_string(),
            label_value(installation),
        ),
        (
            autonodes_api::LABEL_NODECLAIM_NAMESPACE.to_string(),
            label_value(&claim.namespace().unwrap_or_default()),
        ),
    ]
    .into()
}

/// `Provisioned=False` with `NameTaken`: a host object of the claim's VM name (`what`)
/// belongs to another claim or installation; autonodes leaves it alone and looks again.
fn name_taken<H: HostApi, T: TenantApi>(p: &mut Provisioning<'_, H, T>, what: &str) -> Step {
    let message = format!(
        "a {what} named after VM {}/{} exists on {} and belongs to another claim or installation; it is left alone",
        p.vm_ns, p.vm_name, p.host_cluster
    );
    p.status
        .set(PROVISIONED, false, ClaimReason::NameTaken, message);
    Step::Stop(Action::requeue(Duration::from_secs(60)))
}

/// Renders the claim's Secret and VM for its type (the Node gets the claim's identity
/// labels, so tenant Node events find the claim).
// The core's render functions return this error as it is; it is rare and ends in a
// condition at once.
#[allow(clippy::result_large_err)]
pub(super) fn render_for(
    claim: &NodeClaim,
    t: &PreparedType,
    vm_name: &str,
    vm_ns: &str,
    join: &JoinParams,
    installation: &str,
) -> Result<RenderedNode, RenderError> {
    let mut t = t.clone();
    t.vm_namespace = vm_ns.to_string();
    render::render_node(&t, claim, None, vm_name, join, installation)
}

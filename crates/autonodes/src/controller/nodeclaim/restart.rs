//! Restart: a new value of the claim's `autonodes.io/restart` annotation (set by node repair,
//! or by hand) restarts its VM once — its VirtualMachineInstance is deleted and KubeVirt
//! starts a new one — and `status.lastRestart` records which value was carried out, and when.

use kube::runtime::events::EventType;
use kube::ResourceExt;

use super::provisioning::Provisioning;
use super::status::PROVISIONED;
use crate::controller::context::now;
use crate::controller::error::Error;
use crate::remote::api::{HostApi, TenantApi};
use autonodes_api::{Restart, ANNOTATION_RESTART};
use autonodes_core::pool::repair::restart_value;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// The restart stage (before launch: the launch stage then waits for the new instance,
/// its timeout counted from the restart).
pub(super) async fn restart<H: HostApi, T: TenantApi>(
    p: &mut Provisioning<'_, H, T>,
) -> Result<(), Error> {
    let Some(asked) = p.claim.annotations().get(ANNOTATION_RESTART) else {
        return Ok(());
    };
    let value = restart_value(asked);
    let done = p.status.new.last_restart.as_ref();
    if done.is_some_and(|r| r.requested == value) {
        return Ok(());
    }
    // A VM that never ran has nothing to restart; the value is recorded all the same.
    if p.status.was_true(PROVISIONED) {
        let vmi = p.host().vmi(&p.vm_ns, &p.vm_name).await?;
        if let Some(vmi) = vmi {
            p.host()
                .delete_vmi(&p.vm_ns, &p.vm_name, vmi.metadata.uid.clone())
                .await?;
        }
        let (ns, name) = (&p.vm_ns, &p.vm_name);
        tracing::info!(nodeclaim = %p.claim.name_any(), vm = %format!("{ns}/{name}"), "restarting the VM");
        p.ctx
            .events
            .record(
                p.claim,
                EventType::Normal,
                "VirtualMachineRestarted",
                "Restart",
                format!("restarting VirtualMachine {ns}/{name} (deleted its instance; KubeVirt starts a new one)"),
            )
            .await;
    }
    p.status.new.last_restart = Some(Restart {
        requested: value,
        time: Time(now()),
    });
    Ok(())
}

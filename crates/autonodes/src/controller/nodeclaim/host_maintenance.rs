//! Host maintenance: the claim's VM runs on a host node being drained (cordoned, or named
//! by KubeVirt as the node the VM must leave). What happens is decided in the core
//! ([`autonodes_core::host_maintenance::assess`]); this stage records the host node the VM
//! runs on (`status.hostNode`), asks KubeVirt for a live migration when the VM can move (a
//! VirtualMachineInstanceMigration owned by the VM, deleted once the move ended), and sets
//! `HostMaintenance`: True while the VM migrates (`Migrating`) or its pool must replace the
//! node (`HostDraining`, `MigrationFailed`), False (`Migrated`) once it moved. It never
//! stops the walk: the node keeps serving while its VM moves.

use std::time::Duration;

use kube::ResourceExt;

use super::provisioning::Provisioning;
use super::status::HOST_MAINTENANCE;
use crate::controller::error::Error;
use crate::remote::api::{HostApi, TenantApi};
use autonodes_api::conditions;
use autonodes_api::reasons::ClaimReason;
use autonodes_core::host_maintenance::{assess, message_host, migration_name, Maintenance};

/// How soon a claim whose VM migrates, or whose migration could not be asked for, is
/// looked at again (its instance's watch wakes it sooner when the migration ends).
pub(super) const MIGRATION_RECHECK: Duration = Duration::from_secs(15);

/// The host maintenance stage (after launch: the VM runs).
pub(super) async fn host_maintenance<H: HostApi, T: TenantApi>(
    p: &mut Provisioning<'_, H, T>,
) -> Result<(), Error> {
    let Some(vmi) = p.host().vmi(&p.vm_ns, &p.vm_name).await? else {
        return Ok(());
    };
    if vmi.status.node_name.is_some() {
        p.status.new.host_node = vmi.status.node_name.clone();
    }
    let previous = conditions::get(&p.status.new.conditions, HOST_MAINTENANCE);
    let previous_reason = previous.and_then(|c| ClaimReason::parse(&c.reason));
    let previous_from = previous
        .and_then(|c| message_host(&c.message))
        .map(str::to_string);
    let host = p.host();
    let mut verdict = assess(
        &vmi,
        |n| host.host_node_cordoned(n),
        previous_reason,
        previous_from.as_deref(),
    );
    let [ns, pool, _] = crate::metrics::claim_labels(p.claim);
    let count = |result: &str| {
        p.ctx
            .metrics
            .vm_migrations
            .with_label_values(&[&ns, &pool, result])
            .inc()
    };
    let claim = p.claim.name_any();
    match &verdict {
        Maintenance::Migrate { from } => {
            let from = from.clone();
            let name = migration_name(&p.vm_name, &from);
            match ask_migration(p, &name).await {
                Ok(()) => {
                    if previous_reason != Some(ClaimReason::Migrating) {
                        count("started");
                        tracing::info!(nodeclaim = %claim, vm = %p.vm_name, host_node = %from, migration = %name, "host node drained: live-migrating the VM");
                    }
                    p.soon(MIGRATION_RECHECK);
                }
                // Not allowed, not served (no such kind), or refused: the pool replaces it.
                Err(e) if matches!(e.status_code(), Some(400 | 401 | 403 | 404 | 422)) => {
                    tracing::warn!(nodeclaim = %claim, error = %e, "could not ask for a live migration; the node is replaced instead");
                    verdict = Maintenance::Replace {
                        from,
                        why: format!("asking KubeVirt to migrate it failed: {e}"),
                    };
                }
                Err(e) => {
                    tracing::warn!(nodeclaim = %claim, error = %e, "asking for a live migration failed; retrying");
                    p.soon(MIGRATION_RECHECK);
                }
            }
        }
        Maintenance::Migrating { .. } => p.soon(MIGRATION_RECHECK),
        Maintenance::Migrated { from, to }
            if previous_reason != Some(ClaimReason::Migrated)
                || previous_from.as_deref() != Some(from.as_str()) =>
        {
            count("succeeded");
            tracing::info!(nodeclaim = %claim, vm = %p.vm_name, from = %from, to = %to, "VM live-migrated");
            let from = from.clone();
            forget_migration(p, &from).await;
        }
        Maintenance::Failed { from, why }
            if previous_reason != Some(ClaimReason::MigrationFailed) =>
        {
            count("failed");
            tracing::warn!(nodeclaim = %claim, vm = %p.vm_name, host_node = %from, %why, "live migration failed; the node is replaced");
            let from = from.clone();
            forget_migration(p, &from).await;
        }
        _ => {}
    }
    let migrating = matches!(
        verdict,
        Maintenance::Migrate { .. } | Maintenance::Migrating { .. }
    );
    super::power::running(p, migrating);
    match verdict.condition() {
        Some((ok, reason, message)) => p.status.set(HOST_MAINTENANCE, ok, reason, message),
        None if verdict == Maintenance::None => p.status.remove(HOST_MAINTENANCE),
        None => {}
    }
    Ok(())
}

/// Asks for the migration `name` of the claim's VM, owned by the VM and labelled as it is.
async fn ask_migration<H: HostApi, T: TenantApi>(
    p: &Provisioning<'_, H, T>,
    name: &str,
) -> Result<(), crate::remote::error::Error> {
    let Some(vm) = p.host().vm(&p.vm_ns, &p.vm_name).await? else {
        return Ok(());
    };
    let uid = vm.metadata.uid.clone().unwrap_or_default();
    let labels = vm.metadata.labels.clone().unwrap_or_default();
    p.host()
        .migrate(&p.vm_ns, &p.vm_name, &uid, name, &labels)
        .await
}

/// Deletes the migration off `from` once it ended (it would go with the VM anyway; gone
/// now, a later drain of the same host node can ask again).
async fn forget_migration<H: HostApi, T: TenantApi>(p: &Provisioning<'_, H, T>, from: &str) {
    let name = migration_name(&p.vm_name, from);
    if let Err(e) = p.host().delete_migration(&p.vm_ns, &name).await {
        tracing::debug!(migration = %name, error = %e, "deleting a finished migration failed; it goes with its VM");
    }
}

//! Host maintenance: what becomes of a claim's VM when the host node it runs on is drained.
//! Pure: the controller hands in what its caches say of the VM's instance and of host
//! nodes, and the claim's `HostMaintenance` condition as it stands; [`assess`] says what the
//! condition becomes and whether a live migration is to be asked for.
//!
//! A VM has to leave its host node when that node is cordoned (`spec.unschedulable`, the
//! first step of `kubectl drain` and of every node upgrade tool), or when KubeVirt names it
//! in the instance's `status.evacuationNodeName` (an eviction of its launcher pod). Then:
//! - a VM KubeVirt can live-migrate — eviction strategy `LiveMigrate` or
//!   `LiveMigrateIfPossible`, and its `LiveMigratable` condition True — is migrated: autonodes
//!   asks for a migration (a VirtualMachineInstanceMigration) unless KubeVirt runs one already;
//!   its tenant Node stays as it is;
//! - any other VM (strategy `None` or `External`, or disks that cannot move), and one whose
//!   migration failed, is replaced by its pool: a new node first, the old one drained once the
//!   new one is Ready, within the pool's disruption budgets for `HostMaintenance`
//!   ([`crate::pool::plan`]).
//!
//! Once the VM left (its instance's last migration completed), the condition turns False with
//! reason `Migrated`, naming both host nodes, and stays so as the record of the move (also of
//! a migration someone else asked for). A host node uncordoned before the VM left ends the
//! maintenance: the condition goes.

use autonodes_api::kubevirt::{ObservedVmi, LIVE_MIGRATABLE};
use autonodes_api::reasons::ClaimReason;

/// The eviction strategies under which KubeVirt live-migrates a VM off a drained node.
pub const MIGRATING_STRATEGIES: [&str; 2] = ["LiveMigrate", "LiveMigrateIfPossible"];

/// What the claim's `HostMaintenance` condition becomes, and what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Maintenance {
    /// Nothing to do, and no condition (the VM's host node is not being drained).
    None,
    /// Keep the condition as it is (the record of an earlier move).
    Unchanged,
    /// Ask KubeVirt to live-migrate the VM off `from` (create a migration), and say
    /// `Migrating`.
    Migrate {
        /// The host node the VM leaves.
        from: String,
    },
    /// A migration off `from` runs (`HostMaintenance=True`, `Migrating`); `to` is its
    /// target once KubeVirt chose one.
    Migrating {
        /// The host node the VM leaves.
        from: String,
        /// Where it goes.
        to: Option<String>,
    },
    /// The VM was live-migrated from `from` to `to` (`HostMaintenance=False`, `Migrated`).
    Migrated {
        /// The host node it left.
        from: String,
        /// The host node it runs on now.
        to: String,
    },
    /// The VM must leave `from` and cannot live-migrate (`HostMaintenance=True`,
    /// `HostDraining`): its pool replaces the node.
    Replace {
        /// The host node it must leave.
        from: String,
        /// Why it cannot live-migrate.
        why: String,
    },
    /// The VM's migration off `from` failed (`HostMaintenance=True`, `MigrationFailed`):
    /// its pool replaces the node.
    Failed {
        /// The host node it must leave.
        from: String,
        /// Why the migration failed, as KubeVirt says.
        why: String,
    },
}

impl Maintenance {
    /// The condition it sets: status True or False, reason and message; `None` for
    /// [`Maintenance::None`] and [`Maintenance::Unchanged`].
    pub fn condition(&self) -> Option<(bool, ClaimReason, String)> {
        Some(match self {
            Maintenance::None | Maintenance::Unchanged => return None,
            Maintenance::Migrate { from } | Maintenance::Migrating { from, to: None } => (
                true,
                ClaimReason::Migrating,
                format!("host node {from} is being drained; the VM is being live-migrated off it"),
            ),
            Maintenance::Migrating { from, to: Some(to) } => (
                true,
                ClaimReason::Migrating,
                format!("host node {from} is being drained; the VM is being live-migrated to {to}"),
            ),
            Maintenance::Migrated { from, to } => (
                false,
                ClaimReason::Migrated,
                format!("the VM was live-migrated from host node {from} to {to}"),
            ),
            Maintenance::Replace { from, why } => (
                true,
                ClaimReason::HostDraining,
                format!("host node {from} is being drained and the VM cannot live-migrate ({why}); its pool replaces the node, a new one first"),
            ),
            Maintenance::Failed { from, why } => (
                true,
                ClaimReason::MigrationFailed,
                format!("host node {from} is being drained and the VM's live migration failed ({why}); its pool replaces the node, a new one first"),
            ),
        })
    }
}

/// Whether a claim's `HostMaintenance` condition (its status and reason) asks its pool to
/// replace it: True with `HostDraining` or `MigrationFailed`.
pub fn needs_replacement(status_true: bool, reason: &str) -> bool {
    status_true
        && (reason == ClaimReason::HostDraining.as_str()
            || reason == ClaimReason::MigrationFailed.as_str())
}

/// What becomes of the claim's VM, from its instance `vmi`, whether a host node is
/// cordoned (`cordoned`), and the reason of the claim's `HostMaintenance` condition now
/// (`previous`) with the host node its message names (`previous_from`).
pub fn assess(
    vmi: &ObservedVmi,
    cordoned: impl Fn(&str) -> bool,
    previous: Option<ClaimReason>,
    previous_from: Option<&str>,
) -> Maintenance {
    let status = &vmi.status;
    let host = status.node_name.as_deref();
    let migration = status.migration_state.as_ref();
    let evacuation = status.evacuation_node_name.as_deref();
    let leaving = evacuation.or(host.filter(|h| cordoned(h)));
    // A migration KubeVirt runs, whoever asked for it.
    if let Some(m) = migration.filter(|m| m.in_progress()) {
        if let Some(from) = m.source_node.clone() {
            return Maintenance::Migrating {
                from,
                to: m.target_node.clone(),
            };
        }
    }
    let Some(from) = leaving else {
        // Not being drained: a completed migration is recorded (whoever asked for it: the
        // claim may not have written `Migrating` before it ended); an earlier record stays;
        // anything else ends.
        if let Some(m) = migration.filter(|m| m.completed == Some(true)) {
            if let (Some(from), Some(to)) = (m.source_node.clone(), host) {
                if from != to {
                    return Maintenance::Migrated {
                        from,
                        to: to.to_string(),
                    };
                }
            }
        }
        return match previous {
            None | Some(ClaimReason::Migrated) => Maintenance::Unchanged,
            Some(_) => Maintenance::None,
        };
    };
    let from = from.to_string();
    let failed = migration
        .filter(|m| m.failed == Some(true) && m.source_node.as_deref() == Some(from.as_str()));
    if let Some(m) = failed {
        let why = m
            .failure_reason
            .clone()
            .filter(|r| !r.is_empty())
            .unwrap_or_else(|| "no reason given".to_string());
        return Maintenance::Failed { from, why };
    }
    if previous == Some(ClaimReason::MigrationFailed) && previous_from == Some(from.as_str()) {
        return Maintenance::Failed {
            from,
            why: "an earlier attempt off this host node failed".to_string(),
        };
    }
    match cannot_migrate(vmi) {
        Some(why) => Maintenance::Replace { from, why },
        // KubeVirt evacuates a migratable VM it named itself.
        None if evacuation.is_some() => Maintenance::Migrating { from, to: None },
        None => Maintenance::Migrate { from },
    }
}

/// Why KubeVirt cannot live-migrate the VM of `vmi` off a drained node, or `None` when it
/// can: its eviction strategy must ask for a migration and its `LiveMigratable` condition
/// must be True.
pub fn cannot_migrate(vmi: &ObservedVmi) -> Option<String> {
    let strategy = vmi.spec.eviction_strategy.as_deref();
    if !strategy.is_some_and(|s| MIGRATING_STRATEGIES.contains(&s)) {
        return Some(format!(
            "eviction strategy {}",
            strategy.unwrap_or("unset (KubeVirt's default, None)")
        ));
    }
    match vmi.condition(LIVE_MIGRATABLE) {
        Some(c) if c.status == "True" => None,
        Some(c) => Some(format!(
            "LiveMigratable is {}: {}",
            c.status,
            c.reason.as_deref().unwrap_or("no reason given")
        )),
        None => Some("KubeVirt has not said it is LiveMigratable".to_string()),
    }
}

/// The host node a `HostMaintenance` message names first (what [`Maintenance::condition`]
/// writes: "host node NAME ..." or "... from host node NAME ...").
pub fn message_host(message: &str) -> Option<&str> {
    let rest = message.split_once("host node ")?.1;
    rest.split_whitespace().next()
}

/// The name of the migration autonodes asks for to move VM `vm` off host node `from`: the
/// VM's name (cut) and a hash of the host node, so that each maintenance of another host
/// node gets its own, and a name never passes 253 characters.
pub fn migration_name(vm: &str, from: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(from.as_bytes());
    let hash: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
    let head: String = vm.chars().take(200).collect();
    format!("{head}-evacuate-{hash}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vmi(spec: serde_json::Value, status: serde_json::Value) -> ObservedVmi {
        serde_json::from_value(json!({"metadata": {"name": "vm"}, "spec": spec, "status": status}))
            .expect("vmi")
    }

    fn migratable(status: serde_json::Value) -> ObservedVmi {
        let mut s = json!({"phase": "Running", "nodeName": "host-0",
            "conditions": [{"type": "LiveMigratable", "status": "True"}]});
        if let (Some(s), Some(extra)) = (s.as_object_mut(), status.as_object()) {
            s.extend(extra.clone());
        }
        vmi(json!({"evictionStrategy": "LiveMigrate"}), s)
    }

    fn host0_cordoned(n: &str) -> bool {
        n == "host-0"
    }

    #[test]
    fn a_migratable_vm_on_a_cordoned_host_node_is_migrated_and_one_elsewhere_is_left_alone() {
        let v = migratable(json!({}));
        assert_eq!(
            assess(&v, host0_cordoned, None, None),
            Maintenance::Migrate {
                from: "host-0".into()
            }
        );
        assert_eq!(assess(&v, |_| false, None, None), Maintenance::Unchanged);
        let (ok, reason, message) = assess(&v, host0_cordoned, None, None)
            .condition()
            .expect("condition");
        assert!(ok);
        assert_eq!(reason, ClaimReason::Migrating);
        assert_eq!(message_host(&message), Some("host-0"));
    }

    #[test]
    fn a_vm_that_cannot_migrate_is_replaced_and_says_why() {
        for (v, why) in [
            (
                vmi(
                    json!({}),
                    json!({"nodeName": "host-0", "conditions": [{"type": "LiveMigratable", "status": "True"}]}),
                ),
                "eviction strategy unset",
            ),
            (
                vmi(
                    json!({"evictionStrategy": "External"}),
                    json!({"nodeName": "host-0"}),
                ),
                "eviction strategy External",
            ),
            (
                vmi(
                    json!({"evictionStrategy": "LiveMigrate"}),
                    json!({"nodeName": "host-0", "conditions": [{"type": "LiveMigratable", "status": "False", "reason": "DisksNotLiveMigratable"}]}),
                ),
                "LiveMigratable is False: DisksNotLiveMigratable",
            ),
        ] {
            match assess(&v, host0_cordoned, None, None) {
                Maintenance::Replace { from, why: got } => {
                    assert_eq!(from, "host-0");
                    assert!(got.starts_with(why), "{got}");
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn an_evacuation_kubevirt_asks_for_is_handled_as_a_drain_of_that_node() {
        let external = vmi(
            json!({"evictionStrategy": "External"}),
            json!({"nodeName": "host-1", "evacuationNodeName": "host-1"}),
        );
        assert!(matches!(
            assess(&external, |_| false, None, None),
            Maintenance::Replace { from, .. } if from == "host-1"
        ));
        // A migratable VM KubeVirt evacuates itself: no second migration is asked for.
        let live = migratable(json!({"evacuationNodeName": "host-0"}));
        assert_eq!(
            assess(&live, |_| false, None, None),
            Maintenance::Migrating {
                from: "host-0".into(),
                to: None
            }
        );
    }

    #[test]
    fn a_running_migration_is_told_and_a_completed_one_is_recorded_once_and_kept() {
        let running =
            migratable(json!({"migrationState": {"sourceNode": "host-0", "targetNode": "host-1"}}));
        assert_eq!(
            assess(&running, host0_cordoned, Some(ClaimReason::Migrating), None),
            Maintenance::Migrating {
                from: "host-0".into(),
                to: Some("host-1".into())
            }
        );
        let done = migratable(json!({"nodeName": "host-1",
            "migrationState": {"sourceNode": "host-0", "targetNode": "host-1", "completed": true}}));
        let moved = assess(&done, host0_cordoned, Some(ClaimReason::Migrating), None);
        assert_eq!(
            moved,
            Maintenance::Migrated {
                from: "host-0".into(),
                to: "host-1".into()
            }
        );
        assert_eq!(moved.condition().map(|c| c.0), Some(false));
        // Recorded the same however often it is looked at, also when `Migrating` was never
        // written (the migration ended before the claim's status was).
        assert_eq!(
            assess(&done, host0_cordoned, Some(ClaimReason::Migrated), None),
            moved
        );
        assert_eq!(assess(&done, host0_cordoned, None, None), moved);
        // A record stays once KubeVirt forgot the migration.
        assert_eq!(
            assess(
                &migratable(json!({"nodeName": "host-1"})),
                host0_cordoned,
                Some(ClaimReason::Migrated),
                None
            ),
            Maintenance::Unchanged
        );
    }

    #[test]
    fn a_failed_migration_makes_the_pool_replace_the_node_and_is_not_tried_again() {
        let failed = migratable(
            json!({"migrationState": {"sourceNode": "host-0", "failed": true,
            "failureReason": "target pod did not start"}}),
        );
        let got = assess(&failed, host0_cordoned, Some(ClaimReason::Migrating), None);
        assert_eq!(
            got,
            Maintenance::Failed {
                from: "host-0".into(),
                why: "target pod did not start".into()
            }
        );
        let (ok, reason, message) = got.condition().expect("condition");
        assert!(ok && needs_replacement(ok, reason.as_str()));
        // The instance no longer shows the failure (KubeVirt cleared it): still not retried.
        let later = migratable(json!({}));
        assert!(matches!(
            assess(
                &later,
                host0_cordoned,
                Some(ClaimReason::MigrationFailed),
                message_host(&message)
            ),
            Maintenance::Failed { .. }
        ));
    }

    #[test]
    fn a_host_node_uncordoned_before_the_vm_left_ends_the_maintenance() {
        let v = migratable(json!({}));
        for previous in [
            ClaimReason::Migrating,
            ClaimReason::HostDraining,
            ClaimReason::MigrationFailed,
        ] {
            assert_eq!(
                assess(&v, |_| false, Some(previous), Some("host-0")),
                Maintenance::None
            );
        }
        assert!(!needs_replacement(false, "Migrated"));
        assert!(needs_replacement(true, "HostDraining"));
    }

    #[test]
    fn migration_names_differ_by_host_node_and_stay_short() {
        let a = migration_name("vm-1", "host-0");
        assert_ne!(a, migration_name("vm-1", "host-1"));
        assert!(a.starts_with("vm-1-evacuate-"));
        assert!(migration_name(&"v".repeat(300), "h").len() <= 253);
    }
}

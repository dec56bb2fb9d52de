//! Which objects autonodes created belong to no claim any more (pure: no I/O). The orphan
//! sweep (`controller::sweep`) lists what carries `app.kubernetes.io/managed-by=autonodes`
//! on host and tenant clusters, then the claims, and removes what [`orphans`] picks.

use std::collections::{BTreeMap, HashSet};

use autonodes_api::{LABEL_INSTALLATION, LABEL_MANAGED_BY, LABEL_NODECLAIM_UID, MANAGED_BY};

/// Kinds of objects the sweep removes (the `kind` label of
/// `autonodes_orphans_removed_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OrphanKind {
    /// A KubeVirt VirtualMachine on a host cluster.
    VirtualMachine,
    /// A user-data Secret on a host cluster.
    UserDataSecret,
    /// A CDI DataVolume on a host cluster.
    DataVolume,
    /// A bootstrap-token Secret on a tenant cluster.
    BootstrapToken,
    /// A Node a claim's VM registered on a tenant cluster (the kubelet made it with the
    /// installation and claim-UID labels autonodes gave it, without the managed-by label).
    Node,
}

impl OrphanKind {
    /// The metric label value.
    pub fn label(self) -> &'static str {
        match self {
            OrphanKind::VirtualMachine => "VirtualMachine",
            OrphanKind::UserDataSecret => "Secret",
            OrphanKind::DataVolume => "DataVolume",
            OrphanKind::BootstrapToken => "BootstrapToken",
            OrphanKind::Node => "Node",
        }
    }
}

/// A cluster the sweep looks at.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Cluster {
    /// A host cluster, by its `clusterRef.cluster` name.
    Host(String),
    /// A tenant cluster: the claims' namespace and the vCluster's name.
    Tenant {
        /// Namespace of the claims and of the `vc-<name>` Secret.
        namespace: String,
        /// The vCluster's name.
        vcluster: String,
    },
}

/// One object found on a remote cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Where it is.
    pub cluster: Cluster,
    /// What it is.
    pub kind: OrphanKind,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
}

/// The objects that this installation of autonodes made (managed-by label — a Node has
/// none, its kubelet made it — and [`LABEL_INSTALLATION`] equal to `installation`) for a
/// claim (claim-UID label) whose UID is not in `live_claims`. `live_claims` must be listed after `found`: an object can only
/// exist once its claim does, so a claim missing from a later list is gone. Objects without
/// the claim-UID label are never picked (autonodes did not make them for a claim), nor are
/// those of another installation (its claims live in another management cluster, or another
/// namespace of it) or without an installation label (made before installations were
/// labelled: removed by hand, see docs/src/lifecycle.md).
pub fn orphans<'a>(
    found: &'a [Found],
    live_claims: &HashSet<String>,
    installation: &str,
) -> Vec<&'a Found> {
    let installation = crate::names::label_value(installation);
    found
        .iter()
        .filter(|f| {
            f.kind == OrphanKind::Node
                || f.labels.get(LABEL_MANAGED_BY).map(String::as_str) == Some(MANAGED_BY)
        })
        .filter(|f| f.labels.get(LABEL_INSTALLATION) == Some(&installation))
        .filter(|f| {
            f.labels
                .get(LABEL_NODECLAIM_UID)
                .is_some_and(|uid| !uid.is_empty() && !live_claims.contains(uid))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(kind: OrphanKind, name: &str, labels: &[(&str, &str)]) -> Found {
        Found {
            cluster: Cluster::Host("h".into()),
            kind,
            namespace: "vms".into(),
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn a_tenant_node_of_a_vanished_claim_of_this_installation_is_an_orphan_without_the_managed_by_label(
    ) {
        let i = (LABEL_INSTALLATION, "prod");
        let nodes = [
            found(OrphanKind::Node, "gone", &[i, (LABEL_NODECLAIM_UID, "u2")]),
            found(OrphanKind::Node, "live", &[i, (LABEL_NODECLAIM_UID, "u1")]),
            found(
                OrphanKind::Node,
                "staging",
                &[(LABEL_INSTALLATION, "staging"), (LABEL_NODECLAIM_UID, "u3")],
            ),
            found(OrphanKind::Node, "tenant-own", &[]),
        ];
        let live: HashSet<String> = ["u1".to_string()].into();
        let names: Vec<&str> = orphans(&nodes, &live, "prod")
            .iter()
            .map(|f| f.name.as_str())
            .collect();
        assert_eq!(names, ["gone"]);
    }

    #[test]
    fn only_managed_objects_of_vanished_claims_of_this_installation_are_orphans() {
        let m = (LABEL_MANAGED_BY, MANAGED_BY);
        let i = (LABEL_INSTALLATION, "prod");
        let objects = [
            found(
                OrphanKind::VirtualMachine,
                "live",
                &[m, i, (LABEL_NODECLAIM_UID, "u1")],
            ),
            found(
                OrphanKind::VirtualMachine,
                "gone",
                &[m, i, (LABEL_NODECLAIM_UID, "u2")],
            ),
            found(
                OrphanKind::UserDataSecret,
                "gone-userdata",
                &[m, i, (LABEL_NODECLAIM_UID, "u2")],
            ),
            found(
                OrphanKind::VirtualMachine,
                "someone-elses",
                &[(LABEL_NODECLAIM_UID, "u3")],
            ),
            found(OrphanKind::BootstrapToken, "no-uid", &[m, i]),
            found(
                OrphanKind::VirtualMachine,
                "staging",
                &[
                    m,
                    (LABEL_INSTALLATION, "staging"),
                    (LABEL_NODECLAIM_UID, "u2"),
                ],
            ),
            found(
                OrphanKind::VirtualMachine,
                "unlabelled-installation",
                &[m, (LABEL_NODECLAIM_UID, "u2")],
            ),
            found(
                OrphanKind::BootstrapToken,
                "empty-uid",
                &[m, i, (LABEL_NODECLAIM_UID, "")],
            ),
        ];
        let live = HashSet::from(["u1".to_string()]);
        let names: Vec<&str> = orphans(&objects, &live, "prod")
            .iter()
            .map(|f| f.name.as_str())
            .collect();
        assert_eq!(names, ["gone", "gone-userdata"]);
    }
}

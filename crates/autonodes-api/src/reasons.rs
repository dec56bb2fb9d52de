//! Condition types and reasons as types: one enum of condition types and one of reasons
//! per kind, so a controller cannot write a reason that is not listed here, and a test can
//! walk every value ([`ClaimReason::ALL`]): `tests/it/docs.rs` fails when one has no entry
//! in `docs/src/troubleshooting.md`.
//!
//! The API stores them as strings (`metav1.Condition` `type` and `reason`); `as_str` gives
//! that string, `parse` reads one back.

use std::fmt;

/// Defines a `Copy` enum whose values are written to the API by their own names.
macro_rules! names {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident,)* }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)*
        }

        impl $name {
            /// Every value, in the order of their declaration.
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            /// The name the API stores.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => stringify!($variant),)*
                }
            }

            /// The value named `s`, if there is one.
            pub fn parse(s: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|v| v.as_str() == s)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                self.as_str()
            }
        }

        impl From<$name> for String {
            fn from(v: $name) -> String {
                v.as_str().to_string()
            }
        }
    };
}

names! {
    /// The conditions of a NodeClaim, in the order a claim reaches them (its phase is the
    /// first that is not True).
    ClaimCondition {
        /// A node type was chosen and stored with the VM's name.
        Scheduled,
        /// The VM runs.
        Provisioned,
        /// The VM's Node registered in the tenant.
        Joined,
        /// The Node was Ready without startup taints once; stays True afterwards (a later
        /// NotReady is `Ready=False`, not a lost initialization).
        Initialized,
        /// The Node is Ready and no startup taint is left.
        Ready,
        /// Present (True) only while the claim's node type has changed since the claim was
        /// scheduled, or its node's kubelet is of another minor release than the tenant;
        /// not part of the phase ladder. A pool rolls drifted claims.
        Drifted,
        /// Present while the host node the claim's VM runs on is cordoned or the VM is
        /// asked to leave it (True: the VM is being live-migrated, or its pool replaces it),
        /// and afterwards (False) to say how the VM left; not part of the phase ladder.
        HostMaintenance,
    }
}

names! {
    /// Why a NodeClaim condition is what it is.
    ClaimReason {
        /// `Scheduled=True`: a type was chosen.
        Scheduled,
        /// `Provisioned=True`: the VM runs.
        Running,
        /// `Joined=True`: the Node registered.
        NodeJoined,
        /// `Initialized=True`: the Node was Ready without startup taints.
        Initialized,
        /// `Ready=True`: the Node is Ready.
        NodeReady,
        /// `Drifted=True`: the node type's definition changed since the claim was scheduled.
        NodeTypeChanged,
        /// `Drifted=True`: the node's kubelet is of another minor release than the tenant
        /// (the tenant was upgraded or downgraded since the node joined).
        KubernetesVersionChanged,
        /// `Drifted=True`: the node came up with a kubelet of another minor release than
        /// the tenant (a prepared image with a baked kubelet, a pinned download URL): a
        /// replacement would come up the same, so its pool does not replace nodes for the
        /// tenant's version (`VersionDriftHeld`).
        KubeletVersionMismatch,
        /// `HostMaintenance=True`: the VM's host node is cordoned and the VM is being
        /// live-migrated off it (a VirtualMachineInstanceMigration).
        Migrating,
        /// `HostMaintenance=False`: the VM was live-migrated off a cordoned host node; the
        /// message names both host nodes.
        Migrated,
        /// `HostMaintenance=True`: the VM's host node is cordoned, or KubeVirt asks the VM
        /// to leave it (`evacuationNodeName`, eviction strategy `External`), and the VM cannot
        /// live-migrate (its eviction strategy, its volumes): its pool replaces the node, a
        /// new one first, within the budgets for `HostMaintenance`.
        HostDraining,
        /// `HostMaintenance=True`: the VM's live migration off its cordoned host node
        /// failed; its pool replaces the node as for `HostDraining`.
        MigrationFailed,
        /// `Ready=False`: the claim is powered off (`spec.power: Off`): its Node is cordoned
        /// and kept, its VM stopped.
        PoweredOff,
        /// Progress (`Ready=False`): powering off: the Node is being drained, or the VM is
        /// stopping.
        PoweringOff,
        /// Progress: the VM is being created.
        Creating,
        /// Progress: the VM does not run yet.
        Booting,
        /// Progress: no Node with the VM's provider ID yet.
        WaitingForNode,
        /// Progress: the Node is not Ready or keeps a startup taint.
        NodeNotReady,
        /// Progress: the claim is being deleted.
        Terminating,
        /// The claim was deleted by node repair and its VM is kept halted for debugging
        /// (`repair.keepFailedFor`) until the time the message gives; then it is removed.
        KeptForDebugging,
        /// No node type satisfies the claim's requirements.
        NoMatchingNodeType,
        /// Every fitting node type is full.
        InsufficientCapacity,
        /// A NodeQuota of the claim's namespace allows none of the fitting node types, or
        /// the claim would take the namespace over one of its limits.
        QuotaExceeded,
        /// The NodeProvider of every fitting node type serves other namespaces only (its
        /// `tenantNamespaceSelector` does not select the claim's namespace).
        ProviderNotAllowed,
        /// The controller runs with `--require-quota` and no NodeQuota covers the claim's
        /// namespace.
        NoQuota,
        /// No node of the host cluster has room for the VM of any fitting node type (its
        /// zone and host node placement included): the claim waits rather than leaving a
        /// VM Pending on the host.
        HostCapacityExhausted,
        /// Every fitting node type hands out static addresses and its address pool has no
        /// free address left: the claim waits until a claim holding one is deleted.
        AddressPoolExhausted,
        /// The claim's requirements or resources cannot be read.
        InvalidRequest,
        /// A label no Node may carry.
        InvalidLabels,
        /// A kubelet argument is refused: reserved for autonodes or the node's identity
        /// and credentials, given twice in two spellings, or with a value that is not safe
        /// to pass (see `kubeletArgs`).
        InvalidKubeletArgs,
        /// A taint no Node may carry.
        InvalidTaints,
        /// The node type's VM template cannot be rendered.
        InvalidTemplate,
        /// The claim lacks what a VM needs.
        InvalidClaim,
        /// The tenant's or host's kubeconfig Secret does not exist.
        KubeconfigSecretNotFound,
        /// The tenant's or host's kubeconfig Secret is refused.
        InvalidKubeconfig,
        /// A kubeconfig Secret could not be read.
        KubeconfigSecretUnreadable,
        /// The claim's namespace already uses as many tenant clusters as one namespace may
        /// (`--max-tenant-clusters-per-namespace`): its tenant is not connected.
        TooManyTenantClusters,
        /// The host cluster does not answer.
        HostUnreachable,
        /// The host cluster refuses autonodes' identity.
        HostForbidden,
        /// The tenant cluster does not answer.
        TenantUnreachable,
        /// The tenant cluster refuses autonodes' identity.
        TenantForbidden,
        /// The host's API server refused the VirtualMachine.
        VirtualMachineRejected,
        /// The provider places VMs in a host namespace per tenant that must exist
        /// (`vmNamespacePerTenant.policy: Existing`), and it does not.
        VMNamespaceNotFound,
        /// A VirtualMachine or user-data Secret with the claim's VM name exists on the host
        /// and belongs to another claim or installation: autonodes leaves it alone.
        NameTaken,
        /// The user data exceeds what a Secret may hold.
        UserDataTooLarge,
        /// The user data cannot be rendered.
        InvalidUserData,
        /// The tenant's kubeconfig carries no CA.
        TenantCANotFound,
        /// The tenant's CA cannot be read.
        InvalidTenantCA,
        /// The tenant's `/version` is not a Kubernetes version nodes can join (1.15 or
        /// newer).
        UnsupportedTenantVersion,
        /// The claim's node type is gone or unusable.
        NodeTypeUnavailable,
        /// Failed: the VM did not run within the launch timeout.
        LaunchTimeout,
        /// Failed: no Node joined within the registration timeout.
        RegistrationTimeout,
        /// Failed: the joined Node was not Ready without startup taints within the
        /// initialization timeout.
        InitializationTimeout,
        /// Failed: the VM disappeared after it ran.
        VirtualMachineLost,
        /// A cleanup step failed for another reason.
        CleanupFailed,
    }
}

impl ClaimReason {
    /// True for the `Drifted` reasons that say the node's kubelet is of another minor
    /// release than its tenant (`KubernetesVersionChanged`, `KubeletVersionMismatch`):
    /// what `disruption.kubernetesVersionDrift` governs.
    pub const fn is_version_drift(self) -> bool {
        matches!(
            self,
            ClaimReason::KubernetesVersionChanged | ClaimReason::KubeletVersionMismatch
        )
    }

    /// True for the reasons that mean "on its way", not "something is wrong": the claim
    /// records them in its status but no Event, so a healthy claim's history holds Normal
    /// Events only.
    pub const fn is_progress(self) -> bool {
        matches!(
            self,
            ClaimReason::Creating
                | ClaimReason::Booting
                | ClaimReason::WaitingForNode
                | ClaimReason::NodeNotReady
                | ClaimReason::Terminating
                | ClaimReason::PoweringOff
        )
    }
}

names! {
    /// Why a host or tenant cluster cannot be used (a claim, provider or pool condition
    /// reason).
    ClusterReason {
        /// The kubeconfig Secret does not exist.
        KubeconfigSecretNotFound,
        /// The kubeconfig Secret is refused.
        InvalidKubeconfig,
        /// The kubeconfig Secret could not be read.
        KubeconfigSecretUnreadable,
        /// The namespace already uses as many tenant clusters as one namespace may
        /// (`--max-tenant-clusters-per-namespace`): this one is not connected.
        TooManyTenantClusters,
    }
}

impl From<ClusterReason> for ClaimReason {
    fn from(r: ClusterReason) -> Self {
        match r {
            ClusterReason::KubeconfigSecretNotFound => ClaimReason::KubeconfigSecretNotFound,
            ClusterReason::InvalidKubeconfig => ClaimReason::InvalidKubeconfig,
            ClusterReason::KubeconfigSecretUnreadable => ClaimReason::KubeconfigSecretUnreadable,
            ClusterReason::TooManyTenantClusters => ClaimReason::TooManyTenantClusters,
        }
    }
}

names! {
    /// The conditions of a NodePool.
    PoolCondition {
        /// The pool has what it should: its replicas Ready, or no pending pod waiting for a
        /// new node.
        Ready,
        /// Demand is blocked by `spec.limits`.
        LimitReached,
        /// The pool is mirrored for the cluster-autoscaler (the `capi.autonodes.io` mirror
        /// writes it).
        Autoscaling,
        /// Pools made from a vCluster's configuration (`vc-config-<name>`): whether the
        /// configuration, as it is now, could be imported for this pool.
        VClusterConfig,
        /// Whether the pool replaces nodes that stopped being Ready (False while too many
        /// of them are unhealthy at once).
        NodeRepair,
        /// Whether the pool's claims come up: False once several in a row failed before
        /// their node was ready (the reason is the last failure's); the pool then backs off
        /// before creating more.
        NodeRegistrationHealthy,
        /// A pool with `spec.warm`: whether all the warm VMs it asks for are ready for its
        /// claims (False while they boot, when its namespace or type leaves less room, or
        /// when none can be made).
        WarmReady,
        /// Claims whose VM must leave a host node being drained (`HostMaintenance=True`,
        /// reason `HostDraining` or `MigrationFailed`) wait for a replacement the pool's
        /// budgets for `HostMaintenance` do not allow now (only set while that holds).
        HostMaintenanceHeld,
        /// The pool replaces no nodes drifted from the tenant's Kubernetes version: one of
        /// its nodes came up drifted, so a replacement would too (only set while that
        /// holds).
        VersionDriftHeld,
    }
}

names! {
    /// Why a NodePool condition is what it is.
    PoolReason {
        /// `Ready=True`: every replica of a static pool is Ready.
        AllReplicasReady,
        /// `Ready=True`: no pending pod of a dynamic pool waits for a new node.
        Ready,
        /// Progress: claims are being created.
        ScalingUp,
        /// Progress: claims are being removed.
        ScalingDown,
        /// Progress: claims from an older template are being replaced.
        RollingUpdate,
        /// The pool's `providerRef` names no NodeProvider.
        ProviderNotFound,
        /// The pool's claim template cannot be used.
        InvalidTemplate,
        /// The pool's `spec.disruption` cannot be used (a budget's `schedule` without its
        /// `duration`, or the other way round).
        InvalidDisruption,
        /// The tenant's kubeconfig Secret does not exist.
        KubeconfigSecretNotFound,
        /// The tenant's kubeconfig Secret is refused.
        InvalidKubeconfig,
        /// The tenant's kubeconfig Secret could not be read.
        KubeconfigSecretUnreadable,
        /// The pool's namespace already uses as many tenant clusters as one namespace may
        /// (`--max-tenant-clusters-per-namespace`): its tenant is not connected.
        TooManyTenantClusters,
        /// The tenant cluster does not answer.
        TenantUnreachable,
        /// A dynamic pool's tenant has more pods or nodes than autonodes plans for (20,000
        /// of each); the pool creates nothing until it has fewer.
        TenantTooLarge,
        /// No node type fits the pool's template.
        NoMatchingNodeType,
        /// Pending pods fit node types that are all at `maxCapacity`.
        InsufficientCapacity,
        /// Pending pods fit the pool's node types, but their pod affinity, anti-affinity or
        /// topology spread allows no node the pool has or could add.
        PodRulesUnsatisfiable,
        /// `LimitReached=False`: demand fits within `spec.limits`.
        WithinLimits,
        /// `LimitReached=True`: pending pods need nodes beyond `spec.limits`.
        LimitReached,
        /// `LimitReached=True`: the pool's namespace holds as many claims as the
        /// controller allows one namespace (`--max-claims-per-namespace`); the pool creates
        /// no more until it holds fewer.
        NamespaceClaimLimit,
        /// `LimitReached=True`: a NodeQuota covering the pool's namespace limits `nodes`,
        /// and the namespace's claims reached it; the pool creates no more until they are
        /// fewer.
        QuotaExceeded,
        /// `LimitReached=True`: the controller runs with `--require-quota` and no NodeQuota
        /// covers the pool's namespace; the pool creates no claims until one does.
        NoQuota,
        /// The pool's `providerRef` names a NodeProvider whose `tenantNamespaceSelector`
        /// does not select the pool's namespace.
        ProviderNotAllowed,
        /// `Autoscaling=True`: the MachinePool mirrors the pool.
        MachinePoolMirrored,
        /// `Autoscaling=False`: `spec.autoscaling` has bounds the autoscaler cannot use.
        InvalidAutoscalingBounds,
        /// `Autoscaling=False`: an autoscaled pool needs `spec.replicas`.
        ReplicasRequired,
        /// `VClusterConfig=True`: the pool is as the vCluster's configuration says.
        Imported,
        /// `VClusterConfig=False`: the configuration cannot be read, or this pool's entry
        /// cannot be mapped; the pool is kept as it was.
        InvalidVClusterConfig,
        /// `NodeRepair=True`: nodes unhealthy for their toleration are restarted, then
        /// replaced if that did not help.
        RepairAllowed,
        /// `NodeRepair=False`: more of the pool's nodes are unhealthy than
        /// `repair.maxUnhealthy` allows (20 % by default); none is repaired until fewer are.
        TooManyUnhealthyNodes,
        /// `NodeRepair=False`: repair is off for the pool (`repair.maxUnhealthy: "0"`, or
        /// `--node-repair-after=0s` with no conditions of the pool's or provider's own).
        RepairDisabled,
        /// `NodeRegistrationHealthy=True`: fewer claims than the threshold failed in a row
        /// before their node was ready.
        NodesRegistered,
        /// `NodeRegistrationHealthy=False`: the last failed claim's VM did not run within the
        /// launch timeout.
        LaunchTimeout,
        /// `NodeRegistrationHealthy=False`: the last failed claim's Node did not join within
        /// the registration timeout.
        RegistrationTimeout,
        /// `NodeRegistrationHealthy=False`: the last failed claim's Node was not Ready
        /// without startup taints within the initialization timeout.
        InitializationTimeout,
        /// `NodeRegistrationHealthy=False`: the last failed claim's VM disappeared before its
        /// node was ready.
        VirtualMachineLost,
        /// `WarmReady=True`: every warm VM the pool keeps is ready for a claim of the pool.
        WarmReady,
        /// `WarmReady=False`: the pool's warm VMs are being made or are booting.
        WarmStarting,
        /// `WarmReady=False`: fewer warm VMs than `spec.warm.replicas`, held back by the
        /// namespace's NodeQuotas, its claim limit or the type's `maxCapacity`.
        WarmLimited,
        /// `WarmReady=False`: no warm VM can be made for the pool (no type its template
        /// accepts can keep warm VMs, or the pool cannot be worked on).
        WarmUnavailable,
        /// `VersionDriftHeld=True`: a node of the pool came up with a kubelet of another
        /// minor release than the tenant's (its claim is `Drifted` with reason
        /// `KubeletVersionMismatch`), so a replacement would come up drifted as well; the
        /// pool replaces no nodes for the tenant's version until that node is gone.
        ReplacementWouldDrift,
        /// `HostMaintenanceHeld=True`: claims must leave a host node being drained, and
        /// the pool's active disruption budgets for `HostMaintenance` allow no more
        /// replacements now; the host's drain waits on those nodes.
        BudgetExhausted,
    }
}

impl PoolReason {
    /// True for the reasons that mean "on its way", not "something is wrong": the pool
    /// records them in its status but no Warning Event.
    pub const fn is_progress(self) -> bool {
        matches!(
            self,
            PoolReason::ScalingUp | PoolReason::ScalingDown | PoolReason::RollingUpdate
        )
    }
}

impl From<ClusterReason> for PoolReason {
    fn from(r: ClusterReason) -> Self {
        match r {
            ClusterReason::KubeconfigSecretNotFound => PoolReason::KubeconfigSecretNotFound,
            ClusterReason::InvalidKubeconfig => PoolReason::InvalidKubeconfig,
            ClusterReason::KubeconfigSecretUnreadable => PoolReason::KubeconfigSecretUnreadable,
            ClusterReason::TooManyTenantClusters => PoolReason::TooManyTenantClusters,
        }
    }
}

names! {
    /// Why a NodeQuota's `Ready` condition is what it is.
    QuotaReason {
        /// `Ready=True`: the quota is applied to the claims of the namespaces it covers.
        Enforced,
        /// `Ready=False`: a limit cannot be read; the quota lets no claim of its namespaces
        /// be scheduled until it is fixed.
        InvalidQuota,
    }
}

names! {
    /// The conditions of a NodeProvider.
    ProviderCondition {
        /// The host cluster answers and serves KubeVirt.
        HostReachable,
        /// Every node type's template composes.
        TemplatesValid,
        /// The provider can be used: the host is reachable and the templates are valid.
        Ready,
    }
}

names! {
    /// Why a NodeProvider condition (`HostReachable`, `TemplatesValid`, `Ready`) is what it
    /// is.
    ProviderReason {
        /// `HostReachable=True`: the host cluster serves KubeVirt VirtualMachines.
        HostReachable,
        /// `TemplatesValid=True`: every node type's template composes.
        TemplatesValid,
        /// `Ready=True`: the host is reachable (broken node types fail only themselves).
        Ready,
        /// The host's kubeconfig Secret does not exist.
        KubeconfigSecretNotFound,
        /// The host's kubeconfig Secret is refused.
        InvalidKubeconfig,
        /// The host's kubeconfig Secret could not be read.
        KubeconfigSecretUnreadable,
        /// The host cluster does not answer.
        HostUnreachable,
        /// The host cluster refuses autonodes' identity.
        HostForbidden,
        /// The host cluster does not serve `kubevirt.io/v1` VirtualMachines.
        KubeVirtNotInstalled,
        /// `TemplatesValid=False`: some node types' templates do not compose.
        InvalidTemplate,
        /// `Ready=False`: the provider is being deleted and claims still use its types.
        InUse,
    }
}

impl From<ClusterReason> for ProviderReason {
    fn from(r: ClusterReason) -> Self {
        match r {
            ClusterReason::KubeconfigSecretNotFound => ProviderReason::KubeconfigSecretNotFound,
            ClusterReason::InvalidKubeconfig => ProviderReason::InvalidKubeconfig,
            ClusterReason::KubeconfigSecretUnreadable => ProviderReason::KubeconfigSecretUnreadable,
            // Only tenant clusters are counted against a namespace; a host never is.
            ClusterReason::TooManyTenantClusters => ProviderReason::InvalidKubeconfig,
        }
    }
}

names! {
    /// The conditions of a NodeType.
    TypeCondition {
        /// The type can take claims.
        Ready,
        /// Present on a type that keeps warm VMs: True when all of them are ready.
        WarmReady,
    }
}

names! {
    /// Why a NodeType's `Ready` condition is what it is.
    TypeReason {
        /// `Ready=True`: claims can be scheduled to the type.
        Available,
        /// `Ready=True`: every unit of the type's `maxCapacity` is claimed.
        Exhausted,
        /// The type's NodeProvider does not exist.
        ProviderNotFound,
        /// The type's NodeProvider exists but cannot be used (its host unreachable, or it
        /// is being deleted).
        ProviderNotReady,
        /// No memory can be found in the type's composed VM template.
        MemoryNotFound,
        /// The type's VM template cannot be composed or breaks a rule a VM must keep.
        InvalidTemplate,
        /// A resource quantity of the type cannot be read.
        InvalidResources,
        /// A taint of the type cannot be used.
        InvalidTaints,
        /// The KubeVirt instance type the type names cannot be read from the host.
        InstancetypeUnavailable,
        /// The type's `addressPool` cannot be read (a CIDR, gateway or address that is not
        /// one, of another family, or a pool that leaves nothing to hand out).
        InvalidAddressPool,
        /// `WarmReady=True`: every warm VM the type keeps is ready for a claim.
        WarmReady,
        /// `WarmReady=False`: warm VMs are being made or are booting.
        WarmStarting,
        /// `WarmReady=False`: warm VMs ran without their agent reporting to the host API
        /// server (the VMs cannot reach it); they are replaced, claims are served cold.
        WarmNotReporting,
        /// `WarmReady=False`: the type cannot keep warm VMs (its user data template,
        /// placement or zones; its host unreachable).
        WarmUnavailable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_reads_back_as_its_value() {
        for r in ClaimReason::ALL {
            assert_eq!(ClaimReason::parse(r.as_str()), Some(*r));
        }
        for c in ClaimCondition::ALL {
            assert_eq!(ClaimCondition::parse(c.as_str()), Some(*c));
        }
        for r in PoolReason::ALL {
            assert_eq!(PoolReason::parse(r.as_str()), Some(*r));
        }
        for c in PoolCondition::ALL {
            assert_eq!(PoolCondition::parse(c.as_str()), Some(*c));
        }
        assert_eq!(ClaimReason::parse("Maybe"), None);
        assert_eq!(PoolReason::parse("Maybe"), None);
    }

    #[test]
    fn pool_reasons_keep_the_names_the_readme_and_the_api_know() {
        let names: Vec<&str> = PoolReason::ALL.iter().map(|r| r.as_str()).collect();
        for known in [
            "ProviderNotFound",
            "InvalidTemplate",
            "KubeconfigSecretNotFound",
            "TenantUnreachable",
            "LimitReached",
            "WithinLimits",
            "AllReplicasReady",
            "NoMatchingNodeType",
            "InsufficientCapacity",
            "MachinePoolMirrored",
            "InvalidAutoscalingBounds",
            "ReplicasRequired",
        ] {
            assert!(names.contains(&known), "{known} missing from PoolReason");
        }
        for r in ClusterReason::ALL {
            assert_eq!(PoolReason::from(*r).as_str(), r.as_str());
        }
    }

    #[test]
    fn cluster_reasons_keep_their_names_on_a_claim() {
        for r in ClusterReason::ALL {
            assert_eq!(ClaimReason::from(*r).as_str(), r.as_str());
        }
    }

    #[test]
    fn only_progress_reasons_are_progress() {
        let progress: Vec<&str> = ClaimReason::ALL
            .iter()
            .filter(|r| r.is_progress())
            .map(|r| r.as_str())
            .collect();
        assert_eq!(
            progress,
            [
                "PoweringOff",
                "Creating",
                "Booting",
                "WaitingForNode",
                "NodeNotReady",
                "Terminating"
            ]
        );
        let progress: Vec<&str> = PoolReason::ALL
            .iter()
            .filter(|r| r.is_progress())
            .map(|r| r.as_str())
            .collect();
        assert_eq!(progress, ["ScalingUp", "ScalingDown", "RollingUpdate"]);
    }
}

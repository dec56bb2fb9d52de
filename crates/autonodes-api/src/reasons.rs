//! Condition types and reasons as types: one enum of condition types and one of reasons
//! per kind, so a controller cannot write a reason the README does not list, and a test can
//! walk every value ([`ClaimReason::ALL`]).
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
            /// Every value, in the order the README lists them.
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
        /// The Node is Ready and no startup taint is left.
        Ready,
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
        /// `Ready=True`: the Node is Ready.
        NodeReady,
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
        /// No node type satisfies the claim's requirements.
        NoMatchingNodeType,
        /// Every fitting node type is full.
        InsufficientCapacity,
        /// The claim's requirements or resources cannot be read.
        InvalidRequest,
        /// A label no Node may carry.
        InvalidLabels,
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
        /// The user data exceeds what a Secret may hold.
        UserDataTooLarge,
        /// The user data cannot be rendered.
        InvalidUserData,
        /// The tenant's kubeconfig carries no CA.
        TenantCANotFound,
        /// The tenant's CA cannot be read.
        InvalidTenantCA,
        /// The claim's node type is gone or unusable.
        NodeTypeUnavailable,
        /// Failed: the VM did not run within the launch timeout.
        LaunchTimeout,
        /// Failed: no Node joined within the registration timeout.
        RegistrationTimeout,
        /// Failed: the VM disappeared after it ran.
        VirtualMachineLost,
        /// A cleanup step failed for another reason.
        CleanupFailed,
    }
}

impl ClaimReason {
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
    }
}

impl From<ClusterReason> for ClaimReason {
    fn from(r: ClusterReason) -> Self {
        match r {
            ClusterReason::KubeconfigSecretNotFound => ClaimReason::KubeconfigSecretNotFound,
            ClusterReason::InvalidKubeconfig => ClaimReason::InvalidKubeconfig,
            ClusterReason::KubeconfigSecretUnreadable => ClaimReason::KubeconfigSecretUnreadable,
        }
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
        assert_eq!(ClaimReason::parse("Maybe"), None);
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
                "Creating",
                "Booting",
                "WaitingForNode",
                "NodeNotReady",
                "Terminating"
            ]
        );
    }
}

//! The tenant's Kubernetes version (the `gitVersion` of its `/version`) and what follows
//! from it for a node that joins: the kubeadm `JoinConfiguration` apiVersion, the shape of
//! `kubeletExtraArgs`, and the release whose kubelet and kubeadm a stock image installs.
//!
//! The version is written by the tenant, so it is read strictly: `v<major>.<minor>.<patch>`
//! of digits, anything after the patch number (`+k3s1`, `-gke.100`) dropped. What comes out
//! is digits and dots only, safe in a URL and a shell word.

use std::fmt;

/// A Kubernetes release `v<major>.<minor>.<patch>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KubeVersion {
    /// Major version (1).
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Patch version.
    pub patch: u32,
}

/// The oldest tenant a node can join: kubeadm's `v1beta2` configuration appeared in 1.15.
pub const OLDEST_JOINABLE: KubeVersion = KubeVersion::new(1, 15, 0);

/// The version `autonodes render` assumes when no tenant is asked (`--kubernetes-version`
/// changes it).
pub(crate) const DEFAULT_RENDER_VERSION: KubeVersion = KubeVersion::new(1, 33, 0);

/// Why a node whose kubelet reports `kubelet` (its Node's `status.nodeInfo.kubeletVersion`)
/// no longer matches a tenant at `tenant`: their minor releases differ (an upgraded vCluster
/// keeps nodes with the old kubelet). `None` when they match, or when the kubelet's version
/// does not read (nothing to compare).
pub fn version_drift(kubelet: &str, tenant: KubeVersion) -> Option<String> {
    let k = KubeVersion::parse(kubelet).ok()?;
    ((k.major, k.minor) != (tenant.major, tenant.minor)).then(|| {
        format!(
            "the node's kubelet is v{}.{}, the tenant runs v{}.{}",
            k.major, k.minor, tenant.major, tenant.minor
        )
    })
}

impl KubeVersion {
    /// `v<major>.<minor>.<patch>`.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Self {
            major,
            minor,
            patch,
        }
    }

    /// Reads a `gitVersion` such as `v1.20.2`, `1.29.3+k3s1` or `v1.31.0-gke.1`. The error
    /// quotes at most 40 characters of the text, with anything unusual replaced.
    pub fn parse(git_version: &str) -> Result<Self, String> {
        let shown = || -> String {
            git_version
                .chars()
                .take(40)
                .map(|c| {
                    if c.is_ascii_alphanumeric() || "+-.".contains(c) {
                        c
                    } else {
                        '?'
                    }
                })
                .collect()
        };
        let bad = || {
            format!(
                "{:?} is not a Kubernetes version v<major>.<minor>.<patch>",
                shown()
            )
        };
        let text = git_version.trim();
        let text = text.strip_prefix('v').unwrap_or(text);
        let end = text
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(text.len());
        let (numbers, rest) = text.split_at(end);
        if !(rest.is_empty() || rest.starts_with('+') || rest.starts_with('-')) {
            return Err(bad());
        }
        let parts: Vec<&str> = numbers.split('.').collect();
        let [major, minor, patch] = parts.as_slice() else {
            return Err(bad());
        };
        let number = |s: &str| -> Result<u32, String> {
            if s.is_empty() || s.len() > 6 {
                return Err(bad());
            }
            s.parse().map_err(|_| bad())
        };
        Ok(Self::new(number(major)?, number(minor)?, number(patch)?))
    }

    /// Whether a node can join a tenant of this version ([`OLDEST_JOINABLE`] or newer, and
    /// major version 1).
    pub fn is_joinable(self) -> bool {
        self.major == 1 && self >= OLDEST_JOINABLE
    }

    /// The kubeadm configuration API this version's kubeadm reads: `v1beta2` below 1.22,
    /// `v1beta3` up to 1.30, `v1beta4` from 1.31.
    pub fn kubeadm_api_version(self) -> &'static str {
        match self.minor {
            _ if self.major != 1 => "kubeadm.k8s.io/v1beta4",
            0..=21 => "kubeadm.k8s.io/v1beta2",
            22..=30 => "kubeadm.k8s.io/v1beta3",
            _ => "kubeadm.k8s.io/v1beta4",
        }
    }

    /// `v1beta4` writes `kubeletExtraArgs` as a list of `{name, value}`; older versions as a
    /// map.
    pub fn kubelet_args_as_list(self) -> bool {
        self.kubeadm_api_version() == "kubeadm.k8s.io/v1beta4"
    }

    /// Whether an API server of this version streams a watch's initial list
    /// (`sendInitialEvents`, the WatchList feature) by default: 1.32 (beta, on), not 1.33
    /// (turned off again), 1.34 and later. A server may still have it off: a watch it
    /// refuses that way lists in pages instead.
    pub fn streams_initial_lists(self) -> bool {
        self.major == 1 && (self.minor == 32 || self.minor >= 34)
    }

    /// Whether this version's `kubeadm join` checks the container runtime with `crictl`
    /// (before 1.31), which the user data's own check of containerd replaces.
    pub fn kubeadm_needs_crictl(self) -> bool {
        self.major == 1 && self.minor < 31
    }
}

impl fmt::Display for KubeVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}.{}.{}", self.major, self.minor, self.patch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn initial_lists_stream_by_default_on_1_32_and_from_1_34_but_not_on_1_33_or_before() {
        let streams = |minor| KubeVersion::new(1, minor, 0).streams_initial_lists();
        assert!(!streams(20) && !streams(27) && !streams(31));
        assert!(streams(32));
        assert!(!streams(33), "1.33 turned the WatchList gate off again");
        assert!(streams(34) && streams(35) && streams(36));
        assert!(!KubeVersion::new(2, 0, 0).streams_initial_lists());
    }

    #[test]
    fn a_kubelet_of_another_minor_release_than_the_tenant_drifts_and_a_patch_release_does_not() {
        let tenant = KubeVersion::new(1, 21, 3);
        assert_eq!(version_drift("v1.21.0", tenant), None);
        assert_eq!(version_drift("v1.21.9+k3s1", tenant), None);
        assert_eq!(
            version_drift("v1.20.2", tenant).as_deref(),
            Some("the node's kubelet is v1.20, the tenant runs v1.21")
        );
        assert!(version_drift("v1.22.0", tenant).is_some());
        assert_eq!(version_drift("", tenant), None, "nothing to compare");
        assert_eq!(version_drift("garbage", tenant), None);
    }

    #[test]
    fn git_versions_of_common_distributions_read_as_their_release() {
        for (text, want) in [
            ("v1.20.2", (1, 20, 2)),
            ("1.29.3+k3s1", (1, 29, 3)),
            ("v1.31.0-gke.1000", (1, 31, 0)),
            (" v1.33.1 ", (1, 33, 1)),
        ] {
            let v = KubeVersion::parse(text).expect(text);
            assert_eq!((v.major, v.minor, v.patch), want, "{text}");
        }
        assert_eq!(
            KubeVersion::parse("v1.20.2").expect("parses").to_string(),
            "v1.20.2"
        );
    }

    #[test]
    fn anything_else_is_an_error_that_quotes_a_bounded_sanitised_text() {
        for text in [
            "",
            "v1.20",
            "v1.20.2.1",
            "1.x.0",
            "v1.20.2;rm -rf /",
            "latest",
            "v1.2000000.0",
        ] {
            let e = KubeVersion::parse(text).expect_err(text);
            assert!(e.len() < 120, "{e}");
            assert!(!e.contains(';') && !e.contains('/'), "{e}");
        }
        let e = KubeVersion::parse(&"9".repeat(500)).expect_err("long");
        assert!(e.len() < 120, "{e}");
    }

    #[test]
    fn the_kubeadm_api_follows_the_version() {
        let api = |minor| KubeVersion::new(1, minor, 0).kubeadm_api_version();
        assert_eq!(api(15), "kubeadm.k8s.io/v1beta2");
        assert_eq!(api(21), "kubeadm.k8s.io/v1beta2");
        assert_eq!(api(22), "kubeadm.k8s.io/v1beta3");
        assert_eq!(api(30), "kubeadm.k8s.io/v1beta3");
        assert_eq!(api(31), "kubeadm.k8s.io/v1beta4");
        assert_eq!(api(34), "kubeadm.k8s.io/v1beta4");
        assert!(KubeVersion::new(1, 31, 0).kubelet_args_as_list());
        assert!(!KubeVersion::new(1, 30, 9).kubelet_args_as_list());
        assert!(!KubeVersion::new(1, 14, 10).is_joinable());
        assert!(KubeVersion::new(1, 15, 0).is_joinable());
        assert!(!KubeVersion::new(2, 0, 0).is_joinable());
    }

    proptest! {
        #[test]
        fn a_parsed_version_prints_as_digits_and_dots_only(text in "\\PC{0,30}") {
            if let Ok(v) = KubeVersion::parse(&text) {
                let shown = v.to_string();
                prop_assert!(shown.starts_with('v'));
                prop_assert!(shown[1..].chars().all(|c| c.is_ascii_digit() || c == '.'));
            }
        }
    }
}

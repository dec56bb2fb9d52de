//! What a kubeadm of a given release reads in a `JoinConfiguration`, as pure functions: the
//! configuration APIs it knows (`kubeadm.k8s.io/v1beta2` from 1.15 until its removal in
//! 1.26, `v1beta3` from 1.22, `v1beta4` from 1.31) and, per API, the fields it knows and the
//! shape of `nodeRegistration.kubeletExtraArgs` (a map in v1beta2 and v1beta3, a list of
//! `{name, value}` in v1beta4); and whether token discovery can finish with a bootstrap
//! token ([`discovery_token_problem`]).
//!
//! Written from kubeadm's API types and its release notes, independently of the code that
//! renders autonodes' user data, so the simulator checks that code instead of repeating it.

use autonodes_core::kubeversion::KubeVersion;
use serde_json::Value;

/// A kubeadm configuration API (`kubeadm.k8s.io/<version>`) the simulator knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigApi {
    /// `kubeadm.k8s.io/v1beta2`: kubeadm 1.15 to 1.25.
    V1beta2,
    /// `kubeadm.k8s.io/v1beta3`: kubeadm 1.22 and later.
    V1beta3,
    /// `kubeadm.k8s.io/v1beta4`: kubeadm 1.31 and later.
    V1beta4,
}

/// Fields of a JoinConfiguration every API knows.
const TOP: &[&str] = &[
    "apiVersion",
    "kind",
    "caCertPath",
    "discovery",
    "nodeRegistration",
    "controlPlane",
];
/// Fields of `discovery.bootstrapToken`, the same in every API.
const BOOTSTRAP_TOKEN: &[&str] = &[
    "token",
    "apiServerEndpoint",
    "caCertHashes",
    "unsafeSkipCAVerification",
];
/// Fields of `nodeRegistration` every API knows.
const REGISTRATION: &[&str] = &[
    "name",
    "criSocket",
    "taints",
    "kubeletExtraArgs",
    "ignorePreflightErrors",
];

impl ConfigApi {
    /// The API of an `apiVersion`; None for anything but v1beta2, v1beta3 and v1beta4.
    pub fn parse(api_version: &str) -> Option<Self> {
        match api_version {
            "kubeadm.k8s.io/v1beta2" => Some(Self::V1beta2),
            "kubeadm.k8s.io/v1beta3" => Some(Self::V1beta3),
            "kubeadm.k8s.io/v1beta4" => Some(Self::V1beta4),
            _ => None,
        }
    }

    /// `kubeadm.k8s.io/<version>`.
    pub fn api_version(self) -> &'static str {
        match self {
            Self::V1beta2 => "kubeadm.k8s.io/v1beta2",
            Self::V1beta3 => "kubeadm.k8s.io/v1beta3",
            Self::V1beta4 => "kubeadm.k8s.io/v1beta4",
        }
    }

    /// The first minor release (of 1.x) whose kubeadm reads this API, and the last one, if
    /// it was removed.
    fn read_by_minors(self) -> (u32, Option<u32>) {
        match self {
            Self::V1beta2 => (15, Some(25)),
            Self::V1beta3 => (22, None),
            Self::V1beta4 => (31, None),
        }
    }

    /// Whether the kubeadm of release `kubeadm` reads this API; the error is what it says
    /// when it does not (and `kubeadm join` then stops before it does anything).
    pub fn readable_by(self, kubeadm: KubeVersion) -> Result<(), String> {
        let (first, last) = self.read_by_minors();
        let version = format!("v{}.{}.{}", kubeadm.major, kubeadm.minor, kubeadm.patch);
        if kubeadm.major != 1 || kubeadm.minor < first {
            return Err(format!(
                "kubeadm {version} cannot read the JoinConfiguration: no kind \"JoinConfiguration\" is registered for version \"{}\" (kubeadm reads it from v1.{first})",
                self.api_version()
            ));
        }
        if let Some(last) = last.filter(|last| kubeadm.minor > *last) {
            return Err(format!(
                "kubeadm {version} cannot read the JoinConfiguration: your configuration file uses an old API spec: \"{}\" (removed after v1.{last})",
                self.api_version()
            ));
        }
        Ok(())
    }

    /// `nodeRegistration.kubeletExtraArgs` is a list of `{name, value}` (v1beta4), not a map.
    pub fn kubelet_args_as_list(self) -> bool {
        self == Self::V1beta4
    }

    fn top(self) -> Vec<&'static str> {
        let mut known = TOP.to_vec();
        if self != Self::V1beta2 {
            known.extend(["skipPhases", "patches"]);
        }
        if self == Self::V1beta4 {
            known.extend(["dryRun", "timeouts"]);
        }
        known
    }

    fn discovery(self) -> Vec<&'static str> {
        let mut known = vec!["bootstrapToken", "file", "tlsBootstrapToken"];
        // v1beta4 moved it to `timeouts.discovery`.
        if self != Self::V1beta4 {
            known.push("timeout");
        }
        known
    }

    fn registration(self) -> Vec<&'static str> {
        let mut known = REGISTRATION.to_vec();
        if self != Self::V1beta2 {
            known.push("imagePullPolicy");
        }
        if self == Self::V1beta4 {
            known.push("imagePullSerial");
        }
        known
    }

    /// The fields of `doc` (a JoinConfiguration of this API) that this API does not have,
    /// as kubeadm warns about them (and then ignores them).
    pub fn unknown_fields(self, doc: &Value) -> Vec<String> {
        let mut out = unknown_keys(Some(doc), &self.top(), "");
        let discovery = doc.get("discovery");
        out.extend(unknown_keys(discovery, &self.discovery(), "discovery."));
        out.extend(unknown_keys(
            discovery.and_then(|d| d.get("bootstrapToken")),
            BOOTSTRAP_TOKEN,
            "discovery.bootstrapToken.",
        ));
        out.extend(unknown_keys(
            doc.get("nodeRegistration"),
            &self.registration(),
            "nodeRegistration.",
        ));
        out
    }

    /// Refuses `kubeletExtraArgs` in the other APIs' shape, as kubeadm's decoder does.
    pub fn check_kubelet_extra_args(self, doc: &Value) -> Result<(), String> {
        let at = "nodeRegistration.kubeletExtraArgs";
        match (doc.pointer("/nodeRegistration/kubeletExtraArgs"), self.kubelet_args_as_list()) {
            (Some(Value::Object(_)), true) => Err(format!(
                "{}: cannot unmarshal object into {at} of type []Arg (a list of {{name, value}} since v1beta4)",
                self.api_version()
            )),
            (Some(Value::Array(_)), false) => Err(format!(
                "{}: cannot unmarshal array into {at} of type map[string]string (a list only from v1beta4)",
                self.api_version()
            )),
            _ => Ok(()),
        }
    }

    /// Where this API keeps the discovery timeout: `discovery.timeout` before v1beta4,
    /// `timeouts.discovery` from v1beta4.
    pub fn discovery_timeout(self, doc: &Value) -> Option<&Value> {
        match self {
            Self::V1beta4 => doc.pointer("/timeouts/discovery"),
            _ => doc.pointer("/discovery/timeout"),
        }
        .filter(|v| !v.is_null())
    }
}

/// Why kubeadm's token discovery cannot finish with `token` (`<id>.<secret>`), given the
/// data of the tenant's Secret `kube-system/bootstrap-token-<id>` at `now`; None when it
/// can. The bootstrap signer signs `kube-public/cluster-info` for the token's id only while
/// the token has `usage-bootstrap-signing: "true"` and has not expired, and kubeadm checks
/// that signature with the token's secret: another secret under the same id fails it.
pub fn discovery_token_problem(
    token: &str,
    data: &std::collections::BTreeMap<String, String>,
    now: k8s_openapi::jiff::Timestamp,
) -> Option<String> {
    let (id, secret) = token.split_once('.').unwrap_or((token, ""));
    let name = format!("bootstrap-token-{id}");
    if data.get("token-secret").map(String::as_str) != Some(secret) {
        return Some(format!(
            "the discovery token's secret is not the one in {name}: failed to verify JWS signature of the cluster-info ConfigMap"
        ));
    }
    if data.get("usage-bootstrap-signing").map(String::as_str) != Some("true") {
        return Some(format!(
            "{name} lacks usage-bootstrap-signing: \"true\", so cluster-info is never signed for it and discovery cannot finish"
        ));
    }
    if let Some(expiration) = data.get("expiration") {
        match expiration.parse::<k8s_openapi::jiff::Timestamp>() {
            Ok(at) if at > now => {}
            Ok(_) => {
                return Some(format!(
                    "{name} expired at {expiration}: its cluster-info signature is gone and discovery cannot finish"
                ))
            }
            Err(_) => {
                return Some(format!(
                    "{name} has an expiration {expiration:?} that is not an RFC 3339 time: the bootstrap signer ignores it"
                ))
            }
        }
    }
    None
}

fn unknown_keys(value: Option<&Value>, known: &[&str], at: &str) -> Vec<String> {
    value
        .and_then(Value::as_object)
        .map(|m| {
            m.keys()
                .map(String::as_str)
                .filter(|k| !known.contains(k))
                .map(|k| format!("unknown field {at}{k}"))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn v(minor: u32) -> KubeVersion {
        KubeVersion::new(1, minor, 3)
    }

    #[test]
    fn each_kubeadm_release_reads_only_the_configuration_apis_it_has() {
        use ConfigApi::*;
        let reads = |api: ConfigApi, minor| api.readable_by(v(minor)).is_ok();
        assert!(reads(V1beta2, 15) && reads(V1beta2, 20) && reads(V1beta2, 25));
        assert!(!reads(V1beta2, 14) && !reads(V1beta2, 26) && !reads(V1beta2, 34));
        assert!(!reads(V1beta3, 20) && !reads(V1beta3, 21));
        assert!(reads(V1beta3, 22) && reads(V1beta3, 30) && reads(V1beta3, 34));
        assert!(!reads(V1beta4, 20) && !reads(V1beta4, 30));
        assert!(reads(V1beta4, 31) && reads(V1beta4, 34));
        let err = V1beta3.readable_by(v(20)).unwrap_err();
        assert!(
            err.contains("v1.20.3") && err.contains("kubeadm.k8s.io/v1beta3"),
            "{err}"
        );
        let err = V1beta2.readable_by(v(26)).unwrap_err();
        assert!(err.contains("old API spec"), "{err}");
    }

    #[test]
    fn autonodes_writes_for_each_release_an_api_its_kubeadm_reads() {
        // The renderer's choice (autonodes-core) against this file's reading of kubeadm.
        for minor in 15..=36 {
            let version = v(minor);
            let api = ConfigApi::parse(version.kubeadm_api_version()).expect("known API");
            assert_eq!(api.readable_by(version), Ok(()), "1.{minor}");
            assert_eq!(
                api.kubelet_args_as_list(),
                version.kubelet_args_as_list(),
                "1.{minor}"
            );
        }
    }

    #[test]
    fn discovery_fails_with_another_secret_an_expired_token_or_one_not_for_signing() {
        use k8s_openapi::jiff::{SignedDuration, Timestamp};
        use std::collections::BTreeMap;
        let now = Timestamp::now();
        let later = (now + SignedDuration::from_mins(15)).to_string();
        let data = |secret: &str, signing: &str, expiration: &str| {
            BTreeMap::from([
                ("token-id".to_string(), "abcdef".to_string()),
                ("token-secret".to_string(), secret.to_string()),
                ("usage-bootstrap-signing".to_string(), signing.to_string()),
                ("expiration".to_string(), expiration.to_string()),
            ])
        };
        let token = "abcdef.0123456789abcdef";
        let good = data("0123456789abcdef", "true", &later);
        assert_eq!(discovery_token_problem(token, &good, now), None);
        let problem = |d: &BTreeMap<String, String>| {
            discovery_token_problem(token, d, now).unwrap_or_default()
        };
        assert!(problem(&data("ffffffffffffffff", "true", &later)).contains("JWS"));
        assert!(
            problem(&data("0123456789abcdef", "false", &later)).contains("usage-bootstrap-signing")
        );
        let earlier = (now - SignedDuration::from_mins(1)).to_string();
        assert!(problem(&data("0123456789abcdef", "true", &earlier)).contains("expired"));
        let mut no_expiry = good.clone();
        no_expiry.remove("expiration");
        assert_eq!(discovery_token_problem(token, &no_expiry, now), None);
    }

    #[test]
    fn kubelet_extra_args_in_the_shape_of_another_api_are_refused() {
        let map = json!({"nodeRegistration": {"kubeletExtraArgs": {"provider-id": "x"}}});
        let list = json!({"nodeRegistration": {"kubeletExtraArgs": [{"name": "provider-id", "value": "x"}]}});
        let err = ConfigApi::V1beta4
            .check_kubelet_extra_args(&map)
            .unwrap_err();
        assert!(err.contains("cannot unmarshal object"), "{err}");
        for api in [ConfigApi::V1beta2, ConfigApi::V1beta3] {
            let err = api.check_kubelet_extra_args(&list).unwrap_err();
            assert!(err.contains("cannot unmarshal array"), "{err}");
            assert_eq!(api.check_kubelet_extra_args(&map), Ok(()));
        }
        assert_eq!(ConfigApi::V1beta4.check_kubelet_extra_args(&list), Ok(()));
        let none = json!({"nodeRegistration": {"kubeletExtraArgs": null}});
        assert_eq!(ConfigApi::V1beta4.check_kubelet_extra_args(&none), Ok(()));
    }

    #[test]
    fn fields_of_another_api_are_unknown_fields_and_the_timeout_is_read_where_the_api_keeps_it() {
        let doc = json!({
            "apiVersion": "x", "kind": "JoinConfiguration",
            "skipPhases": [], "timeouts": {"discovery": "1m0s"},
            "discovery": {"timeout": "2m0s", "bootstrapToken": {"token": "t"}},
            "nodeRegistration": {"imagePullPolicy": "IfNotPresent", "imagePullSerial": true},
        });
        assert_eq!(
            ConfigApi::V1beta2.unknown_fields(&doc),
            [
                "unknown field skipPhases",
                "unknown field timeouts",
                "unknown field nodeRegistration.imagePullPolicy",
                "unknown field nodeRegistration.imagePullSerial",
            ]
        );
        assert_eq!(
            ConfigApi::V1beta3.unknown_fields(&doc),
            [
                "unknown field timeouts",
                "unknown field nodeRegistration.imagePullSerial",
            ]
        );
        assert_eq!(
            ConfigApi::V1beta4.unknown_fields(&doc),
            ["unknown field discovery.timeout"]
        );
        assert_eq!(
            ConfigApi::V1beta3.discovery_timeout(&doc),
            Some(&json!("2m0s"))
        );
        assert_eq!(
            ConfigApi::V1beta4.discovery_timeout(&doc),
            Some(&json!("1m0s"))
        );
    }
}

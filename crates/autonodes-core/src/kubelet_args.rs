//! The kubelet arguments a claim or pool gives (`kubeletArgs`), read as the kubelet reads
//! them: a name with `_` is the same flag as with `-` (the kubelet's flag set normalises
//! word separators), so every name is put in that form before anything is checked.
//!
//! kubeadm writes the arguments into one environment variable (`KUBELET_KUBEADM_ARGS` in
//! `/var/lib/kubelet/kubeadm-flags.env`) that systemd splits at spaces: a value is therefore
//! held to characters that can neither end the argument nor start another one (no space,
//! quote, backslash, `$` or control character). Reserved
//! are the flags autonodes or kubeadm set for the node (its provider ID, labels, taints,
//! name, container runtime) and those that change the node's identity or credentials
//! (kubeconfigs, certificates, who may call the kubelet).

use std::collections::BTreeMap;

/// The flags no `kubeletArgs` entry may set, in their canonical form (see [`canonical`]).
pub const RESERVED: [&str; 19] = [
    // Set by autonodes: the claim's VM, its labels and the default cgroup driver aside.
    "provider-id",
    "node-labels",
    // Set by kubeadm from the JoinConfiguration autonodes writes.
    "register-with-taints",
    "hostname-override",
    "container-runtime-endpoint",
    "config",
    "kubeconfig",
    "bootstrap-kubeconfig",
    // Where the node's credentials are, and whether it registers at all.
    "cert-dir",
    "root-dir",
    "tls-cert-file",
    "tls-private-key-file",
    "rotate-certificates",
    "register-node",
    "register-schedulable",
    // Who may call the kubelet's own API.
    "client-ca-file",
    "anonymous-auth",
    "authorization-mode",
    "authentication-token-webhook",
];

/// The longest flag name accepted (the kubelet's longest is under 50 characters).
pub const NAME_MAX: usize = 100;

/// Why a `kubeletArgs` entry is refused. Each names the entry as it was given (shortened
/// and with control characters escaped, see [`shown`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KubeletArgError {
    /// The name is no kubelet flag's: lower-case letters, digits and `-` (or `_`), starting
    /// with a letter, at most [`NAME_MAX`] characters after up to two leading dashes.
    #[error("kubeletArgs {given}: not a kubelet flag name (lower-case letters, digits and dashes, starting with a letter, at most {NAME_MAX} characters)")]
    InvalidName {
        /// The entry's name as given, for the message.
        given: String,
    },
    /// The name is one autonodes sets, or one that changes the node's identity or
    /// credentials ([`RESERVED`]).
    #[error("kubeletArgs {given} is the kubelet flag --{flag}, which autonodes sets or which changes the node's identity or credentials; it cannot be given")]
    Reserved {
        /// The entry's name as given, for the message.
        given: String,
        /// The flag it names.
        flag: &'static str,
    },
    /// Two entries name the same flag (`max_pods` and `max-pods`).
    #[error("kubeletArgs {given} and {other} are the same flag --{flag}; give it once")]
    Repeated {
        /// One entry's name as given.
        given: String,
        /// The other's.
        other: String,
        /// The flag both name.
        flag: String,
    },
    /// The value holds a character that could end the argument or start another.
    #[error("kubeletArgs {given}: the value holds {found}; a value may hold letters, digits and . , : = / + @ < > * ~ % _ - only")]
    InvalidValue {
        /// The entry's name as given, for the message.
        given: String,
        /// The first character refused, described.
        found: String,
    },
}

/// The kubelet flag `name` means: up to two leading dashes dropped, `_` read as `-`.
pub fn canonical(name: &str) -> String {
    let bare = name
        .strip_prefix("--")
        .or_else(|| name.strip_prefix('-'))
        .unwrap_or(name);
    bare.replace('_', "-")
}

/// `given` for a message: at most 64 characters, quoted, control characters escaped.
pub fn shown(given: &str) -> String {
    let short: String = given.chars().take(64).collect();
    let more = if given.chars().count() > 64 {
        "…"
    } else {
        ""
    };
    format!("{short:?}{more}")
}

/// Whether `c` may be part of a kubelet argument's value.
fn value_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || ".,:=/+@<>*~%_-".contains(c)
}

/// Whether `flag` (canonical) is a flag name: a lower-case letter, then lower-case letters,
/// digits and single dashes.
fn flag_name(flag: &str) -> bool {
    let mut chars = flag.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && flag.len() <= NAME_MAX
        && flag
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !flag.ends_with('-')
        && !flag.contains("--")
}

/// The arguments `given` as the kubelet gets them (canonical names, see [`canonical`]), or
/// the first entry refused.
pub fn checked(
    given: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, KubeletArgError> {
    let mut out: BTreeMap<String, (String, &String)> = BTreeMap::new();
    for (name, value) in given {
        let flag = canonical(name);
        if !flag_name(&flag) {
            return Err(KubeletArgError::InvalidName { given: shown(name) });
        }
        if let Some(reserved) = RESERVED.iter().find(|r| **r == flag) {
            return Err(KubeletArgError::Reserved {
                given: shown(name),
                flag: reserved,
            });
        }
        if let Some(c) = value.chars().find(|c| !value_char(*c)) {
            let found = match c {
                ' ' => "a space".to_string(),
                c if c.is_control() || c.is_whitespace() => {
                    format!("the control character {:?}", c.escape_default().to_string())
                }
                c => format!("{c:?}"),
            };
            return Err(KubeletArgError::InvalidValue {
                given: shown(name),
                found,
            });
        }
        if let Some((other, _)) = out.get(&flag) {
            return Err(KubeletArgError::Repeated {
                given: shown(other),
                other: shown(name),
                flag,
            });
        }
        out.insert(flag, (name.clone(), value));
    }
    Ok(out.into_iter().map(|(k, (_, v))| (k, v.clone())).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn args(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
        entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_flags_people_pass_are_kept_with_their_names_in_the_kubelets_form() {
        let given = args(&[
            ("max_pods", "110"),
            (
                "--eviction-hard",
                "memory.available<100Mi,nodefs.available<10%",
            ),
            ("kube-reserved", "cpu=500m,memory=1Gi"),
            ("feature-gates", "InPlacePodVerticalScaling=true"),
            ("node-ip", "fd00::a"),
            ("allowed-unsafe-sysctls", "net.core.*"),
            ("resolv-conf", "/run/systemd/resolve/resolv.conf"),
            ("cgroup-driver", "cgroupfs"),
            ("v", "2"),
        ]);
        let out = checked(&given).expect("accepted");
        assert_eq!(out["max-pods"], "110");
        assert_eq!(
            out["eviction-hard"],
            "memory.available<100Mi,nodefs.available<10%"
        );
        assert!(!out.contains_key("max_pods") && !out.contains_key("--eviction-hard"));
        assert_eq!(out.len(), given.len());
    }

    #[test]
    fn a_reserved_flag_is_refused_however_it_is_spelled() {
        for spelling in [
            "provider-id",
            "provider_id",
            "--provider_id",
            "-provider-id",
            "node_labels",
            "register_with_taints",
            "hostname-override",
            "kubeconfig",
            "bootstrap_kubeconfig",
            "cert-dir",
            "config",
        ] {
            let e = checked(&args(&[(spelling, "x")])).expect_err(spelling);
            assert!(
                matches!(e, KubeletArgError::Reserved { .. }),
                "{spelling}: {e}"
            );
            assert!(e.to_string().contains(&format!("{spelling:?}")), "{e}");
        }
    }

    #[test]
    fn two_spellings_of_one_flag_are_refused_rather_than_one_winning() {
        let e = checked(&args(&[("max-pods", "10"), ("max_pods", "500")])).expect_err("same");
        assert_eq!(
            e.to_string(),
            "kubeletArgs \"max-pods\" and \"max_pods\" are the same flag --max-pods; give it once"
        );
    }

    #[test]
    fn a_value_that_could_end_the_argument_or_start_another_is_refused_with_what_it_holds() {
        for (value, found) in [
            ("10 --provider-id=kubevirt://other", "a space"),
            ("10\n--provider-id=x", "the control character \"\\\\n\""),
            ("\"10\"", "'\"'"),
            ("$(reboot)", "'$'"),
            ("a;b", "';'"),
            ("a\\b", "'\\\\'"),
            ("é", "'é'"),
        ] {
            let e = checked(&args(&[("max-pods", value)])).expect_err(value);
            assert_eq!(
                e,
                KubeletArgError::InvalidValue {
                    given: "\"max-pods\"".into(),
                    found: found.into()
                },
                "{value:?}"
            );
        }
    }

    #[test]
    fn a_name_that_is_no_flag_is_refused_and_shown_shortened_and_escaped() {
        for name in [
            "", "-", "---x", "Max-Pods", "9lives", "a b", "a=b", "x-", "a--b",
        ] {
            let e = checked(&args(&[(name, "1")])).expect_err(name);
            assert!(matches!(e, KubeletArgError::InvalidName { .. }), "{name:?}");
        }
        let long = format!("a{}", "\u{1b}[31m".repeat(40));
        let message = checked(&args(&[(&long, "1")]))
            .expect_err("long")
            .to_string();
        assert!(!message.contains('\u{1b}'), "{message}");
        assert!(message.contains('…') && message.len() < 400, "{message}");
    }

    proptest! {
        #[test]
        fn whatever_is_accepted_is_canonical_unreserved_and_safe_for_a_space_split_line(
            entries in proptest::collection::btree_map("[-_a-zA-Z0-9 =]{0,12}", "[ -~\n]{0,16}", 0..6)
        ) {
            if let Ok(out) = checked(&entries) {
                prop_assert_eq!(out.len(), entries.len());
                for (flag, value) in &out {
                    prop_assert!(flag_name(flag));
                    prop_assert!(!RESERVED.contains(&flag.as_str()));
                    prop_assert!(value.chars().all(value_char));
                    let line = format!("--{flag}={value}");
                    prop_assert_eq!(line.split_whitespace().count(), 1);
                    prop_assert!(!line.contains(['"', '\'', '$', '\\', ';', '`']));
                }
            }
        }
    }
}

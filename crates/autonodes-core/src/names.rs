//! Names and label values autonodes derives from names users choose, made to fit the
//! limits Kubernetes enforces (a label value at most 63 characters, an object name at most
//! 253). A user may name a claim or a pool with up to 253 characters; what autonodes builds
//! from such a name is cut and given a hash of the whole name, so it stays unique, stable
//! across restarts and valid. Pure: no I/O.

/// Longest label value Kubernetes accepts.
pub(crate) const MAX_LABEL_VALUE: usize = 63;
/// Longest object name (a DNS-1123 subdomain) Kubernetes accepts.
pub(crate) const MAX_NAME: usize = 253;
/// Hex digits of the hash appended to a shortened name.
const HASH_DIGITS: usize = 10;

/// 64-bit FNV-1a over `parts`, each followed by a 0 byte (so `("ab","c")` and `("a","bc")`
/// differ). Stable across versions and platforms: names derived from it are stored.
pub(crate) fn fnv1a(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in part.bytes().chain(std::iter::once(0)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// Whether `s` is a non-empty label value: at most 63 characters of `[A-Za-z0-9._-]`,
/// starting and ending with a letter or digit.
pub fn is_label_value(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_LABEL_VALUE
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Whether `s` is a DNS-1123 label: at most 63 characters of `[a-z0-9-]`, starting and
/// ending with a letter or digit (a namespace, a node type entry's name).
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_LABEL_VALUE
        && is_lower_alnum(b[0])
        && is_lower_alnum(b[b.len() - 1])
        && b.iter().all(|c| is_lower_alnum(*c) || *c == b'-')
}

/// Whether `s` is a DNS-1123 subdomain of at most `max` characters: DNS labels (of any
/// length) joined by dots (an object name).
pub fn is_dns_subdomain(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.split('.').all(|part| {
            let b = part.as_bytes();
            !b.is_empty()
                && is_lower_alnum(b[0])
                && is_lower_alnum(b[b.len() - 1])
                && b.iter().all(|c| is_lower_alnum(*c) || *c == b'-')
        })
}

/// Whether `s` is a qualified name as label and taint keys are (`name` or `prefix/name`:
/// the prefix a DNS subdomain, the name a non-empty label value), at most
/// [`MAX_QUALIFIED_NAME`] characters in all — shorter than Kubernetes allows (a 253-character
/// prefix and a 63-character name) so that a schema pattern can say it.
pub fn is_qualified_name(s: &str) -> bool {
    if s.len() > MAX_QUALIFIED_NAME {
        return false;
    }
    match s.split_once('/') {
        Some((prefix, name)) => is_dns_subdomain(prefix, MAX_NAME) && is_label_value(name),
        None => is_label_value(s),
    }
}

/// Longest qualified name (label or taint key) autonodes accepts.
pub(crate) const MAX_QUALIFIED_NAME: usize = 253;

fn is_lower_alnum(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// `s` cut to `max - 11` characters of `[A-Za-z0-9._-]` (others become `-`), ending in a
/// letter or digit, then `-` and 10 hex digits of the hash of the whole of `s`.
fn shortened(s: &str, max: usize) -> String {
    let hash = format!("{:0width$x}", fnv1a(&[s]), width = HASH_DIGITS);
    let hash = &hash[hash.len() - HASH_DIGITS..];
    let keep = max - HASH_DIGITS - 1;
    let prefix: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .take(keep)
        .collect();
    let prefix = prefix.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    let prefix = prefix.trim_start_matches(|c: char| !c.is_ascii_alphanumeric());
    if prefix.is_empty() {
        format!("x-{hash}")
    } else {
        format!("{prefix}-{hash}")
    }
}

/// The label value for a name: the name itself when it is a valid label value, else its
/// first characters and a hash of all of it (at most 63 characters). Deterministic, so a
/// selector built from the same name finds the objects labelled with it.
pub fn label_value(name: &str) -> String {
    if is_label_value(name) {
        name.to_string()
    } else {
        shortened(name, MAX_LABEL_VALUE)
    }
}

/// `<base><suffix>` when it fits in an object name, else `base` shortened (with its hash)
/// so that the whole is at most 253 characters. `suffix` is short and valid, e.g. `-x7k2p`.
pub(crate) fn child_name(base: &str, suffix: &str) -> String {
    if base.len() + suffix.len() <= MAX_NAME {
        format!("{base}{suffix}")
    } else {
        let room = MAX_NAME.saturating_sub(suffix.len()).max(HASH_DIGITS + 2);
        format!("{}{suffix}", shortened(base, room).to_ascii_lowercase())
    }
}

/// The host namespace of tenant namespace `tenant` for a provider placing VMs per tenant:
/// `<prefix><tenant>`, shortened with a hash of the whole (a DNS label of at most 63
/// characters) when longer.
pub fn tenant_vm_namespace(prefix: &str, tenant: &str) -> String {
    let whole = format!("{prefix}{tenant}");
    if is_dns_label(&whole) {
        whole
    } else {
        shortened(&whole, MAX_LABEL_VALUE)
            .to_ascii_lowercase()
            .replace(['.', '_'], "-")
    }
}

/// The name of an Event about the object `object`: `<object>.<nanoseconds in hex>`, the
/// object part shortened (with its hash) when the whole would pass 253 characters.
pub fn event_name(object: &str, nanos: i128) -> String {
    child_name(object, &format!(".{nanos:x}"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_and_keys_are_checked_as_the_api_server_checks_them() {
        assert!(is_dns_label("tenant-1"));
        assert!(!is_dns_label("Tenant") && !is_dns_label("-a") && !is_dns_label(&"a".repeat(64)));
        assert!(is_dns_subdomain("vc.example-1.io", 253));
        assert!(!is_dns_subdomain("a..b", 253) && !is_dns_subdomain("a_b", 253));
        assert!(!is_dns_subdomain(&"a".repeat(251), 250));
        for ok in [
            "role",
            "example.com/role",
            "a/B_c.d-e",
            "node-role.kubernetes.io/worker",
        ] {
            assert!(is_qualified_name(ok), "{ok}");
        }
        for bad in [
            "",
            "/a",
            "a/",
            "a/b/c",
            "Example.com/a",
            "a/-b",
            &format!("a/{}", "b".repeat(64)),
        ] {
            assert!(!is_qualified_name(bad), "{bad}");
        }
        assert!(!is_qualified_name(&format!("{}/a", "b".repeat(252))));
    }

    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_name_that_fits_is_its_own_label_value() {
        assert_eq!(label_value("standard-1"), "standard-1");
        assert_eq!(label_value(&"a".repeat(63)), "a".repeat(63));
    }

    #[test]
    fn a_long_name_gets_a_shortened_label_value_with_a_hash_of_all_of_it() {
        let long = format!("{}-{}", "a".repeat(100), "b".repeat(152));
        let v = label_value(&long);
        assert_eq!(v.len(), 63);
        assert!(is_label_value(&v), "{v}");
        assert!(v.starts_with("aaaa"), "{v}");
        // Names sharing their first 52 characters still get different values.
        let other = format!("{}-{}", "a".repeat(100), "c".repeat(152));
        assert_ne!(label_value(&other), v);
        assert_eq!(label_value(&long), v, "deterministic");
    }

    #[test]
    fn event_names_fit_for_the_longest_object_names() {
        let long = "n".repeat(253);
        let e = event_name(&long, 0x1876_5432_1234_5678);
        assert!(e.len() <= MAX_NAME, "{}", e.len());
        assert!(e.ends_with(".1876543212345678"), "{e}");
        assert_eq!(event_name("claim", 255), "claim.ff");
    }

    #[test]
    fn child_names_fit_and_keep_their_suffix() {
        assert_eq!(child_name("pool", "-abcde"), "pool-abcde");
        let c = child_name(&"p".repeat(253), "-abcde");
        assert_eq!(c.len(), MAX_NAME);
        assert!(c.ends_with("-abcde"), "{c}");
    }

    proptest! {
        #[test]
        fn every_label_value_is_valid(name in "[a-z0-9.-]{1,253}") {
            let v = label_value(&name);
            prop_assert!(is_label_value(&v), "{v:?}");
        }

        #[test]
        fn every_event_name_fits(name in "[a-z0-9][a-z0-9.-]{0,252}", nanos in 0i128..i128::MAX) {
            prop_assert!(event_name(&name, nanos).len() <= MAX_NAME);
        }
    }
}

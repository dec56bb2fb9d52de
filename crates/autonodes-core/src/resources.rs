//! Kubernetes resource quantities: parsing and arithmetic (pure, no I/O).
//!
//! Every quantity is held as an exact number of *milli-units* (`i128`): for `cpu` that is
//! millicores, for `memory` thousandths of a byte, for extended resources thousandths of a
//! unit. Values finer than a milli-unit are rounded up, as the Kubernetes API server does
//! (`0.1m` becomes `1m`).

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use autonodes_api::ResourceList;

/// The resource name for CPU.
pub const CPU: &str = "cpu";
/// The resource name for memory.
pub(crate) const MEMORY: &str = "memory";

/// One GiB in bytes.
pub(crate) const GIB: i128 = 1 << 30;

/// A quantity string that is not a valid Kubernetes quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid quantity {input:?}: {reason}")]
pub struct QuantityError {
    /// The text that was parsed.
    pub input: String,
    /// Why it is not a quantity.
    pub reason: &'static str,
}

/// A resource list entry that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceError {
    /// The quantity does not parse.
    #[error("resource {resource}: {source}")]
    Invalid {
        /// The resource name (`cpu`, `memory`, ...).
        resource: String,
        /// The parse error.
        source: QuantityError,
    },
    /// The quantity is negative.
    #[error("resource {resource}: {value:?} is negative")]
    Negative {
        /// The resource name.
        resource: String,
        /// The quantity as written.
        value: String,
    },
}

fn err(input: &str, reason: &'static str) -> QuantityError {
    QuantityError {
        input: input.to_string(),
        reason,
    }
}

/// Largest magnitude of a quantity in milli-units: Kubernetes caps quantities at 2^63-1.
pub(crate) const MAX_QUANTITY_MILLIS: i128 = i64::MAX as i128 * 1000;

/// Parses a Kubernetes quantity (`4`, `500m`, `16Gi`, `1.5`, `2e3`, `1k`) into milli-units,
/// rounding anything finer than a milli-unit up (away from zero) and capping the magnitude
/// at 2^63-1 units, as Kubernetes does. Every string the CRDs' quantity pattern admits
/// parses; only malformed text is an error.
pub fn parse_quantity(input: &str) -> Result<i128, QuantityError> {
    let s = input.trim();
    if s.is_empty() {
        return Err(err(input, "empty"));
    }
    let (negative, rest) = match s.as_bytes()[0] {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let number_end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(number_end);
    let (int_digits, frac_digits) = match number.split_once('.') {
        Some((i, f)) => (i, f),
        None => (number, ""),
    };
    if int_digits.is_empty() && frac_digits.is_empty() {
        return Err(err(input, "no digits"));
    }
    if frac_digits.contains('.') {
        return Err(err(input, "more than one decimal point"));
    }
    // Power-of-two and power-of-ten multipliers of the suffix.
    let (pow2, pow10): (u32, i64) = match suffix {
        "" => (0, 0),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        other if other.starts_with(['e', 'E']) => {
            let exp = &other[1..];
            let digits = exp.strip_prefix(['+', '-']).unwrap_or(exp);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(err(input, "exponent is not an integer"));
            }
            // Any exponent beyond ±10^6 caps or rounds the same way as 10^6 does.
            let digits = digits.trim_start_matches('0');
            let magnitude: i64 = if digits.len() > 6 {
                1_000_000
            } else {
                digits.parse().unwrap_or(0)
            };
            (
                0,
                if exp.starts_with('-') {
                    -magnitude
                } else {
                    magnitude
                },
            )
        }
        _ => return Err(err(input, "unknown suffix")),
    };
    let all_digits = || int_digits.chars().chain(frac_digits.chars());
    // Significant digits (leading zeros dropped); trailing zeros move into the exponent.
    let significant: String = all_digits().skip_while(|c| *c == '0').collect();
    let kept = significant.trim_end_matches('0');
    if kept.is_empty() {
        return Ok(0);
    }
    let mut exponent: i64 =
        pow10 + 3 - frac_digits.len() as i64 + (significant.len() - kept.len()) as i64;
    // More digits than an i128 holds: keep the first 36, the rest only round up.
    let (kept, dropped_nonzero) = if kept.len() > 36 {
        exponent += (kept.len() - 36) as i64;
        (&kept[..36], true)
    } else {
        (kept, false)
    };
    let capped = || {
        if negative {
            -MAX_QUANTITY_MILLIS
        } else {
            MAX_QUANTITY_MILLIS
        }
    };
    let mut mantissa: i128 = kept.parse().map_err(|_| err(input, "not a number"))?;
    if dropped_nonzero {
        mantissa += 1;
    }
    mantissa = match mantissa.checked_mul(1i128 << pow2) {
        Some(m) => m,
        None => return Ok(capped()),
    };
    while exponent > 0 {
        if mantissa > MAX_QUANTITY_MILLIS {
            return Ok(capped());
        }
        mantissa *= 10;
        exponent -= 1;
    }
    if exponent < 0 {
        // Round up: any remainder makes one more milli-unit.
        let mut rounded_up = false;
        while exponent < 0 && mantissa > 0 {
            if mantissa % 10 != 0 {
                rounded_up = true;
            }
            mantissa /= 10;
            exponent += 1;
        }
        if rounded_up || mantissa == 0 {
            mantissa += 1;
        }
    }
    let mantissa = mantissa.min(MAX_QUANTITY_MILLIS);
    Ok(if negative { -mantissa } else { mantissa })
}

/// Millicores of a CPU quantity (`2` → 2000, `500m` → 500).
pub fn cpu_millis(q: &Quantity) -> Result<i128, QuantityError> {
    parse_quantity(&q.0)
}

/// Bytes of a memory quantity (`4Gi` → 4294967296), rounded up to whole bytes.
pub fn memory_bytes(q: &Quantity) -> Result<i128, QuantityError> {
    Ok(ceil_div(parse_quantity(&q.0)?, 1000))
}

fn ceil_div(a: i128, b: i128) -> i128 {
    let d = a / b;
    if a % b != 0 && (a > 0) == (b > 0) {
        d + 1
    } else {
        d
    }
}

/// Whether a resource name is an extended resource (a domain-qualified name outside
/// `kubernetes.io`, such as `nvidia.com/gpu`), as opposed to a native one (`cpu`, `memory`,
/// `ephemeral-storage`, `hugepages-2Mi`, ...).
pub(crate) fn is_extended_resource(name: &str) -> bool {
    match name.split_once('/') {
        Some((domain, _)) => domain != "kubernetes.io" && !domain.ends_with(".kubernetes.io"),
        None => false,
    }
}

/// Formats millicores the way Kubernetes prints CPU (`2`, `1500m`).
pub(crate) fn format_cpu(millis: i128) -> String {
    if millis % 1000 == 0 {
        (millis / 1000).to_string()
    } else {
        format!("{millis}m")
    }
}

/// Formats bytes with the largest binary suffix that divides them exactly (`16Gi`, `512Mi`).
pub(crate) fn format_memory(bytes: i128) -> String {
    const SUFFIXES: [(&str, u32); 6] = [
        ("Ei", 60),
        ("Pi", 50),
        ("Ti", 40),
        ("Gi", 30),
        ("Mi", 20),
        ("Ki", 10),
    ];
    if bytes != 0 {
        for (suffix, shift) in SUFFIXES {
            let unit = 1i128 << shift;
            if bytes % unit == 0 {
                return format!("{}{suffix}", bytes / unit);
            }
        }
    }
    bytes.to_string()
}

/// Parsed resources: name → amount in milli-units. Only non-negative amounts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceAmounts {
    amounts: BTreeMap<String, i128>,
}

impl ResourceAmounts {
    /// Parses a resource list; names the resource whose quantity is invalid or negative.
    pub fn from_list(list: &ResourceList) -> Result<Self, ResourceError> {
        let mut amounts = BTreeMap::new();
        for (name, q) in list {
            let milli = parse_quantity(&q.0).map_err(|source| ResourceError::Invalid {
                resource: name.clone(),
                source,
            })?;
            if milli < 0 {
                return Err(ResourceError::Negative {
                    resource: name.clone(),
                    value: q.0.clone(),
                });
            }
            amounts.insert(name.clone(), milli);
        }
        Ok(Self { amounts })
    }

    /// Amounts already in milli-units by name; a negative one counts as zero.
    pub fn from_milli(amounts: BTreeMap<String, i128>) -> Self {
        Self {
            amounts: amounts.into_iter().map(|(k, v)| (k, v.max(0))).collect(),
        }
    }

    /// The amount of a resource in milli-units (0 when absent).
    pub fn milli(&self, name: &str) -> i128 {
        self.amounts.get(name).copied().unwrap_or(0)
    }

    /// CPU in millicores.
    pub fn cpu_millis(&self) -> i128 {
        self.milli(CPU)
    }

    /// Memory in bytes (rounded up).
    pub fn memory_bytes(&self) -> i128 {
        ceil_div(self.milli(MEMORY), 1000)
    }

    /// Every resource and its amount in milli-units, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, i128)> {
        self.amounts.iter().map(|(k, v)| (k.as_str(), *v))
    }

    /// Extended resources with a non-zero amount (see [`is_extended_resource`]).
    pub fn extended(&self) -> impl Iterator<Item = (&str, i128)> {
        self.iter()
            .filter(|(name, milli)| *milli > 0 && is_extended_resource(name))
    }

    /// The first resource of `wanted` that `self` does not cover, with the wanted and the
    /// available amount in milli-units; `None` when every wanted amount is available.
    pub fn shortfall<'a>(&self, wanted: &'a ResourceAmounts) -> Option<Shortfall<'a>> {
        wanted
            .amounts
            .iter()
            .find(|(name, want)| self.milli(name) < **want)
            .map(|(name, want)| Shortfall {
                resource: name,
                wanted: *want,
                available: self.milli(name),
            })
    }

    /// The cost by the default formula: 10 per CPU, 2 per GiB of memory, 10000 per unit
    /// of every extended resource, rounded to the nearest integer.
    pub fn default_cost(&self) -> i64 {
        let cpu = self.cpu_millis() as f64 / 1000.0;
        let gib = self.memory_bytes() as f64 / GIB as f64;
        let extended: f64 = self.extended().map(|(_, m)| m as f64 / 1000.0).sum();
        let cost = (10.0 * cpu + 2.0 * gib + 10000.0 * extended).round();
        if cost >= i64::MAX as f64 {
            i64::MAX
        } else {
            cost as i64
        }
    }
}

/// A resource that is wanted in a larger amount than available.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shortfall<'a> {
    /// The resource name.
    pub resource: &'a str,
    /// The wanted amount, in milli-units.
    pub wanted: i128,
    /// The available amount, in milli-units.
    pub available: i128,
}

impl fmt::Display for Shortfall<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |milli: i128| match self.resource {
            CPU => format_cpu(milli),
            MEMORY => format_memory(ceil_div(milli, 1000)),
            _ => format_cpu(milli),
        };
        write!(
            f,
            "{} {} wanted, {} available",
            self.resource,
            show(self.wanted),
            show(self.available)
        )
    }
}

/// What a host node still has room for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Room {
    /// Millicores.
    pub cpu_millis: i128,
    /// Bytes.
    pub memory: i128,
    /// Pods.
    pub pods: i128,
}

impl Room {
    pub(crate) fn take(&mut self, r: &Room, n: i128) {
        self.cpu_millis -= r.cpu_millis * n;
        self.memory -= r.memory * n;
        self.pods -= r.pods * n;
    }

    /// How many of `r` fit in this room.
    pub(crate) fn holds(&self, r: &Room) -> i128 {
        let each = |have: i128, want: i128| {
            if want <= 0 {
                i128::MAX
            } else {
                (have / want).max(0)
            }
        };
        each(self.cpu_millis, r.cpu_millis)
            .min(each(self.memory, r.memory))
            .min(each(self.pods, r.pods))
            .max(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[(&str, &str)]) -> ResourceList {
        entries
            .iter()
            .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
            .collect()
    }

    #[test]
    fn plain_integers_and_millis_parse_to_millicores() {
        assert_eq!(parse_quantity("4"), Ok(4000));
        assert_eq!(parse_quantity("500m"), Ok(500));
        assert_eq!(parse_quantity("0.5"), Ok(500));
        assert_eq!(parse_quantity("+1.25"), Ok(1250));
        assert_eq!(parse_quantity(".5"), Ok(500));
        assert_eq!(parse_quantity("2."), Ok(2000));
        assert_eq!(parse_quantity("-3"), Ok(-3000));
        assert_eq!(parse_quantity("0"), Ok(0));
    }

    #[test]
    fn binary_and_decimal_suffixes_scale_the_number() {
        assert_eq!(parse_quantity("1Ki"), Ok(1024 * 1000));
        assert_eq!(parse_quantity("16Gi"), Ok(16 * GIB * 1000));
        assert_eq!(parse_quantity("1.5Gi"), Ok(3 * GIB / 2 * 1000));
        assert_eq!(parse_quantity("1k"), Ok(1_000_000));
        assert_eq!(parse_quantity("2M"), Ok(2_000_000_000));
        assert_eq!(parse_quantity("1E"), Ok(1_000_000_000_000_000_000_000));
        assert_eq!(parse_quantity("1Ei"), Ok((1i128 << 60) * 1000));
    }

    #[test]
    fn exponents_scale_by_powers_of_ten() {
        assert_eq!(parse_quantity("2e3"), Ok(2_000_000));
        assert_eq!(parse_quantity("2E+3"), Ok(2_000_000));
        assert_eq!(parse_quantity("5e-3"), Ok(5));
        assert_eq!(parse_quantity("1.5e1"), Ok(15_000));
    }

    #[test]
    fn values_finer_than_a_milli_unit_round_up() {
        assert_eq!(parse_quantity("0.1m"), Ok(1));
        assert_eq!(parse_quantity("1n"), Ok(1));
        assert_eq!(parse_quantity("1001u"), Ok(2));
        assert_eq!(parse_quantity("1000u"), Ok(1));
        assert_eq!(parse_quantity("0.0001"), Ok(1));
        assert_eq!(parse_quantity("0.000"), Ok(0));
    }

    #[test]
    fn malformed_quantities_are_errors_with_a_reason() {
        for bad in [
            "", "abc", "1.2.3", "1Gb", "Gi", "1e", "1e1.5", "--1", "1 Gi", "1ki", "+",
        ] {
            let e = parse_quantity(bad).expect_err(bad);
            assert_eq!(e.input, bad);
            assert!(!e.reason.is_empty());
        }
        assert_eq!(
            parse_quantity("1Gb").map_err(|e| e.to_string()),
            Err("invalid quantity \"1Gb\": unknown suffix".to_string())
        );
    }

    #[test]
    fn huge_quantities_are_capped_at_2_to_the_63_units_as_kubernetes_caps_them() {
        for huge in [
            "99999999999999999999999999999999999999999",
            "1e9999",
            "1e99999999999999999999",
            "10000000Ei",
            "9223372036854775808",
        ] {
            assert_eq!(parse_quantity(huge), Ok(MAX_QUANTITY_MILLIS), "{huge}");
        }
        assert_eq!(parse_quantity("-1e9999"), Ok(-MAX_QUANTITY_MILLIS));
        assert_eq!(
            parse_quantity("9223372036854775807"),
            Ok(MAX_QUANTITY_MILLIS)
        );
        // Vanishingly small values round up to one milli-unit; zero stays zero.
        assert_eq!(parse_quantity("1e-99999999999"), Ok(1));
        assert_eq!(parse_quantity("0e99999"), Ok(0));
        assert_eq!(
            parse_quantity("0.000000000000000000000000000000000000000001"),
            Ok(1)
        );
    }

    #[test]
    fn memory_bytes_round_up_to_whole_bytes() {
        assert_eq!(memory_bytes(&Quantity("4Gi".into())), Ok(4 * GIB));
        assert_eq!(memory_bytes(&Quantity("1500m".into())), Ok(2));
        assert_eq!(memory_bytes(&Quantity("1G".into())), Ok(1_000_000_000));
        assert_eq!(cpu_millis(&Quantity("2".into())), Ok(2000));
    }

    #[test]
    fn extended_resources_are_domain_qualified_names_outside_kubernetes_io() {
        assert!(is_extended_resource("nvidia.com/gpu"));
        assert!(is_extended_resource("example.org/fpga"));
        assert!(!is_extended_resource("cpu"));
        assert!(!is_extended_resource("memory"));
        assert!(!is_extended_resource("hugepages-2Mi"));
        assert!(!is_extended_resource("kubernetes.io/batch"));
        assert!(!is_extended_resource("requests.kubernetes.io/x"));
    }

    #[test]
    fn default_cost_is_ten_per_cpu_two_per_gib_and_ten_thousand_per_extended_unit() {
        let cost = |e: &[(&str, &str)]| {
            ResourceAmounts::from_list(&list(e))
                .expect("valid")
                .default_cost()
        };
        assert_eq!(cost(&[("cpu", "2"), ("memory", "4Gi")]), 28);
        assert_eq!(cost(&[("cpu", "4"), ("memory", "16Gi")]), 72);
        assert_eq!(cost(&[("cpu", "1"), ("memory", "2Gi")]), 14);
        assert_eq!(cost(&[("cpu", "250m"), ("memory", "512Mi")]), 4); // 2.5 + 1 = 3.5 → 4
        assert_eq!(
            cost(&[("cpu", "4"), ("memory", "16Gi"), ("nvidia.com/gpu", "1")]),
            10_072
        );
        // Native resources other than cpu and memory cost nothing.
        assert_eq!(
            cost(&[
                ("cpu", "1"),
                ("memory", "1Gi"),
                ("ephemeral-storage", "100Gi")
            ]),
            12
        );
    }

    #[test]
    fn shortfall_names_the_first_resource_not_covered() {
        let have =
            ResourceAmounts::from_list(&list(&[("cpu", "2"), ("memory", "4Gi")])).expect("valid");
        let fits = ResourceAmounts::from_list(&list(&[("cpu", "1500m"), ("memory", "4Gi")]))
            .expect("valid");
        assert_eq!(have.shortfall(&fits), None);
        let too_much = ResourceAmounts::from_list(&list(&[("memory", "8Gi")])).expect("valid");
        let s = have.shortfall(&too_much).expect("short");
        assert_eq!(s.resource, "memory");
        assert_eq!(s.to_string(), "memory 8Gi wanted, 4Gi available");
        let gpu = ResourceAmounts::from_list(&list(&[("nvidia.com/gpu", "1")])).expect("valid");
        assert_eq!(
            have.shortfall(&gpu).map(|s| s.to_string()),
            Some("nvidia.com/gpu 1 wanted, 0 available".to_string())
        );
    }

    #[test]
    fn invalid_and_negative_list_entries_name_the_resource() {
        let e = ResourceAmounts::from_list(&list(&[("cpu", "two")])).expect_err("invalid");
        assert!(
            e.to_string().starts_with("resource cpu: invalid quantity"),
            "{e}"
        );
        let e = ResourceAmounts::from_list(&list(&[("memory", "-1Gi")])).expect_err("negative");
        assert_eq!(e.to_string(), "resource memory: \"-1Gi\" is negative");
    }

    #[test]
    fn formatting_picks_whole_cpus_and_the_largest_exact_binary_suffix() {
        assert_eq!(format_cpu(4000), "4");
        assert_eq!(format_cpu(1500), "1500m");
        assert_eq!(format_memory(16 * GIB), "16Gi");
        assert_eq!(format_memory(1536 * 1024 * 1024), "1536Mi");
        assert_eq!(format_memory(1000), "1000");
        assert_eq!(format_memory(0), "0");
    }
}

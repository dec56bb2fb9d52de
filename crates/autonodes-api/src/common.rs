//! Types shared by several autonodes resources.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Resources by name (`cpu`, `memory`, `nvidia.com/gpu`, ...).
pub type ResourceList = BTreeMap<String, Quantity>;

/// Free-form string properties (`key: value`) used for scheduling and node labels.
pub type Properties = BTreeMap<String, String>;

/// Node taints, as in a Kubernetes Node's `spec.taints`.
pub type Taints = Vec<Taint>;

/// Conditions as `metav1.Condition`s.
pub type Conditions = Vec<Condition>;

/// How a requirement compares a property of a node type with its values.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum Operator {
    /// The property is set and its value is one of `values`.
    In,
    /// The property is unset, or its value is none of `values`.
    NotIn,
    /// The property is set (any value).
    Exists,
    /// The property is not set.
    DoesNotExist,
    /// Synonym of `DoesNotExist`, as vCluster Platform spells it.
    NotExists,
    /// The property is an integer greater than the single integer in `values`.
    Gt,
    /// The property is an integer less than the single integer in `values`.
    Lt,
    /// The property is an integer greater than or equal to the single integer in
    /// `values` (Karpenter's `Gte`).
    Gte,
    /// The property is an integer less than or equal to the single integer in `values`
    /// (Karpenter's `Lte`).
    Lte,
}

impl Operator {
    /// The operator's name as written in YAML.
    pub fn as_str(self) -> &'static str {
        match self {
            Operator::In => "In",
            Operator::NotIn => "NotIn",
            Operator::Exists => "Exists",
            Operator::DoesNotExist => "DoesNotExist",
            Operator::NotExists => "NotExists",
            Operator::Gt => "Gt",
            Operator::Lt => "Lt",
            Operator::Gte => "Gte",
            Operator::Lte => "Lte",
        }
    }
}

/// One scheduling requirement on the properties of a node type.
///
/// Read in either spelling: Kubernetes' and Karpenter's `{key, operator, values}`, or
/// vCluster's `{property, operator?, value | values}` (exactly one of `key` and
/// `property`; `operator` defaults to `In`; `value` is one value). Always written back in
/// the first spelling.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(try_from = "RequirementShape")]
pub struct Requirement {
    /// The property key, e.g. `autonodes.io/node-type` or `topology.kubernetes.io/zone`.
    pub key: String,
    /// How the property is compared with `values`: In, NotIn, Exists, DoesNotExist
    /// (or its synonym NotExists), Gt, Lt, Gte, Lte.
    pub operator: Operator,
    /// Values to compare with. In and NotIn take one or more; Gt, Lt, Gte and Lte exactly
    /// one integer; Exists and DoesNotExist none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
    /// Karpenter's `minValues`: the node types that satisfy every requirement (and, in a
    /// pool, hold the pods of a new node) must offer at least this many distinct values of
    /// `key`, or no node is made; 1 to 50.
    #[serde(default, rename = "minValues", skip_serializing_if = "Option::is_none")]
    pub min_values: Option<i64>,
}

/// A requirement as written, in either spelling (see [`Requirement`]).
#[derive(Deserialize)]
struct RequirementShape {
    key: Option<String>,
    property: Option<String>,
    operator: Option<Operator>,
    value: Option<String>,
    values: Option<Vec<String>>,
    #[serde(rename = "minValues")]
    min_values: Option<i64>,
}

impl TryFrom<RequirementShape> for Requirement {
    type Error = String;

    fn try_from(s: RequirementShape) -> Result<Self, Self::Error> {
        let key = match (s.key, s.property) {
            (Some(k), None) | (None, Some(k)) => k,
            (Some(_), Some(_)) => {
                return Err("a requirement has both key and property; write one".to_string())
            }
            (None, None) => return Err("a requirement needs a key (or property)".to_string()),
        };
        let values = match (s.value, s.values) {
            (Some(_), Some(_)) => {
                return Err(format!(
                    "requirement on {key}: value and values are exclusive; write one"
                ))
            }
            (Some(v), None) => vec![v],
            (None, vs) => vs.unwrap_or_default(),
        };
        Ok(Requirement {
            key,
            operator: s.operator.unwrap_or(Operator::In),
            values,
            min_values: s.min_values,
        })
    }
}

impl JsonSchema for Requirement {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Requirement".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let key = |description: &str| {
            schemars::json_schema!({
                "type": "string",
                "description": description,
                "minLength": 1,
                "maxLength": 253,
                "pattern": crate::schema::QUALIFIED_NAME_PATTERN,
            })
        };
        schemars::json_schema!({
            "type": "object",
            "description": "One requirement on the properties of a node type: {key, operator, values} (Kubernetes, Karpenter) or {property, operator, value | values} (vCluster).",
            "properties": {
                "key": key("The property key, e.g. autonodes.io/node-type or topology.kubernetes.io/zone (or write it as `property`)."),
                "property": key("The property key, as vCluster writes it (instead of `key`)."),
                "operator": {
                    "type": "string",
                    "maxLength": 16,
                    "description": "How the property is compared: In (the default), NotIn, Exists, DoesNotExist (or NotExists), Gt, Lt, Gte, Lte.",
                    "enum": ["In", "NotIn", "Exists", "DoesNotExist", "NotExists", "Gt", "Lt", "Gte", "Lte"],
                },
                "values": {
                    "type": "array",
                    "description": "Values to compare with: In and NotIn one or more, Gt, Lt, Gte and Lte exactly one integer, Exists and DoesNotExist none.",
                    "items": {"type": "string"},
                },
                "minValues": {
                    "type": "integer",
                    "description": "Karpenter's minValues: the node types that satisfy every requirement (and, in a pool, hold the pods of a new node) must offer at least this many distinct values of the key, or no node is made.",
                    "minimum": 1,
                    "maximum": 50,
                },
                "value": {
                    "type": "string",
                    "description": "A single value to compare with, as vCluster writes it (instead of `values`).",
                },
            },
            "oneOf": [{"required": ["key"]}, {"required": ["property"]}],
            "not": {"required": ["value", "values"]},
            "x-kubernetes-validations": crate::schema::REQUIREMENT_RULES.iter().map(|(rule, message)| {
                serde_json::json!({"rule": rule, "message": message})
            }).collect::<Vec<_>>(),
        })
    }
}

/// Where a provider's virtual machines run: a KubeVirt host cluster and a namespace in it.
/// Addresses a provider or node type hands out, one per claim, written into the VM's
/// cloud-init network data: the node keeps its address for the claim's whole life, also
/// when its VM is recreated. An address is given to one claim at a time.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AddressPool {
    /// The subnet addresses come from, IPv4 or IPv6 (`10.20.0.0/24`, `fd00:20::/64`). A
    /// node gets an address of it with its prefix length; the subnet's own address and
    /// (IPv4) its broadcast address are never handed out.
    #[schemars(length(min = 1, max = 64), regex(pattern = crate::schema::CIDR_PATTERN))]
    pub cidr: String,
    /// The default gateway, inside `cidr`; never handed out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), regex(pattern = crate::schema::IP_PATTERN))]
    pub gateway: Option<String>,
    /// DNS servers written into the network data (never handed out when inside `cidr`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8), inner(length(max = 64), regex(pattern = crate::schema::IP_PATTERN)))]
    pub dns_servers: Vec<String>,
    /// Addresses of `cidr` never handed out (routers, hosts, other machines on the segment).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256), inner(length(max = 64), regex(pattern = crate::schema::IP_PATTERN)))]
    pub exclude: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct ClusterRef {
    /// The host cluster: `local` for the management cluster itself, otherwise the name of a
    /// Secret in the autonodes service namespace whose key `kubeconfig` reaches the host cluster.
    #[schemars(length(min = 1, max = 253), regex(pattern = crate::schema::DNS_SUBDOMAIN_PATTERN))]
    pub cluster: String,
    /// The namespace on the host cluster where VirtualMachines and their Secrets are created.
    #[schemars(length(min = 1, max = 63), regex(pattern = crate::schema::DNS_LABEL_PATTERN))]
    pub namespace: String,
}

/// The tenant cluster (vCluster) a node joins.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct VClusterRef {
    /// Name of the vCluster. Its kubeconfig is read from the Secret `vc-<name>` (key `config`)
    /// in the namespace of the claim, as vCluster exports it.
    #[schemars(length(min = 1, max = 250), regex(pattern = crate::schema::DNS_SUBDOMAIN_PATTERN))]
    pub name: String,
}

/// Labels and annotations copied onto the NodeType generated from a provider entry.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct TypeMetadata {
    /// Labels copied onto the NodeType object.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "crate::schema::label_map")]
    pub labels: BTreeMap<String, String>,
    /// Annotations copied onto the NodeType object.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// Resources the kubelet reserves on a node of this type.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Overhead {
    /// Resources reserved for Kubernetes system daemons (the kubelet's `kubeReserved`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "crate::schema::resource_list")]
    pub kube_reserved: ResourceList,
}

/// Pattern of a [`DurationOrNever`]: `Never`, or a Go duration without a sign (`30s`,
/// `1h30m`, `1.5h`, `0`). Every string it admits parses; the CRD schema uses it, so the API
/// server refuses what the controller could not read.
pub const DURATION_OR_NEVER_PATTERN: &str =
    r"^(Never|0|(([0-9]{1,9}(\.[0-9]{0,9})?|\.[0-9]{1,9})(ns|us|µs|ms|s|m|h))+)$";

/// Longest [`DurationOrNever`] the schema admits (with at most 9 digits before the point,
/// the sum of its parts stays far below the longest `Duration`).
pub const DURATION_OR_NEVER_MAX_LENGTH: usize = 64;

/// A Go duration (`30s`, `5m`, `1h30m`) or `Never`, as Karpenter and vCluster write
/// `consolidateAfter` and `expireAfter`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DurationOrNever {
    /// Never (the behaviour is off).
    Never,
    /// After this long.
    After(std::time::Duration),
}

impl DurationOrNever {
    /// The duration, or `None` for `Never`.
    pub fn after(self) -> Option<std::time::Duration> {
        match self {
            DurationOrNever::Never => None,
            DurationOrNever::After(d) => Some(d),
        }
    }
}

impl std::str::FromStr for DurationOrNever {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "Never" {
            return Ok(DurationOrNever::Never);
        }
        parse_go_duration(s)
            .map(DurationOrNever::After)
            .map_err(|why| format!("{s:?} is neither Never nor a Go duration such as 30s: {why}"))
    }
}

/// A Go duration without a sign: `0`, or numbers (decimals allowed) each followed by a
/// unit (`ns`, `us`, `µs`, `μs`, `ms`, `s`, `m`, `h`). Never panics: a value too large for a
/// `Duration` is an error.
pub fn parse_go_duration(s: &str) -> Result<std::time::Duration, &'static str> {
    if s == "0" {
        return Ok(std::time::Duration::ZERO);
    }
    if s.is_empty() {
        return Err("it is empty");
    }
    let mut rest = s;
    let mut total = std::time::Duration::ZERO;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or("a number has no unit")?;
        let (number, after) = rest.split_at(number_end);
        if number.is_empty() || number == "." {
            return Err("a unit has no number");
        }
        let value: f64 = number.parse().map_err(|_| "a number is malformed")?;
        let unit_end = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_end);
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "\u{00b5}s" | "\u{03bc}s" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err("a unit is not one of ns, us, ms, s, m, h"),
        };
        // Each part on its own, as Go (and kube's `Duration`) add them; checked, so a value
        // too large is an error and never a panic.
        let part =
            std::time::Duration::try_from_secs_f64(value * scale).map_err(|_| "it is too long")?;
        total = total.checked_add(part).ok_or("it is too long")?;
        rest = next;
    }
    Ok(total)
}

impl std::fmt::Display for DurationOrNever {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DurationOrNever::Never => f.write_str("Never"),
            // Whole seconds as hours, minutes and seconds (`720h`, `1h30m`, `90s` → `1m30s`).
            DurationOrNever::After(d) if d.subsec_nanos() == 0 && !d.is_zero() => {
                let s = d.as_secs();
                for (value, unit) in [(s / 3600, "h"), (s / 60 % 60, "m"), (s % 60, "s")] {
                    if value > 0 {
                        write!(f, "{value}{unit}")?;
                    }
                }
                Ok(())
            }
            DurationOrNever::After(d) => kube_core::Duration::from(*d).fmt(f),
        }
    }
}

impl Serialize for DurationOrNever {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for DurationOrNever {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for DurationOrNever {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "DurationOrNever".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": DURATION_OR_NEVER_PATTERN,
            "maxLength": DURATION_OR_NEVER_MAX_LENGTH,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// One duration grammar: on every Go duration kube's own `Duration` reads without
        /// overflowing, [`parse_go_duration`] reads the same (to the nanosecond kube's
        /// float arithmetic rounds to).
        #[test]
        fn go_durations_read_the_same_as_kubes_duration_reads_them(
            parts in proptest::collection::vec((0u32..100_000, 0usize..6, proptest::bool::ANY), 1..4),
        ) {
            const UNITS: [&str; 6] = ["ns", "us", "ms", "s", "m", "h"];
            let text: String = parts
                .iter()
                .map(|(n, u, frac)| if *frac { format!("{n}.5{}", UNITS[*u]) } else { format!("{n}{}", UNITS[*u]) })
                .collect();
            let ours = parse_go_duration(&text).expect("a Go duration");
            let kube: kube_core::Duration = text.parse().expect("kube reads it");
            let kube: std::time::Duration = kube.into();
            let diff = ours.abs_diff(kube);
            proptest::prop_assert!(diff <= std::time::Duration::from_nanos(parts.len() as u64), "{text}: {ours:?} vs {kube:?}");
        }
    }

    #[test]
    fn a_duration_too_long_for_a_duration_is_an_error_where_kubes_parser_would_panic() {
        // kube's `Duration` multiplies with `Duration::mul_f64`, which panics on overflow:
        // what users and tenants write must never end a reconcile that way.
        assert!(parse_go_duration("99999999999999999999h").is_err());
        assert!(parse_go_duration("1e400h").is_err());
        assert!(parse_go_duration("-5s").is_err());
    }
    use proptest::prelude::*;

    #[test]
    fn never_and_go_durations_read_and_write_back() {
        for (text, value) in [
            ("Never", DurationOrNever::Never),
            (
                "30s",
                DurationOrNever::After(std::time::Duration::from_secs(30)),
            ),
            (
                "1h30m",
                DurationOrNever::After(std::time::Duration::from_secs(5400)),
            ),
        ] {
            let parsed: DurationOrNever =
                serde_json::from_value(serde_json::json!(text)).expect(text);
            assert_eq!(parsed, value);
            let again: DurationOrNever =
                serde_json::from_value(serde_json::to_value(parsed).expect("writes"))
                    .expect("reads back");
            assert_eq!(again, value);
            assert_eq!(parsed.to_string(), text, "written as it was read");
        }
        for (text, written) in [
            ("90s", "1m30s"),
            ("0", "0ns"),
            ("1.5s", "1.5s"),
            ("720h", "720h"),
        ] {
            let parsed: DurationOrNever = text.parse().expect(text);
            assert_eq!(parsed.to_string(), written);
        }
        for bad in [
            "never",
            "-5m",
            "5",
            "5 minutes",
            "",
            "1e400h",
            "99999999999999999999999h",
            "5d",
        ] {
            assert!(bad.parse::<DurationOrNever>().is_err(), "{bad}");
        }
    }

    fn requirement(v: serde_json::Value) -> Result<Requirement, String> {
        serde_json::from_value(v).map_err(|e| e.to_string())
    }

    #[test]
    fn a_requirement_reads_in_the_vcluster_spelling_with_in_as_the_default_operator() {
        let vcluster = requirement(serde_json::json!({"property": "zone", "value": "a"}));
        let kubernetes =
            requirement(serde_json::json!({"key": "zone", "operator": "In", "values": ["a"]}));
        assert_eq!(vcluster, kubernetes);
        let many = requirement(
            serde_json::json!({"property": "tier", "operator": "NotIn", "values": ["x", "y"]}),
        )
        .expect("reads");
        assert_eq!(many.operator, Operator::NotIn);
        assert_eq!(many.values, ["x", "y"]);
        let exists = requirement(serde_json::json!({"property": "gpu", "operator": "Exists"}))
            .expect("reads");
        assert!(exists.values.is_empty());
        // Written back in Kubernetes' spelling.
        assert_eq!(
            serde_json::to_value(vcluster.expect("reads")).expect("writes"),
            serde_json::json!({"key": "zone", "operator": "In", "values": ["a"]})
        );
    }

    #[test]
    fn a_requirement_with_both_or_neither_key_and_property_or_both_value_and_values_is_refused() {
        for (bad, says) in [
            (
                serde_json::json!({"key": "a", "property": "a", "value": "x"}),
                "both key and property",
            ),
            (serde_json::json!({"operator": "Exists"}), "needs a key"),
            (
                serde_json::json!({"property": "a", "value": "x", "values": ["y"]}),
                "exclusive",
            ),
        ] {
            let e = requirement(bad.clone()).expect_err("refused");
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn the_requirement_schema_admits_either_spelling_and_names_each_field() {
        let schema = serde_json::to_value(schemars::schema_for!(Requirement)).expect("schema");
        for field in ["key", "property", "operator", "value", "values"] {
            assert!(
                schema["properties"][field]["description"].is_string(),
                "{field}: {schema}"
            );
        }
        assert_eq!(schema["oneOf"].as_array().map(Vec::len), Some(2));
    }

    proptest! {
        /// The schema is at least as strict as the parser: whatever the pattern admits
        /// (so the API server stores) the controller reads.
        #[test]
        fn everything_the_schema_pattern_admits_parses(
            s in DURATION_OR_NEVER_PATTERN.trim_start_matches('^').trim_end_matches('$')
        ) {
            prop_assume!(s.chars().count() <= DURATION_OR_NEVER_MAX_LENGTH);
            prop_assert!(s.parse::<DurationOrNever>().is_ok(), "{s:?}");
        }
    }
}

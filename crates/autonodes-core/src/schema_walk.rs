//! Every field of every CRD against what the code reads from it: the schemas must admit
//! nothing the controller cannot decode or parse, so the API server refuses it with a 422
//! instead of storing an object the controller can only report as `InvalidSpec`.
//!
//! - Each string field of a spec has an entry in [`PARSERS`]: the function the code uses
//!   to read it, or a reason why any text is fine.
//! - For each parsed field, values generated from its schema (pattern, enum, length) are
//!   all accepted by its parser.
//! - Whole objects generated from each CRD's schema decode into its Rust type.

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{json, Map, Value};

use crate::names;
use crate::resources;
use autonodes_api::{self, DurationOrNever};

/// How the code reads a field.
#[derive(Clone, Copy, Debug)]
enum Parser {
    /// `resources::parse_quantity`.
    Quantity,
    /// A label value or empty (what the tenant's API server takes for a Node label).
    LabelValue,
    /// `names::is_qualified_name` (label and taint keys).
    QualifiedName,
    /// `names::is_dns_label`.
    DnsLabel,
    /// `names::is_dns_subdomain` with this maximum length.
    Subdomain(usize),
    /// `template::check_taint`'s effect check.
    TaintEffect,
    /// `DurationOrNever::from_str`.
    Duration,
    /// `pool::budget::budget_nodes`.
    BudgetNodes,
    /// `pool::budget::budget_duration`.
    BudgetDuration,
    /// `warm::parse_guest_server`.
    GuestServer,
    /// Any text is read as it is; the reason says why.
    Free(&'static str),
}

impl Parser {
    fn accepts(self, s: &str) -> bool {
        match self {
            Parser::Quantity => resources::parse_quantity(s).is_ok(),
            Parser::LabelValue => s.is_empty() || names::is_label_value(s),
            Parser::QualifiedName => names::is_qualified_name(s),
            Parser::DnsLabel => names::is_dns_label(s),
            Parser::Subdomain(max) => names::is_dns_subdomain(s, max),
            Parser::TaintEffect => {
                crate::template::check_taint(&k8s_openapi::api::core::v1::Taint {
                    key: "example.com/k".into(),
                    effect: s.to_string(),
                    ..Default::default()
                })
                .is_ok()
            }
            Parser::Duration => s.parse::<DurationOrNever>().is_ok(),
            Parser::BudgetNodes => crate::pool::budget::budget_nodes(s).is_some(),
            Parser::BudgetDuration => crate::pool::budget::budget_duration(s).is_some(),
            Parser::GuestServer => crate::warm::parse_guest_server(s).is_ok(),
            Parser::Free(_) => true,
        }
    }
}

/// The parser of each spec field, by the end of its path (`[]` an array item, `*` a map
/// value). The first matching entry wins.
const PARSERS: &[(&str, Parser)] = &[
    ("MachinePool.spec.", Parser::Free("the Cluster-API mirror: written by autonodes, read as text")),
    ("Machine.spec.", Parser::Free("the Cluster-API mirror: written by autonodes, read as text")),
    ("MachineSet.spec.", Parser::Free("the Cluster-API mirror: served for discovery, never read")),
    (".taints[].key", Parser::QualifiedName),
    (".taints[].value", Parser::LabelValue),
    (".taints[].effect", Parser::TaintEffect),
    (".taints[].timeAdded", Parser::Free("date-time, decoded as a Kubernetes Time (format checked by the API server)")),
    (".startupTaints[].key", Parser::QualifiedName),
    (".startupTaints[].value", Parser::LabelValue),
    (".startupTaints[].effect", Parser::TaintEffect),
    (".startupTaints[].timeAdded", Parser::Free("date-time, decoded as a Kubernetes Time (format checked by the API server)")),
    (".addressPool.cidr", Parser::Free("read as a CIDR when the node type is prepared (the schema admits its characters only): one that is not makes the type Failed with InvalidAddressPool")),
    (".addressPool.gateway", Parser::Free("read as an IP address when the node type is prepared: one that is not makes the type Failed with InvalidAddressPool")),
    (".addressPool.dnsServers[]", Parser::Free("read as an IP address when the node type is prepared: one that is not makes the type Failed with InvalidAddressPool")),
    (".addressPool.exclude[]", Parser::Free("read as an IP address when the node type is prepared: one that is not makes the type Failed with InvalidAddressPool")),
    (".labels.*", Parser::LabelValue),
    (".requirements[].key", Parser::QualifiedName),
    (".requirements[].property", Parser::QualifiedName),
    (".requirements[].value", Parser::Free("compared as text with property values, as one of `values`")),
    (".requirements[].operator", Parser::Free("an enum: decoding checks it (whole-object test)")),
    (".requirements[].values[]", Parser::Free("compared as text with property values; Gt/Lt values are checked as integers with a condition")),
    (".resources.*", Parser::Quantity),
    (".kubeReserved.*", Parser::Quantity),
    (".desiredCapacity.*", Parser::Quantity),
    ("NodePool.spec.limits.*", Parser::Quantity),
    ("NodeQuota.spec.limits.*", Parser::Quantity),
    ("NodeQuota.spec.namespaces[]", Parser::Free("compared as text with claims' namespaces")),
    ("NodeQuota.spec.nodeTypeSelector.", Parser::Free("a label selector matched as text against node type properties; an unknown operator selects nothing")),
    ("NodeProvider.spec.tenantNamespaceSelector.", Parser::Free("a label selector matched as text against a namespace's labels (access::provider_admits); an unknown operator selects nothing")),
    ("NodePool.spec.terminationGracePeriod", Parser::Duration),
    (".disruption.consolidationPolicy", Parser::Free("an enum: decoding checks it (whole-object test)")),
    (".disruption.budgets[].nodes", Parser::BudgetNodes),
    (".disruption.budgets[].schedule", Parser::Free("cron text: its shape is the schema's pattern; pool::budget::budget_schedule reads it and the pool's Ready condition names one it cannot")),
    (".disruption.budgets[].duration", Parser::BudgetDuration),
    (".disruption.budgets[].reasons[]", Parser::Free("an enum: decoding checks it (whole-object test)")),
    (".disruption.kubernetesVersionDrift", Parser::Free("an enum: decoding checks it (whole-object test)")),
    ("NodePool.spec.preferencePolicy", Parser::Free("an enum: decoding checks it (whole-object test)")),
    (".repair.conditions[].status", Parser::Free("an enum: decoding checks it (whole-object test)")),
    (".repair.conditions[].tolerationDuration", Parser::Duration),
    (".repair.conditions[].type", Parser::Free("compared as text with the types of the Node's conditions")),
    (".repair.keepFailedFor", Parser::Duration),
    (".repair.maxUnhealthy", Parser::BudgetNodes),
    (".repair.restartTimeout", Parser::Duration),
    (".consolidateAfter", Parser::Duration),
    (".expireAfter", Parser::Duration),
    (".vClusterRef.name", Parser::Subdomain(250)),
    (".providerRef", Parser::Subdomain(253)),
    (".typeRef", Parser::Subdomain(253)),
    (".clusterRef.cluster", Parser::Subdomain(253)),
    ("NodeProvider.spec.kubeVirt.guestApiServer", Parser::GuestServer),
    (".clusterRef.namespace", Parser::DnsLabel),
    (".nodeTypes[].name", Parser::DnsLabel),
    (".properties.*", Parser::Free("property values are compared as text; the ones that become labels are checked when the node is built")),
    (".kubeletArgs.*", Parser::Free("kubelet flag values, quoted into the user data; flags autonodes owns are refused there")),
    (".displayName", Parser::Free("shown only")),
    (".metadata.annotations.*", Parser::Free("annotation values are any text")),
    ("NodeClaim.spec.kubernetesVersion", Parser::Free("copied to the Machine mirror's spec.version, never parsed")),
    ("NodeClaim.spec.power", Parser::Free("an enum (On, Off): decoding checks it (whole-object test)")),
    ("NodeProvider.spec.kubeVirt.vmNamespacePerTenant.prefix", Parser::Free("the schema admits a DNS label prefix only; the namespace it makes is cut and hashed to a DNS label (names::tenant_vm_namespace)")),
    ("NodeProvider.spec.kubeVirt.vmNamespacePerTenant.policy", Parser::Free("an enum (Create, Existing): decoding checks it (whole-object test)")),
];

fn parser_of(path: &str) -> Option<Parser> {
    PARSERS
        .iter()
        .find(|(suffix, _)| {
            if suffix.ends_with('.') {
                path.starts_with(suffix)
            } else {
                path.ends_with(suffix)
            }
        })
        .map(|(_, p)| *p)
}

/// A field holding a value (not an object or array), with its path and schema.
struct Leaf {
    path: String,
    schema: Value,
}

fn is_open(schema: &Value) -> bool {
    schema["x-kubernetes-preserve-unknown-fields"] == true
}

fn leaves(schema: &Value, path: &str, out: &mut Vec<Leaf>) {
    if let Some(props) = schema["properties"].as_object() {
        for (k, v) in props {
            leaves(v, &format!("{path}.{k}"), out);
        }
        if let Some(extra) = schema.get("additionalProperties").filter(|a| a.is_object()) {
            leaves(extra, &format!("{path}.*"), out);
        }
        return;
    }
    if let Some(extra) = schema.get("additionalProperties").filter(|a| a.is_object()) {
        leaves(extra, &format!("{path}.*"), out);
        return;
    }
    if schema["type"] == "array" {
        leaves(&schema["items"], &format!("{path}[]"), out);
        return;
    }
    if schema["type"] == "object" || is_open(schema) {
        return; // free-form JSON (VM templates): read as JSON, checked by `template`
    }
    out.push(Leaf {
        path: path.to_string(),
        schema: schema.clone(),
    });
}

/// Every CRD as (kind, schema of its served version).
fn crd_schemas() -> Vec<(String, Value)> {
    autonodes_api::crds()
        .into_iter()
        .map(|crd| {
            let v = serde_json::to_value(&crd).expect("crd serializes");
            (
                v["spec"]["names"]["kind"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                v["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone(),
            )
        })
        .collect()
}

fn spec_leaves() -> Vec<Leaf> {
    let mut out = Vec::new();
    for (kind, schema) in crd_schemas() {
        leaves(
            &schema["properties"]["spec"],
            &format!("{kind}.spec"),
            &mut out,
        );
    }
    out
}

fn is_text(schema: &Value) -> bool {
    schema["type"] == "string" || schema["x-kubernetes-int-or-string"] == true
}

/// Strings the schema of a string field admits (pattern, enum, lengths).
fn strings(schema: &Value) -> BoxedStrategy<String> {
    if let Some(values) = schema["enum"].as_array() {
        let values: Vec<String> = values
            .iter()
            .filter_map(|v| v.as_str().map(String::from))
            .collect();
        return proptest::sample::select(values).boxed();
    }
    if schema["format"] == "date-time" {
        return (2000u32..2100, 1u32..13, 1u32..29, 0u32..24, 0u32..60)
            .prop_map(|(y, mo, d, h, mi)| format!("{y}-{mo:02}-{d:02}T{h:02}:{mi:02}:00Z"))
            .boxed();
    }
    let min = schema["minLength"].as_u64().unwrap_or(0) as usize;
    let max = schema["maxLength"].as_u64().map(|m| m as usize);
    let base: BoxedStrategy<String> = match schema["pattern"].as_str() {
        Some(p) => {
            let body = p.trim_start_matches('^').trim_end_matches('$');
            proptest::string::string_regex(body)
                .unwrap_or_else(|e| panic!("pattern {p}: {e}"))
                .boxed()
        }
        None => proptest::string::string_regex(".{0,40}")
            .expect("any text")
            .boxed(),
    };
    base.prop_filter("length within the schema's bounds", move |s| {
        let n = s.chars().count();
        n >= min && max.is_none_or(|m| n <= m)
    })
    .boxed()
}

fn integers(schema: &Value) -> BoxedStrategy<i64> {
    let min = schema["minimum"].as_f64().map(|m| m as i64);
    let (lo, hi) = if schema["format"] == "int32" {
        (i64::from(i32::MIN), i64::from(i32::MAX))
    } else {
        (i64::MIN, i64::MAX)
    };
    let lo = min.unwrap_or(lo).max(lo);
    let hi = schema["maximum"].as_f64().map_or(hi, |m| m as i64);
    prop_oneof![Just(lo), Just(hi), lo..=hi].boxed()
}

/// Whether `object` has the fields the schema's `oneOf` (exactly one branch's `required`
/// all present) and `not` (not all of its `required` present) ask for.
fn admits_presence(schema: &Value, object: &Value) -> bool {
    let has_all = |branch: &Value| {
        branch["required"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .all(|k| object.get(k).is_some())
    };
    let one_of = schema["oneOf"]
        .as_array()
        .is_none_or(|branches| branches.iter().filter(|b| has_all(b)).count() == 1);
    let not = schema.get("not").is_none_or(|n| !has_all(n));
    one_of && not
}

/// Values the schema admits, as JSON; `depth` bounds open objects.
fn values(schema: &Value) -> BoxedStrategy<Value> {
    if schema["x-kubernetes-int-or-string"] == true {
        return prop_oneof![
            integers(&json!({"minimum": 0})).prop_map(Value::from),
            strings(schema).prop_map(Value::from),
        ]
        .boxed();
    }
    if let Some(props) = schema["properties"].as_object() {
        let required: Vec<String> = schema["required"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r.as_str().map(String::from))
            .collect();
        let fields: Vec<BoxedStrategy<Option<(String, Value)>>> = props
            .iter()
            .map(|(k, v)| {
                let k = k.clone();
                let value = values(v);
                if required.contains(&k) {
                    value.prop_map(move |v| Some((k.clone(), v))).boxed()
                } else {
                    proptest::option::of(value.prop_map(move |v| (k.clone(), v))).boxed()
                }
            })
            .collect();
        let schema = schema.clone();
        return fields
            .prop_map(|fields| Value::Object(fields.into_iter().flatten().collect::<Map<_, _>>()))
            .prop_filter("oneOf/not of required fields", move |o| {
                admits_presence(&schema, o)
            })
            .boxed();
    }
    if let Some(extra) = schema.get("additionalProperties").filter(|a| a.is_object()) {
        let keys =
            proptest::string::string_regex("[a-z]([a-z.]{0,10}/)?[a-z]{1,10}").expect("keys");
        return proptest::collection::btree_map(keys, values(extra), 0..3)
            .prop_map(|m: BTreeMap<String, Value>| Value::Object(m.into_iter().collect()))
            .boxed();
    }
    if is_open(schema) || schema["type"] == "object" {
        return prop_oneof![
            Just(json!({})),
            Just(json!({"spec": {"template": {"spec": {"domain": {"devices": {}}}}}})),
        ]
        .boxed();
    }
    match schema["type"].as_str() {
        Some("array") => proptest::collection::vec(values(&schema["items"]), 0..3)
            .prop_map(Value::from)
            .boxed(),
        Some("integer") => integers(schema).prop_map(Value::from).boxed(),
        Some("boolean") => any::<bool>().prop_map(Value::from).boxed(),
        Some("number") => (0u32..1000).prop_map(Value::from).boxed(),
        _ => strings(schema).prop_map(Value::from).boxed(),
    }
}

#[test]
fn every_string_field_of_every_crd_spec_names_the_parser_that_reads_it() {
    for (path, parser) in PARSERS {
        if let Parser::Free(reason) = parser {
            assert!(!reason.is_empty(), "{path}: free text needs a reason");
        }
    }
    let missing: Vec<String> = spec_leaves()
        .into_iter()
        .filter(|l| is_text(&l.schema) && parser_of(&l.path).is_none())
        .map(|l| l.path)
        .collect();
    assert!(
        missing.is_empty(),
        "fields without an entry in PARSERS (say how the code reads them): {missing:#?}"
    );
}

#[test]
fn every_value_a_schema_admits_for_a_parsed_field_is_read_by_its_parser() {
    let mut checked = 0;
    for leaf in spec_leaves().into_iter().filter(|l| is_text(&l.schema)) {
        let Some(parser) = parser_of(&leaf.path) else {
            continue;
        };
        if matches!(parser, Parser::Free(_)) {
            continue;
        }
        assert!(
            leaf.schema.get("pattern").is_some() || leaf.schema.get("enum").is_some(),
            "{}: parsed by {parser:?} but its schema admits any text",
            leaf.path
        );
        let strategy = if leaf.schema["x-kubernetes-int-or-string"] == true {
            values(&leaf.schema)
                .prop_map(|v| match v {
                    Value::String(s) => s,
                    other => other.to_string(),
                })
                .boxed()
        } else {
            strings(&leaf.schema)
        };
        let mut runner = TestRunner::new(Config {
            cases: 300,
            failure_persistence: None,
            ..Config::default()
        });
        let path = leaf.path.clone();
        runner
            .run(&strategy, |s| {
                prop_assert!(
                    parser.accepts(&s),
                    "{path}: schema admits {s:?}, {parser:?} refuses it"
                );
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{e}"));
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} parsed fields found");
}

#[test]
fn every_object_a_crd_schema_admits_decodes_into_its_rust_type() {
    for (kind, schema) in crd_schemas() {
        let mut body = schema.clone();
        // Metadata is the API server's business; spec and status are ours.
        if let Some(props) = body["properties"].as_object_mut() {
            props.remove("metadata");
            props.remove("apiVersion");
            props.remove("kind");
        }
        let strategy = values(&body);
        let mut runner = TestRunner::new(Config {
            cases: 200,
            failure_persistence: None,
            ..Config::default()
        });
        for _ in 0..200 {
            let mut object = strategy.new_tree(&mut runner).expect("a value").current();
            object["metadata"] = json!({"name": "x", "namespace": "ns"});
            let group = if kind.starts_with("Machine") {
                "capi.autonodes.io"
            } else {
                autonodes_api::GROUP
            };
            object["apiVersion"] = json!(format!("{group}/{}", autonodes_api::VERSION));
            object["kind"] = json!(kind);
            let decoded = match kind.as_str() {
                "NodeClaim" => {
                    serde_json::from_value::<autonodes_api::NodeClaim>(object.clone()).map(drop)
                }
                "NodePool" => {
                    serde_json::from_value::<autonodes_api::NodePool>(object.clone()).map(drop)
                }
                "NodeProvider" => {
                    serde_json::from_value::<autonodes_api::NodeProvider>(object.clone()).map(drop)
                }
                "NodeType" => {
                    serde_json::from_value::<autonodes_api::NodeType>(object.clone()).map(drop)
                }
                "NodeQuota" => {
                    serde_json::from_value::<autonodes_api::NodeQuota>(object.clone()).map(drop)
                }
                "MachinePool" => {
                    serde_json::from_value::<autonodes_api::capi::MachinePool>(object.clone())
                        .map(drop)
                }
                "Machine" => {
                    serde_json::from_value::<autonodes_api::capi::Machine>(object.clone()).map(drop)
                }
                "MachineSet" => {
                    serde_json::from_value::<autonodes_api::capi::MachineSet>(object.clone())
                        .map(drop)
                }
                other => panic!("a CRD without a decode check: {other}"),
            };
            if let Err(e) = decoded {
                panic!(
                    "{kind}: the schema admits an object its type cannot decode: {e}\n{}",
                    serde_json::to_string_pretty(&object).unwrap_or_default()
                );
            }
        }
    }
}

//! Hand-written JSON schema fragments for fields whose derived schema would be
//! wrong or unhelpful for a Kubernetes structural schema.

use schemars::{json_schema, Schema, SchemaGenerator};

/// A Kubernetes quantity (`4`, `500m`, `16Gi`, `2e3`); everything it admits parses
/// (`resources::parse_quantity`, which caps the magnitude as Kubernetes does). Stricter
/// than the pattern Kubernetes publishes: an exponent is an integer, as Kubernetes parses it.
pub const QUANTITY_PATTERN: &str =
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?[0-9]+))?$";
/// An `https://host[:port][/path]` URL of letters, digits and `.-[]:` in the host and
/// `._~/-` in the path: no credentials, query or fragment (`warm::parse_guest_server`).
pub const GUEST_SERVER_PATTERN: &str = r"^https://[A-Za-z0-9.\[\]:-]+(/[A-Za-z0-9._~/-]*)?$";
/// The characters of an IPv4 or IPv6 address (what `address_pool` parses as one).
pub const IP_PATTERN: &str = r"^[0-9A-Fa-f.:]{2,45}$";
/// The characters of an IPv4 or IPv6 CIDR, `address/prefix`.
pub const CIDR_PATTERN: &str = r"^[0-9A-Fa-f.:]{2,45}/[0-9]{1,3}$";
/// A label value (empty allowed), at most 63 characters (`names::is_label_value`).
pub const LABEL_VALUE_PATTERN: &str = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$";
/// A DNS-1123 label (`names::is_dns_label`), with `maxLength` 63.
pub const DNS_LABEL_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
/// A DNS-1123 subdomain (`names::is_dns_subdomain`), with a `maxLength`.
pub const DNS_SUBDOMAIN_PATTERN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// A label or taint key (`names::is_qualified_name`), with `maxLength` 253.
pub const QUALIFIED_NAME_PATTERN: &str = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$";
/// The taint effects Kubernetes knows.
pub const TAINT_EFFECTS: [&str; 3] = ["NoSchedule", "PreferNoSchedule", "NoExecute"];

/// A quantity written as an integer or a string.
pub fn quantity(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "A Kubernetes quantity, e.g. 4, 500m or 16Gi.",
        "x-kubernetes-int-or-string": true,
        "pattern": QUANTITY_PATTERN
    })
}

/// The most entries of a label, kubelet-argument or property map, and of a taint list.
pub const MAX_MAP_ENTRIES: u32 = 64;
/// The longest kubelet argument value.
pub const MAX_KUBELET_ARG: u32 = 1024;
/// The longest property value (room for a user cloud-config in `autonodes.io/user-data`;
/// the rendered user data has its own bound).
pub const MAX_PROPERTY_VALUE: u32 = 65536;

/// Node labels: values are label values (keys are checked when the node is built), at most
/// [`MAX_MAP_ENTRIES`].
pub fn label_map(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "description": "Labels: keys are qualified names (`example.com/role`), values at most 63 characters of letters, digits, `-`, `_` and `.`; at most 64.",
        "maxProperties": MAX_MAP_ENTRIES,
        "additionalProperties": {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE_PATTERN}
    })
}

/// Properties: string values of at most [`MAX_PROPERTY_VALUE`] characters, at most
/// [`MAX_MAP_ENTRIES`] of them.
pub fn properties(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "description": "Properties by key: at most 64, each value at most 65536 characters.",
        "maxProperties": MAX_MAP_ENTRIES,
        "additionalProperties": {"type": "string", "maxLength": MAX_PROPERTY_VALUE}
    })
}

/// Node taints, each as in a Node's `spec.taints`, with the key, value and effect the API
/// server of the tenant would accept.
pub fn taints(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "description": "Taints, as in a Kubernetes Node's spec.taints; at most 64.",
        "maxItems": MAX_MAP_ENTRIES,
        "items": {
            "type": "object",
            "required": ["key", "effect"],
            "properties": {
                "key": {"type": "string", "description": "The taint key (a qualified name).",
                        "minLength": 1, "maxLength": 253, "pattern": QUALIFIED_NAME_PATTERN},
                "value": {"type": "string", "description": "The taint value (a label value).",
                          "maxLength": 63, "pattern": LABEL_VALUE_PATTERN},
                "effect": {"type": "string", "description": "NoSchedule, PreferNoSchedule or NoExecute.",
                           "enum": TAINT_EFFECTS},
                "timeAdded": {"type": "string", "format": "date-time",
                              "description": "When a NoExecute taint was added (set by the node controller)."}
            }
        }
    })
}

/// `metav1.Condition` list, as a list-map keyed by `type` (as upstream APIs declare it).
pub fn conditions(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "Current state of this object as standard Kubernetes conditions, one per type.",
        "type": "array",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "items": {
            "type": "object",
            "description": "Condition contains details for one aspect of the current state of this object.",
            "required": ["type", "status", "lastTransitionTime", "reason", "message"],
            "properties": {
                "type": {
                    "type": "string",
                    "description": "Type of condition in CamelCase.",
                    "maxLength": 316,
                    "pattern": "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
                },
                "status": {
                    "type": "string",
                    "description": "Status of the condition: True, False or Unknown.",
                    "enum": ["True", "False", "Unknown"]
                },
                "observedGeneration": {
                    "type": "integer",
                    "format": "int64",
                    "minimum": 0,
                    "description": "The .metadata.generation the condition was set from."
                },
                "lastTransitionTime": {
                    "type": "string",
                    "format": "date-time",
                    "description": "Last time the condition's status changed."
                },
                "reason": {
                    "type": "string",
                    "description": "Programmatic identifier for the condition's last transition, in CamelCase.",
                    "maxLength": 1024,
                    "minLength": 1,
                    "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
                },
                "message": {
                    "type": "string",
                    "description": "Human readable message about the transition.",
                    "maxLength": 32768
                }
            }
        }
    })
}

/// A map from resource name (`cpu`, `memory`, `nvidia.com/gpu`, ...) to a quantity.
/// Quantities may be written as integers (`cpu: 4`) or strings (`memory: 16Gi`).
pub fn resource_list(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "description": "Resources by name (cpu, memory, or an extended resource such as nvidia.com/gpu); values are Kubernetes quantities, e.g. 4 or 16Gi.",
        "additionalProperties": {
            "x-kubernetes-int-or-string": true,
            "pattern": QUANTITY_PATTERN
        }
    })
}

/// The CEL rules (`x-kubernetes-validations`: rule, message) of a requirement, as the
/// controller checks it (`autonodes_core::scheduling::CheckedRequirement`): In and NotIn
/// (also the default operator) need a value, Exists and DoesNotExist take none, Gt, Lt,
/// Gte and Lte exactly one. Servers before 1.25 ignore them; the controller's own check
/// stays.
pub const REQUIREMENT_RULES: [(&str, &str); 3] = [
    (
        "(has(self.operator) && !(self.operator in ['In', 'NotIn'])) || has(self.value) || (has(self.values) && size(self.values) > 0)",
        "In and NotIn (the default operator) need at least one value in values (or value)",
    ),
    (
        "!has(self.operator) || !(self.operator in ['Exists', 'DoesNotExist', 'NotExists']) || (!has(self.value) && (!has(self.values) || size(self.values) == 0))",
        "Exists and DoesNotExist take no values",
    ),
    (
        "!has(self.operator) || !(self.operator in ['Gt', 'Lt', 'Gte', 'Lte']) || has(self.value) || (has(self.values) && size(self.values) == 1)",
        "Gt, Lt, Gte and Lte take exactly one integer in values (or value)",
    ),
];

/// Most requirements one claim or pool may list (as Karpenter bounds a NodePool's).
pub const MAX_REQUIREMENTS: usize = 100;
/// Most disruption budgets one pool may list (as Karpenter bounds them).
pub const MAX_BUDGETS: usize = 50;

/// A VirtualMachine template (`metadata` + `spec`), kept as free-form JSON:
/// KubeVirt's schema is large and versioned on the host cluster, not here.
pub fn vm_template(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "description": "A KubeVirt VirtualMachine template: `metadata` (labels, annotations) and `spec`, as in a kubevirt.io/v1 VirtualMachine.",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// Kubelet arguments, a string map: at most [`MAX_MAP_ENTRIES`], each value at most
/// [`MAX_KUBELET_ARG`] characters.
pub fn string_map(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "maxProperties": MAX_MAP_ENTRIES,
        "additionalProperties": {"type": "string", "maxLength": MAX_KUBELET_ARG}
    })
}

//! Hand-written JSON schema fragments for fields whose derived schema would be
//! wrong or unhelpful for a Kubernetes structural schema.

use schemars::{json_schema, Schema, SchemaGenerator};

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
            "pattern": "^(\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))))?$"
        }
    })
}

/// A VirtualMachine template (`metadata` + `spec`), kept as free-form JSON:
/// KubeVirt's schema is large and versioned on the host cluster, not here.
pub fn vm_template(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "description": "A KubeVirt VirtualMachine template: `metadata` (labels, annotations) and `spec`, as in a kubevirt.io/v1 VirtualMachine.",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// Kubelet arguments, free-form string map.
pub fn string_map(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "additionalProperties": {"type": "string"}
    })
}

//! Why a VM template cannot be composed.

use crate::resources::QuantityError;
use crate::template::merge::MergeError;

/// Why a node type's VirtualMachine cannot be composed. Every variant names the node type.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TemplateError {
    /// Both `mergeVirtualMachineTemplate` and `virtualMachineTemplate` are set.
    #[error("node type {node_type}: mergeVirtualMachineTemplate and virtualMachineTemplate are mutually exclusive; set at most one")]
    BothTemplates {
        /// The node type.
        node_type: String,
    },
    /// Neither the type nor its provider has a template.
    #[error("node type {node_type}: no VirtualMachine template (neither the type's virtualMachineTemplate nor the provider's)")]
    NoTemplate {
        /// The node type.
        node_type: String,
    },
    /// A template or a part of it is not a JSON object.
    #[error("node type {node_type}: {field} must be an object")]
    NotAnObject {
        /// The node type.
        node_type: String,
        /// The offending field.
        field: String,
    },
    /// The strategic merge failed.
    #[error("node type {node_type}: mergeVirtualMachineTemplate: {source}")]
    Merge {
        /// The node type.
        node_type: String,
        /// What went wrong.
        source: MergeError,
    },
    /// A quantity in the type or its template does not parse.
    #[error("node type {node_type}: {field}: {source}")]
    Quantity {
        /// The node type.
        node_type: String,
        /// The field holding the quantity.
        field: String,
        /// The parse error.
        source: QuantityError,
    },
    /// A CPU topology value is not a positive integer.
    #[error("node type {node_type}: {field} must be a positive integer")]
    BadTopology {
        /// The node type.
        node_type: String,
        /// The field.
        field: String,
    },
    /// Memory can be found neither in `resources` nor in the template.
    #[error("node type {node_type}: memory is not set: give resources.memory, or spec.template.spec.domain.memory.guest or domain.resources.requests.memory in the template")]
    MemoryNotFound {
        /// The node type.
        node_type: String,
    },
    /// `spec.template.spec.taints` is not a list of taints.
    #[error("node type {node_type}: spec.template.spec.taints: {message}")]
    BadTaints {
        /// The node type.
        node_type: String,
        /// What is wrong.
        message: String,
    },
    /// The template sets both `spec.running` and `spec.runStrategy`, which KubeVirt rejects.
    #[error("node type {node_type}: the template sets both spec.running and spec.runStrategy; KubeVirt accepts only one")]
    RunningAndRunStrategy {
        /// The node type.
        node_type: String,
    },
    /// A name built from the VM name is too long or invalid.
    #[error("node type {node_type}: {field}: {message}")]
    BadName {
        /// The node type.
        node_type: String,
        /// The field the name goes to.
        field: String,
        /// What is wrong.
        message: String,
    },
}

impl TemplateError {
    /// A type property autonodes cannot use (`field` is `property <key>`).
    pub fn property(node_type: &str, property: &str, message: impl Into<String>) -> Self {
        TemplateError::BadName {
            node_type: node_type.to_string(),
            field: format!("property {property}"),
            message: message.into(),
        }
    }
}

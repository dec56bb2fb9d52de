//! The schema builders the test CRDs are written with: a [`Schema`] per JSON type,
//! structural objects, maps, arrays, printer columns, and a CRD from its parts.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceColumnDefinition, CustomResourceDefinition, CustomResourceDefinitionNames,
    CustomResourceDefinitionSpec, CustomResourceDefinitionVersion, CustomResourceSubresourceStatus,
    CustomResourceSubresources, CustomResourceValidation, JSONSchemaProps, JSONSchemaPropsOrArray,
    JSONSchemaPropsOrBool, JSON,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;

/// The Kubernetes quantity pattern KubeVirt puts on int-or-string quantities.
const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

// ---------------------------------------------------------------------------------------
// Schema and CRD builders.

/// A schema under construction.
#[derive(Clone)]
pub(super) struct Schema(JSONSchemaProps);

impl Schema {
    pub(super) fn of(props: JSONSchemaProps) -> Self {
        Schema(props)
    }

    pub(super) fn required(mut self, fields: &[&str]) -> Self {
        self.0.required = Some(fields.iter().map(|f| f.to_string()).collect());
        self
    }

    pub(super) fn with_property(mut self, name: &str, schema: Schema) -> Self {
        self.0
            .properties
            .get_or_insert_with(BTreeMap::new)
            .insert(name.to_string(), schema.0);
        self
    }
}

pub(super) fn typed(type_: &str, description: &str) -> JSONSchemaProps {
    JSONSchemaProps {
        type_: Some(type_.to_string()),
        description: Some(description.to_string()),
        ..Default::default()
    }
}

pub(super) fn string(description: &str) -> Schema {
    Schema(typed("string", description))
}

pub(super) fn boolean(description: &str) -> Schema {
    Schema(typed("boolean", description))
}

pub(super) fn integer(description: &str) -> Schema {
    Schema(typed("integer", description))
}

pub(super) fn int32(description: &str) -> Schema {
    Schema(JSONSchemaProps {
        format: Some("int32".into()),
        ..typed("integer", description)
    })
}

pub(super) fn int64(description: &str) -> Schema {
    Schema(JSONSchemaProps {
        format: Some("int64".into()),
        ..typed("integer", description)
    })
}

/// An RFC 3339 time that may be `null` (a Kubernetes `metav1.Time` pointer).
pub(super) fn timestamp(description: &str) -> Schema {
    Schema(JSONSchemaProps {
        format: Some("date-time".into()),
        nullable: Some(true),
        ..typed("string", description)
    })
}

pub(super) fn string_enum(description: &str, values: &[&str]) -> Schema {
    Schema(JSONSchemaProps {
        enum_: Some(values.iter().map(|v| JSON(json!(v))).collect()),
        ..typed("string", description)
    })
}

pub(super) fn quantity(description: &str) -> Schema {
    Schema(JSONSchemaProps {
        description: Some(description.to_string()),
        any_of: Some(vec![
            JSONSchemaProps {
                type_: Some("integer".into()),
                ..Default::default()
            },
            JSONSchemaProps {
                type_: Some("string".into()),
                ..Default::default()
            },
        ]),
        pattern: Some(QUANTITY_PATTERN.into()),
        x_kubernetes_int_or_string: Some(true),
        ..Default::default()
    })
}

pub(super) fn map_of(description: &str, values: Schema) -> Schema {
    Schema(JSONSchemaProps {
        additional_properties: Some(JSONSchemaPropsOrBool::Schema(Box::new(values.0))),
        ..typed("object", description)
    })
}

pub(super) fn string_map(description: &str) -> Schema {
    map_of(description, string("A value."))
}

pub(super) fn quantity_map(description: &str) -> Schema {
    map_of(description, quantity("A quantity."))
}

pub(super) fn array(description: &str, items: Schema) -> Schema {
    Schema(JSONSchemaProps {
        items: Some(JSONSchemaPropsOrArray::Schema(Box::new(items.0))),
        ..typed("array", description)
    })
}

pub(super) fn object<const N: usize>(description: &str, properties: [(&str, Schema); N]) -> Schema {
    Schema(JSONSchemaProps {
        properties: Some(
            properties
                .into_iter()
                .map(|(name, schema)| (name.to_string(), schema.0))
                .collect(),
        ),
        ..typed("object", description)
    })
}

/// An object with no fields (`masquerade: {}`): anything inside is pruned.
pub(super) fn empty_object(description: &str) -> Schema {
    Schema(typed("object", description))
}

/// An object that keeps whatever it is given: only where autonodes writes nothing itself.
pub(super) fn preserve(description: &str) -> Schema {
    Schema(JSONSchemaProps {
        x_kubernetes_preserve_unknown_fields: Some(true),
        ..typed("object", description)
    })
}

pub(super) fn column(
    name: &str,
    type_: &str,
    json_path: &str,
    description: Option<&str>,
) -> CustomResourceColumnDefinition {
    CustomResourceColumnDefinition {
        name: name.to_string(),
        type_: type_.to_string(),
        json_path: json_path.to_string(),
        description: description.map(str::to_string),
        ..Default::default()
    }
}

pub(super) struct CrdParts {
    pub(super) group: &'static str,
    pub(super) version: &'static str,
    pub(super) kind: &'static str,
    pub(super) plural: &'static str,
    pub(super) singular: &'static str,
    pub(super) short_names: &'static [&'static str],
    pub(super) description: &'static str,
    pub(super) spec: Schema,
    pub(super) spec_required: bool,
    pub(super) status: Schema,
    /// Whether `status` is a subresource (KubeVirt's VMI CRD has none: its status is
    /// written with the object).
    pub(super) status_subresource: bool,
    pub(super) columns: Vec<CustomResourceColumnDefinition>,
}

pub(super) fn crd(parts: CrdParts) -> CustomResourceDefinition {
    let root = object(
        parts.description,
        [
            ("apiVersion", string("APIVersion of this object.")),
            ("kind", string("Kind of this object.")),
            // The API server allows nothing but `type: object` on the root metadata.
            (
                "metadata",
                Schema(JSONSchemaProps {
                    type_: Some("object".to_string()),
                    ..Default::default()
                }),
            ),
            ("spec", parts.spec),
            ("status", parts.status),
        ],
    );
    let root = if parts.spec_required {
        root.required(&["spec"])
    } else {
        root
    };
    CustomResourceDefinition {
        metadata: ObjectMeta {
            name: Some(format!("{}.{}", parts.plural, parts.group)),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/part-of".to_string(),
                "autonodes-simulator".to_string(),
            )])),
            ..Default::default()
        },
        spec: CustomResourceDefinitionSpec {
            group: parts.group.to_string(),
            names: CustomResourceDefinitionNames {
                kind: parts.kind.to_string(),
                list_kind: Some(format!("{}List", parts.kind)),
                plural: parts.plural.to_string(),
                singular: Some(parts.singular.to_string()),
                short_names: Some(parts.short_names.iter().map(|s| s.to_string()).collect()),
                categories: Some(vec!["all".to_string()]),
            },
            scope: "Namespaced".to_string(),
            versions: vec![CustomResourceDefinitionVersion {
                name: parts.version.to_string(),
                served: true,
                storage: true,
                schema: Some(CustomResourceValidation {
                    open_api_v3_schema: Some(root.0),
                }),
                subresources: parts
                    .status_subresource
                    .then(|| CustomResourceSubresources {
                        status: Some(CustomResourceSubresourceStatus(json!({}))),
                        scale: None,
                    }),
                additional_printer_columns: Some(parts.columns),
                ..Default::default()
            }],
            ..Default::default()
        },
        status: None,
    }
}

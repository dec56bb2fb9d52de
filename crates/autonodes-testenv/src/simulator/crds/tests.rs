//! Tests of the test CRDs.

use super::*;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};

/// Walks a schema and returns every path that preserves unknown fields.
fn preserving_paths(schema: &JSONSchemaProps, path: String, out: &mut Vec<String>) {
    if schema.x_kubernetes_preserve_unknown_fields == Some(true) {
        out.push(path.clone());
    }
    for (name, child) in schema.properties.iter().flatten() {
        preserving_paths(child, format!("{path}.{name}"), out);
    }
    if let Some(JSONSchemaPropsOrArray::Schema(items)) = &schema.items {
        preserving_paths(items, format!("{path}[]"), out);
    }
    if let Some(JSONSchemaPropsOrBool::Schema(values)) = &schema.additional_properties {
        preserving_paths(values, format!("{path}{{}}"), out);
    }
}

fn root(crd: &CustomResourceDefinition) -> &JSONSchemaProps {
    crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .expect("schema")
}

#[test]
fn no_object_on_a_path_autonodes_writes_preserves_unknown_fields() {
    let mut paths = Vec::new();
    preserving_paths(root(&virtual_machine_crd()), String::new(), &mut paths);
    let written = [
        ".metadata",
        ".spec",
        ".spec.dataVolumeTemplates[]",
        ".spec.dataVolumeTemplates[].metadata",
        ".spec.template",
        ".spec.template.metadata",
        ".spec.template.spec",
        ".spec.template.spec.domain",
        ".spec.template.spec.domain.cpu",
        ".spec.template.spec.domain.memory",
        ".spec.template.spec.domain.resources",
        ".spec.template.spec.domain.devices",
        ".spec.template.spec.domain.devices.disks[]",
        ".spec.template.spec.domain.devices.interfaces[]",
        ".spec.template.spec.networks[]",
        ".spec.template.spec.volumes[]",
        ".spec.template.spec.volumes[].cloudInitNoCloud",
        ".spec.template.spec.volumes[].cloudInitNoCloud.secretRef",
        ".spec.template.spec.affinity",
        ".spec.template.spec.affinity.nodeAffinity",
        ".spec.template.spec.affinity.podAntiAffinity",
        ".spec.dataVolumeTemplates[].spec",
        ".spec.dataVolumeTemplates[].spec.source",
        ".spec.dataVolumeTemplates[].spec.storage",
        ".spec.dataVolumeTemplates[].spec.pvc",
        ".spec.dataVolumeTemplates[].spec.pvc.resources",
        ".spec.instancetype",
        ".spec.preference",
        ".status",
    ];
    for p in written {
        assert!(
            !paths.iter().any(|q| q == p),
            "{p} preserves unknown fields"
        );
    }
    assert!(paths.contains(&".spec.template.spec.readinessProbe".to_string()));
}

/// The property names at `path` (`a.b.c`, through `items` for a list) of a schema.
fn fields_at(schema: &JSONSchemaProps, path: &str) -> Vec<String> {
    let mut at = schema;
    for step in path.split('.').filter(|s| !s.is_empty()) {
        if let Some(JSONSchemaPropsOrArray::Schema(items)) = &at.items {
            at = items;
        }
        at = &at.properties.as_ref().expect("properties")[step];
    }
    at.properties
        .iter()
        .flatten()
        .map(|(k, _)| k.clone())
        .collect()
}

#[test]
fn a_vms_data_volume_templates_drop_what_kubevirts_older_cdi_types_lack_and_pvc_is_structural() {
    let vm = root(&virtual_machine_crd()).clone();
    let dv = root(&data_volume_crd()).clone();
    let in_vm = fields_at(&vm, "spec.dataVolumeTemplates.spec");
    let in_cdi = fields_at(&dv, "spec");
    assert!(
        !in_vm.contains(&"serviceAccountName".to_string()),
        "{in_vm:?}"
    );
    assert!(
        in_cdi.contains(&"serviceAccountName".to_string()),
        "{in_cdi:?}"
    );
    let http = fields_at(&vm, "spec.dataVolumeTemplates.spec.source.http");
    assert!(!http
        .iter()
        .any(|f| f == "checksum" || f == "insecureSkipVerify"));
    let http = fields_at(&dv, "spec.source.http");
    assert!(http.contains(&"checksum".to_string()), "{http:?}");
    // A golden volume's DataVolume copies a template's `pvc`: pruned like CDI's.
    let mut paths = Vec::new();
    preserving_paths(&dv, String::new(), &mut paths);
    for p in [".spec", ".spec.pvc", ".spec.pvc.resources", ".spec.storage"] {
        assert!(
            !paths.iter().any(|q| q == p),
            "{p} preserves unknown fields"
        );
    }
    let pvc = fields_at(&dv, "spec.pvc");
    assert!(
        pvc.contains(&"volumeAttributesClassName".to_string()),
        "{pvc:?}"
    );
}

#[test]
fn names_and_short_names_match_kubevirt() {
    let crds = kubevirt_crds();
    let names: Vec<_> = crds
        .iter()
        .map(|c| c.metadata.name.clone().unwrap_or_default())
        .collect();
    assert_eq!(
        names,
        [
            "virtualmachines.kubevirt.io",
            "virtualmachineinstances.kubevirt.io",
            "virtualmachineinstancemigrations.kubevirt.io",
            "datavolumes.cdi.kubevirt.io"
        ]
    );
    assert_eq!(
        crds[0].spec.names.short_names.as_deref(),
        Some(&["vm".to_string(), "vms".to_string()][..])
    );
    // As in KubeVirt's and CDI's CRDs: VirtualMachine, VirtualMachineInstanceMigration and
    // DataVolume have a status subresource, VirtualMachineInstance has none (its status is
    // written with it).
    let has_status: Vec<bool> = crds
        .iter()
        .map(|c| {
            c.spec.versions[0]
                .subresources
                .as_ref()
                .is_some_and(|s| s.status.is_some())
        })
        .collect();
    assert_eq!(has_status, [true, false, true, true]);
}

/// The property at `path` (`a.b.c`, through `items` for a list) of a schema.
fn schema_at<'a>(schema: &'a JSONSchemaProps, path: &str) -> &'a JSONSchemaProps {
    let mut at = schema;
    for step in path.split('.').filter(|s| !s.is_empty()) {
        if let Some(JSONSchemaPropsOrArray::Schema(items)) = &at.items {
            at = items;
        }
        at = &at.properties.as_ref().expect("properties")[step];
    }
    at
}

#[test]
fn the_fields_a_live_migration_is_followed_by_are_kept_on_instances_and_migrations() {
    let vmi = root(&virtual_machine_instance_crd()).clone();
    let vmim = root(&virtual_machine_instance_migration_crd()).clone();
    let status = fields_at(&vmi, "status");
    for f in [
        "nodeName",
        "evacuationNodeName",
        "migrationState",
        "conditions",
    ] {
        assert!(status.contains(&f.to_string()), "{f}: {status:?}");
    }
    let state_fields = [
        "sourceNode",
        "targetNode",
        "completed",
        "failed",
        "failureReason",
        "startTimestamp",
        "endTimestamp",
        "migrationUid",
        "mode",
    ];
    for schema in [&vmi, &vmim] {
        let state = fields_at(schema, "status.migrationState");
        for f in state_fields {
            assert!(state.contains(&f.to_string()), "{f}: {state:?}");
        }
        let end = schema_at(schema, "status.migrationState.endTimestamp");
        assert_eq!(end.nullable, Some(true));
    }
    let condition: Vec<String> = match &schema_at(&vmi, "status.conditions").items {
        Some(JSONSchemaPropsOrArray::Schema(item)) => item
            .properties
            .iter()
            .flatten()
            .map(|(k, _)| k.clone())
            .collect(),
        _ => Vec::new(),
    };
    for f in [
        "type",
        "status",
        "reason",
        "message",
        "lastTransitionTime",
        "lastProbeTime",
    ] {
        assert!(condition.contains(&f.to_string()), "{f}: {condition:?}");
    }
    let strategies = schema_at(&vmi, "spec.evictionStrategy")
        .enum_
        .iter()
        .flatten()
        .map(|v| v.0.clone())
        .collect::<Vec<_>>();
    assert_eq!(
        strategies,
        EVICTION_STRATEGIES.map(|s| serde_json::json!(s))
    );
    assert_eq!(
        schema_at(&vmim, "spec").required.as_deref(),
        Some(&["vmiName".to_string()][..])
    );
    let phases = schema_at(&vmim, "status.phase")
        .enum_
        .as_ref()
        .map(Vec::len);
    assert_eq!(phases, Some(MIGRATION_PHASES.len()));
    let mut paths = Vec::new();
    preserving_paths(&vmim, String::new(), &mut paths);
    for p in [
        ".spec",
        ".status",
        ".status.migrationState",
        ".status.phaseTransitionTimestamps[]",
    ] {
        assert!(
            !paths.iter().any(|q| q == p),
            "{p} preserves unknown fields"
        );
    }
}

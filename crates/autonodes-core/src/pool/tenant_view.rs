//! What a dynamic pool keeps of its tenant's pods, nodes and DaemonSets: only the fields
//! planning reads (requests, selectors, affinity, tolerations, spread, the node a pod is
//! bound to, its phase and scheduling condition, a node's labels, taints and conditions),
//! so that the controller's watch caches of a tenant stay small.

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec};
use k8s_openapi::api::core::v1::{
    Container, ContainerStatus, Node, NodeSpec, NodeStatus, Pod, PodSpec, PodStatus,
    PodTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::do_not_disrupt::annotation_read_by_planning;

/// The metadata planning reads: name, namespace, labels, the annotations it reads, the
/// owners' kinds and names, and the deletion time.
fn meta(m: ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        generate_name: m.generate_name,
        labels: m.labels,
        annotations: m
            .annotations
            .map(|a| {
                a.into_iter()
                    .filter(|(k, _)| annotation_read_by_planning(k))
                    .collect()
            })
            .filter(|a: &std::collections::BTreeMap<String, String>| !a.is_empty()),
        owner_references: m.owner_references.map(|owners| {
            owners
                .into_iter()
                .map(|o| OwnerReference {
                    kind: o.kind,
                    name: o.name,
                    ..OwnerReference::default()
                })
                .collect()
        }),
        deletion_timestamp: m.deletion_timestamp,
        creation_timestamp: m.creation_timestamp,
        ..ObjectMeta::default()
    }
}

/// A container's name, resources and restart policy (an init container with
/// `restartPolicy: Always` is a native sidecar, counted for the pod's whole life).
fn container(c: Container) -> Container {
    Container {
        name: c.name,
        resources: c.resources,
        restart_policy: c.restart_policy,
        ..Container::default()
    }
}

/// A container status's name and the resources a resize reads (what the container has
/// and what is allocated to it).
fn container_status(c: ContainerStatus) -> ContainerStatus {
    ContainerStatus {
        name: c.name,
        resources: c.resources,
        allocated_resources: c.allocated_resources,
        ..ContainerStatus::default()
    }
}

/// A pod spec's scheduling fields and its containers' resources.
fn pod_spec(s: PodSpec) -> PodSpec {
    PodSpec {
        node_name: s.node_name,
        containers: s.containers.into_iter().map(container).collect(),
        init_containers: s
            .init_containers
            .map(|cs| cs.into_iter().map(container).collect()),
        overhead: s.overhead,
        resources: s.resources,
        node_selector: s.node_selector,
        affinity: s.affinity,
        tolerations: s.tolerations,
        topology_spread_constraints: s.topology_spread_constraints,
        host_network: s.host_network,
        ..PodSpec::default()
    }
}

/// A pod as planning reads it: its scheduling fields, its containers' resources, its
/// phase, start time, `PodScheduled` and `PodResizePending` conditions, and what its
/// containers' statuses say of a resize ([`crate::pod_requests`]).
pub fn pod(p: Pod) -> Pod {
    Pod {
        metadata: meta(p.metadata),
        spec: p.spec.map(pod_spec),
        status: p.status.map(pod_status),
    }
}

/// The status fields planning and the request rule read.
pub fn pod_status(s: PodStatus) -> PodStatus {
    let statuses = |list: Option<Vec<ContainerStatus>>| {
        list.map(|cs| cs.into_iter().map(container_status).collect())
    };
    PodStatus {
        phase: s.phase,
        start_time: s.start_time,
        conditions: s.conditions.map(|cs| {
            cs.into_iter()
                .filter(|c| c.type_ == "PodScheduled" || c.type_ == "PodResizePending")
                .collect()
        }),
        resize: s.resize,
        container_statuses: statuses(s.container_statuses),
        init_container_statuses: statuses(s.init_container_statuses),
        ..PodStatus::default()
    }
}

/// A node as planning reads it: labels, annotations it reads, taints, whether it is
/// cordoned, its provider ID, conditions and allocatable resources.
pub fn node(n: Node) -> Node {
    Node {
        metadata: meta(n.metadata),
        spec: n.spec.map(|s| NodeSpec {
            taints: s.taints,
            unschedulable: s.unschedulable,
            provider_id: s.provider_id,
            ..NodeSpec::default()
        }),
        status: n.status.map(|s| NodeStatus {
            conditions: s.conditions,
            allocatable: s.allocatable,
            capacity: s.capacity,
            ..NodeStatus::default()
        }),
    }
}

/// A DaemonSet as planning reads it: its pod template's scheduling fields and resources.
pub fn daemonset(d: DaemonSet) -> DaemonSet {
    DaemonSet {
        metadata: meta(d.metadata),
        spec: d.spec.map(|s| DaemonSetSpec {
            selector: s.selector,
            template: PodTemplateSpec {
                metadata: s.template.metadata.map(meta),
                spec: s.template.spec.map(pod_spec),
            },
            ..DaemonSetSpec::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::pool::pack::{pod_request, PendingPod};

    #[test]
    fn a_trimmed_pod_keeps_what_packing_reads_and_drops_the_rest() {
        let full: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "a", "labels": {"app": "web"},
                "annotations": {"karpenter.sh/do-not-disrupt": "true", "big": "x".repeat(1000)},
                "managedFields": [{"manager": "kubectl"}],
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "uid": "u"}]},
            "spec": {
                "containers": [{"name": "c", "image": "nginx", "env": [{"name": "A", "value": "b"}],
                    "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}],
                "nodeSelector": {"tier": "fast"},
                "tolerations": [{"key": "k", "operator": "Exists"}],
                "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "web"}}}]}},
                "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                    "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}],
                "volumes": [{"name": "v", "emptyDir": {}}]
            },
            "status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"},
                {"type": "Initialized", "status": "True"}]}
        }))
        .expect("pod");
        let trimmed = pod(full.clone());
        assert_eq!(PendingPod::from_pod(&trimmed), PendingPod::from_pod(&full));
        assert_eq!(pod_request(&trimmed), pod_request(&full));
        assert_eq!(
            crate::pool::pack::is_unschedulable(&trimmed),
            crate::pool::pack::is_unschedulable(&full)
        );
        let text = serde_json::to_string(&trimmed).expect("json");
        for gone in [
            "managedFields",
            "nginx",
            "env",
            "volumes",
            "Initialized",
            "big",
        ] {
            assert!(!text.contains(gone), "{gone} kept: {text}");
        }
        assert!(text.contains("karpenter.sh/do-not-disrupt"));
        // The 1,000-character annotation alone is gone, and more beside it.
        assert!(text.len() + 1100 < serde_json::to_string(&full).expect("json").len());
    }

    #[test]
    fn a_trimmed_pod_keeps_its_sidecars_pod_level_resources_and_resize_status() {
        let full: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "a"},
            "spec": {
                "resources": {"requests": {"memory": "3Gi"}},
                "containers": [{"name": "app", "image": "nginx",
                    "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}],
                "initContainers": [{"name": "mesh", "image": "proxy", "restartPolicy": "Always",
                    "resources": {"requests": {"cpu": "500m"}}}]
            },
            "status": {"phase": "Running",
                "conditions": [{"type": "PodResizePending", "status": "True", "reason": "Deferred",
                    "message": "no room"}],
                "containerStatuses": [{"name": "app", "image": "nginx", "imageID": "sha",
                    "ready": true, "restartCount": 3,
                    "resources": {"requests": {"cpu": "2"}},
                    "allocatedResources": {"cpu": "2"},
                    "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}
        }))
        .expect("pod");
        let trimmed = pod(full.clone());
        let request = pod_request(&trimmed);
        assert_eq!(request, pod_request(&full));
        // 2 CPU resized app + 0.5 CPU sidecar; pod-level memory.
        assert_eq!((request.cpu, request.memory), (2500, 3 << 30));
        let text = serde_json::to_string(&trimmed).expect("json");
        for gone in ["nginx", "proxy", "sha", "startedAt"] {
            assert!(!text.contains(gone), "{gone} kept: {text}");
        }
    }
}

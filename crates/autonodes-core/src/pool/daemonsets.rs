//! The tenant's DaemonSets on nodes a pool plans: a DaemonSet whose pods would run on a
//! node (its template's node selector, required node affinity and tolerations accept the
//! node's labels and taints) takes its pod's requests from that node, so a node sized for
//! pending pods alone does not turn out too small once the DaemonSets' pods arrive.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Pod, Toleration};

use super::consolidate::NodeUse;
use super::pack::{accepts, Amount, NodeShape, PendingPod};

/// The pod a DaemonSet runs on every node it selects, as packing sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct DaemonPod {
    /// `namespace/name` of the DaemonSet.
    pub daemonset: String,
    /// Its pod template's requests, selectors and tolerations, with the tolerations the
    /// DaemonSet controller adds to every daemon pod.
    pub pod: PendingPod,
}

/// The tolerations the DaemonSet controller adds to each pod it creates (Kubernetes'
/// `AddOrUpdateDaemonPodTolerations`): daemon pods run on not-ready, unreachable,
/// pressured and unschedulable nodes, and host-network pods before the network is up.
fn controller_tolerations(host_network: bool) -> Vec<Toleration> {
    let toleration = |key: &str, effect: &str| Toleration {
        key: Some(key.to_string()),
        operator: Some("Exists".to_string()),
        effect: Some(effect.to_string()),
        ..Toleration::default()
    };
    let mut out = vec![
        toleration("node.kubernetes.io/not-ready", "NoExecute"),
        toleration("node.kubernetes.io/unreachable", "NoExecute"),
        toleration("node.kubernetes.io/disk-pressure", "NoSchedule"),
        toleration("node.kubernetes.io/memory-pressure", "NoSchedule"),
        toleration("node.kubernetes.io/pid-pressure", "NoSchedule"),
        toleration("node.kubernetes.io/unschedulable", "NoSchedule"),
    ];
    if host_network {
        out.push(toleration(
            "node.kubernetes.io/network-unavailable",
            "NoSchedule",
        ));
    }
    out
}

/// The daemon pods of the tenant's DaemonSets (those being deleted left out).
pub fn daemon_pods(daemonsets: &[DaemonSet]) -> Vec<DaemonPod> {
    daemonsets
        .iter()
        .filter(|ds| ds.metadata.deletion_timestamp.is_none())
        .filter_map(|ds| {
            let spec = ds.spec.as_ref()?;
            let template = &spec.template;
            let pod = Pod {
                metadata: template.metadata.clone().unwrap_or_default(),
                spec: template.spec.clone(),
                status: None,
            };
            let mut pending = PendingPod::from_pod(&pod);
            let host_network = template
                .spec
                .as_ref()
                .and_then(|s| s.host_network)
                .unwrap_or(false);
            pending
                .tolerations
                .extend(controller_tolerations(host_network));
            let daemonset = format!(
                "{}/{}",
                ds.metadata.namespace.as_deref().unwrap_or_default(),
                ds.metadata.name.as_deref().unwrap_or_default()
            );
            pending.key = daemonset.clone();
            Some(DaemonPod {
                daemonset,
                pod: pending,
            })
        })
        .collect()
}

/// What the daemon pods that would run on a node of `shape` ask for together (a pod slot
/// each).
pub fn overhead(shape: &NodeShape, daemons: &[DaemonPod]) -> Amount {
    daemons
        .iter()
        .filter(|d| accepts(shape, &d.pod))
        .fold(Amount::default(), |sum, d| sum.plus(&d.pod.request))
}

/// What is still to come on an existing node of `shape`: the daemon pods' [`overhead`]
/// less what the DaemonSet pods already on `node` ask for (never below zero).
pub fn still_to_come(
    shape: &NodeShape,
    daemons: &[DaemonPod],
    node: &str,
    usage: &NodeUse,
) -> Amount {
    overhead(shape, daemons).minus(&usage.daemons_on(node))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::Taint;
    use serde_json::json;

    use super::*;

    fn daemonset(name: &str, spec: serde_json::Value) -> DaemonSet {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "kube-system"},
            "spec": {
                "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}}, "spec": spec}
            }
        }))
        .expect("daemonset")
    }

    fn requests(cpu: &str, memory: &str) -> serde_json::Value {
        json!([{"name": "c", "image": "i", "resources": {"requests": {"cpu": cpu, "memory": memory}}}])
    }

    fn shape(labels: &[(&str, &str)], taints: &[(&str, &str)]) -> NodeShape {
        NodeShape {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
            taints: taints
                .iter()
                .map(|(k, e)| Taint {
                    key: k.to_string(),
                    effect: e.to_string(),
                    ..Taint::default()
                })
                .collect(),
        }
    }

    #[test]
    fn a_daemonset_that_selects_the_node_takes_its_requests_and_a_pod_slot() {
        let daemons = daemon_pods(&[
            daemonset("cni", json!({"containers": requests("1", "256Mi")})),
            daemonset(
                "gpu-agent",
                json!({"containers": requests("500m", "128Mi"),
                       "nodeSelector": {"accelerator": "nvidia"}}),
            ),
        ]);
        let plain = overhead(&shape(&[("kubernetes.io/arch", "amd64")], &[]), &daemons);
        assert_eq!((plain.cpu, plain.memory, plain.pods), (1000, 256 << 20, 1));
        let gpu = overhead(&shape(&[("accelerator", "nvidia")], &[]), &daemons);
        assert_eq!((gpu.cpu, gpu.memory, gpu.pods), (1500, 384 << 20, 2));
    }

    #[test]
    fn a_tainted_node_gets_only_the_daemonsets_that_tolerate_the_taint() {
        let daemons = daemon_pods(&[
            daemonset("plain", json!({"containers": requests("1", "0")})),
            daemonset(
                "tolerant",
                json!({"containers": requests("250m", "0"),
                       "tolerations": [{"key": "dedicated", "operator": "Exists"}]}),
            ),
        ]);
        let tainted = overhead(&shape(&[], &[("dedicated", "NoSchedule")]), &daemons);
        assert_eq!((tainted.cpu, tainted.pods), (250, 1));
        // The taints the DaemonSet controller tolerates for every daemon pod do not keep
        // one off.
        let cordoned = overhead(
            &shape(&[], &[("node.kubernetes.io/unschedulable", "NoSchedule")]),
            &daemons,
        );
        assert_eq!((cordoned.cpu, cordoned.pods), (1250, 2));
    }

    #[test]
    fn a_daemonset_being_deleted_or_requiring_another_node_adds_nothing() {
        let mut gone = daemonset("gone", json!({"containers": requests("1", "0")}));
        gone.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        let elsewhere = daemonset(
            "arm-only",
            json!({"containers": requests("1", "0"),
                   "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                       {"nodeSelectorTerms": [{"matchExpressions":
                           [{"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64"]}]}]}}}}),
        );
        let daemons = daemon_pods(&[gone, elsewhere]);
        assert_eq!(daemons.len(), 1);
        assert_eq!(
            overhead(&shape(&[("kubernetes.io/arch", "amd64")], &[]), &daemons),
            Amount::default()
        );
    }

    #[test]
    fn on_an_existing_node_only_the_daemon_pods_not_there_yet_are_still_to_come() {
        let daemons = daemon_pods(&[daemonset("cni", json!({"containers": requests("1", "0")}))]);
        let running: Pod = serde_json::from_value(json!({
            "metadata": {"name": "cni-x", "namespace": "kube-system",
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                              "name": "cni", "uid": "u"}]},
            "spec": {"nodeName": "n1", "containers": requests("1", "0")},
            "status": {"phase": "Running"}
        }))
        .expect("pod");
        let pods = [running];
        let usage = NodeUse::of(&pods);
        let s = shape(&[], &[]);
        assert_eq!(still_to_come(&s, &daemons, "n1", &usage), Amount::default());
        assert_eq!(still_to_come(&s, &daemons, "n2", &usage).cpu, 1000);
    }
}

//! What a Node that joined a tenant still needs from autonodes: the labels the kubelet may
//! not set on itself and the removal of the registration taint, as one JSON patch.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Taint};
use serde_json::{json, Value};

use crate::node_config::REGISTRATION_TAINT_KEY;

/// The JSON-patch operations that give `node` the `labels` it lacks and remove the
/// registration taint, or `None` when it needs neither.
///
/// Labels are added one by one; each registration taint is removed by its position, after a
/// `test` that the position still holds it. The kubelet's status heartbeats, which change
/// the Node's `resourceVersion`, do not make the patch conflict; neither does a taint added
/// or removed behind it meanwhile (the node lifecycle controller taking
/// `node.kubernetes.io/not-ready` off a new Node). Only a change at or before its position
/// makes the patch fail (422) — it never overwrites another writer's taints.
pub fn node_patch(node: &Node, labels: &BTreeMap<String, String>) -> Option<Vec<Value>> {
    let current = node.metadata.labels.clone().unwrap_or_default();
    let missing: BTreeMap<&String, &String> = labels
        .iter()
        .filter(|(k, v)| current.get(*k) != Some(*v))
        .collect();
    let taints: Vec<Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let registration: Vec<(usize, &Taint)> = taints
        .iter()
        .enumerate()
        .filter(|(_, t)| t.key == REGISTRATION_TAINT_KEY)
        .collect();
    if missing.is_empty() && registration.is_empty() {
        return None;
    }
    let mut ops: Vec<Value> = Vec::new();
    if current.is_empty() && !missing.is_empty() {
        ops.push(json!({"op": "add", "path": "/metadata/labels", "value": {}}));
    }
    for (k, v) in &missing {
        ops.push(json!({"op": "add", "path": format!("/metadata/labels/{}", json_pointer_escape(k)), "value": v}));
    }
    // From the last to the first, so that a removal does not move the positions still to go.
    for (i, taint) in registration.into_iter().rev() {
        let path = format!("/spec/taints/{i}");
        ops.push(json!({"op": "test", "path": path, "value": taint}));
        ops.push(json!({"op": "remove", "path": path}));
    }
    Some(ops)
}

/// True when `node` still carries the registration taint (its patch tests the taints).
pub fn removes_registration_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == REGISTRATION_TAINT_KEY))
}

/// A JSON pointer segment for `key` (`~` → `~0`, `/` → `~1`).
fn json_pointer_escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// What a node must know of its tenant before it joins, read at most once a minute per
/// tenant (by the controller, from the tenant).
#[derive(Clone, Debug)]
pub struct JoinInfo {
    /// Where the tenant says nodes join.
    pub published: Published,
    /// The tenant's Kubernetes version (its `/version`), or why it is not one.
    pub version: Result<crate::kubeversion::KubeVersion, String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSpec;

    fn node(labels: &[(&str, &str)], taints: &[&str]) -> Node {
        let mut n = Node::default();
        if !labels.is_empty() {
            n.metadata.labels = Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            );
        }
        n.spec = Some(NodeSpec {
            taints: Some(
                taints
                    .iter()
                    .map(|k| Taint {
                        key: k.to_string(),
                        effect: "NoSchedule".into(),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        });
        n
    }

    fn want(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_node_with_its_labels_and_no_registration_taint_needs_no_patch() {
        let n = node(&[("a/b", "1")], &["other"]);
        assert_eq!(node_patch(&n, &want(&[("a/b", "1")])), None);
    }

    /// `node` as the API server has it after `ops` (a JSON patch) was applied to it.
    fn patched(node: &Node, ops: Vec<Value>) -> Result<Node, String> {
        let mut doc = serde_json::to_value(node).map_err(|e| e.to_string())?;
        let patch: json_patch::Patch =
            serde_json::from_value(Value::Array(ops)).map_err(|e| e.to_string())?;
        json_patch::patch(&mut doc, &patch).map_err(|e| e.to_string())?;
        serde_json::from_value(doc).map_err(|e| e.to_string())
    }

    fn taint_keys(node: &Node) -> Vec<String> {
        node.spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .map(|ts| ts.iter().map(|t| t.key.clone()).collect())
            .unwrap_or_default()
    }

    #[test]
    fn missing_labels_are_added_escaped_and_the_registration_taint_is_removed_if_unchanged() {
        let n = node(&[], &[REGISTRATION_TAINT_KEY, "keep"]);
        let ops = node_patch(&n, &want(&[("example.com/x~y", "v")])).expect("a patch");
        assert_eq!(
            ops[0],
            json!({"op": "add", "path": "/metadata/labels", "value": {}})
        );
        assert_eq!(
            ops[1],
            json!({"op": "add", "path": "/metadata/labels/example.com~1x~0y", "value": "v"})
        );
        let after = patched(&n, ops).expect("applies");
        assert_eq!(taint_keys(&after), ["keep"]);
        assert_eq!(
            after.metadata.labels.expect("labels")["example.com/x~y"],
            "v"
        );
    }

    #[test]
    fn a_taint_removed_behind_the_registration_taint_meanwhile_does_not_fail_the_patch() {
        let read = node(
            &[],
            &[
                "first",
                REGISTRATION_TAINT_KEY,
                "node.kubernetes.io/not-ready",
            ],
        );
        let ops = node_patch(&read, &want(&[])).expect("a patch");
        // The node lifecycle controller took its taint off between our read and our write.
        let now = node(&[], &["first", REGISTRATION_TAINT_KEY]);
        let after = patched(&now, ops.clone()).expect("applies");
        assert_eq!(taint_keys(&after), ["first"]);
        // Another taint added at the end meanwhile stays.
        let now = node(&[], &["first", REGISTRATION_TAINT_KEY, "not-ours", "added"]);
        let after = patched(&now, ops).expect("applies");
        assert_eq!(taint_keys(&after), ["first", "not-ours", "added"]);
    }

    #[test]
    fn a_taint_changed_before_the_registration_taint_fails_the_patch_instead_of_being_overwritten()
    {
        let read = node(&[], &["first", REGISTRATION_TAINT_KEY]);
        let ops = node_patch(&read, &want(&[])).expect("a patch");
        let now = node(&[], &[REGISTRATION_TAINT_KEY]);
        assert!(patched(&now, ops).is_err());
    }

    #[test]
    fn the_last_taint_going_leaves_no_taint() {
        let n = node(&[("a", "b")], &[REGISTRATION_TAINT_KEY]);
        let ops = node_patch(&n, &want(&[("a", "b")])).expect("a patch");
        assert_eq!(ops.len(), 2);
        assert!(taint_keys(&patched(&n, ops).expect("applies")).is_empty());
    }

    #[test]
    fn every_registration_taint_goes_when_there_are_several() {
        let n = node(
            &[],
            &[REGISTRATION_TAINT_KEY, "keep", REGISTRATION_TAINT_KEY],
        );
        let ops = node_patch(&n, &want(&[])).expect("a patch");
        assert_eq!(taint_keys(&patched(&n, ops).expect("applies")), ["keep"]);
    }
}

/// The ConfigMap in which a kubeadm-style tenant (and a vCluster with private nodes)
/// publishes its cluster configuration: `kube-system/kubeadm-config`.
pub const KUBEADM_CONFIG: (&str, &str) = ("kube-system", "kubeadm-config");
/// Annotation on that ConfigMap with the URL vCluster serves its node join script at.
pub(crate) const ANNOTATION_JOIN_SCRIPT_ENDPOINT: &str = "vcluster.loft.sh/join-script-endpoint";
/// The port kubeadm puts behind a `controlPlaneEndpoint` written without one.
pub(crate) const DEFAULT_CONTROL_PLANE_PORT: u16 = 6443;

/// Where the tenant says nodes join, read from its `kube-system/kubeadm-config`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Published {
    /// `controlPlaneEndpoint` as `host:port`.
    pub endpoint: Option<String>,
    /// The join script URL of the annotation [`ANNOTATION_JOIN_SCRIPT_ENDPOINT`].
    pub join_script_url: Option<String>,
}

/// Reads the join address a tenant publishes: `controlPlaneEndpoint` of the
/// `ClusterConfiguration` in `data` (port 6443 when it has none) and the join script URL
/// of the annotation. The tenant writes both, so both are checked: an endpoint of anything
/// but `host:port` of letters, digits and `.-:[]`, or a URL that is not
/// [`crate::userdata::is_join_script_url`], is an error (and not used).
pub fn published(
    data: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) -> Result<Published, String> {
    let mut out = Published::default();
    if let Some(text) = data.get("ClusterConfiguration") {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct ClusterConfiguration {
            #[serde(default)]
            control_plane_endpoint: String,
        }
        let config: ClusterConfiguration = crate::yaml::from_str(text).map_err(|_| {
            "its ClusterConfiguration is not YAML of a kubeadm ClusterConfiguration".to_string()
        })?;
        let ep = config.control_plane_endpoint.trim();
        if !ep.is_empty() {
            out.endpoint = Some(endpoint_with_port(ep).ok_or_else(|| {
                format!(
                    "controlPlaneEndpoint {:?} is not host[:port]",
                    ep.chars().take(100).collect::<String>()
                )
            })?);
        }
    }
    if let Some(url) = annotations.get(ANNOTATION_JOIN_SCRIPT_ENDPOINT) {
        let url = url.trim();
        if !crate::userdata::is_join_script_url(url) {
            return Err(format!(
                "annotation {ANNOTATION_JOIN_SCRIPT_ENDPOINT} {:?} is not an https URL of letters, digits and .-_/:[]",
                url.chars().take(100).collect::<String>()
            ));
        }
        out.join_script_url = Some(url.to_string());
    }
    Ok(out)
}

/// `host:port` from `host[:port]` (IPv6 in brackets), or `None` when it has other
/// characters.
fn endpoint_with_port(ep: &str) -> Option<String> {
    let safe = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'[' | b']' | b':'))
    };
    if !safe(ep) {
        return None;
    }
    let (host, port) = if let Some(rest) = ep.strip_prefix('[') {
        let (h, after) = rest.split_once(']')?;
        (format!("[{h}]"), after.strip_prefix(':'))
    } else {
        match ep.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h.to_string(), Some(p)),
            Some(_) => return None,
            None => (ep.to_string(), None),
        }
    };
    let port = match port {
        Some(p) => p.parse::<u16>().ok().filter(|p| *p > 0)?,
        None => DEFAULT_CONTROL_PLANE_PORT,
    };
    (host.len() > 2 || !host.starts_with('[')).then(|| format!("{host}:{port}"))
}

#[cfg(test)]
mod published_tests {
    use super::*;

    fn data(endpoint: &str) -> BTreeMap<String, String> {
        BTreeMap::from([(
            "ClusterConfiguration".to_string(),
            format!("apiVersion: kubeadm.k8s.io/v1beta3\nkind: ClusterConfiguration\ncontrolPlaneEndpoint: {endpoint}\n"),
        )])
    }

    #[test]
    fn the_control_plane_endpoint_and_the_join_script_url_are_what_the_tenant_publishes() {
        let none = BTreeMap::new();
        assert_eq!(
            published(&data("vc.example.com:8443"), &none)
                .expect("reads")
                .endpoint
                .as_deref(),
            Some("vc.example.com:8443")
        );
        assert_eq!(
            published(&data("10.0.0.5"), &none)
                .expect("reads")
                .endpoint
                .as_deref(),
            Some("10.0.0.5:6443"),
            "kubeadm's default port"
        );
        assert_eq!(
            published(&data("'[fd00::1]:443'"), &none)
                .expect("reads")
                .endpoint
                .as_deref(),
            Some("[fd00::1]:443")
        );
        let url = BTreeMap::from([(
            ANNOTATION_JOIN_SCRIPT_ENDPOINT.to_string(),
            "https://join.example.com".to_string(),
        )]);
        let p = published(&BTreeMap::new(), &url).expect("reads");
        assert_eq!(p.endpoint, None);
        assert_eq!(
            p.join_script_url.as_deref(),
            Some("https://join.example.com")
        );
        assert_eq!(published(&none, &none), Ok(Published::default()));
    }

    #[test]
    fn what_the_tenant_publishes_cannot_reach_a_shell() {
        let none = BTreeMap::new();
        for bad in [
            "'a;b:443'",
            "'$(id):443'",
            "'a b'",
            "'host:99999'",
            "'fd00::1'",
        ] {
            assert!(published(&data(bad), &none).is_err(), "{bad}");
        }
        for bad in [
            "http://x",
            "https://x/$(id)",
            "https://x?token=a",
            "https://x\"y",
        ] {
            let a =
                BTreeMap::from([(ANNOTATION_JOIN_SCRIPT_ENDPOINT.to_string(), bad.to_string())]);
            assert!(published(&none, &a).is_err(), "{bad}");
        }
        let e = published(
            &BTreeMap::from([("ClusterConfiguration".to_string(), "[".to_string())]),
            &none,
        )
        .expect_err("not YAML");
        assert!(!e.contains('['), "{e}");
    }
}

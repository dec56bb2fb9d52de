//! What a claim's node is configured with once its type is chosen: its properties
//! (type < pool < claim), labels, taints and kubelet arguments, each checked.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Taint;

use crate::catalogue::{identity_properties, merge_taints, PreparedType};
use crate::properties::{
    CONFIG_PROPERTIES, PROP_ARCH, PROP_INSTANCE_TYPE, PROP_NODE_TYPE, PROP_NODE_TYPE_ALIAS,
    PROP_OS, PROP_PROVIDER,
};
use crate::requirements::{self};
use crate::scheduling::{narrow_offer, CheckedRequirement};
use crate::template;
use autonodes_api::{
    NodeClaimSpec, NodePoolSpec, Properties, LABEL_NODECLAIM, LABEL_NODECLAIM_NAMESPACE,
    LABEL_NODECLAIM_UID, LABEL_NODEPOOL,
};

/// The taint every node registers with until autonodes has seen it join.
pub(crate) const REGISTRATION_TAINT_KEY: &str = "autonodes.io/unregistered";

// ---------------------------------------------------------------------------------------
// Node properties, labels, taints
// ---------------------------------------------------------------------------------------

/// The properties of a node: the type's (defaults < provider < type), then the pool's,
/// then the claim's; the type identity properties are kept whatever pool or claim say.
/// A type property that offers several values (`a,b`) or any (`*`) becomes the one value
/// the claim's and pool's requirements pick ([`narrow_offer`]).
pub(crate) fn node_properties(
    t: &PreparedType,
    pool: Option<&NodePoolSpec>,
    claim: &NodeClaimSpec,
) -> Properties {
    let mut p = t.properties.clone();
    let asked: Vec<requirements::Requirement> = pool
        .map(|p| p.requirements.as_slice())
        .unwrap_or_default()
        .iter()
        .chain(&claim.requirements)
        .filter_map(|r| CheckedRequirement::new(r, "").ok())
        .map(|r| r.requirement)
        .collect();
    for (key, value) in p.iter_mut() {
        let on_key: Vec<&requirements::Requirement> =
            asked.iter().filter(|r| &r.key == key).collect();
        if let Some(chosen) = narrow_offer(value, &on_key) {
            *value = chosen;
        }
    }
    if let Some(pool) = pool {
        p.extend(pool.properties.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    p.extend(claim.properties.iter().map(|(k, v)| (k.clone(), v.clone())));
    for (k, v) in identity_properties(&t.name, &t.short_name, &t.provider) {
        p.insert(k.to_string(), v);
    }
    p
}

/// The cloud-config a node of these properties merges into its user data
/// (`autonodes.io/user-data`, else vCluster's spelling).
pub fn user_cloud_config(properties: &Properties) -> Option<&str> {
    crate::properties::config_property(properties, crate::properties::PROP_USER_DATA)
        .map(String::as_str)
}

/// The SSH keys a node of these properties gets (`autonodes.io/ssh-keys`, else vCluster's
/// spelling), one per line.
pub fn ssh_keys(properties: &Properties) -> Vec<String> {
    crate::properties::config_property(properties, crate::properties::PROP_SSH_KEYS)
        .map(|v| crate::userdata::parse_ssh_keys(v))
        .unwrap_or_default()
}

/// The properties of a claim's node: [`node_properties`], with the zone the claim was
/// scheduled into (`status.zone`) in place of what its type offers.
pub fn claim_node_properties(
    t: &PreparedType,
    pool: Option<&NodePoolSpec>,
    claim: &autonodes_api::NodeClaim,
) -> Properties {
    let mut p = node_properties(t, pool, &claim.spec);
    if let Some(zone) = claim.status.as_ref().and_then(|s| s.zone.as_ref()) {
        p.insert(crate::properties::PROP_ZONE.to_string(), zone.clone());
    }
    p
}

/// Whether `key` is a valid label key: an optional DNS subdomain prefix and `/`, then a
/// name of at most 63 characters of `[A-Za-z0-9-_.]` starting and ending alphanumeric.
pub(crate) fn is_valid_label_key(key: &str) -> bool {
    crate::names::is_qualified_name(key)
}

/// Whether `value` is a valid label value (empty, or like a label name).
pub(crate) fn is_valid_label_value(value: &str) -> bool {
    value.is_empty() || crate::names::is_label_value(value)
}

/// Whether a kubelet accepts `key` in `--node-labels`. Keys in the `kubernetes.io` or
/// `k8s.io` namespaces (or their subdomains) are refused unless they are one of the
/// well-known labels the kubelet sets itself or lie under `kubelet.kubernetes.io` or
/// `node.kubernetes.io` (e.g. `node-role.kubernetes.io/worker` is refused).
pub(crate) fn kubelet_may_set_label(key: &str) -> bool {
    const ALLOWED: &[&str] = &[
        "kubernetes.io/hostname",
        "kubernetes.io/os",
        "kubernetes.io/arch",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/arch",
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
        "topology.kubernetes.io/region",
        "topology.kubernetes.io/zone",
        "failure-domain.beta.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
    ];
    let Some((namespace, _)) = key.split_once('/') else {
        return true;
    };
    let under = |ns: &str, domain: &str| ns == domain || ns.ends_with(&format!(".{domain}"));
    let restricted = under(namespace, "kubernetes.io") || under(namespace, "k8s.io");
    !restricted
        || ALLOWED.contains(&key)
        || under(namespace, "kubelet.kubernetes.io")
        || under(namespace, "node.kubernetes.io")
}

/// Why a pool or claim may not set the node label `key`, if it may not: labels the
/// kubelet, the node controller or autonodes itself own. Of `node.kubernetes.io/*`, only
/// `exclude-from-external-load-balancers` and `exclude-disruption` (meant for
/// administrators) may be set.
pub(crate) fn reserved_label(key: &str) -> Option<&'static str> {
    const USER_NODE_LABELS: &[&str] = &[
        "node.kubernetes.io/exclude-from-external-load-balancers",
        "node.kubernetes.io/exclude-disruption",
    ];
    let (namespace, _) = key.split_once('/').unwrap_or(("", key));
    let under = |domain: &str| namespace == domain || namespace.ends_with(&format!(".{domain}"));
    match key {
        "kubernetes.io/hostname" => Some("the kubelet sets it to the node's name"),
        PROP_OS | PROP_ARCH => {
            Some("the kubelet sets it; choose it with the property of the same name")
        }
        PROP_INSTANCE_TYPE | PROP_NODE_TYPE | PROP_NODE_TYPE_ALIAS | PROP_PROVIDER => {
            Some("autonodes sets it from the node type")
        }
        LABEL_NODECLAIM | LABEL_NODECLAIM_NAMESPACE | LABEL_NODECLAIM_UID | LABEL_NODEPOOL => {
            Some("autonodes sets it to name the node's claim")
        }
        autonodes_api::LABEL_INSTALLATION => {
            Some("autonodes sets it to the installation that made the node")
        }
        k if USER_NODE_LABELS.contains(&k) => None,
        _ if namespace == "beta.kubernetes.io" => Some("the kubelet sets it"),
        _ if under("node.kubernetes.io") => Some("the kubelet or the node controller owns it"),
        _ if namespace == "topology.kubernetes.io"
            || namespace == "failure-domain.beta.kubernetes.io" =>
        {
            Some("it describes the host; set it as a property of the provider or node type")
        }
        _ => None,
    }
}

/// A node label that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: label {key:?}={value:?}: {message}")]
pub struct LabelError {
    /// Where the label comes from, e.g. `spec.labels`.
    pub field: String,
    /// The label key.
    pub key: String,
    /// The label value.
    pub value: String,
    /// What is wrong.
    pub message: &'static str,
}

/// The labels of a node, split by who sets them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeLabels {
    /// Labels the kubelet registers the node with (`--node-labels` in the join config).
    pub join: BTreeMap<String, String>,
    /// Labels the kubelet may not set (see [`kubelet_may_set_label`]); autonodes sets them
    /// on the Node after it joined.
    pub after_join: BTreeMap<String, String>,
}

impl NodeLabels {
    /// Every label of the node.
    pub fn all(&self) -> BTreeMap<String, String> {
        let mut all = self.join.clone();
        all.extend(self.after_join.iter().map(|(k, v)| (k.clone(), v.clone())));
        all
    }
}

/// The labels of a node: every property that is a valid label (key and value) and not a
/// configuration property ([`CONFIG_PROPERTIES`]), then the pool's `labels`, then the
/// claim's `labels`, then `identity` (the labels naming the node's claim). Invalid or
/// reserved ([`reserved_label`]) pool or claim labels are errors naming the field;
/// properties that are not valid labels are simply not labels.
pub fn node_labels(
    properties: &Properties,
    pool_labels: Option<&BTreeMap<String, String>>,
    claim_labels: &BTreeMap<String, String>,
    identity: &BTreeMap<String, String>,
) -> Result<NodeLabels, LabelError> {
    let mut all: BTreeMap<String, String> = properties
        .iter()
        .filter(|(k, v)| {
            !CONFIG_PROPERTIES.contains(&k.as_str())
                && is_valid_label_key(k)
                && is_valid_label_value(v)
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (field, labels) in [
        ("NodePool spec.labels", pool_labels),
        ("spec.labels", Some(claim_labels)),
    ] {
        for (k, v) in labels.into_iter().flatten() {
            let error = |message| LabelError {
                field: field.to_string(),
                key: k.clone(),
                value: v.clone(),
                message,
            };
            if !is_valid_label_key(k) {
                return Err(error("not a valid label key"));
            }
            if !is_valid_label_value(v) {
                return Err(error("not a valid label value"));
            }
            if let Some(why) = reserved_label(k) {
                return Err(error(why));
            }
            all.insert(k.clone(), v.clone());
        }
    }
    all.extend(identity.iter().map(|(k, v)| (k.clone(), v.clone())));
    let (join, after_join) = all.into_iter().partition(|(k, _)| kubelet_may_set_label(k));
    Ok(NodeLabels { join, after_join })
}

/// The registration taint, `autonodes.io/unregistered:NoExecute`.
pub(crate) fn registration_taint() -> Taint {
    Taint {
        key: REGISTRATION_TAINT_KEY.to_string(),
        effect: "NoExecute".to_string(),
        ..Taint::default()
    }
}

/// The taints of a node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeTaints {
    /// Taints the node keeps: the type's (spec and template), the pool's, the claim's.
    pub taints: Vec<Taint>,
    /// Startup taints (pool and claim): something else removes them once the node is ready.
    pub startup: Vec<Taint>,
}

impl NodeTaints {
    /// What the node registers with: `taints`, `startup` and the registration taint.
    pub fn registration(&self) -> Vec<Taint> {
        merge_taints([
            self.taints.as_slice(),
            self.startup.as_slice(),
            &[registration_taint()],
        ])
    }
}

/// A taint of a pool or claim that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct TaintError {
    /// Where the taint is, e.g. `spec.startupTaints`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

/// The taints of a node of type `t` for a claim (and its pool).
pub fn node_taints(
    t: &PreparedType,
    pool: Option<&NodePoolSpec>,
    claim: &NodeClaimSpec,
) -> Result<NodeTaints, TaintError> {
    let check = |field: &str, list: &[Taint]| -> Result<(), TaintError> {
        list.iter().try_for_each(|taint| {
            template::check_taint(taint).map_err(|message| TaintError {
                field: field.to_string(),
                message,
            })
        })
    };
    let empty: &[Taint] = &[];
    let (pool_taints, pool_startup) = pool.map_or((empty, empty), |p| {
        (p.taints.as_slice(), p.startup_taints.as_slice())
    });
    check("NodePool spec.taints", pool_taints)?;
    check("NodePool spec.startupTaints", pool_startup)?;
    check("spec.taints", &claim.taints)?;
    check("spec.startupTaints", &claim.startup_taints)?;
    Ok(NodeTaints {
        taints: merge_taints([t.taints.as_slice(), pool_taints, claim.taints.as_slice()]),
        startup: merge_taints([pool_startup, claim.startup_taints.as_slice()]),
    })
}

/// The kubelet arguments of a node: the pool's, then the claim's.
pub fn kubelet_args(
    pool: Option<&NodePoolSpec>,
    claim: &NodeClaimSpec,
) -> BTreeMap<String, String> {
    let mut args = pool.map(|p| p.kubelet_args.clone()).unwrap_or_default();
    args.extend(
        claim
            .kubelet_args
            .iter()
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    args
}

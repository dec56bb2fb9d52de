//! Multus networks a node type attaches its VMs to, by NetworkAttachmentDefinition name
//! (Gardener's shared networks and its `default: true` tenant network). Pure code, no I/O.
//!
//! - `autonodes.io/networks`: secondary networks, `[<namespace>/]<name>` separated by
//!   commas or blanks. Each becomes a network `multus-<n>` (n from 1, in the order given)
//!   with a bridge interface, after the template's own. A template without networks gets
//!   the pod network written out first (`default`, masquerade), because KubeVirt adds the
//!   pod network by itself only to a VM that lists no network at all.
//! - `autonodes.io/default-network`: one `[<namespace>/]<name>` that replaces the pod
//!   network: the template's pod network and its interface are removed, and the Multus
//!   network takes their place (first, `default: true`, bridge interface), under the pod
//!   network's name (`default` if the template had none).

use serde_json::{json, Value};

use super::error::TemplateError;
use crate::names::{is_dns_label, is_dns_subdomain};
use crate::properties::{PROP_DEFAULT_NETWORK, PROP_NETWORKS};

/// The most secondary networks one node type may ask for.
pub(crate) const MAX_NETWORKS: usize = 16;
/// The name autonodes gives the pod network (or the network replacing it) when the
/// template has none.
pub(crate) const POD_NETWORK: &str = "default";
/// What the name of the n-th secondary network starts with.
pub(crate) const SECONDARY_PREFIX: &str = "multus-";
/// The longest property value read.
const MAX_PROPERTY_LEN: usize = 4096;

/// Checks one NetworkAttachmentDefinition reference, `[<namespace>/]<name>`.
fn check_reference(reference: &str) -> Result<(), String> {
    let shown: String = reference.chars().take(64).collect();
    let (namespace, name) = match reference.split_once('/') {
        Some((ns, name)) => (Some(ns), name),
        None => (None, reference),
    };
    if namespace.is_some_and(|ns| !is_dns_label(ns)) {
        return Err(format!("{shown:?}: the namespace must be a DNS-1123 label"));
    }
    if !is_dns_subdomain(name, 253) {
        return Err(format!(
            "{shown:?}: the NetworkAttachmentDefinition name must be a DNS-1123 subdomain"
        ));
    }
    Ok(())
}

/// Reads the value of [`PROP_NETWORKS`]: the references in order. The error says which
/// entry is wrong and why, in at most a line.
pub(crate) fn parse_networks(value: &str) -> Result<Vec<String>, String> {
    if value.len() > MAX_PROPERTY_LEN {
        return Err(format!("longer than {MAX_PROPERTY_LEN} characters"));
    }
    let mut networks: Vec<String> = Vec::new();
    for reference in value
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|r| !r.is_empty())
    {
        check_reference(reference)?;
        if networks.iter().any(|n| n == reference) {
            return Err(format!(
                "{:?} is listed twice",
                reference.chars().take(64).collect::<String>()
            ));
        }
        if networks.len() == MAX_NETWORKS {
            return Err(format!("more than {MAX_NETWORKS} networks"));
        }
        networks.push(reference.to_string());
    }
    Ok(networks)
}

/// Reads the value of [`PROP_DEFAULT_NETWORK`]: one reference.
pub(crate) fn parse_default_network(value: &str) -> Result<String, String> {
    let reference = value.trim();
    if reference.is_empty() {
        return Err("empty".to_string());
    }
    check_reference(reference)?;
    Ok(reference.to_string())
}

fn list<'v>(template: &'v mut Value, pointer: &str) -> Result<&'v mut Vec<Value>, String> {
    let (parent, key) = pointer.rsplit_once('/').unwrap_or(("", pointer));
    let slot = super::merge::ensure_object(template, parent)
        .ok_or_else(|| format!("{parent} is not an object"))?
        .entry(key)
        .or_insert_with(|| json!([]));
    slot.as_array_mut()
        .ok_or_else(|| format!("{pointer} is not a list"))
}

const NETWORKS: &str = "/spec/template/spec/networks";
const INTERFACES: &str = "/spec/template/spec/domain/devices/interfaces";

fn name_of(v: &Value) -> Option<&str> {
    v.get("name").and_then(Value::as_str)
}

/// Attaches a type's VMs to Multus networks: `default_network` replaces the pod network,
/// `secondary` are added after the template's networks (see the module documentation).
/// A network or interface name the template already uses is an error naming the property.
pub(crate) fn add_networks(
    template: &mut Value,
    default_network: Option<&str>,
    secondary: &[String],
    node_type: &str,
) -> Result<(), TemplateError> {
    if default_network.is_none() && secondary.is_empty() {
        return Ok(());
    }
    let bad =
        |property: &str, message: String| TemplateError::property(node_type, property, message);
    let mut work = template.clone();
    let networks = list(&mut work, NETWORKS).map_err(|m| bad(PROP_NETWORKS, m))?;
    let had_networks = !networks.is_empty();
    let mut networks = std::mem::take(networks);
    let interfaces = list(&mut work, INTERFACES).map_err(|m| bad(PROP_NETWORKS, m))?;
    let mut interfaces = std::mem::take(interfaces);

    if let Some(reference) = default_network {
        let pod_names: Vec<String> = networks
            .iter()
            .filter(|n| n.get("pod").is_some())
            .filter_map(|n| name_of(n).map(str::to_string))
            .collect();
        networks.retain(|n| n.get("pod").is_none());
        interfaces.retain(|i| name_of(i).is_none_or(|n| !pod_names.iter().any(|p| p == n)));
        let name = pod_names
            .first()
            .cloned()
            .unwrap_or_else(|| POD_NETWORK.to_string());
        if networks.iter().any(|n| name_of(n) == Some(name.as_str()))
            || interfaces.iter().any(|i| name_of(i) == Some(name.as_str()))
        {
            return Err(bad(
                PROP_DEFAULT_NETWORK,
                format!("the template already has a network or interface named {name}"),
            ));
        }
        networks.insert(
            0,
            json!({"name": name, "multus": {"networkName": reference, "default": true}}),
        );
        interfaces.insert(0, json!({"name": name, "bridge": {}}));
    } else if !had_networks && !secondary.is_empty() {
        // KubeVirt attaches the pod network by itself only when no network is listed.
        networks.push(json!({"name": POD_NETWORK, "pod": {}}));
        if !interfaces.iter().any(|i| name_of(i) == Some(POD_NETWORK)) {
            interfaces.insert(0, json!({"name": POD_NETWORK, "masquerade": {}}));
        }
    }

    for (i, reference) in secondary.iter().enumerate() {
        let name = format!("{SECONDARY_PREFIX}{}", i + 1);
        if networks.iter().any(|n| name_of(n) == Some(name.as_str()))
            || interfaces.iter().any(|i| name_of(i) == Some(name.as_str()))
        {
            return Err(bad(
                PROP_NETWORKS,
                format!("the template already has a network or interface named {name}"),
            ));
        }
        networks.push(json!({"name": name, "multus": {"networkName": reference}}));
        interfaces.push(json!({"name": name, "bridge": {}}));
    }
    *list(&mut work, NETWORKS).map_err(|m| bad(PROP_NETWORKS, m))? = networks;
    *list(&mut work, INTERFACES).map_err(|m| bad(PROP_NETWORKS, m))? = interfaces;
    *template = work;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod_template() -> Value {
        json!({"spec": {"template": {"spec": {
            "domain": {"devices": {"interfaces": [{"name": "default", "masquerade": {}}]}},
            "networks": [{"name": "default", "pod": {}}],
        }}}})
    }

    #[test]
    fn network_references_are_read_in_order_with_or_without_a_namespace() {
        assert_eq!(
            parse_networks("storage, infra/vlan-20\nbackup").expect("parses"),
            vec!["storage", "infra/vlan-20", "backup"]
        );
        assert_eq!(parse_networks(" ").expect("empty"), Vec::<String>::new());
        assert_eq!(
            parse_default_network(" tenant-a/isolated ").expect("parses"),
            "tenant-a/isolated"
        );
    }

    #[test]
    fn a_network_reference_autonodes_cannot_use_is_refused_with_the_reason() {
        for (value, says) in [
            ("Bad_Name", "DNS-1123 subdomain"),
            ("ns.with.dots/net", "namespace must be a DNS-1123 label"),
            ("a/b/c", "DNS-1123 subdomain"),
            ("net,net", "listed twice"),
            (&"n".repeat(5000), "longer than"),
        ] {
            let e = parse_networks(value).expect_err(value);
            assert!(e.contains(says), "{value}: {e}");
            assert!(e.len() < 200, "{value}: unbounded: {e}");
        }
        let many: Vec<String> = (0..17).map(|i| format!("n{i}")).collect();
        assert!(parse_networks(&many.join(","))
            .expect_err("17")
            .contains("more than 16"));
        assert!(parse_default_network("").is_err());
        assert!(parse_default_network("x y").is_err());
    }

    #[test]
    fn secondary_networks_are_added_after_the_pod_network_with_bridge_interfaces() {
        let mut t = pod_template();
        add_networks(
            &mut t,
            None,
            &["storage".into(), "infra/vlan-20".into()],
            "p.t",
        )
        .expect("adds");
        let spec = &t["spec"]["template"]["spec"];
        assert_eq!(
            spec["networks"],
            json!([
                {"name": "default", "pod": {}},
                {"name": "multus-1", "multus": {"networkName": "storage"}},
                {"name": "multus-2", "multus": {"networkName": "infra/vlan-20"}},
            ])
        );
        assert_eq!(
            spec["domain"]["devices"]["interfaces"],
            json!([
                {"name": "default", "masquerade": {}},
                {"name": "multus-1", "bridge": {}},
                {"name": "multus-2", "bridge": {}},
            ])
        );
    }

    #[test]
    fn a_template_without_networks_keeps_the_pod_network_when_secondary_ones_are_added() {
        let mut t = json!({"spec": {"template": {"spec": {"domain": {}}}}});
        add_networks(&mut t, None, &["storage".into()], "p.t").expect("adds");
        let spec = &t["spec"]["template"]["spec"];
        assert_eq!(spec["networks"][0], json!({"name": "default", "pod": {}}));
        assert_eq!(
            spec["domain"]["devices"]["interfaces"][0],
            json!({"name": "default", "masquerade": {}})
        );
        assert_eq!(spec["networks"][1]["name"], "multus-1");
    }

    #[test]
    fn a_default_network_replaces_the_pod_network_and_its_interface_under_its_name() {
        let mut t = pod_template();
        add_networks(
            &mut t,
            Some("tenant-a/isolated"),
            &["storage".into()],
            "p.t",
        )
        .expect("adds");
        let spec = &t["spec"]["template"]["spec"];
        assert_eq!(
            spec["networks"],
            json!([
                {"name": "default", "multus": {"networkName": "tenant-a/isolated", "default": true}},
                {"name": "multus-1", "multus": {"networkName": "storage"}},
            ])
        );
        assert_eq!(
            spec["domain"]["devices"]["interfaces"],
            json!([{"name": "default", "bridge": {}}, {"name": "multus-1", "bridge": {}}])
        );
        // Without any network in the template, the replacement is named `default`.
        let mut bare = json!({"spec": {"template": {"spec": {}}}});
        add_networks(&mut bare, Some("isolated"), &[], "p.t").expect("adds");
        assert_eq!(
            bare["spec"]["template"]["spec"]["networks"],
            json!([{"name": "default", "multus": {"networkName": "isolated", "default": true}}])
        );
    }

    #[test]
    fn a_network_name_the_template_uses_already_is_an_error_and_nothing_is_written() {
        let mut t = pod_template();
        t["spec"]["template"]["spec"]["networks"]
            .as_array_mut()
            .expect("list")
            .push(json!({"name": "multus-1", "multus": {"networkName": "mine"}}));
        let before = t.clone();
        let e = add_networks(&mut t, None, &["storage".into()], "p.t").expect_err("taken");
        assert!(e.to_string().contains(PROP_NETWORKS), "{e}");
        assert_eq!(t, before);
        let mut odd = json!({"spec": {"template": {"spec": {"networks": "x"}}}});
        assert!(add_networks(&mut odd, None, &["n".into()], "p.t").is_err());
    }

    #[test]
    fn no_network_property_leaves_the_template_alone() {
        let mut t = json!({"spec": {"template": {"spec": {}}}});
        add_networks(&mut t, None, &[], "p.t").expect("noop");
        assert_eq!(t, json!({"spec": {"template": {"spec": {}}}}));
    }
}

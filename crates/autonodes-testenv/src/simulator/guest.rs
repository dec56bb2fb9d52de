//! What the simulated guest does with its user data, as pure functions: parse the
//! `#cloud-config`, find the kubeadm `JoinConfiguration` it writes and the `kubeadm join`
//! it runs, check the kubelet's `--node-labels`, and compute kubeadm's CA public-key pins.
//!
//! The CA pin (`sha256:<hex>` over the DER SubjectPublicKeyInfo of a CA certificate) is
//! computed here independently of the code that renders the user data, so the simulator
//! checks autonodes' hash rather than repeating it.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::core::v1::Taint;
use serde::Deserialize;
use serde_json::Value;
use sha2::Digest;

pub use super::kubeadm::{discovery_token_problem, ConfigApi};

/// Where the kubeadm join configuration must be written.
pub const JOIN_CONFIG_PATH: &str = "/etc/kubernetes/kubeadm-join.yaml";

/// kubeadm's default `discovery.timeout`.
pub const DEFAULT_DISCOVERY_TIMEOUT: Duration = Duration::from_secs(300);

/// Why the guest could not use its user data (it never retries these).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UserDataError(pub String);

fn bad(message: impl Into<String>) -> UserDataError {
    UserDataError(message.into())
}

/// What the guest will do to join, read from its user data.
#[derive(Debug, Clone, PartialEq)]
pub struct JoinPlan {
    /// The configuration API the JoinConfiguration is written in (`apiVersion`): the
    /// guest's kubeadm must read it ([`ConfigApi::readable_by`]).
    pub config_api: ConfigApi,
    /// `discovery.bootstrapToken.apiServerEndpoint` (`host:port`).
    pub api_server_endpoint: String,
    /// The token used for discovery.
    pub discovery_token: String,
    /// The token the kubelet authenticates with (`discovery.tlsBootstrapToken`, else the
    /// discovery token).
    pub tls_bootstrap_token: String,
    /// `discovery.bootstrapToken.caCertHashes`.
    pub ca_cert_hashes: Vec<String>,
    /// `discovery.bootstrapToken.unsafeSkipCAVerification`.
    pub unsafe_skip_ca_verification: bool,
    /// How long kubeadm keeps trying discovery (`discovery.timeout`, default 5 minutes).
    pub discovery_timeout: Duration,
    /// `nodeRegistration.name` (kubeadm falls back to the hostname).
    pub node_name: Option<String>,
    /// `kubeletExtraArgs.provider-id`.
    pub provider_id: Option<String>,
    /// `kubeletExtraArgs.node-labels`, parsed.
    pub node_labels: BTreeMap<String, String>,
    /// `nodeRegistration.taints`.
    pub taints: Vec<Taint>,
    /// Unknown fields kubeadm would warn about (and ignore).
    pub warnings: Vec<String>,
    /// The vCluster join script the guest runs before `kubeadm join`, if any.
    pub join_script: Option<JoinScript>,
}

/// A `runcmd` entry that fetches vCluster's node join script and runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinScript {
    /// The URL fetched (`https://host:port/node/join?token=...`).
    pub url: String,
    /// `--cacert <path>` given to curl, if any.
    pub ca_file: Option<String>,
}

/// The MAC address the VM gives its first interface (what its network data matches), if
/// it names one.
pub(crate) fn first_mac(vm: &kube::api::DynamicObject) -> Option<&str> {
    vm.data
        .pointer("/spec/template/spec/domain/devices/interfaces/0/macAddress")
        .and_then(Value::as_str)
}

/// Parses `#cloud-config` user data and returns the join it performs.
pub fn parse_user_data(text: &str) -> Result<JoinPlan, UserDataError> {
    if !text.starts_with("#cloud-config") {
        return Err(bad(
            "user data does not start with #cloud-config (cloud-init would not read it as cloud-config)",
        ));
    }
    let doc: Value = autonodes_core::yaml::from_str(text)
        .map_err(|e| bad(format!("user data is not valid YAML: {e}")))?;
    let map = doc
        .as_object()
        .ok_or_else(|| bad("cloud-config is not a YAML mapping"))?;
    let files = map
        .get("write_files")
        .and_then(|v| v.as_array())
        .ok_or_else(|| bad("cloud-config has no write_files list"))?;
    let file = files
        .iter()
        .find(|f| f.get("path").and_then(|p| p.as_str()) == Some(JOIN_CONFIG_PATH))
        .ok_or_else(|| bad(format!("write_files has no entry for {JOIN_CONFIG_PATH}")))?;
    let content = write_file_content(file)?;
    let runcmd = map.get("runcmd").and_then(|v| v.as_array());
    let runs_join = runcmd.is_some_and(|cmds| cmds.iter().any(runs_kubeadm_join));
    if !runs_join {
        return Err(bad(format!(
            "runcmd does not run `kubeadm join --config {JOIN_CONFIG_PATH}`"
        )));
    }
    let join_script = runcmd
        .into_iter()
        .flatten()
        .map(command_line)
        .find(|line| line.contains("/node/join"))
        .map(|line| join_script(&line))
        .transpose()?;
    if let Some(ca) = join_script.as_ref().and_then(|s| s.ca_file.as_ref()) {
        if !files
            .iter()
            .any(|f| f.get("path").and_then(|p| p.as_str()) == Some(ca.as_str()))
        {
            return Err(bad(format!(
                "the join script is fetched trusting {ca}, which write_files does not write"
            )));
        }
    }
    let mut plan = parse_join_configuration(&content)?;
    plan.join_script = join_script;
    Ok(plan)
}

/// A `runcmd` entry (string or argv list) as one line.
fn command_line(cmd: &Value) -> String {
    match cmd {
        Value::String(s) => s.clone(),
        Value::Array(args) => args
            .iter()
            .filter_map(|a| a.as_str())
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    }
}

/// Reads `curl [--cacert F] "<url>/node/join?token=T" | sh -s -- --skip-join`. The script
/// joins by itself unless told `--skip-join`, and then `kubeadm join` would run on a
/// joined node: refused.
fn join_script(line: &str) -> Result<JoinScript, UserDataError> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let url = words
        .iter()
        .map(|w| w.trim_matches(['"', '\'']))
        .find(|w| w.starts_with("https://") && w.contains("/node/join?token="))
        .ok_or_else(|| {
            bad(format!(
                "the join script command {line:?} fetches no https://…/node/join?token=… URL"
            ))
        })?;
    if !words.contains(&"--skip-join") {
        return Err(bad(format!(
            "the join script runs without --skip-join, so it joins by itself before `kubeadm join`: {line:?}"
        )));
    }
    let ca_file = words
        .windows(2)
        .find(|w| w[0] == "--cacert")
        .map(|w| w[1].to_string());
    Ok(JoinScript {
        url: url.to_string(),
        ca_file,
    })
}

/// The decoded `content` of a cloud-init `write_files` entry.
fn write_file_content(file: &Value) -> Result<String, UserDataError> {
    let content = file
        .get("content")
        .and_then(|c| c.as_str())
        .ok_or_else(|| {
            bad(format!(
                "write_files entry {JOIN_CONFIG_PATH} has no content"
            ))
        })?;
    match file.get("encoding").and_then(|e| e.as_str()) {
        None | Some("text/plain") => Ok(content.to_string()),
        Some("b64") | Some("base64") => {
            let compact: String = content.split_whitespace().collect();
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(compact)
                .map_err(|e| bad(format!("{JOIN_CONFIG_PATH}: bad base64 content: {e}")))?;
            String::from_utf8(bytes)
                .map_err(|_| bad(format!("{JOIN_CONFIG_PATH}: content is not UTF-8")))
        }
        Some(other) => Err(bad(format!(
            "{JOIN_CONFIG_PATH}: encoding {other} is not supported by the simulator"
        ))),
    }
}

/// True when a `runcmd` entry (string or argv list) runs `kubeadm join --config <path>`.
fn runs_kubeadm_join(cmd: &Value) -> bool {
    let line = command_line(cmd);
    let words: Vec<&str> = line.split_whitespace().collect();
    let join_at = words
        .windows(2)
        .position(|w| w[0].ends_with("kubeadm") && w[1] == "join");
    let Some(join_at) = join_at else {
        return false;
    };
    let rest = &words[join_at + 2..];
    rest.windows(2)
        .any(|w| w[0] == "--config" && w[1].trim_matches(['\'', '"', ';']) == JOIN_CONFIG_PATH)
        || rest.iter().any(|w| {
            w.trim_matches(['\'', '"', ';']) == format!("--config={JOIN_CONFIG_PATH}").as_str()
        })
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct JoinConfiguration {
    #[serde(default)]
    discovery: Discovery,
    #[serde(default)]
    node_registration: NodeRegistration,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Discovery {
    bootstrap_token: Option<BootstrapTokenDiscovery>,
    tls_bootstrap_token: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct BootstrapTokenDiscovery {
    #[serde(default)]
    token: String,
    #[serde(default)]
    api_server_endpoint: String,
    #[serde(default)]
    ca_cert_hashes: Vec<String>,
    #[serde(default, rename = "unsafeSkipCAVerification")]
    unsafe_skip_ca_verification: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NodeRegistration {
    name: Option<String>,
    #[serde(default)]
    kubelet_extra_args: ExtraArgs,
    taints: Option<Vec<Taint>>,
}

/// `kubeletExtraArgs`: a map in v1beta2 and v1beta3, a list of `{name, value}` in v1beta4
/// (the shape was checked against the apiVersion before).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ExtraArgs {
    Map(BTreeMap<String, String>),
    List(Vec<NamedArg>),
}

impl Default for ExtraArgs {
    fn default() -> Self {
        ExtraArgs::Map(BTreeMap::new())
    }
}

impl ExtraArgs {
    fn get(&self, name: &str) -> Option<String> {
        match self {
            ExtraArgs::Map(m) => m.get(name).cloned(),
            ExtraArgs::List(l) => l
                .iter()
                .rev()
                .find(|a| a.name == name)
                .map(|a| a.value.clone()),
        }
    }
}

#[derive(Debug, Deserialize)]
struct NamedArg {
    name: String,
    #[serde(default)]
    value: String,
}

/// Parses the kubeadm configuration file (possibly several YAML documents) and returns the
/// join its `JoinConfiguration` describes.
pub fn parse_join_configuration(text: &str) -> Result<JoinPlan, UserDataError> {
    let mut found = None;
    let docs: Vec<Value> = autonodes_core::yaml::from_multiple(text)
        .map_err(|e| bad(format!("{JOIN_CONFIG_PATH} is not valid YAML: {e}")))?;
    for value in docs {
        if value.get("kind").and_then(|k| k.as_str()) == Some("JoinConfiguration") {
            found = Some(value);
            break;
        }
    }
    let value = found.ok_or_else(|| bad(format!("{JOIN_CONFIG_PATH} has no JoinConfiguration")))?;
    let api_version = value
        .get("apiVersion")
        .and_then(|v| v.as_str())
        .unwrap_or_default();
    let config_api = ConfigApi::parse(api_version).ok_or_else(|| {
        bad(format!(
            "JoinConfiguration apiVersion {api_version:?} is not kubeadm.k8s.io/v1beta2, v1beta3 or v1beta4"
        ))
    })?;
    config_api.check_kubelet_extra_args(&value).map_err(bad)?;
    let warnings = config_api.unknown_fields(&value);
    let timeout = config_api.discovery_timeout(&value).cloned();
    let config: JoinConfiguration = serde_json::from_value(value)
        .map_err(|e| bad(format!("JoinConfiguration does not parse: {e}")))?;
    let bootstrap = config.discovery.bootstrap_token.ok_or_else(|| {
        bad("JoinConfiguration has no discovery.bootstrapToken (file discovery is not simulated)")
    })?;
    if !is_bootstrap_token(&bootstrap.token) {
        return Err(bad(format!(
            "discovery.bootstrapToken.token {:?} is not a bootstrap token ([a-z0-9]{{6}}.[a-z0-9]{{16}})",
            bootstrap.token
        )));
    }
    split_host_port(&bootstrap.api_server_endpoint).ok_or_else(|| {
        bad(format!(
            "discovery.bootstrapToken.apiServerEndpoint {:?} is not host:port",
            bootstrap.api_server_endpoint
        ))
    })?;
    if bootstrap.ca_cert_hashes.is_empty() && !bootstrap.unsafe_skip_ca_verification {
        return Err(bad(
            "discovery.bootstrapToken.caCertHashes is empty and unsafeSkipCAVerification is not set",
        ));
    }
    let discovery_timeout = match timeout {
        None => DEFAULT_DISCOVERY_TIMEOUT,
        Some(t) => t
            .as_str()
            .and_then(parse_duration)
            .ok_or_else(|| bad(format!("the discovery timeout {t} is not a duration")))?,
    };
    let args = &config.node_registration.kubelet_extra_args;
    let node_labels = match args.get("node-labels") {
        Some(labels) => parse_node_labels(&labels)?,
        None => BTreeMap::new(),
    };
    let tls_bootstrap_token = config
        .discovery
        .tls_bootstrap_token
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| bootstrap.token.clone());
    Ok(JoinPlan {
        config_api,
        api_server_endpoint: bootstrap.api_server_endpoint,
        discovery_token: bootstrap.token,
        tls_bootstrap_token,
        ca_cert_hashes: bootstrap.ca_cert_hashes,
        unsafe_skip_ca_verification: bootstrap.unsafe_skip_ca_verification,
        discovery_timeout,
        node_name: config.node_registration.name.filter(|n| !n.is_empty()),
        provider_id: args.get("provider-id").filter(|p| !p.is_empty()),
        node_labels,
        taints: config.node_registration.taints.unwrap_or_default(),
        warnings,
        join_script: None,
    })
}

/// True for `[a-z0-9]{6}.[a-z0-9]{16}`.
pub fn is_bootstrap_token(token: &str) -> bool {
    let ok = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    token
        .split_once('.')
        .is_some_and(|(id, secret)| ok(id, 6) && ok(secret, 16))
}

/// Splits `host:port` (IPv6 hosts in brackets); None unless the port is a number.
pub fn split_host_port(endpoint: &str) -> Option<(String, u16)> {
    let (host, port) = endpoint.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty() || host.contains('/') || host.contains(':') && !endpoint.starts_with('[') {
        return None;
    }
    Some((host.to_ascii_lowercase(), port))
}

/// The join address a tenant publishes in `kube-system/kubeadm-config`: the
/// `controlPlaneEndpoint` of its `ClusterConfiguration` (port 6443 when absent), read as
/// kubeadm reads it; `None` when it publishes none.
pub fn published_endpoint(cluster_configuration: &str) -> Option<(String, u16)> {
    let doc: Value = autonodes_core::yaml::from_str(cluster_configuration).ok()?;
    let ep = doc.get("controlPlaneEndpoint")?.as_str()?.trim();
    if ep.is_empty() {
        return None;
    }
    split_host_port(ep).or_else(|| {
        (!ep.contains(':') && !ep.contains('/')).then(|| (ep.to_ascii_lowercase(), 6443))
    })
}

/// The `host:port` an `https://host[:port][/path]` URL points at (port 443 when absent).
pub fn endpoint_of_url(url: &str) -> Option<(String, u16)> {
    let rest = url.strip_prefix("https://")?;
    let authority = rest.split('/').next()?;
    match split_host_port(authority) {
        Some(hp) => Some(hp),
        None if !authority.is_empty() && !authority.contains(':') => {
            Some((authority.to_ascii_lowercase(), 443))
        }
        None => None,
    }
}

/// Parses the kubelet's `--node-labels` (`k=v,k=v`) and refuses what a kubelet refuses:
/// labels under `kubernetes.io` or `k8s.io` outside the set a kubelet may set on itself.
pub fn parse_node_labels(text: &str) -> Result<BTreeMap<String, String>, UserDataError> {
    let mut labels = BTreeMap::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| bad(format!("node-labels entry {item:?} is not key=value")))?;
        labels.insert(k.trim().to_string(), v.trim().to_string());
    }
    let refused: Vec<&str> = labels
        .keys()
        .map(String::as_str)
        .filter(|k| is_kubernetes_label(k) && !is_kubelet_label(k))
        .collect();
    if !refused.is_empty() {
        return Err(bad(format!(
            "the kubelet refuses to start: unknown 'kubernetes.io' or 'k8s.io' labels specified with --node-labels: {refused:?}"
        )));
    }
    Ok(labels)
}

fn label_namespace(key: &str) -> &str {
    key.split_once('/').map(|(ns, _)| ns).unwrap_or("")
}

fn is_kubernetes_label(key: &str) -> bool {
    let ns = label_namespace(key);
    ns == "kubernetes.io"
        || ns.ends_with(".kubernetes.io")
        || ns == "k8s.io"
        || ns.ends_with(".k8s.io")
}

/// The kubelet's own allowed set (`k8s.io/kubelet/pkg/apis.IsKubeletLabel`).
fn is_kubelet_label(key: &str) -> bool {
    const KEYS: &[&str] = &[
        "kubernetes.io/hostname",
        "topology.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
        "failure-domain.beta.kubernetes.io/region",
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
        "kubernetes.io/os",
        "kubernetes.io/arch",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/arch",
    ];
    if KEYS.contains(&key) {
        return true;
    }
    let ns = label_namespace(key);
    ["kubelet.kubernetes.io", "node.kubernetes.io"]
        .iter()
        .any(|allowed| ns == *allowed || ns.ends_with(&format!(".{allowed}")))
}

/// Parses a Go duration such as `5m0s`, `1h30m`, `20s`, `500ms`: the one duration grammar
/// of autonodes ([`autonodes_api::parse_go_duration`]), as the kubelet's configuration reads it.
pub fn parse_duration(text: &str) -> Option<Duration> {
    autonodes_api::parse_go_duration(text.trim()).ok()
}

/// kubeadm's CA pins (`sha256:<hex>`) of every certificate in a PEM bundle.
pub fn ca_cert_hashes(pem: &[u8]) -> Result<Vec<String>, UserDataError> {
    let text = std::str::from_utf8(pem).map_err(|_| bad("CA bundle is not UTF-8 PEM"))?;
    let mut hashes = Vec::new();
    let mut body: Option<String> = None;
    for line in text.lines().map(str::trim) {
        if line == "-----BEGIN CERTIFICATE-----" {
            body = Some(String::new());
        } else if line == "-----END CERTIFICATE-----" {
            let b64 = body
                .take()
                .ok_or_else(|| bad("CA bundle: END without BEGIN"))?;
            let der = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| bad(format!("CA bundle: bad base64: {e}")))?;
            hashes.push(spki_pin(&der)?);
        } else if let Some(b) = body.as_mut() {
            b.push_str(line);
        }
    }
    if hashes.is_empty() {
        return Err(bad("CA bundle holds no certificate"));
    }
    Ok(hashes)
}

/// `sha256:<hex>` of the DER SubjectPublicKeyInfo of one DER certificate.
pub fn spki_pin(cert_der: &[u8]) -> Result<String, UserDataError> {
    let spki = subject_public_key_info(cert_der)?;
    let digest = sha2::Sha256::digest(spki);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("sha256:{hex}"))
}

/// One DER TLV: (tag, whole element including header, contents).
fn der_element(input: &[u8]) -> Result<(u8, &[u8], &[u8]), UserDataError> {
    let err = || bad("certificate is not valid DER");
    let tag = *input.first().ok_or_else(err)?;
    let first = *input.get(1).ok_or_else(err)?;
    let (len, header) = if first < 0x80 {
        (usize::from(first), 2)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 {
            return Err(err());
        }
        let bytes = input.get(2..2 + n).ok_or_else(err)?;
        let len = bytes
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, 2 + n)
    };
    let end = header.checked_add(len).ok_or_else(err)?;
    let whole = input.get(..end).ok_or_else(err)?;
    Ok((tag, whole, &whole[header..]))
}

/// The SubjectPublicKeyInfo element of an X.509 certificate:
/// Certificate → tbsCertificate → \[version\], serial, signature, issuer, validity, subject, SPKI.
fn subject_public_key_info(cert: &[u8]) -> Result<&[u8], UserDataError> {
    const SEQUENCE: u8 = 0x30;
    let (tag, _, cert_body) = der_element(cert)?;
    if tag != SEQUENCE {
        return Err(bad("certificate is not a DER SEQUENCE"));
    }
    let (tag, _, tbs) = der_element(cert_body)?;
    if tag != SEQUENCE {
        return Err(bad("tbsCertificate is not a SEQUENCE"));
    }
    let mut rest = tbs;
    let mut fields = Vec::new();
    while !rest.is_empty() && fields.len() < 8 {
        let (tag, whole, _) = der_element(rest)?;
        fields.push((tag, whole));
        rest = &rest[whole.len()..];
    }
    // An explicit [0] version comes first in v3 certificates.
    let skip = usize::from(fields.first().is_some_and(|(tag, _)| *tag == 0xa0));
    let (tag, spki) = fields
        .get(skip + 5)
        .ok_or_else(|| bad("tbsCertificate has no subjectPublicKeyInfo"))?;
    if *tag != SEQUENCE {
        return Err(bad("subjectPublicKeyInfo is not a SEQUENCE"));
    }
    Ok(spki)
}

/// True when `pin` (as written in `caCertHashes`) names one of `hashes`; kubeadm accepts
/// `sha256:` in any case and hex in any case.
pub fn pin_matches(pin: &str, hashes: &[String]) -> bool {
    let Some((kind, hex)) = pin.trim().split_once(':') else {
        return false;
    };
    kind.eq_ignore_ascii_case("sha256")
        && hashes.iter().any(|h| {
            h.strip_prefix("sha256:")
                .is_some_and(|x| x.eq_ignore_ascii_case(hex))
        })
}

/// A stable `10.a.b.c` address and a locally administered MAC for a VM.
pub(crate) fn guest_address(vm_uid: &str) -> (String, String) {
    let d = sha2::Sha256::digest(vm_uid.as_bytes());
    let b = d.as_slice();
    let ip = format!("10.{}.{}.{}", b[0], b[1], 2 + b[2] % 252);
    let mac = format!("02:00:{:02x}:{:02x}:{:02x}:{:02x}", b[3], b[4], b[5], b[6]);
    (ip, mac)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_addresses_are_stable_10_x_addresses() {
        let (ip, mac) = guest_address("3f1c2a");
        assert_eq!(guest_address("3f1c2a").0, ip);
        assert!(ip.starts_with("10."), "{ip}");
        assert_eq!(ip.split('.').count(), 4);
        assert!(mac.starts_with("02:00:"));
        assert_ne!(guest_address("other").0, ip);
    }

    const JOIN: &str = "apiVersion: kubeadm.k8s.io/v1beta3
kind: JoinConfiguration
discovery:
  bootstrapToken:
    apiServerEndpoint: 127.0.0.1:6443
    token: abcdef.0123456789abcdef
    caCertHashes: [\"sha256:00\"]
nodeRegistration:
  name: vm-1
  kubeletExtraArgs:
    provider-id: kubevirt://vm-1
    node-labels: a=b,node.kubernetes.io/instance-type=x
  taints:
  - key: autonodes.io/unregistered
    effect: NoExecute
";

    fn cloud_config(join: &str, runcmd: &str) -> String {
        let indented: String = join.lines().map(|l| format!("    {l}\n")).collect();
        format!(
            "#cloud-config\nwrite_files:\n- path: {JOIN_CONFIG_PATH}\n  permissions: '0600'\n  content: |\n{indented}runcmd:\n{runcmd}"
        )
    }

    #[test]
    fn a_kubeadm_cloud_config_yields_its_join_plan() {
        let text = cloud_config(
            JOIN,
            "- [kubeadm, join, --config, /etc/kubernetes/kubeadm-join.yaml]\n",
        );
        let plan = parse_user_data(&text).expect("valid");
        assert_eq!(plan.api_server_endpoint, "127.0.0.1:6443");
        assert_eq!(plan.tls_bootstrap_token, "abcdef.0123456789abcdef");
        assert_eq!(plan.node_name.as_deref(), Some("vm-1"));
        assert_eq!(plan.provider_id.as_deref(), Some("kubevirt://vm-1"));
        assert_eq!(plan.node_labels["a"], "b");
        assert_eq!(plan.taints[0].key, "autonodes.io/unregistered");
        assert_eq!(plan.taints[0].effect, "NoExecute");
        assert_eq!(plan.discovery_timeout, DEFAULT_DISCOVERY_TIMEOUT);
        assert!(plan.warnings.is_empty(), "{:?}", plan.warnings);
    }

    #[test]
    fn user_data_without_the_join_command_or_file_is_refused() {
        let no_run = cloud_config(JOIN, "- echo hello\n");
        assert!(parse_user_data(&no_run).unwrap_err().0.contains("runcmd"));
        let wrong_path = cloud_config(JOIN, "- kubeadm join --config /tmp/x.yaml\n");
        assert!(parse_user_data(&wrong_path).is_err());
        let shell = cloud_config(
            JOIN,
            "- sh -c 'kubeadm join --config=/etc/kubernetes/kubeadm-join.yaml'\n",
        );
        assert!(parse_user_data(&shell).is_ok());
        assert!(parse_user_data("write_files: []")
            .unwrap_err()
            .0
            .contains("#cloud-config"));
    }

    #[test]
    fn misspelt_join_fields_are_reported_and_a_missing_pin_is_refused() {
        let text = JOIN.replace("caCertHashes", "caCertHash");
        let err = parse_join_configuration(&text).unwrap_err();
        assert!(err.0.contains("caCertHashes is empty"), "{err}");
        let text = JOIN.replace("  name: vm-1", "  name: vm-1\n  nodeLabels: x");
        let plan = parse_join_configuration(&text).expect("valid");
        assert_eq!(plan.warnings, ["unknown field nodeRegistration.nodeLabels"]);
        let old = JOIN.replace("v1beta3", "v1beta1");
        assert!(parse_join_configuration(&old).is_err());
    }

    #[test]
    fn kubelet_extra_args_as_a_map_in_v1beta4_or_a_list_in_v1beta3_are_refused() {
        let v1beta4 = JOIN.replace("v1beta3", "v1beta4");
        let err = parse_join_configuration(&v1beta4).unwrap_err();
        assert!(err.0.contains("cannot unmarshal object"), "{err}");
        let list = JOIN.replace(
            "    provider-id: kubevirt://vm-1\n    node-labels: a=b,node.kubernetes.io/instance-type=x\n",
            "  - name: provider-id\n    value: kubevirt://vm-1\n",
        );
        let err = parse_join_configuration(&list).unwrap_err();
        assert!(err.0.contains("cannot unmarshal array"), "{err}");
        let plan = parse_join_configuration(&list.replace("v1beta3", "v1beta4")).expect("valid");
        assert_eq!(plan.provider_id.as_deref(), Some("kubevirt://vm-1"));
        assert_eq!(plan.config_api, ConfigApi::V1beta4);
    }

    #[test]
    fn autonodes_user_data_for_each_release_is_read_by_that_releases_kubeadm() {
        use crate::userdata::{render_user_data, JoinParams, JoinTemplate, UserDataInput};
        use autonodes_core::kubeversion::KubeVersion;
        let labels = BTreeMap::from([("autonodes.io/node-type".to_string(), "n".to_string())]);
        for minor in [20, 21, 22, 25, 26, 30, 31, 34] {
            let version = KubeVersion::new(1, minor, 1);
            let join = JoinParams {
                kubernetes_version: version,
                ..JoinParams::placeholder()
            };
            let text = render_user_data(&UserDataInput {
                template: JoinTemplate::Kubeadm,
                node_name: "vm-1",
                join: &join,
                node_labels: &labels,
                taints: &[],
                kubelet_args: &BTreeMap::new(),
                user_cloud_config: None,
                ssh_keys: &[],
                image_prepared: false,
                download_url: None,
            })
            .expect("renders");
            let plan = parse_user_data(&text).expect("the guest reads it");
            assert_eq!(plan.config_api.readable_by(version), Ok(()), "1.{minor}");
            assert!(plan.warnings.is_empty(), "1.{minor}: {:?}", plan.warnings);
            assert_eq!(plan.node_labels["autonodes.io/node-type"], "n");
            assert_eq!(plan.provider_id.as_deref(), Some("kubevirt://vm-1"));
            // The tests' tenants are v1.20: their kubeadm reads only what autonodes writes
            // for releases below 1.22 (v1beta2).
            let old = KubeVersion::new(1, 20, 2);
            assert_eq!(
                plan.config_api.readable_by(old).is_ok(),
                minor < 22,
                "1.{minor}"
            );
        }
    }

    #[test]
    fn the_kubelet_refuses_labels_in_kubernetes_namespaces_outside_its_own_set() {
        assert!(parse_node_labels("node-role.kubernetes.io/worker=").is_err());
        assert!(parse_node_labels("foo.k8s.io/x=y").is_err());
        let ok = parse_node_labels(
            "kubernetes.io/arch=amd64, node.kubernetes.io/instance-type=a.b,x.node.kubernetes.io/y=1,autonodes.io/provider=p",
        )
        .expect("allowed");
        assert_eq!(ok.len(), 4);
    }

    #[test]
    fn go_durations_parse() {
        assert_eq!(parse_duration("5m0s"), Some(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("20"), None);
        assert_eq!(parse_duration(""), None);
    }

    #[test]
    fn endpoints_compare_by_host_and_port() {
        assert_eq!(
            endpoint_of_url("https://127.0.0.1:6443"),
            Some(("127.0.0.1".into(), 6443))
        );
        assert_eq!(
            endpoint_of_url("https://api.example.com/"),
            Some(("api.example.com".into(), 443))
        );
        assert_eq!(split_host_port("[::1]:6443"), Some(("::1".into(), 6443)));
        assert_eq!(split_host_port("https://127.0.0.1:6443"), None);
        assert_eq!(split_host_port("127.0.0.1"), None);
    }

    #[test]
    fn the_ca_pin_equals_the_openssl_recipe_kubeadm_documents() {
        let dir = tempfile::tempdir().expect("tempdir");
        let key = dir.path().join("ca.key");
        let crt = dir.path().join("ca.crt");
        let status = std::process::Command::new("openssl")
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            ])
            .args(["-subj", "/CN=test-ca", "-keyout"])
            .arg(&key)
            .arg("-out")
            .arg(&crt)
            .output()
            .expect("openssl runs");
        assert!(status.status.success(), "{status:?}");
        // openssl x509 -pubkey -in ca.crt | openssl rsa -pubin -outform der | sha256sum
        let script = format!(
            "openssl x509 -pubkey -noout -in {} | openssl pkey -pubin -outform der | sha256sum",
            crt.display()
        );
        let out = std::process::Command::new("sh")
            .args(["-c", &script])
            .output()
            .expect("sh runs");
        let expected = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .expect("a hash")
            .to_string();
        let pem = std::fs::read(&crt).expect("read");
        let hashes = ca_cert_hashes(&pem).expect("hash");
        assert_eq!(hashes, [format!("sha256:{expected}")]);
        // autonodes' own implementation (x509-parser) agrees with this one (a DER walk).
        assert_eq!(crate::userdata::ca_cert_hash(&pem).as_ref(), Ok(&hashes[0]));
        assert!(pin_matches(
            &format!("SHA256:{}", expected.to_uppercase()),
            &hashes
        ));
        assert!(!pin_matches("sha256:00", &hashes));
    }
}

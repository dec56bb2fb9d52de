//! Cloud-init user data for a node. Pure code, no I/O.
//!
//! The user data is a `#cloud-config` rendered from a handlebars template in `templates/`
//! (strict mode, no HTML escaping; the templates are compiled into the binary). It writes
//! `/etc/kubernetes/kubeadm-join.yaml`, a kubeadm `JoinConfiguration` whose apiVersion
//! follows the tenant's version (`v1beta2` below 1.22, `v1beta3` up to 1.30, `v1beta4`
//! from 1.31), and `/etc/autonodes/prepare-node.sh`, which installs containerd, the kubelet
//! and kubeadm of the tenant's version unless the image is prepared, sets containerd to
//! systemd cgroups and checks it answers; then it runs `prepare && kubeadm join`. The
//! user's own cloud-config (property `autonodes.io/user-data`) is merged in, its `runcmd`
//! entries first; SSH keys come from `autonodes.io/ssh-keys`.
//!
//! Every value reaches the document through the `yaml` helper ([`to_flow_yaml`]), which
//! writes it as a double-quoted YAML scalar (or a flow collection of such), escaping every
//! character YAML does not allow raw. So labels, taints or user values with quotes,
//! colons, newlines or any unicode cannot break the document.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::OnceLock;

use crate::kubeversion::KubeVersion;
use handlebars::{
    Context, Handlebars, Helper, HelperResult, Output, RenderContext, RenderErrorReason,
};
use k8s_openapi::api::core::v1::Taint;
use serde::Serialize;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// Where the JoinConfiguration is written on the node.
pub const JOIN_CONFIG_PATH: &str = "/etc/kubernetes/kubeadm-join.yaml";

/// Largest user data autonodes writes, in bytes (64 KiB). KubeVirt's 2048-byte limit
/// applies only to inline `userData`; a Secret-backed `cloudInitNoCloud.secretRef` is not
/// counted by KubeVirt and is bounded by the 1 MiB Secret limit. 64 KiB keeps the Secret
/// small while leaving ample room for a user's cloud-config.
pub(crate) const USER_DATA_MAX_BYTES: usize = 64 * 1024;

/// Bootstrap token `autonodes render` shows when it has no tenant cluster to mint one in.
pub const PLACEHOLDER_TOKEN: &str = "abcdef.0123456789abcdef";
/// CA certificate hash `autonodes render` shows when it has no tenant kubeconfig.
pub(crate) const PLACEHOLDER_CA_HASH: &str =
    "sha256:0000000000000000000000000000000000000000000000000000000000000000";
/// API server endpoint `autonodes render` shows when it has no tenant kubeconfig.
pub(crate) const PLACEHOLDER_ENDPOINT: &str = "tenant-api-server.invalid:443";

const KUBEADM_TEMPLATE: &str = include_str!("../templates/kubeadm.hbs");
const VCLUSTER_TEMPLATE: &str = include_str!("../templates/vcluster.hbs");
const JOIN_CONFIGURATION_PARTIAL: &str = include_str!("../templates/join-configuration.hbs");
const PREPARE_SCRIPT_TEMPLATE: &str = include_str!("../templates/prepare-node.sh.hbs");
const WARM_TEMPLATE: &str = include_str!("../templates/warm.hbs");

pub mod binding;
pub mod warm;

/// Where the user data writes the script that prepares the node before `kubeadm join`.
pub(crate) const PREPARE_SCRIPT_PATH: &str = "/etc/autonodes/prepare-node.sh";

/// The container runtime socket the node's kubelet uses (containerd).
pub(crate) const CRI_SOCKET: &str = "unix:///run/containerd/containerd.sock";

/// Where stock images download the kubelet and kubeadm from by default
/// (`<url>/<version>/bin/linux/<arch>/<binary>`, with a `.sha256` beside each).
pub const DEFAULT_DOWNLOAD_URL: &str = "https://dl.k8s.io/release";

/// Why user data cannot be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UserDataError {
    /// The user's cloud-config (property `autonodes.io/user-data`) is unusable.
    #[error("property autonodes.io/user-data: {0}")]
    InvalidUserCloudConfig(String),
    /// A join parameter is malformed.
    #[error("join parameters: {field}: {message}")]
    InvalidJoinParams {
        /// The parameter.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A kubelet argument is refused: reserved, repeated, or not safe to pass.
    #[error(transparent)]
    KubeletArg(#[from] crate::kubelet_args::KubeletArgError),
    /// Property `autonodes.io/user-data-template` names no built-in template.
    #[error("property autonodes.io/user-data-template: unknown template {0:?} (expected kubeadm or vcluster)")]
    UnknownTemplate(String),
    /// The rendered user data exceeds [`USER_DATA_MAX_BYTES`].
    #[error("user data is {size} bytes, more than the {max}-byte limit; shorten autonodes.io/user-data or autonodes.io/ssh-keys")]
    TooLarge {
        /// Size of the rendered user data.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// Property `autonodes.io/kubernetes-download-url` is not a URL autonodes uses.
    #[error("property autonodes.io/kubernetes-download-url: {0:?} is not http(s)://host[:port][/path] of letters, digits and .-_/:[]~%")]
    InvalidDownloadUrl(String),
    /// The template engine failed (a bug in a built-in template).
    #[error("user data template {template}: {message}")]
    Template {
        /// The template name.
        template: &'static str,
        /// The engine's message.
        message: String,
    },
}

/// A tenant CA certificate from which no hash can be computed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CaHashError {
    /// No `CERTIFICATE` PEM block.
    #[error("no PEM CERTIFICATE block found")]
    NoCertificate,
    /// The PEM or the certificate inside does not parse.
    #[error("invalid CA certificate: {0}")]
    Invalid(String),
}

/// The kubeadm discovery hash of a CA certificate: `sha256:` and the hex SHA-256 of the DER
/// SubjectPublicKeyInfo of the first `CERTIFICATE` in `pem` (what `kubeadm join
/// --discovery-token-ca-cert-hash` expects).
pub fn ca_cert_hash(pem: &[u8]) -> Result<String, CaHashError> {
    for block in x509_parser::pem::Pem::iter_from_buffer(pem) {
        let block = block.map_err(|e| CaHashError::Invalid(e.to_string()))?;
        if block.label != "CERTIFICATE" {
            continue;
        }
        let cert = block
            .parse_x509()
            .map_err(|e| CaHashError::Invalid(e.to_string()))?;
        let digest = Sha256::digest(cert.tbs_certificate.subject_pki.raw);
        let mut out = String::with_capacity(7 + 64);
        out.push_str("sha256:");
        for b in digest {
            let _ = write!(out, "{b:02x}");
        }
        return Ok(out);
    }
    Err(CaHashError::NoCertificate)
}

/// A kubeadm bootstrap token, `[a-z0-9]{6}.[a-z0-9]{16}`.
#[derive(Clone, PartialEq, Eq)]
pub struct BootstrapToken {
    id: String,
    secret: String,
}

impl std::fmt::Debug for BootstrapToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BootstrapToken({}.****)", self.id)
    }
}

const TOKEN_ALPHABET: &[u8; 36] = b"abcdefghijklmnopqrstuvwxyz0123456789";

impl BootstrapToken {
    /// Parses `id.secret`, checking the format.
    pub fn parse(token: &str) -> Option<Self> {
        let (id, secret) = token.split_once('.')?;
        let ok = |s: &str, n: usize| {
            s.len() == n
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        };
        (ok(id, 6) && ok(secret, 16)).then(|| Self {
            id: id.to_string(),
            secret: secret.to_string(),
        })
    }

    /// Makes a token from a source of random bytes (e.g. the OS random generator). Bytes
    /// that would bias the alphabet are skipped, so every character is uniform.
    pub fn from_random(mut next_byte: impl FnMut() -> u8) -> Self {
        let mut pick = |n: usize| -> String {
            let mut s = String::with_capacity(n);
            while s.len() < n {
                let b = next_byte();
                // 252 = 7 × 36: reject the 4 values that would favour the first letters.
                if b < 252 {
                    s.push(char::from(TOKEN_ALPHABET[usize::from(b % 36)]));
                }
            }
            s
        };
        let id = pick(6);
        let secret = pick(16);
        Self { id, secret }
    }

    /// The public token ID.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The token secret.
    pub fn secret(&self) -> &str {
        &self.secret
    }

    /// The full token, `id.secret`.
    pub fn token(&self) -> String {
        format!("{}.{}", self.id, self.secret)
    }

    /// Name of the token's Secret in `kube-system` of the tenant, `bootstrap-token-<id>`.
    pub fn secret_name(&self) -> String {
        format!("bootstrap-token-{}", self.id)
    }
}

/// How a node finds and authenticates to the tenant API server. Its `Debug` leaves the
/// token out.
#[derive(Clone, PartialEq, Eq)]
pub struct JoinParams {
    /// `host:port` of the tenant API server (an IPv6 host in brackets).
    pub api_server_endpoint: String,
    /// Bootstrap token `id.secret`.
    pub token: String,
    /// CA public key hashes (`sha256:<hex>`), at least one.
    pub ca_cert_hashes: Vec<String>,
    /// Where vCluster's node join script is served (`https://host:port`, `/node/join` is
    /// added); `None`: `https://<api_server_endpoint>`. Only the `vcluster` template uses it.
    pub join_script_url: Option<String>,
    /// The tenant's CA certificate (PEM), which the `vcluster` template trusts when it
    /// fetches the join script; `None`: the guest's own trust store.
    pub ca_pem: Option<String>,
    /// The tenant's Kubernetes version (its `/version`): the JoinConfiguration's apiVersion
    /// and the kubelet and kubeadm a stock image installs follow it.
    pub kubernetes_version: KubeVersion,
    /// Where a stock image downloads the kubelet and kubeadm (the operator's
    /// `--kubernetes-download-url`, [`DEFAULT_DOWNLOAD_URL`] by default; a node type's
    /// `autonodes.io/kubernetes-download-url` property wins).
    pub download_url: String,
}

impl std::fmt::Debug for JoinParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinParams")
            .field("api_server_endpoint", &self.api_server_endpoint)
            .field("token", &"<redacted>")
            .field("ca_cert_hashes", &self.ca_cert_hashes)
            .field("join_script_url", &self.join_script_url)
            .field("kubernetes_version", &self.kubernetes_version)
            .field("download_url", &self.download_url)
            .finish_non_exhaustive()
    }
}

impl JoinParams {
    /// Placeholder parameters, for showing what a node would get without a tenant cluster.
    pub fn placeholder() -> Self {
        Self {
            api_server_endpoint: PLACEHOLDER_ENDPOINT.to_string(),
            token: PLACEHOLDER_TOKEN.to_string(),
            ca_cert_hashes: vec![PLACEHOLDER_CA_HASH.to_string()],
            join_script_url: None,
            ca_pem: None,
            kubernetes_version: crate::kubeversion::DEFAULT_RENDER_VERSION,
            download_url: DEFAULT_DOWNLOAD_URL.to_string(),
        }
    }

    /// The base URL of the join script: [`JoinParams::join_script_url`], else the API
    /// server's endpoint.
    pub fn join_script_base(&self) -> String {
        self.join_script_url
            .clone()
            .unwrap_or_else(|| format!("https://{}", self.api_server_endpoint))
    }

    /// Checks the formats: endpoint `host:port` of safe characters, token
    /// `[a-z0-9]{6}.[a-z0-9]{16}`, hashes `sha256:` + 64 hex digits.
    pub fn validate(&self) -> Result<(), UserDataError> {
        let bad = |field, message: String| UserDataError::InvalidJoinParams { field, message };
        let ep = &self.api_server_endpoint;
        let (host, port) = ep
            .rsplit_once(':')
            .ok_or_else(|| bad("apiServerEndpoint", format!("{ep:?} is not host:port")))?;
        let host_ok = !host.is_empty()
            && host.bytes().all(|b| {
                b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'[' | b']' | b':')
            });
        let port_ok = port.parse::<u16>().is_ok_and(|p| p > 0);
        if !host_ok || !port_ok {
            return Err(bad("apiServerEndpoint", format!("{ep:?} is not host:port")));
        }
        if BootstrapToken::parse(&self.token).is_none() {
            return Err(bad(
                "token",
                "not a bootstrap token of the form [a-z0-9]{6}.[a-z0-9]{16}".to_string(),
            ));
        }
        if self.ca_cert_hashes.is_empty() {
            return Err(bad(
                "caCertHashes",
                "at least one hash is needed".to_string(),
            ));
        }
        if !self.kubernetes_version.is_joinable() {
            return Err(bad(
                "kubernetesVersion",
                format!(
                    "{} is not supported: nodes join Kubernetes {} or newer (kubeadm v1beta2)",
                    self.kubernetes_version,
                    crate::kubeversion::OLDEST_JOINABLE
                ),
            ));
        }
        if !is_download_url(&self.download_url) {
            return Err(bad(
                "downloadURL",
                format!(
                    "{:?} is not http(s)://host[:port][/path] of letters, digits and .-_/:[]~%",
                    self.download_url.chars().take(200).collect::<String>()
                ),
            ));
        }
        if let Some(url) = &self.join_script_url {
            if !is_join_script_url(url) {
                return Err(bad(
                    "joinScriptURL",
                    format!(
                        "{url:?} is not https://host[:port][/path] of letters, digits and .-_/:[]"
                    ),
                ));
            }
        }
        for h in &self.ca_cert_hashes {
            let hex = h.strip_prefix("sha256:").unwrap_or("");
            if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad(
                    "caCertHashes",
                    format!("{h:?} is not sha256:<64 hex digits>"),
                ));
            }
        }
        Ok(())
    }
}

/// Whether `url` is a join script base URL autonodes puts into a shell command:
/// `https://`, then a host (and port, path) of letters, digits and `.-_/:[]` only (no
/// quotes, spaces, `?`, `&` or `$`).
pub(crate) fn is_join_script_url(url: &str) -> bool {
    let Some(rest) = url.strip_prefix("https://") else {
        return false;
    };
    !rest.is_empty()
        && !rest.starts_with('/')
        && rest.len() <= 2048
        && rest.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b'/' | b':' | b'[' | b']')
        })
}

/// Whether `url` is a download base URL autonodes puts into the prepare script: `https://`
/// or `http://` (a mirror on a private network), then a host (and port, path) of letters,
/// digits and `.-_/:[]~%` only (no quotes, spaces, `?`, `&` or `$`).
pub(crate) fn is_download_url(url: &str) -> bool {
    let Some(rest) = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
    else {
        return false;
    };
    !rest.is_empty()
        && !rest.starts_with('/')
        && rest.len() <= 2048
        && rest.bytes().all(|b| {
            b.is_ascii_alphanumeric()
                || matches!(
                    b,
                    b'.' | b'-' | b'_' | b'/' | b':' | b'[' | b']' | b'~' | b'%'
                )
        })
}

/// Where the `vcluster` template writes the tenant's CA for fetching the join script.
pub(crate) const JOIN_CA_PATH: &str = "/etc/autonodes/tenant-ca.crt";

/// The built-in user data templates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum JoinTemplate {
    /// `kubeadm join --config` with the written JoinConfiguration (the default).
    #[default]
    Kubeadm,
    /// vCluster's node join script, fetched from the tenant's `/node/join`.
    Vcluster,
}

impl JoinTemplate {
    /// The template named by property `autonodes.io/user-data-template` (absent: kubeadm).
    pub fn from_property(value: Option<&str>) -> Result<Self, UserDataError> {
        match value.map(str::trim) {
            None | Some("") | Some("kubeadm") => Ok(Self::Kubeadm),
            Some("vcluster") => Ok(Self::Vcluster),
            Some(other) => Err(UserDataError::UnknownTemplate(other.to_string())),
        }
    }

    /// The template's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Kubeadm => "kubeadm",
            Self::Vcluster => "vcluster",
        }
    }
}

/// Everything the user data of one node depends on. Its `Debug` shows the join parameters
/// without their token and the user's cloud-config by length only.
#[derive(Clone, Copy)]
pub struct UserDataInput<'a> {
    /// Which built-in template.
    pub template: JoinTemplate,
    /// Node name (= VM name); the provider ID is `kubevirt://<node_name>`.
    pub node_name: &'a str,
    /// Endpoint, token and CA hashes.
    pub join: &'a JoinParams,
    /// Labels the kubelet registers with (`--node-labels`).
    pub node_labels: &'a BTreeMap<String, String>,
    /// Taints the node registers with (including startup and registration taints).
    pub taints: &'a [Taint],
    /// Extra kubelet arguments, checked by [`crate::kubelet_args::checked`].
    pub kubelet_args: &'a BTreeMap<String, String>,
    /// The user's cloud-config (property `autonodes.io/user-data`).
    pub user_cloud_config: Option<&'a str>,
    /// SSH public keys (property `autonodes.io/ssh-keys`, see [`parse_ssh_keys`]).
    pub ssh_keys: &'a [String],
    /// The image has containerd, the kubelet and kubeadm already (property
    /// `autonodes.io/image-prepared: "true"`): nothing is installed.
    pub image_prepared: bool,
    /// The node type's `autonodes.io/kubernetes-download-url`, which replaces
    /// [`JoinParams::download_url`].
    pub download_url: Option<&'a str>,
}

impl std::fmt::Debug for UserDataInput<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserDataInput")
            .field("template", &self.template)
            .field("node_name", &self.node_name)
            .field("join", self.join)
            .field("node_labels", self.node_labels)
            .field("taints", &self.taints)
            .field("kubelet_args", self.kubelet_args)
            .field(
                "user_cloud_config",
                &self
                    .user_cloud_config
                    .map(|c| format!("<{} bytes>", c.len())),
            )
            .field("ssh_keys", &self.ssh_keys.len())
            .field("image_prepared", &self.image_prepared)
            .field("download_url", &self.download_url)
            .finish()
    }
}

/// SSH keys from the `autonodes.io/ssh-keys` property: one per line; blank lines and
/// lines starting with `#` are skipped.
pub(crate) fn parse_ssh_keys(value: &str) -> Vec<String> {
    value
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// The provider ID of a node: `kubevirt://<vm>`.
pub fn provider_id(vm_name: &str) -> String {
    format!("kubevirt://{vm_name}")
}

#[derive(Serialize)]
struct TemplateData<'a> {
    node_name: &'a str,
    api_server_endpoint: &'a str,
    token: &'a str,
    ca_cert_hashes: &'a [String],
    kubelet_extra_args: BTreeMap<String, String>,
    taints: Vec<Value>,
    ssh_authorized_keys: Vec<String>,
    user_extra: Map<String, Value>,
    user_write_files: Vec<Value>,
    user_runcmd: Vec<Value>,
    join_config_path: &'static str,
    vcluster_join_command: String,
    join_ca_path: &'static str,
    join_ca_pem: Option<&'a str>,
    join_api_version: &'static str,
    kubelet_args_as_list: bool,
    cri_socket: &'static str,
    ignore_preflight_errors: Vec<&'static str>,
    prepare_script_path: &'static str,
    prepare_script: String,
    join_command: String,
}

/// What the prepare script is rendered from.
#[derive(Serialize)]
struct PrepareData<'a> {
    node_name: &'a str,
    kubernetes_version: String,
    download_url: &'a str,
    install: bool,
}

/// The user's cloud-config split into what autonodes merges and the rest.
#[derive(Debug, Default)]
struct UserCloudConfig {
    extra: Map<String, Value>,
    write_files: Vec<Value>,
    runcmd: Vec<Value>,
    ssh_authorized_keys: Vec<String>,
}

fn parse_user_cloud_config(text: &str) -> Result<UserCloudConfig, UserDataError> {
    let invalid = |m: String| UserDataError::InvalidUserCloudConfig(m);
    let trimmed = text.trim_start();
    if trimmed.is_empty() {
        return Ok(UserCloudConfig::default());
    }
    if !trimmed.starts_with("#cloud-config") {
        return Err(invalid(
            "must be a cloud-config (a YAML mapping starting with #cloud-config)".to_string(),
        ));
    }
    let json: Value =
        crate::yaml::from_str(text).map_err(|e| invalid(format!("not valid YAML: {e}")))?;
    let mut map = match json {
        Value::Object(m) => m,
        Value::Null => Map::new(),
        _ => return Err(invalid("must be a YAML mapping".to_string())),
    };
    let mut list = |key: &str| -> Result<Vec<Value>, UserDataError> {
        match map.remove(key) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(a)) => Ok(a),
            Some(_) => Err(invalid(format!("{key} must be a list"))),
        }
    };
    let write_files = list("write_files")?;
    let runcmd = list("runcmd")?;
    let ssh_authorized_keys = list("ssh_authorized_keys")?
        .into_iter()
        .map(|v| match v {
            Value::String(s) => Ok(s),
            _ => Err(invalid(
                "ssh_authorized_keys entries must be strings".to_string(),
            )),
        })
        .collect::<Result<_, _>>()?;
    Ok(UserCloudConfig {
        extra: map,
        write_files,
        runcmd,
        ssh_authorized_keys,
    })
}

/// Writes `s` as a double-quoted YAML scalar, escaping `"`, `\`, control characters,
/// DEL and the C1 range, the unicode line separators, the BOM and non-characters — all
/// that YAML (1.1 and 1.2) does not accept raw or would read as a line break.
pub(crate) fn yaml_string(s: &str, out: &mut String) {
    out.reserve(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20
                || ('\u{7f}'..='\u{9f}').contains(&c)
                || matches!(
                    c,
                    '\u{2028}' | '\u{2029}' | '\u{feff}' | '\u{fffe}' | '\u{ffff}'
                ) =>
            {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Writes a JSON value as single-line YAML flow: strings double-quoted (see
/// [`yaml_string`]), numbers, booleans and null as is, lists `[..]`, maps `{..}`.
/// The result is valid YAML wherever a value may stand.
pub(crate) fn to_flow_yaml(v: &Value) -> String {
    let mut out = String::new();
    write_flow(v, &mut out);
    out
}

fn write_flow(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            let _ = write!(out, "{n}");
        }
        Value::String(s) => yaml_string(s, out),
        Value::Array(a) => {
            out.push('[');
            for (i, item) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_flow(item, out);
            }
            out.push(']');
        }
        Value::Object(m) => {
            out.push('{');
            for (i, (k, item)) in m.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                yaml_string(k, out);
                out.push_str(": ");
                write_flow(item, out);
            }
            out.push('}');
        }
    }
}

fn yaml_helper(
    h: &Helper<'_>,
    _: &Handlebars<'_>,
    _: &Context,
    _: &mut RenderContext<'_, '_>,
    out: &mut dyn Output,
) -> HelperResult {
    let param = h
        .param(0)
        .ok_or(RenderErrorReason::ParamNotFoundForIndex("yaml", 0))?;
    out.write(&to_flow_yaml(param.value()))?;
    Ok(())
}

/// `{{block text indent}}`: `text` as a YAML literal block scalar (`|`, or `|-` without a
/// final newline) whose lines are indented by `indent` spaces, so a script in the user
/// data reads as a script. Text a block scalar cannot hold as is (control characters,
/// leading blanks or carriage returns) is written with [`to_flow_yaml`] instead.
fn block_helper(
    h: &Helper<'_>,
    _: &Handlebars<'_>,
    _: &Context,
    _: &mut RenderContext<'_, '_>,
    out: &mut dyn Output,
) -> HelperResult {
    let param = h
        .param(0)
        .ok_or(RenderErrorReason::ParamNotFoundForIndex("block", 0))?;
    let indent = h
        .param(1)
        .and_then(|p| p.value().as_u64())
        .ok_or(RenderErrorReason::ParamNotFoundForIndex("block", 1))?;
    let block = param
        .value()
        .as_str()
        .and_then(|text| to_block_yaml(text, usize::try_from(indent).unwrap_or(0)));
    out.write(&block.unwrap_or_else(|| to_flow_yaml(param.value())))?;
    Ok(())
}

/// `text` as a YAML literal block scalar whose lines are indented by `indent` spaces (at
/// most 32), or `None` when a block scalar cannot hold it as is (empty, leading blanks,
/// control characters other than tab and newline).
pub(crate) fn to_block_yaml(text: &str, indent: usize) -> Option<String> {
    let plain = !text.is_empty()
        && !text.starts_with([' ', '\t', '\n'])
        && text
            .chars()
            .all(|c| c == '\n' || c == '\t' || (!c.is_control() && c != '\u{feff}'));
    if !plain {
        return None;
    }
    let pad = " ".repeat(indent.min(32));
    let body = text.strip_suffix('\n').unwrap_or(text);
    let mut block = String::from(if text.ends_with('\n') && !text.ends_with("\n\n") {
        "|"
    } else if text.ends_with('\n') {
        "|+"
    } else {
        "|-"
    });
    for line in body.split('\n') {
        block.push('\n');
        if !line.is_empty() {
            block.push_str(&pad);
            block.push_str(line);
        }
    }
    Some(block)
}

fn registry() -> Result<&'static Handlebars<'static>, UserDataError> {
    static REGISTRY: OnceLock<Result<Handlebars<'static>, String>> = OnceLock::new();
    REGISTRY
        .get_or_init(|| {
            let mut hb = Handlebars::new();
            hb.set_strict_mode(true);
            hb.register_escape_fn(handlebars::no_escape);
            hb.register_helper("yaml", Box::new(yaml_helper));
            hb.register_helper("block", Box::new(block_helper));
            hb.register_partial("join_configuration", JOIN_CONFIGURATION_PARTIAL)
                .map_err(|e| format!("join_configuration: {e}"))?;
            for (name, text) in [
                ("kubeadm", KUBEADM_TEMPLATE),
                ("vcluster", VCLUSTER_TEMPLATE),
                ("prepare", PREPARE_SCRIPT_TEMPLATE),
                ("warm", WARM_TEMPLATE),
            ] {
                hb.register_template_string(name, text)
                    .map_err(|e| format!("{name}: {e}"))?;
            }
            Ok(hb)
        })
        .as_ref()
        .map_err(|message| UserDataError::Template {
            template: "registry",
            message: message.clone(),
        })
}

/// Renders the user data of a node. The result is a `#cloud-config` document of at most
/// [`USER_DATA_MAX_BYTES`] bytes.
pub fn render_user_data(input: &UserDataInput<'_>) -> Result<String, UserDataError> {
    input.join.validate()?;
    let mut kubelet_extra_args = crate::kubelet_args::checked(input.kubelet_args)?;
    kubelet_extra_args.insert("provider-id".to_string(), provider_id(input.node_name));
    // The prepare script sets containerd to systemd cgroups; the kubelet must match.
    kubelet_extra_args
        .entry("cgroup-driver".to_string())
        .or_insert_with(|| "systemd".to_string());
    if !input.node_labels.is_empty() {
        let mut labels = String::new();
        for (i, (k, v)) in input.node_labels.iter().enumerate() {
            if i > 0 {
                labels.push(',');
            }
            let _ = write!(labels, "{k}={v}");
        }
        kubelet_extra_args.insert("node-labels".to_string(), labels);
    }
    let user = match input.user_cloud_config {
        Some(text) => parse_user_cloud_config(text)?,
        None => UserCloudConfig::default(),
    };
    let mut ssh_authorized_keys = user.ssh_authorized_keys;
    ssh_authorized_keys.extend(input.ssh_keys.iter().cloned());
    let taints = input
        .taints
        .iter()
        .map(|t| {
            let mut m = Map::new();
            m.insert("key".into(), Value::String(t.key.clone()));
            if let Some(v) = t.value.as_ref().filter(|v| !v.is_empty()) {
                m.insert("value".into(), Value::String(v.clone()));
            }
            m.insert("effect".into(), Value::String(t.effect.clone()));
            Value::Object(m)
        })
        .collect();
    let version = input.join.kubernetes_version;
    let download_url = match input.download_url {
        Some(url) if !is_download_url(url) => {
            return Err(UserDataError::InvalidDownloadUrl(
                url.chars().take(200).collect(),
            ))
        }
        Some(url) => url,
        None => input.join.download_url.as_str(),
    };
    let registry = registry()?;
    let prepare_script = registry
        .render(
            "prepare",
            &PrepareData {
                node_name: input.node_name,
                kubernetes_version: version.to_string(),
                download_url: download_url.trim_end_matches('/'),
                install: !input.image_prepared && input.template == JoinTemplate::Kubeadm,
            },
        )
        .map_err(|e| UserDataError::Template {
            template: "prepare",
            message: e.to_string(),
        })?;
    let data = TemplateData {
        node_name: input.node_name,
        api_server_endpoint: &input.join.api_server_endpoint,
        token: &input.join.token,
        ca_cert_hashes: &input.join.ca_cert_hashes,
        kubelet_extra_args,
        taints,
        ssh_authorized_keys,
        user_extra: user.extra,
        user_write_files: user.write_files,
        user_runcmd: user.runcmd,
        join_config_path: JOIN_CONFIG_PATH,
        // URL and token are validated to [A-Za-z0-9.:/_\[\]-], safe inside the quotes. The
        // script only installs the node's binaries (`--skip-join`); the join itself is
        // `kubeadm join` with autonodes' JoinConfiguration.
        vcluster_join_command: format!(
            "curl -fsSL {}\"{}/node/join?token={}\" | sh -s -- --skip-join",
            if input.join.ca_pem.is_some() {
                format!("--cacert {JOIN_CA_PATH} ")
            } else {
                String::new()
            },
            input
                .join
                .join_script_base()
                .trim_end_matches('/')
                .trim_end_matches("/node/join"),
            input.join.token
        ),
        join_ca_path: JOIN_CA_PATH,
        join_ca_pem: input.join.ca_pem.as_deref(),
        join_api_version: version.kubeadm_api_version(),
        kubelet_args_as_list: version.kubelet_args_as_list(),
        cri_socket: CRI_SOCKET,
        // The prepare script checks containerd itself; images need no crictl.
        ignore_preflight_errors: if version.kubeadm_needs_crictl() {
            vec!["FileExisting-crictl", "CRI"]
        } else {
            Vec::new()
        },
        prepare_script_path: PREPARE_SCRIPT_PATH,
        prepare_script,
        join_command: format!("{PREPARE_SCRIPT_PATH} && kubeadm join --config {JOIN_CONFIG_PATH}"),
    };
    let name = input.template.name();
    let text = registry
        .render(name, &data)
        .map_err(|e| UserDataError::Template {
            template: name,
            message: e.to_string(),
        })?;
    within_limit(text)
}

/// `text`, unless it is longer than [`USER_DATA_MAX_BYTES`].
fn within_limit(text: String) -> Result<String, UserDataError> {
    if text.len() > USER_DATA_MAX_BYTES {
        return Err(UserDataError::TooLarge {
            size: text.len(),
            max: USER_DATA_MAX_BYTES,
        });
    }
    Ok(text)
}

/// The content of the file `path` a `#cloud-config` writes (`write_files`), if it writes it.
pub fn written_file(user_data: &str, path: &str) -> Option<String> {
    let doc: Value = crate::yaml::from_str(user_data).ok()?;
    doc.get("write_files")?
        .as_array()?
        .iter()
        .find(|f| f.get("path").and_then(Value::as_str) == Some(path))
        .and_then(|f| f.get("content").and_then(Value::as_str))
        .map(str::to_string)
}

/// Accepts a download base URL the user data can use ([`is_download_url`]).
pub fn parse_download_url(s: &str) -> Result<String, String> {
    if is_download_url(s) {
        Ok(s.trim_end_matches('/').to_string())
    } else {
        Err("expected http(s)://host[:port][/path] of letters, digits and .-_/:[]~%".to_string())
    }
}

#[cfg(test)]
mod tests;

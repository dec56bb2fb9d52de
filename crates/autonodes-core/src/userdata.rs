//! Cloud-init user data for a node (DESIGN §5). Pure code, no I/O.
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
pub const USER_DATA_MAX_BYTES: usize = 64 * 1024;

/// Bootstrap token `autonodes render` shows when it has no tenant cluster to mint one in.
pub const PLACEHOLDER_TOKEN: &str = "abcdef.0123456789abcdef";
/// CA certificate hash `autonodes render` shows when it has no tenant kubeconfig.
pub const PLACEHOLDER_CA_HASH: &str =
    "sha256:0000000000000000000000000000000000000000000000000000000000000000";
/// API server endpoint `autonodes render` shows when it has no tenant kubeconfig.
pub const PLACEHOLDER_ENDPOINT: &str = "tenant-api-server.invalid:443";

const KUBEADM_TEMPLATE: &str = include_str!("../templates/kubeadm.hbs");
const VCLUSTER_TEMPLATE: &str = include_str!("../templates/vcluster.hbs");
const JOIN_CONFIGURATION_PARTIAL: &str = include_str!("../templates/join-configuration.hbs");
const PREPARE_SCRIPT_TEMPLATE: &str = include_str!("../templates/prepare-node.sh.hbs");

/// Where the user data writes the script that prepares the node before `kubeadm join`.
pub const PREPARE_SCRIPT_PATH: &str = "/etc/autonodes/prepare-node.sh";

/// The container runtime socket the node's kubelet uses (containerd).
pub const CRI_SOCKET: &str = "unix:///run/containerd/containerd.sock";

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
    /// A kubelet argument autonodes sets itself was given.
    #[error("kubeletArgs.{0} is set by autonodes and cannot be given")]
    ReservedKubeletArg(String),
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
pub fn is_join_script_url(url: &str) -> bool {
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
pub fn is_download_url(url: &str) -> bool {
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
pub const JOIN_CA_PATH: &str = "/etc/autonodes/tenant-ca.crt";

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
    /// Extra kubelet arguments (`provider-id` and `node-labels` are reserved).
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
pub fn parse_ssh_keys(value: &str) -> Vec<String> {
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
pub fn yaml_string(s: &str, out: &mut String) {
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
pub fn to_flow_yaml(v: &Value) -> String {
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
pub fn to_block_yaml(text: &str, indent: usize) -> Option<String> {
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
    let mut kubelet_extra_args = BTreeMap::new();
    for (k, v) in input.kubelet_args {
        let name = k.trim_start_matches('-');
        if name == "provider-id" || name == "node-labels" {
            return Err(UserDataError::ReservedKubeletArg(name.to_string()));
        }
        kubelet_extra_args.insert(name.to_string(), v.clone());
    }
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
    if text.len() > USER_DATA_MAX_BYTES {
        return Err(UserDataError::TooLarge {
            size: text.len(),
            max: USER_DATA_MAX_BYTES,
        });
    }
    Ok(text)
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
mod tests {
    use super::*;
    use serde_json::json;

    /// An EC test CA; its hash was computed with kubeadm's documented pipeline:
    /// `openssl x509 -pubkey -noout | openssl pkey -pubin -outform der | sha256sum`.
    const TEST_CA: &str = "-----BEGIN CERTIFICATE-----
MIIBkDCCATWgAwIBAgIUV4rPR2BloFMuSqpw9E22xEUO48gwCgYIKoZIzj0EAwIw
HDEaMBgGA1UEAwwRYXV0b25vZGVzLXRlc3QtY2EwIBcNMjYxMTIyMTYyMjI2WhgP
MjEyNjEwMjkxNjIyMjZaMBwxGjAYBgNVBAMMEWF1dG9ub2Rlcy10ZXN0LWNhMFkw
EwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEoc1K8HRxSUqNnCxLK+m5DMT4qNpduhoX
7UzK99rdUMtiMhzG7Sqc8QVJheMB9+eAQa1pME5Mixia44nomD9tK6NTMFEwHQYD
VR0OBBYEFEhD5xdU5035d4rB2OeDLv8o6fA+MB8GA1UdIwQYMBaAFEhD5xdU5035
d4rB2OeDLv8o6fA+MA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZIzj0EAwIDSQAwRgIh
ALSCkSTyQaInuL6DucynDnEnDn3BmFrDIP2T88gG8jFaAiEAs2mkVzuGZG/sIDbD
1jC/wDJJUBTNuNopMyIHQHg2qcQ=
-----END CERTIFICATE-----
";
    const TEST_CA_HASH: &str =
        "sha256:2917f5ab7ab656c6c2585c6a715cfb777c242f7a357a5ba18a4c21849d401d6a";

    fn join() -> JoinParams {
        JoinParams {
            api_server_endpoint: "10.0.0.1:6443".into(),
            token: "abcdef.0123456789abcdef".into(),
            ca_cert_hashes: vec![TEST_CA_HASH.into()],
            join_script_url: None,
            ca_pem: None,
            kubernetes_version: KubeVersion::new(1, 30, 2),
            download_url: DEFAULT_DOWNLOAD_URL.into(),
        }
    }

    fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: value.map(str::to_string),
            effect: effect.into(),
            time_added: None,
        }
    }

    struct Fixture {
        join: JoinParams,
        labels: BTreeMap<String, String>,
        taints: Vec<Taint>,
        args: BTreeMap<String, String>,
        keys: Vec<String>,
    }

    impl Fixture {
        fn new() -> Self {
            Self {
                join: join(),
                labels: BTreeMap::from([
                    (
                        "autonodes.io/node-type".to_string(),
                        "high-memory-node".to_string(),
                    ),
                    ("workload".to_string(), "memory-intensive".to_string()),
                ]),
                taints: vec![
                    taint("workload", Some("high-memory"), "NoSchedule"),
                    taint("autonodes.io/unregistered", None, "NoExecute"),
                ],
                args: BTreeMap::from([("max-pods".to_string(), "50".to_string())]),
                keys: vec![],
            }
        }

        fn input<'a>(&'a self, user: Option<&'a str>) -> UserDataInput<'a> {
            UserDataInput {
                template: JoinTemplate::Kubeadm,
                node_name: "tenant-node-1",
                join: &self.join,
                node_labels: &self.labels,
                taints: &self.taints,
                kubelet_args: &self.args,
                user_cloud_config: user,
                ssh_keys: &self.keys,
                image_prepared: false,
                download_url: None,
            }
        }
    }

    /// Parses user data as cloud-init would (YAML) and the join config inside it.
    fn parse(user_data: &str) -> (Value, Value) {
        assert!(user_data.starts_with("#cloud-config\n"), "{user_data}");
        let doc: Value = crate::yaml::from_str(user_data)
            .unwrap_or_else(|e| panic!("user data is not YAML: {e}\n{user_data}"));
        let files = doc["write_files"].as_array().expect("write_files");
        let file = files
            .iter()
            .find(|f| f["path"] == JOIN_CONFIG_PATH)
            .expect("join config written");
        let content = file["content"].as_str().expect("content");
        let join: Value = crate::yaml::from_str(content)
            .unwrap_or_else(|e| panic!("join config is not YAML: {e}\n{content}"));
        (doc, join)
    }

    #[test]
    fn ca_hash_is_sha256_of_the_certificate_public_key_info() {
        assert_eq!(
            ca_cert_hash(TEST_CA.as_bytes()),
            Ok(TEST_CA_HASH.to_string())
        );
        // Other PEM blocks before the certificate are skipped.
        let with_key =
            format!("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n{TEST_CA}");
        assert_eq!(
            ca_cert_hash(with_key.as_bytes()),
            Ok(TEST_CA_HASH.to_string())
        );
    }

    #[test]
    fn ca_hash_of_something_that_is_not_a_certificate_is_an_error() {
        assert_eq!(ca_cert_hash(b"hello"), Err(CaHashError::NoCertificate));
        let garbage = "-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n";
        assert!(matches!(
            ca_cert_hash(garbage.as_bytes()),
            Err(CaHashError::Invalid(_))
        ));
    }

    #[test]
    fn kubeadm_user_data_writes_a_join_configuration_and_runs_the_join() {
        let f = Fixture::new();
        let ud = render_user_data(&f.input(None)).expect("renders");
        let (doc, join) = parse(&ud);
        assert_eq!(join["apiVersion"], "kubeadm.k8s.io/v1beta3");
        assert_eq!(join["kind"], "JoinConfiguration");
        let bt = &join["discovery"]["bootstrapToken"];
        assert_eq!(bt["apiServerEndpoint"], "10.0.0.1:6443");
        assert_eq!(bt["token"], "abcdef.0123456789abcdef");
        assert_eq!(bt["caCertHashes"], json!([TEST_CA_HASH]));
        let reg = &join["nodeRegistration"];
        assert_eq!(reg["name"], "tenant-node-1");
        assert_eq!(
            reg["kubeletExtraArgs"],
            json!({
                "cgroup-driver": "systemd",
                "max-pods": "50",
                "node-labels": "autonodes.io/node-type=high-memory-node,workload=memory-intensive",
                "provider-id": "kubevirt://tenant-node-1",
            })
        );
        assert_eq!(reg["criSocket"], CRI_SOCKET);
        assert_eq!(
            reg["ignorePreflightErrors"],
            json!(["FileExisting-crictl", "CRI"])
        );
        assert_eq!(
            reg["taints"],
            json!([
                {"key": "workload", "value": "high-memory", "effect": "NoSchedule"},
                {"key": "autonodes.io/unregistered", "effect": "NoExecute"},
            ])
        );
        assert_eq!(
            doc["runcmd"],
            json!([[
                "sh",
                "-c",
                "/etc/autonodes/prepare-node.sh && kubeadm join --config /etc/kubernetes/kubeadm-join.yaml"
            ]])
        );
        assert_eq!(doc["write_files"][0]["permissions"], "0600");
        assert_eq!(doc["write_files"][1]["path"], PREPARE_SCRIPT_PATH);
        assert_eq!(doc["write_files"][1]["permissions"], "0755");
        assert!(doc.get("ssh_authorized_keys").is_none());
    }

    #[test]
    fn the_users_runcmd_runs_before_the_join_and_other_keys_are_kept() {
        let user = "#cloud-config\npackages: [htop]\nruncmd:\n  - echo first\n  - [touch, /tmp/x]\nwrite_files:\n  - path: /etc/motd\n    content: hi\nssh_authorized_keys: [ssh-ed25519 AAAA user]\n";
        let mut f2 = Fixture::new();
        f2.keys = parse_ssh_keys("ssh-ed25519 BBBB ops\n\n# comment\n");
        let ud = render_user_data(&f2.input(Some(user))).expect("renders");
        let (doc, _) = parse(&ud);
        assert_eq!(
            doc["runcmd"],
            json!([
                "echo first",
                ["touch", "/tmp/x"],
                [
                    "sh",
                    "-c",
                    "/etc/autonodes/prepare-node.sh && kubeadm join --config /etc/kubernetes/kubeadm-join.yaml"
                ]
            ])
        );
        assert_eq!(doc["packages"], json!(["htop"]));
        assert_eq!(
            doc["write_files"][0],
            json!({"path": "/etc/motd", "content": "hi"})
        );
        assert_eq!(doc["write_files"][1]["path"], JOIN_CONFIG_PATH);
        assert_eq!(
            doc["ssh_authorized_keys"],
            json!(["ssh-ed25519 AAAA user", "ssh-ed25519 BBBB ops"])
        );
    }

    #[test]
    fn a_user_data_that_is_not_a_cloud_config_mapping_is_an_error() {
        let f = Fixture::new();
        for (bad, why) in [
            ("#!/bin/sh\necho hi\n", "must be a cloud-config"),
            ("#cloud-config\n- a\n- b\n", "must be a YAML mapping"),
            ("#cloud-config\nruncmd: echo\n", "runcmd must be a list"),
            ("#cloud-config\nfoo: [unclosed\n", "not valid YAML"),
        ] {
            let e = render_user_data(&f.input(Some(bad))).expect_err(bad);
            assert!(
                e.to_string()
                    .starts_with("property autonodes.io/user-data:"),
                "{e}"
            );
            assert!(e.to_string().contains(why), "{bad}: {e}");
        }
        // Empty user data is no user data.
        assert!(render_user_data(&f.input(Some("  \n"))).is_ok());
    }

    #[test]
    fn hostile_labels_taints_and_user_values_cannot_break_the_yaml() {
        let nasty = [
            "quote\"s and 'single'",
            "colon: space",
            "# not a comment",
            "- dash",
            "new\nline",
            "back\\slash",
            "tab\there",
            "{{handlebars}}",
            "&anchor *alias !tag |pipe >fold %percent @at `tick",
            "unicode ünïcødé 日本語 🚀",
            "nel\u{85}ls\u{2028}ps\u{2029}",
            "ctrl\u{1}\u{7f}\u{9b}bom\u{feff}",
            "  leading and trailing  ",
            "",
            "null",
            "true",
            "0x1F",
            "...",
            "---",
        ];
        for s in nasty {
            let mut f = Fixture::new();
            f.taints = vec![taint(s, Some(s), "NoSchedule")];
            f.args = BTreeMap::from([(format!("x{s}"), s.to_string())]);
            f.keys = vec![s.to_string()];
            f.labels = BTreeMap::from([("k".to_string(), s.to_string())]);
            let user = format!(
                "#cloud-config\nruncmd:\n  - {}\nbootcmd: [{}]\n",
                to_flow_yaml(&json!(s)),
                to_flow_yaml(&json!(s))
            );
            let ud = render_user_data(&f.input(Some(&user))).expect("renders");
            let (doc, join) = parse(&ud);
            assert_eq!(
                join["nodeRegistration"]["taints"][0]["key"],
                json!(s),
                "{s:?}"
            );
            assert_eq!(
                join["nodeRegistration"]["kubeletExtraArgs"][format!("x{s}")],
                json!(s)
            );
            assert_eq!(
                join["nodeRegistration"]["kubeletExtraArgs"]["node-labels"],
                json!(format!("k={s}"))
            );
            assert_eq!(doc["runcmd"][0], json!(s), "{s:?}");
            assert_eq!(doc["bootcmd"], json!([s]));
            assert_eq!(doc["ssh_authorized_keys"], json!([s]));
        }
    }

    #[test]
    fn flow_yaml_escapes_what_yaml_does_not_allow_raw() {
        let mut out = String::new();
        yaml_string("a\"b\\c\n\u{85}\u{2028}\u{7f}é", &mut out);
        assert_eq!(out, "\"a\\\"b\\\\c\\n\\u0085\\u2028\\u007fé\"");
        assert_eq!(
            to_flow_yaml(&json!({"a": [1, true, null, "x"]})),
            "{\"a\": [1, true, null, \"x\"]}"
        );
    }

    #[test]
    fn a_block_scalar_reads_back_as_the_same_text_and_unholdable_text_is_refused() {
        for text in [
            "#!/bin/sh\necho a\n\n  indented: \"x\"\n",
            "no newline",
            "two\n\n",
        ] {
            let block = to_block_yaml(text, 2).expect("representable");
            let doc: Value = crate::yaml::from_str(&format!("k: {block}\n")).expect("YAML");
            assert_eq!(doc["k"], text, "{block}");
        }
        for text in ["", " leading", "\tleading", "bell\u{7}", "cr\r\n"] {
            assert_eq!(to_block_yaml(text, 2), None, "{text:?}");
        }
    }

    /// The content of the prepare script the user data writes.
    fn prepare_script(doc: &Value) -> String {
        doc["write_files"]
            .as_array()
            .and_then(|f| f.iter().find(|f| f["path"] == PREPARE_SCRIPT_PATH))
            .and_then(|f| f["content"].as_str())
            .expect("prepare script written")
            .to_string()
    }

    #[test]
    fn the_join_configuration_api_and_kubelet_args_follow_the_tenant_version() {
        let mut f = Fixture::new();
        for (minor, api, list, crictl) in [
            (20, "kubeadm.k8s.io/v1beta2", false, true),
            (22, "kubeadm.k8s.io/v1beta3", false, true),
            (30, "kubeadm.k8s.io/v1beta3", false, true),
            (31, "kubeadm.k8s.io/v1beta4", true, false),
            (33, "kubeadm.k8s.io/v1beta4", true, false),
        ] {
            f.join.kubernetes_version = KubeVersion::new(1, minor, 4);
            let ud = render_user_data(&f.input(None)).expect("renders");
            let (doc, join) = parse(&ud);
            assert_eq!(join["apiVersion"], api, "1.{minor}");
            let args = &join["nodeRegistration"]["kubeletExtraArgs"];
            if list {
                assert!(args.as_array().expect("a list in v1beta4").contains(
                    &json!({"name": "provider-id", "value": "kubevirt://tenant-node-1"})
                ));
            } else {
                assert_eq!(args["provider-id"], "kubevirt://tenant-node-1", "1.{minor}");
            }
            assert_eq!(
                join["nodeRegistration"]
                    .get("ignorePreflightErrors")
                    .is_some(),
                crictl,
                "1.{minor}"
            );
            let script = prepare_script(&doc);
            assert!(
                script.contains(&format!("KUBERNETES_VERSION=\"v1.{minor}.4\"")),
                "{script}"
            );
        }
        f.join.kubernetes_version = KubeVersion::new(1, 14, 0);
        assert!(matches!(
            render_user_data(&f.input(None)),
            Err(UserDataError::InvalidJoinParams {
                field: "kubernetesVersion",
                ..
            })
        ));
    }

    #[test]
    fn a_stock_image_installs_from_the_download_url_and_a_prepared_one_installs_nothing() {
        let f = Fixture::new();
        let ud = render_user_data(&f.input(None)).expect("renders");
        let script = prepare_script(&parse(&ud).0);
        assert!(script.starts_with("#!/bin/sh\n"), "{script}");
        assert!(script.contains("INSTALL=true"), "{script}");
        assert!(
            script.contains("DOWNLOAD_URL=\"https://dl.k8s.io/release\""),
            "{script}"
        );
        assert!(script.contains("SystemdCgroup = true"), "{script}");

        let mut input = f.input(None);
        input.download_url = Some("http://mirror.internal:8080/k8s/");
        let script = prepare_script(&parse(&render_user_data(&input).expect("renders")).0);
        assert!(
            script.contains("DOWNLOAD_URL=\"http://mirror.internal:8080/k8s\""),
            "{script}"
        );

        input.image_prepared = true;
        let script = prepare_script(&parse(&render_user_data(&input).expect("renders")).0);
        assert!(script.contains("INSTALL=false"), "{script}");

        for bad in [
            "ftp://x",
            "https://x/$(reboot)",
            "https://x/\"; reboot",
            "https://x y",
            "https://",
        ] {
            input.download_url = Some(bad);
            assert!(
                matches!(
                    render_user_data(&input),
                    Err(UserDataError::InvalidDownloadUrl(_))
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn vcluster_template_installs_with_the_join_script_then_joins_with_kubeadm() {
        let f = Fixture::new();
        let mut input = f.input(Some("#cloud-config\nruncmd: [echo pre]\n"));
        input.template = JoinTemplate::Vcluster;
        let ud = render_user_data(&input).expect("renders");
        let (doc, join) = parse(&ud);
        assert_eq!(join["nodeRegistration"]["name"], "tenant-node-1");
        let runcmd = doc["runcmd"].as_array().expect("list");
        assert_eq!(runcmd[0], "echo pre");
        let n = runcmd.len();
        assert_eq!(
            runcmd[n - 2],
            json!(["sh", "-c",
                "curl -fsSL \"https://10.0.0.1:6443/node/join?token=abcdef.0123456789abcdef\" | sh -s -- --skip-join"])
        );
        assert_eq!(
            runcmd[n - 1],
            json!([
                "sh",
                "-c",
                format!("{PREPARE_SCRIPT_PATH} && kubeadm join --config {JOIN_CONFIG_PATH}")
            ])
        );
        // vCluster's script installs the binaries: the prepare script only checks them.
        assert!(prepare_script(&doc).contains("INSTALL=false"));
        // A published join script URL, fetched trusting the tenant's CA.
        let mut join_params = f.join.clone();
        join_params.join_script_url = Some("https://vc.example.com:8443/".into());
        join_params.ca_pem =
            Some("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".into());
        input.join = &join_params;
        let (doc, _) = parse(&render_user_data(&input).expect("renders"));
        let runcmd = doc["runcmd"].as_array().expect("list");
        assert_eq!(
            runcmd[runcmd.len() - 2][2],
            json!(format!("curl -fsSL --cacert {JOIN_CA_PATH} \"https://vc.example.com:8443/node/join?token=abcdef.0123456789abcdef\" | sh -s -- --skip-join"))
        );
        let ca = doc["write_files"]
            .as_array()
            .and_then(|f| f.iter().find(|f| f["path"] == JOIN_CA_PATH))
            .expect("the CA file");
        assert!(ca["content"]
            .as_str()
            .is_some_and(|c| c.starts_with("-----BEGIN CERTIFICATE-----")));
        // A URL that could break out of the shell quotes is refused.
        for bad in [
            "http://x",
            "https://x\"; rm -rf /",
            "https://x?a=b",
            "https://",
            "https://x y",
        ] {
            join_params.join_script_url = Some(bad.into());
            assert!(join_params.validate().is_err(), "{bad}");
        }
        // Both templates write the same JoinConfiguration.
        let (_, kubeadm_join) = parse(&render_user_data(&f.input(None)).expect("renders"));
        assert_eq!(join, kubeadm_join);
    }

    #[test]
    fn templates_are_chosen_by_property_and_unknown_names_are_errors() {
        assert_eq!(JoinTemplate::from_property(None), Ok(JoinTemplate::Kubeadm));
        assert_eq!(
            JoinTemplate::from_property(Some("vcluster")),
            Ok(JoinTemplate::Vcluster)
        );
        let e = JoinTemplate::from_property(Some("k3s")).expect_err("unknown");
        assert!(e.to_string().contains("\"k3s\""), "{e}");
    }

    #[test]
    fn oversized_user_data_is_a_clear_error() {
        let f = Fixture::new();
        let big = format!(
            "#cloud-config\nruncmd:\n  - echo {}\n",
            "x".repeat(USER_DATA_MAX_BYTES)
        );
        let e = render_user_data(&f.input(Some(&big))).expect_err("too large");
        assert!(
            matches!(
                e,
                UserDataError::TooLarge {
                    max: USER_DATA_MAX_BYTES,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("65536-byte limit"), "{e}");
    }

    #[test]
    fn join_params_are_validated() {
        let f = Fixture::new();
        for (field, change) in [
            (
                "apiServerEndpoint",
                JoinParams {
                    api_server_endpoint: "host".into(),
                    ..join()
                },
            ),
            (
                "apiServerEndpoint",
                JoinParams {
                    api_server_endpoint: "h\"; rm -rf /:1".into(),
                    ..join()
                },
            ),
            (
                "apiServerEndpoint",
                JoinParams {
                    api_server_endpoint: "host:99999".into(),
                    ..join()
                },
            ),
            (
                "token",
                JoinParams {
                    token: "ABCDEF.0123456789abcdef".into(),
                    ..join()
                },
            ),
            (
                "token",
                JoinParams {
                    token: "abcdef0123456789abcdef".into(),
                    ..join()
                },
            ),
            (
                "caCertHashes",
                JoinParams {
                    ca_cert_hashes: vec![],
                    ..join()
                },
            ),
            (
                "caCertHashes",
                JoinParams {
                    ca_cert_hashes: vec!["md5:00".into()],
                    ..join()
                },
            ),
        ] {
            let mut input = f.input(None);
            input.join = &change;
            let e = render_user_data(&input).expect_err(field);
            assert!(
                e.to_string()
                    .starts_with(&format!("join parameters: {field}:")),
                "{e}"
            );
        }
        assert!(JoinParams {
            api_server_endpoint: "[fd00::1]:6443".into(),
            ..join()
        }
        .validate()
        .is_ok());
        assert!(JoinParams::placeholder().validate().is_ok());
    }

    #[test]
    fn provider_id_and_node_labels_cannot_be_given_as_kubelet_args() {
        let mut f = Fixture::new();
        f.args = BTreeMap::from([("--provider-id".to_string(), "x".to_string())]);
        assert_eq!(
            render_user_data(&f.input(None)),
            Err(UserDataError::ReservedKubeletArg("provider-id".into()))
        );
    }

    #[test]
    fn bootstrap_tokens_have_the_kubeadm_format() {
        let mut bytes = (0u8..=255).cycle();
        let t = BootstrapToken::from_random(|| bytes.next().unwrap_or(0));
        assert!(BootstrapToken::parse(&t.token()).is_some(), "{}", t.token());
        assert_eq!(t.id().len(), 6);
        assert_eq!(t.secret().len(), 16);
        assert_eq!(t.secret_name(), format!("bootstrap-token-{}", t.id()));
        assert!(
            !format!("{t:?}").contains(t.secret()),
            "Debug hides the secret"
        );
        // Biased bytes are rejected: only 252..=255 would never be used.
        let mut high = [255u8, 254, 253, 252, 0].into_iter().cycle();
        let t = BootstrapToken::from_random(|| high.next().unwrap_or(0));
        assert_eq!(t.token(), "aaaaaa.aaaaaaaaaaaaaaaa");
        assert!(BootstrapToken::parse("abcdef.0123456789abcde").is_none());
        assert!(BootstrapToken::parse(PLACEHOLDER_TOKEN).is_some());
    }

    #[test]
    fn ssh_keys_property_is_one_key_per_line() {
        assert_eq!(
            parse_ssh_keys(" ssh-ed25519 AAAA a \n\n# off\nssh-rsa BBBB b"),
            vec![
                "ssh-ed25519 AAAA a".to_string(),
                "ssh-rsa BBBB b".to_string()
            ]
        );
    }

    #[test]
    fn debug_output_of_join_parameters_and_user_data_input_never_shows_the_token() {
        let mut join = JoinParams::placeholder();
        join.token = "abcdef.0123456789abcdef".into();
        let shown = format!("{join:?}");
        assert!(!shown.contains("0123456789abcdef"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
        let labels = BTreeMap::new();
        let input = UserDataInput {
            template: JoinTemplate::Kubeadm,
            node_name: "n",
            join: &join,
            node_labels: &labels,
            taints: &[],
            kubelet_args: &labels,
            user_cloud_config: Some("password: hunter2"),
            ssh_keys: &[],
            image_prepared: false,
            download_url: None,
        };
        let shown = format!("{input:?}");
        assert!(
            !shown.contains("0123456789abcdef") && !shown.contains("hunter2"),
            "{shown}"
        );
    }
}

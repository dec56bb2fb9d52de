//! The one place where the bytes of a kubeconfig Secret become a client configuration.
//!
//! A kubeconfig in a Secret is written by whoever may write Secrets in a tenant namespace
//! (or in the service namespace), so it is untrusted input. kube's own kubeconfig loader
//! runs `exec` plugins, reads `tokenFile` and certificate paths and follows `proxy-url`;
//! autonodes never hands it such a Secret. [`check`] accepts only what a kubeconfig
//! exported by vCluster, Gardener or `kubectl config view --raw --minify --flatten`
//! contains, and everything else is refused by naming the field (never its value):
//!
//! - the `current-context`'s cluster and user only (other entries are never looked at);
//! - `server`: an `https://` URL without user info or query, whose host is not link-local
//!   (`169.254.0.0/16`, `fe80::/10`: cloud metadata endpoints), also when written as an
//!   IPv4-mapped IPv6 address or in the shortened numeric forms a resolver accepts;
//! - the CA inline as `certificate-authority-data` (PEM certificates, base64);
//!   `insecure-skip-tls-verify: true` only under an explicit policy opt-in;
//! - credentials inline: `token`, or `client-certificate-data` with `client-key-data`.
//!
//! Refused: `exec`, `auth-provider`, `tokenFile`, `username`/`password`, every file path
//! (`certificate-authority`, `client-certificate`, `client-key`), `proxy-url`,
//! impersonation (`as`, `as-groups`, `as-uid`, `as-user-extra`) and any field this module
//! does not know in the used cluster, user or context entry. This module does no I/O:
//! nothing is executed, opened or sent while (or before) a kubeconfig is checked.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use base64::Engine;
use serde_json::{Map, Value};

/// A YAML mapping, read as JSON (keys are strings).
type Mapping = Map<String, Value>;

/// The largest kubeconfig accepted (a Secret holds at most 1 MiB anyway).
pub(crate) const MAX_KUBECONFIG_BYTES: usize = 1024 * 1024;

/// What the operator allows beyond the defaults (flags of `autonodes run`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KubeconfigPolicy {
    /// Accept `insecure-skip-tls-verify: true` (`--allow-insecure-skip-tls-verify`).
    pub allow_insecure_skip_tls_verify: bool,
}

/// A kubeconfig that passed [`check`]: everything needed to reach its cluster, and nothing
/// that names a file, a command or a proxy.
#[derive(Clone, PartialEq, Eq)]
pub struct CheckedKubeconfig {
    /// The API server URL (`https://host[:port][/path]`).
    pub server: String,
    /// The CA certificate(s) as given (PEM), when the kubeconfig has them.
    pub ca_pem: Option<Vec<u8>>,
    /// The CA certificates, DER-encoded (one per PEM `CERTIFICATE` block).
    pub ca_der: Vec<Vec<u8>>,
    /// The name the server certificate is checked against instead of the URL's host.
    pub tls_server_name: Option<String>,
    /// The server certificate is not checked (only with the policy opt-in).
    pub insecure_skip_tls_verify: bool,
    /// A bearer token.
    pub token: Option<String>,
    /// A client certificate and its key.
    pub client_identity: Option<ClientIdentity>,
}

/// A client certificate and its private key, both PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    /// The certificate (PEM `CERTIFICATE`).
    pub certificate_pem: Vec<u8>,
    /// The private key (PEM `… PRIVATE KEY`).
    pub key_pem: Vec<u8>,
}

impl fmt::Debug for CheckedKubeconfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print credentials.
        f.debug_struct("CheckedKubeconfig")
            .field("server", &self.server)
            .field("ca_certificates", &self.ca_der.len())
            .field("tls_server_name", &self.tls_server_name)
            .field("insecure_skip_tls_verify", &self.insecure_skip_tls_verify)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field(
                "client_identity",
                &self.client_identity.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

impl fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClientIdentity(<redacted>)")
    }
}

/// Why a kubeconfig was refused: the field (a path such as `users[admin].user.exec`) and
/// what is wrong with it. Neither ever contains a value from the kubeconfig other than
/// the (shortened, sanitised) names of its entries.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field} {problem}")]
pub struct Refusal {
    /// The refused field.
    pub field: String,
    /// What is wrong with it.
    pub problem: String,
}

impl Refusal {
    fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        Refusal {
            field: field.into(),
            problem: problem.into(),
        }
    }
}

/// User fields that are refused, with the reason shown to the user.
const REFUSED_USER_FIELDS: &[(&str, &str)] = &[
    (
        "exec",
        "is refused: it runs a command, and autonodes never runs commands named in a kubeconfig; use `token` or `client-certificate-data`/`client-key-data`",
    ),
    (
        "auth-provider",
        "is refused: auth provider plugins run commands or read files; use `token` or `client-certificate-data`/`client-key-data`",
    ),
    (
        "tokenFile",
        "is refused: it names a local file; put the token inline as `token`",
    ),
    (
        "username",
        "is refused: basic authentication is not accepted; use `token` or `client-certificate-data`/`client-key-data`",
    ),
    (
        "password",
        "is refused: basic authentication is not accepted; use `token` or `client-certificate-data`/`client-key-data`",
    ),
    (
        "client-certificate",
        "is refused: it names a local file; put the certificate inline as `client-certificate-data`",
    ),
    (
        "client-key",
        "is refused: it names a local file; put the key inline as `client-key-data`",
    ),
    ("as", "is refused: impersonation is not accepted"),
    ("as-groups", "is refused: impersonation is not accepted"),
    ("as-uid", "is refused: impersonation is not accepted"),
    ("as-user-extra", "is refused: impersonation is not accepted"),
];

/// Cluster fields that are refused, with the reason shown to the user.
const REFUSED_CLUSTER_FIELDS: &[(&str, &str)] = &[
    (
        "certificate-authority",
        "is refused: it names a local file; put the CA inline as `certificate-authority-data`",
    ),
    (
        "proxy-url",
        "is refused: autonodes does not send a cluster's traffic through a proxy named in its kubeconfig",
    ),
];

const USER_FIELDS: &[&str] = &[
    "token",
    "client-certificate-data",
    "client-key-data",
    "extensions",
];
const CLUSTER_FIELDS: &[&str] = &[
    "server",
    "certificate-authority-data",
    "insecure-skip-tls-verify",
    "tls-server-name",
    "disable-compression",
    "extensions",
];
const CONTEXT_FIELDS: &[&str] = &["cluster", "user", "namespace", "extensions"];

/// Checks the bytes of a kubeconfig Secret and returns what a client needs, or the first
/// field that is refused. Pure: it reads nothing but `bytes`.
pub fn check(bytes: &[u8], policy: &KubeconfigPolicy) -> Result<CheckedKubeconfig, Refusal> {
    if bytes.len() > MAX_KUBECONFIG_BYTES {
        return Err(Refusal::new(
            "the kubeconfig",
            format!("is larger than {MAX_KUBECONFIG_BYTES} bytes"),
        ));
    }
    let text = std::str::from_utf8(bytes)
        .map_err(|_| Refusal::new("the kubeconfig", "is not UTF-8 text"))?;
    let doc: Value = crate::yaml::from_str(text).map_err(|e| {
        Refusal::new(
            "the kubeconfig",
            format!("is not YAML{}", crate::yaml::position(&e)),
        )
    })?;
    let top = doc
        .as_object()
        .ok_or_else(|| Refusal::new("the kubeconfig", "is not a YAML mapping"))?;

    let context_name = match top.get("current-context") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(v) if !is_empty(v) => {
            return Err(Refusal::new("current-context", "is not a string"));
        }
        _ => {
            return Err(Refusal::new(
                "current-context",
                "is not set: autonodes uses the current context only",
            ))
        }
    };
    let context = named_entry(top, "contexts", "context", &context_name)?;
    let context_path = format!("contexts[{}].context", show_name(&context_name));
    only_known_fields(context, &context_path, CONTEXT_FIELDS, &[])?;
    let cluster_name = required_string(context, &context_path, "cluster")?;
    let user_name = required_string(context, &context_path, "user")?;
    let cluster = named_entry(top, "clusters", "cluster", &cluster_name)?;
    let user = named_entry(top, "users", "user", &user_name)?;
    let cluster_path = format!("clusters[{}].cluster", show_name(&cluster_name));
    let user_path = format!("users[{}].user", show_name(&user_name));

    // Refused fields first, so the message names what the writer must change.
    only_known_fields(user, &user_path, USER_FIELDS, REFUSED_USER_FIELDS)?;
    only_known_fields(
        cluster,
        &cluster_path,
        CLUSTER_FIELDS,
        REFUSED_CLUSTER_FIELDS,
    )?;

    let server = required_string(cluster, &cluster_path, "server")?;
    check_server(&server).map_err(|p| Refusal::new(format!("{cluster_path}.server"), p))?;

    let insecure = match cluster.get("insecure-skip-tls-verify") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::Bool(true)) if policy.allow_insecure_skip_tls_verify => true,
        Some(Value::Bool(true)) => {
            return Err(Refusal::new(
                format!("{cluster_path}.insecure-skip-tls-verify"),
                "is refused: it turns off the check of the server's certificate; the controller accepts it only when started with --allow-insecure-skip-tls-verify",
            ))
        }
        Some(_) => {
            return Err(Refusal::new(
                format!("{cluster_path}.insecure-skip-tls-verify"),
                "is not true or false",
            ))
        }
    };

    let (ca_pem, ca_der) =
        match optional_string(cluster, &cluster_path, "certificate-authority-data")? {
            Some(data) => {
                let field = format!("{cluster_path}.certificate-authority-data");
                let pem = decode_base64(&data).map_err(|p| Refusal::new(&field, p))?;
                let der = certificates(&pem);
                if der.is_empty() {
                    return Err(Refusal::new(field, "holds no PEM X.509 certificate"));
                }
                (Some(pem), der)
            }
            None if insecure => (None, Vec::new()),
            None => {
                return Err(Refusal::new(
                    format!("{cluster_path}.certificate-authority-data"),
                    "is not set: autonodes trusts only a CA given inline",
                ))
            }
        };

    let tls_server_name = optional_string(cluster, &cluster_path, "tls-server-name")?;
    if let Some(name) = &tls_server_name {
        if name.len() > 253 || !name.chars().all(|c| c.is_ascii_graphic()) {
            return Err(Refusal::new(
                format!("{cluster_path}.tls-server-name"),
                "is not a host name",
            ));
        }
    }

    let token = optional_string(user, &user_path, "token")?;
    if let Some(t) = &token {
        if !t.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(Refusal::new(
                format!("{user_path}.token"),
                "holds characters a bearer token cannot have",
            ));
        }
    }
    let cert = optional_string(user, &user_path, "client-certificate-data")?;
    let key = optional_string(user, &user_path, "client-key-data")?;
    let client_identity = match (cert, key) {
        (None, None) => None,
        (Some(_), None) => {
            return Err(Refusal::new(
                format!("{user_path}.client-key-data"),
                "is not set, but client-certificate-data is",
            ))
        }
        (None, Some(_)) => {
            return Err(Refusal::new(
                format!("{user_path}.client-certificate-data"),
                "is not set, but client-key-data is",
            ))
        }
        (Some(cert), Some(key)) => {
            let cert_field = format!("{user_path}.client-certificate-data");
            let key_field = format!("{user_path}.client-key-data");
            let certificate_pem = decode_base64(&cert).map_err(|p| Refusal::new(&cert_field, p))?;
            if certificates(&certificate_pem).is_empty() {
                return Err(Refusal::new(cert_field, "holds no PEM X.509 certificate"));
            }
            let key_pem = decode_base64(&key).map_err(|p| Refusal::new(&key_field, p))?;
            if !has_private_key(&key_pem) {
                return Err(Refusal::new(key_field, "holds no PEM private key"));
            }
            Some(ClientIdentity {
                certificate_pem,
                key_pem,
            })
        }
    };
    if token.is_none() && client_identity.is_none() {
        return Err(Refusal::new(
            user_path,
            "has no credentials: give `token`, or `client-certificate-data` and `client-key-data`",
        ));
    }

    Ok(CheckedKubeconfig {
        server,
        ca_pem,
        ca_der,
        tls_server_name,
        insecure_skip_tls_verify: insecure,
        token,
        client_identity,
    })
}

/// An entry name as shown in a field path: at most 63 characters of a safe set, so a
/// refusal can be logged and put into a condition as it is.
fn show_name(name: &str) -> String {
    let mut shown: String = name
        .chars()
        .take(63)
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.:@/".contains(c) {
                c
            } else {
                '?'
            }
        })
        .collect();
    if name.chars().count() > 63 {
        shown.push('…');
    }
    shown
}

/// Null, an empty string, list or mapping: what kubectl treats as not set.
fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(s) => s.is_empty(),
        Value::Object(m) => m.is_empty(),
        _ => false,
    }
}

/// The `inner` mapping of the one entry of the list `list` named `name`.
fn named_entry<'a>(
    top: &'a Mapping,
    list: &str,
    inner: &str,
    name: &str,
) -> Result<&'a Mapping, Refusal> {
    let shown = show_name(name);
    let entries = match top.get(list) {
        Some(Value::Array(s)) => s.as_slice(),
        Some(v) if !is_empty(v) => return Err(Refusal::new(list, "is not a list")),
        _ => &[],
    };
    let mut found = entries
        .iter()
        .filter(|e| e.get("name").and_then(Value::as_str) == Some(name));
    let entry = found
        .next()
        .ok_or_else(|| Refusal::new(format!("{list}[{shown}]"), "is missing"))?;
    if found.next().is_some() {
        return Err(Refusal::new(
            format!("{list}[{shown}]"),
            "appears more than once",
        ));
    }
    match entry.get(inner) {
        Some(Value::Object(m)) => Ok(m),
        _ => Err(Refusal::new(
            format!("{list}[{shown}].{inner}"),
            "is missing or not a mapping",
        )),
    }
}

/// Refuses the fields of `refused` that are set, then any field not in `known`.
fn only_known_fields(
    m: &Mapping,
    path: &str,
    known: &[&str],
    refused: &[(&str, &str)],
) -> Result<(), Refusal> {
    for (field, why) in refused {
        if m.get(*field).is_some_and(|v| !is_empty(v)) {
            return Err(Refusal::new(format!("{path}.{field}"), *why));
        }
    }
    for (k, v) in m {
        let k = k.as_str();
        let is_refused = refused.iter().any(|(f, _)| *f == k);
        if !known.contains(&k) && !is_refused && !is_empty(v) {
            return Err(Refusal::new(
                format!("{path}.{}", show_name(k)),
                "is not a field autonodes accepts in a kubeconfig Secret",
            ));
        }
    }
    Ok(())
}

fn optional_string(m: &Mapping, path: &str, field: &str) -> Result<Option<String>, Refusal> {
    match m.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(Refusal::new(format!("{path}.{field}"), "is not a string")),
    }
}

fn required_string(m: &Mapping, path: &str, field: &str) -> Result<String, Refusal> {
    optional_string(m, path, field)?
        .ok_or_else(|| Refusal::new(format!("{path}.{field}"), "is not set"))
}

fn decode_base64(data: &str) -> Result<Vec<u8>, &'static str> {
    let compact: String = data.chars().filter(|c| !c.is_whitespace()).collect();
    base64::engine::general_purpose::STANDARD
        .decode(compact)
        .map_err(|_| "is not base64")
}

/// The DER of every PEM `CERTIFICATE` block in `pem` that parses as X.509.
fn certificates(pem: &[u8]) -> Vec<Vec<u8>> {
    x509_parser::pem::Pem::iter_from_buffer(pem)
        .map_while(Result::ok)
        .filter(|p| p.label == "CERTIFICATE" && p.parse_x509().is_ok())
        .map(|p| p.contents)
        .collect()
}

fn has_private_key(pem: &[u8]) -> bool {
    x509_parser::pem::Pem::iter_from_buffer(pem)
        .map_while(Result::ok)
        .any(|p| p.label.ends_with("PRIVATE KEY") && !p.contents.is_empty())
}

/// Checks an API server URL: `https://`, a host, no user info, no query or fragment, and
/// a host that is not link-local.
pub(crate) fn check_server(server: &str) -> Result<(), &'static str> {
    if !server.starts_with("https://") {
        return Err("must be an https:// URL");
    }
    if server.contains(['?', '#']) || server.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("must be an https:// URL without query, fragment or spaces");
    }
    let uri: http::Uri = server.parse().map_err(|_| "is not a URL")?;
    let authority = uri.authority().ok_or("has no host")?;
    if authority.as_str().contains('@') {
        return Err("must not carry user info (`user:password@`)");
    }
    let host = authority.host();
    if host.is_empty() {
        return Err("has no host");
    }
    if host.contains('%') {
        return Err("must not name an IPv6 zone");
    }
    if is_link_local_host(host) {
        return Err(
            "is refused: its host is link-local (169.254.0.0/16 or fe80::/10), where cloud metadata services answer",
        );
    }
    Ok(())
}

/// True when `host` (as written in a URL) is a link-local address in any form a resolver
/// would accept: dotted quad, the short and octal/hex forms of `inet_aton`, an IPv6
/// address in brackets, or an IPv4 address mapped into IPv6.
pub(crate) fn is_link_local_host(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(v6) = host.parse::<Ipv6Addr>() {
        return is_link_local(IpAddr::V6(v6));
    }
    let host = host.strip_suffix('.').unwrap_or(host);
    match inet_aton(host) {
        Some(v4) => is_link_local(IpAddr::V4(v4)),
        None => false,
    }
}

fn is_link_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.octets()[0] == 169 && v4.octets()[1] == 254,
        IpAddr::V6(v6) => {
            (v6.segments()[0] & 0xffc0) == 0xfe80
                || v6
                    .to_ipv4_mapped()
                    .is_some_and(|v4| is_link_local(IpAddr::V4(v4)))
        }
    }
}

/// Parses an IPv4 address the way the C library's `inet_aton` does: one to four parts,
/// each decimal, octal (leading `0`) or hexadecimal (`0x`), the last part filling the
/// remaining bytes.
fn inet_aton(s: &str) -> Option<Ipv4Addr> {
    let parts: Vec<&str> = s.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut nums = Vec::with_capacity(parts.len());
    for p in &parts {
        nums.push(parse_c_number(p)?);
    }
    let (last, init) = nums.split_last()?;
    let mut value: u64 = 0;
    for (i, n) in init.iter().enumerate() {
        if *n > 0xff {
            return None;
        }
        value |= n << (24 - 8 * i);
    }
    let rest_bits = 32 - 8 * init.len();
    if rest_bits < 64 && *last >= (1u64 << rest_bits) {
        return None;
    }
    value |= last;
    u32::try_from(value).ok().map(Ipv4Addr::from)
}

fn parse_c_number(p: &str) -> Option<u64> {
    if p.is_empty() {
        return None;
    }
    let (digits, radix) = if let Some(h) = p.strip_prefix("0x").or_else(|| p.strip_prefix("0X")) {
        (h, 16)
    } else if p.len() > 1 && p.starts_with('0') {
        (&p[1..], 8)
    } else {
        (p, 10)
    };
    if digits.is_empty() {
        // "0x" alone is 0 for inet_aton.
        return (radix == 16).then_some(0);
    }
    if !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u64::from_str_radix(digits, radix)
        .ok()
        .filter(|n| *n <= u64::from(u32::MAX))
}

pub mod vcluster_service;

#[cfg(test)]
mod tests;

//! CRDs an API server starts with, from what an earlier server stored for them.
//!
//! A test API server of 1.20 spends about as much CPU on the 13 CRDs of a world as on its
//! own start: once each CRD is established it rebuilds and encodes its whole OpenAPI
//! document. So the first server of a binary given a set of CRDs gets them applied through
//! its API, as a user's would, and what it stored for them in etcd is kept: in this process,
//! and in a file under the temporary directory for the other test processes of the run. A
//! later server of the same binary with the same CRDs finds them in its etcd when it starts
//! and builds its OpenAPI document once. They are applied to it all the same (an apply that
//! changes nothing), so a CRD that differs from the stored one would still be applied and
//! waited for.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::error::{io_err, TestEnvError};

/// What one server stored for a set of CRDs: each CRD's name and its etcd value.
pub(super) type Stored = Arc<Vec<(String, Vec<u8>)>>;

/// The stores of this process, by [`seed_key`].
fn kept() -> &'static Mutex<HashMap<String, Stored>> {
    static KEPT: OnceLock<Mutex<HashMap<String, Stored>>> = OnceLock::new();
    KEPT.get_or_init(Default::default)
}

/// What identifies a set of stored CRDs: the API server binary (its path, size and time)
/// and the CRDs as applied.
pub(super) fn seed_key(apiserver: &Path, crds: &[CustomResourceDefinition]) -> String {
    let mut hash = Sha256::new();
    hash.update(apiserver.to_string_lossy().as_bytes());
    if let Ok(meta) = std::fs::metadata(apiserver) {
        hash.update(meta.len().to_le_bytes());
        if let Ok(modified) = meta.modified() {
            hash.update(format!("{modified:?}").as_bytes());
        }
    }
    for crd in crds {
        hash.update(serde_json::to_vec(crd).unwrap_or_default());
    }
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

fn seed_file(key: &str) -> PathBuf {
    std::env::temp_dir()
        .join("autonodes-crd-seeds")
        .join(format!("{key}.json"))
}

/// What a server stored for the CRDs of `key`, if one did in this process or this run.
pub(super) fn stored(key: &str) -> Option<Stored> {
    if let Some(s) = kept().lock().ok()?.get(key) {
        return Some(s.clone());
    }
    let text = std::fs::read_to_string(seed_file(key)).ok()?;
    let file: Vec<(String, String)> = serde_json::from_str(&text).ok()?;
    let values = file
        .into_iter()
        .map(|(name, value)| Some((name, STANDARD.decode(value).ok()?)))
        .collect::<Option<Vec<_>>>()?;
    let values = Arc::new(values);
    if let Ok(mut k) = kept().lock() {
        k.insert(key.to_string(), values.clone());
    }
    Some(values)
}

/// Keeps what a server stored for the CRDs of `key`, for the servers after it (the file is
/// written whole, then renamed, so a reader never sees half of it).
pub(super) fn keep(key: &str, values: Vec<(String, Vec<u8>)>) -> Result<(), TestEnvError> {
    let file = seed_file(key);
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir).map_err(io_err(format!("creating {}", dir.display())))?;
    }
    let text: Vec<(&str, String)> = values
        .iter()
        .map(|(name, value)| (name.as_str(), STANDARD.encode(value)))
        .collect();
    let partial = file.with_extension(format!("{}.partial", std::process::id()));
    std::fs::write(&partial, serde_json::to_vec(&text).unwrap_or_default())
        .map_err(io_err(format!("writing {}", partial.display())))?;
    std::fs::rename(&partial, &file).map_err(io_err(format!("renaming {}", partial.display())))?;
    if let Ok(mut k) = kept().lock() {
        k.insert(key.to_string(), Arc::new(values));
    }
    Ok(())
}

/// The etcd key of CRD `name` of the API server with `--etcd-prefix=/{server}`.
pub(super) fn crd_key(server: &str, name: &str) -> String {
    format!("/{server}/apiextensions.k8s.io/customresourcedefinitions/{name}")
}

/// Writes each CRD's stored value under server `server`'s prefix in the etcd at `etcd_url`.
pub(super) fn put(etcd_url: &str, server: &str, values: &Stored) -> Result<(), TestEnvError> {
    for (name, value) in values.iter() {
        etcd_call(
            etcd_url,
            "/v3/kv/put",
            &json!({"key": STANDARD.encode(crd_key(server, name)), "value": STANDARD.encode(value)}),
        )?;
    }
    Ok(())
}

/// The stored values of the CRDs `names` of server `server`, from the etcd at `etcd_url`;
/// an error if one is missing.
pub(super) fn read(
    etcd_url: &str,
    server: &str,
    names: &[String],
) -> Result<Vec<(String, Vec<u8>)>, TestEnvError> {
    names
        .iter()
        .map(|name| {
            let key = crd_key(server, name);
            let answer = etcd_call(
                etcd_url,
                "/v3/kv/range",
                &json!({"key": STANDARD.encode(&key)}),
            )?;
            let value = answer
                .pointer("/kvs/0/value")
                .and_then(Value::as_str)
                .and_then(|v| STANDARD.decode(v).ok())
                .ok_or_else(|| TestEnvError::Io {
                    context: format!("reading {key} from etcd"),
                    source: std::io::Error::other(format!("no value: {answer}")),
                })?;
            Ok((name.clone(), value))
        })
        .collect()
}

/// One call to etcd's JSON gateway: HTTP/1.0, so that the answer comes whole (not chunked)
/// and ends with the connection.
fn etcd_call(etcd_url: &str, path: &str, body: &Value) -> Result<Value, TestEnvError> {
    let context = || format!("calling etcd {path}");
    let address = etcd_url.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).map_err(io_err(context()))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(io_err(context()))?;
    let body = body.to_string();
    write!(
        stream,
        "POST {path} HTTP/1.0\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .map_err(io_err(context()))?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).map_err(io_err(context()))?;
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        return Err(TestEnvError::Io {
            context: context(),
            source: std::io::Error::other(format!("{head}: {body}")),
        });
    }
    serde_json::from_str(body).map_err(|e| TestEnvError::Io {
        context: context(),
        source: std::io::Error::other(e),
    })
}

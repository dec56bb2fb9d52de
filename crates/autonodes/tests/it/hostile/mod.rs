//! A hostile tenant API server: real HTTPS on loopback (a certificate of a CA the test makes
//! with openssl), answering every request the way a hostile tenant would. One request per
//! connection; it counts the bytes it managed to send.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;

/// How the server answers.
#[derive(Clone, Debug)]
pub enum Hostile {
    /// Lists as large as a tenant can make them: a Node list of `node_bytes` bytes, and
    /// `secrets` Secrets of `secret_bytes` bytes each carrying autonodes' labels (with
    /// `installation`) wherever Secrets are asked for, whatever the selector or page size.
    Huge {
        /// Bytes of the Node list.
        node_bytes: u64,
        /// Secrets in every Secret list.
        secrets: usize,
        /// Bytes of data per Secret.
        secret_bytes: usize,
        /// The installation label value the Secrets carry.
        installation: String,
    },
    /// Every list (Nodes, Secrets, pods) of about `bytes` bytes, and every watch an
    /// endless stream of events of about `bytes` bytes each, one per line.
    Flood {
        /// Bytes of each list and of each watch event.
        bytes: usize,
    },
    /// Headers at once, then one byte of body per second, forever.
    Trickle,
    /// `302 Found` to `location` for every request.
    Redirect {
        /// Where to.
        location: String,
    },
}

/// A running hostile server.
pub struct HostileServer {
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// PEM of the CA its certificate is signed by.
    pub ca_pem: String,
    /// Bytes of response bodies it sent.
    pub sent: Arc<AtomicU64>,
    /// Requests it answered.
    pub requests: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for HostileServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl runs");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `openssl req` with a new unencrypted P-256 key written to `key`; `args` say the rest
/// (`-x509` for a self-signed certificate, `-out`, `-subj`, …).
fn request_with_new_key(dir: &Path, key: &str, args: &[&str]) {
    let mut all = vec![
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        key,
    ];
    all.extend_from_slice(args);
    openssl(dir, &all);
}

/// A CA and a serving certificate for 127.0.0.1 signed by it, in `dir`.
fn certificates(dir: &Path) -> (String, String, String) {
    std::fs::create_dir_all(dir).expect("dir");
    request_with_new_key(
        dir,
        "ca.key",
        &[
            "-x509",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=hostile-ca",
        ],
    );
    request_with_new_key(dir, "tls.key", &["-out", "tls.csr", "-subj", "/CN=hostile"]);
    std::fs::write(
        dir.join("ext.cnf"),
        "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1\n",
    )
    .expect("ext");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "tls.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "tls.crt",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ],
    );
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).expect("pem");
    (read("ca.crt"), read("tls.crt"), read("tls.key"))
}

impl HostileServer {
    /// Starts a server answering as `mode`, its certificates in `dir`.
    pub async fn start(dir: &Path, mode: Hostile) -> HostileServer {
        let (ca_pem, cert_pem, key_pem) = certificates(dir);
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(cert_pem.as_bytes())
                .collect::<Result<_, _>>()
                .expect("cert");
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).expect("key");
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocols")
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("server config");
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let sent = Arc::new(AtomicU64::new(0));
        let requests = Arc::new(AtomicU64::new(0));
        let (s, r) = (sent.clone(), requests.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let (acceptor, mode, sent, requests) =
                    (acceptor.clone(), mode.clone(), s.clone(), r.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let Some(path) = read_request(&mut tls).await else {
                        return;
                    };
                    requests.fetch_add(1, Ordering::Relaxed);
                    let _ = answer(&mut tls, &mode, &path, &sent).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        HostileServer {
            port,
            ca_pem,
            sent,
            requests,
            task,
        }
    }

    /// A kubeconfig for this server (a bearer token, the CA).
    pub fn kubeconfig(&self) -> String {
        use base64::Engine;
        let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem);
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: hostile\n  cluster:\n    server: https://127.0.0.1:{}\n    certificate-authority-data: {ca}\nusers:\n- name: hostile\n  user:\n    token: hostile-token\ncontexts:\n- name: hostile\n  context:\n    cluster: hostile\n    user: hostile\ncurrent-context: hostile\n",
            self.port
        )
    }

    /// Bytes of bodies sent so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }
}

/// Reads a request head (at most 64 KiB) and returns its path and query.
async fn read_request<S: AsyncReadExt + Unpin>(s: &mut S) -> Option<String> {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut buf).await.ok()?;
        if n == 0 || head.len() > 64 * 1024 {
            return None;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head);
    line.split_whitespace().nth(1).map(str::to_string)
}

const CHUNK: usize = 64 * 1024;

async fn answer<S: AsyncWriteExt + Unpin>(
    s: &mut S,
    mode: &Hostile,
    path: &str,
    sent: &AtomicU64,
) -> std::io::Result<()> {
    match mode {
        Hostile::Redirect { location } => {
            s.write_all(
                format!("HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .await
        }
        Hostile::Trickle => {
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\nConnection: close\r\n\r\n")
                .await?;
            loop {
                s.write_all(b" ").await?;
                s.flush().await?;
                sent.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
        Hostile::Flood { bytes } => {
            if path.starts_with("/version") {
                let body = r#"{"major":"1","minor":"30","gitVersion":"v1.30.0"}"#;
                return json(s, body.as_bytes(), sent).await;
            }
            let (kind, item) = if path.contains("/secrets") {
                ("Secret", "Secret")
            } else if path.contains("/pods") {
                ("Pod", "Pod")
            } else {
                ("Node", "Node")
            };
            // Objects of 64 KiB of annotations each, as many as make `bytes`.
            let pad = "f".repeat(64 * 1024);
            let object = |i: usize| {
                format!(
                    r#"{{"apiVersion":"v1","kind":"{item}","metadata":{{"name":"flood-{i}","namespace":"kube-system","resourceVersion":"{i}","labels":{{"autonodes.io/nodeclaim":"x"}},"annotations":{{"pad":"{pad}"}}}}}}"#
                )
            };
            if !path.contains("watch=") {
                let bytes = *bytes as u64;
                return stream_list(s, &format!("{kind}List"), bytes, sent, object).await;
            }
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
                .await?;
            let per_event = bytes / (64 * 1024);
            let mut n = 0usize;
            loop {
                // One event line: an object whose annotations hold `bytes`, sent in chunks.
                let head = format!(
                    r#"{{"type":"ADDED","object":{{"apiVersion":"v1","kind":"{item}","metadata":{{"name":"flood-w{n}","namespace":"kube-system","resourceVersion":"{}","labels":{{"autonodes.io/nodeclaim":"x"}},"annotations":{{"#,
                    n + 1
                );
                let mut line = head;
                for k in 0..per_event.max(1) {
                    if k > 0 {
                        line.push(',');
                    }
                    line.push_str(&format!(r#""pad{k}":"{pad}""#));
                    if line.len() >= CHUNK {
                        chunk(s, line.as_bytes(), sent).await?;
                        line.clear();
                    }
                }
                line.push_str("}}}}\n");
                chunk(s, line.as_bytes(), sent).await?;
                n += 1;
            }
        }
        Hostile::Huge {
            node_bytes,
            secrets,
            secret_bytes,
            installation,
        } => {
            if path.starts_with("/version") {
                let body = r#"{"major":"1","minor":"30","gitVersion":"v1.30.0"}"#;
                return json(s, body.as_bytes(), sent).await;
            }
            if path.contains("/pods") && !path.contains("watch=") {
                return stream_list(s, "PodList", 0, sent, |_| String::new()).await;
            }
            if path.contains("/nodes") && !path.contains("watch=") {
                return stream_list(s, "NodeList", *node_bytes, sent, |i| {
                    format!(
                        r#"{{"metadata":{{"name":"hostile-{i}","labels":{{"autonodes.io/nodeclaim":"x","autonodes.io/installation":"{installation}","padding":"{pad}"}}}},"spec":{{"providerID":"kubevirt://hostile-{i}"}}}}"#,
                        pad = "p".repeat(60)
                    )
                })
                .await;
            }
            if path.contains("/secrets") && !path.contains("watch=") {
                let data = "A".repeat(*secret_bytes * 4 / 3);
                let total = (*secrets as u64) * (*secret_bytes as u64 + 300);
                let secrets = *secrets;
                return stream_list(s, "SecretList", total, sent, |i| {
                    if i >= secrets {
                        return String::new();
                    }
                    format!(
                        r#"{{"metadata":{{"name":"bootstrap-token-h{i:05}","namespace":"kube-system","labels":{{"app.kubernetes.io/managed-by":"autonodes","autonodes.io/installation":"{installation}","autonodes.io/nodeclaim-uid":"u{i}"}}}},"type":"bootstrap.kubernetes.io/token","data":{{"padding":"{data}"}}}}"#
                    )
                })
                .await;
            }
            let body = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404,"message":"not here"}"#;
            s.write_all(
                format!("HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len()).as_bytes(),
            )
            .await?;
            s.write_all(body.as_bytes()).await
        }
    }
}

/// One chunk of a chunked body.
async fn chunk<S: AsyncWriteExt + Unpin>(
    s: &mut S,
    data: &[u8],
    sent: &AtomicU64,
) -> std::io::Result<()> {
    s.write_all(format!("{:x}\r\n", data.len()).as_bytes())
        .await?;
    s.write_all(data).await?;
    s.write_all(b"\r\n").await?;
    sent.fetch_add(data.len() as u64, Ordering::Relaxed);
    Ok(())
}

async fn json<S: AsyncWriteExt + Unpin>(
    s: &mut S,
    body: &[u8],
    sent: &AtomicU64,
) -> std::io::Result<()> {
    s.write_all(
        format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len()).as_bytes(),
    )
    .await?;
    s.write_all(body).await?;
    sent.fetch_add(body.len() as u64, Ordering::Relaxed);
    Ok(())
}

/// A list of `kind` of about `bytes` bytes (items from `item(i)` until it gives an empty
/// string or the size is reached), chunked; stops at the first failed write.
async fn stream_list<S: AsyncWriteExt + Unpin>(
    s: &mut S,
    kind: &str,
    bytes: u64,
    sent: &AtomicU64,
    item: impl Fn(usize) -> String,
) -> std::io::Result<()> {
    s.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
        .await?;
    let mut buf = format!(
        r#"{{"kind":"{kind}","apiVersion":"v1","metadata":{{"resourceVersion":"1"}},"items":["#
    );
    let mut total = 0u64;
    let mut i = 0usize;
    loop {
        let next = if total < bytes {
            item(i)
        } else {
            String::new()
        };
        if next.is_empty() {
            buf.push_str("]}");
        } else {
            if i > 0 {
                buf.push(',');
            }
            buf.push_str(&next);
            i += 1;
        }
        if buf.len() >= CHUNK || next.is_empty() {
            s.write_all(format!("{:x}\r\n", buf.len()).as_bytes())
                .await?;
            s.write_all(buf.as_bytes()).await?;
            s.write_all(b"\r\n").await?;
            total += buf.len() as u64;
            sent.fetch_add(buf.len() as u64, Ordering::Relaxed);
            buf.clear();
        }
        if next.is_empty() {
            return s.write_all(b"0\r\n\r\n").await;
        }
    }
}

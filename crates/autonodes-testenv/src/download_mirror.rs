//! A download mirror on loopback with the layout of `https://dl.k8s.io/release`:
//! `/<version>/bin/linux/<arch>/<binary>` and a `.sha256` beside each, serving the kubelet
//! and kubeadm the test environment built, so a stock guest image installs them the way it
//! would from dl.k8s.io (`autonodes run --kubernetes-download-url`). Plain HTTP/1.1 `GET`,
//! one request per connection; every request is logged for the test to show.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use sha2::Digest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// A running mirror; stops when dropped.
#[derive(Debug)]
pub struct DownloadMirror {
    /// The port on 127.0.0.1 (guests use `http://10.0.2.2:<port>`).
    pub port: u16,
    requests: Arc<Mutex<Vec<String>>>,
    task: JoinHandle<()>,
}

impl DownloadMirror {
    /// Serves `binaries` (names in `bin_dir`) as `/<version>/bin/linux/amd64/<name>` with
    /// their `.sha256`.
    pub async fn start(bin_dir: &Path, version: &str, binaries: &[&str]) -> std::io::Result<Self> {
        let mut files: BTreeMap<String, Arc<Vec<u8>>> = BTreeMap::new();
        for name in binaries {
            let bytes = std::fs::read(bin_dir.join(name))?;
            let sum = format!("{:x}", sha2::Sha256::digest(&bytes));
            let path = format!("/{version}/bin/linux/amd64/{name}");
            files.insert(format!("{path}.sha256"), Arc::new(sum.into_bytes()));
            files.insert(path, Arc::new(bytes));
        }
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let port = listener.local_addr()?.port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let log = requests.clone();
        let files = Arc::new(files);
        let task = tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let files = files.clone();
                let log = log.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
                        match conn.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let line = String::from_utf8_lossy(&head)
                        .lines()
                        .next()
                        .unwrap_or_default()
                        .to_string();
                    let mut words = line.split_whitespace();
                    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
                    let found = (method == "GET").then(|| files.get(path)).flatten();
                    let status = if found.is_some() { 200 } else { 404 };
                    if let Ok(mut l) = log.lock() {
                        l.push(format!("{method} {path} {status}"));
                    }
                    let body: &[u8] = found.map(|b| b.as_slice()).unwrap_or(b"not found\n");
                    let reason = if status == 200 { "OK" } else { "Not Found" };
                    let header = format!(
                        "HTTP/1.1 {status} {reason}\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = conn.write_all(header.as_bytes()).await;
                    let _ = conn.write_all(body).await;
                    let _ = conn.shutdown().await;
                });
            }
        });
        Ok(DownloadMirror {
            port,
            requests,
            task,
        })
    }

    /// Every request so far: `GET <path> <status>`.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

impl Drop for DownloadMirror {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn get(port: u16, path: &str) -> String {
        let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connects");
        conn.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .expect("writes");
        let mut out = Vec::new();
        conn.read_to_end(&mut out).await.expect("reads");
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn a_binary_and_its_checksum_are_served_under_dl_k8s_io_paths_and_others_are_404() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::write(dir.path().join("kubeadm"), b"binary").expect("file");
        let mirror = DownloadMirror::start(dir.path(), "v1.20.2", &["kubeadm"])
            .await
            .expect("starts");
        let body = get(mirror.port, "/v1.20.2/bin/linux/amd64/kubeadm").await;
        assert!(
            body.starts_with("HTTP/1.1 200 OK\r\n") && body.ends_with("\r\n\r\nbinary"),
            "{body}"
        );
        let sum = get(mirror.port, "/v1.20.2/bin/linux/amd64/kubeadm.sha256").await;
        assert!(
            sum.ends_with(&format!("{:x}", sha2::Sha256::digest(b"binary"))),
            "{sum}"
        );
        assert!(get(mirror.port, "/v1.20.2/bin/linux/amd64/kubelet")
            .await
            .starts_with("HTTP/1.1 404"));
        assert_eq!(mirror.requests().len(), 3);
    }
}

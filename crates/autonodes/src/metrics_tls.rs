//! HTTPS for the metrics server when `/metrics` is authenticated (`--metrics-auth`): the
//! bearer tokens callers show must not cross the network in clear. The certificate is
//! self-signed, made at start (Prometheus scrapes it with `insecureSkipVerify`, as it
//! scrapes the kubelet and controller-runtime's secure metrics; the token is what
//! authenticates).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// How long a client may take for its TLS handshake.
const HANDSHAKE: Duration = Duration::from_secs(10);
/// Handshaken connections waiting for the server to take them.
const BACKLOG: usize = 64;

/// A TLS acceptor with a new self-signed certificate for `autonodes`, `localhost` and
/// the pod's own name (`POD_NAME`, when set).
pub(crate) fn self_signed_acceptor() -> anyhow::Result<TlsAcceptor> {
    let mut names = vec!["autonodes".to_string(), "localhost".to_string()];
    if let Ok(pod) = std::env::var("POD_NAME") {
        names.push(pod);
    }
    let certified = rcgen::generate_simple_self_signed(names)
        .context("making the metrics server's self-signed certificate")?;
    let cert = CertificateDer::from(certified.cert.der().to_vec());
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
        certified.signing_key.serialize_der(),
    ));
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .context("the metrics server's TLS configuration")?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// A listener whose connections are TLS: each handshake runs on its own (a slow client
/// holds up nobody), bounded by [`HANDSHAKE`].
pub(crate) struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    addr: SocketAddr,
    accepting: tokio::task::JoinHandle<()>,
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl TlsListener {
    /// TLS over `listener`'s connections.
    pub(crate) fn new(listener: TcpListener, acceptor: TlsAcceptor) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        let (tx, ready) = mpsc::channel(BACKLOG);
        let accepting = tokio::spawn(async move {
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(c) => c,
                    Err(error) => {
                        tracing::debug!(%error, "metrics server: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(error)) => {
                            tracing::debug!(%peer, %error, "metrics server: TLS handshake failed")
                        }
                        Err(_) => tracing::debug!(%peer, "metrics server: TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener {
            ready,
            addr,
            accepting,
        })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(c) => c,
            // The accepting task never ends on its own; if it did, serve nothing more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.addr)
    }
}

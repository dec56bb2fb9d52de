//! Clients of host and tenant clusters whose every connection goes only where the
//! [`AddressPolicy`] allows: the server's name is resolved here, each address is checked,
//! and the connection is made to a checked address (never resolved a second time), so a
//! name that resolves to loopback, a metadata service or the management API server is
//! refused like the address itself. TLS still verifies the server's name, and redirects are
//! never followed (the HTTP client does not follow them).
//!
//! A refused address is an error whose text says only that the address was refused; what a
//! tenant is shown of any connection failure is coarse ([`coarse_error`]): refused,
//! unreachable, or TLS — never the connect or handshake text, so a tenant kubeconfig cannot
//! tell an open port from a closed one.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use autonodes_core::address_policy::{AddressPolicy, Refusal};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::ConfigExt;
use kube::{Client, Config};
use tower::{BoxError, ServiceBuilder};

use crate::remote::request_metrics::{ClusterKind, CountRequests};

/// The address policies of host and tenant clusters' clients.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Egress {
    /// For host (KubeVirt) clusters (`--host-allow-cidrs`, `--host-deny-cidrs`).
    pub host: Arc<AddressPolicy>,
    /// For tenant clusters (`--tenant-allow-cidrs`, `--tenant-deny-cidrs`).
    pub tenant: Arc<AddressPolicy>,
    /// The management API server's addresses as last read, refused to both (the
    /// controller reads them again while it runs).
    pub management: Arc<ManagementAddresses>,
}

/// The management cluster's API server's addresses as last read: every host and tenant
/// connection to one of them is refused, and while they are not known (never read) every
/// connection is. Replaced whole when they are read again.
#[derive(Debug)]
pub struct ManagementAddresses {
    addrs: std::sync::RwLock<Option<Arc<[SocketAddr]>>>,
}

impl Default for ManagementAddresses {
    /// Known, and none: for clients that are never pointed at the management cluster
    /// (tests of one cluster). The controller starts from [`ManagementAddresses::unknown`].
    fn default() -> Self {
        ManagementAddresses::known(Vec::new())
    }
}

impl PartialEq for ManagementAddresses {
    fn eq(&self, other: &Self) -> bool {
        self.current() == other.current()
    }
}

impl Eq for ManagementAddresses {}

impl ManagementAddresses {
    /// Not read yet: every connection is refused.
    pub fn unknown() -> Self {
        ManagementAddresses {
            addrs: std::sync::RwLock::new(None),
        }
    }

    /// Read as `addrs`.
    pub fn known(addrs: Vec<SocketAddr>) -> Self {
        ManagementAddresses {
            addrs: std::sync::RwLock::new(Some(addrs.into())),
        }
    }

    /// The addresses as last read (`None`: never read).
    pub fn current(&self) -> Option<Arc<[SocketAddr]>> {
        self.addrs
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Replaces the addresses with `addrs` (sorted, without repeats); `true` when they
    /// differ from what was known.
    pub(crate) fn replace(&self, mut addrs: Vec<SocketAddr>) -> bool {
        addrs.sort();
        addrs.dedup();
        let mut held = self
            .addrs
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let changed = held.as_deref() != Some(addrs.as_slice());
        *held = Some(addrs.into());
        changed
    }

    /// Whether a connection to `addr` may be made as far as the management API server
    /// goes: not one of its addresses (in any spelling of the IP), and they are known.
    pub fn check(&self, addr: SocketAddr) -> Result<(), Refusal> {
        match self.current() {
            None => Err(Refusal::ManagementApiServerUnknown),
            Some(known) => {
                let policy = AddressPolicy {
                    protected: known.to_vec(),
                    ..AddressPolicy::default()
                };
                match policy.check(addr) {
                    Err(Refusal::ManagementApiServer) => Err(Refusal::ManagementApiServer),
                    _ => Ok(()),
                }
            }
        }
    }
}

impl Egress {
    /// Both policies with `addrs` (the management cluster's API server, as read once)
    /// refused.
    pub(crate) fn protecting(&self, addrs: &[SocketAddr]) -> Egress {
        Egress {
            management: Arc::new(ManagementAddresses::known(addrs.to_vec())),
            ..self.clone()
        }
    }

    /// [`Egress::allowing`] the comma-separated networks of `list` (`127.0.0.1`).
    pub fn allowing_list(list: &str) -> Result<Egress, String> {
        Ok(Egress::allowing(
            &autonodes_core::address_policy::Cidr::parse_list(list)?,
        ))
    }

    /// Both policies allowing `cidrs` over the built-in list (the test environment and the
    /// playground, whose clusters all listen on loopback).
    pub fn allowing(cidrs: &[autonodes_core::address_policy::Cidr]) -> Egress {
        let p = Arc::new(AddressPolicy {
            allow: cidrs.to_vec(),
            ..AddressPolicy::default()
        });
        Egress {
            host: p.clone(),
            tenant: p,
            management: Arc::default(),
        }
    }
}

/// How long a TCP connect may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection refused by the address policy.
#[derive(Debug, thiserror::Error)]
#[error("the server's address is refused: {0}")]
pub(crate) struct AddressRefused(pub Refusal);

/// A TCP connector that resolves the server's name itself and connects only to addresses
/// the policy allows and that are not the management API server's.
#[derive(Clone)]
pub(crate) struct GuardedConnector {
    http: HttpConnector,
    policy: Arc<AddressPolicy>,
    management: Arc<ManagementAddresses>,
}

impl GuardedConnector {
    /// A connector for `policy`, refusing `management`'s addresses as they are at each
    /// connection.
    pub(crate) fn new(policy: Arc<AddressPolicy>, management: Arc<ManagementAddresses>) -> Self {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(CONNECT_TIMEOUT));
        GuardedConnector {
            http,
            policy,
            management,
        }
    }
}

/// The first of `addrs` the policy and the management API server's addresses allow, else
/// the last refusal.
pub(crate) fn first_allowed(
    policy: &AddressPolicy,
    management: &ManagementAddresses,
    addrs: impl IntoIterator<Item = SocketAddr>,
) -> Result<SocketAddr, Refusal> {
    let mut refusal = Refusal::Denied;
    for a in addrs {
        match management.check(a).and_then(|()| policy.check(a)) {
            Ok(()) => return Ok(a),
            Err(r) => refusal = r,
        }
    }
    Err(refusal)
}

impl tower::Service<http::Uri> for GuardedConnector {
    type Response = <HttpConnector as tower::Service<http::Uri>>::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        tower::Service::<http::Uri>::poll_ready(&mut self.http, cx).map_err(Into::into)
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let mut http = self.http.clone();
        let policy = self.policy.clone();
        let management = self.management.clone();
        Box::pin(async move {
            let host = uri
                .host()
                .ok_or("the server URL has no host")?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
                Some("http") => 80,
                _ => 443,
            });
            let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
                Ok(ip) => vec![SocketAddr::new(ip, port)],
                Err(_) => tokio::net::lookup_host((host.as_str(), port))
                    .await?
                    .collect(),
            };
            let addr = first_allowed(&policy, &management, addrs).map_err(AddressRefused)?;
            let ip = match addr.ip() {
                IpAddr::V4(v4) => v4.to_string(),
                IpAddr::V6(v6) => format!("[{v6}]"),
            };
            // The checked address, not the name: nothing is resolved again.
            let checked: http::Uri = format!("http://{ip}:{port}").parse()?;
            Ok(tower::Service::call(&mut http, checked).await?)
        })
    }
}

/// The most bytes one answer of a tenant's API server may have: a single list (paged, as
/// every list autonodes makes of a tenant is) or the stream of one watch connection (which
/// is then opened again, from where it was). A larger answer is an error that says so.
pub const TENANT_BODY_LIMIT: usize = 8 * 1024 * 1024;
/// Whether `error` (or what it wraps) is an answer that passed its body limit
/// ([`TENANT_BODY_LIMIT`], [`HOST_BODY_LIMIT`]).
pub(crate) fn passed_body_limit(error: &(dyn std::error::Error + 'static)) -> bool {
    causes(error).any(|e| e.is::<http_body_util::LengthLimitError>())
}

/// `error` and every error it wraps, outermost first.
pub fn causes<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(error), |e| {
        // An `io::Error`'s `source` skips the error it carries: read that one itself.
        match e.downcast_ref::<std::io::Error>() {
            Some(io) => io
                .get_ref()
                .map(|inner| inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        }
    })
}

/// How many answers (watches aside) of one cluster are read at once: the others wait,
/// unread, so what one tenant's answers take in memory is at most this many times its
/// body limit, however many claims and pools ask at once.
pub(crate) const BODIES_AT_ONCE: usize = 4;
/// The most bytes one answer of a host's API server may have (hosts are the platform's
/// own, and hold every tenant's VMs).
pub(crate) const HOST_BODY_LIMIT: usize = 256 * 1024 * 1024;

/// Sends a request again that its server turned away for load (`429`), after the bounded
/// wait of [`autonodes_core::throttle::retry_delay`]: the server's `Retry-After`, at most
/// 10 s, at most three times. Requests whose body cannot be replayed (a stream) are not.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RetryThrottled {
    attempt: u32,
}

impl<Res> tower::retry::Policy<http::Request<kube::client::Body>, http::Response<Res>, BoxError>
    for RetryThrottled
{
    type Future = tokio::time::Sleep;

    fn retry(
        &mut self,
        _req: &mut http::Request<kube::client::Body>,
        result: &mut Result<http::Response<Res>, BoxError>,
    ) -> Option<Self::Future> {
        let response = result.as_ref().ok()?;
        let retry_after = response
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok());
        let wait = autonodes_core::throttle::retry_delay(
            response.status().as_u16(),
            retry_after,
            self.attempt,
        )?;
        self.attempt += 1;
        Some(tokio::time::sleep(wait))
    }

    fn clone_request(
        &mut self,
        req: &http::Request<kube::client::Body>,
    ) -> Option<http::Request<kube::client::Body>> {
        let body = req.body().try_clone()?;
        let mut copy = http::Request::new(body);
        *copy.method_mut() = req.method().clone();
        *copy.uri_mut() = req.uri().clone();
        *copy.version_mut() = req.version();
        *copy.headers_mut() = req.headers().clone();
        *copy.extensions_mut() = req.extensions().clone();
        Some(copy)
    }
}

/// A client for `config` whose connections `policy` and `management` guard: kube's own stack (base URI,
/// authentication, TLS from the kubeconfig) over the [`GuardedConnector`], each request
/// counted for `kind`, each answer's body at most [`TENANT_BODY_LIMIT`] or
/// [`HOST_BODY_LIMIT`] bytes, a request turned away for load sent again
/// ([`RetryThrottled`]). A tenant's client charges what it reads to its namespace's
/// `share` of the memory budget ([`crate::remote::budget`]).
pub(crate) fn guarded_client(
    config: &Config,
    policy: Arc<AddressPolicy>,
    management: Arc<ManagementAddresses>,
    kind: ClusterKind,
    share: Option<Arc<crate::remote::budget::Share>>,
    transports: &Transports,
) -> Result<Client, kube::Error> {
    let limit = match kind {
        ClusterKind::Tenant => TENANT_BODY_LIMIT,
        _ => HOST_BODY_LIMIT,
    };
    let connector = GuardedConnector::new(policy, management);
    let (http_client, user) = match kind {
        // A tenant's watches and requests share one HTTP/2 connection (as client-go's
        // do), so a tenant costs one connection, not one per watch; pings find a dead
        // one. Namespaces whose kubeconfigs are the same share it too.
        ClusterKind::Tenant => transports.tenant(config, || {
            Ok(
                hyper_util::client::legacy::Client::builder(TokioExecutor::new())
                    .timer(hyper_util::rt::TokioTimer::new())
                    .http2_keep_alive_interval(Some(HTTP2_PING_INTERVAL))
                    .http2_keep_alive_timeout(HTTP2_PING_TIMEOUT)
                    .http2_initial_stream_window_size(HTTP2_STREAM_WINDOW)
                    .http2_initial_connection_window_size(HTTP2_CONNECTION_WINDOW)
                    .build(http2_connector(config, connector)?),
            )
        })?,
        _ => (
            hyper_util::client::legacy::Client::builder(TokioExecutor::new())
                .build(config.rustls_https_connector_with_connector(connector)?),
            Arc::new(()),
        ),
    };
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .layer(tower::retry::RetryLayer::new(RetryThrottled::default()))
        .layer_fn(|inner| BodyPermits {
            inner,
            permits: Arc::new(tokio::sync::Semaphore::new(BODIES_AT_ONCE)),
            share: share.clone(),
            _transport: user.clone(),
        })
        .map_response(move |r: http::Response<_>| {
            r.map(|body| http_body_util::Limited::new(body, limit))
        })
        .service(http_client);
    Ok(
        kube::client::ClientBuilder::new(service, config.default_namespace.clone())
            .with_layer(&CountRequests(kind))
            .build(),
    )
}

/// The HTTP client of a tenant: its connection pool (one HTTP/2 connection).
type TenantHttp = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<GuardedConnector>,
    kube::client::Body,
>;

/// What a tenant connection is made of: the server and everything TLS and the requests
/// authenticate with, compared whole (two namespaces share a connection only when their
/// kubeconfigs say exactly the same). Holds credentials: never logged, no `Debug`.
#[derive(Clone, PartialEq, Eq, Hash)]
struct TransportKey {
    server: String,
    ca: Option<Vec<Vec<u8>>>,
    insecure: bool,
    tls_server_name: Option<String>,
    certificate: Option<String>,
    key: Option<String>,
    token: Option<String>,
}

impl TransportKey {
    fn of(config: &Config) -> Self {
        use secrecy::ExposeSecret;
        let a = &config.auth_info;
        TransportKey {
            server: config.cluster_url.to_string(),
            ca: config.root_cert.clone(),
            insecure: config.accept_invalid_certs,
            tls_server_name: config.tls_server_name.clone(),
            certificate: a.client_certificate_data.clone(),
            key: a
                .client_key_data
                .as_ref()
                .map(|k| k.expose_secret().to_string()),
            token: a.token.as_ref().map(|t| t.expose_secret().to_string()),
        }
    }
}

/// The tenant connections in use, by what they are made of: namespaces whose kubeconfig
/// Secrets name the same server with the same credentials (a platform that put one
/// vCluster's Secret in several namespaces) share one HTTP client and so one connection,
/// each namespace still with its own stack (its memory budget share, its answers'
/// limits). An entry lives while a client uses it.
#[derive(Default)]
pub(crate) struct Transports {
    tenants: std::sync::Mutex<
        std::collections::HashMap<TransportKey, (TenantHttp, std::sync::Weak<()>)>,
    >,
}

impl Transports {
    /// The HTTP client for a tenant `config` (the one in use for the same kubeconfig, else
    /// `build`'s), and the token a client holds while it uses it.
    fn tenant(
        &self,
        config: &Config,
        build: impl FnOnce() -> Result<TenantHttp, kube::Error>,
    ) -> Result<(TenantHttp, Arc<()>), kube::Error> {
        let key = TransportKey::of(config);
        let mut tenants = self
            .tenants
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((http, user)) = tenants
            .get(&key)
            .and_then(|(http, w)| Some((http.clone(), w.upgrade()?)))
        {
            return Ok((http, user));
        }
        tenants.retain(|_, (_, w)| w.strong_count() > 0);
        let http = build()?;
        let user = Arc::new(());
        tenants.insert(key, (http.clone(), Arc::downgrade(&user)));
        Ok((http, user))
    }

    /// How many tenant connections are in use.
    #[cfg(test)]
    fn in_use(&self) -> usize {
        self.tenants
            .lock()
            .map(|t| t.values().filter(|(_, w)| w.strong_count() > 0).count())
            .unwrap_or(0)
    }
}

/// How often an idle HTTP/2 connection to a tenant is pinged.
const HTTP2_PING_INTERVAL: Duration = Duration::from_secs(30);
/// How long a ping may go unanswered before the connection counts as dead (its watches
/// then list again on a new one).
const HTTP2_PING_TIMEOUT: Duration = Duration::from_secs(20);

/// How much a tenant may send on one HTTP/2 stream before autonodes reads it, and on its
/// connection: what HTTP/2 buffers in this process ahead of the memory budget (hyper's
/// defaults, 2 and 5 MiB, let forty flooding tenants park 200 MiB here).
const HTTP2_STREAM_WINDOW: u32 = 64 * 1024;
const HTTP2_CONNECTION_WINDOW: u32 = 256 * 1024;

/// The TLS sessions a tenant's client keeps for resumption (one server, a few names).
const TLS_SESSIONS: usize = 4;

/// kube's TLS settings of `config` (its CA, client certificate and `tls-server-name`) over
/// `connector`, offering HTTP/2 and HTTP/1.1 (ALPN): a server that speaks HTTP/2, as every
/// kube-apiserver does, takes one connection for all of a client's requests and watches.
fn http2_connector(
    config: &Config,
    connector: GuardedConnector,
) -> Result<hyper_rustls::HttpsConnector<GuardedConnector>, kube::Error> {
    let mut tls = config.rustls_client_config()?;
    // A tenant's client talks to one server: a session cache for a few names, not
    // rustls' default of 256, which takes 6 KB in every tenant's client.
    tls.resumption = tokio_rustls::rustls::client::Resumption::in_memory_sessions(TLS_SESSIONS);
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    let builder = match &config.tls_server_name {
        Some(name) => {
            let name = tokio_rustls::rustls::pki_types::ServerName::try_from(name.clone())
                .map_err(|e| {
                    kube::Error::Service(format!("tls-server-name {name:?}: {e}").into())
                })?;
            builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name))
        }
        None => builder,
    };
    Ok(builder
        .enable_http1()
        .enable_http2()
        .wrap_connector(connector))
}

/// A redirect from a remote API server: never followed, an error.
#[derive(Debug, thiserror::Error)]
#[error("the server answered with a redirect (HTTP {0}), which autonodes does not follow")]
pub(crate) struct Redirected(u16);

/// Lets at most [`BODIES_AT_ONCE`] answers of a cluster be read at once (watch streams
/// are not counted: they live as long as the watch), charges every answer's bytes to the
/// memory budget's `share` when there is one (watch streams included), and turns a
/// redirect into an error.
#[derive(Clone)]
struct BodyPermits<S> {
    inner: S,
    permits: Arc<tokio::sync::Semaphore>,
    share: Option<Arc<crate::remote::budget::Share>>,
    /// Keeps the transport this client uses in [`Transports`] while the client lives.
    _transport: Arc<()>,
}

/// The body [`BodyPermits`] hands on.
type PermittedBody = http_body_util::combinators::UnsyncBoxBody<bytes::Bytes, BoxError>;

impl<S, Req, B> tower::Service<http::Request<Req>> for BodyPermits<S>
where
    S: tower::Service<http::Request<Req>, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = http::Response<PermittedBody>;
    type Error = BoxError;
    type Future =
        Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send + 'static>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: http::Request<Req>) -> Self::Future {
        use http_body_util::BodyExt;
        let watch = req
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
        let answer = self.inner.call(req);
        let permits = self.permits.clone();
        let share = self.share.clone();
        Box::pin(async move {
            let resp = answer.await.map_err(Into::into)?;
            if resp.status().is_redirection() {
                return Err(Redirected(resp.status().as_u16()).into());
            }
            let charged = move |b: PermittedBody| match &share {
                Some(share) => share.charged(b, watch).boxed_unsync(),
                None => b,
            };
            if watch {
                return Ok(resp.map(|b| charged(b.map_err(Into::into).boxed_unsync())));
            }
            // Unread, the answer waits in the socket: the server cannot push more.
            let permit = permits.acquire_owned().await?;
            Ok(resp.map(move |b| {
                charged(
                    b.map_err(Into::into)
                        .map_frame(move |frame| {
                            let _held_until_the_body_is_read = &permit;
                            frame
                        })
                        .boxed_unsync(),
                )
            }))
        })
    }
}

/// What a tenant or host is shown of a failure that is not an answer of its API server:
/// refused by the address policy, a TLS failure, or unreachable — nothing else.
pub(crate) fn coarse_error(e: &(dyn std::error::Error + 'static)) -> &'static str {
    let mut tls = false;
    for err in causes(e) {
        if err.downcast_ref::<AddressRefused>().is_some() {
            return "the server's address is refused by autonodes' address policy";
        }
        if err
            .downcast_ref::<http_body_util::LengthLimitError>()
            .is_some()
        {
            return "the server's answer is larger than autonodes accepts";
        }
        if err.downcast_ref::<Redirected>().is_some() {
            return "the server answered with a redirect, which autonodes does not follow";
        }
        if err
            .downcast_ref::<crate::remote::budget::OverBudget>()
            .is_some()
        {
            return "the tenant's answers being read at once passed autonodes' memory budget; read again later";
        }
        let text = err.to_string();
        if text.contains("certificate") || text.contains("tls") || text.contains("TLS") {
            tls = true;
        }
    }
    if tls {
        "the TLS handshake with the server failed"
    } else {
        "the server cannot be reached"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tenant `config` with `token`, and the HTTP client `Transports` would build for it.
    fn tenant_config(token: &str) -> Config {
        let mut config = Config::new("https://10.0.0.1:6443".parse().expect("a URL"));
        config.auth_info.token = Some(secrecy::SecretString::from(token.to_string()));
        config
    }

    fn tenant_http(config: &Config) -> Result<TenantHttp, kube::Error> {
        let connector = GuardedConnector::new(
            Arc::new(AddressPolicy::default()),
            Arc::new(ManagementAddresses::unknown()),
        );
        Ok(
            hyper_util::client::legacy::Client::builder(TokioExecutor::new())
                .build(http2_connector(config, connector)?),
        )
    }

    #[tokio::test]
    async fn namespaces_with_the_same_kubeconfig_share_a_tenant_connection_and_others_do_not() {
        let transports = Transports::default();
        let a = tenant_config("token-a");
        let (_, first) = transports.tenant(&a, || tenant_http(&a)).expect("a client");
        let (_, again) = transports
            .tenant(&a, || panic!("the connection in use is shared"))
            .expect("a client");
        assert!(Arc::ptr_eq(&first, &again));
        let b = tenant_config("token-b");
        let (_, other) = transports.tenant(&b, || tenant_http(&b)).expect("a client");
        assert!(
            !Arc::ptr_eq(&first, &other),
            "another identity, another connection"
        );
        assert_eq!(transports.in_use(), 2);
        drop((first, again));
        assert_eq!(
            transports.in_use(),
            1,
            "a transport no client uses is let go"
        );
        let mut built = false;
        let _ = transports.tenant(&a, || {
            built = true;
            tenant_http(&a)
        });
        assert!(built, "built again once no client used it");
    }

    #[test]
    fn an_answer_over_the_budget_is_told_apart_also_inside_an_io_error() {
        let over = crate::remote::budget::OverBudget {
            which: "all tenants' 64 MiB".into(),
        };
        let wrapped = std::io::Error::other(over);
        assert!(
            coarse_error(&wrapped).contains("memory budget"),
            "{}",
            coarse_error(&wrapped)
        );
        assert!(!coarse_error(&std::io::Error::other("reset")).contains("memory budget"));
    }
    use autonodes_core::address_policy::Cidr;
    use std::sync::atomic::{AtomicU32, Ordering};
    use tower::ServiceExt;

    /// A service answering `429` (with `retry_after`) the first `throttled` times, then
    /// `200`; counts the requests it got.
    fn throttling(
        throttled: u32,
        retry_after: Option<&'static str>,
        seen: Arc<AtomicU32>,
    ) -> impl tower::Service<
        http::Request<kube::client::Body>,
        Response = http::Response<()>,
        Error = BoxError,
        Future = impl Send,
    > + Clone {
        tower::service_fn(move |_req: http::Request<kube::client::Body>| {
            let n = seen.fetch_add(1, Ordering::SeqCst);
            async move {
                let mut r = http::Response::builder().status(if n < throttled { 429 } else { 200 });
                if let Some(v) = retry_after.filter(|_| n < throttled) {
                    r = r.header(http::header::RETRY_AFTER, v);
                }
                Ok::<_, BoxError>(r.body(()).expect("response"))
            }
        })
    }

    async fn send(
        throttled: u32,
        retry_after: Option<&'static str>,
        body: kube::client::Body,
    ) -> (u16, u32, Duration) {
        let seen = Arc::new(AtomicU32::new(0));
        let svc = ServiceBuilder::new()
            .layer(tower::retry::RetryLayer::new(RetryThrottled::default()))
            .service(throttling(throttled, retry_after, seen.clone()));
        let started = tokio::time::Instant::now();
        let req = http::Request::get("/api/v1/nodes")
            .body(body)
            .expect("request");
        let status = svc.oneshot(req).await.expect("answer").status().as_u16();
        (status, seen.load(Ordering::SeqCst), started.elapsed())
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_turned_away_for_load_is_sent_again_after_the_servers_retry_after() {
        let (status, sent, waited) = send(2, Some("2"), kube::client::Body::empty()).await;
        assert_eq!((status, sent), (200, 3));
        assert_eq!(waited, Duration::from_secs(4));
    }

    #[tokio::test(start_paused = true)]
    async fn a_server_asking_for_a_long_wait_gets_the_bounded_one_and_at_most_three_retries() {
        let (status, sent, waited) =
            send(10, Some("3600"), kube::client::Body::from(b"{}".to_vec())).await;
        assert_eq!((status, sent), (429, 4), "the fourth 429 is the answer");
        assert_eq!(waited, autonodes_core::throttle::MAX_WAIT * 3);
    }

    #[tokio::test(start_paused = true)]
    async fn other_answers_are_not_retried() {
        let seen = Arc::new(AtomicU32::new(0));
        let svc = ServiceBuilder::new()
            .layer(tower::retry::RetryLayer::new(RetryThrottled::default()))
            .service(tower::service_fn({
                let seen = seen.clone();
                move |_req: http::Request<kube::client::Body>| {
                    seen.fetch_add(1, Ordering::SeqCst);
                    async move {
                        Ok::<_, BoxError>(
                            http::Response::builder().status(503).body(()).expect("r"),
                        )
                    }
                }
            }));
        let req = http::Request::get("/")
            .body(kube::client::Body::empty())
            .expect("request");
        assert_eq!(
            svc.oneshot(req).await.expect("answer").status().as_u16(),
            503
        );
        assert_eq!(seen.load(Ordering::SeqCst), 1);
    }

    #[derive(Debug, thiserror::Error)]
    #[error("client error (Connect)")]
    struct Wrapper(#[source] Box<dyn std::error::Error + Send + Sync>);

    #[test]
    fn a_failure_before_an_answer_shows_only_refused_tls_or_unreachable() {
        let refused = Wrapper(Box::new(AddressRefused(Refusal::Loopback)));
        assert_eq!(
            coarse_error(&refused),
            "the server's address is refused by autonodes' address policy"
        );
        let closed = Wrapper(Box::new(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "tcp connect error: Connection refused (os error 111)",
        )));
        assert_eq!(coarse_error(&closed), "the server cannot be reached");
        let tls = Wrapper(Box::new(std::io::Error::other(
            "invalid peer certificate: UnknownIssuer",
        )));
        assert_eq!(
            coarse_error(&tls),
            "the TLS handshake with the server failed"
        );
    }

    #[test]
    fn the_first_allowed_address_of_a_name_is_used_and_a_name_with_none_is_refused() {
        let policy = AddressPolicy {
            allow: vec![Cidr::parse("127.0.0.1").expect("cidr")],
            ..AddressPolicy::default()
        };
        let a = |s: &str| s.parse::<SocketAddr>().expect("addr");
        let none = ManagementAddresses::default();
        assert_eq!(
            first_allowed(&policy, &none, [a("[::1]:443"), a("127.0.0.1:443")]),
            Ok(a("127.0.0.1:443"))
        );
        assert_eq!(
            first_allowed(&policy, &none, [a("169.254.169.254:80")]),
            Err(Refusal::LinkLocal)
        );
    }

    #[test]
    fn nothing_is_connected_to_until_the_management_api_server_is_known_and_then_never_it() {
        let policy = AddressPolicy {
            allow: vec![Cidr::parse("127.0.0.1").expect("cidr")],
            ..AddressPolicy::default()
        };
        let a = |s: &str| s.parse::<SocketAddr>().expect("addr");
        let known = ManagementAddresses::unknown();
        assert_eq!(
            first_allowed(&policy, &known, [a("10.0.0.5:443")]),
            Err(Refusal::ManagementApiServerUnknown),
            "fails closed before the first read"
        );
        assert!(known.replace(vec![a("127.0.0.1:6443"), a("10.96.0.1:443")]));
        assert!(
            !known.replace(vec![a("10.96.0.1:443"), a("127.0.0.1:6443")]),
            "the same"
        );
        assert_eq!(
            first_allowed(&policy, &known, [a("10.0.0.5:443")]),
            Ok(a("10.0.0.5:443"))
        );
        assert_eq!(
            first_allowed(&policy, &known, [a("127.0.0.1:8443")]),
            Ok(a("127.0.0.1:8443"))
        );
        // Any spelling of a protected address (IPv4-mapped IPv6 here) is refused; a name
        // with another address is served by that one.
        assert_eq!(
            first_allowed(&policy, &known, [a("[::ffff:10.96.0.1]:443")]),
            Err(Refusal::ManagementApiServer)
        );
        assert_eq!(
            first_allowed(&policy, &known, [a("127.0.0.1:6443"), a("10.0.0.5:6443")]),
            Ok(a("10.0.0.5:6443"))
        );
        // Read again with the server moved: the new address is refused, the old one not.
        assert!(known.replace(vec![a("10.96.0.1:443"), a("10.0.0.7:6443")]));
        assert_eq!(
            first_allowed(&policy, &known, [a("10.0.0.7:6443")]),
            Err(Refusal::ManagementApiServer)
        );
        assert_eq!(
            first_allowed(&policy, &known, [a("127.0.0.1:6443")]),
            Ok(a("127.0.0.1:6443"))
        );
    }

    #[tokio::test]
    async fn a_watch_that_ended_at_its_body_limit_is_told_apart_from_other_watch_errors() {
        use http_body_util::BodyExt;
        let cut = http_body_util::Limited::new(
            http_body_util::Full::new(bytes::Bytes::from(vec![b'x'; 64])),
            16,
        )
        .collect()
        .await
        .expect_err("64 bytes pass a 16-byte limit");
        // As kube's watcher reports it: the body's error in an io::Error of the event
        // reader, in a client error, in a watch error.
        let past_limit = kube::runtime::watcher::Error::WatchFailed(kube::Error::ReadEvents(
            std::io::Error::other(cut),
        ));
        assert!(passed_body_limit(&past_limit));

        let reset = kube::runtime::watcher::Error::WatchFailed(kube::Error::ReadEvents(
            std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset"),
        ));
        assert!(!passed_body_limit(&reset));
        let gone = kube::runtime::watcher::Error::WatchFailed(kube::Error::Api(Box::new(
            kube::core::Status::failure("too old resource version", "Expired").with_code(410),
        )));
        assert!(!passed_body_limit(&gone));
    }
}

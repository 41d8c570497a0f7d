//! The listener: hyper HTTP/1 with a header timeout, connections per
//! client address, the body deadline, HTTPS's headers, and a span per
//! request.

use super::*;

/// The listener's bounds on clients that are slow, silent or many.
pub(super) struct ListenerLimits {
    pub(super) header_timeout: Duration,
    pub(super) max_connections_per_ip: usize,
    /// HTTPS only, when set.
    pub(super) tls: Option<Arc<crate::tls::ListenerTls>>,
}

/// Over HTTPS: every cookie is `Secure` and browsers are told to come back
/// over HTTPS only (HSTS). Over plain HTTP nothing changes.
pub(super) async fn secure_transport(
    State(https): State<bool>,
    request: Request,
    next: Next,
) -> Response {
    let mut response = next.run(request).await;
    if !https {
        return response;
    }
    let headers = response.headers_mut();
    let cookies: Vec<_> = headers
        .get_all(header::SET_COOKIE)
        .iter()
        .cloned()
        .collect();
    if !cookies.is_empty() {
        headers.remove(header::SET_COOKIE);
        for cookie in cookies {
            let secure = [cookie.as_bytes(), b"; Secure"].concat();
            match header::HeaderValue::from_bytes(&secure) {
                Ok(v) => headers.append(header::SET_COOKIE, v),
                Err(_) => headers.append(header::SET_COOKIE, cookie),
            };
        }
    }
    headers.insert(
        header::STRICT_TRANSPORT_SECURITY,
        header::HeaderValue::from_static("max-age=31536000"),
    );
    response
}

/// Serves `app` on `listener` until `shutdown`, then waits for the
/// connections' requests in flight. HTTP/1 only: hyper's HTTP/1
/// connection has the header timeout (axum::serve sets none), which
/// hyper starts as soon as it waits for a request (a new connection, or a
/// kept-alive one after its answer), so silent and idle connections end
/// too. Clients get their address as `ConnectInfo<SocketAddr>`.
pub(super) async fn serve<S>(
    listener: TcpListener,
    app: S,
    limits: ListenerLimits,
    shutdown: CancellationToken,
) -> std::io::Result<()>
where
    S: tower::Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
{
    use tower::{Service, ServiceExt};
    let mut make_service =
        axum::ServiceExt::<Request>::into_make_service_with_connect_info::<SocketAddr>(app);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let open = ConnectionsPerClient::new(limits.max_connections_per_ip);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    loop {
        let (stream, remote) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    accept_failed(e, &shutdown).await;
                    continue;
                }
            },
        };
        let Some(admitted) = open.admit(remote.ip()) else {
            tracing::debug!(client = %remote, "connection refused: too many from this address");
            drop(stream);
            continue;
        };
        let service = match ServiceExt::<SocketAddr>::ready(&mut make_service).await {
            Ok(ready) => ready.call(remote).await,
            Err(never) => match never {},
        };
        let service = match service {
            Ok(service) => service,
            Err(never) => match never {},
        };
        let service = TowerToHyperService::new(
            service.map_request(|r: axum::http::Request<hyper::body::Incoming>| r.map(Body::new)),
        );
        let watcher = graceful.watcher();
        let http = http.clone();
        let tls = limits.tls.as_ref().map(|tls| tls.acceptor());
        let handshake_timeout = limits.header_timeout;
        tokio::spawn(async move {
            let ended = match tls {
                None => {
                    watcher
                        .watch(http.serve_connection(TokioIo::new(stream), service))
                        .await
                }
                // The handshake counts against the header timeout: a
                // client that opens a connection and says nothing is
                // closed as on plain HTTP.
                Some(acceptor) => {
                    match tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => {
                            watcher
                                .watch(http.serve_connection(TokioIo::new(stream), service))
                                .await
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(client = %remote, error = %e, "TLS handshake failed");
                            Ok(())
                        }
                        Err(_) => {
                            tracing::debug!(client = %remote, "TLS handshake timed out");
                            Ok(())
                        }
                    }
                }
            };
            if let Err(e) = ended {
                // Timeouts and clients going away end up here.
                tracing::debug!(client = %remote, error = %e, "connection ended");
            }
            drop(admitted);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// After a failed accept: errors of one connection are that connection's;
/// others (out of file descriptors) would fail again at once, so wait.
pub(super) async fn accept_failed(e: std::io::Error, shutdown: &CancellationToken) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        e.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        return;
    }
    tracing::warn!(error = %e, "accepting a connection failed; retrying in 1s");
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        _ = shutdown.cancelled() => {}
    }
}

/// Open connections per client, at most `max` each. IPv6 clients are
/// counted per /64, the block one host or customer usually has.
pub(super) struct ConnectionsPerClient {
    max: usize,
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// One admitted connection; dropping it gives its place back.
pub(super) struct Admitted {
    client: IpAddr,
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

pub(super) fn client_of(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let prefix = u128::from(v6) & !(u128::MAX >> 64);
            IpAddr::V6(prefix.into())
        }
        v4 => v4,
    }
}

impl ConnectionsPerClient {
    fn new(max: usize) -> Self {
        ConnectionsPerClient {
            max,
            open: Default::default(),
        }
    }

    fn admit(&self, ip: IpAddr) -> Option<Admitted> {
        let client = client_of(ip);
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let count = open.entry(client).or_insert(0);
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(Admitted {
            client,
            open: self.open.clone(),
        })
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = open.get_mut(&self.client) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.client);
            }
        }
    }
}

/// Gives a request's body `timeout` to arrive in full, counted from when
/// its headers were in, and answers 408 if it did not. tower-http's
/// `RequestBodyTimeout` restarts its clock at every chunk, so a body
/// dribbled a byte at a time would never time out, and its error reaches
/// the handler's extractor as a 400; this clock never restarts, and
/// whatever the handler answered to the failed read becomes the 408.
pub(super) async fn body_deadline(
    State(timeout): State<Duration>,
    request: Request,
    next: Next,
) -> Response {
    if request.body().is_end_stream() {
        return next.run(request).await;
    }
    let expired = Arc::new(AtomicBool::new(false));
    let request = request.map(|body| {
        Body::new(DeadlineBody {
            body,
            deadline: Box::pin(tokio::time::sleep(timeout)),
            expired: expired.clone(),
        })
    });
    let response = next.run(request).await;
    if !expired.load(Ordering::Relaxed) {
        return response;
    }
    tracing::info!(?timeout, "request body not received in time");
    (
        StatusCode::REQUEST_TIMEOUT,
        [(header::CONNECTION, "close")],
        axum::Json(crate::api::error::ErrorBody {
            code: "request_timeout",
            detail: format!("the request body did not arrive within {timeout:?}"),
        }),
    )
        .into_response()
}

/// A request body that fails once its deadline has passed.
pub(super) struct DeadlineBody {
    body: Body,
    deadline: Pin<Box<tokio::time::Sleep>>,
    expired: Arc<AtomicBool>,
}

#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive in time")]
pub(super) struct BodyTimedOut;

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        // What has arrived is taken even at the deadline.
        if let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            this.expired.store(true, Ordering::Relaxed);
            return Poll::Ready(Some(Err(axum::Error::new(BodyTimedOut))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// A span per API request (when traces are exported; else nothing), named
/// by its route, a child of the caller's `traceparent` if it sent one.
pub(super) async fn trace_request(request: Request, next: Next) -> Response {
    use tracing::field::Empty;
    use tracing::Instrument;
    let span = tracing::trace_span!(
        target: crate::telemetry::TARGET, "http.request",
        otel.name = Empty, otel.kind = "server",
        http.request.method = %request.method(), http.route = Empty,
        http.response.status_code = Empty,
    );
    if span.is_disabled() {
        return next.run(request).await;
    }
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or("(unmatched)", |m| m.as_str())
        .to_owned();
    span.record(
        "otel.name",
        format!("{} {route}", request.method()).as_str(),
    );
    span.record("http.route", route.as_str());
    let caller = request
        .headers()
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(crate::telemetry::valid_traceparent);
    crate::telemetry::set_parent(&span, caller);
    let response = next.run(request).instrument(span.clone()).await;
    span.record(
        "http.response.status_code",
        i64::from(response.status().as_u16()),
    );
    response
}

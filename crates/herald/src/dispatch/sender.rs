//! One HTTP attempt: sign, POST, read a short excerpt of the answer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use herald_policy::{parse_retry_after, Outcome};
use herald_signing::{signature_header, Secret};
use http::header::{HeaderName, HeaderValue};

use crate::config::Config;
use crate::net::{GuardedResolver, NetworkPolicy, UrlError, WebhookUrl};
use crate::store::ClaimedDelivery;

// The names of the headers every request carries, made once: a name given
// as a string is parsed and checked again on every request.
const WEBHOOK_ID: HeaderName = HeaderName::from_static("webhook-id");
const WEBHOOK_TIMESTAMP: HeaderName = HeaderName::from_static("webhook-timestamp");
const WEBHOOK_SIGNATURE: HeaderName = HeaderName::from_static("webhook-signature");
const SVIX_ID: HeaderName = HeaderName::from_static("svix-id");
const SVIX_TIMESTAMP: HeaderName = HeaderName::from_static("svix-timestamp");
const SVIX_SIGNATURE: HeaderName = HeaderName::from_static("svix-signature");
const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
const X_EVENT_ID: HeaderName = HeaderName::from_static("x-event-id");
const X_EVENT_TYPE: HeaderName = HeaderName::from_static("x-event-type");
const X_ATTEMPT: HeaderName = HeaderName::from_static("x-attempt");
const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const APPLICATION_JSON: HeaderValue = HeaderValue::from_static("application/json");

/// The part of a response body kept in the attempt log, in bytes of text.
pub const EXCERPT_BYTES: usize = 4096;

pub const USER_AGENT: &str = concat!("Herald/", env!("CARGO_PKG_VERSION"));

/// What one attempt observed, ready for the policy and the attempt log.
#[derive(Debug, Clone)]
pub struct Observed {
    pub outcome: Outcome,
    pub status: Option<u16>,
    pub excerpt: String,
    pub error: Option<String>,
    pub duration: Duration,
}

#[derive(Clone)]
pub struct Sender {
    customers: Lane,
    /// For the operator's own webhook URL (see [`Sender::send`]).
    trusted: Lane,
    /// `HERALD_REQUEST_TIMEOUT`: the whole of a send, a name checked
    /// before it included, as the lease is checked to cover it.
    request_timeout: Duration,
    /// `HERALD_SIGNATURE_HEADERS`.
    header_names: herald_signing::HeaderNames,
}

/// A client and the network policy it enforces, both at connect time (its
/// resolver) and before (IP-literal hosts, which skip DNS).
#[derive(Clone)]
struct Lane {
    client: reqwest::Client,
    policy: NetworkPolicy,
    /// The client's proxy resolves target names itself (an `http://` or
    /// `socks5h://` proxy), so the connect-time guard never sees them:
    /// the name is resolved and checked before the request instead.
    proxy_resolves: bool,
    /// The proxy's host: exempt from the guard when the client resolves it,
    /// so a target of that name is checked before the request too.
    proxy_host: Option<String>,
    /// Endpoint URLs this lane has parsed and its policy has passed, by
    /// their text: parsing one costs a few thousand instructions, on every
    /// request, and a URL's verdict cannot change while the process runs
    /// (the policy is fixed at start; a changed URL is another key).
    passed: Arc<Mutex<HashMap<String, WebhookUrl>>>,
}

/// URLs a lane keeps parsed at most; past that it starts afresh.
const PASSED_URLS_KEPT: usize = 4096;

impl Lane {
    fn webhook_url(&self, raw: &str) -> Result<WebhookUrl, UrlError> {
        let passed = || self.passed.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(url) = passed().get(raw) {
            return Ok(url.clone());
        }
        let url = WebhookUrl::parse(raw, self.policy)?;
        let mut kept = passed();
        if kept.len() >= PASSED_URLS_KEPT {
            kept.clear();
        }
        kept.insert(raw.to_owned(), url.clone());
        Ok(url)
    }
}

/// How the lanes reach receivers: the proxy, and the roots they trust.
struct Egress {
    proxy: Option<String>,
    no_proxy: Option<String>,
    roots: Vec<reqwest::Certificate>,
    system_roots: bool,
}

impl Egress {
    fn of(config: &Config) -> anyhow::Result<Self> {
        let roots = match &config.egress.ca_bundle {
            None => Vec::new(),
            Some(path) => {
                let pem = std::fs::read(path).map_err(|e| {
                    anyhow::anyhow!("HERALD_CA_BUNDLE: cannot read {}: {e}", path.display())
                })?;
                let in_words = |e: String| {
                    anyhow::anyhow!(
                        "HERALD_CA_BUNDLE: {} holds no usable certificate: {e}",
                        path.display()
                    )
                };
                crate::tls::certificates_in(&pem)
                    .map_err(in_words)?
                    .iter()
                    .map(|der| {
                        reqwest::Certificate::from_der(der).map_err(|e| in_words(e.to_string()))
                    })
                    .collect::<anyhow::Result<Vec<_>>>()?
            }
        };
        Ok(Egress {
            proxy: config.egress.proxy_url.clone(),
            no_proxy: config.egress.no_proxy.clone(),
            roots,
            system_roots: config.egress.tls_system_roots,
        })
    }
}

impl Lane {
    fn new(
        config: &Config,
        egress: &Egress,
        policy: NetworkPolicy,
        proxied: bool,
    ) -> anyhow::Result<Self> {
        let proxy = egress.proxy.as_deref().filter(|_| proxied);
        let mut builder = reqwest::Client::builder()
            .user_agent(USER_AGENT)
            // Redirects are never followed: a 3xx is the receiver's answer.
            .redirect(reqwest::redirect::Policy::none())
            .http1_only()
            .tcp_nodelay(true)
            .connect_timeout(config.delivery.connect_timeout)
            .timeout(config.delivery.request_timeout)
            .pool_idle_timeout(Duration::from_secs(60))
            // Many endpoints often share one host (a customer's gateway):
            // keeping only one endpoint's worth of idle connections per host
            // made 100 endpoints on one host open 31,552 connections for
            // 50,000 requests.
            .pool_max_idle_per_host(config.delivery.max_in_flight.max(1))
            .tls_built_in_native_certs(egress.system_roots);
        for root in &egress.roots {
            builder = builder.add_root_certificate(root.clone());
        }
        let guarded = GuardedResolver { policy };
        builder = match proxy {
            // Proxies from the environment would bypass the SSRF guard:
            // only the configured one is used.
            None => builder
                .no_proxy()
                .dns_resolver(std::sync::Arc::new(guarded)),
            Some(proxy_url) => {
                let url = url::Url::parse(proxy_url)?;
                let proxy = reqwest::Proxy::all(proxy_url)
                    .map_err(|e| anyhow::anyhow!("HERALD_PROXY_URL: {e}"))?
                    .no_proxy(
                        egress
                            .no_proxy
                            .as_deref()
                            .and_then(reqwest::NoProxy::from_string),
                    );
                // The proxy is the operator's: its own name may be an
                // internal one, so it is resolved without the guard.
                let resolver = ProxyAwareResolver {
                    guarded,
                    proxy_host: url.host_str().unwrap_or_default().to_owned(),
                };
                builder
                    .proxy(proxy)
                    .dns_resolver(std::sync::Arc::new(resolver))
            }
        };
        let proxy_resolves = proxy.is_some_and(|p| !p.starts_with("socks5://"));
        let proxy_host = proxy
            .and_then(|p| url::Url::parse(p).ok())
            .and_then(|u| u.host_str().map(str::to_owned));
        Ok(Lane {
            client: builder.build()?,
            policy,
            proxy_resolves,
            proxy_host,
            passed: Arc::default(),
        })
    }
}

/// Resolves the proxy's own host as it is, every other name (the targets a
/// `socks5://` proxy is handed as addresses, and those in
/// `HERALD_NO_PROXY`) through the guard.
struct ProxyAwareResolver {
    guarded: GuardedResolver,
    proxy_host: String,
}

impl reqwest::dns::Resolve for ProxyAwareResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        if name.as_str().eq_ignore_ascii_case(&self.proxy_host) {
            return GuardedResolver {
                policy: NetworkPolicy {
                    allow_private: true,
                },
            }
            .resolve(name);
        }
        self.guarded.resolve(name)
    }
}

impl Sender {
    pub fn new(config: &Config) -> anyhow::Result<Self> {
        let egress = Egress::of(config)?;
        Ok(Sender {
            customers: Lane::new(
                config,
                &egress,
                NetworkPolicy {
                    allow_private: config.egress.allow_private_networks,
                },
                true,
            )?,
            trusted: Lane::new(
                config,
                &egress,
                NetworkPolicy {
                    allow_private: true,
                },
                config.egress.operator_webhook_via_proxy,
            )?,
            request_timeout: config.delivery.request_timeout,
            header_names: config.delivery.signature_headers,
        })
    }

    /// Sends attempt number `attempt_number` of `d`. Never fails: every
    /// problem becomes an [`Outcome`] the policy can judge.
    /// `trusted`: the operator's own webhook, whose URL comes from the
    /// configuration, not from a customer, and is often an internal
    /// address: the SSRF guard does not apply to it.
    /// `traceparent`: sent as the W3C header unless the endpoint sets one.
    pub async fn send(
        &self,
        d: &ClaimedDelivery,
        attempt_number: u32,
        trusted: bool,
        traceparent: Option<&str>,
    ) -> Observed {
        let started = Instant::now();
        let failed = |error: String| Observed {
            outcome: Outcome::NetworkError,
            status: None,
            excerpt: String::new(),
            error: Some(storable_error(error)),
            duration: started.elapsed(),
        };
        let lane = if trusted {
            &self.trusted
        } else {
            &self.customers
        };
        // IP-literal hosts skip DNS, so the resolver's guard never sees them.
        let url = match lane.webhook_url(&d.url) {
            Ok(url) => url,
            Err(e) => return failed(format!("refused: {e}")),
        };
        // Behind a proxy that resolves names, Herald checks the addresses
        // the name has as Herald sees them (the proxy may see others: see
        // docs/security.md, "Egress proxy").
        let names_proxy = || {
            let proxy = lane.proxy_host.as_deref()?;
            Some(url.host_str()?.eq_ignore_ascii_case(proxy))
        };
        if lane.proxy_resolves || names_proxy() == Some(true) {
            // Within the request's time: a slow resolver besides a whole
            // request would outlive the lease, and another process could
            // send the delivery meanwhile.
            match tokio::time::timeout(self.request_timeout, lane.policy.check_resolved(&url)).await
            {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return failed(format!("refused: {e}")),
                Err(_) => return failed("timed out resolving the endpoint's host".to_owned()),
            }
        }
        // Stored secrets that could not be decrypted: never send unsigned
        // or with garbage.
        if let Some(why) = &d.unreadable {
            return failed(why.clone());
        }
        // The current secret first, then those a rotation keeps valid.
        let secrets = match std::iter::once(&d.secret)
            .chain(d.old_secrets.iter())
            .map(|s| Secret::parse(s))
            .collect::<Result<Vec<_>, _>>()
        {
            Ok(s) => s,
            Err(e) => return failed(format!("endpoint secret unusable: {e}")),
        };
        let timestamp = chrono::Utc::now().timestamp();
        let signature =
            signature_header(&secrets, d.msg_id.as_str(), timestamp, d.payload.as_bytes());
        // Whether the endpoint's own headers set `name`, whatever its case.
        let own = |name: &str| d.headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(name));
        let mut target = url.into_url();
        // A URL's `user:pass@` is sent as Basic authorization; a custom
        // Authorization header is the endpoint saying which credential to
        // send, so it alone goes (both went, the receiver reading either).
        if own("authorization") {
            let _ = target.set_username("");
            let _ = target.set_password(None);
        }
        let mut request = lane
            .client
            .post(target)
            .timeout(self.request_timeout.saturating_sub(started.elapsed()));
        // The endpoint's own headers first: Herald's, set after, win (the
        // API refuses reserved names anyway).
        for (name, value) in &d.headers {
            request = request.header(name.as_str(), value.as_str());
        }
        if let Some(traceparent) = traceparent.filter(|_| !own("traceparent")) {
            request = request.header(TRACEPARENT, traceparent);
        }
        // The endpoint's own Content-Type (for raw payloads) wins.
        if !own("content-type") {
            request = request.header(http::header::CONTENT_TYPE, APPLICATION_JSON);
        }
        let timestamp = timestamp.to_string();
        if self.header_names.svix() {
            request = request
                .header(SVIX_ID, d.msg_id.as_str())
                .header(SVIX_TIMESTAMP, timestamp.as_str())
                .header(SVIX_SIGNATURE, signature.as_str());
        }
        if self.header_names.webhook() {
            request = request
                .header(WEBHOOK_ID, d.msg_id.as_str())
                .header(WEBHOOK_TIMESTAMP, timestamp)
                .header(WEBHOOK_SIGNATURE, signature);
        }
        let request = request
            .header(IDEMPOTENCY_KEY, d.id.as_str())
            // The design brief's receivers read this name for the same key.
            .header(X_EVENT_ID, d.id.as_str())
            .header(X_EVENT_TYPE, d.event_type.as_str())
            .header(X_ATTEMPT, attempt_number.to_string())
            .body(d.payload.clone());
        let result = async {
            let mut response = request.send().await?;
            let status = response.status().as_u16();
            let retry_after = response
                .headers()
                .get(http::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| parse_retry_after(v, SystemTime::now()));
            let mut body = Vec::new();
            let mut whole = false;
            // The status is the receiver's answer: a body that then breaks
            // off, or outlasts the request timeout, is no reason to send
            // again what a 2xx accepted. It is noted with the excerpt.
            let mut broke_off = None;
            while body.len() < EXCERPT_BYTES {
                match response.chunk().await {
                    Ok(Some(chunk)) => body.extend_from_slice(&chunk),
                    Ok(None) => {
                        whole = true;
                        break;
                    }
                    Err(e) => {
                        broke_off = Some(e);
                        break;
                    }
                }
            }
            if body.len() > EXCERPT_BYTES {
                body.truncate(EXCERPT_BYTES);
                whole = false;
            }
            Ok::<_, reqwest::Error>((status, retry_after, excerpt_of(&body, whole), broke_off))
        }
        .await;
        match result {
            Ok((status, retry_after, excerpt, broke_off)) => Observed {
                outcome: Outcome::Response {
                    status,
                    retry_after,
                },
                status: Some(status),
                excerpt,
                error: broke_off.map(|e| {
                    storable_error(format!("the response body broke off: {}", error_chain(&e)))
                }),
                duration: started.elapsed(),
            },
            Err(e) if e.is_timeout() => Observed {
                outcome: Outcome::Timeout,
                status: None,
                excerpt: String::new(),
                error: Some(storable_error(format!("timed out: {}", error_chain(&e)))),
                duration: started.elapsed(),
            },
            Err(e) => failed(error_chain(&e)),
        }
    }
}

/// The attempt log's excerpt of a response body that starts with `body`
/// (`whole`: and ends there). Made storable here, where it comes in, so
/// that no store ever sees a receiver's bytes as they are: invalid UTF-8
/// and NUL become U+FFFD ([`crate::store::storable`]), a character the read
/// cut off at the end is left out rather than mangled, and the text is cut
/// to [`EXCERPT_BYTES`] between characters.
pub fn excerpt_of(body: &[u8], whole: bool) -> String {
    let body = if whole { body } else { without_cut_char(body) };
    let text = String::from_utf8_lossy(body);
    let text = crate::store::storable(&text);
    let mut end = text.len().min(EXCERPT_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

/// `bytes` without the start of a character whose rest was not read.
fn without_cut_char(bytes: &[u8]) -> &[u8] {
    // A UTF-8 character is at most 4 bytes: its start is among the last 3.
    for start in (bytes.len().saturating_sub(3)..bytes.len()).rev() {
        if let Err(e) = std::str::from_utf8(&bytes[start..]) {
            if e.valid_up_to() == 0 && e.error_len().is_none() {
                return &bytes[..start];
            }
        }
    }
    bytes
}

/// Error text as it is stored: it may quote what a receiver sent.
fn storable_error(text: String) -> String {
    match crate::store::storable(&text) {
        std::borrow::Cow::Borrowed(_) => text,
        std::borrow::Cow::Owned(clean) => clean,
    }
}

/// The error and its causes on one line: reqwest's own message alone
/// ("error sending request") does not say what went wrong.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excerpts_are_valid_utf8_without_nul() {
        assert_eq!(excerpt_of(b"ok\0done", true), "ok\u{FFFD}done");
        assert_eq!(excerpt_of(b"\xff\xfe", true), "\u{FFFD}\u{FFFD}");
        assert_eq!(
            excerpt_of("caf\u{e9} \u{2713}".as_bytes(), true),
            "caf\u{e9} \u{2713}"
        );
        assert_eq!(storable_error("a\0b".to_owned()), "a\u{FFFD}b");
    }

    #[test]
    fn excerpts_are_cut_between_characters() {
        // The read stopped inside "€" (3 bytes): it is left out, not mangled.
        let mut body = vec![b'a'; EXCERPT_BYTES - 2];
        body.extend_from_slice(&"\u{20ac}".as_bytes()[..2]);
        let excerpt = excerpt_of(&body, false);
        assert_eq!(excerpt, "a".repeat(EXCERPT_BYTES - 2));
        // A body that really ends that way was sent broken: U+FFFD says so.
        assert!(excerpt_of(&body[EXCERPT_BYTES - 4..], true).ends_with('\u{FFFD}'));
        // Text longer than the limit once decoded (every NUL grows to three
        // bytes) is cut at a character boundary within it.
        let excerpt = excerpt_of(&[0u8; EXCERPT_BYTES], false);
        assert_eq!(excerpt.len(), EXCERPT_BYTES / 3 * 3);
        assert!(excerpt.chars().all(|c| c == '\u{FFFD}'));
        // A character that fits whole is kept.
        let mut body = vec![b'a'; EXCERPT_BYTES - 3];
        body.extend_from_slice("\u{20ac}".as_bytes());
        assert!(excerpt_of(&body, false).ends_with('\u{20ac}'));
    }
}

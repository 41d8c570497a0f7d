//! One HTTP attempt: sign, POST, read a short excerpt of the answer.

use std::time::{Duration, Instant, SystemTime};

use herald_policy::{parse_retry_after, Outcome};
use herald_signing::{signature_header, Secret};

use crate::config::Config;
use crate::net::{GuardedResolver, NetworkPolicy, WebhookUrl};
use crate::store::ClaimedDelivery;

/// The part of a response body kept in the attempt log.
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
}

/// A client and the network policy it enforces, both at connect time (its
/// resolver) and before (IP-literal hosts, which skip DNS).
#[derive(Clone)]
struct Lane {
    client: reqwest::Client,
    policy: NetworkPolicy,
}

impl Lane {
    fn new(config: &Config, policy: NetworkPolicy) -> anyhow::Result<Self> {
        Ok(Lane {
            client: Sender::client(config, policy)?,
            policy,
        })
    }
}

impl Sender {
    pub fn new(config: &Config) -> anyhow::Result<Self> {
        Ok(Sender {
            customers: Lane::new(
                config,
                NetworkPolicy {
                    allow_private: config.allow_private_networks,
                },
            )?,
            trusted: Lane::new(
                config,
                NetworkPolicy {
                    allow_private: true,
                },
            )?,
        })
    }

    fn client(config: &Config, policy: NetworkPolicy) -> anyhow::Result<reqwest::Client> {
        let client = reqwest::Client::builder()
            .user_agent(USER_AGENT)
            // Redirects are never followed: a 3xx is the receiver's answer.
            .redirect(reqwest::redirect::Policy::none())
            // Proxies from the environment would bypass the SSRF guard.
            .no_proxy()
            .http1_only()
            .tcp_nodelay(true)
            .connect_timeout(config.connect_timeout)
            .timeout(config.request_timeout)
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(config.endpoint_concurrency.max(1))
            .dns_resolver(std::sync::Arc::new(GuardedResolver { policy }))
            .build()?;
        Ok(client)
    }

    /// Sends attempt number `attempt_number` of `d`. Never fails: every
    /// problem becomes an [`Outcome`] the policy can judge.
    /// `trusted`: the operator's own webhook, whose URL comes from the
    /// configuration, not from a customer, and is often an internal
    /// address: the SSRF guard does not apply to it.
    pub async fn send(&self, d: &ClaimedDelivery, attempt_number: u32, trusted: bool) -> Observed {
        let started = Instant::now();
        let failed = |error: String| Observed {
            outcome: Outcome::NetworkError,
            status: None,
            excerpt: String::new(),
            error: Some(error),
            duration: started.elapsed(),
        };
        let lane = if trusted {
            &self.trusted
        } else {
            &self.customers
        };
        // IP-literal hosts skip DNS, so the resolver's guard never sees them.
        let url = match WebhookUrl::parse(&d.url, lane.policy) {
            Ok(url) => url,
            Err(e) => return failed(format!("refused: {e}")),
        };
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
        let mut request = lane.client.post(url.into_url());
        // The endpoint's own headers first: Herald's, set after, win (the
        // API refuses reserved names anyway).
        for (name, value) in &d.headers {
            request = request.header(name.as_str(), value.as_str());
        }
        let request = request
            .header(http::header::CONTENT_TYPE, "application/json")
            .header("webhook-id", d.msg_id.as_str())
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .header("idempotency-key", d.id.as_str())
            .header("x-event-type", d.event_type.as_str())
            .header("x-attempt", attempt_number.to_string())
            .body(d.payload.clone());
        let result = async {
            let mut response = request.send().await?;
            let status = response.status().as_u16();
            let retry_after = response
                .headers()
                .get(http::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| parse_retry_after(v, SystemTime::now()));
            let mut excerpt = Vec::new();
            while excerpt.len() < EXCERPT_BYTES {
                match response.chunk().await? {
                    Some(chunk) => excerpt.extend_from_slice(&chunk),
                    None => break,
                }
            }
            excerpt.truncate(EXCERPT_BYTES);
            Ok::<_, reqwest::Error>((status, retry_after, excerpt))
        }
        .await;
        match result {
            Ok((status, retry_after, excerpt)) => Observed {
                outcome: Outcome::Response {
                    status,
                    retry_after,
                },
                status: Some(status),
                excerpt: String::from_utf8_lossy(&excerpt).into_owned(),
                error: None,
                duration: started.elapsed(),
            },
            Err(e) if e.is_timeout() => Observed {
                outcome: Outcome::Timeout,
                status: None,
                excerpt: String::new(),
                error: Some(format!("timed out: {}", error_chain(&e))),
                duration: started.elapsed(),
            },
            Err(e) => failed(error_chain(&e)),
        }
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

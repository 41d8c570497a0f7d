//! Configuration: defaults, then an optional TOML file, then `HERALD_*`
//! environment variables. Every value is validated at start; a bad one stops
//! the process with an error naming the key.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use herald_policy::{parse_duration, parse_schedule, Jitter, RetryPolicy};

/// Every key, its default and what it means. The README's configuration
/// table is this list; the TOML key is the name in lower case without the
/// `HERALD_` prefix (e.g. `retry_schedule`).
pub const KEYS: &[(&str, &str, &str)] = &[
    ("HERALD_LISTEN", "127.0.0.1:8080", "Address the API and dashboard listen on."),
    ("HERALD_PUBLIC_URL", "", "Base URL browsers reach Herald at, e.g. `https://webhooks.example.com`: portal links point there. Empty: `http://` + the listen address."),
    ("HERALD_PORTAL_FRAME_ANCESTORS", "'self'", "CSP `frame-ancestors` of the customer portal: who may embed it in an iframe (`'self'`, `'none'`, or origins such as `https://app.example.com`, space-separated). Another origin makes the portal cookie `SameSite=None; Secure; Partitioned`."),
    ("HERALD_PORTAL_PRIMARY_COLOR", "#0969da", "The portal's primary colour (`#rgb` or `#rrggbb`); a link's `primaryColor` overrides it."),
    ("HERALD_PORTAL_DARK_MODE", "false", "The portal in dark colours; a link's `darkMode` overrides it."),
    ("HERALD_PORTAL_PRODUCT_NAME", "Webhooks", "The name in the portal's header; a link's `productName` overrides it."),
    ("HERALD_HEADER_TIMEOUT", "10s", "A request's headers must arrive within this, counted from the connection's opening or the previous answer (so it also ends idle kept-alive connections); else the connection is closed."),
    ("HERALD_BODY_TIMEOUT", "30s", "A request's body must arrive within this once its headers have; else 408 and the connection is closed."),
    ("HERALD_MAX_CONNECTIONS_PER_IP", "256", "Open connections from one client address at most; more are closed as soon as they are accepted."),
    ("HERALD_LOGIN_FAILURE_LIMIT", "10", "Failed dashboard log-ins one client address may make at once, and as many failed portal links (a limit of their own); then one per second, further failures answered 429. The right token or link is never refused."),
    ("HERALD_DATABASE_URL", "sqlite://herald-data/herald.db", "Store: `sqlite:///abs/path.db`, `sqlite://relative.db` or `postgres://user@host/db`."),
    ("HERALD_DATABASE_SCHEMA", "herald", "PostgreSQL schema holding Herald's tables and functions."),
    ("HERALD_BACKUP_DIR", "", "SQLite: the folder scheduled backups go to (with HERALD_BACKUP_INTERVAL)."),
    ("HERALD_BACKUP_INTERVAL", "", "SQLite: take a backup (as `herald backup`) this often into HERALD_BACKUP_DIR, e.g. `1h`; empty: no scheduled backups."),
    ("HERALD_BACKUP_KEEP", "24", "Scheduled backups kept; the oldest beyond this many are removed."),
    ("HERALD_AUTO_MIGRATE", "true", "At start, apply the store's pending migrations; `false`: refuse to start while any is pending (naming them), so that `herald migrate` runs as a step of the deploy."),
    ("HERALD_DATABASE_WAIT", "30s", "At start, how long to keep retrying a store that cannot be reached (a database still starting) before giving up; `0s`: give up at once."),
    ("HERALD_ADMIN_TOKEN", "(generated)", "Bearer token for /api/*. Unset: generated at first start, printed once, kept hashed in the store; set, it retires a generated one for good."),
    ("HERALD_ADMIN_TOKEN_FILE", "", "A file holding HERALD_ADMIN_TOKEN (Docker and Kubernetes secrets; a trailing newline is ignored). Not together with HERALD_ADMIN_TOKEN."),
    ("HERALD_ENCRYPTION_KEY_FILE", "", "A file holding HERALD_ENCRYPTION_KEY (as HERALD_ADMIN_TOKEN_FILE)."),
    ("HERALD_DATABASE_URL_FILE", "", "A file holding HERALD_DATABASE_URL, for a URL with a password (as HERALD_ADMIN_TOKEN_FILE)."),
    ("HERALD_RETRY_SCHEDULE", "1m,5m,30m,2h,6h,12h", "Delays between attempts; attempts = entries + 1; empty: one attempt, never retried."),
    ("HERALD_JITTER", "full", "full (uniform 0..delay), equal (delay/2..delay) or none."),
    ("HERALD_SIGNATURE_HEADERS", "webhook", "Which names carry the signature: webhook (webhook-id, -timestamp, -signature: Standard Webhooks), svix (svix-id, …: what Svix sends by default) or both."),
    ("HERALD_MAX_AGE", "24h", "No retry once a message is older than this."),
    ("HERALD_REQUEST_TIMEOUT", "30s", "Whole-attempt timeout (connect, send, response headers, excerpt)."),
    ("HERALD_CONNECT_TIMEOUT", "5s", "TCP/TLS connect timeout."),
    ("HERALD_ALLOW_PRIVATE_NETWORKS", "false", "Allow endpoints on loopback, private and other non-global addresses."),
    ("HERALD_DISABLE_AFTER", "50", "Consecutive failed attempts after which an endpoint is disabled (see HERALD_DISABLE_MIN_WINDOW)."),
    ("HERALD_DISABLE_MIN_WINDOW", "1h", "The failing streak must also have lasted this long; `0s` disables on the count alone."),
    ("HERALD_BREAKER_MIN_ATTEMPTS", "20", "Circuit breaker: attempts within HERALD_BREAKER_WINDOW needed before its failure rate counts; 0 turns the breaker off."),
    ("HERALD_BREAKER_WINDOW", "1m", "Circuit breaker: the sliding window its attempts and failures are counted in."),
    ("HERALD_BREAKER_FAILURE_RATE", "50%", "Circuit breaker: failed share of the window's attempts that opens it (`50%` or `0.5`)."),
    ("HERALD_BREAKER_COOLDOWN", "30s", "Circuit breaker: how long it stays open before one probe goes; doubled on each reopening, at most 10m."),
    ("HERALD_OPERATOR_WEBHOOK_URL", "", "When set, Herald sends endpoint.disabled, endpoint.enabled and message.attempt.exhausted events here."),
    ("HERALD_OPERATOR_WEBHOOK_SECRET", "", "`whsec_…` secret signing the operator webhooks; required with HERALD_OPERATOR_WEBHOOK_URL."),
    ("HERALD_METRICS_MAX_ENDPOINTS", "500", "Endpoints labelled by id in /metrics at most; the rest share endpoint=\"other\"."),
    ("HERALD_ENDPOINT_CONCURRENCY", "64", "Requests in flight to one endpoint at most (as many more may wait, claimed); at most 100000."),
    ("HERALD_MAX_IN_FLIGHT", "512", "Requests in flight in this process at most; at most 100000."),
    ("HERALD_LEASE", "2m", "How long a claimed delivery is reserved; must exceed twice the request timeout by more than 1 s."),
    ("HERALD_POLL_INTERVAL", "1s", "Safety-net poll for due deliveries (new messages wake the dispatcher at once)."),
    ("HERALD_RETENTION", "30d", "Delivered messages and their attempts are pruned after this."),
    ("HERALD_DEAD_RETENTION", "90d", "Dead deliveries not replayed are pruned after this."),
    ("HERALD_AUDIT_RETENTION", "365d", "Audit log entries are pruned after this."),
    ("HERALD_ENCRYPTION_KEY", "", "Comma-separated base64 AES-256 keys (32 bytes each, e.g. `openssl rand -base64 32`) that encrypt endpoint secrets and header values at rest; the first encrypts, all decrypt. Empty: stored in plain text (warned at start)."),
    ("HERALD_PAYLOAD_RETENTION", "", "Payloads of messages older than this are erased (the message and its history stay; what was not sent by then is dead, `expunged`). Empty: kept as long as the message."),
    ("HERALD_MAX_HEADERS_PER_ENDPOINT", "20", "Custom request headers one endpoint may have at most."),
    ("HERALD_MAX_ENDPOINTS_PER_APP", "1000", "Endpoints one application may have at most; creating one more answers 422."),
    ("HERALD_AUTH_FAILURE_LIMIT", "10", "Failed API authentications per client address in a burst; past it, each further wrong token's 401 is slowed (up to 1 s), one failure forgiven per second. Valid tokens are never refused."),
    ("HERALD_PROXY_URL", "", "Egress proxy for every customer request: `http://[user:pass@]host:port` (CONNECT for https targets) or `socks5://…` / `socks5h://…` (the proxy resolves names). Empty: direct."),
    ("HERALD_NO_PROXY", "", "Comma-separated hosts, domains (`.example.com`) or CIDR blocks reached directly, not through HERALD_PROXY_URL."),
    ("HERALD_OPERATOR_WEBHOOK_VIA_PROXY", "false", "Send the operator webhook through HERALD_PROXY_URL too (by default it goes directly: it is usually internal)."),
    ("HERALD_CA_BUNDLE", "", "PEM file of extra root certificates trusted for https receivers (an internal CA), beside the built-in roots."),
    ("HERALD_TLS_SYSTEM_ROOTS", "false", "Also trust the operating system's certificate store for https receivers."),
    ("HERALD_TLS_CERT", "", "PEM certificate chain: with HERALD_TLS_KEY, the listener speaks HTTPS only (reloaded on SIGHUP)."),
    ("HERALD_TLS_KEY", "", "PEM private key of HERALD_TLS_CERT."),
    ("HERALD_API_RATE_LIMIT", "0", "Requests per second one caller (admin token, application token, dashboard session) may make, with bursts of as many; beyond: 429 with Retry-After. 0: no limit."),
    ("HERALD_OTLP_ENDPOINT", "", "OpenTelemetry: export traces over OTLP/HTTP (protobuf) to this base URL, e.g. `http://collector:4318`. Empty: no tracing, at no cost."),
    ("HERALD_OTLP_SAMPLE_RATIO", "1.0", "Share of traces exported (0.0-1.0); a caller's sampled traceparent is always followed."),
    ("HERALD_OTLP_SERVICE_NAME", "herald", "`service.name` of the exported spans."),
    ("HERALD_LOG", "info", "Log filter (tracing EnvFilter syntax)."),
];

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{key}: {message}")]
    Invalid { key: String, message: String },
    #[error("cannot read config file {path}: {message}")]
    File { path: PathBuf, message: String },
}

/// Scheduled backups of the SQLite store (`HERALD_BACKUP_*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduledBackups {
    pub dir: std::path::PathBuf,
    pub every: Duration,
    pub keep: usize,
}

/// Every setting, grouped by the part of Herald that reads it; each group
/// is parsed and checked by its own function (`Values::listener` …).
#[derive(Clone, Debug)]
pub struct Config {
    pub listener: ListenerConfig,
    /// `HERALD_PUBLIC_URL` and `HERALD_PORTAL_*`.
    pub portal: PortalConfig,
    pub store: StoreConfig,
    pub delivery: DeliveryConfig,
    pub egress: EgressConfig,
    pub security: SecurityConfig,
    pub retention: RetentionConfig,
    pub telemetry: TelemetryConfig,
}

/// The HTTP listener (`HERALD_LISTEN`, timeouts, connections, TLS).
#[derive(Clone, Debug)]
pub struct ListenerConfig {
    pub listen: SocketAddr,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub max_connections_per_ip: usize,
    /// The listener's certificate chain and key: both or neither.
    pub tls: Option<(PathBuf, PathBuf)>,
}

/// The store (`HERALD_DATABASE_*`, migrations, scheduled backups).
#[derive(Clone, educe::Educe)]
#[educe(Debug)]
pub struct StoreConfig {
    #[educe(Debug(method(redacted_url)))]
    pub database_url: String,
    pub database_schema: String,
    /// `HERALD_DATABASE_WAIT`: how long start-up waits for an unreachable store.
    pub database_wait: Duration,
    /// `HERALD_AUTO_MIGRATE`: whether opening the store applies pending
    /// migrations (else a store with any pending is refused).
    pub auto_migrate: bool,
    /// `HERALD_BACKUP_DIR` / `_INTERVAL` / `_KEEP`: scheduled backups of
    /// the SQLite store; `None`: off.
    pub backups: Option<ScheduledBackups>,
}

/// How deliveries are sent, retried and paced, and when an endpoint is
/// left alone.
#[derive(Clone, educe::Educe)]
#[educe(Debug)]
pub struct DeliveryConfig {
    pub retry: RetryPolicy,
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
    pub disable_after: u32,
    pub disable_min_window: Duration,
    /// `HERALD_BREAKER_*`: the per-endpoint circuit breaker.
    pub breaker: herald_policy::breaker::BreakerRule,
    /// Where operator events go, with their signing secret (`whsec_…`).
    #[educe(Debug(method(webhook_url_only)))]
    pub operator_webhook: Option<(String, String)>,
    pub endpoint_concurrency: usize,
    pub max_in_flight: usize,
    pub lease: Duration,
    pub poll_interval: Duration,
    pub signature_headers: herald_signing::HeaderNames,
}

/// Where outbound requests may go and through what.
#[derive(Clone, educe::Educe)]
#[educe(Debug)]
pub struct EgressConfig {
    pub allow_private_networks: bool,
    /// Egress proxy for customer requests (validated: http, socks5 or socks5h).
    #[educe(Debug(method(redacted_optional_url)))]
    pub proxy_url: Option<String>,
    pub no_proxy: Option<String>,
    pub operator_webhook_via_proxy: bool,
    /// Extra trusted roots for https receivers.
    pub ca_bundle: Option<PathBuf>,
    pub tls_system_roots: bool,
}

/// Who may do what, how hard a caller may push, and the key of what is
/// stored sealed.
#[derive(Clone, educe::Educe)]
#[educe(Debug)]
pub struct SecurityConfig {
    #[educe(Debug(method(redacted_secret)))]
    pub admin_token: Option<String>,
    /// Whether `admin_token` is the store's from now on (it retires a
    /// generated one): false for a process's own passing token, such as
    /// the API `import-svix` starts for itself.
    pub admin_token_kept: bool,
    /// `HERALD_ENCRYPTION_KEY`: seals the stored credentials (empty: none).
    pub encryption_keys: std::sync::Arc<crate::crypto::Keyring>,
    pub login_failure_limit: u32,
    /// Failed API authentications one address may make in a burst.
    pub auth_failure_limit: u32,
    /// Requests per second per caller; 0: unlimited.
    pub api_rate_limit: u32,
    pub max_headers_per_endpoint: usize,
    pub max_endpoints_per_app: usize,
}

/// How long history is kept (`HERALD_*RETENTION`).
#[derive(Clone, Debug)]
pub struct RetentionConfig {
    /// `HERALD_RETENTION`: delivered messages.
    pub retention: Duration,
    /// `HERALD_DEAD_RETENTION`: dead deliveries.
    pub dead_retention: Duration,
    /// `HERALD_AUDIT_RETENTION`: audit log entries.
    pub audit_retention: Duration,
    /// `HERALD_PAYLOAD_RETENTION`, when set.
    pub payload_retention: Option<Duration>,
}

/// Logs, spans and metrics.
#[derive(Clone, Debug)]
pub struct TelemetryConfig {
    pub log: String,
    /// OpenTelemetry export, when configured.
    pub otlp: Option<Otlp>,
    pub metrics_max_endpoints: usize,
}

/// The customer portal's settings.
#[derive(Debug, Clone)]
pub struct PortalConfig {
    /// `HERALD_PUBLIC_URL`, without a trailing slash; None: derived from
    /// the listen address.
    pub public_url: Option<String>,
    /// `HERALD_PORTAL_FRAME_ANCESTORS`, checked.
    pub frame_ancestors: String,
    /// The theme when a link sets none.
    pub theme: Theme,
}

impl PortalConfig {
    /// Whether another site may frame the portal (the cookie must then
    /// cross sites).
    pub fn embeddable_cross_site(&self) -> bool {
        self.frame_ancestors
            .split_ascii_whitespace()
            .any(|source| source != "'self'" && source != "'none'")
    }
}

impl Default for PortalConfig {
    fn default() -> Self {
        PortalConfig {
            public_url: None,
            frame_ancestors: "'self'".to_owned(),
            theme: Theme::default(),
        }
    }
}

/// The portal's look: configuration, overridden by a link's parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Theme {
    /// `#rgb` or `#rrggbb` ([`Theme::valid_color`]).
    pub primary_color: String,
    pub dark_mode: bool,
    pub product_name: String,
}

impl Default for Theme {
    fn default() -> Self {
        Theme {
            primary_color: "#0969da".to_owned(),
            dark_mode: false,
            product_name: "Webhooks".to_owned(),
        }
    }
}

impl Theme {
    /// `#rgb` or `#rrggbb`: all a colour needs, and safe inside a style.
    pub fn valid_color(text: &str) -> bool {
        text.strip_prefix('#').is_some_and(|hex| {
            (hex.len() == 3 || hex.len() == 6) && hex.bytes().all(|b| b.is_ascii_hexdigit())
        })
    }

    /// A product name: 1..=64 characters, no control characters.
    pub fn valid_product_name(text: &str) -> bool {
        let n = text.chars().count();
        (1..=64).contains(&n) && !text.chars().any(char::is_control)
    }
}

/// `HERALD_PORTAL_FRAME_ANCESTORS`: `'self'`, `'none'`, or origins
/// (`scheme://host[:port]`, `*.` allowed at the host's start).
fn frame_ancestors_of(text: &str) -> Result<String, String> {
    let sources: Vec<&str> = text.split_ascii_whitespace().collect();
    if sources.is_empty() {
        return Err("must name at least one source ('self', 'none' or an origin)".into());
    }
    for source in &sources {
        if *source == "'self'" || *source == "'none'" {
            continue;
        }
        let ok = source.split_once("://").is_some_and(|(scheme, rest)| {
            matches!(scheme, "http" | "https")
                && !rest.is_empty()
                && rest.bytes().all(|b| {
                    b.is_ascii_alphanumeric()
                        || matches!(b, b'.' | b'-' | b':' | b'*' | b'[' | b']')
                })
        });
        if !ok {
            return Err(format!(
                "`{source}` is not 'self', 'none' or an origin like https://app.example.com"
            ));
        }
    }
    if sources.len() > 1 && sources.contains(&"'none'") {
        return Err("'none' cannot be combined with other sources".into());
    }
    Ok(sources.join(" "))
}

/// Where and how spans are exported (`HERALD_OTLP_*`).
#[derive(Clone, educe::Educe)]
#[educe(Debug)]
pub struct Otlp {
    #[educe(Debug(method(masked_url)))]
    pub endpoint: String,
    pub sample_ratio: f64,
    pub service_name: String,
}

impl Default for Config {
    fn default() -> Self {
        Config::from_values(&BTreeMap::new())
            .unwrap_or_else(|e| unreachable!("defaults are valid: {e}"))
    }
}

impl Config {
    /// Loads from an optional TOML file, then the process environment.
    pub fn load(file: Option<&Path>) -> Result<Config, ConfigError> {
        let env: BTreeMap<String, String> = std::env::vars().collect();
        Config::load_from(file, &env)
    }

    pub fn load_from(
        file: Option<&Path>,
        env: &BTreeMap<String, String>,
    ) -> Result<Config, ConfigError> {
        let mut values = BTreeMap::new();
        if let Some(path) = file {
            let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
                path: path.to_owned(),
                message: e.to_string(),
            })?;
            values.extend(parse_toml(&text).map_err(|message| ConfigError::File {
                path: path.to_owned(),
                message,
            })?);
        }
        let from_file: Vec<String> = values.keys().cloned().collect();
        for (key, _, _) in KEYS {
            if let Some(v) = env.get(*key) {
                values.insert((*key).to_owned(), v.clone());
            }
        }
        // A value the file gave is named as the file writes it, so the
        // operator looks in the file rather than the environment.
        Config::from_values(&values).map_err(|e| match (e, file) {
            (ConfigError::Invalid { key, message }, Some(path))
                if from_file.contains(&key) && !env.contains_key(&key) =>
            {
                let file_key = key.trim_start_matches("HERALD_").to_ascii_lowercase();
                ConfigError::Invalid {
                    key: format!("`{file_key}` in {} ({key})", path.display()),
                    message,
                }
            }
            (e, _) => e,
        })
    }

    /// Builds a config from `HERALD_*` keys to raw strings; absent keys take
    /// their defaults.
    pub fn from_values(values: &BTreeMap<String, String>) -> Result<Config, ConfigError> {
        let values = &with_secret_files(values)?;
        let v = Values { values };
        Ok(Config {
            listener: v.listener()?,
            portal: v.portal()?,
            store: v.store()?,
            delivery: v.delivery()?,
            egress: v.egress()?,
            security: v.security()?,
            retention: v.retention()?,
            telemetry: v.telemetry()?,
        })
    }
}

/// The raw `HERALD_*` values, read and checked one concern at a time.
struct Values<'a> {
    values: &'a BTreeMap<String, String>,
}

impl Values<'_> {
    /// The value of `key`, or its default.
    fn get(&self, key: &str) -> String {
        self.values.get(key).cloned().unwrap_or_else(|| {
            KEYS.iter()
                .find(|(k, _, _)| *k == key)
                .map(|(_, d, _)| (*d).to_owned())
                .unwrap_or_default()
        })
    }

    fn invalid(&self, key: &str, message: String) -> ConfigError {
        ConfigError::Invalid {
            key: key.to_owned(),
            message,
        }
    }

    fn duration(&self, key: &str) -> Result<Duration, ConfigError> {
        parse_duration(&self.get(key)).map_err(|m| self.invalid(key, m))
    }

    /// A duration that must be longer than zero.
    fn positive_duration(&self, key: &str) -> Result<Duration, ConfigError> {
        match self.duration(key)? {
            d if d.is_zero() => Err(self.invalid(key, "must be greater than zero".into())),
            d => Ok(d),
        }
    }

    fn number(&self, key: &str) -> Result<u64, ConfigError> {
        self.get(key)
            .trim()
            .parse::<u64>()
            .map_err(|_| self.invalid(key, format!("`{}` is not a whole number", self.get(key))))
    }

    /// A whole number of at least 1.
    fn positive(&self, key: &str) -> Result<u64, ConfigError> {
        match self.number(key)? {
            0 => Err(self.invalid(key, "must be at least 1".into())),
            n => Ok(n),
        }
    }

    fn size(&self, key: &str, n: u64) -> Result<usize, ConfigError> {
        usize::try_from(n).map_err(|_| self.invalid(key, "too large".into()))
    }

    /// `n`, refused above `max`: a bound on what the process allocates or
    /// counts per request in flight (a semaphore's permits, a channel's
    /// room), where a huge value would stop delivery instead of starting.
    fn at_most(&self, key: &str, n: u64, max: u64) -> Result<usize, ConfigError> {
        if n > max {
            return Err(self.invalid(key, format!("at most {max}")));
        }
        self.size(key, n)
    }

    fn small(&self, key: &str, n: u64) -> Result<u32, ConfigError> {
        u32::try_from(n).map_err(|_| self.invalid(key, "too large".into()))
    }

    fn boolean(&self, key: &str) -> Result<bool, ConfigError> {
        match self.get(key).trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" => Ok(true),
            "false" | "0" | "no" => Ok(false),
            other => Err(self.invalid(key, format!("`{other}` is not true or false"))),
        }
    }

    fn path(&self, key: &str) -> Option<PathBuf> {
        Some(PathBuf::from(self.get(key).trim())).filter(|p| !p.as_os_str().is_empty())
    }

    fn listener(&self) -> Result<ListenerConfig, ConfigError> {
        let listen = self.get("HERALD_LISTEN").parse().map_err(|_| {
            self.invalid(
                "HERALD_LISTEN",
                format!(
                    "`{}` is not an address like 127.0.0.1:8080",
                    self.get("HERALD_LISTEN")
                ),
            )
        })?;
        let tls = match (self.path("HERALD_TLS_CERT"), self.path("HERALD_TLS_KEY")) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            (Some(_), None) => {
                return Err(self.invalid(
                    "HERALD_TLS_KEY",
                    "required when HERALD_TLS_CERT is set".into(),
                ))
            }
            (None, Some(_)) => {
                return Err(self.invalid(
                    "HERALD_TLS_CERT",
                    "required when HERALD_TLS_KEY is set".into(),
                ))
            }
        };
        Ok(ListenerConfig {
            listen,
            header_timeout: self.positive_duration("HERALD_HEADER_TIMEOUT")?,
            body_timeout: self.positive_duration("HERALD_BODY_TIMEOUT")?,
            max_connections_per_ip: self.size(
                "HERALD_MAX_CONNECTIONS_PER_IP",
                self.positive("HERALD_MAX_CONNECTIONS_PER_IP")?,
            )?,
            tls,
        })
    }

    fn portal(&self) -> Result<PortalConfig, ConfigError> {
        let public_url = match self.get("HERALD_PUBLIC_URL").trim() {
            "" => None,
            text => {
                let parsed = url::Url::parse(text).map_err(|e| {
                    self.invalid("HERALD_PUBLIC_URL", format!("`{text}` is not a URL: {e}"))
                })?;
                if !matches!(parsed.scheme(), "http" | "https")
                    || parsed.host_str().is_none()
                    || parsed.query().is_some()
                {
                    return Err(self.invalid(
                        "HERALD_PUBLIC_URL",
                        format!("`{text}` must be an http(s) URL without a query"),
                    ));
                }
                // The pages answer at /portal and /dashboard, and redirect
                // and set their cookies there: behind a path prefix a link
                // would work once and the session never.
                if parsed.path() != "/" || parsed.fragment().is_some() {
                    return Err(self.invalid(
                        "HERALD_PUBLIC_URL",
                        format!(
                            "`{text}`: Herald is served at the root of its host; a path \
                             (a proxy's prefix) is not supported"
                        ),
                    ));
                }
                Some(text.trim_end_matches('/').to_owned())
            }
        };
        let primary_color = self.get("HERALD_PORTAL_PRIMARY_COLOR");
        if !Theme::valid_color(&primary_color) {
            return Err(self.invalid(
                "HERALD_PORTAL_PRIMARY_COLOR",
                format!("`{primary_color}` is not a colour like #0969da"),
            ));
        }
        let product_name = self.get("HERALD_PORTAL_PRODUCT_NAME");
        if !Theme::valid_product_name(&product_name) {
            return Err(self.invalid(
                "HERALD_PORTAL_PRODUCT_NAME",
                "must be 1-64 characters without control characters".into(),
            ));
        }
        Ok(PortalConfig {
            public_url,
            frame_ancestors: frame_ancestors_of(&self.get("HERALD_PORTAL_FRAME_ANCESTORS"))
                .map_err(|m| self.invalid("HERALD_PORTAL_FRAME_ANCESTORS", m))?,
            theme: Theme {
                primary_color,
                dark_mode: self.boolean("HERALD_PORTAL_DARK_MODE")?,
                product_name,
            },
        })
    }

    fn store(&self) -> Result<StoreConfig, ConfigError> {
        let database_url = self.get("HERALD_DATABASE_URL");
        if !(database_url.starts_with("sqlite:")
            || database_url.starts_with("postgres://")
            || database_url.starts_with("postgresql://"))
        {
            return Err(self.invalid(
                "HERALD_DATABASE_URL",
                format!(
                    "`{}`: expected sqlite://… or postgres://…",
                    redact_url(&database_url)
                ),
            ));
        }
        let database_schema = self.get("HERALD_DATABASE_SCHEMA");
        if let Err(rule) = check_schema_name(&database_schema) {
            return Err(self.invalid("HERALD_DATABASE_SCHEMA", rule));
        }
        // Zero is allowed: fail at once when the store is unreachable.
        let database_wait = self.duration("HERALD_DATABASE_WAIT")?;
        let auto_migrate = self.boolean("HERALD_AUTO_MIGRATE")?;
        let backups = {
            let dir = self.get("HERALD_BACKUP_DIR").trim().to_owned();
            let interval = self.get("HERALD_BACKUP_INTERVAL").trim().to_owned();
            let keep = usize::try_from(self.number("HERALD_BACKUP_KEEP")?)
                .map_err(|_| self.invalid("HERALD_BACKUP_KEEP", "too large".into()))?;
            if keep == 0 {
                return Err(self.invalid("HERALD_BACKUP_KEEP", "must keep at least 1".into()));
            }
            match (dir.is_empty(), interval.is_empty()) {
                (true, true) => None,
                // A folder alone would take no backup and say nothing.
                (false, true) => {
                    return Err(self.invalid(
                        "HERALD_BACKUP_DIR",
                        "takes no backup without HERALD_BACKUP_INTERVAL (e.g. `1h`)".into(),
                    ))
                }
                (true, false) => {
                    return Err(self.invalid(
                        "HERALD_BACKUP_DIR",
                        "must name a folder when HERALD_BACKUP_INTERVAL is set".into(),
                    ))
                }
                (false, false) => {
                    if !self.get("HERALD_DATABASE_URL").starts_with("sqlite:") {
                        return Err(self.invalid(
                            "HERALD_BACKUP_INTERVAL",
                            "scheduled backups are for the SQLite store; on PostgreSQL use \
                             pg_dump or continuous archiving"
                                .into(),
                        ));
                    }
                    let every = parse_duration(&interval)
                        .map_err(|m| self.invalid("HERALD_BACKUP_INTERVAL", m))?;
                    if every.is_zero() {
                        return Err(self.invalid(
                            "HERALD_BACKUP_INTERVAL",
                            "must be longer than 0s (leave it empty for no backups)".into(),
                        ));
                    }
                    Some(ScheduledBackups {
                        dir: std::path::PathBuf::from(dir),
                        every,
                        keep,
                    })
                }
            }
        };
        Ok(StoreConfig {
            database_url,
            database_schema,
            database_wait,
            auto_migrate,
            backups,
        })
    }

    fn delivery(&self) -> Result<DeliveryConfig, ConfigError> {
        let schedule = parse_schedule(&self.get("HERALD_RETRY_SCHEDULE"))
            .map_err(|m| self.invalid("HERALD_RETRY_SCHEDULE", m))?;
        let jitter: Jitter = self
            .get("HERALD_JITTER")
            .parse()
            .map_err(|m| self.invalid("HERALD_JITTER", m))?;
        let max_age = self.positive_duration("HERALD_MAX_AGE")?;
        let request_timeout = self.positive_duration("HERALD_REQUEST_TIMEOUT")?;
        let lease = self.duration("HERALD_LEASE")?;
        // A claimed delivery may wait for one request of its endpoint to
        // finish and then take one request itself: a lease shorter than two
        // attempts would let a second worker send it meanwhile.
        if lease <= request_timeout * 2 + Duration::from_secs(1) {
            return Err(self.invalid(
                "HERALD_LEASE",
                format!("{lease:?} must exceed twice HERALD_REQUEST_TIMEOUT ({request_timeout:?}) by more than 1s"),
            ));
        }
        let breaker = {
            let min_attempts = u32::try_from(self.number("HERALD_BREAKER_MIN_ATTEMPTS")?)
                .map_err(|_| self.invalid("HERALD_BREAKER_MIN_ATTEMPTS", "too large".into()))?;
            let window = self.duration("HERALD_BREAKER_WINDOW")?;
            if window.is_zero() {
                return Err(self.invalid("HERALD_BREAKER_WINDOW", "must be longer than 0".into()));
            }
            let failure_rate =
                herald_policy::breaker::parse_rate(&self.get("HERALD_BREAKER_FAILURE_RATE"))
                    .map_err(|m| self.invalid("HERALD_BREAKER_FAILURE_RATE", m))?;
            let cooldown = self.duration("HERALD_BREAKER_COOLDOWN")?;
            if cooldown.is_zero() {
                return Err(self.invalid("HERALD_BREAKER_COOLDOWN", "must be longer than 0".into()));
            }
            herald_policy::breaker::BreakerRule {
                min_attempts,
                window,
                failure_rate,
                cooldown,
                // Doubling stops at 10 minutes (issue 13), or at the first
                // cooldown when that is longer.
                max_cooldown: cooldown.max(Duration::from_secs(600)),
            }
        };
        let operator_url = self.get("HERALD_OPERATOR_WEBHOOK_URL").trim().to_owned();
        let operator_secret = self.get("HERALD_OPERATOR_WEBHOOK_SECRET").trim().to_owned();
        let operator_webhook = if operator_url.is_empty() {
            if !operator_secret.is_empty() {
                return Err(self.invalid(
                    "HERALD_OPERATOR_WEBHOOK_SECRET",
                    "sends nothing without HERALD_OPERATOR_WEBHOOK_URL".into(),
                ));
            }
            None
        } else {
            match url::Url::parse(&operator_url) {
                Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {}
                _ => {
                    return Err(self.invalid(
                        "HERALD_OPERATOR_WEBHOOK_URL",
                        format!("`{operator_url}` is not an http(s) URL"),
                    ))
                }
            }
            if operator_secret.is_empty() {
                return Err(self.invalid(
                    "HERALD_OPERATOR_WEBHOOK_SECRET",
                    "required when HERALD_OPERATOR_WEBHOOK_URL is set (a whsec_… secret)".into(),
                ));
            }
            herald_signing::Secret::parse(&operator_secret)
                .map_err(|e| self.invalid("HERALD_OPERATOR_WEBHOOK_SECRET", e.to_string()))?;
            Some((operator_url, operator_secret))
        };

        Ok(DeliveryConfig {
            retry: RetryPolicy {
                schedule,
                jitter,
                max_age,
            },
            request_timeout,
            connect_timeout: self.positive_duration("HERALD_CONNECT_TIMEOUT")?,
            disable_after: self.small(
                "HERALD_DISABLE_AFTER",
                self.positive("HERALD_DISABLE_AFTER")?,
            )?,
            disable_min_window: self.duration("HERALD_DISABLE_MIN_WINDOW")?,
            breaker,
            operator_webhook,
            endpoint_concurrency: self.at_most(
                "HERALD_ENDPOINT_CONCURRENCY",
                self.positive("HERALD_ENDPOINT_CONCURRENCY")?,
                MAX_CONCURRENCY,
            )?,
            max_in_flight: self.at_most(
                "HERALD_MAX_IN_FLIGHT",
                self.positive("HERALD_MAX_IN_FLIGHT")?,
                MAX_CONCURRENCY,
            )?,
            lease,
            poll_interval: self.positive_duration("HERALD_POLL_INTERVAL")?,
            signature_headers: self
                .get("HERALD_SIGNATURE_HEADERS")
                .parse()
                .map_err(|m| self.invalid("HERALD_SIGNATURE_HEADERS", m))?,
        })
    }

    fn egress(&self) -> Result<EgressConfig, ConfigError> {
        let proxy_url = proxy_url_of(self.get("HERALD_PROXY_URL").trim())
            .map_err(|m| self.invalid("HERALD_PROXY_URL", m))?;
        let no_proxy = no_proxy_of(self.get("HERALD_NO_PROXY").trim())
            .map_err(|m| self.invalid("HERALD_NO_PROXY", m))?;
        if no_proxy.is_some() && proxy_url.is_none() {
            return Err(self.invalid(
                "HERALD_NO_PROXY",
                "names what goes around HERALD_PROXY_URL, which is not set".into(),
            ));
        }
        Ok(EgressConfig {
            allow_private_networks: self.boolean("HERALD_ALLOW_PRIVATE_NETWORKS")?,
            proxy_url,
            no_proxy,
            operator_webhook_via_proxy: self.boolean("HERALD_OPERATOR_WEBHOOK_VIA_PROXY")?,
            ca_bundle: self.path("HERALD_CA_BUNDLE"),
            tls_system_roots: self.boolean("HERALD_TLS_SYSTEM_ROOTS")?,
        })
    }

    fn security(&self) -> Result<SecurityConfig, ConfigError> {
        let admin_token = self
            .values
            .get("HERALD_ADMIN_TOKEN")
            .filter(|t| !t.is_empty())
            .cloned();
        if let Some(t) = &admin_token {
            if t.len() < 16 {
                return Err(self.invalid(
                    "HERALD_ADMIN_TOKEN",
                    "must be at least 16 characters".into(),
                ));
            }
        }
        Ok(SecurityConfig {
            admin_token,
            admin_token_kept: true,
            encryption_keys: std::sync::Arc::new(
                crate::crypto::Keyring::parse(&self.get("HERALD_ENCRYPTION_KEY"))
                    .map_err(|e| self.invalid("HERALD_ENCRYPTION_KEY", e))?,
            ),
            login_failure_limit: self.small(
                "HERALD_LOGIN_FAILURE_LIMIT",
                self.positive("HERALD_LOGIN_FAILURE_LIMIT")?,
            )?,
            auth_failure_limit: self.small(
                "HERALD_AUTH_FAILURE_LIMIT",
                self.positive("HERALD_AUTH_FAILURE_LIMIT")?,
            )?,
            api_rate_limit: self.small(
                "HERALD_API_RATE_LIMIT",
                self.number("HERALD_API_RATE_LIMIT")?,
            )?,
            max_headers_per_endpoint: self.size(
                "HERALD_MAX_HEADERS_PER_ENDPOINT",
                self.number("HERALD_MAX_HEADERS_PER_ENDPOINT")?,
            )?,
            max_endpoints_per_app: self.size(
                "HERALD_MAX_ENDPOINTS_PER_APP",
                self.positive("HERALD_MAX_ENDPOINTS_PER_APP")?,
            )?,
        })
    }

    fn retention(&self) -> Result<RetentionConfig, ConfigError> {
        let payload_retention = match self.get("HERALD_PAYLOAD_RETENTION").trim() {
            "" => None,
            _ => match self.duration("HERALD_PAYLOAD_RETENTION")? {
                d if d.is_zero() => {
                    return Err(self.invalid(
                        "HERALD_PAYLOAD_RETENTION",
                        "must be greater than zero (leave it empty to keep payloads)".into(),
                    ))
                }
                d => Some(d),
            },
        };
        Ok(RetentionConfig {
            retention: self.positive_duration("HERALD_RETENTION")?,
            dead_retention: self.positive_duration("HERALD_DEAD_RETENTION")?,
            audit_retention: self.positive_duration("HERALD_AUDIT_RETENTION")?,
            payload_retention,
        })
    }

    fn telemetry(&self) -> Result<TelemetryConfig, ConfigError> {
        // The exporter's other settings are checked even without an
        // endpoint: a typo there is found now, not when tracing is turned on.
        let ratio_text = self.get("HERALD_OTLP_SAMPLE_RATIO");
        let sample_ratio = ratio_text
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|r| (0.0..=1.0).contains(r))
            .ok_or_else(|| {
                self.invalid(
                    "HERALD_OTLP_SAMPLE_RATIO",
                    format!("`{ratio_text}` is not a number from 0.0 to 1.0"),
                )
            })?;
        let service_name = self.get("HERALD_OTLP_SERVICE_NAME").trim().to_owned();
        if service_name.is_empty() || service_name.len() > 256 {
            return Err(self.invalid(
                "HERALD_OTLP_SERVICE_NAME",
                "must be 1-256 characters".into(),
            ));
        }
        let otlp_given = self.get("HERALD_OTLP_ENDPOINT").trim().to_owned();
        let otlp = if otlp_given.is_empty() {
            None
        } else {
            // Shown without its password in every error.
            let shown = redact_url(&otlp_given);
            let endpoint = match url::Url::parse(&otlp_given) {
                Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => u,
                _ => {
                    return Err(self.invalid(
                        "HERALD_OTLP_ENDPOINT",
                        format!("`{shown}` is not an http(s) URL"),
                    ))
                }
            };
            // `/v1/traces` is appended to the path: a query or a fragment
            // would swallow it, and the exporter sends no credentials of a
            // URL (OTEL_EXPORTER_OTLP_HEADERS carries them).
            if endpoint.query().is_some() || endpoint.fragment().is_some() {
                return Err(self.invalid(
                    "HERALD_OTLP_ENDPOINT",
                    format!("`{shown}`: a collector's address takes no query or fragment"),
                ));
            }
            if !endpoint.username().is_empty() || endpoint.password().is_some() {
                return Err(self.invalid(
                    "HERALD_OTLP_ENDPOINT",
                    format!(
                        "`{shown}`: credentials in the URL are not sent; give them in \
                         OTEL_EXPORTER_OTLP_HEADERS (e.g. `authorization=Basic …`)"
                    ),
                ));
            }
            Some(Otlp {
                // As parsed: a host name in Unicode is sent in its ASCII form.
                endpoint: endpoint.as_str().trim_end_matches('/').to_owned(),
                sample_ratio,
                service_name,
            })
        };

        let log = self.get("HERALD_LOG");
        // Checked here, so a typo stops the start with the key named rather
        // than logging at a level nobody asked for.
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&log) {
            return Err(self.invalid("HERALD_LOG", format!("`{log}` is not a log filter: {e}")));
        }
        Ok(TelemetryConfig {
            log,
            otlp,
            metrics_max_endpoints: self.size(
                "HERALD_METRICS_MAX_ENDPOINTS",
                self.number("HERALD_METRICS_MAX_ENDPOINTS")?,
            )?,
        })
    }
}

/// The most requests in flight `HERALD_MAX_IN_FLIGHT` and
/// `HERALD_ENDPOINT_CONCURRENCY` may ask for: far beyond what one process's
/// sockets allow, and well within what its semaphores and channels hold.
pub const MAX_CONCURRENCY: u64 = 100_000;

/// A PostgreSQL schema name Herald uses (`HERALD_DATABASE_SCHEMA`,
/// `copy-store --to-schema`): quoted nowhere, so kept to a plain name.
pub fn check_schema_name(name: &str) -> Result<(), String> {
    let plain = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if name.is_empty() || name.len() > 40 || !plain {
        return Err(format!(
            "`{name}`: use 1-40 lower-case letters, digits or '_'"
        ));
    }
    Ok(())
}

// Where values come from besides the environment: `<KEY>_FILE` secrets
// and the TOML file.
mod egress;
mod redact;
mod sources;
use egress::{no_proxy_of, proxy_url_of};
pub use redact::redact_url;
use redact::{masked_url, redacted_optional_url, redacted_secret, redacted_url, webhook_url_only};
pub use sources::FILE_KEYS;
use sources::{parse_toml, with_secret_files};

#[cfg(test)]
mod tests;

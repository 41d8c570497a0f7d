use super::*;

fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn defaults_match_the_documented_table() {
    let c = Config::default();
    assert_eq!(c.listener.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(c.store.database_url, "sqlite://herald-data/herald.db");
    assert_eq!(c.delivery.retry, RetryPolicy::default());
    assert_eq!(c.delivery.request_timeout, Duration::from_secs(30));
    assert_eq!(c.delivery.connect_timeout, Duration::from_secs(5));
    assert!(!c.egress.allow_private_networks);
    assert_eq!(c.delivery.disable_after, 50);
    assert_eq!(c.delivery.disable_min_window, Duration::from_secs(3600));
    assert_eq!(
        c.delivery.breaker,
        herald_policy::breaker::BreakerRule::default()
    );
    assert!(c.delivery.operator_webhook.is_none());
    assert_eq!(c.telemetry.metrics_max_endpoints, 500);
    assert_eq!(c.security.max_headers_per_endpoint, 20);
    assert_eq!(c.security.auth_failure_limit, 10);
    assert!(c.security.admin_token.is_none());
    assert_eq!(c.listener.header_timeout, Duration::from_secs(10));
    assert_eq!(c.listener.body_timeout, Duration::from_secs(30));
    assert_eq!(c.listener.max_connections_per_ip, 256);
    assert_eq!(c.security.login_failure_limit, 10);
}

#[test]
fn environment_overrides_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("herald.toml");
    std::fs::write(&path, "listen = \"0.0.0.0:9000\"\nmax_age = \"2h\"\nretry_schedule = [\"1s\", \"2s\"]\ndisable_after = 7\n")
        .expect("write");
    let c = Config::load_from(
        Some(&path),
        &env(&[("HERALD_MAX_AGE", "3h"), ("HERALD_JITTER", "none")]),
    )
    .expect("valid");
    assert_eq!(c.listener.listen.to_string(), "0.0.0.0:9000");
    assert_eq!(c.delivery.retry.max_age, Duration::from_secs(3 * 3600));
    assert_eq!(
        c.delivery.retry.schedule,
        vec![Duration::from_secs(1), Duration::from_secs(2)]
    );
    assert_eq!(c.delivery.retry.jitter, Jitter::None);
    assert_eq!(c.delivery.disable_after, 7);
}

#[test]
fn invalid_values_name_their_key() {
    for (key, value) in [
        ("HERALD_LISTEN", "nowhere"),
        ("HERALD_DATABASE_URL", "mysql://x"),
        ("HERALD_DATABASE_SCHEMA", "Bad-Name"),
        ("HERALD_RETENTION", "0s"),
        ("HERALD_RETRY_SCHEDULE", "1m,soon"),
        ("HERALD_JITTER", "lots"),
        ("HERALD_MAX_AGE", "24"),
        ("HERALD_REQUEST_TIMEOUT", "0s"),
        ("HERALD_ALLOW_PRIVATE_NETWORKS", "maybe"),
        ("HERALD_DISABLE_AFTER", "-1"),
        ("HERALD_ENDPOINT_CONCURRENCY", "0"),
        ("HERALD_LEASE", "10s"),
        ("HERALD_ADMIN_TOKEN", "short"),
        ("HERALD_MAX_HEADERS_PER_ENDPOINT", "many"),
        ("HERALD_AUTH_FAILURE_LIMIT", "0"),
        ("HERALD_HEADER_TIMEOUT", "0s"),
        ("HERALD_BODY_TIMEOUT", "soon"),
        ("HERALD_MAX_CONNECTIONS_PER_IP", "0"),
        ("HERALD_LOGIN_FAILURE_LIMIT", "none"),
        ("HERALD_LOG", "bogus==="),
        ("HERALD_BACKUP_DIR", "/tmp/backups"),
        (
            "HERALD_OPERATOR_WEBHOOK_SECRET",
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        ),
        ("HERALD_LOG", "[["),
        ("HERALD_ENCRYPTION_KEY", "not-base64!"),
        ("HERALD_ENCRYPTION_KEY", "c2hvcnQ="),
        ("HERALD_BREAKER_MIN_ATTEMPTS", "some"),
        ("HERALD_BREAKER_WINDOW", "0s"),
        ("HERALD_BREAKER_FAILURE_RATE", "150%"),
        ("HERALD_BREAKER_FAILURE_RATE", "half"),
        ("HERALD_BREAKER_COOLDOWN", "soon"),
        // A semaphore of that many permits panicked in the dispatcher:
        // the API went on answering 202 and nothing was ever sent.
        ("HERALD_MAX_IN_FLIGHT", "1000000000000000000"),
        ("HERALD_ENDPOINT_CONCURRENCY", "100001"),
    ] {
        let err = Config::load_from(None, &env(&[(key, value)])).expect_err(key);
        assert!(err.to_string().starts_with(key), "{key}: {err}");
    }
    let c = Config::load_from(None, &env(&[("HERALD_MAX_IN_FLIGHT", "100000")]))
        .expect("the bound itself");
    assert_eq!(c.delivery.max_in_flight, 100_000);
}

#[test]
fn breaker_settings_parse_rates_both_ways_and_zero_turns_it_off() {
    for rate in ["25%", "0.25", " 25 % "] {
        let c =
            Config::load_from(None, &env(&[("HERALD_BREAKER_FAILURE_RATE", rate)])).expect(rate);
        assert_eq!(c.delivery.breaker.failure_rate, 0.25, "{rate}");
    }
    let c = Config::load_from(
        None,
        &env(&[
            ("HERALD_BREAKER_MIN_ATTEMPTS", "0"),
            ("HERALD_BREAKER_COOLDOWN", "20m"),
        ]),
    )
    .expect("valid");
    assert!(c.delivery.breaker.is_off());
    assert_eq!(c.delivery.breaker.max_cooldown, Duration::from_secs(1200));
    // A rate of 0 would open the breaker of an endpoint that never fails.
    for zero in ["0", "0%"] {
        let refused = Config::load_from(None, &env(&[("HERALD_BREAKER_FAILURE_RATE", zero)]))
            .expect_err(zero)
            .to_string();
        assert!(refused.contains("HERALD_BREAKER_FAILURE_RATE"), "{refused}");
    }
}

#[test]
fn encryption_keys_parse_and_are_redacted() {
    let k1 = "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=";
    let k2 = "AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI=";
    let c = Config::load_from(
        None,
        &env(&[("HERALD_ENCRYPTION_KEY", &format!("{k1},{k2}"))]),
    )
    .expect("two keys");
    assert_eq!(c.security.encryption_keys.len(), 2);
    let shown = format!("{c:?}");
    assert!(!shown.contains(k1) && !shown.contains(k2), "{shown}");
    assert!(!Config::default().security.encryption_keys.is_enabled());
}

#[test]
fn portal_settings_are_checked_and_name_their_key() {
    for (key, value) in [
        ("HERALD_PORTAL_PRIMARY_COLOR", "red"),
        ("HERALD_PORTAL_PRIMARY_COLOR", "#12345"),
        ("HERALD_PORTAL_FRAME_ANCESTORS", "javascript:alert(1)"),
        ("HERALD_PORTAL_FRAME_ANCESTORS", "'none' https://a.example"),
        (
            "HERALD_PORTAL_FRAME_ANCESTORS",
            "https://a.example; script-src *",
        ),
        ("HERALD_PORTAL_PRODUCT_NAME", ""),
        ("HERALD_PORTAL_DARK_MODE", "dim"),
        ("HERALD_PUBLIC_URL", "ftp://x.example"),
        ("HERALD_PUBLIC_URL", "https://x.example/?a=1"),
        ("HERALD_PUBLIC_URL", "https://x.example/herald/"),
    ] {
        let err = Config::from_values(&env(&[(key, value)])).expect_err(value);
        assert!(err.to_string().starts_with(key), "{key}={value}: {err}");
    }
    let c = Config::from_values(&env(&[
        (
            "HERALD_PORTAL_FRAME_ANCESTORS",
            "'self'  https://app.example.com",
        ),
        ("HERALD_PUBLIC_URL", "https://hooks.example.com/"),
    ]))
    .expect("valid");
    assert_eq!(c.portal.frame_ancestors, "'self' https://app.example.com");
    assert!(c.portal.embeddable_cross_site());
    assert_eq!(
        c.portal.public_url.as_deref(),
        Some("https://hooks.example.com")
    );
    assert!(!Config::default().portal.embeddable_cross_site());
}

/// Every setting stands in the example file (set to its default, or
/// commented out where it has none), so the file docs/configuration.md
/// points to cannot fall behind `KEYS`.
#[test]
fn the_example_file_names_every_setting() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../herald.example.toml");
    let text = std::fs::read_to_string(&path).expect("read the example");
    let keys: Vec<String> = text
        .lines()
        .map(|l| l.trim_start_matches('#').trim_start())
        .filter_map(|l| l.split_once(" =").map(|(k, _)| k.trim().to_owned()))
        .collect();
    let missing: Vec<&str> = crate::config::KEYS
        .iter()
        .map(|(env, _, _)| *env)
        .filter(|env| {
            let key = env.trim_start_matches("HERALD_").to_ascii_lowercase();
            !keys.contains(&key)
        })
        .collect();
    assert!(
        missing.is_empty(),
        "not in herald.example.toml: {missing:?}"
    );
}

#[test]
fn the_example_file_parses_to_the_defaults() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../herald.example.toml");
    let c = Config::load_from(Some(&path), &BTreeMap::new()).expect("example is valid");
    let d = Config::default();
    assert_eq!(c.delivery.breaker, d.delivery.breaker);
    assert_eq!(c.listener.listen, d.listener.listen);
    assert_eq!(c.store.database_url, d.store.database_url);
    assert_eq!(c.delivery.retry, d.delivery.retry);
    assert_eq!(
        (
            c.listener.header_timeout,
            c.listener.body_timeout,
            c.listener.max_connections_per_ip,
            c.security.login_failure_limit
        ),
        (
            d.listener.header_timeout,
            d.listener.body_timeout,
            d.listener.max_connections_per_ip,
            d.security.login_failure_limit
        )
    );
    assert_eq!(
        (
            c.delivery.request_timeout,
            c.delivery.connect_timeout,
            c.delivery.lease,
            c.delivery.poll_interval
        ),
        (
            d.delivery.request_timeout,
            d.delivery.connect_timeout,
            d.delivery.lease,
            d.delivery.poll_interval
        )
    );
    assert_eq!(
        (
            c.egress.allow_private_networks,
            c.delivery.disable_after,
            c.delivery.endpoint_concurrency,
            c.delivery.max_in_flight
        ),
        (
            d.egress.allow_private_networks,
            d.delivery.disable_after,
            d.delivery.endpoint_concurrency,
            d.delivery.max_in_flight
        )
    );
}

/// Userinfo in the operator webhook's URL is a credential: the
/// configuration's Debug (what a start-up error or a debug log prints)
/// masks it, as the start-up log lines do.
#[test]
fn configured_url_credentials_stay_out_of_debug() {
    let c = Config::from_values(&env(&[
        (
            "HERALD_OPERATOR_WEBHOOK_URL",
            "https://opuser:oppass123@ops.example.com/hook",
        ),
        (
            "HERALD_OPERATOR_WEBHOOK_SECRET",
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        ),
    ]))
    .expect("valid");
    let shown = format!("{c:?}");
    for credential in ["opuser", "oppass123", "MfKQ9r8"] {
        assert!(!shown.contains(credential), "{credential} in {shown}");
    }
    assert!(shown.contains("ops.example.com"), "the host stays: {shown}");
}

/// The collector's URL: what the exporter would not honour (credentials,
/// which it never sends; a query or fragment, which `/v1/traces` would be
/// appended to) is refused, naming the key and never showing a password;
/// a Unicode host is sent in its ASCII form. The exporter's other settings
/// are checked without an endpoint too.
#[test]
fn the_otlp_collector_url_is_taken_only_as_the_exporter_uses_it() {
    for bad in [
        "http://otuser:otkey987@collector:4318",
        "http://u:otkey987@bad host:4318",
        "grpc://u:otkey987@collector:4317",
        "http://collector:4318?tenant=a",
        "http://collector:4318/#x",
    ] {
        let err = Config::from_values(&env(&[("HERALD_OTLP_ENDPOINT", bad)]))
            .expect_err(bad)
            .to_string();
        assert!(err.starts_with("HERALD_OTLP_ENDPOINT"), "{err}");
        assert!(!err.contains("otkey987"), "{err}");
    }
    let c = Config::from_values(&env(&[(
        "HERALD_OTLP_ENDPOINT",
        "http://bücher.example:4318/",
    )]))
    .expect("valid");
    assert_eq!(
        c.telemetry.otlp.map(|o| o.endpoint).as_deref(),
        Some("http://xn--bcher-kva.example:4318")
    );
    for (key, value) in [
        ("HERALD_OTLP_SAMPLE_RATIO", "2"),
        ("HERALD_OTLP_SERVICE_NAME", " "),
    ] {
        let err = Config::from_values(&env(&[(key, value)]))
            .expect_err(key)
            .to_string();
        assert!(err.starts_with(key), "{err}");
    }
}

#[test]
fn proxy_and_tls_settings_are_checked() {
    let c = Config::from_values(&env(&[(
        "HERALD_PROXY_URL",
        "http://user:secret@proxy.internal:3128",
    )]))
    .expect("valid");
    assert_eq!(
        c.egress.proxy_url.as_deref(),
        Some("http://user:secret@proxy.internal:3128")
    );
    assert!(!format!("{c:?}").contains("secret"), "redacted in Debug");
    for bad in [
        "https://proxy:3128",
        "ftp://proxy:21",
        "proxy:3128",
        "http://proxy:3128/path",
        "socks5://",
    ] {
        let err = Config::from_values(&env(&[("HERALD_PROXY_URL", bad)]))
            .err()
            .unwrap_or_else(|| panic!("{bad} accepted"));
        assert!(err.to_string().starts_with("HERALD_PROXY_URL"), "{err}");
    }
    assert!(Config::from_values(&env(&[("HERALD_PROXY_URL", "socks5h://127.0.0.1:1080")])).is_ok());
    let with_proxy = |no_proxy: &str| {
        Config::from_values(&env(&[
            ("HERALD_PROXY_URL", "http://proxy.internal:3128"),
            ("HERALD_NO_PROXY", no_proxy),
        ]))
    };
    let good = "localhost, .internal.example, api.example.com,10.0.0.0/8,::1,fd00::/8,*,";
    let c = with_proxy(good).expect("every form the proxy client matches");
    assert_eq!(c.egress.no_proxy.as_deref(), Some(good));
    // Each would never match a host, so its traffic would go through the
    // proxy though the operator meant it not to.
    for (bad, said) in [
        ("*.example.com", "`.example.com`"),
        ("api.example.com:8443", "no port"),
        ("http://api.example.com", "no scheme"),
        ("[::1]", "without brackets"),
        ("10.0.0.0/33", "0 to 32"),
        ("host/8", "CIDR"),
        ("bad host", "not a host name"),
    ] {
        let err = with_proxy(bad).expect_err(bad).to_string();
        assert!(err.starts_with("HERALD_NO_PROXY"), "{err}");
        assert!(err.contains(said), "{bad}: {err}");
    }
    let err = Config::from_values(&env(&[("HERALD_NO_PROXY", "localhost")]))
        .expect_err("no proxy to go around");
    assert!(
        err.to_string()
            .contains("HERALD_PROXY_URL, which is not set"),
        "{err}"
    );
    let err =
        Config::from_values(&env(&[("HERALD_TLS_CERT", "/x.pem")])).expect_err("key required");
    assert!(err.to_string().starts_with("HERALD_TLS_KEY"), "{err}");
    let err = Config::from_values(&env(&[("HERALD_API_RATE_LIMIT", "-1")])).expect_err("refused");
    assert!(
        err.to_string().starts_with("HERALD_API_RATE_LIMIT"),
        "{err}"
    );
    assert_eq!(Config::default().security.api_rate_limit, 0);
}

#[test]
fn unknown_file_keys_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("herald.toml");
    std::fs::write(&path, "retry_shedule = \"1m\"\n").expect("write");
    let err = Config::load_from(Some(&path), &BTreeMap::new()).expect_err("typo");
    assert!(err.to_string().contains("retry_shedule"), "{err}");
}

#[test]
fn a_bad_value_from_the_file_is_named_as_the_file_writes_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("herald.toml");
    std::fs::write(&path, "listen = \"nowhere\"\nmax_in_flight = 0\n").expect("write");
    let err = Config::load_from(Some(&path), &BTreeMap::new())
        .expect_err("bad listen")
        .to_string();
    assert!(
        err.starts_with(&format!("`listen` in {} (HERALD_LISTEN)", path.display())),
        "{err}"
    );
    // The environment overrides the file: a bad value there is named as
    // the variable, and the file's own bad value is not reached first.
    let err = Config::load_from(
        Some(&path),
        &env(&[
            ("HERALD_LISTEN", "elsewhere"),
            ("HERALD_MAX_IN_FLIGHT", "8"),
        ]),
    )
    .expect_err("bad listen")
    .to_string();
    assert!(err.starts_with("HERALD_LISTEN:"), "{err}");
}

#[test]
fn secrets_come_from_files_named_by_the_file_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let token = dir.path().join("token");
    std::fs::write(&token, "from-a-file-token-0123456789abcdef\n").expect("write");
    let key = dir.path().join("key");
    std::fs::write(&key, format!("{}\n", base64_key())).expect("write");
    let url = dir.path().join("url");
    std::fs::write(&url, "sqlite://from-a-file.db").expect("write");
    let values: BTreeMap<String, String> = [
        ("HERALD_ADMIN_TOKEN_FILE", token.display().to_string()),
        ("HERALD_ENCRYPTION_KEY_FILE", key.display().to_string()),
        ("HERALD_DATABASE_URL_FILE", url.display().to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let c = Config::from_values(&values).expect("valid");
    assert_eq!(
        c.security.admin_token.as_deref(),
        Some("from-a-file-token-0123456789abcdef")
    );
    assert!(c.security.encryption_keys.is_enabled());
    assert_eq!(c.store.database_url, "sqlite://from-a-file.db");

    let refused = |extra: &[(&str, &str)]| -> String {
        let mut v = values.clone();
        for (k, x) in extra {
            v.insert((*k).to_owned(), (*x).to_owned());
        }
        Config::from_values(&v).expect_err("refused").to_string()
    };
    let both = refused(&[("HERALD_ADMIN_TOKEN", "also-given-directly")]);
    assert!(both.contains("HERALD_ADMIN_TOKEN_FILE"), "{both}");
    assert!(!both.contains("from-a-file"), "no secret in errors: {both}");
    let missing = refused(&[("HERALD_ENCRYPTION_KEY_FILE", "/nonexistent/key")]);
    assert!(missing.contains("HERALD_ENCRYPTION_KEY_FILE"), "{missing}");
    assert!(missing.contains("/nonexistent/key"), "{missing}");
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "\n").expect("write");
    let empty_err = refused(&[("HERALD_DATABASE_URL_FILE", empty.to_str().expect("path"))]);
    assert!(empty_err.contains("is empty"), "{empty_err}");
}

fn base64_key() -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode([7u8; 32])
}

/// A URL that does not parse (a typo in the port) is shown without its
/// credentials all the same, for the database and the proxy alike.
#[test]
fn urls_that_do_not_parse_are_shown_without_their_password() {
    let typo = "postgres://herald:FILEDBPASSWORD@db.internal:54321x/herald";
    assert_eq!(
        redact_url(typo),
        "postgres://redacted@db.internal:54321x/herald"
    );
    assert_eq!(
        redact_url("postgres://herald:pw@db:5432/herald"),
        "postgres://herald:redacted@db:5432/herald"
    );
    assert_eq!(redact_url("sqlite://./herald.db"), "sqlite://./herald.db");
    assert_eq!(redact_url("admin:pw@herald:8080"), "redacted@herald:8080");
    assert_eq!(redact_url("sqlite::memory:"), "sqlite::memory:");
    let err = Config::from_values(&env(&[
        ("HERALD_ADMIN_TOKEN", "x".repeat(32).as_str()),
        ("HERALD_PROXY_URL", "http://puser:PROXYPASS@proxy:99999"),
    ]))
    .expect_err("a bad port");
    assert!(!err.to_string().contains("PROXYPASS"), "{err}");
}

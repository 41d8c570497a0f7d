//! `/metrics` and `/readyz`: a known, stepped run scraped over HTTP.
//!
//! The recorder is global to the process and tests run in parallel, so
//! per-endpoint series are checked by the endpoint ids a test made itself,
//! and the one unlabelled counter (messages ingested) exactly only in the
//! real binary, where nothing else runs.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Instant;

use herald::dispatch::BatchReport;
use serde_json::json;

use crate::helpers::*;

/// One sample of the text format: its labels and its value.
type Sample = (BTreeMap<String, String>, f64);

/// The samples of metric `name` in a Prometheus text exposition.
fn samples(text: &str, name: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|line| {
            let (series, value) = match line.find('{') {
                Some(open) => {
                    let (labels, rest) = parse_labels(&line[open + 1..]);
                    ((&line[..open], labels), rest)
                }
                None => {
                    let (n, rest) = line.split_once(' ')?;
                    ((n, BTreeMap::new()), rest)
                }
            };
            if series.0 != name {
                return None;
            }
            let value = value.split_whitespace().next()?;
            let value: f64 = value
                .parse()
                .unwrap_or_else(|_| panic!("not a number in {line:?}"));
            Some((series.1, value))
        })
        .collect()
}

/// Parses `k="v",k2="v2"}` (escapes included); returns the labels and
/// what follows the closing brace.
fn parse_labels(s: &str) -> (BTreeMap<String, String>, &str) {
    let mut labels = BTreeMap::new();
    let mut rest = s;
    loop {
        rest = rest.trim_start_matches(',');
        if let Some(after) = rest.strip_prefix('}') {
            return (labels, after);
        }
        let (key, after_eq) = rest.split_once("=\"").expect("label key=\"");
        let mut value = String::new();
        let mut chars = after_eq.char_indices();
        let end = loop {
            match chars.next().expect("closing quote") {
                (i, '"') => break i,
                (_, '\\') => match chars.next().expect("escaped char").1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        labels.insert(key.to_owned(), value);
        rest = &after_eq[end + 1..];
    }
}

/// The value of `name` with exactly the labels `labels`, if that series
/// exists.
fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let want: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let found: Vec<f64> = samples(text, name)
        .into_iter()
        .filter(|(l, _)| *l == want)
        .map(|(_, v)| v)
        .collect();
    assert!(found.len() <= 1, "{name}{labels:?} appears twice:\n{text}");
    found.first().copied()
}

/// Like [`value`], for a series that must exist.
fn must(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    value(text, name, labels).unwrap_or_else(|| panic!("no sample {name}{labels:?} in:\n{text}"))
}

/// GET /metrics without any token, as Prometheus scrapes.
async fn scrape(base: &str) -> String {
    let resp = reqwest::Client::new()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("herald answers /metrics");
    assert_eq!(resp.status(), 200, "no token needed for /metrics");
    let content_type = header_text(resp.headers(), "content-type");
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    resp.text().await.expect("metrics text")
}

fn id_of(endpoint: &serde_json::Value) -> String {
    endpoint["id"].as_str().expect("endpoint id").to_owned()
}

/// Steps the dispatcher until nothing is claimable; sums the reports.
async fn run_to_quiet(app: &TestApp) -> BatchReport {
    let mut total = BatchReport::default();
    for _ in 0..10 {
        let r = app.step().await;
        if r.claimed == 0 {
            return total;
        }
        total.claimed += r.claimed;
        total.delivered += r.delivered;
        total.retried += r.retried;
        total.dead += r.dead;
    }
    panic!("still claiming after 10 batches: {total:?}");
}

#[tokio::test]
async fn a_known_run_is_counted_exactly_and_the_gauges_follow_the_store() {
    let app = spawn_stepped(&[]).await;
    let ok_rx = Receiver::start().await;
    ok_rx.script([Reply::status(500)]); // one attempt retried, then 200s
    let bad_rx = Receiver::start().await;
    bad_rx.always(Reply::status(400)); // permanent: dead at once
    let ok_app = app.create_app().await;
    let ok_ep = id_of(
        &app.create_endpoint(&ok_app, &ok_rx.url("/"), json!({}))
            .await,
    );
    let bad_app = app.create_app().await;
    let bad_ep = id_of(
        &app.create_endpoint(&bad_app, &bad_rx.url("/"), json!({}))
            .await,
    );

    let before = scrape(&app.base).await;
    let ingested_before = value(&before, "herald_messages_ingested_total", &[]).unwrap_or(0.0);
    assert_eq!(
        must(&before, "herald_deliveries", &[("state", "pending")]),
        0.0
    );
    assert_eq!(
        value(
            &before,
            "herald_attempts_total",
            &[("endpoint", &ok_ep), ("outcome", "success")]
        ),
        None
    );

    for i in 0..3 {
        app.send_message(&ok_app, "order.paid", json!({"i": i}))
            .await;
    }
    for i in 0..2 {
        app.send_message(&bad_app, "order.paid", json!({"i": i}))
            .await;
    }
    // Within a second of the last scrape, yet re-read: ingest changed it.
    let queued = scrape(&app.base).await;
    assert_eq!(
        must(&queued, "herald_deliveries", &[("state", "pending")]),
        5.0
    );
    assert_eq!(must(&queued, "herald_due_backlog", &[]), 5.0);
    assert!(must(&queued, "herald_oldest_due_age_seconds", &[]) >= 0.0);
    assert!(
        must(&queued, "herald_messages_ingested_total", &[]) >= ingested_before + 5.0,
        "other tests may ingest meanwhile; these five are counted"
    );

    let report = run_to_quiet(&app).await;
    assert_eq!((report.delivered, report.retried, report.dead), (3, 1, 2));

    let after = scrape(&app.base).await;
    let attempts = |ep: &str, outcome: &str| {
        value(
            &after,
            "herald_attempts_total",
            &[("endpoint", ep), ("outcome", outcome)],
        )
    };
    assert_eq!(attempts(&ok_ep, "success"), Some(3.0));
    assert_eq!(attempts(&ok_ep, "retry"), Some(1.0));
    assert_eq!(attempts(&ok_ep, "dead"), None);
    assert_eq!(attempts(&bad_ep, "dead"), Some(2.0));
    assert_eq!(attempts(&bad_ep, "success"), None);
    assert_eq!(attempts(&bad_ep, "retry"), None);

    for (ep, n) in [(&ok_ep, 4.0), (&bad_ep, 2.0)] {
        let one = [("endpoint", ep.as_str())];
        assert_eq!(
            must(&after, "herald_attempt_duration_seconds_count", &one),
            n
        );
        assert!(must(&after, "herald_attempt_duration_seconds_sum", &one) > 0.0);
        let bucket = |le: &str| {
            must(
                &after,
                "herald_attempt_duration_seconds_bucket",
                &[("endpoint", ep.as_str()), ("le", le)],
            )
        };
        // Local attempts under the 2 s request timeout: all in the 30 s
        // bucket; the smallest bucket is there too.
        assert_eq!(bucket("+Inf"), n);
        assert_eq!(bucket("30"), n);
        assert!(bucket("0.01") <= n);
    }

    // A fresh database: exactly this run's state.
    let state = |s: &str| must(&after, "herald_deliveries", &[("state", s)]);
    assert_eq!(state("pending"), 0.0);
    assert_eq!(state("delivering"), 0.0);
    assert_eq!(state("dead"), 2.0);
    assert_eq!(must(&after, "herald_due_backlog", &[]), 0.0);
    assert_eq!(must(&after, "herald_oldest_due_age_seconds", &[]), 0.0);
    assert_eq!(must(&after, "herald_endpoints_disabled", &[]), 0.0);
    assert!(
        after.contains("# HELP herald_attempts_total "),
        "metrics are described:\n{after}"
    );

    let resp = reqwest::get(app.url("/readyz")).await.expect("readyz");
    assert_eq!(resp.status(), 200);
    let body: serde_json::Value = resp.json().await.expect("json");
    assert_eq!(body, json!({"status": "ready"}));
    app.shutdown().await;
}

#[tokio::test]
async fn endpoints_past_the_label_bound_are_counted_as_other() {
    let app = spawn_stepped(&[("HERALD_METRICS_MAX_ENDPOINTS", "1")]).await;
    let rx = Receiver::start().await;
    let app_id = app.create_app().await;
    let first = id_of(&app.create_endpoint(&app_id, &rx.url("/a"), json!({})).await);
    let other_before = value(
        &scrape(&app.base).await,
        "herald_attempts_total",
        &[("endpoint", "other"), ("outcome", "success")],
    )
    .unwrap_or(0.0);

    // The first endpoint with an attempt takes the one label there is...
    app.send_message(&app_id, "a", json!({})).await;
    assert_eq!(run_to_quiet(&app).await.delivered, 1);
    // ...and keeps it; the second one, attempted after it, is "other".
    let second = id_of(&app.create_endpoint(&app_id, &rx.url("/b"), json!({})).await);
    app.send_message(&app_id, "b", json!({})).await;
    assert_eq!(run_to_quiet(&app).await.delivered, 2);

    let text = scrape(&app.base).await;
    let success = |ep: &str| {
        value(
            &text,
            "herald_attempts_total",
            &[("endpoint", ep), ("outcome", "success")],
        )
    };
    assert_eq!(success(&first), Some(2.0));
    assert_eq!(success(&second), None);
    // Only this test sets a bound this low, so nothing else counts here.
    assert_eq!(success("other"), Some(other_before + 1.0));
    app.shutdown().await;
}

/// The real binary: a process of its own, so even the unlabelled ingest
/// counter is exact, and a refused duplicate is not counted; and so are
/// the dispatcher's claims, which must not follow every finished request.
#[tokio::test]
async fn the_binary_counts_accepted_messages_exactly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::start().await;
    let port = closed_port().await;
    let addr = format!("127.0.0.1:{port}");
    let mut cmd = crate::helpers::binary::serve_command(&dir.path().join("h.db"), port);
    let _child = cmd
        .env("HERALD_ADMIN_TOKEN", TOKEN)
        .env("HERALD_ALLOW_PRIVATE_NETWORKS", "true")
        // No safety-net poll during the test: every claim below is one
        // the dispatcher chose to make.
        .env("HERALD_POLL_INTERVAL", "1h")
        .env("HERALD_LOG", "warn")
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("herald starts");
    wait_healthy(&addr).await;
    let base = format!("http://{addr}");
    // Shown at 0 before anything happened, so that an `increase(…) > 0`
    // alert sees the first one.
    let fresh = scrape(&base).await;
    for counter in [
        "herald_completions_unrecorded_total",
        "herald_backup_failures_total",
        "herald_throttle_paced_total",
    ] {
        assert_eq!(value(&fresh, counter, &[]), Some(0.0), "{counter}: {fresh}");
    }
    let remote = Remote::new(&addr);
    let app_id = remote.app_with_endpoint(&rx.url("/")).await;
    let path = format!("/app/{app_id}/msg");
    for (i, event_id) in ["e1", "e2", "e3", "e3"].iter().enumerate() {
        let body = json!({"eventType": "t", "eventId": event_id, "payload": {"i": i}});
        let (status, _) = remote.call(reqwest::Method::POST, &path, Some(body)).await;
        assert_eq!(status, if i < 3 { 202 } else { 409 });
    }

    // Delivered in the background: wait (bounded) for the outcomes to be
    // counted and written, then everything is exact.
    let deadline = Instant::now() + PATIENCE;
    let text = loop {
        let text = scrape(&base).await;
        let success: f64 = samples(&text, "herald_attempts_total")
            .iter()
            .filter(|(l, _)| l.get("outcome").map(String::as_str) == Some("success"))
            .map(|(_, v)| v)
            .sum();
        let live = value(&text, "herald_deliveries", &[("state", "pending")]).unwrap_or(1.0)
            + value(&text, "herald_deliveries", &[("state", "delivering")]).unwrap_or(1.0);
        if success >= 3.0 && live == 0.0 {
            break text;
        }
        assert!(Instant::now() < deadline, "never settled:\n{text}");
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    };
    assert_eq!(rx.requests().len(), 3);
    assert_eq!(must(&text, "herald_messages_ingested_total", &[]), 3.0);
    let durations: f64 = samples(&text, "herald_attempt_duration_seconds_count")
        .iter()
        .map(|(_, v)| v)
        .sum();
    assert_eq!(durations, 3.0);
    assert_eq!(must(&text, "herald_deliveries", &[("state", "dead")]), 0.0);
    let ready = reqwest::get(format!("{base}/readyz"))
        .await
        .expect("readyz");
    assert_eq!(ready.status(), 200);

    // Each new message is handed to the dispatcher by its ingest batch;
    // when its request finishes, nothing else is due. The idle loop must
    // not claim after every finished request (a store transaction that
    // finds nothing), only when new work or a due time calls for it.
    let wasted = |text: &str| value(text, "herald_dispatch_claims_total", &[("found", "none")]);
    let before = wasted(&scrape(&base).await).unwrap_or(0.0);
    for i in 0..20 {
        remote.send_all(&app_id, "t", 1, 1).await;
        rx.wait_for(4 + i).await;
    }
    let text = scrape(&base).await;
    let after = wasted(&text).unwrap_or(0.0);
    assert!(
        after - before <= 2.0,
        "{} empty claims for 20 handed-off messages:\n{text}",
        after - before
    );
}

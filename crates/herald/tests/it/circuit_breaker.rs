//! The per-endpoint circuit breaker (issue 13, item 3), stepped with
//! `process_batch` against a real receiver that fails and then recovers:
//! it opens, holds deliveries without spending attempts, sends one probe
//! when half-open, reopens with a doubled cooldown, and closes. The clock
//! is the wall clock (the store's times are Unix ms taken by the engine),
//! so the cooldowns are short and every wait is a bounded loop. Also: one
//! probe only from two dispatchers sharing a PostgreSQL database.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{Backend, PgSchema, Receiver, Reply, TestApp, PATIENCE};

crate::on_both_stores!(postgres:
    two_dispatchers_send_one_probe,
);

/// Four attempts at 50 % open it; a 300 ms first cooldown (600 ms after
/// one failed probe).
const BREAKER: &[(&str, &str)] = &[
    ("HERALD_BREAKER_MIN_ATTEMPTS", "4"),
    ("HERALD_BREAKER_WINDOW", "1m"),
    ("HERALD_BREAKER_FAILURE_RATE", "50%"),
    ("HERALD_BREAKER_COOLDOWN", "300ms"),
];

async fn circuit(app: &TestApp, app_id: &str, ep: &str) -> Value {
    let (status, health) = app
        .get(&format!("/api/v1/app/{app_id}/endpoint/{ep}/health"))
        .await;
    assert_eq!(status, StatusCode::OK, "{health}");
    health["circuit"].clone()
}

fn ms_of(rfc3339: &Value) -> i64 {
    chrono::DateTime::parse_from_rfc3339(rfc3339.as_str().expect("a time"))
        .expect("RFC 3339")
        .timestamp_millis()
}

/// Steps until a batch claims something (the cooldown ended and this
/// process won the probe), bounded; returns that batch and how many
/// empty batches came first.
async fn step_until_claimed(app: &TestApp) -> (herald::dispatch::BatchReport, usize) {
    let deadline = Instant::now() + PATIENCE;
    let mut empty = 0;
    loop {
        let r = app.step().await;
        if r.claimed > 0 {
            return (r, empty);
        }
        empty += 1;
        assert!(
            Instant::now() < deadline,
            "the breaker never let a probe go"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The dashboard page of `ep`, logged in as an operator.
async fn dashboard_page(app: &TestApp, app_id: &str, ep: &str) -> String {
    let resp = crate::helpers::logged_in(app)
        .await
        .get(app.url(&format!("/dashboard/app/{app_id}/endpoint/{ep}")))
        .send()
        .await
        .expect("herald answers");
    assert_eq!(resp.status(), 200);
    resp.text().await.expect("page")
}

/// `/metrics`' value of `herald_endpoint_circuit_open` for `ep`.
async fn open_gauge(app: &TestApp, ep: &str) -> Option<String> {
    let text = app.metrics_text().await;
    let series = format!("herald_endpoint_circuit_open{{endpoint=\"{ep}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(series.as_str()).map(str::to_owned))
}

fn x_attempts(rx: &Receiver) -> Vec<String> {
    rx.requests()
        .iter()
        .map(|r| r.header("x-attempt"))
        .collect()
}

async fn open_hold_probe_reopen_close(backend: &Backend) {
    let app = backend.spawn_stepped(BREAKER).await;
    let rx = Receiver::start().await;
    // Four failures open it; the first probe fails too; then it recovers.
    rx.script((0..5).map(|_| Reply::status(500)));
    let (app_id, ep) = app.app_with_endpoint(&rx.url("/"), json!({})).await;
    assert_eq!(circuit(&app, &app_id, &ep).await["state"], "closed");

    let mut msgs = Vec::new();
    for n in 0..4 {
        msgs.push(app.send_message(&app_id, "t.x", json!({ "n": n })).await);
    }
    let r = app.step().await;
    assert_eq!((r.claimed, r.retried), (4, 4));
    let opened = circuit(&app, &app_id, &ep).await;
    assert_eq!(opened["state"], "open", "{opened}");
    assert_eq!(opened["recentFailureRate"], 1.0);
    assert_eq!(opened["recentAttempts"], 4);
    let cooldown = ms_of(&opened["until"]) - ms_of(&opened["since"]);
    assert_eq!(cooldown, 300, "{opened}");
    let page = dashboard_page(&app, &app_id, &ep).await;
    let until = opened["until"].as_str().expect("until");
    assert!(
        page.contains(&format!("circuit open until {until}")),
        "the endpoint page shows the open breaker"
    );
    assert_eq!(open_gauge(&app, &ep).await.as_deref(), Some("1"));

    // Held: due retries and new messages alike stay pending, unclaimed,
    // with no attempt spent, while it is open.
    for n in 4..6 {
        msgs.push(app.send_message(&app_id, "t.x", json!({ "n": n })).await);
    }
    let r = app.step().await;
    assert_eq!(r.claimed, 0, "nothing is claimed while the breaker is open");
    assert_eq!(rx.requests().len(), 4);
    for m in &msgs[4..] {
        let ds = app.deliveries(&app_id, m).await;
        assert_eq!(ds[0]["state"], "pending");
    }

    // Half-open: exactly one probe, the oldest due delivery's second try.
    let (r, held_steps) = step_until_claimed(&app).await;
    assert_eq!(r.claimed, 1, "one probe");
    assert!(held_steps > 0, "the cooldown held it for a while");
    assert_eq!(x_attempts(&rx), ["1", "1", "1", "1", "2"]);
    // It failed: open again, for twice the cooldown.
    let reopened = circuit(&app, &app_id, &ep).await;
    assert_eq!(reopened["state"], "open", "{reopened}");
    assert_eq!(
        ms_of(&reopened["until"]) - ms_of(&reopened["since"]),
        600,
        "{reopened}"
    );
    assert_eq!(app.step().await.claimed, 0);

    // The next probe succeeds: closed, and the rest flows.
    let (r, _) = step_until_claimed(&app).await;
    assert_eq!((r.claimed, r.delivered), (1, 1));
    let closed = circuit(&app, &app_id, &ep).await;
    assert_eq!(closed["state"], "closed", "{closed}");
    assert!(closed["until"].is_null());
    assert_eq!(open_gauge(&app, &ep).await.as_deref(), Some("0"));
    assert!(!dashboard_page(&app, &app_id, &ep)
        .await
        .contains("circuit open"));
    let r = app.step().await;
    assert_eq!((r.claimed, r.delivered), (5, 5));
    assert_eq!(app.step().await.claimed, 0);

    // 4 first tries, the failed probe, the good probe, then the five
    // held: every message delivered, each attempt number as counted.
    let mut seen = x_attempts(&rx);
    assert_eq!(seen.len(), 11, "{seen:?}");
    seen.sort();
    let expected = [
        vec!["1"; 6], // four first tries + the two held new messages
        vec!["2"; 4], // the failed probe + three held retries
        vec!["3"; 1], // the failed probe's delivery, delivered
    ]
    .concat();
    assert_eq!(seen, expected);
    for m in &msgs {
        let ds = app.deliveries(&app_id, m).await;
        assert_eq!(ds[0]["state"], "delivered", "{ds:?}");
    }
    app.shutdown().await;
}

crate::on_both_stores!(open_hold_probe_reopen_close);

/// Off: `HERALD_BREAKER_MIN_ATTEMPTS=0` never opens, whatever fails.
#[tokio::test]
async fn min_attempts_zero_turns_the_breaker_off() {
    let app = crate::helpers::spawn_stepped(&[("HERALD_BREAKER_MIN_ATTEMPTS", "0")]).await;
    let rx = Receiver::start().await;
    rx.always(Reply::status(500));
    let (app_id, ep) = app.app_with_endpoint(&rx.url("/"), json!({})).await;
    for n in 0..30 {
        app.send_message(&app_id, "t.x", json!({ "n": n })).await;
    }
    assert_eq!(app.step().await.claimed, 30);
    assert_eq!(app.step().await.claimed, 30, "retried at once: no breaker");
    assert_eq!(circuit(&app, &app_id, &ep).await["state"], "closed");
    app.shutdown().await;
}

/// Two dispatchers on one PostgreSQL database, both stepping when the
/// cooldown ends: one probe reaches the receiver, not two, each time the
/// breaker is half-open (the receiver keeps failing, so each probe
/// reopens it and nothing else may go).
async fn two_dispatchers_send_one_probe(pg: PgSchema) {
    let backend = Backend::Postgres(pg);
    let first = backend.spawn_stepped(BREAKER).await;
    let second = backend.spawn_stepped(BREAKER).await;
    let rx = Receiver::start().await;
    rx.always(Reply::status(500));
    let (app_id, ep) = first.app_with_endpoint(&rx.url("/"), json!({})).await;
    for n in 0..8 {
        first.send_message(&app_id, "t.x", json!({ "n": n })).await;
    }
    // All eight claimed by one, all failing: open. (Stepped alone: were
    // both stepping, the other could claim the retries before its view
    // of the breakers, refreshed per step, shows the opening; that lag
    // between processes is documented, and not what this test is about.)
    let a = first.step().await;
    assert_eq!(a.claimed, 8);
    assert_eq!(circuit(&second, &app_id, &ep).await["state"], "open");
    assert_eq!(rx.requests().len(), 8);
    // Two half-open periods: both dispatchers step together throughout;
    // each period lets exactly one request through.
    for probe in 1..=2 {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let (a, b) = tokio::join!(first.step(), second.step());
            assert!(
                a.claimed + b.claimed <= 1,
                "two probes at once: {a:?} {b:?}"
            );
            if a.claimed + b.claimed == 1 {
                break;
            }
            assert!(Instant::now() < deadline, "no probe went");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(rx.requests().len(), 8 + probe, "exactly one probe");
        let c = circuit(&first, &app_id, &ep).await;
        assert_eq!(c["state"], "open", "the probe failed: {c}");
        // Stepping on at once sends nothing more.
        let (a, b) = tokio::join!(first.step(), second.step());
        assert_eq!(a.claimed + b.claimed, 0);
    }
    first.shutdown().await;
    second.shutdown().await;
    if let Backend::Postgres(pg) = &backend {
        pg.drop_schema().await;
    }
}

/// The health API's `circuit.state` of `ep`, through `remote`.
async fn remote_state(remote: &crate::helpers::Remote, app_id: &str, ep: &str) -> Value {
    let path = format!("/app/{app_id}/endpoint/{ep}/health");
    let (status, health) = remote.call(reqwest::Method::GET, &path, None).await;
    assert_eq!(status, 200);
    health["circuit"].clone()
}

async fn wait_for_state(
    remote: &crate::helpers::Remote,
    app_id: &str,
    ep: &str,
    want: &str,
) -> Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let c = remote_state(remote, app_id, ep).await;
        if c["state"] == want {
            return c;
        }
        assert!(
            Instant::now() < deadline,
            "the circuit never became {want}: {c}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// End to end with the real binary: a failing receiver opens the breaker
/// (health API `open`, operator event `endpoint.circuit_opened`), nothing
/// reaches it while open, and once it recovers the probe closes it
/// (`endpoint.circuit_closed`) and every message is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_opens_and_closes_the_breaker_and_tells_operators() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::start().await;
    rx.always(Reply::status(503));
    let ops = Receiver::start().await;
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let ops_url = ops.url("/ops");
    let herald = crate::helpers::binary::serve(
        &dir.path().join("herald.db"),
        &[
            ("HERALD_ADMIN_TOKEN", crate::helpers::TOKEN),
            ("HERALD_ALLOW_PRIVATE_NETWORKS", "true"),
            (
                "HERALD_RETRY_SCHEDULE",
                "50ms,50ms,50ms,50ms,50ms,50ms,50ms,50ms",
            ),
            ("HERALD_JITTER", "none"),
            ("HERALD_REQUEST_TIMEOUT", "2s"),
            ("HERALD_LEASE", "6s"),
            ("HERALD_POLL_INTERVAL", "200ms"),
            ("HERALD_BREAKER_MIN_ATTEMPTS", "5"),
            ("HERALD_BREAKER_WINDOW", "1m"),
            ("HERALD_BREAKER_FAILURE_RATE", "0.5"),
            ("HERALD_BREAKER_COOLDOWN", "3s"),
            ("HERALD_OPERATOR_WEBHOOK_URL", &ops_url),
            ("HERALD_OPERATOR_WEBHOOK_SECRET", secret),
        ],
    )
    .await;
    let remote = crate::helpers::Remote::new(herald.addr);
    let (app_id, ep) = remote
        .app_with_endpoint_of(json!({ "url": rx.url("/hook") }))
        .await;
    let msgs = remote.send_all(&app_id, "order.paid", 5, 5).await;

    let open = wait_for_state(&remote, &app_id, &ep, "open").await;
    assert!(open["until"].is_string(), "{open}");
    assert!(open["recentFailureRate"].as_f64().expect("rate") >= 0.5);
    // Held while open: what reached the receiver by now (what was in
    // flight at the opening has finished within a request timeout) is all
    // it gets until the cooldown ends.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let at_open = rx.requests().len();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(rx.requests().len(), at_open, "nothing is sent while open");
    assert_eq!(remote_state(&remote, &app_id, &ep).await["state"], "open");
    let events =
        crate::endpoint_health::operator_events(&ops, secret, &["endpoint.circuit_opened"]).await;
    let opened = events
        .iter()
        .find(|e| e["type"] == "endpoint.circuit_opened")
        .expect("opened");
    assert_eq!(opened["data"]["endpointId"], ep.as_str());
    assert_eq!(opened["data"]["appId"], app_id.as_str());
    assert!(opened["data"]["failures"].as_u64().expect("failures") >= 5);
    assert_eq!(opened["data"]["failureRate"], 1.0);
    assert!(opened["data"]["openUntil"].is_string());

    // The receiver recovers: the next probe closes it, the rest goes.
    rx.always(Reply::status(200));
    wait_for_state(&remote, &app_id, &ep, "closed").await;
    let events =
        crate::endpoint_health::operator_events(&ops, secret, &["endpoint.circuit_closed"]).await;
    let closed: Vec<_> = events
        .iter()
        .filter(|e| e["type"] == "endpoint.circuit_closed")
        .collect();
    assert_eq!(closed.len(), 1, "once per transition: {events:?}");
    assert_eq!(closed[0]["data"]["endpointId"], ep.as_str());
    let opened_count = events
        .iter()
        .filter(|e| e["type"] == "endpoint.circuit_opened")
        .count();
    assert_eq!(opened_count, 1, "{events:?}");
    // Every message is delivered in the end.
    let deadline = Instant::now() + PATIENCE;
    for m in &msgs {
        loop {
            let path = format!("/app/{app_id}/msg/{m}/delivery");
            let (_, ds) = remote.call(reqwest::Method::GET, &path, None).await;
            if ds["data"][0]["state"] == "delivered" {
                break;
            }
            assert!(Instant::now() < deadline, "{m} never delivered: {ds}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert!(rx
        .requests()
        .iter()
        .skip(at_open)
        .all(|r| msgs.contains(&r.header("webhook-id"))));
    drop(herald);
}

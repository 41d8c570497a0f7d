//! Claimed deliveries waiting at their endpoint's gate: a lease that could
//! end before the request does is never sent under, and an endpoint
//! disabled (or answering 410) while deliveries wait stops them. Plus the
//! PostgreSQL ingest that routed to an endpoint disabled before its insert.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{spawn_app, Answered, Backend, PgSchema, Receiver, Reply, TestApp, PATIENCE};

crate::on_both_stores!(a_delivery_is_never_sent_twice_when_many_wait_at_a_slow_endpoint);

crate::on_both_stores!(postgres: ingest_gives_nothing_to_an_endpoint_disabled_after_routing);

/// Waits (bounded) until no delivery of `msgs` is `delivering`, and returns
/// their deliveries.
async fn settled(app: &TestApp, app_id: &str, msgs: &[String]) -> Vec<Value> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let mut all = Vec::new();
        for m in msgs {
            all.extend(app.deliveries(app_id, m).await);
        }
        if all.iter().all(|d| d["state"] != "delivering") {
            return all;
        }
        assert!(Instant::now() < deadline, "still delivering: {all:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Holds the store's writes back while it lives, so that ingest batches
/// and claims queue up at once, each having counted the endpoint's
/// deliveries before any of the others was registered.
enum WriteBlock {
    Sqlite(rusqlite::Connection),
    Postgres(sqlx::PgConnection),
}

impl WriteBlock {
    async fn start(app: &TestApp, backend: &Backend) -> WriteBlock {
        match backend {
            Backend::Sqlite => {
                let conn = rusqlite::Connection::open(app._dir.path().join("herald.db"))
                    .expect("open the SQLite file");
                conn.execute_batch("BEGIN IMMEDIATE")
                    .expect("take the write lock");
                WriteBlock::Sqlite(conn)
            }
            Backend::Postgres(PgSchema { url, schema }) => {
                use sqlx::Connection;
                let mut conn = sqlx::PgConnection::connect(url)
                    .await
                    .expect("connect to PostgreSQL");
                for sql in [
                    format!("SET search_path TO \"{schema}\""),
                    "BEGIN".to_owned(),
                    "LOCK TABLE messages IN EXCLUSIVE MODE".to_owned(),
                ] {
                    sqlx::query(sqlx::AssertSqlSafe(sql))
                        .execute(&mut conn)
                        .await
                        .expect("lock the messages table");
                }
                WriteBlock::Postgres(conn)
            }
        }
    }

    /// PostgreSQL sessions waiting for this block's lock.
    async fn waiting(&mut self) -> i64 {
        match self {
            WriteBlock::Sqlite(_) => unreachable!("SQLite shows no lock waits"),
            WriteBlock::Postgres(conn) => sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE pg_blocking_pids(pid) @> ARRAY[pg_backend_pid()]",
            )
            .fetch_one(conn)
            .await
            .expect("pg_stat_activity"),
        }
    }

    async fn end(self) {
        match self {
            WriteBlock::Sqlite(conn) => conn.execute_batch("COMMIT").expect("commit"),
            WriteBlock::Postgres(mut conn) => {
                sqlx::query("COMMIT")
                    .execute(&mut conn)
                    .await
                    .expect("commit");
            }
        }
    }
}

/// Issue #16, defect 2: two ingest handoffs (or one and the loop's claim)
/// could each give one endpoint its whole room (`2 × cap`), so with one
/// request at a time a delivery waited behind two slow requests, its lease
/// ended at the gate, and it was claimed again and sent twice (same
/// Idempotency-Key, `X-Attempt: 1` both times). Now a delivery whose lease
/// no longer covers a request when it passes the gate is released and
/// claimed afresh.
async fn a_delivery_is_never_sent_twice_when_many_wait_at_a_slow_endpoint(backend: &Backend) {
    let config = [
        ("HERALD_ENDPOINT_CONCURRENCY", "1"),
        ("HERALD_REQUEST_TIMEOUT", "3s"),
        ("HERALD_LEASE", "7100ms"),
        ("HERALD_RETRY_SCHEDULE", "1h"),
        // The idle loop's poll would reserve every free slot while the
        // store is held, leaving the handoffs none.
        ("HERALD_POLL_INTERVAL", "10s"),
    ];
    let app = backend.spawn_app(&config).await;
    let receiver = Receiver::start().await;
    // Slow but within the timeout: the third request in a row to the
    // endpoint ends 7.5 s after the claims, past their 7.1 s lease.
    receiver.always(Reply::status(200).delay(Duration::from_millis(2500)));
    let (app_id, _) = app
        .app_with_endpoint(&receiver.url("/slow"), json!({}))
        .await;

    let send = |i: usize| {
        let (base, app_id) = (app.url(""), app_id.clone());
        tokio::spawn(async move {
            let out: Value = reqwest::Client::new()
                .post(format!("{base}/api/v1/app/{app_id}/msg"))
                .bearer_auth(crate::helpers::TOKEN)
                .json(&json!({"eventType": "order.created", "payload": {"i": i}}))
                .json_answer()
                .await;
            out["id"].as_str().expect("accepted").to_owned()
        })
    };
    let block = WriteBlock::start(&app, backend).await;
    // One batch is stuck at the store; the next gathers the other two and
    // reserves its handoff before the first one's delivery is counted, so
    // three wait at a gate that was to hold two.
    let first = send(0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rest: Vec<_> = (1..3).map(send).collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    block.end().await;
    let claimed_at = Instant::now();
    let mut msgs = vec![first.await.expect("send")];
    for r in rest {
        msgs.push(r.await.expect("send"));
    }
    // Just after the leases end (7.1 s) and before the third request does
    // (7.5 s), wake the loop as a production poll would: a message to five
    // endpoints of another application leaves one pending for it to claim.
    let other = app.create_app().await;
    let fast = Receiver::start().await;
    for _ in 0..5 {
        app.create_endpoint(&other, &fast.url("/fast"), json!({}))
            .await;
    }
    tokio::time::sleep_until((claimed_at + Duration::from_millis(7250)).into()).await;
    app.send_message(&other, "order.created", json!({"wake": true}))
        .await;
    fast.wait_for(5).await;
    for m in &msgs {
        app.wait_for_state(&app_id, m, "delivered").await;
    }

    let mut sent: HashMap<(String, String), usize> = HashMap::new();
    for r in receiver.requests() {
        *sent
            .entry((r.header("idempotency-key"), r.header("x-attempt")))
            .or_default() += 1;
    }
    let twice: Vec<_> = sent.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "sent more than once: {twice:?}");
    assert_eq!(receiver.requests().len(), msgs.len(), "one request each");
    for m in &msgs {
        let attempts = app.attempts_of_msg(&app_id, m).await;
        assert_eq!(attempts.len(), 1, "one attempt row for {m}: {attempts:?}");
    }
    app.shutdown().await;
}

/// Issue #16, defect 9: deliveries already waiting at an endpoint's gate
/// were still sent after it answered 410 Gone (which disables it at once).
#[tokio::test]
async fn deliveries_waiting_at_the_gate_are_not_sent_after_a_410() {
    let app = spawn_app(&[
        ("HERALD_ENDPOINT_CONCURRENCY", "1"),
        ("HERALD_RETRY_SCHEDULE", "1h"),
    ])
    .await;
    let receiver = Receiver::start().await;
    receiver.script([Reply::status(410).delay(Duration::from_millis(700))]);
    let (app_id, ep_id) = app
        .app_with_endpoint(&receiver.url("/gone"), json!({}))
        .await;

    let sends = (0..3).map(|i| app.send_message(&app_id, "order.created", json!({ "i": i })));
    let msgs = futures::future::join_all(sends).await;
    receiver.wait_for(1).await;
    let all = settled(&app, &app_id, &msgs).await;

    let (status, ep) = app
        .get(&format!("/api/v1/app/{app_id}/endpoint/{ep_id}"))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(ep["disabled"], true, "410 disables: {ep}");
    assert_eq!(
        receiver.requests().len(),
        1,
        "nothing is sent after the 410: {all:?}"
    );
    let held = all.iter().filter(|d| d["state"] == "pending").count();
    assert_eq!(held, 2, "the others are held for the endpoint: {all:?}");
    app.shutdown().await;
}

/// Issue #16, defect 9: the same after an operator's `POST …/disable`
/// while deliveries wait behind a slow request.
#[tokio::test]
async fn deliveries_waiting_at_the_gate_are_not_sent_after_a_disable() {
    let app = spawn_app(&[("HERALD_ENDPOINT_CONCURRENCY", "1")]).await;
    let receiver = Receiver::start().await;
    receiver.always(Reply::status(200).delay(Duration::from_millis(700)));
    let (app_id, ep_id) = app
        .app_with_endpoint(&receiver.url("/slow"), json!({}))
        .await;

    let sends = (0..3).map(|i| app.send_message(&app_id, "order.created", json!({ "i": i })));
    let msgs = futures::future::join_all(sends).await;
    receiver.wait_for(1).await;
    app.disable_endpoint(&app_id, &ep_id, json!({})).await;
    let all = settled(&app, &app_id, &msgs).await;
    assert_eq!(
        receiver.requests().len(),
        1,
        "only the request in flight at the disable: {all:?}"
    );
    let delivered = all.iter().filter(|d| d["state"] == "delivered").count();
    assert_eq!(delivered, 1, "{all:?}");
    app.shutdown().await;
}

/// Issue #16, defect 9: on PostgreSQL, ingest routes on endpoints read
/// without locks; an endpoint disabled by an operator before the batch's
/// insert still got the delivery (and, handed off, was sent). The insert
/// now judges the endpoint as its own statement sees it. The window is held
/// open deterministically: the test holds a table lock on `messages`, so the
/// insert statement waits for it after routing and before it takes its
/// snapshot (PostgreSQL takes a statement's table locks first).
async fn ingest_gives_nothing_to_an_endpoint_disabled_after_routing(pg: PgSchema) {
    let backend = Backend::Postgres(pg);
    let app = backend.spawn_app(&[]).await;
    let receiver = Receiver::start().await;
    let (app_id, ep_id) = app.app_with_endpoint(&receiver.url("/ep"), json!({})).await;

    let mut block = WriteBlock::start(&app, &backend).await;

    let send = {
        let (client, base, app_id) = (reqwest::Client::new(), app.url(""), app_id.clone());
        tokio::spawn(async move {
            client
                .post(format!("{base}/api/v1/app/{app_id}/msg"))
                .bearer_auth(crate::helpers::TOKEN)
                .json(&json!({"eventType": "order.created", "payload": {"n": 1}}))
                .send()
                .await
                .expect("request")
                .json::<Value>()
                .await
                .expect("json")
        })
    };
    // Routed, and now waiting for the table lock.
    let deadline = Instant::now() + PATIENCE;
    loop {
        if block.waiting().await > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "ingest never waited for the lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    app.disable_endpoint(&app_id, &ep_id, json!({})).await;
    block.end().await;

    let out = send.await.expect("send task");
    let msg = out["id"].as_str().expect("message accepted").to_owned();
    let deliveries = app.deliveries(&app_id, &msg).await;
    assert!(
        deliveries.is_empty(),
        "an endpoint disabled by a person gets nothing: {deliveries:?}"
    );
    assert!(receiver.requests().is_empty());
    app.shutdown().await;
}

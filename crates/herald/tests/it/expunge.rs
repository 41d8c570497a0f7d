//! Erasing payloads and response excerpts (Svix's expunge routes, and
//! `HERALD_PAYLOAD_RETENTION`): gone from the API and the store, and a
//! delivery of an erased message is never sent, on both stores.

use std::sync::Arc;

use axum::http::StatusCode;
use serde_json::{json, Value};

use crate::helpers::*;

crate::on_both_stores!(
    an_expunged_payload_is_gone_and_its_deliveries_never_send_it,
    a_delivery_in_flight_at_expunge_is_not_retried_with_an_empty_body,
    a_messages_payload_retention_period_erases_it_when_it_ends,
    the_sdk_expunges_and_the_dashboard_and_tables_show_nothing_of_the_payload,
);

const MARKER: &str = "secret-card-4242-4242";

async fn an_expunged_payload_is_gone_and_its_deliveries_never_send_it(backend: &Backend) {
    let app = backend
        .spawn_stepped(&[("HERALD_RETRY_SCHEDULE", "0ms,0ms,0ms")])
        .await;
    let rx = Receiver::start().await;
    rx.always(Reply::status(503).body(&format!("echo {MARKER}")));
    let (app_id, _) = app.app_with_endpoint(&rx.url("/"), json!({})).await;
    let msg = app
        .send_message(&app_id, "card.charged", json!({"card": MARKER}))
        .await;
    // One failed attempt: pending, to be retried.
    assert_eq!(app.step().await.retried, 1);
    let attempts = app.attempts_of_msg(&app_id, &msg).await;
    assert!(attempts[0]["response"]
        .as_str()
        .unwrap_or_default()
        .contains(MARKER));
    let attempt_id = attempts[0]["id"].as_str().expect("id").to_owned();

    // The attempt's excerpt first.
    let (status, _) = app
        .delete(&format!(
            "/api/v1/app/{app_id}/msg/{msg}/attempt/{attempt_id}/content"
        ))
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, a) = app
        .get(&format!(
            "/api/v1/app/{app_id}/msg/{msg}/attempt/{attempt_id}"
        ))
        .await;
    assert_eq!(a["response"], "", "{a}");

    // Then the payload.
    let (status, _) = app
        .delete(&format!("/api/v1/app/{app_id}/msg/{msg}/content"))
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, m) = app.get(&format!("/api/v1/app/{app_id}/msg/{msg}")).await;
    assert_eq!(
        m["payload"],
        json!({"expired": true}),
        "as Svix shows it: {m}"
    );
    assert_eq!(m["payloadExpunged"], true);
    let d = app.deliveries(&app_id, &msg).await;
    assert_eq!(d[0]["state"], "dead", "{d:?}");
    assert_eq!(d[0]["deadReason"], "expunged", "{d:?}");
    assert!(!format!("{m}{d:?}{:?}", app.attempts_of_msg(&app_id, &msg).await).contains(MARKER));

    // Nothing is sent again, nor can be asked for.
    app.step().await;
    assert_eq!(rx.requests().len(), 1);
    let dlv = d[0]["id"].as_str().expect("id");
    let ep = d[0]["endpointId"].as_str().expect("ep");
    let (status, body) = app.resend(&app_id, &msg, ep).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body.to_string().contains("expunged"), "{body}");
    let (_, replayed) = app.replay_dead(&app_id, dlv).await;
    app.step().await;
    assert_eq!(rx.requests().len(), 1, "no replay sends it: {replayed}");
    let d = app.deliveries(&app_id, &msg).await;
    assert_eq!(d[0]["state"], "dead");
    // A repeat is harmless; an unknown message is 404.
    let (status, _) = app
        .delete(&format!("/api/v1/app/{app_id}/msg/{msg}/content"))
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = app
        .delete(&format!(
            "/api/v1/app/{app_id}/msg/msg_01M8RY624CYWDGTSNY6BG0KV0S/content"
        ))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    app.shutdown().await;
}

/// A delivery in flight when its message is expunged finishes the request
/// it began; when that fails, the retry is never sent.
async fn a_delivery_in_flight_at_expunge_is_not_retried_with_an_empty_body(backend: &Backend) {
    let app = backend
        .spawn_stepped(&[("HERALD_RETRY_SCHEDULE", "0ms,0ms,0ms")])
        .await;
    let rx = Receiver::start().await;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    rx.script([Reply::status(503).held(&gate)]);
    let (app_id, _) = app.app_with_endpoint(&rx.url("/"), json!({})).await;
    let msg = app
        .send_message(&app_id, "a.b", json!({"card": MARKER}))
        .await;
    let dispatcher = app.running().dispatcher.clone();
    let step = tokio::spawn(async move { dispatcher.process_batch().await });
    rx.wait_for(1).await;
    let (status, _) = app
        .delete(&format!("/api/v1/app/{app_id}/msg/{msg}/content"))
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    gate.add_permits(1);
    let report = step.await.expect("step").expect("batch");
    assert_eq!(report.retried, 1, "the request in flight failed: retry due");
    app.step().await;
    let d = app.deliveries(&app_id, &msg).await;
    assert_eq!(d[0]["state"], "dead", "{d:?}");
    assert_eq!(d[0]["deadReason"], "expunged");
    let got = rx.requests();
    assert_eq!(got.len(), 1, "the retry was not sent");
    let attempts = app.attempts_of_msg(&app_id, &msg).await;
    let last = attempts.last().expect("attempt");
    assert_eq!(last["responseStatusCode"], 0, "nothing was sent: {last}");
    assert!(
        last.to_string().contains("expunged"),
        "the attempt log says why: {last}"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn payload_retention_erases_old_payloads_and_the_sqlite_file_no_longer_holds_them() {
    let rx = Receiver::start().await;
    let app = spawn_stepped(&[("HERALD_PAYLOAD_RETENTION", "1h")]).await;
    let (app_id, _) = app.app_with_endpoint(&rx.url("/"), json!({})).await;
    // Older than `old`, with a period of its own: the setting applies only
    // where a message has none (docs/security.md).
    let (status, own) = app
        .post(
            &format!("/api/v1/app/{app_id}/msg"),
            json!({"eventType": "a.b", "payload": {"n": "own"}, "payloadRetentionPeriod": 5}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{own}");
    let old = app
        .send_message(&app_id, "a.b", json!({"card": MARKER}))
        .await;
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let kept = app.send_message(&app_id, "a.b", json!({"n": "kept"})).await;
    app.step().await;
    let path = app._dir.path().join("herald.db");
    let holds_marker = |path: &std::path::Path| {
        let conn = rusqlite::Connection::open(path).expect("open");
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .expect("checkpoint");
        let bytes = std::fs::read(path).expect("read the file");
        bytes.windows(MARKER.len()).any(|w| w == MARKER.as_bytes())
    };
    assert!(holds_marker(&path), "the check sees the payload before");
    let store = app.running().store.clone();
    // An hour and a millisecond after the old one was made: it is past the
    // retention, the one made 5 ms later is not.
    let config = test_config(app._dir.path(), &[("HERALD_PAYLOAD_RETENTION", "1h")]);
    let created_old = store
        .get_message(&herald::ids::AppId::parse(&app_id).expect("id"), &old)
        .await
        .expect("read")
        .expect("message")
        .created_at;
    herald::server::retention_pass(
        &*store,
        &config,
        created_old + 3_600_000 + 1,
        &tokio_util::sync::CancellationToken::new(),
    )
    .await;
    let (_, m): (StatusCode, Value) = app.get(&format!("/api/v1/app/{app_id}/msg/{old}")).await;
    assert_eq!(m["payloadExpunged"], true, "{m}");
    let (_, k): (StatusCode, Value) = app.get(&format!("/api/v1/app/{app_id}/msg/{kept}")).await;
    assert_eq!(k["payloadExpunged"], false, "{k}");
    assert_eq!(k["payload"], json!({"n": "kept"}));
    let (_, o): (StatusCode, Value) = app
        .get(&format!(
            "/api/v1/app/{app_id}/msg/{}",
            own["id"].as_str().expect("id")
        ))
        .await;
    assert_eq!(o["payloadExpunged"], false, "its own five days hold: {o}");
    assert_eq!(o["payload"], json!({"n": "own"}));
    // The bytes: after a checkpoint the database file holds no trace of it.
    assert!(
        !holds_marker(&path),
        "the erased payload is still in {}",
        path.display()
    );
    app.shutdown().await;
}

async fn a_messages_payload_retention_period_erases_it_when_it_ends(backend: &Backend) {
    let app = backend.spawn_stepped(&[]).await;
    let app_id = app.create_app().await;
    let path = format!("/api/v1/app/{app_id}/msg");
    let (status, short) = app
        .post(
            &path,
            json!({"eventType": "a.b", "payload": {"card": MARKER}, "payloadRetentionPeriod": 5}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{short}");
    let (status, long) = app
        .post(&path, json!({"eventType": "a.b", "payload": {"n": 1}}))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    for bad in [4, 91] {
        let (status, body) = app
            .post(
                &path,
                json!({"eventType": "a.b", "payload": {}, "payloadRetentionPeriod": bad}),
            )
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert!(
            body.to_string().contains("payloadRetentionPeriod"),
            "{body}"
        );
    }
    let short_id = short["id"].as_str().expect("id").to_owned();
    let long_id = long["id"].as_str().expect("id").to_owned();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = test_config(dir.path(), &[]);
    let store = app.running().store.clone();
    let day = 86_400_000;
    let now = herald::store::now_millis();
    let pass = |at| {
        let store = store.clone();
        let config = config.clone();
        async move {
            herald::server::retention_pass(
                &*store,
                &config,
                at,
                &tokio_util::sync::CancellationToken::new(),
            )
            .await
        }
    };
    pass(now + 5 * day - 60_000).await;
    let (_, m) = app.get(&format!("{path}/{short_id}")).await;
    assert_eq!(m["payloadExpunged"], false, "not yet: {m}");
    pass(now + 5 * day + 60_000).await;
    let (_, m) = app.get(&format!("{path}/{short_id}")).await;
    assert_eq!(m["payloadExpunged"], true, "{m}");
    let (_, m) = app.get(&format!("{path}/{long_id}")).await;
    assert_eq!(m["payloadExpunged"], false, "{m}");
    app.shutdown().await;
}

/// Through the official Rust SDK, as the issue asks: `expunge_content` and
/// `replay_missing`; the dashboard's delivery page and the PostgreSQL
/// table no longer hold the payload either.
async fn the_sdk_expunges_and_the_dashboard_and_tables_show_nothing_of_the_payload(
    backend: &Backend,
) {
    let app = backend.spawn_stepped(&[]).await;
    let rx = Receiver::start().await;
    rx.always(Reply::status(503));
    let svix = app.sdk();
    let (app_id, ep) = app.app_with_endpoint(&rx.url("/"), json!({})).await;
    let msg = app
        .send_message(&app_id, "a.b", json!({"card": MARKER}))
        .await;
    app.step().await;
    svix.message()
        .expunge_content(app_id.clone(), msg.clone())
        .await
        .expect("expunge_content through the SDK");
    let replay = svix::models::ReplayIn::new(chrono::Utc::now() - chrono::Duration::hours(1));
    let out = svix
        .endpoint()
        .replay_missing(app_id.clone(), ep.clone(), replay, None)
        .await
        .expect("replay_missing through the SDK");
    assert!(
        format!("{:?}", out.task).to_lowercase().contains("replay"),
        "{out:?}"
    );

    // The dashboard's page of the delivery.
    let browser = logged_in(&app).await;
    let d = app.deliveries(&app_id, &msg).await;
    let dlv = d[0]["id"].as_str().expect("id");
    let page = browser
        .get(app.url(&format!("/dashboard/app/{app_id}/delivery/{dlv}")))
        .text_answer()
        .await;
    assert!(page.contains("payload was expunged"), "{page}");
    assert!(!page.contains(MARKER));

    // The store's own rows.
    let store = app.running().store.clone();
    let app_key = herald::ids::AppId::parse(&app_id).expect("id");
    let m = store
        .get_message(&app_key, &msg)
        .await
        .expect("read")
        .expect("message");
    assert_eq!(m.payload, "", "the row holds nothing of it");
    app.shutdown().await;
}

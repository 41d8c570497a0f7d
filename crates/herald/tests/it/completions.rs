//! Outcomes on their way to the store, end to end: bodies a store could
//! refuse, a row the store does refuse, and late outcomes that changed
//! nothing. Each test runs on SQLite and on PostgreSQL (the server named
//! by `HERALD_TEST_POSTGRES_URL`, in a throw-away schema; SKIPPED without
//! it).

use std::sync::Arc;

use axum::http::StatusCode;
use serde_json::{json, Value};

use herald::dispatch::RecordReport;
use herald::ids::AttemptId;
use herald::store::{Completion, NextState};

use crate::helpers::*;

crate::on_both_stores!(
    bodies_with_nul_and_invalid_utf8_are_recorded_once_beside_other_apps,
    a_row_the_store_refuses_does_not_hold_back_the_rest_of_its_batch,
    a_stale_dead_outcome_sends_no_exhausted_event,
);

async fn app_with_endpoints(app: &TestApp, receivers: &[&Receiver]) -> (String, Vec<String>) {
    let app_id = app.create_app().await;
    let mut eps = Vec::new();
    for rx in receivers {
        let ep = app
            .create_endpoint(&app_id, &rx.url("/hook"), json!({}))
            .await;
        eps.push(ep["id"].as_str().expect("endpoint id").to_owned());
    }
    (app_id, eps)
}

/// An endpoint answering `ok\0done`, one answering bytes that are not
/// UTF-8, and another application's healthy endpoint, all through the
/// background dispatcher: each message arrives once per endpoint, is logged
/// once, with the receiver's words made storable, and ends delivered. (On
/// PostgreSQL the NUL failed every completion batch it was in: the other
/// app's deliveries were sent again each lease and stayed `delivering`.)
async fn bodies_with_nul_and_invalid_utf8_are_recorded_once_beside_other_apps(db: &Backend) {
    let app = db.spawn_app(&[]).await;
    let (nul, broken, healthy) = (
        Receiver::start().await,
        Receiver::start().await,
        Receiver::start().await,
    );
    nul.always(Reply::status(200).bytes(b"ok\0done"));
    broken.always(Reply::status(200).bytes(b"\xff\xfe"));
    healthy.always(Reply::status(200).body("fine"));
    let (odd_app, odd_eps) = app_with_endpoints(&app, &[&nul, &broken]).await;
    let (other_app, _) = app_with_endpoints(&app, &[&healthy]).await;
    const N: usize = 5;
    let odd_msgs = app.send_n(&odd_app, N).await;
    let other_msgs = app.send_n(&other_app, N).await;
    for m in &odd_msgs {
        app.wait_for_state(&odd_app, m, "delivered").await;
    }
    for m in &other_msgs {
        app.wait_for_state(&other_app, m, "delivered").await;
    }
    for (rx, name) in [(&nul, "nul"), (&broken, "broken"), (&healthy, "healthy")] {
        assert_eq!(rx.requests().len(), N, "requests at the {name} receiver");
    }
    let excerpt_of = |ep: &str| {
        if ep == odd_eps[0] {
            "ok\u{FFFD}done"
        } else {
            "\u{FFFD}\u{FFFD}"
        }
    };
    for m in &odd_msgs {
        let attempts = app.attempts_of_msg(&odd_app, m).await;
        assert_eq!(attempts.len(), 2, "one attempt per endpoint: {attempts:?}");
        for a in &attempts {
            assert_eq!(a["status"], 0, "{a}");
            let ep = a["endpointId"].as_str().expect("endpoint id");
            assert_eq!(a["response"], excerpt_of(ep), "{a}");
        }
    }
    for m in &other_msgs {
        let attempts = app.attempts_of_msg(&other_app, m).await;
        assert_eq!(attempts.len(), 1, "{attempts:?}");
        assert_eq!(attempts[0]["response"], "fine");
    }
    app.shutdown().await;
}

/// The claim of the dispatcher, by hand: what `process_batch` would send.
async fn claim_all(app: &TestApp) -> Vec<herald::store::ClaimedDelivery> {
    let now = chrono::Utc::now().timestamp_millis();
    claim_up_to(&app.running().store, now, now + 60_000, 100).await
}

fn delivered(d: &herald::store::ClaimedDelivery) -> Completion {
    let now = chrono::Utc::now().timestamp_millis();
    crate::store_conformance::completion(d, NextState::Delivered, now)
}

/// A batch of outcomes in which one row truly cannot be written: its
/// attempt id is already taken (both stores refuse the row, and with it the
/// whole transaction). The completer's write path records the others, each
/// once; the refused one is counted, and its delivery is left to its lease.
async fn a_row_the_store_refuses_does_not_hold_back_the_rest_of_its_batch(db: &Backend) {
    let app = db.spawn_stepped(&[]).await;
    let rx = Receiver::start().await;
    let (app_id, _) = app_with_endpoints(&app, &[&rx]).await;
    let first = app.send_n(&app_id, 1).await.remove(0);
    assert_eq!(app.step().await.delivered, 1);
    let taken = app.attempts_of_msg(&app_id, &first).await[0]["id"]
        .as_str()
        .expect("attempt id")
        .to_owned();

    let msgs = app.send_n(&app_id, 5).await;
    let claimed = claim_all(&app).await;
    assert_eq!(claimed.len(), 5);
    let mut batch: Vec<Completion> = claimed.iter().map(delivered).collect();
    batch[3].attempt.id = AttemptId::parse(&taken).expect("attempt id");
    let refused = batch[3].attempt.msg_id.to_string();

    let report = app.running().dispatcher.record(&batch).await;
    assert_eq!(
        report,
        RecordReport {
            recorded: 4,
            degraded: 0,
            unrecorded: 1,
        }
    );
    for m in &msgs {
        let ds = app.deliveries(&app_id, m).await;
        let attempts = app.attempts_of_msg(&app_id, m).await;
        if *m == refused {
            assert_eq!(ds[0]["state"], "delivering", "left to its lease: {ds:?}");
            assert!(attempts.is_empty(), "{attempts:?}");
        } else {
            assert_eq!(ds[0]["state"], "delivered", "{ds:?}");
            assert_eq!(attempts.len(), 1, "written once: {attempts:?}");
        }
    }
    assert_eq!(
        app.attempts_of_msg(&app_id, &first).await.len(),
        1,
        "the attempt that held the id is untouched"
    );
    let metrics = app.client.get(app.url("/metrics")).text_answer().await;
    let unrecorded = metrics
        .lines()
        .find_map(|l| l.strip_prefix("herald_completions_unrecorded_total "))
        .and_then(|v| v.trim().parse::<f64>().ok());
    assert!(
        unrecorded.is_some_and(|n| n >= 1.0),
        "counted (the counter is the process's): {unrecorded:?}"
    );
    app.shutdown().await;
}

/// An attempt decided dead whose delivery another claim took over while it
/// was in flight (as a worker does once a lease has ended; a resend did
/// this once, and is refused now): the outcome is logged but changes
/// nothing, so no
/// `message.attempt.exhausted` is sent. A dead outcome that does move its
/// delivery is still reported. The stale failure counts in the endpoint's
/// failing streak: it was the endpoint's answer.
async fn a_stale_dead_outcome_sends_no_exhausted_event(db: &Backend) {
    let ops = Receiver::start().await;
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let ops_url = ops.url("/ops");
    let app = db
        .spawn_stepped(&[
            ("HERALD_OPERATOR_WEBHOOK_URL", &ops_url),
            ("HERALD_OPERATOR_WEBHOOK_SECRET", secret),
        ])
        .await;
    let rx = Receiver::start().await;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    rx.script([Reply::status(400).held(&gate)]);
    let (app_id, eps) = app_with_endpoints(&app, &[&rx]).await;
    let msg = app.send_n(&app_id, 1).await.remove(0);

    let stepping = {
        let dispatcher = app.running().dispatcher.clone();
        tokio::spawn(async move { dispatcher.process_batch().await })
    };
    rx.wait_for(1).await;
    let later = chrono::Utc::now().timestamp_millis() + 3_600_000;
    let taken = claim_up_to(&app.running().store, later, later + 60_000, 100).await;
    // (The operator's own events, such as the endpoint's creation, are
    // taken too, and given back below.)
    let mine = taken.iter().filter(|d| d.msg_id.as_str() == msg).count();
    assert_eq!(mine, 1, "the lease taken over");
    gate.add_permits(1);
    let report = stepping.await.expect("step task").expect("batch processed");
    assert_eq!((report.dead, report.unrecorded), (1, 0));
    let ds = app.deliveries(&app_id, &msg).await;
    assert_eq!(
        ds[0]["state"], "delivering",
        "the new holder's, untouched: {ds:?}"
    );
    let (_, h) = app
        .get(&format!("/api/v1/app/{app_id}/endpoint/{}/health", eps[0]))
        .await;
    assert_eq!(h["failureStreak"], 1, "{h}");

    // Given back by its holder, it is sent (200), and any operator event
    // queued meanwhile would be sent in the same step.
    let now = chrono::Utc::now().timestamp_millis();
    for d in &taken {
        app.running()
            .store
            .release(&d.id, &d.lease_token, now)
            .await
            .expect("release");
    }
    app.step().await;
    app.wait_for_state(&app_id, &msg, "delivered").await;
    let events: Vec<Value> = ops
        .requests()
        .iter()
        .map(|r| serde_json::from_slice(&r.body).expect("JSON event"))
        // The endpoint's creation is reported too; no attempt event is.
        .filter(|e: &Value| e["type"] != "endpoint.created")
        .collect();
    assert!(
        events.is_empty(),
        "no event for a stale outcome: {events:?}"
    );

    // A dead outcome that moves its delivery is reported.
    let before = ops.requests().len();
    rx.always(Reply::status(400));
    let (status, body) = app
        .post(
            &format!("/api/v1/app/{app_id}/msg/{msg}/endpoint/{}/resend", eps[0]),
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(app.step().await.dead, 1);
    app.step().await;
    let got = ops.wait_for(before + 1).await;
    let event: Value = serde_json::from_slice(&got[before].body).expect("JSON event");
    assert_eq!(event["type"], "message.attempt.exhausted", "{event}");
    assert_eq!(event["data"]["msgId"], msg.as_str());
    assert_eq!(ops.requests().len(), before + 1);
    app.shutdown().await;
}

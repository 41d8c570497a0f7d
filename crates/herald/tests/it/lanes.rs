//! Lanes: endpoints that do not answer keep a few sending slots, not all of
//! them, so a healthy endpoint beside them is served at once.

use std::sync::Arc;

use serde_json::json;

use herald::server::{self, Role};

use crate::helpers::{spawn_app, spawn_stepped, test_config, Receiver, Reply, TestApp};

/// Two receivers: `stuck`, which holds every request until the
/// semaphore returned with them gets permits, and `healthy`.
async fn stuck_and_healthy() -> (Receiver, Receiver, Arc<tokio::sync::Semaphore>) {
    let (stuck, healthy) = (Receiver::start().await, Receiver::start().await);
    let never = Arc::new(tokio::sync::Semaphore::new(0));
    stuck.always(Reply::status(200).held(&never));
    (stuck, healthy, never)
}

/// Four endpoints of `app_id` on `stuck`: `/stuck/0` … `/stuck/3`.
async fn four_stuck_endpoints(app: &TestApp, app_id: &str, stuck: &Receiver) {
    for i in 0..4 {
        app.create_endpoint(app_id, &stuck.url(&format!("/stuck/{i}")), json!({}))
            .await;
    }
}

/// With a fixed cap, four endpoints that never answer would each take 2 ×
/// 16 claims, 128 in all, more than the 64 slots: the healthy endpoint's
/// deliveries would wait for the stuck ones' timeouts (30 s here). With
/// lanes each stuck endpoint holds 2 × 4 (its lane never widens: nothing
/// comes back), and every message reaches the healthy receiver while the
/// stuck ones still hold their requests.
#[tokio::test]
async fn endpoints_that_never_answer_leave_slots_for_a_healthy_one() {
    let app = spawn_app(&[
        ("HERALD_MAX_IN_FLIGHT", "64"),
        ("HERALD_ENDPOINT_CONCURRENCY", "16"),
        ("HERALD_REQUEST_TIMEOUT", "30s"),
        ("HERALD_LEASE", "120s"),
    ])
    .await;
    let (stuck, healthy, never) = stuck_and_healthy().await;
    let app_id = app.create_app().await;
    four_stuck_endpoints(&app, &app_id, &stuck).await;
    app.create_endpoint(&app_id, &healthy.url("/healthy"), json!({}))
        .await;

    let messages = 60;
    for i in 0..messages {
        app.send_message(&app_id, "test.event", json!({ "i": i }))
            .await;
    }
    // Bounded by the helpers' patience, far below the stuck requests'
    // 30 s timeout: the healthy endpoint did not wait for them.
    let got = healthy.wait_for(messages).await;
    assert_eq!(got.len(), messages);
    let held = stuck.requests().len();
    assert!(
        (4..=4 * 2 * 16).contains(&held),
        "the stuck endpoints hold {held} requests"
    );
    never.add_permits(10_000);
    app.shutdown().await;
}

/// An endpoint this process has not seen (after a restart, or two minutes
/// idle) gets a new lane's room in its first claims, not its whole cap:
/// stuck endpoints whose backlog a freshly started worker meets first
/// cannot take every slot before their (missing) answers show, and a
/// healthy endpoint's deliveries behind them are sent while they still
/// hold their requests.
#[tokio::test]
async fn unseen_stuck_endpoints_start_narrow_and_leave_slots() {
    let overrides = [
        ("HERALD_MAX_IN_FLIGHT", "64"),
        ("HERALD_ENDPOINT_CONCURRENCY", "16"),
        // Far past the helpers' patience: a healthy delivery that waited
        // for a stuck request's end would fail the test.
        ("HERALD_REQUEST_TIMEOUT", "300s"),
        ("HERALD_LEASE", "700s"),
    ];
    // The API alone first: the backlog waits in the store.
    let app = spawn_stepped(&overrides).await;
    let (stuck, healthy, never) = stuck_and_healthy().await;
    let stuck_app = app.create_app().await;
    four_stuck_endpoints(&app, &stuck_app, &stuck).await;
    let (healthy_app, _) = app
        .app_with_endpoint(&healthy.url("/healthy"), json!({}))
        .await;
    // 40 per stuck endpoint, older than the healthy ones: with their whole
    // room (2 × 16) in the first claim the four would take 128, every one
    // of the 64 slots.
    for i in 0..40 {
        app.send_message(&stuck_app, "test.event", json!({ "i": i }))
            .await;
    }
    let messages = 20;
    for i in 0..messages {
        app.send_message(&healthy_app, "test.event", json!({ "i": i }))
            .await;
    }
    // A worker starts on that store and meets them all at once.
    let worker = server::start(test_config(app._dir.path(), &overrides), None, Role::Worker)
        .await
        .expect("the worker starts");
    let got = healthy.wait_for(messages).await;
    assert_eq!(got.len(), messages);
    let held = stuck.requests().len();
    assert!(
        held <= 4 * 2 * 4,
        "four unseen stuck endpoints hold {held} requests, more than a new lane's room each"
    );
    never.add_permits(10_000);
    worker.shutdown().await.expect("the worker stops");
    app.shutdown().await;
}

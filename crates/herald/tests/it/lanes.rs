//! Lanes: endpoints that do not answer keep a few sending slots, not all of
//! them, so a healthy endpoint beside them is served at once.

use std::sync::Arc;

use serde_json::json;

use crate::helpers::{spawn_app, Receiver, Reply};

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
    let (stuck, healthy) = (Receiver::start().await, Receiver::start().await);
    let never = Arc::new(tokio::sync::Semaphore::new(0));
    stuck.always(Reply::status(200).held(&never));
    let app_id = app.create_app().await;
    for i in 0..4 {
        app.create_endpoint(&app_id, &stuck.url(&format!("/stuck/{i}")), json!({}))
            .await;
    }
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

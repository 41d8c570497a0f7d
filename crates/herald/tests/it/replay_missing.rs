//! Svix's replay-missing: messages an endpoint never got (made before it,
//! sent while it was disabled by a person, filtered otherwise then) are
//! delivered to it once, on both stores.

use axum::http::StatusCode;
use serde_json::{json, Value};

use crate::helpers::*;

crate::on_both_stores!(
    replay_missing_delivers_what_an_endpoint_never_got_once,
    what_an_endpoint_missed_while_disabled_by_a_person_is_replayed,
);

async fn replay_missing(app: &TestApp, app_id: &str, ep: &str, body: Value) -> (StatusCode, Value) {
    app.post(
        &format!("/api/v1/app/{app_id}/endpoint/{ep}/replay-missing"),
        body,
    )
    .await
}

/// Steps the dispatcher until nothing is due (a bounded number of times).
async fn drain(app: &TestApp) {
    for _ in 0..20 {
        if app.step().await.claimed == 0 {
            return;
        }
    }
    panic!("deliveries were still due after 20 steps");
}

fn count_to(deliveries: &[Value], ep: &str) -> usize {
    deliveries.iter().filter(|d| d["endpointId"] == ep).count()
}

async fn replay_missing_delivers_what_an_endpoint_never_got_once(backend: &Backend) {
    let app = backend.spawn_stepped(&[]).await;
    let rx = Receiver::start().await;
    app.create_event_types(&["a", "b"]).await;
    let (app_id, first) = app.app_with_endpoint(&rx.url("/first"), json!({})).await;
    let since = "2020-01-01T00:00:00Z";
    let m1 = app.send_message(&app_id, "a", json!({"n": 1})).await;
    // Created after m1; gets m2 the ordinary way.
    let late = app
        .create_endpoint(&app_id, &rx.url("/late"), json!({}))
        .await;
    let late = late["id"].as_str().expect("id").to_owned();
    let m2 = app.send_message(&app_id, "a", json!({"n": 2})).await;
    let m3 = app.send_message(&app_id, "b", json!({"n": 3})).await;
    // Only "a": it would get m1 and m2, never m3.
    let only_a = app
        .create_endpoint(&app_id, &rx.url("/only-a"), json!({"filterTypes": ["a"]}))
        .await;
    let only_a = only_a["id"].as_str().expect("id").to_owned();
    drain(&app).await;

    let (status, out) = replay_missing(&app, &app_id, &late, json!({"since": since})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{out}");
    assert_eq!(out["status"], "running");
    assert_eq!(out["task"], "endpoint.replay");
    let id = out["id"].as_str().expect("id");
    assert!(
        id.len() == 33
            && id.starts_with("qtask_")
            && id[6..].chars().all(|c| c.is_ascii_alphanumeric()),
        "{id}"
    );
    let (status, _) = replay_missing(&app, &app_id, &only_a, json!({"since": since})).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    // A repeat makes nothing new.
    let (status, _) = replay_missing(&app, &app_id, &late, json!({"since": since})).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    drain(&app).await;

    let (d1, d2, d3) = (
        app.deliveries(&app_id, &m1).await,
        app.deliveries(&app_id, &m2).await,
        app.deliveries(&app_id, &m3).await,
    );
    assert_eq!(count_to(&d1, &late), 1, "m1 reached the late endpoint once");
    assert_eq!(count_to(&d2, &late), 1, "m2 it had already: no second");
    assert_eq!(count_to(&d3, &late), 1);
    assert_eq!((count_to(&d1, &only_a), count_to(&d2, &only_a)), (1, 1));
    assert_eq!(count_to(&d3, &only_a), 0, "its filter leaves m3 out");
    assert_eq!(count_to(&d1, &first), 1);
    let paths: Vec<String> = rx.requests().iter().map(|r| r.path.clone()).collect();
    assert_eq!(
        paths.iter().filter(|p| *p == "/late").count(),
        3,
        "{paths:?}"
    );
    assert_eq!(
        paths.iter().filter(|p| *p == "/only-a").count(),
        2,
        "{paths:?}"
    );
    assert!(d1.iter().all(|d| d["state"] == "delivered"), "{d1:?}");

    // A window that ends before m1 holds nothing.
    let fresh = app
        .create_endpoint(&app_id, &rx.url("/fresh"), json!({}))
        .await;
    let fresh = fresh["id"].as_str().expect("id").to_owned();
    let (status, _) = replay_missing(
        &app,
        &app_id,
        &fresh,
        json!({"since": since, "until": "2020-01-02T00:00:00Z"}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(count_to(&app.deliveries(&app_id, &m1).await, &fresh), 0);

    // Bad input is named; an unknown endpoint is 404.
    let (status, body) = replay_missing(
        &app,
        &app_id,
        &fresh,
        json!({"since": since, "until": "2019-01-01T00:00:00Z"}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(body.to_string().contains("until"), "{body}");
    let (status, _) = replay_missing(&app, &app_id, "ep_nosuch", json!({"since": since})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    app.shutdown().await;
}

async fn what_an_endpoint_missed_while_disabled_by_a_person_is_replayed(backend: &Backend) {
    let app = backend.spawn_stepped(&[]).await;
    let rx = Receiver::start().await;
    let (app_id, ep) = app.app_with_endpoint(&rx.url("/"), json!({})).await;
    let base = format!("/api/v1/app/{app_id}/endpoint/{ep}");
    let (status, _) = app.post(&format!("{base}/disable"), json!({})).await;
    assert_eq!(status, StatusCode::OK);
    let missed = app.send_message(&app_id, "a.b", json!({})).await;
    assert!(app.deliveries(&app_id, &missed).await.is_empty());
    let (status, _) = app.post(&format!("{base}/enable"), json!({})).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) =
        replay_missing(&app, &app_id, &ep, json!({"since": "2020-01-01T00:00:00Z"})).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    drain(&app).await;
    let d = app.deliveries(&app_id, &missed).await;
    assert_eq!(d.len(), 1);
    assert_eq!(d[0]["state"], "delivered");
    rx.wait_for(1).await;
    app.shutdown().await;
}

//! Endpoint health, auto-disable and operator webhooks, end to end: real
//! receivers, the dispatcher stepped by hand so nothing depends on timing.

use axum::http::StatusCode;
use serde_json::{json, Value};

use crate::helpers::*;

/// An app with one endpoint pointed at `rx`; returns (app id, endpoint id).
async fn health(app: &TestApp, app_id: &str, ep_id: &str) -> Value {
    let (status, h) = app
        .get(&format!("/api/v1/app/{app_id}/endpoint/{ep_id}/health"))
        .await;
    assert_eq!(status, StatusCode::OK, "{h}");
    h
}

#[tokio::test]
async fn a_failing_streak_disables_holds_and_resumes_on_enable() {
    let app = spawn_stepped(&[
        ("HERALD_DISABLE_AFTER", "3"),
        ("HERALD_DISABLE_MIN_WINDOW", "0s"),
        ("HERALD_RETRY_SCHEDULE", "0ms,0ms,0ms,0ms"),
    ])
    .await;
    let rx = Receiver::start().await;
    rx.always(Reply::status(500));
    let (app_id, ep_id) = app.app_with_endpoint(&rx.url("/hook"), json!({})).await;
    app.send_n(&app_id, 3).await;
    assert_eq!(app.step().await.retried, 3);

    let h = health(&app, &app_id, &ep_id).await;
    assert_eq!(h["failureStreak"], 3);
    assert_eq!(h["disabled"], true, "{h}");
    assert_eq!(
        h["disabledReason"], "3 consecutive failed attempts over 0s",
        "{h}"
    );
    assert_eq!(h["lastError"], "HTTP 500");
    assert_eq!(h["lastHour"]["attempts"], 3);
    assert_eq!(h["lastHour"]["failures"], 3);
    assert_eq!(h["lastHour"]["failureRate"], 1.0);
    assert!(h["lastHour"]["p50Ms"].is_i64(), "{h}");
    assert!(h["lastSuccessAt"].is_null());
    let (_, ep) = app
        .get(&format!("/api/v1/app/{app_id}/endpoint/{ep_id}"))
        .await;
    assert_eq!(ep["disabled"], true);

    // Held: the retries fall due at once but are not attempted, and a new
    // message is routed to the (automatically) disabled endpoint and held.
    let late = app.send_n(&app_id, 1).await;
    assert_eq!(app.step().await.claimed, 0);
    assert_eq!(rx.requests().len(), 3);
    let held = app.deliveries(&app_id, &late[0]).await;
    assert_eq!(held.len(), 1);
    assert_eq!(held[0]["state"], "pending");

    // Enabling (here by PATCH, as the Svix SDKs do) resumes everything.
    rx.always(Reply::status(200));
    let (status, out) = app
        .patch(
            &format!("/api/v1/app/{app_id}/endpoint/{ep_id}"),
            json!({"disabled": false}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(out["disabled"], false);
    let h = health(&app, &app_id, &ep_id).await;
    assert_eq!(
        (h["failureStreak"].clone(), h["disabledReason"].clone()),
        (json!(0), Value::Null)
    );
    assert_eq!(app.step().await.delivered, 4);
    assert_eq!(rx.requests().len(), 7);
    let h = health(&app, &app_id, &ep_id).await;
    assert_eq!(h["lastHour"]["attempts"], 7);
    assert_eq!(h["lastHour"]["successes"], 4);
    assert!(h["lastSuccessAt"].is_string(), "{h}");
    app.shutdown().await;
}

#[tokio::test]
async fn the_window_must_pass_too_and_any_success_resets_the_streak() {
    let app = spawn_stepped(&[
        ("HERALD_DISABLE_AFTER", "2"),
        ("HERALD_DISABLE_MIN_WINDOW", "1h"),
        ("HERALD_RETRY_SCHEDULE", "0ms,0ms,0ms,0ms"),
    ])
    .await;
    let rx = Receiver::start().await;
    rx.always(Reply::status(503));
    let (app_id, ep_id) = app.app_with_endpoint(&rx.url("/hook"), json!({})).await;
    app.send_n(&app_id, 3).await;
    app.step().await;
    let h = health(&app, &app_id, &ep_id).await;
    assert_eq!(h["failureStreak"], 3);
    assert_eq!(h["disabled"], false, "a streak younger than the window");

    // One success in the next batch ends the streak.
    rx.script([Reply::status(503), Reply::status(200), Reply::status(503)]);
    app.step().await;
    let h = health(&app, &app_id, &ep_id).await;
    assert!(h["failureStreak"].as_u64().expect("streak") <= 2, "{h}");
    assert!(h["lastSuccessAt"].is_string());
    assert_eq!(h["disabled"], false);
    app.shutdown().await;
}

#[tokio::test]
async fn gone_disables_at_once_and_the_reason_says_so() {
    let app = spawn_stepped(&[]).await;
    let rx = Receiver::start().await;
    rx.always(Reply::status(410));
    let (app_id, ep_id) = app.app_with_endpoint(&rx.url("/hook"), json!({})).await;
    app.send_n(&app_id, 1).await;
    let report = app.step().await;
    assert_eq!(report.dead, 1, "410 is a permanent status for the delivery");
    let h = health(&app, &app_id, &ep_id).await;
    assert_eq!(h["disabled"], true);
    assert_eq!(h["disabledReason"], "the endpoint answered 410 Gone");
    assert_eq!(h["failureStreak"], 1);
    app.shutdown().await;
}

/// A 410 followed in the same batch of outcomes by a success of the same
/// endpoint (whose streak the success ends) disables it all the same.
#[tokio::test]
async fn gone_disables_even_when_a_success_follows_in_its_batch() {
    let app = spawn_stepped(&[]).await;
    let rx = Receiver::start().await;
    let (app_id, ep_id) = app.app_with_endpoint(&rx.url("/hook"), json!({})).await;
    let sent = app.send_n(&app_id, 2).await;
    let gone = sent[0].clone();
    rx.answer_with(move |r| match r.header("webhook-id") == gone {
        true => Reply::status(410),
        false => Reply::status(200),
    });
    let report = app.step().await;
    assert_eq!((report.dead, report.delivered), (1, 1), "{report:?}");
    let h = health(&app, &app_id, &ep_id).await;
    assert_eq!(h["disabled"], true, "{h}");
    assert_eq!(h["disabledReason"], "the endpoint answered 410 Gone");
    app.shutdown().await;
}

#[tokio::test]
async fn held_deliveries_past_the_age_cap_die_at_enable_and_stay_replayable() {
    let app = spawn_stepped(&[
        ("HERALD_DISABLE_AFTER", "1"),
        ("HERALD_DISABLE_MIN_WINDOW", "0s"),
        ("HERALD_MAX_AGE", "300ms"),
    ])
    .await;
    let rx = Receiver::start().await;
    rx.always(Reply::status(500));
    let (app_id, ep_id) = app.app_with_endpoint(&rx.url("/hook"), json!({})).await;
    let ids = app.send_n(&app_id, 1).await;
    assert_eq!(app.step().await.retried, 1);
    assert_eq!(health(&app, &app_id, &ep_id).await["disabled"], true);
    // The age cap is measured on the store's clock: let it pass.
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;

    let out = app.enable_endpoint(&app_id, &ep_id).await;
    assert_eq!(out["expiredDeliveries"], 1);
    assert_eq!(out["endpoint"]["disabled"], false);
    let ds = app.deliveries(&app_id, &ids[0]).await;
    assert_eq!(
        (ds[0]["state"].clone(), ds[0]["deadReason"].clone()),
        (json!("dead"), json!("too_old")),
        "{ds:?}"
    );

    rx.always(Reply::status(200));
    let (status, out) = app
        .post(
            "/api/v1/dead-letter/replay",
            json!({"app_id": app_id, "reason": "too_old"}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{out}");
    assert_eq!(out["replayed"], 1);
    assert_eq!(app.step().await.delivered, 1);
    assert_eq!(rx.requests().len(), 2);
    app.shutdown().await;
}

#[tokio::test]
async fn disabling_by_hand_routes_nothing_new_and_records_the_reason() {
    let app = spawn_stepped(&[]).await;
    let rx = Receiver::start().await;
    let (app_id, ep_id) = app.app_with_endpoint(&rx.url("/hook"), json!({})).await;
    let (status, out) = app
        .post(
            &format!("/api/v1/app/{app_id}/endpoint/{ep_id}/disable"),
            json!({"reason": "customer asked"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(out["disabled"], true);
    assert_eq!(
        health(&app, &app_id, &ep_id).await["disabledReason"],
        "customer asked"
    );
    let ids = app.send_n(&app_id, 1).await;
    assert!(app.deliveries(&app_id, &ids[0]).await.is_empty());
    let (status, out) = app
        .post(
            &format!("/api/v1/app/{app_id}/endpoint/{ep_id}/disable"),
            json!({"reason": 5}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{out}");
    assert_eq!(out["detail"][0]["loc"][1], "reason", "{out}");
    app.shutdown().await;
}

#[tokio::test]
async fn dead_letters_list_and_replay_across_apps_with_filters() {
    let app = spawn_stepped(&[]).await;
    let rx = Receiver::start().await;
    rx.always(Reply::status(400));
    let (a, _) = app.app_with_endpoint(&rx.url("/hook"), json!({})).await;
    let (b, eb) = app.app_with_endpoint(&rx.url("/hook"), json!({})).await;
    app.send_n(&a, 2).await;
    app.send_message(&b, "invoice.paid", json!({})).await;
    assert_eq!(app.step().await.dead, 3);

    let (status, all) = app.get("/api/v1/dead-letter?limit=2").await;
    assert_eq!(status, StatusCode::OK, "{all}");
    assert_eq!(all["data"].as_array().map(Vec::len), Some(2));
    assert_eq!(all["done"], false);
    let (_, of_type) = app.get("/api/v1/dead-letter?event_type=invoice.paid").await;
    assert_eq!(of_type["data"].as_array().map(Vec::len), Some(1));
    assert_eq!(of_type["data"][0]["endpointId"], eb.as_str());
    // A query's errors name the query, where they said `body` on a GET.
    for (query, field) in [
        ("since=yesterday", "since"),
        ("reason=bored", "reason"),
        ("endpoint_id=foo", "endpoint_id"),
    ] {
        let (status, bad) = app.get(&format!("/api/v1/dead-letter?{query}")).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
        assert_eq!(bad["detail"][0]["loc"], json!(["query", field]), "{bad}");
    }
    let (status, _) = app.get("/api/v1/dead-letter?app_id=app_nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    rx.always(Reply::status(200));
    let first = of_type["data"][0]["id"].as_str().expect("id").to_owned();
    let (status, out) = app
        .post("/api/v1/dead-letter/replay", json!({"ids": [first]}))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{out}");
    assert_eq!(out["replayed"], 1);
    let (status, out) = app
        .post("/api/v1/dead-letter/replay", json!({"ids": ["nope"]}))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{out}");
    let (status, out) = app
        .post("/api/v1/dead-letter/replay", json!({"limit": 5000}))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{out}");
    let (_, out) = app
        .post("/api/v1/dead-letter/replay", json!({"app_id": a}))
        .await;
    assert_eq!(
        (out["replayed"].clone(), out["done"].clone()),
        (json!(2), json!(true))
    );
    assert_eq!(app.step().await.delivered, 3);
    let (_, left) = app.get("/api/v1/dead-letter").await;
    assert_eq!(left["data"].as_array().map(Vec::len), Some(0));
    app.shutdown().await;
}

fn verify_operator(secret: &str, r: &Recorded) -> Value {
    r.verified_by(secret)
        .expect("operator events are signed with the configured secret");
    serde_json::from_slice(&r.body).expect("JSON event")
}

/// The operator events received so far, verified, once every one of
/// `types` is among them (bounded wait).
pub(crate) async fn operator_events(ops: &Receiver, secret: &str, types: &[&str]) -> Vec<Value> {
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let events: Vec<Value> = ops
            .requests()
            .iter()
            .map(|r| verify_operator(secret, r))
            .collect();
        if types.iter().all(|t| events.iter().any(|e| e["type"] == *t)) {
            return events;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never got all of {types:?}: {events:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn operator_webhooks_report_disable_enable_and_exhaustion() {
    let ops = Receiver::start().await;
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let app = spawn_stepped(&[
        ("HERALD_DISABLE_AFTER", "1"),
        ("HERALD_DISABLE_MIN_WINDOW", "0s"),
        ("HERALD_OPERATOR_WEBHOOK_URL", &ops.url("/ops")),
        ("HERALD_OPERATOR_WEBHOOK_SECRET", secret),
    ])
    .await;
    let rx = Receiver::start().await;
    rx.always(Reply::status(400));
    let (app_id, ep_id) = app.app_with_endpoint(&rx.url("/hook"), json!({})).await;
    let msg = app.send_n(&app_id, 1).await.remove(0);
    assert_eq!(app.step().await.dead, 1);
    // The events travel the durable path: the next step delivers them.
    app.step().await;
    let events = operator_events(
        &ops,
        secret,
        &["endpoint.disabled", "message.attempt.exhausted"],
    )
    .await;
    let of_type = |t: &str| {
        events
            .iter()
            .find(|e| e["type"] == t)
            .unwrap_or_else(|| panic!("no {t} in {events:?}"))
            .clone()
    };
    let disabled = of_type("endpoint.disabled");
    assert_eq!(disabled["data"]["endpointId"], ep_id.as_str());
    assert_eq!(disabled["data"]["appId"], app_id.as_str());
    assert_eq!(disabled["data"]["trigger"], "automatic");
    let exhausted = of_type("message.attempt.exhausted");
    assert_eq!(exhausted["data"]["msgId"], msg.as_str());
    assert_eq!(exhausted["data"]["reason"], "permanent_status");
    assert_eq!(exhausted["data"]["lastAttempt"]["responseStatusCode"], 400);

    app.enable_endpoint(&app_id, &ep_id).await;
    app.step().await;
    let events = operator_events(&ops, secret, &["endpoint.enabled"]).await;
    let enabled = events
        .iter()
        .find(|e| e["type"] == "endpoint.enabled")
        .expect("enabled")
        .clone();
    assert_eq!(enabled["data"]["endpointId"], ep_id.as_str());
    app.shutdown().await;
}

#[tokio::test]
async fn operator_webhooks_need_a_valid_secret() {
    let dir = tempfile::tempdir().expect("tempdir");
    let values: std::collections::BTreeMap<String, String> = [
        ("HERALD_OPERATOR_WEBHOOK_URL", "http://127.0.0.1:9/ops"),
        (
            "HERALD_DATABASE_URL",
            &format!("sqlite://{}", dir.path().join("h.db").display()),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let err = herald::config::Config::from_values(&values).expect_err("secret required");
    assert!(
        err.to_string().contains("HERALD_OPERATOR_WEBHOOK_SECRET"),
        "{err}"
    );
    let mut bad = values.clone();
    bad.insert("HERALD_OPERATOR_WEBHOOK_SECRET".into(), "hunter2".into());
    let err = herald::config::Config::from_values(&bad).expect_err("bad secret");
    assert!(
        err.to_string().contains("HERALD_OPERATOR_WEBHOOK_SECRET"),
        "{err}"
    );
    let mut bad_url = values;
    bad_url.insert("HERALD_OPERATOR_WEBHOOK_URL".into(), "ftp://x".into());
    bad_url.insert(
        "HERALD_OPERATOR_WEBHOOK_SECRET".into(),
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into(),
    );
    let err = herald::config::Config::from_values(&bad_url).expect_err("bad url");
    assert!(
        err.to_string().contains("HERALD_OPERATOR_WEBHOOK_URL"),
        "{err}"
    );
}

#[tokio::test]
async fn operator_webhooks_reach_an_internal_address_that_customers_cannot() {
    let ops = Receiver::start().await;
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let app = spawn_stepped(&[
        ("HERALD_ALLOW_PRIVATE_NETWORKS", "false"),
        ("HERALD_DISABLE_AFTER", "1"),
        ("HERALD_DISABLE_MIN_WINDOW", "0s"),
        ("HERALD_OPERATOR_WEBHOOK_URL", &ops.url("/ops")),
        ("HERALD_OPERATOR_WEBHOOK_SECRET", secret),
    ])
    .await;
    // A customer endpoint on loopback, slipped past the API's check
    // (straight into the store): the sender still refuses it.
    let customer = Receiver::start().await;
    let app_id = app.create_app().await;
    let (status, refused) = app
        .post(
            &format!("/api/v1/app/{app_id}/endpoint"),
            json!({"url": customer.url("/")}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    let app_key = herald::ids::AppId::parse(&app_id).expect("id");
    let now = chrono::Utc::now().timestamp_millis();
    app.running()
        .store
        .create_endpoint(&herald::store::Endpoint::new(
            app_key,
            customer.url("/"),
            secret,
            now,
        ))
        .await
        .expect("endpoint");
    app.send_n(&app_id, 1).await;
    app.step().await;
    app.step().await;
    // The operator's own URL, from the configuration, is trusted.
    let got = ops.wait_for(1).await;
    let event = verify_operator(secret, &got[0]);
    assert_eq!(event["type"], "endpoint.disabled");
    assert!(
        customer.requests().is_empty(),
        "the customer's loopback URL got nothing"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn operator_webhooks_report_endpoint_changes_and_failing_then_recovered_as_svix_does() {
    let ops = Receiver::start().await;
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let app = spawn_app(&[
        ("HERALD_RETRY_SCHEDULE", "0ms,0ms,0ms,0ms,0ms,0ms"),
        ("HERALD_OPERATOR_WEBHOOK_URL", &ops.url("/ops")),
        ("HERALD_OPERATOR_WEBHOOK_SECRET", secret),
    ])
    .await;
    let rx = Receiver::start().await;
    // Four failures, then a success: failing after the fourth, recovered
    // on the fifth.
    rx.script((0..4).map(|_| Reply::status(503)));
    let (s, a) = app
        .post(
            "/api/v1/app",
            json!({"name": "ops-test", "uid": "ops-test"}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{a}");
    let app_id = a["id"].as_str().expect("id").to_owned();
    let ep = app
        .create_endpoint(&app_id, &rx.url("/"), json!({"uid": "ep-one"}))
        .await;
    let ep_id = ep["id"].as_str().expect("id").to_owned();
    let (s, _) = app
        .patch(
            &format!("/api/v1/app/{app_id}/endpoint/{ep_id}"),
            json!({"description": "changed"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, out) = app
        .post(
            &format!("/api/v1/app/{app_id}/msg"),
            json!({"eventType": "a.b", "eventId": "evt-7", "payload": {}}),
        )
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{out}");
    let msg_id = out["id"].as_str().expect("id").to_owned();
    app.wait_for_state(&app_id, &msg_id, "delivered").await;
    let events = operator_events(
        &ops,
        secret,
        &[
            "endpoint.created",
            "endpoint.updated",
            "message.attempt.failing",
            "message.attempt.recovered",
        ],
    )
    .await;
    let of_type =
        |t: &str| -> Vec<Value> { events.iter().filter(|e| e["type"] == t).cloned().collect() };
    for t in ["endpoint.created", "endpoint.updated"] {
        let e = of_type(t);
        assert_eq!(e.len(), 1, "{t}: {events:?}");
        assert_eq!(
            e[0]["data"],
            json!({"appId": app_id, "appUid": "ops-test", "endpointId": ep_id, "endpointUid": "ep-one"})
        );
    }
    let failing = of_type("message.attempt.failing");
    assert_eq!(failing.len(), 1, "only the fourth failure: {events:?}");
    let recovered = of_type("message.attempt.recovered");
    assert_eq!(recovered.len(), 1);
    for (e, status) in [(&failing[0], 503), (&recovered[0], 200)] {
        let d = &e["data"];
        assert_eq!(d["appId"], app_id.as_str());
        assert_eq!(d["appUid"], "ops-test");
        assert_eq!(d["msgId"], msg_id.as_str());
        assert_eq!(d["msgEventId"], "evt-7");
        assert_eq!(d["endpointId"], ep_id.as_str());
        assert_eq!(d["lastAttempt"]["responseStatusCode"], status);
        assert!(d["lastAttempt"]["id"]
            .as_str()
            .is_some_and(|i| i.starts_with("atmpt_")));
        assert!(d["lastAttempt"]["timestamp"].is_string());
    }
    assert!(of_type("message.attempt.exhausted").is_empty());

    let (s, _) = app
        .delete(&format!("/api/v1/app/{app_id}/endpoint/{ep_id}"))
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let events = operator_events(&ops, secret, &["endpoint.deleted"]).await;
    let deleted = events
        .iter()
        .find(|e| e["type"] == "endpoint.deleted")
        .expect("deleted");
    assert_eq!(deleted["data"]["endpointUid"], "ep-one");
    app.shutdown().await;
}

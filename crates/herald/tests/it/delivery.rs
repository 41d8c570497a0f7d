//! The delivery engine end to end: real server, real receivers.

use std::time::{Duration, SystemTime};

use axum::http::StatusCode;
use serde_json::json;

use crate::helpers::*;

fn verify(secret: &str, r: &Recorded) {
    r.verified_by(secret)
        .expect("signature verifies with the standardwebhooks crate");
}

#[tokio::test]
async fn happy_path_carries_every_header_and_the_exact_body() {
    let app = spawn_app(&[]).await;
    let rx = Receiver::start().await;
    let (app_id, ep_id) = app.app_with_endpoint(&rx.url("/hook"), json!({})).await;
    let secret = app.endpoint_secret(&app_id, &ep_id).await;
    assert!(secret.starts_with("whsec_"));

    // Odd spacing on purpose: receivers must get the bytes as sent.
    let raw = r#"{"eventType":"user.created","payload":{"b": 2,  "a":[1, 2.50]}}"#;
    let resp = app
        .client
        .post(app.url(&format!("/api/v1/app/{app_id}/msg")))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body(raw)
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 202);
    let msg: serde_json::Value = resp.json().await.expect("json");
    let msg_id = msg["id"].as_str().expect("id").to_owned();
    assert!(msg_id.starts_with("msg_"));
    assert_eq!(msg["payload"], json!({"b": 2, "a": [1, 2.5]}));

    let got = rx.wait_for(1).await;
    let r = &got[0];
    assert_eq!(r.path, "/hook");
    assert_eq!(&r.body[..], br#"{"b": 2,  "a":[1, 2.50]}"#);
    assert_eq!(r.header("content-type"), "application/json");
    assert_eq!(r.header("webhook-id"), msg_id);
    let ts: i64 = r
        .header("webhook-timestamp")
        .parse()
        .expect("integer timestamp");
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    assert!(
        (now - ts).abs() <= 5,
        "timestamp {ts} is this attempt's time ({now})"
    );
    assert!(r.header("webhook-signature").starts_with("v1,"));
    verify(&secret, r);
    assert_eq!(r.header("x-event-type"), "user.created");
    assert!(r.header("idempotency-key").starts_with("dlv_"));
    assert_eq!(r.header("x-event-id"), r.header("idempotency-key"));
    assert_eq!(r.header("x-attempt"), "1");
    assert_eq!(
        r.header("user-agent"),
        format!("Herald/{}", env!("CARGO_PKG_VERSION"))
    );

    let ds = app.wait_for_state(&app_id, &msg_id, "delivered").await;
    assert_eq!(ds.len(), 1);
    assert_eq!(
        r.header("idempotency-key"),
        ds[0]["id"].as_str().expect("delivery id")
    );
    assert!(r.header("idempotency-key").starts_with("dlv_"));

    let attempts = app.attempts_of_msg(&app_id, &msg_id).await;
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0]["status"], 0);
    assert_eq!(attempts[0]["statusText"], "success");
    assert_eq!(attempts[0]["responseStatusCode"], 200);
    assert_eq!(attempts[0]["triggerType"], 0);
    assert_eq!(attempts[0]["endpointId"], ep_id);
    assert_eq!(attempts[0]["msgId"], msg_id.as_str());
    app.shutdown().await;
}

#[tokio::test]
async fn two_server_errors_then_success_is_three_attempts_with_one_key() {
    let app = spawn_app(&[]).await;
    let rx = Receiver::start().await;
    rx.script([Reply::status(500), Reply::status(503)]);
    let (app_id, ep_id) = app.app_with_endpoint(&rx.url("/"), json!({})).await;
    let secret = app.endpoint_secret(&app_id, &ep_id).await;
    let msg = app
        .send_message(&app_id, "order.paid", json!({"n": 1}))
        .await;

    let got = rx.wait_for(3).await;
    assert_eq!(got.len(), 3);
    let key = got[0].header("idempotency-key");
    for (i, r) in got.iter().enumerate() {
        assert_eq!(r.header("idempotency-key"), key);
        assert_eq!(r.header("webhook-id"), msg);
        assert_eq!(r.header("x-attempt"), (i + 1).to_string());
        verify(&secret, r); // signed afresh on every attempt
    }
    let ds = app.wait_for_state(&app_id, &msg, "delivered").await;
    assert_eq!(ds[0]["attempts"], 3);
    let attempts = app.attempts_of_msg(&app_id, &msg).await;
    let codes: Vec<_> = attempts
        .iter()
        .map(|a| a["responseStatusCode"].clone())
        .collect();
    assert_eq!(codes, vec![json!(500), json!(503), json!(200)]);
    assert_eq!(
        attempts
            .iter()
            .map(|a| a["status"].clone())
            .collect::<Vec<_>>(),
        vec![json!(2), json!(2), json!(0)]
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_permanent_status_is_dead_after_one_attempt_and_never_retried() {
    let app = spawn_stepped(&[("HERALD_RETRY_SCHEDULE", "0ms,0ms,0ms")]).await;
    let rx = Receiver::start().await;
    rx.always(Reply::status(400).body("bad signature, go away"));
    let (app_id, _) = app.app_with_endpoint(&rx.url("/"), json!({})).await;
    let msg = app.send_message(&app_id, "a.b", json!({})).await;

    let report = app.step().await;
    assert_eq!((report.claimed, report.dead), (1, 1));
    // The whole schedule is zero-length: were it retryable, these steps
    // would send it again.
    for _ in 0..4 {
        assert_eq!(app.step().await.claimed, 0);
    }
    assert_eq!(rx.requests().len(), 1);
    let ds = app.deliveries(&app_id, &msg).await;
    assert_eq!(ds[0]["state"], "dead");
    assert_eq!(ds[0]["deadReason"], "permanent_status");
    assert_eq!(ds[0]["lastStatusCode"], 400);
    let attempts = app.attempts_of_msg(&app_id, &msg).await;
    assert_eq!(attempts[0]["response"], "bad signature, go away");
    app.shutdown().await;
}

/// A receiver that answers 200 and then breaks its body off (it promised
/// more bytes than it sent, then closed): the 200 is its answer, the
/// delivery is delivered, and nothing is sent again.
#[tokio::test]
async fn a_2xx_whose_body_breaks_off_is_delivered_once() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
    let requests = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = requests.clone();
    let server = tokio::spawn(async move {
        // Bounded: at most a few connections in this test.
        for _ in 0..4 {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                match conn.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                }
            }
            let _ = conn
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\naccepted")
                .await;
            drop(conn);
        }
    });
    let app = spawn_stepped(&[]).await;
    let (app_id, _) = app.app_with_endpoint(&url, json!({})).await;
    let msg = app.send_message(&app_id, "a.b", json!({})).await;
    let report = app.step().await;
    assert_eq!(report.delivered, 1, "{report:?}");
    let attempts = app.attempts_of_msg(&app_id, &msg).await;
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    assert_eq!(attempts[0]["responseStatusCode"], 200);
    assert_eq!(attempts[0]["response"], "accepted");
    assert_eq!(app.step().await.claimed, 0, "nothing to send again");
    assert_eq!(requests.load(std::sync::atomic::Ordering::SeqCst), 1);
    server.abort();
    app.shutdown().await;
}

#[tokio::test]
async fn redirects_are_not_followed_and_are_permanent() {
    let app = spawn_stepped(&[]).await;
    let rx = Receiver::start().await;
    rx.always(Reply::status(301).header("location", &rx.url("/elsewhere")));
    let (app_id, _) = app.app_with_endpoint(&rx.url("/here"), json!({})).await;
    let msg = app.send_message(&app_id, "a.b", json!({})).await;
    assert_eq!(app.step().await.dead, 1);
    let paths: Vec<_> = rx.requests().iter().map(|r| r.path.clone()).collect();
    assert_eq!(paths, vec!["/here"]);
    assert_eq!(
        app.deliveries(&app_id, &msg).await[0]["deadReason"],
        "permanent_status"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn timeouts_408_429_and_refused_connections_are_retried() {
    let app = spawn_stepped(&[
        ("HERALD_REQUEST_TIMEOUT", "1s"),
        ("HERALD_LEASE", "4s"),
        ("HERALD_RETRY_SCHEDULE", "0ms,0ms,0ms,0ms"),
    ])
    .await;
    let rx = Receiver::start().await;
    rx.script([
        Reply::status(408),
        Reply::status(429),
        Reply::status(200).delay(Duration::from_secs(2)),
        Reply::status(200),
    ]);
    let (app_id, _) = app.app_with_endpoint(&rx.url("/"), json!({})).await;
    let msg = app.send_message(&app_id, "a.b", json!({})).await;
    for expected_status in [Some(408), Some(429), None] {
        let report = app.step().await;
        assert_eq!(
            (report.claimed, report.retried),
            (1, 1),
            "after {expected_status:?}"
        );
    }
    let report = app.step().await;
    assert_eq!(report.delivered, 1);
    let attempts = app.attempts_of_msg(&app_id, &msg).await;
    assert_eq!(attempts.len(), 4);
    assert_eq!(attempts[2]["responseStatusCode"], 0);
    assert!(
        attempts[2]["error"]
            .as_str()
            .expect("error")
            .contains("timed out"),
        "{}",
        attempts[2]
    );

    // Nobody listening: a network error, retried.
    let port = closed_port().await;
    let (app2, _) = app
        .app_with_endpoint(&format!("http://127.0.0.1:{port}/"), json!({}))
        .await;
    let msg2 = app.send_message(&app2, "a.b", json!({})).await;
    let report = app.step().await;
    assert_eq!((report.claimed, report.retried), (1, 1));
    let attempts = app.attempts_of_msg(&app2, &msg2).await;
    assert_eq!(attempts[0]["responseStatusCode"], 0);
    assert!(!attempts[0]["error"]
        .as_str()
        .expect("error text")
        .is_empty());
    assert_eq!(app.deliveries(&app2, &msg2).await[0]["state"], "pending");
    app.shutdown().await;
}

fn millis_of(v: &serde_json::Value) -> i64 {
    chrono::DateTime::parse_from_rfc3339(v.as_str().expect("timestamp"))
        .expect("rfc3339")
        .timestamp_millis()
}

#[tokio::test]
async fn retry_after_replaces_the_scheduled_delay() {
    // The schedule says "at once"; the receiver says "in 120 s" and then
    // "at this date, 1 h away".
    let app = spawn_stepped(&[("HERALD_RETRY_SCHEDULE", "0ms,0ms,0ms")]).await;
    let rx = Receiver::start().await;
    let in_an_hour = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(3600));
    rx.script([
        Reply::status(429).header("retry-after", "120"),
        Reply::status(503).header("retry-after", &in_an_hour),
    ]);
    let (app_id, _) = app.app_with_endpoint(&rx.url("/"), json!({})).await;
    let msg = app.send_message(&app_id, "a.b", json!({})).await;

    assert_eq!(app.step().await.retried, 1);
    let d = &app.deliveries(&app_id, &msg).await[0];
    let attempt = &app.attempts_of_msg(&app_id, &msg).await[0];
    let wait = millis_of(&d["nextAttemptAt"]) - millis_of(&attempt["timestamp"]);
    assert!(
        (119_000..=125_000).contains(&wait),
        "next attempt {wait} ms later"
    );
    assert_eq!(app.step().await.claimed, 0, "not due before the hint");

    // Move the delivery's due time to now through a resend, then check the
    // HTTP-date form.
    let ep = &app.deliveries(&app_id, &msg).await[0]["endpointId"];
    let (s, _) = app
        .post(
            &format!(
                "/api/v1/app/{app_id}/msg/{msg}/endpoint/{}/resend",
                ep.as_str().expect("ep")
            ),
            json!(null),
        )
        .await;
    assert_eq!(s, StatusCode::ACCEPTED);
    assert_eq!(app.step().await.retried, 1);
    let d = &app.deliveries(&app_id, &msg).await[0];
    let wait = millis_of(&d["nextAttemptAt"]) - chrono::Utc::now().timestamp_millis();
    assert!(
        (3_590_000..=3_601_000).contains(&wait),
        "next attempt {wait} ms away"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn exhaustion_is_dead_and_resend_and_replay_keep_the_key() {
    let app = spawn_app(&[("HERALD_RETRY_SCHEDULE", "0ms,0ms")]).await;
    let rx = Receiver::start().await;
    rx.script([Reply::status(500), Reply::status(500), Reply::status(500)]);
    let (app_id, ep_id) = app.app_with_endpoint(&rx.url("/"), json!({})).await;
    let msg = app.send_message(&app_id, "a.b", json!({})).await;

    let got = rx.wait_for(3).await;
    let ds = app.wait_for_state(&app_id, &msg, "dead").await;
    assert_eq!(ds[0]["deadReason"], "exhausted");
    assert_eq!(ds[0]["attempts"], 3);
    let key = got[0].header("idempotency-key");

    let (s, dead) = app
        .get(&format!(
            "/api/v1/app/{app_id}/dead-letter?endpoint_id={ep_id}"
        ))
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(dead["data"].as_array().expect("list").len(), 1);
    assert_eq!(dead["data"][0]["id"], key.as_str());
    assert_eq!(dead["done"], true);

    // Svix's resend: a fresh attempt, same key, X-Attempt goes on counting.
    let (s, body) = app
        .post(
            &format!("/api/v1/app/{app_id}/msg/{msg}/endpoint/{ep_id}/resend"),
            json!(null),
        )
        .await;
    assert_eq!((s, body), (StatusCode::ACCEPTED, json!({})));
    let got = rx.wait_for(4).await;
    assert_eq!(got[3].header("idempotency-key"), key);
    assert_eq!(got[3].header("x-attempt"), "4");
    app.wait_for_state(&app_id, &msg, "delivered").await;
    let attempts = app.attempts_of_msg(&app_id, &msg).await;
    assert_eq!(
        attempts[3]["triggerType"], 1,
        "a resend is a manual attempt"
    );
    let (_, dead) = app.get(&format!("/api/v1/app/{app_id}/dead-letter")).await;
    assert_eq!(dead["data"].as_array().expect("list").len(), 0);
    app.shutdown().await;
}

#[tokio::test]
async fn dead_letters_replay_one_and_all_of_an_endpoint() {
    let app = spawn_stepped(&[("HERALD_RETRY_SCHEDULE", "")]).await;
    let rx = Receiver::start().await;
    rx.always(Reply::status(502));
    let (app_id, ep_id) = app.app_with_endpoint(&rx.url("/"), json!({})).await;
    let mut msgs = Vec::new();
    for i in 0..3 {
        msgs.push(app.send_message(&app_id, "a.b", json!({ "i": i })).await);
    }
    assert_eq!(app.step().await.dead, 3);
    let (_, dead) = app
        .get(&format!("/api/v1/app/{app_id}/dead-letter?limit=2"))
        .await;
    assert_eq!(dead["data"].as_array().expect("list").len(), 2);
    assert_eq!(dead["done"], false);
    let (_, rest) = app
        .get(&format!(
            "/api/v1/app/{app_id}/dead-letter?limit=2&iterator={}",
            dead["iterator"].as_str().expect("it")
        ))
        .await;
    assert_eq!(rest["data"].as_array().expect("list").len(), 1);
    assert_eq!(rest["done"], true);

    rx.always(Reply::status(200));
    let one = dead["data"][0]["id"].as_str().expect("id").to_owned();
    let (s, _) = app
        .post(
            &format!("/api/v1/app/{app_id}/dead-letter/{one}/replay"),
            json!(null),
        )
        .await;
    assert_eq!(s, StatusCode::ACCEPTED);
    let (s, _) = app
        .post(
            &format!("/api/v1/app/{app_id}/dead-letter/{one}/replay"),
            json!(null),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "a pending delivery is not dead");
    assert_eq!(app.step().await.delivered, 1);
    assert_eq!(
        rx.requests().last().expect("req").header("idempotency-key"),
        one
    );
    assert_eq!(rx.requests().last().expect("req").header("x-attempt"), "2");

    let (s, body) = app
        .post(
            &format!("/api/v1/app/{app_id}/endpoint/{ep_id}/dead-letter/replay"),
            json!(null),
        )
        .await;
    assert_eq!((s, body), (StatusCode::ACCEPTED, json!({"replayed": 2})));
    assert_eq!(app.step().await.delivered, 2);
    for m in &msgs {
        assert_eq!(app.deliveries(&app_id, m).await[0]["state"], "delivered");
    }
    let (s, _) = app
        .post(
            &format!("/api/v1/app/{app_id}/dead-letter/dlv_01ARZ3NDEKTSV4RRFFQ69G5FAV/replay"),
            json!(null),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    app.shutdown().await;
}

#[tokio::test]
async fn the_age_cap_dead_letters_old_messages_and_caps_the_last_delay() {
    let app = spawn_stepped(&[
        ("HERALD_RETRY_SCHEDULE", "1h,1h"),
        ("HERALD_MAX_AGE", "24h"),
    ])
    .await;
    let rx = Receiver::start().await;
    rx.always(Reply::status(500));
    let (app_id, _) = app.app_with_endpoint(&rx.url("/"), json!({})).await;
    let store = app.running().store.clone();
    let app_key = herald::ids::AppId::parse(&app_id).expect("app id");
    let now = chrono::Utc::now().timestamp_millis();
    let old = herald::store::NewMessage {
        id: herald::ids::MsgId::generate(),
        app_id: app_key.clone(),
        event_type: "a.b".into(),
        event_id: None,
        payload: "{}".into(),
        created_at: now - 24 * 3_600_000 - 1_000,
        channels: None,
        traceparent: None,
        tags: None,
        deliver_at: None,
        payload_expires_at: None,
        application: None,
    };
    let nearly = herald::store::NewMessage {
        id: herald::ids::MsgId::generate(),
        created_at: now - 24 * 3_600_000 + 60_000,
        channels: None,
        ..old.clone()
    };
    store
        .insert_messages(&[old.clone(), nearly.clone()])
        .await
        .expect("insert");
    let report = app.step().await;
    assert_eq!((report.claimed, report.dead, report.retried), (2, 1, 1));
    let d_old = &app.deliveries(&app_id, old.id.as_str()).await[0];
    assert_eq!(d_old["state"], "dead");
    assert_eq!(d_old["deadReason"], "too_old");
    let d_near = &app.deliveries(&app_id, nearly.id.as_str()).await[0];
    assert_eq!(d_near["state"], "pending");
    // The 1 h step is cut to the minute the message has left.
    let wait = millis_of(&d_near["nextAttemptAt"]) - now;
    assert!((0..=61_000).contains(&wait), "next attempt in {wait} ms");
    app.shutdown().await;
}

#[tokio::test]
async fn filter_types_choose_the_endpoints() {
    let app = spawn_stepped(&[]).await;
    let rx = Receiver::start().await;
    let app_id = app.create_app().await;
    app.create_event_types(&["user.created", "user.deleted"])
        .await;
    app.create_endpoint(
        &app_id,
        &rx.url("/only-created"),
        json!({"filterTypes": ["user.created"]}),
    )
    .await;
    let sdk_name = app
        .create_endpoint(
            &app_id,
            &rx.url("/only-deleted"),
            json!({"eventTypes": ["user.deleted"]}),
        )
        .await;
    assert_eq!(sdk_name["filterTypes"], json!(["user.deleted"]));
    assert_eq!(sdk_name["eventTypes"], json!(["user.deleted"]));
    app.create_endpoint(&app_id, &rx.url("/everything"), json!({}))
        .await;

    app.send_message(&app_id, "user.created", json!({})).await;
    app.send_message(&app_id, "user.updated", json!({})).await;
    assert_eq!(app.step().await.delivered, 3);
    let mut seen: Vec<(String, String)> = rx
        .requests()
        .iter()
        .map(|r| (r.path.clone(), r.header("x-event-type")))
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        vec![
            ("/everything".to_owned(), "user.created".to_owned()),
            ("/everything".to_owned(), "user.updated".to_owned()),
            ("/only-created".to_owned(), "user.created".to_owned()),
        ]
    );
    app.shutdown().await;
}

#[tokio::test]
async fn fan_out_to_three_endpoints_with_distinct_keys() {
    let app = spawn_app(&[]).await;
    let rx = Receiver::start().await;
    let app_id = app.create_app().await;
    for i in 0..3 {
        app.create_endpoint(&app_id, &rx.url(&format!("/ep{i}")), json!({}))
            .await;
    }
    let msg = app.send_message(&app_id, "a.b", json!({"x": 1})).await;
    let got = rx.wait_for(3).await;
    let mut keys: Vec<String> = got.iter().map(|r| r.header("idempotency-key")).collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), 3, "one key per delivery");
    assert!(got.iter().all(|r| r.header("webhook-id") == msg));
    let mut paths: Vec<_> = got.iter().map(|r| r.path.clone()).collect();
    paths.sort();
    assert_eq!(paths, vec!["/ep0", "/ep1", "/ep2"]);
    app.shutdown().await;
}

#[tokio::test]
async fn disabled_endpoints_get_nothing() {
    let app = spawn_stepped(&[]).await;
    let rx = Receiver::start().await;
    let app_id = app.create_app().await;
    app.create_endpoint(&app_id, &rx.url("/off"), json!({"disabled": true}))
        .await;
    let msg = app.send_message(&app_id, "a.b", json!({})).await;
    assert_eq!(app.step().await.claimed, 0);
    assert!(app.deliveries(&app_id, &msg).await.is_empty());
    app.shutdown().await;
}

#[tokio::test]
async fn ssrf_guard_refuses_private_addresses_at_creation() {
    let app = spawn_app(&[("HERALD_ALLOW_PRIVATE_NETWORKS", "false")]).await;
    let app_id = app.create_app().await;
    for url in [
        "http://127.0.0.1:8080/",
        "http://localhost:8080/",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.7/",
        "http://192.168.1.1/",
        "http://100.64.0.1/",
        "http://[::1]/",
        "http://[fd00::1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://0.0.0.0/",
        "http://2130706433/",
    ] {
        let (s, body) = app
            .post(
                &format!("/api/v1/app/{app_id}/endpoint"),
                json!({ "url": url }),
            )
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{url}: {body}");
        assert_eq!(body["detail"][0]["loc"], json!(["body", "url"]), "{url}");
    }
    // A public address literal is fine (no DNS needed to decide).
    let (s, _) = app
        .post(
            &format!("/api/v1/app/{app_id}/endpoint"),
            json!({ "url": "https://93.184.215.14/hook" }),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    app.shutdown().await;
}

#[tokio::test]
async fn ssrf_guard_refuses_private_addresses_when_connecting() {
    // An endpoint that slipped into the store (say, created while private
    // networks were allowed) is still refused at connect time, by name and
    // by address literal, and nothing reaches the receiver.
    let app = spawn_stepped(&[("HERALD_ALLOW_PRIVATE_NETWORKS", "false")]).await;
    let rx = Receiver::start().await;
    let app_id = app.create_app().await;
    let store = app.running().store.clone();
    let app_key = herald::ids::AppId::parse(&app_id).expect("id");
    for url in [format!("http://localhost:{}/", rx.addr.port()), rx.url("/")] {
        let now = chrono::Utc::now().timestamp_millis();
        store
            .create_endpoint(&herald::store::Endpoint::new(
                app_key.clone(),
                url,
                herald_signing::Secret::generate().expose(),
                now,
            ))
            .await
            .expect("endpoint stored");
    }
    let msg = app.send_message(&app_id, "a.b", json!({})).await;
    let report = app.step().await;
    assert_eq!((report.claimed, report.retried), (2, 2));
    assert!(
        rx.requests().is_empty(),
        "nothing may reach a private address"
    );
    for a in app.attempts_of_msg(&app_id, &msg).await {
        let err = a["error"].as_str().expect("error");
        assert!(err.contains("non-public address"), "{err}");
    }
    app.shutdown().await;
}

#[tokio::test]
async fn one_stuck_endpoint_does_not_hold_up_the_others() {
    // Endpoint cap 2: the stuck endpoint may take two slots, never more, so
    // the healthy endpoint's deliveries flow while it hangs.
    let app = spawn_app(&[
        ("HERALD_ENDPOINT_CONCURRENCY", "2"),
        ("HERALD_MAX_IN_FLIGHT", "8"),
        ("HERALD_REQUEST_TIMEOUT", "20s"),
        ("HERALD_LEASE", "45s"),
    ])
    .await;
    let stuck = Receiver::start().await;
    stuck.always(Reply::status(200).delay(Duration::from_secs(15)));
    let healthy = Receiver::start().await;
    let (slow_app, _) = app.app_with_endpoint(&stuck.url("/"), json!({})).await;
    let (good_app, _) = app.app_with_endpoint(&healthy.url("/"), json!({})).await;
    for i in 0..20 {
        app.send_message(&slow_app, "a.b", json!({ "i": i })).await;
    }
    stuck.wait_for(2).await;
    for i in 0..20 {
        app.send_message(&good_app, "a.b", json!({ "i": i })).await;
    }
    healthy.wait_for(20).await;
    assert_eq!(
        stuck.requests().len(),
        2,
        "the stuck endpoint never gets more than its cap"
    );
    drop(app.running); // no graceful wait for the 15 s answers
}

/// Verifies `r` with `secret` alone (standardwebhooks accepts a header
/// whose signatures include one by this secret).
fn verifies_with(secret: &str, r: &Recorded) -> bool {
    r.verified_by(secret).is_ok()
}

#[tokio::test]
async fn a_rotated_secret_signs_beside_the_new_one_until_its_grace_ends() {
    let app = spawn_stepped(&[]).await;
    let rx = Receiver::start().await;
    let (app_id, ep_id) = app.app_with_endpoint(&rx.url("/hook"), json!({})).await;
    let old = app.endpoint_secret(&app_id, &ep_id).await;
    let rotate = format!("/api/v1/app/{app_id}/endpoint/{ep_id}/secret/rotate");

    let new = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let (status, body) = app
        .post(&rotate, json!({"key": new, "gracePeriodSeconds": 1}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["key"], new);
    assert_eq!(app.endpoint_secret(&app_id, &ep_id).await, new);
    app.send_message(&app_id, "a.b", json!({})).await;
    app.step().await;
    let got = rx.wait_for(1).await;
    assert_eq!(got[0].header("webhook-signature").split(' ').count(), 2);
    assert!(verifies_with(new, &got[0]), "the new secret verifies");
    assert!(
        verifies_with(&old, &got[0]),
        "the old one too, during the grace"
    );

    // Past the one-second grace only the new secret signs.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    app.send_message(&app_id, "a.b", json!({})).await;
    app.step().await;
    let got = rx.wait_for(2).await;
    assert_eq!(got[1].header("webhook-signature").split(' ').count(), 1);
    assert!(verifies_with(new, &got[1]));
    assert!(
        !verifies_with(&old, &got[1]),
        "the old secret no longer verifies"
    );

    // Given as Svix's API takes it too, without its prefix: shown with it.
    let bare = "C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
    let (status, body) = app.post(&rotate, json!({"key": bare})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["key"], format!("whsec_{bare}"));
    assert_eq!(
        app.endpoint_secret(&app_id, &ep_id).await,
        format!("whsec_{bare}")
    );
    let (_, made) = app
        .post(
            &format!("/api/v1/app/{app_id}/endpoint"),
            json!({"url": rx.url("/bare"), "secret": bare}),
        )
        .await;
    let made_id = made["id"].as_str().expect("id");
    assert_eq!(
        app.endpoint_secret(&app_id, made_id).await,
        format!("whsec_{bare}")
    );

    // Bad input: a malformed key, an absurd grace; no body at all is fine.
    let (status, body) = app.post(&rotate, json!({"key": "hunter2"})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["detail"][0]["loc"][1], "key", "{body}");
    let (status, _) = app
        .post(&rotate, json!({"gracePeriodSeconds": 99_999_999}))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, _) = app
        .as_token(TOKEN)
        .request(reqwest::Method::POST, &rotate, None)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_ne!(
        app.endpoint_secret(&app_id, &ep_id).await,
        new,
        "a generated key"
    );
    app.shutdown().await;
}

crate::on_both_stores!(resending_a_delivery_in_flight_is_refused_until_its_outcome_is_written);

/// Review of the release binary, item 13: a resend of a delivery whose
/// attempt was in flight made it pending and due at once, so it was sent
/// again beside that attempt (same Idempotency-Key, same `X-Attempt`; on a
/// FIFO endpoint two requests open). Now it is refused with 409 and a JSON
/// error, nothing is sent; once the attempt's outcome is written it is
/// accepted, and `X-Attempt` goes on counting.
async fn resending_a_delivery_in_flight_is_refused_until_its_outcome_is_written(backend: &Backend) {
    let app = backend.spawn_stepped(&[]).await;
    let rx = Receiver::start().await;
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    rx.script([Reply::status(200).held(&gate)]);
    let (app_id, ep_id) = app
        .app_with_endpoint(&rx.url("/"), json!({"ordering": "fifo"}))
        .await;
    let msg = app.send_message(&app_id, "a.b", json!({})).await;
    let resend = format!("/api/v1/app/{app_id}/msg/{msg}/endpoint/{ep_id}/resend");
    // The first attempt is held open at the receiver while we resend.
    let (report, (refused, body)) = tokio::join!(app.step(), async {
        rx.wait_for(1).await;
        let answer = app.post(&resend, json!(null)).await;
        gate.add_permits(1);
        answer
    });
    assert_eq!(refused, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["code"], "conflict");
    assert!(
        body["detail"]
            .as_str()
            .is_some_and(|d| d.contains("in flight")),
        "{body}"
    );
    assert_eq!(report.delivered, 1, "the attempt's outcome is written");
    assert_eq!(app.step().await.claimed, 0, "nothing was queued again");
    assert_eq!(rx.requests().len(), 1);

    let (s, _) = app.post(&resend, json!(null)).await;
    assert_eq!(s, StatusCode::ACCEPTED, "resent once the attempt is over");
    assert_eq!(app.step().await.delivered, 1);
    let got = rx.requests();
    assert_eq!(got.len(), 2);
    assert_eq!(
        got[1].header("idempotency-key"),
        got[0].header("idempotency-key")
    );
    assert_eq!(
        (got[0].header("x-attempt"), got[1].header("x-attempt")),
        ("1".to_owned(), "2".to_owned()),
        "X-Attempt goes on counting across a resend"
    );
    app.shutdown().await;
}

/// `HERALD_SIGNATURE_HEADERS=svix` signs under Svix's own names (what Svix
/// sends by default, and what a receiver written by hand for it reads),
/// `both` under both; Svix's library verifies each.
#[tokio::test]
async fn the_signature_goes_under_the_names_configured() {
    for (names, svix, webhook) in [("svix", true, false), ("both", true, true)] {
        let app = spawn_stepped(&[("HERALD_SIGNATURE_HEADERS", names)]).await;
        let rx = Receiver::start().await;
        let (app_id, ep_id) = app.app_with_endpoint(&rx.url("/hook"), json!({})).await;
        let secret = app.endpoint_secret(&app_id, &ep_id).await;
        app.send_message(&app_id, "a.b", json!({"n": 1})).await;
        app.step().await;
        let got = rx.wait_for(1).await;
        let r = &got[0];
        for (name, wanted) in [("svix-signature", svix), ("webhook-signature", webhook)] {
            assert_eq!(r.headers.contains_key(name), wanted, "{names}: {name}");
        }
        svix::webhooks::Webhook::new(&secret)
            .expect("secret")
            .verify(&r.body, &r.headers)
            .unwrap_or_else(|e| panic!("{names}: Svix's library verifies it: {e}"));
        if webhook {
            assert_eq!(r.header("svix-id"), r.header("webhook-id"));
            verify(&secret, r);
        }
        app.shutdown().await;
    }
    let err = herald::config::Config::from_values(
        &[("HERALD_SIGNATURE_HEADERS".to_owned(), "x-sig".to_owned())].into(),
    )
    .expect_err("refused")
    .to_string();
    assert!(err.starts_with("HERALD_SIGNATURE_HEADERS"), "{err}");
}

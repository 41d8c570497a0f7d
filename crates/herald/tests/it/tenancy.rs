//! Application-scoped tokens and Idempotency-Key, end to end.

use std::time::{Duration, Instant};

use axum::http::StatusCode;
use reqwest::Method;
use serde_json::{json, Value};

use crate::helpers::*;
use crate::on_both_stores;

crate::on_both_stores!(postgres:
    a_token_revoked_through_one_process_is_refused_by_the_others,
    a_uid_moved_through_one_process_is_followed_by_the_others,
);

#[tokio::test]
async fn an_application_token_reaches_its_own_application_and_nothing_else() {
    let app = spawn_stepped(&[]).await;
    let rx = Receiver::start().await;
    rx.always(Reply::status(400));
    app.create_event_types(&["a.b"]).await;
    let (_, a) = app
        .post("/api/v1/app", json!({"name": "A", "uid": "tenant-a"}))
        .await;
    let (_, b) = app
        .post("/api/v1/app", json!({"name": "B", "uid": "tenant-b"}))
        .await;
    let (a, b) = (
        a["id"].as_str().expect("id").to_owned(),
        b["id"].as_str().expect("id").to_owned(),
    );
    let ep_b = app.create_endpoint(&b, &rx.url("/b"), json!({})).await;
    let ep_b = ep_b["id"].as_str().expect("id").to_owned();
    let msg_b = app.send_message(&b, "a.b", json!({})).await;
    app.step().await;
    let attempt_b = app.attempts_of_msg(&b, &msg_b).await[0]["id"]
        .as_str()
        .expect("attempt")
        .to_owned();
    let dlv_b = app.deliveries(&b, &msg_b).await[0]["id"]
        .as_str()
        .expect("delivery")
        .to_owned();
    let (s, tok_b) = app.post(&format!("/api/v1/app/{b}/token"), json!({})).await;
    assert_eq!(s, StatusCode::CREATED, "{tok_b}");
    let tok_b_id = tok_b["id"].as_str().expect("id").to_owned();

    let (s, created) = app
        .post(&format!("/api/v1/app/{a}/token"), json!({"name": "ci"}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{created}");
    let token = created["token"]
        .as_str()
        .expect("token shown once")
        .to_owned();
    assert!(token.starts_with("hrld_app_"));
    let (_, listed) = app.get(&format!("/api/v1/app/{a}/token")).await;
    assert_eq!(listed["data"][0]["name"], "ci");
    assert!(
        listed["data"][0].get("token").is_none(),
        "never shown again"
    );

    // Its own application works, by id and by uid.
    let (s, _) = app.as_token(&token).get(&format!("/api/v1/app/{a}")).await;
    assert_eq!(s, StatusCode::OK);
    let (s, ep) = app
        .as_token(&token)
        .post(
            "/api/v1/app/tenant-a/endpoint",
            json!({"url": rx.url("/a")}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{ep}");
    let (s, _) = app
        .as_token(&token)
        .post(
            &format!("/api/v1/app/{a}/msg"),
            json!({"eventType": "a.b", "payload": {}}),
        )
        .await;
    assert_eq!(s, StatusCode::ACCEPTED);
    let (s, _) = app.as_token(&token).get("/api/v1/event-type").await;
    assert_eq!(s, StatusCode::OK, "the catalogue is readable");

    // Every route of B, by id and by uid: 404, as if B did not exist.
    let body = Some(
        json!({"name": "x", "url": "http://127.0.0.1:9/", "eventType": "a.b", "payload": {}, "since": "2020-01-01T00:00:00Z", "headers": {}}),
    );
    for app_ref in [b.as_str(), "tenant-b"] {
        let p = |rest: &str| format!("/api/v1/app/{app_ref}{rest}");
        let routes: Vec<(Method, String)> = vec![
            (Method::GET, p("")),
            (Method::PUT, p("")),
            (Method::PATCH, p("")),
            (Method::DELETE, p("")),
            (Method::GET, p("/endpoint")),
            (Method::POST, p("/endpoint")),
            (Method::GET, p(&format!("/endpoint/{ep_b}"))),
            (Method::PUT, p(&format!("/endpoint/{ep_b}"))),
            (Method::PATCH, p(&format!("/endpoint/{ep_b}"))),
            (Method::DELETE, p(&format!("/endpoint/{ep_b}"))),
            (Method::GET, p(&format!("/endpoint/{ep_b}/secret"))),
            (Method::POST, p(&format!("/endpoint/{ep_b}/secret/rotate"))),
            (Method::GET, p(&format!("/endpoint/{ep_b}/headers"))),
            (Method::PUT, p(&format!("/endpoint/{ep_b}/headers"))),
            (Method::PATCH, p(&format!("/endpoint/{ep_b}/headers"))),
            (Method::GET, p(&format!("/endpoint/{ep_b}/health"))),
            (Method::GET, p(&format!("/endpoint/{ep_b}/stats"))),
            (Method::POST, p(&format!("/endpoint/{ep_b}/enable"))),
            (Method::POST, p(&format!("/endpoint/{ep_b}/disable"))),
            (Method::POST, p(&format!("/endpoint/{ep_b}/recover"))),
            (Method::GET, p(&format!("/endpoint/{ep_b}/msg"))),
            (
                Method::POST,
                p(&format!("/endpoint/{ep_b}/dead-letter/replay")),
            ),
            (Method::GET, p("/msg")),
            (Method::POST, p("/msg")),
            (Method::GET, p(&format!("/msg/{msg_b}"))),
            (Method::GET, p(&format!("/msg/{msg_b}/delivery"))),
            (Method::GET, p(&format!("/msg/{msg_b}/endpoint"))),
            (Method::GET, p(&format!("/msg/{msg_b}/attempt/{attempt_b}"))),
            (
                Method::POST,
                p(&format!("/msg/{msg_b}/endpoint/{ep_b}/resend")),
            ),
            (Method::GET, p(&format!("/attempt/msg/{msg_b}"))),
            (Method::GET, p(&format!("/attempt/endpoint/{ep_b}"))),
            (Method::GET, p("/dead-letter")),
            (Method::POST, p(&format!("/dead-letter/{dlv_b}/replay"))),
        ];
        for (method, path) in routes {
            let (s, out) = app
                .as_token(&token)
                .request(method.clone(), &path, body.clone())
                .await;
            assert_eq!(s, StatusCode::NOT_FOUND, "{method} {path}: {out}");
        }
        for (method, path) in [
            (Method::GET, p("/token")),
            (Method::POST, p("/token")),
            (Method::DELETE, p(&format!("/token/{tok_b_id}"))),
        ] {
            let (s, out) = app
                .as_token(&token)
                .request(method.clone(), &path, None)
                .await;
            assert!(
                s == StatusCode::NOT_FOUND || s == StatusCode::FORBIDDEN,
                "{method} {path}: {s} {out}"
            );
        }
    }
    // What no application token may do: 403.
    for (method, path) in [
        (Method::GET, "/api/v1/app".to_owned()),
        (Method::POST, "/api/v1/app".to_owned()),
        (Method::POST, "/api/v1/event-type".to_owned()),
        (Method::GET, "/api/v1/dead-letter".to_owned()),
        (Method::POST, "/api/v1/dead-letter/replay".to_owned()),
        (Method::GET, format!("/api/v1/app/{a}/token")),
        (Method::POST, format!("/api/v1/app/{a}/token")),
    ] {
        let (s, out) = app
            .as_token(&token)
            .request(method.clone(), &path, Some(json!({"name": "x"})))
            .await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{method} {path}: {out}");
        assert_eq!(out["code"], "forbidden");
    }
    // B is untouched.
    let (s, b_now) = app.get(&format!("/api/v1/app/{b}")).await;
    assert_eq!((s, b_now["name"].clone()), (StatusCode::OK, json!("B")));
    let (_, ep_now) = app.get(&format!("/api/v1/app/{b}/endpoint/{ep_b}")).await;
    assert_eq!(ep_now["disabled"], false);
    assert_eq!(app.deliveries(&b, &msg_b).await[0]["state"], "dead");

    // Revoked: refused at once.
    let token_id = created["id"].as_str().expect("id");
    let (s, _) = app
        .delete(&format!("/api/v1/app/{a}/token/{token_id}"))
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _) = app.as_token(&token).get(&format!("/api/v1/app/{a}")).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    app.shutdown().await;
}

#[tokio::test]
async fn an_idempotency_key_returns_the_first_response_and_stores_one_message() {
    let app = spawn_stepped(&[]).await;
    let app_id = app.create_app().await;
    let path = format!("/api/v1/app/{app_id}/msg");
    let body = json!({"eventType": "a.b", "payload": {"n": 1}});
    let admin = app.as_token(TOKEN);
    let (s1, replayed1, first) = admin.post_keyed(&path, "key-1", body.clone()).await;
    let (s2, replayed2, second) = admin.post_keyed(&path, "key-1", body.clone()).await;
    assert_eq!((s1, s2), (StatusCode::ACCEPTED, StatusCode::ACCEPTED));
    assert_eq!(first, second, "the identical response");
    assert!(!replayed1 && replayed2);
    let (_, listed) = app.get(&path).await;
    assert_eq!(
        listed["data"].as_array().map(Vec::len),
        Some(1),
        "one message"
    );

    // The same key with another body: refused, nothing stored.
    let (s, _, out) = admin
        .post_keyed(
            &path,
            "key-1",
            json!({"eventType": "a.b", "payload": {"n": 2}}),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{out}");
    // The same key on another URL is another request, as Svix keeps keys
    // (one business key for several applications' messages): it runs.
    let (s, replayed, out) = admin
        .post_keyed("/api/v1/app", "key-1", json!({"name": "x"}))
        .await;
    assert_eq!((s, replayed), (StatusCode::CREATED, false), "{out}");
    let (s, replayed, _) = admin
        .post_keyed("/api/v1/app", "key-1", json!({"name": "x"}))
        .await;
    assert_eq!(
        (s, replayed),
        (StatusCode::CREATED, true),
        "and is kept for that URL"
    );
    // A refusal is not kept (as Svix): the repeat runs again, and once
    // the client has fixed what was refused, it goes through.
    let bad = json!({"eventType": "no spaces", "payload": {}});
    let (s1, _, _) = admin.post_keyed(&path, "key-2", bad.clone()).await;
    let (s2, r2, _) = admin.post_keyed(&path, "key-2", bad).await;
    assert_eq!(
        (s1, s2, r2),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            StatusCode::UNPROCESSABLE_ENTITY,
            false
        )
    );
    let later = "/api/v1/app/later/msg";
    let (s1, _, _) = admin.post_keyed(later, "key-3", body.clone()).await;
    assert_eq!(s1, StatusCode::NOT_FOUND, "no application `later` yet");
    app.post("/api/v1/app", json!({"name": "later", "uid": "later"}))
        .await;
    let (s2, r2, _) = admin.post_keyed(later, "key-3", body.clone()).await;
    assert_eq!((s2, r2), (StatusCode::ACCEPTED, false));
    // Keys are per token: an application token's "key-1" is its own.
    let (_, tok) = app
        .post(&format!("/api/v1/app/{app_id}/token"), json!({}))
        .await;
    let token = tok["token"].as_str().expect("token");
    let (s, replayed, _) = app.as_token(token).post_keyed(&path, "key-1", body).await;
    assert_eq!((s, replayed), (StatusCode::ACCEPTED, false));
    let (_, listed) = app.get(&path).await;
    assert_eq!(listed["data"].as_array().map(Vec::len), Some(2));
    app.shutdown().await;
}

#[tokio::test]
async fn an_idempotency_key_compares_the_json_not_its_spelling() {
    let app = spawn_stepped(&[]).await;
    let app_id = app.create_app().await;
    let url = app.url(&format!("/api/v1/app/{app_id}/msg"));
    let send = |body: &'static str| {
        app.client
            .post(url.clone())
            .bearer_auth(TOKEN)
            .header("idempotency-key", "same-key")
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let first = send(r#"{"eventType":"a.b","payload":{"n":1,"list":[1,2]}}"#)
        .await
        .expect("herald");
    assert_eq!(first.status(), 202);
    let first_body = first.text().await.expect("body");
    // Other spacing and key order: the same request, the first answer.
    let again =
        send("{\n  \"payload\": { \"list\": [1, 2], \"n\": 1 },\n  \"eventType\": \"a.b\"\n}")
            .await
            .expect("herald");
    assert_eq!(again.status(), 202);
    assert!(again.headers().get("idempotent-replayed").is_some());
    assert_eq!(again.text().await.expect("body"), first_body);
    // A different payload under the key: 409.
    let other = send(r#"{"eventType":"a.b","payload":{"n":1,"list":[2,1]}}"#)
        .await
        .expect("herald");
    assert_eq!(other.status(), 409);
    let (_, listed) = app.get(&format!("/api/v1/app/{app_id}/msg")).await;
    assert_eq!(
        listed["data"].as_array().map(Vec::len),
        Some(1),
        "one message"
    );
    app.shutdown().await;
}

/// Polls `token` against `app` (bounded by `within`) until it is refused;
/// returns whether it was.
async fn refused_within(app: &TestApp, token: &str, path: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        let (s, _) = app.as_token(token).get(path).await;
        if s == StatusCode::UNAUTHORIZED {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Two API processes share a PostgreSQL database. A token revoked through
/// one (deleted; its application's tokens expired) is refused by the other
/// at once, though the other had cached it as valid: the revoking process
/// tells the others through the store. Checked well inside the cache's
/// 30 s, which would otherwise keep it working there.
async fn a_token_revoked_through_one_process_is_refused_by_the_others(pg: PgSchema) {
    let backend = Backend::Postgres(pg);
    let one = backend.spawn_stepped(&[]).await;
    let two = backend.spawn_stepped(&[]).await;
    let app_id = one.create_app().await;
    let path = format!("/api/v1/app/{app_id}");
    let mint = |name: &'static str| {
        let (one, app_id) = (&one, &app_id);
        async move {
            let (s, t) = one
                .post(
                    &format!("/api/v1/app/{app_id}/token"),
                    json!({ "name": name }),
                )
                .await;
            assert_eq!(s, StatusCode::CREATED, "{t}");
            (
                t["id"].as_str().expect("id").to_owned(),
                t["token"].as_str().expect("token").to_owned(),
            )
        }
    };
    let (deleted_id, deleted) = mint("deleted").await;
    let (_, expired) = mint("expired").await;
    // Both work through the other process, which caches them as valid.
    for token in [&deleted, &expired] {
        let (s, _) = two.as_token(token).get(&path).await;
        assert_eq!(s, StatusCode::OK);
    }

    let (s, _) = one.delete(&format!("{path}/token/{deleted_id}")).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    assert!(
        refused_within(&two, &deleted, &path, Duration::from_secs(10)).await,
        "the other process still accepts the deleted token"
    );
    let (s, _) = two.as_token(&expired).get(&path).await;
    assert_eq!(s, StatusCode::OK, "the other token is untouched");

    let (s, body) = one
        .post(&format!("/api/v1/auth/app/{app_id}/expire-all"), json!({}))
        .await;
    assert!(s.is_success(), "{s} {body}");
    assert!(
        refused_within(&two, &expired, &path, Duration::from_secs(10)).await,
        "the other process still accepts a token expired through the first"
    );
    one.shutdown().await;
    two.shutdown().await;
    if let Backend::Postgres(pg) = &backend {
        pg.drop_schema().await;
    }
}

/// Two API processes share a PostgreSQL database. A uid the other process
/// has cached (a message sent through it by that uid) is moved through the
/// first to another application: the other process forgets it at once
/// and sends the next messages by that uid to the application that has it
/// now, never to the one that gave it up. (Its cache would otherwise keep
/// the old application for 30 s.)
async fn a_uid_moved_through_one_process_is_followed_by_the_others(pg: PgSchema) {
    let backend = Backend::Postgres(pg);
    let one = backend.spawn_stepped(&[]).await;
    let two = backend.spawn_stepped(&[]).await;
    let (s, first) = one
        .post("/api/v1/app", json!({"name": "first", "uid": "shop"}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{first}");
    let first = first["id"].as_str().expect("id").to_owned();
    let send = || async {
        let (s, m) = two
            .post(
                "/api/v1/app/shop/msg",
                json!({"eventType": "a.b", "payload": {}}),
            )
            .await;
        assert_eq!(s, StatusCode::ACCEPTED, "{m}");
        m["id"].as_str().expect("id").to_owned()
    };
    send().await;

    let (s, out) = one
        .patch(&format!("/api/v1/app/{first}"), json!({"uid": "old-shop"}))
        .await;
    assert_eq!(s, StatusCode::OK, "{out}");
    let (s, second) = one
        .post("/api/v1/app", json!({"name": "second", "uid": "shop"}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{second}");
    let second = second["id"].as_str().expect("id").to_owned();

    let in_app = |app: String, msg: String| {
        let one = &one;
        async move { one.get(&format!("/api/v1/app/{app}/msg/{msg}")).await.0 == StatusCode::OK }
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let msg = send().await;
        if in_app(second.clone(), msg).await {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the other process still sends `shop` messages to the application that gave the uid up"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let msg = send().await;
    assert!(in_app(second.clone(), msg.clone()).await, "and goes on so");
    assert!(!in_app(first.clone(), msg).await);
    one.shutdown().await;
    two.shutdown().await;
    if let Backend::Postgres(pg) = &backend {
        pg.drop_schema().await;
    }
}

on_both_stores!(
    an_application_token_cannot_change_or_delete_its_application,
    uids_that_read_like_application_ids_are_refused,
);

/// An application token (ordinary or a portal's) reads its application
/// but cannot take another customer's uid, nor change or delete it: the
/// uid is how the operator finds a customer, and messages and portal links
/// follow it.
async fn an_application_token_cannot_change_or_delete_its_application(backend: &Backend) {
    let app = backend.spawn_stepped(&[]).await;
    let (_, a) = app
        .post("/api/v1/app", json!({"name": "A", "uid": "customer-a"}))
        .await;
    let a = a["id"].as_str().expect("id").to_owned();
    let (s, tok) = app.post(&format!("/api/v1/app/{a}/token"), json!({})).await;
    assert_eq!(s, StatusCode::CREATED, "{tok}");
    let tok = tok["token"].as_str().expect("token").to_owned();
    let (s, portal) = app
        .post(&format!("/api/v1/auth/app-portal-access/{a}"), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{portal}");
    let portal = portal["token"].as_str().expect("token").to_owned();

    for token in [&tok, &portal] {
        for path in [
            format!("/api/v1/app/{a}"),
            "/api/v1/app/customer-a".to_owned(),
        ] {
            let (s, got) = app.as_token(token).get(&path).await;
            assert_eq!(s, StatusCode::OK, "{path}: {got}");
            for (method, body) in [
                (Method::PATCH, Some(json!({"uid": "customer-c"}))),
                (Method::PATCH, Some(json!({"name": "renamed"}))),
                (Method::PUT, Some(json!({"name": "A", "uid": "customer-c"}))),
                (Method::DELETE, None),
            ] {
                let (s, out) = app
                    .as_token(token)
                    .request(method.clone(), &path, body)
                    .await;
                assert_eq!(s, StatusCode::FORBIDDEN, "{method} {path}: {out}");
                assert_eq!(out["code"], "forbidden", "{out}");
            }
        }
    }
    let (_, still) = app.get(&format!("/api/v1/app/{a}")).await;
    assert_eq!(
        (&still["uid"], &still["name"]),
        (&json!("customer-a"), &json!("A"))
    );

    // Customer C, created later by its uid, is an application of its own.
    let (s, c) = app
        .post("/api/v1/app", json!({"name": "C", "uid": "customer-c"}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{c}");
    assert_ne!(c["id"], json!(a));

    // The admin may move the uid; the audit log says from what to what.
    let (s, out) = app
        .patch(&format!("/api/v1/app/{a}"), json!({"uid": "customer-a2"}))
        .await;
    assert_eq!(s, StatusCode::OK, "{out}");
    let (s, out) = app
        .put(
            &format!("/api/v1/app/{a}"),
            json!({"name": "A", "uid": "customer-a3"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{out}");
    let (s, log) = app
        .get(&format!("/api/v1/audit-log?action=app.updated&appId={a}"))
        .await;
    assert_eq!(s, StatusCode::OK, "{log}");
    let uids: Vec<Value> = log["data"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| e["details"]["uid"].clone())
        .collect();
    assert_eq!(
        uids,
        vec![
            json!({"old": "customer-a2", "new": "customer-a3"}),
            json!({"old": "customer-a", "new": "customer-a2"}),
        ],
        "{log}"
    );
    app.shutdown().await;
}

/// A uid starting `app_` (an endpoint's: `ep_`) in any letter case could
/// name another's id: refused with 422 naming `uid`, wherever one is set.
async fn uids_that_read_like_application_ids_are_refused(backend: &Backend) {
    let app = backend.spawn_stepped(&[]).await;
    let a = app.create_app().await;
    let shadow = a.to_uppercase();
    let uid_loc = |out: &Value| -> Vec<Value> {
        out["detail"][0]["loc"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    for uid in [shadow.as_str(), "app_x", "App_01abc", "aPP_"] {
        let (s, out) = app
            .post("/api/v1/app", json!({"name": "X", "uid": uid}))
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{uid}: {out}");
        assert_eq!(uid_loc(&out), [json!("body"), json!("uid")], "{out}");
        let (s, out) = app
            .put(
                &format!("/api/v1/app/{a}"),
                json!({"name": "X", "uid": uid}),
            )
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{uid}: {out}");
        assert_eq!(uid_loc(&out), [json!("body"), json!("uid")], "{out}");
        let (s, out) = app
            .patch(&format!("/api/v1/app/{a}"), json!({"uid": uid}))
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{uid}: {out}");
        assert_eq!(uid_loc(&out), [json!("body"), json!("uid")], "{out}");
    }
    // A PUT whose path names no application creates one with that uid.
    let (s, out) = app
        .put("/api/v1/app/APP_newcustomer", json!({"name": "X"}))
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{out}");
    assert_eq!(uid_loc(&out), [json!("body"), json!("uid")], "{out}");
    // A message's inline application.
    let (s, out) = app
        .post(
            "/api/v1/app/aPp_inline/msg",
            json!({
                "eventType": "a.b",
                "payload": {},
                "application": {"name": "X", "uid": "aPp_inline"},
            }),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{out}");
    assert_eq!(
        uid_loc(&out),
        [json!("body"), json!("application"), json!("uid")],
        "{out}"
    );
    let (_, apps) = app.get("/api/v1/app").await;
    assert_eq!(apps["data"].as_array().map(Vec::len), Some(1), "{apps}");
    let (_, still) = app.get(&format!("/api/v1/app/{a}")).await;
    assert_eq!(still["uid"], Value::Null);

    // Endpoints alike with `ep_`: such a uid equal to another endpoint's
    // id could never be looked up by (the id wins).
    let rx = Receiver::start().await;
    let ep = app.create_endpoint(&a, &rx.url("/"), json!({})).await;
    let ep = ep["id"].as_str().expect("id").to_owned();
    let endpoints = format!("/api/v1/app/{a}/endpoint");
    for uid in [ep.as_str(), "ep_x", "EP_y"] {
        let body = json!({"url": rx.url("/"), "uid": uid});
        for (s, out) in [
            app.post(&endpoints, body.clone()).await,
            app.put(&format!("{endpoints}/{ep}"), body.clone()).await,
            app.patch(&format!("{endpoints}/{ep}"), json!({"uid": uid}))
                .await,
        ] {
            assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{uid}: {out}");
            assert_eq!(uid_loc(&out), [json!("body"), json!("uid")], "{out}");
        }
    }
    let (_, list) = app.get(&endpoints).await;
    assert_eq!(list["data"].as_array().map(Vec::len), Some(1), "{list}");
    app.shutdown().await;
}

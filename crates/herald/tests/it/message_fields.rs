//! Svix's message fields beyond the basics, through the official SDK:
//! `application` (an inline application, created with its first message),
//! `tags` (returned, and filtered on by `tag`), and `deliverAt` (scheduled
//! delivery). Inline applications and `deliverAt` on both stores.

use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::StatusCode;
use serde_json::json;
use svix::api::{MessageListOptions, Svix};
use svix::error::Error as SvixError;
use svix::models::{ApplicationIn, EndpointIn, EndpointOut, MessageIn, MessageOut};

use crate::helpers::*;
use crate::on_both_stores;

fn message(event_type: &str) -> MessageIn {
    MessageIn::new(event_type.to_owned(), json!({"ok": true}))
}

/// A message `a.b` of `app_id`, sent through the SDK to be delivered at `at`.
async fn send_deliver_at(
    svix: &Svix,
    app_id: &str,
    at: DateTime<Utc>,
) -> Result<MessageOut, SvixError> {
    svix.message()
        .create(
            app_id.to_owned(),
            MessageIn {
                deliver_at: Some(at),
                ..message("a.b")
            },
            None,
        )
        .await
}

/// An endpoint of `app_id` at `url`, created through the SDK.
async fn sdk_endpoint(svix: &Svix, app_id: &str, url: String) -> EndpointOut {
    svix.endpoint()
        .create(app_id.to_owned(), EndpointIn::new(url), None)
        .await
        .expect("endpoint")
}

/// The HTTP status of an SDK error (422s come back as `Validation`).
fn status_of(e: &SvixError) -> u16 {
    match e {
        SvixError::Http(h) => h.status.as_u16(),
        SvixError::Validation(v) => v.status.as_u16(),
        other => panic!("not an HTTP error: {other}"),
    }
}

/// The `loc`s of a 422 from the SDK.
fn locs_of(e: &SvixError) -> Vec<Vec<String>> {
    match e {
        SvixError::Validation(v) => v
            .payload
            .as_ref()
            .map(|p| p.detail.iter().map(|d| d.loc.clone()).collect())
            .unwrap_or_default(),
        other => panic!("not a 422: {other}"),
    }
}

fn ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

fn rfc3339_ms(value: &serde_json::Value) -> i64 {
    let text = value.as_str().expect("a time");
    DateTime::parse_from_rfc3339(text)
        .expect("RFC 3339")
        .timestamp_millis()
}

on_both_stores!(
    a_message_with_application_creates_its_app_in_the_same_commit,
    concurrent_inline_creations_of_one_uid_make_one_app,
    deliver_at_holds_attempts_until_it_is_due,
    deliver_at_is_never_handed_off_early,
);

async fn a_message_with_application_creates_its_app_in_the_same_commit(backend: &Backend) {
    let app = backend.spawn_stepped(&[]).await;
    let svix = app.sdk();

    // No application, no `application`: 404 as before.
    let missing = svix
        .message()
        .create("no-such-app".into(), message("a.b"), None)
        .await
        .expect_err("no application");
    assert_eq!(status_of(&missing), 404);

    let msg = svix
        .message()
        .create(
            "inline-app".into(),
            MessageIn {
                application: Some(ApplicationIn {
                    metadata: Some([("k".to_owned(), "v".to_owned())].into()),
                    throttle_rate: Some(7),
                    ..app_in("inline-app", "Inline app")
                }),
                ..message("a.b")
            },
            None,
        )
        .await
        .expect("message with an inline application");
    let created = svix
        .application()
        .get("inline-app".into())
        .await
        .expect("the application exists");
    assert_eq!(created.name, "Inline app");
    assert_eq!(created.uid.as_deref(), Some("inline-app"));
    assert_eq!(created.metadata.get("k").map(String::as_str), Some("v"));
    let fetched = svix
        .message()
        .get("inline-app".into(), msg.id.clone(), None)
        .await
        .expect("the message is stored under it");
    assert_eq!(fetched.id, msg.id);
    let by_id = svix
        .message()
        .get(created.id.clone(), msg.id.clone(), None)
        .await
        .expect("by the application's id too");
    assert_eq!(by_id.id, msg.id);

    // Once it exists, `application` is ignored (Svix): nothing changes.
    svix.message()
        .create(
            "inline-app".into(),
            MessageIn {
                application: Some(app_in("inline-app", "Another name")),
                ..message("a.b")
            },
            None,
        )
        .await
        .expect("application ignored for an existing app");
    let same = svix
        .application()
        .get("inline-app".into())
        .await
        .expect("app");
    assert_eq!((same.id, same.name), (created.id, "Inline app".to_owned()));

    // Svix's rule: the body's uid must be given and be the path's.
    for (body, loc) in [
        (
            ApplicationIn::new("No uid".into()),
            vec!["body", "application", "uid"],
        ),
        (
            app_in("other-uid", "Mismatch"),
            vec!["body", "application", "uid"],
        ),
        (
            app_in("fresh-uid", " "),
            vec!["body", "application", "name"],
        ),
    ] {
        let path = if body.uid.as_deref() == Some("fresh-uid") {
            "fresh-uid"
        } else {
            "unmatched-uid"
        };
        let refused = svix
            .message()
            .create(
                path.into(),
                MessageIn {
                    application: Some(body),
                    ..message("a.b")
                },
                None,
            )
            .await
            .expect_err("refused");
        assert_eq!(status_of(&refused), 422);
        assert!(
            locs_of(&refused).contains(&loc.iter().map(|s| (*s).to_owned()).collect()),
            "{refused}"
        );
    }
    let (status, _) = app.get("/api/v1/app/unmatched-uid").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "no app made by a refusal");

    // Other routes still 404 for a missing application.
    let (status, _) = app.get("/api/v1/app/fresh-uid/msg").await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // An application token never reaches another (or a missing) app.
    let (status, token) = app
        .post("/api/v1/app/inline-app/token", json!({"name": "t"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{token}");
    let resp = app
        .client
        .post(app.url("/api/v1/app/token-made/msg"))
        .bearer_auth(token["token"].as_str().expect("token"))
        .json(&json!({
            "eventType": "a.b", "payload": {},
            "application": {"name": "x", "uid": "token-made"},
        }))
        .send()
        .await
        .expect("answer");
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let (status, _) = app.get("/api/v1/app/token-made").await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Its creation is audited.
    let (status, audit) = app.get("/api/v1/audit-log?limit=100").await;
    assert_eq!(status, StatusCode::OK, "{audit}");
    let made: Vec<_> = audit["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter(|e| e["action"] == "app.created")
        .collect();
    assert_eq!(made.len(), 1, "{audit}");
    app.shutdown().await;
}

async fn concurrent_inline_creations_of_one_uid_make_one_app(backend: &Backend) {
    let app = backend.spawn_stepped(&[]).await;
    let svix = std::sync::Arc::new(app.sdk());
    let sends = (0..10).map(|i| {
        let svix = svix.clone();
        tokio::spawn(async move {
            svix.message()
                .create(
                    "racing-uid".into(),
                    MessageIn {
                        application: Some(app_in("racing-uid", "Raced")),
                        ..MessageIn::new("a.b".into(), json!({ "i": i }))
                    },
                    None,
                )
                .await
        })
    });
    for sent in futures::future::join_all(sends).await {
        sent.expect("task").expect("every one accepted");
    }
    let apps = svix.application().list(None).await.expect("apps");
    let racing: Vec<_> = apps
        .data
        .iter()
        .filter(|a| a.uid.as_deref() == Some("racing-uid"))
        .collect();
    assert_eq!(racing.len(), 1, "{:?}", apps.data);
    let msgs = svix
        .message()
        .list(
            "racing-uid".into(),
            Some(MessageListOptions {
                limit: Some(50),
                ..MessageListOptions::default()
            }),
        )
        .await
        .expect("messages");
    assert_eq!(msgs.data.len(), 10);
    app.shutdown().await;
}

#[tokio::test]
async fn tags_round_trip_and_filter_message_lists() {
    let app = spawn_stepped(&[]).await;
    let svix = app.sdk();
    let app_id = app.create_app().await;
    let tagged = |tags: &[&str]| MessageIn {
        tags: Some(tags.iter().map(|t| (*t).to_owned()).collect()),
        ..message("a.b")
    };
    let both = svix
        .message()
        .create(app_id.clone(), tagged(&["red", "blue#1/x.y"]), None)
        .await
        .expect("tagged message");
    assert_eq!(
        both.tags,
        Some(["blue#1/x.y".to_owned(), "red".to_owned()].into())
    );
    let red = svix
        .message()
        .create(app_id.clone(), tagged(&["red"]), None)
        .await
        .expect("tagged message");
    let plain = svix
        .message()
        .create(app_id.clone(), message("a.b"), None)
        .await
        .expect("untagged message");
    assert_eq!(plain.tags, None);

    let fetched = svix
        .message()
        .get(app_id.clone(), both.id.clone(), None)
        .await
        .expect("get");
    assert_eq!(fetched.tags, both.tags);

    let list = |tag: Option<&str>| {
        let svix = &svix;
        let app_id = app_id.clone();
        let tag = tag.map(str::to_owned);
        async move {
            let page = svix
                .message()
                .list(
                    app_id,
                    Some(MessageListOptions {
                        tag,
                        ..MessageListOptions::default()
                    }),
                )
                .await
                .expect("list");
            let mut ids: Vec<String> = page.data.into_iter().map(|m| m.id).collect();
            ids.sort();
            ids
        }
    };
    let mut reds = vec![both.id.clone(), red.id.clone()];
    reds.sort();
    assert_eq!(list(Some("red")).await, reds);
    assert_eq!(list(Some("blue#1/x.y")).await, vec![both.id.clone()]);
    assert_eq!(list(Some("green")).await, Vec::<String>::new());
    assert_eq!(list(None).await.len(), 3);

    // Svix's limits: at most 5, each 1-128 of [a-zA-Z0-9-_./\#].
    for bad in [
        vec!["a", "b", "c", "d", "e", "f"],
        vec!["no spaces"],
        vec![""],
        vec!["é"],
    ] {
        let refused = svix
            .message()
            .create(app_id.clone(), tagged(&bad), None)
            .await
            .expect_err("refused");
        assert_eq!(status_of(&refused), 422, "{bad:?}");
        assert!(locs_of(&refused).contains(&vec!["body".to_owned(), "tags".to_owned()]));
    }
    let long = "t".repeat(129);
    let refused = svix
        .message()
        .create(app_id.clone(), tagged(&[long.as_str()]), None)
        .await
        .expect_err("too long");
    assert_eq!(status_of(&refused), 422);
    svix.message()
        .create(
            app_id.clone(),
            tagged(&[&"t".repeat(128), "1", "2", "3", "4"]),
            None,
        )
        .await
        .expect("five tags of up to 128");
    app.shutdown().await;
}

async fn deliver_at_holds_attempts_until_it_is_due(backend: &Backend) {
    let app = backend.spawn_stepped(&[("HERALD_MAX_AGE", "2h")]).await;
    let svix = app.sdk();
    let rx = Receiver::start().await;
    let app_id = app.create_app().await;
    let ep = sdk_endpoint(&svix, &app_id, rx.url("/hook")).await;

    // An hour ahead: stored, pending, due then; no step sends it.
    let later = Utc::now() + chrono::Duration::hours(1);
    let scheduled = send_deliver_at(&svix, &app_id, later)
        .await
        .expect("scheduled message");
    assert_eq!(scheduled.deliver_at.map(ms), Some(ms(later)));
    let fetched = svix
        .message()
        .get(app_id.clone(), scheduled.id.clone(), None)
        .await
        .expect("get");
    assert_eq!(fetched.deliver_at.map(ms), Some(ms(later)));
    let report = app.step().await;
    assert_eq!(report.claimed, 0);
    let ds = app.deliveries(&app_id, &scheduled.id).await;
    assert_eq!(ds.len(), 1);
    assert_eq!(ds[0]["state"], "pending");
    assert_eq!(rfc3339_ms(&ds[0]["nextAttemptAt"]), ms(later));
    let listed = svix
        .message_attempt()
        .list_attempted_messages(app_id.clone(), ep.id.clone(), None)
        .await
        .expect("the endpoint's messages");
    let entry = listed
        .data
        .iter()
        .find(|m| m.id == scheduled.id)
        .expect("listed");
    assert_eq!(entry.deliver_at.map(ms), Some(ms(later)));

    // In the past: sent at once.
    let past = send_deliver_at(&svix, &app_id, Utc::now() - chrono::Duration::minutes(5))
        .await
        .expect("past deliverAt");
    let report = app.step().await;
    assert_eq!((report.claimed, report.delivered), (1, 1));
    let got = rx.wait_for(1).await;
    assert_eq!(got[0].header("webhook-id"), past.id);

    // A few hundred ms ahead: nothing before, sent once due.
    let soon = Utc::now() + chrono::Duration::milliseconds(400);
    let near = send_deliver_at(&svix, &app_id, soon).await.expect("soon");
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let report = app.step().await;
        if report.claimed > 0 {
            // Claimed, so the claim's clock had reached `deliverAt`.
            assert!(ms(Utc::now()) >= ms(soon));
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never sent");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let got = rx.wait_for(2).await;
    assert_eq!(got[1].header("webhook-id"), near.id);
    assert_eq!(rx.requests().len(), 2, "the hour-ahead one is still held");

    // More than HERALD_MAX_AGE ahead: 422 naming deliverAt.
    let refused = send_deliver_at(&svix, &app_id, Utc::now() + chrono::Duration::hours(3))
        .await
        .expect_err("too far ahead");
    assert_eq!(status_of(&refused), 422);
    assert!(locs_of(&refused).contains(&vec!["body".to_owned(), "deliverAt".to_owned()]));
    let (status, body) = app
        .post(
            &format!("/api/v1/app/{app_id}/msg"),
            json!({"eventType": "a.b", "payload": {}, "deliverAt": "tomorrow"}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    app.shutdown().await;
}

/// With the dispatcher running, the ingest batch claims its new deliveries
/// itself (the handoff): never a scheduled one before its time.
async fn deliver_at_is_never_handed_off_early(backend: &Backend) {
    let app = backend.spawn_app(&[]).await;
    let svix = app.sdk();
    let rx = Receiver::start().await;
    let app_id = app.create_app().await;
    sdk_endpoint(&svix, &app_id, rx.url("/hook")).await;
    let later = Utc::now() + chrono::Duration::hours(1);
    let scheduled = send_deliver_at(&svix, &app_id, later)
        .await
        .expect("scheduled");
    let ds = app.deliveries(&app_id, &scheduled.id).await;
    assert_eq!(ds[0]["state"], "pending", "{ds:?}");
    assert_eq!(rfc3339_ms(&ds[0]["nextAttemptAt"]), ms(later));
    // A message sent after it arrives; the scheduled one does not.
    let now = svix
        .message()
        .create(app_id.clone(), message("a.b"), None)
        .await
        .expect("at once");
    let got = rx.wait_for(1).await;
    assert_eq!(got[0].header("webhook-id"), now.id);
    let soon = send_deliver_at(
        &svix,
        &app_id,
        Utc::now() + chrono::Duration::milliseconds(300),
    )
    .await
    .expect("soon");
    let got = rx.wait_for(2).await;
    assert_eq!(got[1].header("webhook-id"), soon.id);
    assert_eq!(rx.requests().len(), 2);
    assert_eq!(
        app.deliveries(&app_id, &scheduled.id).await[0]["state"],
        "pending"
    );
    app.shutdown().await;
}

/// The age cap counts from `deliverAt`: a scheduled message's deliveries
/// start their retry cycle then, as the claim reports it.
#[tokio::test]
async fn a_scheduled_delivery_starts_its_cycle_at_deliver_at() {
    use herald::store::NewMessage;
    let app = spawn_stepped(&[]).await;
    let rx = Receiver::start().await;
    let (app_id, _) = app.app_with_endpoint(&rx.url("/hook"), json!({})).await;
    let store = &app.running().store;
    let now = herald::store::now_millis();
    let m = NewMessage {
        id: herald::ids::MsgId::generate(),
        app_id: herald::ids::AppId::parse(&app_id).expect("app id"),
        event_type: "a.b".into(),
        event_id: None,
        payload: "{}".into(),
        channels: None,
        created_at: now - 10_000,
        traceparent: None,
        tags: None,
        deliver_at: Some(now - 4_000),
        application: None,
        payload_expires_at: None,
    };
    store
        .insert_messages(std::slice::from_ref(&m))
        .await
        .expect("insert");
    let ahead = claim_up_to(store, now - 5_000, now + 60_000, 10).await;
    assert!(ahead.is_empty(), "not due before deliverAt");
    let claimed = claim_up_to(store, now, now + 60_000, 10).await;
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].cycle_started_at, now - 4_000);
    app.shutdown().await;
}

/// Svix's `transformationsParams.rawPayload`: the body is that text byte
/// for byte, signed over those bytes, with the endpoint's Content-Type.
#[tokio::test]
async fn a_raw_payload_is_sent_byte_for_byte_with_the_endpoints_content_type() {
    let app = spawn_app(&[]).await;
    let rx = Receiver::start().await;
    let app_id = app.create_app().await;
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    app.create_endpoint(
        &app_id,
        &rx.url("/form"),
        serde_json::json!({"secret": secret, "headers": {"Content-Type": "application/x-www-form-urlencoded"}}),
    )
    .await;
    let raw = "amount=4200&currency=EUR&note=caf%C3%A9";
    let (status, out) = app
        .post(
            &format!("/api/v1/app/{app_id}/msg"),
            serde_json::json!({"eventType": "invoice.paid", "payload": {},
                               "transformationsParams": {"rawPayload": raw}}),
        )
        .await;
    assert_eq!(status, reqwest::StatusCode::ACCEPTED, "{out}");
    assert_eq!(out["payload"], raw, "shown as a JSON string");
    let got = rx.wait_for(1).await;
    assert_eq!(got[0].body.as_ref(), raw.as_bytes());
    assert_eq!(
        got[0].header("content-type"),
        "application/x-www-form-urlencoded"
    );
    // The body is those bytes (asserted above): signed over them.
    got[0]
        .verified_by(secret)
        .expect("signed over the exact bytes");
    let msg = out["id"].as_str().expect("id");
    let (_, read) = app.get(&format!("/api/v1/app/{app_id}/msg/{msg}")).await;
    assert_eq!(read["payload"], raw);
    // A raw payload that is JSON text shows as that JSON, on creation as
    // on every read (creation showed it as a string, reads as JSON).
    let (status, out) = app
        .post(
            &format!("/api/v1/app/{app_id}/msg"),
            json!({"eventType": "a.b", "payload": {}, "transformationsParams": {"rawPayload": "{\"a\": 1}"}}),
        )
        .await;
    assert_eq!(status, reqwest::StatusCode::ACCEPTED, "{out}");
    let msg = out["id"].as_str().expect("id");
    let (_, read) = app.get(&format!("/api/v1/app/{app_id}/msg/{msg}")).await;
    assert_eq!(
        (out["payload"].clone(), read["payload"].clone()),
        (json!({"a": 1}), json!({"a": 1}))
    );
    // Empty, or with a NUL (PostgreSQL's text cannot hold one): a 422
    // naming the field.
    for raw in ["", "a\u{0}b"] {
        let (status, body) = app
            .post(
                &format!("/api/v1/app/{app_id}/msg"),
                serde_json::json!({"eventType": "a.b", "payload": {}, "transformationsParams": {"rawPayload": raw}}),
            )
            .await;
        assert_eq!(
            status,
            reqwest::StatusCode::UNPROCESSABLE_ENTITY,
            "{raw:?}: {body}"
        );
        assert_eq!(
            body["detail"][0]["loc"],
            json!(["body", "transformationsParams", "rawPayload"]),
            "{body}"
        );
    }
    app.shutdown().await;
}

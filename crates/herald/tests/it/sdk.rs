//! The official Svix Rust SDK, pointed at Herald, drives the happy path.

use svix::api::Svix;
use svix::models::{EndpointIn, EventTypeIn, MessageIn, MessageOut};

use crate::helpers::*;

/// A message `event_type` with `payload` to the application `app_id`,
/// created through the SDK.
async fn send(
    svix: &Svix,
    app_id: &str,
    event_type: &str,
    payload: serde_json::Value,
) -> MessageOut {
    svix.message()
        .create(
            app_id.to_owned(),
            MessageIn::new(event_type.to_owned(), payload),
            None,
        )
        .await
        .expect("message created through the SDK")
}

#[tokio::test]
async fn the_svix_sdk_creates_an_app_an_endpoint_and_a_message_that_arrives() {
    let app = spawn_app(&[]).await;
    let rx = Receiver::start().await;
    let svix = app.sdk();
    let created = svix
        .application()
        .create(app_in("sdk-app", "SDK app"), None)
        .await
        .expect("application created through the SDK");
    assert!(created.id.starts_with("app_"));
    let fetched = svix
        .application()
        .get("sdk-app".into())
        .await
        .expect("get by uid");
    assert_eq!(fetched.id, created.id);
    let apps = svix.application().list(None).await.expect("list");
    assert_eq!(apps.data.len(), 1);

    let et = svix
        .event_type()
        .create(
            EventTypeIn::new("invoice.paid".into(), "An invoice was paid".into()),
            None,
        )
        .await
        .expect("event type created through the SDK");
    assert_eq!(et.name, "invoice.paid");
    let ep = svix
        .endpoint()
        .create(
            created.id.clone(),
            EndpointIn {
                event_types: Some(["invoice.paid".to_owned()].into()),
                ..EndpointIn::new(rx.url("/sdk"))
            },
            None,
        )
        .await
        .expect("endpoint created through the SDK");
    assert_eq!(ep.event_types, Some(["invoice.paid".to_owned()].into()));
    let secret = svix
        .endpoint()
        .get_secret(created.id.clone(), ep.id.clone())
        .await
        .expect("secret");

    let msg = send(
        &svix,
        &created.id,
        "invoice.paid",
        serde_json::json!({"amount": 42}),
    )
    .await;
    let got = rx.wait_for(1).await;
    assert_eq!(got[0].header("webhook-id"), msg.id);
    got[0].verified_by(&secret.key).expect("verifies");

    let fetched = svix
        .message()
        .get(created.id.clone(), msg.id.clone(), None)
        .await
        .expect("get message");
    assert_eq!(fetched.payload, serde_json::json!({"amount": 42}));

    // Attempts as the SDK parses them (the completer writes them in batches).
    let deadline = std::time::Instant::now() + PATIENCE;
    let attempts = loop {
        let list = svix
            .message_attempt()
            .list_by_msg(created.id.clone(), msg.id.clone(), None)
            .await
            .expect("attempts by message");
        if !list.data.is_empty() {
            break list;
        }
        assert!(std::time::Instant::now() < deadline, "no attempt recorded");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(attempts.data[0].response_status_code, 200);
    let by_ep = svix
        .message_attempt()
        .list_by_endpoint(created.id.clone(), ep.id.clone(), None)
        .await
        .expect("attempts by endpoint");
    assert_eq!(by_ep.data.len(), 1);
    svix.message_attempt()
        .resend(created.id.clone(), msg.id.clone(), ep.id.clone(), None)
        .await
        .expect("resend through the SDK");
    rx.wait_for(2).await;
    app.shutdown().await;
}

/// Every core call the official SDK makes, against Herald: applications,
/// event types, endpoints (headers, secret rotation, stats, recover),
/// messages with channels and filters, and the attempt log.
#[tokio::test]
async fn the_svix_sdk_drives_the_core_surface() {
    use std::collections::{BTreeMap, BTreeSet};
    use svix::api::*;
    use svix::models::*;

    let app = spawn_app(&[]).await;
    let rx = Receiver::start().await;
    let svix = app.sdk();
    let set = |items: &[&str]| {
        items
            .iter()
            .map(|s| (*s).to_owned())
            .collect::<BTreeSet<_>>()
    };

    // Applications.
    let a = svix
        .application()
        .get_or_create(app_in("shop", "Shop"), None)
        .await
        .expect("get_or_create creates");
    let again = svix
        .application()
        .get_or_create(app_in("shop", "Shop"), None)
        .await
        .expect("get_or_create finds");
    assert_eq!(again.id, a.id);
    let up = svix
        .application()
        .upsert("shop".into(), ApplicationIn::new("Shop v2".into()))
        .await
        .expect("upsert");
    assert_eq!(
        (up.id.clone(), up.name.clone()),
        (a.id.clone(), "Shop v2".to_owned())
    );
    let patched = svix
        .application()
        .patch(
            a.id.clone(),
            ApplicationPatch {
                name: Some("Shop v3".into()),
                ..ApplicationPatch::new()
            },
        )
        .await
        .expect("patch");
    assert_eq!(patched.name, "Shop v3");

    // Event types.
    for name in ["order.created", "order.paid", "order.old"] {
        svix.event_type()
            .create(
                EventTypeIn::new(name.into(), format!("{name} happened")),
                None,
            )
            .await
            .expect("event type");
    }
    svix.event_type()
        .upsert(
            "order.paid".into(),
            EventTypeUpsertIn {
                deprecated: Some(true),
                ..EventTypeUpsertIn::new("paid".into())
            },
        )
        .await
        .expect("upsert event type");
    let et = svix
        .event_type()
        .patch(
            "order.paid".into(),
            EventTypePatch {
                description: Some("paid!".into()),
                ..EventTypePatch::new()
            },
        )
        .await
        .expect("patch event type");
    assert_eq!((et.description.as_str(), et.deprecated), ("paid!", true));
    svix.event_type()
        .delete("order.old".into(), None)
        .await
        .expect("archive");
    let listed = svix.event_type().list(None).await.expect("list");
    assert_eq!(listed.data.len(), 2);
    assert_eq!(
        svix.event_type()
            .get("order.old".into())
            .await
            .expect("get")
            .archived,
        Some(true)
    );

    // Endpoints: channels route, headers travel, the secret rotates.
    let ep = svix
        .endpoint()
        .create(
            a.id.clone(),
            EndpointIn {
                uid: Some("eu".into()),
                channels: Some(set(&["eu"])),
                event_types: Some(set(&["order.created", "order.paid"])),
                ..EndpointIn::new(rx.url("/eu"))
            },
            None,
        )
        .await
        .expect("endpoint");
    assert_eq!(ep.channels, Some(set(&["eu"])));
    let other = svix
        .endpoint()
        .upsert(
            a.id.clone(),
            "everything".into(),
            EndpointUpsertIn::new(rx.url("/all")),
        )
        .await
        .expect("upsert creates under the uid");
    assert_eq!(other.uid.as_deref(), Some("everything"));
    let other = svix
        .endpoint()
        .upsert(
            a.id.clone(),
            "everything".into(),
            EndpointUpsertIn {
                description: Some("all of it".into()),
                ..EndpointUpsertIn::new(rx.url("/all"))
            },
        )
        .await
        .expect("upsert replaces");
    assert_eq!(other.description, "all of it");
    let ep2 = svix
        .endpoint()
        .patch(
            a.id.clone(),
            ep.id.clone(),
            EndpointPatch {
                description: Some("Europe".into()),
                ..EndpointPatch::new()
            },
        )
        .await
        .expect("patch endpoint");
    assert_eq!(ep2.description, "Europe");
    svix.endpoint()
        .set_headers(
            a.id.clone(),
            ep.id.clone(),
            EndpointHeadersIn::new(BTreeMap::from([
                ("x-tenant".to_owned(), "acme".to_owned()),
                ("x-drop".to_owned(), "me".to_owned()),
            ])),
        )
        .await
        .expect("set headers");
    svix.endpoint()
        .patch_headers(
            a.id.clone(),
            ep.id.clone(),
            EndpointHeadersPatchIn {
                delete_headers: Some(vec!["x-drop".into()]),
                ..EndpointHeadersPatchIn::new(BTreeMap::from([(
                    "x-region".to_owned(),
                    "eu-west".to_owned(),
                )]))
            },
        )
        .await
        .expect("patch headers");
    let headers = svix
        .endpoint()
        .get_headers(a.id.clone(), ep.id.clone())
        .await
        .expect("get headers");
    assert_eq!(
        headers.headers,
        BTreeMap::from([
            ("x-region".to_owned(), "eu-west".to_owned()),
            ("x-tenant".to_owned(), "acme".to_owned()),
        ])
    );
    let old_secret = svix
        .endpoint()
        .get_secret(a.id.clone(), ep.id.clone())
        .await
        .expect("secret")
        .key;
    svix.endpoint()
        .rotate_secret(
            a.id.clone(),
            ep.id.clone(),
            EndpointSecretRotateIn::new(),
            None,
        )
        .await
        .expect("rotate");
    let new_secret = svix
        .endpoint()
        .get_secret(a.id.clone(), ep.id.clone())
        .await
        .expect("secret")
        .key;
    assert_ne!(old_secret, new_secret);

    // Messages: one to the EU channel, one without a channel.
    let eu = svix
        .message()
        .create(
            a.id.clone(),
            MessageIn {
                channels: Some(set(&["eu"])),
                event_id: Some("evt-1".into()),
                ..MessageIn::new("order.created".into(), serde_json::json!({"n": 1}))
            },
            None,
        )
        .await
        .expect("message with a channel");
    let plain = send(&svix, &a.id, "order.paid", serde_json::json!({"n": 2})).await;
    let got = rx.wait_for(3).await;
    let eu_requests: Vec<_> = got.iter().filter(|r| r.path == "/eu").collect();
    assert_eq!(
        eu_requests.len(),
        1,
        "the channel-less message skips the EU endpoint"
    );
    assert_eq!(eu_requests[0].header("webhook-id"), eu.id);
    assert_eq!(eu_requests[0].header("x-tenant"), "acme");
    assert_eq!(eu_requests[0].header("x-region"), "eu-west");
    assert_eq!(
        eu_requests[0]
            .header("webhook-signature")
            .split(' ')
            .count(),
        2,
        "new and old secret sign during the grace"
    );
    assert_eq!(got.iter().filter(|r| r.path == "/all").count(), 2);

    let all = svix.message().list(a.id.clone(), None).await.expect("list");
    assert_eq!(
        all.data.iter().map(|m| m.id.clone()).collect::<Vec<_>>(),
        vec![plain.id.clone(), eu.id.clone()],
        "newest first"
    );
    let by_channel = svix
        .message()
        .list(
            a.id.clone(),
            Some(MessageListOptions {
                channel: Some("eu".into()),
                ..MessageListOptions::default()
            }),
        )
        .await
        .expect("list by channel");
    assert_eq!(by_channel.data.len(), 1);
    let by_type = svix
        .message()
        .list(
            a.id.clone(),
            Some(MessageListOptions {
                event_types: Some(set(&["order.paid", "order.nothing"])),
                ..MessageListOptions::default()
            }),
        )
        .await
        .expect("list by type");
    assert_eq!(by_type.data.len(), 1);
    assert_eq!(by_type.data[0].id, plain.id);
    let fetched = svix
        .message()
        .get(a.id.clone(), "evt-1".into(), None)
        .await
        .expect("get by eventId");
    assert_eq!(fetched.channels, Some(set(&["eu"])));

    // The attempt log, filtered: once every outcome is written (the
    // receiver seeing a request comes before its outcome is recorded).
    app.wait_for_state(&a.id, &eu.id, "delivered").await;
    app.wait_for_state(&a.id, &plain.id, "delivered").await;
    let attempts = svix
        .message_attempt()
        .list_by_msg(a.id.clone(), eu.id.clone(), None)
        .await
        .expect("attempts by msg");
    assert_eq!(attempts.data.len(), 2, "one per endpoint");
    let one = svix
        .message_attempt()
        .get(
            a.id.clone(),
            eu.id.clone(),
            attempts.data[0].id.clone(),
            None,
        )
        .await
        .expect("get attempt");
    assert_eq!(one.response_status_code, 200);
    let failed = svix
        .message_attempt()
        .list_by_endpoint(
            a.id.clone(),
            ep.id.clone(),
            Some(MessageAttemptListByEndpointOptions {
                status: Some(MessageStatus::Fail),
                ..MessageAttemptListByEndpointOptions::default()
            }),
        )
        .await
        .expect("failed attempts");
    assert!(failed.data.is_empty());
    let ok_2xx = svix
        .message_attempt()
        .list_by_endpoint(
            a.id.clone(),
            other.id.clone(),
            Some(MessageAttemptListByEndpointOptions {
                status_code_class: Some(StatusCodeClass::Code2xx),
                ..MessageAttemptListByEndpointOptions::default()
            }),
        )
        .await
        .expect("2xx attempts");
    assert_eq!(ok_2xx.data.len(), 2);
    let destinations = svix
        .message_attempt()
        .list_attempted_destinations(a.id.clone(), eu.id.clone(), None)
        .await
        .expect("destinations");
    assert_eq!(destinations.data.len(), 2);
    assert!(destinations
        .data
        .iter()
        .all(|d| d.status == MessageStatus::Success));
    let sent = svix
        .message_attempt()
        .list_attempted_messages(a.id.clone(), other.id.clone(), None)
        .await
        .expect("attempted messages");
    assert_eq!(sent.data.len(), 2);
    let stats = svix
        .endpoint()
        .get_stats(a.id.clone(), other.id.clone(), None)
        .await
        .expect("stats");
    assert_eq!((stats.success, stats.fail, stats.pending), (2, 0, 0));

    // Recover: a failure made dead, then re-queued by time window.
    rx.always(Reply::status(400));
    let before = chrono::Utc::now() - chrono::Duration::seconds(5);
    let doomed = send(&svix, &a.id, "order.paid", serde_json::json!({"n": 3})).await;
    app.wait_for_state(&a.id, &doomed.id, "dead").await;
    rx.always(Reply::status(200));
    svix.endpoint()
        .recover(a.id.clone(), other.id.clone(), RecoverIn::new(before), None)
        .await
        .expect("recover");
    app.wait_for_state(&a.id, &doomed.id, "delivered").await;

    // Deleting: the endpoint, then the application.
    svix.endpoint()
        .delete(a.id.clone(), ep.id.clone())
        .await
        .expect("delete endpoint");
    svix.application()
        .delete(a.id.clone())
        .await
        .expect("delete app");
    assert!(svix.application().get(a.id.clone()).await.is_err());
    app.shutdown().await;
}

#[tokio::test]
async fn the_svix_sdk_health_check_and_svixs_health_routes_answer() {
    let app = spawn_app(&[]).await;
    let svix = app.sdk();
    svix.health()
        .get()
        .await
        .expect("health.get() through the SDK");
    // As Svix's server answers them, without a token.
    let client = reqwest::Client::new();
    let resp = get_answer(&client, &app, "/api/v1/health").await;
    assert_eq!(resp.status(), 200);
    let body: serde_json::Value = resp.json().await.expect("json");
    assert_eq!(
        body,
        serde_json::json!({"database": {"status": "ok"}, "queue": {"status": "ok"}, "cache": {"status": "ok"}})
    );
    for path in ["/api/v1/health", "/api/v1/health/ping"] {
        let resp = client.head(app.url(path)).send().await.expect("herald");
        assert!(resp.status().is_success(), "HEAD {path}: {}", resp.status());
    }
    let resp = get_answer(&client, &app, "/api/v1/health/ping").await;
    assert_eq!(resp.status(), 204);
    app.shutdown().await;
}

//! The official Svix Rust SDK, pointed at Herald, drives the happy path.

use svix::api::{Svix, SvixOptions};
use svix::models::{ApplicationIn, EndpointIn, EventTypeIn, MessageIn};

use crate::helpers::*;

#[tokio::test]
async fn the_svix_sdk_creates_an_app_an_endpoint_and_a_message_that_arrives() {
    let app = spawn_app(&[]).await;
    let rx = Receiver::start().await;
    let svix = Svix::new(
        TOKEN.to_owned(),
        Some(SvixOptions {
            server_url: Some(app.base.clone()),
            ..SvixOptions::default()
        }),
    );
    let created = svix
        .application()
        .create(
            ApplicationIn {
                uid: Some("sdk-app".into()),
                ..ApplicationIn::new("SDK app".into())
            },
            None,
        )
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

    let msg = svix
        .message()
        .create(
            created.id.clone(),
            MessageIn::new("invoice.paid".into(), serde_json::json!({"amount": 42})),
            None,
        )
        .await
        .expect("message created through the SDK");
    let got = rx.wait_for(1).await;
    assert_eq!(got[0].header("webhook-id"), msg.id);
    let wh = standardwebhooks::Webhook::new(&secret.key).expect("secret");
    let mut headers = http::HeaderMap::new();
    for name in ["webhook-id", "webhook-timestamp", "webhook-signature"] {
        headers.insert(name, got[0].header(name).parse().expect("value"));
    }
    wh.verify(&got[0].body, &headers).expect("verifies");

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

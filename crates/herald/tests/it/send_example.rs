//! Svix's send-example through the official SDK: a real, signed message to
//! one endpoint whatever its filter, with the schema's example or
//! `svix.ping`'s body; no example is a 400 that says so.

use serde_json::json;
use svix::models::EventExampleIn;

use crate::helpers::*;

crate::on_both_stores!(send_example_is_stored_and_sent_on_both_stores,);

/// Asks the API to send an example of `event_type` to endpoint `ep` of
/// `app_id`: its answer.
async fn send_example(
    app: &TestApp,
    app_id: &str,
    ep: &str,
    event_type: &str,
) -> (reqwest::StatusCode, serde_json::Value) {
    app.post(
        &format!("/api/v1/app/{app_id}/endpoint/{ep}/send-example"),
        json!({ "eventType": event_type }),
    )
    .await
}

#[tokio::test]
async fn send_example_delivers_the_schema_example_or_the_ping_to_that_endpoint_alone() {
    let app = spawn_app(&[]).await;
    let rx = Receiver::start().await;
    let other = Receiver::start().await;
    let svix = app.sdk();
    app.create_event_type(json!({"name": "invoice.paid", "description": "paid",
        "schemas": {"1": {"type": "object", "examples": [{"amount": 4200}, {"amount": 1}]}}}))
        .await;
    app.create_event_types(&["bare.type", "only.this"]).await;
    let app_id = app.create_app().await;
    // Its filter takes neither event type: send-example goes anyway.
    let ep = app
        .create_endpoint(
            &app_id,
            &rx.url("/ex"),
            json!({"filterTypes": ["only.this"]}),
        )
        .await;
    let ep = ep["id"].as_str().expect("id").to_owned();
    app.create_endpoint(&app_id, &other.url("/other"), json!({}))
        .await;

    let sent = svix
        .endpoint()
        .send_example(
            app_id.clone(),
            ep.clone(),
            EventExampleIn::new("invoice.paid".into()),
            None,
        )
        .await
        .expect("send_example through the SDK");
    assert!(sent.id.starts_with("msg_"));
    let got = rx.wait_for(1).await;
    assert_eq!(got[0].body.as_ref(), br#"{"amount":4200}"#);
    assert_eq!(got[0].header("x-event-type"), "invoice.paid");
    assert!(got[0].header("webhook-signature").starts_with("v1,"));

    let second = EventExampleIn {
        example_index: Some(1),
        ..EventExampleIn::new("invoice.paid".into())
    };
    svix.endpoint()
        .send_example(app_id.clone(), ep.clone(), second, None)
        .await
        .expect("the second example");
    svix.endpoint()
        .send_example(
            app_id.clone(),
            ep.clone(),
            EventExampleIn::new("svix.ping".into()),
            None,
        )
        .await
        .expect("svix.ping");
    let got = rx.wait_for(3).await;
    let bodies: Vec<&[u8]> = got.iter().map(|r| r.body.as_ref()).collect();
    assert!(
        bodies.contains(&br#"{"amount":1}"#.as_slice()),
        "{bodies:?}"
    );
    assert!(
        bodies.contains(&br#"{"success": true}"#.as_slice()),
        "{bodies:?}"
    );
    // In the attempt log like any message.
    let attempts = app.attempts_of_msg(&app_id, &sent.id).await;
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0]["responseStatusCode"], 200);

    // No example: 400 naming the problem; no such type: 404.
    let (status, body) = send_example(&app, &app_id, &ep, "bare.type").await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("example"),
        "{body}"
    );
    let (status, _) = send_example(&app, &app_id, &ep, "no.such.type").await;
    assert_eq!(status, 404);
    // The other endpoint received none of these.
    assert!(other.requests().is_empty());
    app.shutdown().await;
}

async fn send_example_is_stored_and_sent_on_both_stores(backend: &Backend) {
    let app = backend.spawn_stepped(&[]).await;
    let rx = Receiver::start().await;
    let (app_id, ep) = app.app_with_endpoint(&rx.url("/"), json!({})).await;
    let (status, out) = send_example(&app, &app_id, &ep, "svix.ping").await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(app.step().await.delivered, 1);
    let got = rx.wait_for(1).await;
    assert_eq!(got[0].body.as_ref(), br#"{"success": true}"#);
    let msg = out["id"].as_str().expect("id");
    let d = app.deliveries(&app_id, msg).await;
    assert_eq!(d.len(), 1);
    assert_eq!(d[0]["state"], "delivered");
    // An endpoint of another application: 404, nothing stored.
    let other = app.create_app().await;
    let (status, _) = send_example(&app, &other, &ep, "svix.ping").await;
    assert_eq!(status, 404);
    app.shutdown().await;
}

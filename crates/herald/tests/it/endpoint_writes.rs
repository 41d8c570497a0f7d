//! Endpoint writes through the real API, on both stores: enabling an
//! endpoint that is enabled kills none of its deliveries.

use axum::http::StatusCode;
use serde_json::json;

use crate::helpers::*;

crate::on_both_stores!(enabling_an_enabled_endpoint_keeps_its_old_pending_deliveries,);

/// An app with one endpoint pointed at `url`; returns (app id, endpoint id).
async fn app_and_endpoint(app: &TestApp, url: &str) -> (String, String) {
    let app_id = app.create_app().await;
    let ep = app.create_endpoint(&app_id, url, json!({})).await;
    (app_id, ep["id"].as_str().expect("id").to_owned())
}

/// `POST …/enable` on an endpoint that is enabled: its pending delivery,
/// older than the age cap, is not held and so is not "too old" at enable;
/// it stays pending and is delivered.
async fn enabling_an_enabled_endpoint_keeps_its_old_pending_deliveries(backend: &Backend) {
    let app = backend.spawn_stepped(&[("HERALD_MAX_AGE", "300ms")]).await;
    let rx = Receiver::start().await;
    rx.script([Reply::status(500)]);
    let (app_id, ep_id) = app_and_endpoint(&app, &rx.url("/hook")).await;
    let msg = app.send_message(&app_id, "x", json!({})).await;
    assert_eq!(app.step().await.retried, 1);
    // The age cap is measured on the store's clock: let it pass.
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;

    let (status, out) = app
        .post(
            &format!("/api/v1/app/{app_id}/endpoint/{ep_id}/enable"),
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(
        (
            out["expiredDeliveries"].clone(),
            out["endpoint"]["disabled"].clone()
        ),
        (json!(0), json!(false))
    );
    let ds = app.deliveries(&app_id, &msg).await;
    assert_eq!(ds[0]["state"], "pending", "{ds:?}");

    assert_eq!(app.step().await.delivered, 1);
    app.wait_for_state(&app_id, &msg, "delivered").await;
    assert_eq!(rx.requests().len(), 2);
    app.shutdown().await;
}

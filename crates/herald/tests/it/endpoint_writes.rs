//! Endpoint writes racing each other through the real API, on both stores:
//! a save never writes back a disabled flag or a secret it merely read,
//! and enabling an endpoint that is enabled kills none of its deliveries.
//! And, on PostgreSQL, deleting an application while its deliveries
//! complete.

use axum::http::StatusCode;
use serde_json::json;

use crate::helpers::*;

crate::on_both_stores!(postgres: deleting_apps_while_their_deliveries_complete);

/// Races per test: one lost race in five was common before saves wrote
/// only what they change.
const ROUNDS: usize = 100;

crate::on_both_stores!(
    a_save_racing_a_disable_never_undoes_it,
    a_save_racing_a_rotation_keeps_the_rotated_secret,
    enabling_an_enabled_endpoint_keeps_its_old_pending_deliveries,
);

/// An app with one endpoint pointed at `url`; returns (app id, endpoint id).
/// A PATCH of the description and a PUT of the headers, each racing
/// `POST …/disable`: the endpoint always ends disabled, by the operator
/// (the reason given, and nothing new routed to it), with the PATCH's
/// description and the PUT's headers.
async fn a_save_racing_a_disable_never_undoes_it(backend: &Backend) {
    let app = backend.spawn_app(&[]).await;
    let (app_id, ep_id) = app
        .app_with_endpoint("http://127.0.0.1:9/hook", json!({}))
        .await;
    let ep_path = format!("/api/v1/app/{app_id}/endpoint/{ep_id}");
    for round in 0..ROUNDS {
        let reason = format!("round {round}");
        let description = format!("described in round {round}");
        let (headers_path, disable_path) =
            (format!("{ep_path}/headers"), format!("{ep_path}/disable"));
        let (patched, headers, disabled) = tokio::join!(
            app.patch(&ep_path, json!({ "description": description })),
            app.put(
                &headers_path,
                json!({"headers": {"X-Round": round.to_string()}})
            ),
            app.post(&disable_path, json!({ "reason": reason })),
        );
        assert_eq!(patched.0, StatusCode::OK, "{}", patched.1);
        assert_eq!(headers.0, StatusCode::NO_CONTENT, "{}", headers.1);
        assert_eq!(disabled.0, StatusCode::OK, "{}", disabled.1);

        let (status, ep) = app.get(&ep_path).await;
        assert_eq!(status, StatusCode::OK, "{ep}");
        assert_eq!(
            (ep["disabled"].clone(), ep["description"].clone()),
            (json!(true), json!(description)),
            "round {round}: the disable and the PATCH both hold"
        );
        let (_, health) = app.get(&format!("{ep_path}/health")).await;
        assert_eq!(
            (health["disabled"].clone(), health["disabledReason"].clone()),
            (json!(true), json!(reason)),
            "round {round}: {health}"
        );
        let (_, h) = app.get(&format!("{ep_path}/headers")).await;
        assert_eq!(h["headers"], json!({"X-Round": round.to_string()}));

        let (status, out) = app.post(&format!("{ep_path}/enable"), json!({})).await;
        assert_eq!(status, StatusCode::OK, "{out}");
        assert_eq!(out["endpoint"]["disabled"], false);
    }

    // Disabled by an operator (not by Herald): new messages pass it by.
    let (status, _) = app.post(&format!("{ep_path}/disable"), json!({})).await;
    assert_eq!(status, StatusCode::OK);
    let msg = app.send_message(&app_id, "x", json!({})).await;
    assert!(app.deliveries(&app_id, &msg).await.is_empty());
    app.shutdown().await;
}

/// A PATCH of the description and a PUT of the headers, each racing a
/// secret rotation: the rotated secret is always the one kept.
async fn a_save_racing_a_rotation_keeps_the_rotated_secret(backend: &Backend) {
    let app = backend.spawn_app(&[]).await;
    let (app_id, ep_id) = app
        .app_with_endpoint("http://127.0.0.1:9/hook", json!({}))
        .await;
    let ep_path = format!("/api/v1/app/{app_id}/endpoint/{ep_id}");
    for round in 0..ROUNDS {
        let key = herald_signing::Secret::generate().expose();
        let (headers_path, rotate_path) = (
            format!("{ep_path}/headers"),
            format!("{ep_path}/secret/rotate"),
        );
        let (patched, headers, rotated) = tokio::join!(
            app.patch(&ep_path, json!({ "description": format!("round {round}") })),
            app.put(
                &headers_path,
                json!({"headers": {"X-Round": round.to_string()}})
            ),
            app.post(&rotate_path, json!({ "key": key, "gracePeriodSeconds": 0 })),
        );
        assert_eq!(patched.0, StatusCode::OK, "{}", patched.1);
        assert_eq!(headers.0, StatusCode::NO_CONTENT, "{}", headers.1);
        assert_eq!(rotated.0, StatusCode::OK, "{}", rotated.1);
        let (status, secret) = app.get(&format!("{ep_path}/secret")).await;
        assert_eq!(status, StatusCode::OK, "{secret}");
        assert_eq!(secret["key"], key, "round {round}: the rotation holds");
    }
    app.shutdown().await;
}

/// `POST …/enable` on an endpoint that is enabled: its pending delivery,
/// older than the age cap, is not held and so is not "too old" at enable;
/// it stays pending and is delivered.
async fn enabling_an_enabled_endpoint_keeps_its_old_pending_deliveries(backend: &Backend) {
    let app = backend.spawn_stepped(&[("HERALD_MAX_AGE", "300ms")]).await;
    let rx = Receiver::start().await;
    rx.script([Reply::status(500)]);
    let (app_id, ep_id) = app.app_with_endpoint(&rx.url("/hook"), json!({})).await;
    let msg = app.send_message(&app_id, "x", json!({})).await;
    assert_eq!(app.step().await.retried, 1);
    // The age cap is measured on the store's clock: let it pass.
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;

    let out = app.enable_endpoint(&app_id, &ep_id).await;
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

/// Applications deleted while deliveries to their endpoints are being
/// recorded (PostgreSQL: completers and the deletion lock endpoints and
/// their stats buckets): every deletion answers 204, never a 500 for a
/// deadlock.
async fn deleting_apps_while_their_deliveries_complete(pg: PgSchema) {
    use futures::FutureExt;
    const APPS: usize = 40;
    let backend = Backend::Postgres(pg);
    let outcome = std::panic::AssertUnwindSafe(async {
        let app = backend.spawn_app(&[]).await;
        let rx = Receiver::start().await;
        for round in 0..APPS {
            let app_id = app.create_app().await;
            for n in 0..3 {
                app.create_endpoint(&app_id, &rx.url(&format!("/{round}/{n}")), json!({}))
                    .await;
            }
            let before = rx.requests().len();
            // Messages keep coming until the app is gone (then 404).
            let sending = {
                let (client, url) = (
                    app.client.clone(),
                    app.url(&format!("/api/v1/app/{app_id}/msg")),
                );
                tokio::spawn(async move {
                    loop {
                        let sent = client
                            .post(&url)
                            .bearer_auth(TOKEN)
                            .json(&json!({"eventType": "x", "payload": {}}))
                            .send()
                            .await
                            .expect("herald answers");
                        if sent.status() == reqwest::StatusCode::NOT_FOUND {
                            return;
                        }
                        assert_eq!(sent.status(), reqwest::StatusCode::ACCEPTED);
                    }
                })
            };
            // Outcomes are being recorded for its endpoints: delete it now.
            rx.wait_for(before + 6).await;
            let (status, out) = app.delete(&format!("/api/v1/app/{app_id}")).await;
            assert_eq!(status, StatusCode::NO_CONTENT, "round {round}: {out}");
            sending.await.expect("sender");
            let (status, _) = app.get(&format!("/api/v1/app/{app_id}")).await;
            assert_eq!(status, StatusCode::NOT_FOUND);
        }
        app.shutdown().await;
    })
    .catch_unwind()
    .await;
    if let Backend::Postgres(pg) = &backend {
        pg.drop_schema().await;
    }
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

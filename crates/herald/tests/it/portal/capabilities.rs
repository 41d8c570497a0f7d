//! Capabilities: what a portal session or token may see and do, in the
//! pages and in the API.

use reqwest::StatusCode;
use serde_json::{json, Value};

use super::*;

/// Herald with an application and one endpoint on a receiver.
struct OneEndpoint {
    app: TestApp,
    rx: Receiver,
    /// The application's id.
    id: String,
    /// The endpoint as the API created it, and its id.
    ep: Value,
    ep_id: String,
}

async fn one_endpoint() -> OneEndpoint {
    let app = spawn_app(&[]).await;
    let rx = Receiver::start().await;
    let id = app.create_app().await;
    let ep = app.create_endpoint(&id, &rx.url("/hook"), json!({})).await;
    let ep_id = ep["id"].as_str().expect("id").to_owned();
    OneEndpoint {
        app,
        rx,
        id,
        ep,
        ep_id,
    }
}

/// The status of a test event (`svix.ping`) sent at `path` with `token`.
async fn test_event_status(app: &TestApp, token: &str, path: &str) -> StatusCode {
    app.as_token(token)
        .post(path, json!({"eventType": "svix.ping"}))
        .await
        .0
}

#[tokio::test]
async fn capabilities_hide_forms_and_the_server_refuses_what_they_do_not_allow() {
    let OneEndpoint {
        app,
        rx,
        id,
        ep,
        ep_id,
    } = one_endpoint().await;
    let here = format!("/portal/endpoint/{ep_id}");
    // Every action of the endpoint's page that changes something.
    let writes: &[&str] = &[
        "/rotate",
        "/send-example",
        "/recover",
        "/edit",
        "/delete",
        "/disable",
    ];
    // (capabilities, form actions that must be absent, POSTs refused)
    let cases: &[(Value, &[&str], &[&str])] = &[
        (
            json!({"readOnly": true}),
            &[writes, &["reveal"]].concat(),
            writes,
        ),
        (
            json!({"capabilities": ["ViewBase", "ViewEndpointSecret"]}),
            &["/rotate", "/send-example", "/edit"],
            &["/rotate", "/send-example", "/edit", "/delete"],
        ),
        (
            json!({"capabilities": ["ManageEndpointSecret"]}),
            &["/send-example", "/edit"],
            &["/send-example", "/recover", "/disable"],
        ),
        (
            json!({"capabilities": ["CreateAttempts", "ManageTransformations"]}),
            &["/rotate", "/edit", "reveal"],
            &["/rotate", "/edit", "/enable"],
        ),
    ];
    for (body, absent, refused) in cases {
        let (_, out) = access(&app, &id, body.clone()).await;
        let cookie = open_link(&app, out["url"].as_str().expect("url")).await;
        let (status, html) = page(&app, &cookie, &here).await;
        assert_eq!(status, StatusCode::OK, "{body}: {html}");
        assert!(
            html.contains(&*rx.url("/hook")),
            "sees the endpoint: {body}"
        );
        for form in *absent {
            let needle = if *form == "reveal" {
                "data-reveal=\"secret\"".to_owned()
            } else {
                format!("action=\"{here}{form}\"")
            };
            assert!(!html.contains(&needle), "{body}: {needle} shown");
            assert!(
                !html.contains(&format!("href=\"{here}{form}\"")),
                "{body}: link to {form} shown"
            );
        }
        for action in *refused {
            let (status, text) = post_form(
                &app,
                &cookie,
                &format!("{here}{action}"),
                &[
                    ("url", "https://example.com/new"),
                    ("eventType", "svix.ping"),
                    ("since", "2020-01-01T00:00"),
                ],
            )
            .await;
            assert_eq!(
                status,
                StatusCode::FORBIDDEN,
                "{body} POST {action}: {text}"
            );
        }
        if !body.to_string().contains("Secret") && !body.to_string().contains("ManageEndpoint") {
            let (status, _) = page(&app, &cookie, &format!("{here}/secret")).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{body}: the secret");
        }
    }
    let (_, still) = app.get(&format!("/api/v1/app/{id}/endpoint/{ep_id}")).await;
    assert_eq!(still["url"], ep["url"], "nothing changed");
    assert_eq!(still["disabled"], false);
}

/// Capabilities in the API: each call needs its capability, and a portal
/// token never creates messages; the per-caller rate limit applies to
/// portal sessions.
#[tokio::test]
async fn portal_tokens_need_their_capability_for_each_api_call() {
    let OneEndpoint {
        app,
        rx: _rx,
        id,
        ep_id,
        ..
    } = one_endpoint().await;
    let token = |caps: Value| {
        let app = &app;
        let id = id.clone();
        async move {
            let (status, out) = access(app, &id, json!({ "capabilities": caps })).await;
            assert_eq!(status, StatusCode::OK, "{out}");
            out["token"].as_str().expect("token").to_owned()
        }
    };
    let secret_path = format!("/api/v1/app/{id}/endpoint/{ep_id}/secret");
    let rotate_path = format!("/api/v1/app/{id}/endpoint/{ep_id}/secret/rotate");
    let example_path = format!("/api/v1/app/{id}/endpoint/{ep_id}/send-example");
    let base = token(json!(["ViewBase"])).await;
    assert_eq!(
        app.as_token(&base).get(&secret_path).await.0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        test_event_status(&app, &base, &example_path).await,
        StatusCode::FORBIDDEN
    );
    let secrets = token(json!(["ManageEndpointSecret"])).await;
    assert_eq!(
        app.as_token(&secrets).get(&secret_path).await.0,
        StatusCode::OK
    );
    assert_eq!(
        app.as_token(&secrets).post(&rotate_path, json!({})).await.0,
        StatusCode::OK
    );
    assert_eq!(
        app.as_token(&secrets)
            .patch(
                &format!("/api/v1/app/{id}/endpoint/{ep_id}"),
                json!({"description": "x"})
            )
            .await
            .0,
        StatusCode::FORBIDDEN
    );
    let attempts = token(json!(["CreateAttempts"])).await;
    assert_eq!(
        test_event_status(&app, &attempts, &example_path).await,
        StatusCode::OK
    );
    let all = token(json!([
        "ViewBase",
        "ViewEndpointSecret",
        "ManageEndpointSecret",
        "ManageEndpoint",
        "CreateAttempts"
    ]))
    .await;
    let (status, err) = app
        .as_token(&all)
        .post(
            &format!("/api/v1/app/{id}/msg"),
            json!({"eventType": "a.b", "payload": {}}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{err}");
    assert_eq!(err["code"], "forbidden", "a JSON error: {err}");

    // A portal session is one caller of HERALD_API_RATE_LIMIT.
    let limited_app = spawn_app(&[("HERALD_API_RATE_LIMIT", "2")]).await;
    let id = limited_app.create_app().await;
    let (_, out) = access(&limited_app, &id, json!({})).await;
    let cookie = open_link(&limited_app, out["url"].as_str().expect("url")).await;
    let mut limited = false;
    for _ in 0..20 {
        if page(&limited_app, &cookie, "/portal/event-types").await.0
            == StatusCode::TOO_MANY_REQUESTS
        {
            limited = true;
            break;
        }
    }
    assert!(limited, "the session met the rate limit");
}

/// The message log's resend: shown and done with `CreateAttempts`, absent
/// and refused (403) without it; the receiver gets the one more attempt.
#[tokio::test]
async fn the_message_page_resends_only_with_create_attempts() {
    let OneEndpoint {
        app, rx, id, ep_id, ..
    } = one_endpoint().await;
    let msg = app
        .send_message(&id, "order.paid", json!({"order": "inv-42"}))
        .await;
    app.wait_for_state(&id, &msg, "delivered").await;
    rx.wait_for(1).await;
    let resend = format!("/portal/msg/{msg}/endpoint/{ep_id}/resend");

    let (_, out) = access(&app, &id, json!({"readOnly": true})).await;
    let viewer = open_link(&app, out["url"].as_str().expect("url")).await;
    let (status, body) = page(&app, &viewer, &format!("/portal/msg/{msg}")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains("inv-42"), "the payload is shown: {body}");
    assert!(!body.contains("/resend"), "no resend form: {body}");
    let (status, _) = post_form(&app, &viewer, &resend, &[]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    let (_, out) = access(
        &app,
        &id,
        json!({"capabilities": ["ViewBase", "CreateAttempts"]}),
    )
    .await;
    let operator = open_link(&app, out["url"].as_str().expect("url")).await;
    let (_, body) = page(&app, &operator, &format!("/portal/msg/{msg}")).await;
    assert!(body.contains(&resend), "the resend form: {body}");
    let (status, _) = post_form(&app, &operator, &resend, &[]).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let got = rx.wait_for(2).await;
    assert_eq!(got.len(), 2, "one more attempt reached the receiver");
    assert_eq!(got[1].header("x-attempt"), "2");
}

/// Sensitive header values are redacted in every answer (their names in
/// `sensitive`, as Svix's API describes); a read-only portal token gets
/// every header by name only; the receiver still gets them all.
#[tokio::test]
async fn header_values_are_redacted_and_a_read_only_token_gets_names_only() {
    let app = spawn_app(&[]).await;
    let id = app.create_app().await;
    let ep = app
        .create_endpoint(
            &id,
            "http://127.0.0.1:9/hook",
            json!({"headers": {
                "Authorization": "Bearer tenant-credential",
                "Cookie": "session=abc",
                "X-Api-Key": "key-123",
                "X-Auth-Token": "tok-456",
                "X-Region": "eu-1",
            }}),
        )
        .await;
    let ep_id = ep["id"].as_str().expect("id");
    let path = format!("/api/v1/app/{id}/endpoint/{ep_id}/headers");
    let secret_values = ["tenant-credential", "abc", "key-123", "tok-456"];
    let sensitive = json!(["Authorization", "Cookie", "X-Api-Key", "X-Auth-Token"]);

    let (status, admin) = app.get(&path).await;
    assert_eq!(status, StatusCode::OK, "{admin}");
    assert_eq!(admin["headers"], json!({"X-Region": "eu-1"}), "{admin}");
    assert_eq!(admin["sensitive"], sensitive, "{admin}");

    for (caps, names_only) in [
        (json!(["ViewBase"]), true),
        (json!(["ManageEndpoint"]), false),
    ] {
        let (status, out) = access(&app, &id, json!({ "capabilities": caps })).await;
        assert_eq!(status, StatusCode::OK, "{out}");
        let token = out["token"].as_str().expect("token");
        let (status, got) = app.as_token(token).get(&path).await;
        assert_eq!(status, StatusCode::OK, "{got}");
        let text = got.to_string();
        for value in secret_values {
            assert!(!text.contains(value), "{caps}: {text}");
        }
        if names_only {
            assert_eq!(got["headers"], json!({}), "{got}");
            assert_eq!(
                got["sensitive"],
                json!([
                    "Authorization",
                    "Cookie",
                    "X-Api-Key",
                    "X-Auth-Token",
                    "X-Region"
                ]),
                "{got}"
            );
        } else {
            assert_eq!(got, admin, "{caps}");
        }
    }
}

//! The customer portal (issue #12): Svix-compatible access links and
//! tokens, the one-time code exchange, sessions in the store, capability
//! checks, and every portal route scoped to the session's application.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use svix::api::{Svix, SvixOptions};
use svix::models::{AppPortalAccessIn, ApplicationIn, ApplicationTokenExpireIn};

use crate::helpers::*;
use crate::on_both_stores;

fn sdk(app: &TestApp, token: &str) -> Svix {
    Svix::new(
        token.to_owned(),
        Some(SvixOptions {
            server_url: Some(app.base.clone()),
            ..SvixOptions::default()
        }),
    )
}

/// A browser without redirects or a cookie jar: each test says what it
/// sends.
fn browser() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
}

/// A portal link's path and query (the URL's origin is Herald's).
fn path_of(url: &str) -> String {
    let parsed = url::Url::parse(url).expect("the link is a URL");
    format!("{}?{}", parsed.path(), parsed.query().unwrap_or(""))
}

/// Opens a link; returns the session cookie (`name=value`).
async fn open_link(app: &TestApp, url: &str) -> String {
    let response = browser()
        .get(app.url(&path_of(url)))
        .send()
        .await
        .expect("GET link");
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let headers = response.headers();
    assert_eq!(headers["location"], "/portal");
    assert_eq!(headers["referrer-policy"], "no-referrer");
    assert_eq!(headers["cache-control"], "no-store");
    let cookie = headers["set-cookie"].to_str().expect("text").to_owned();
    assert!(cookie.contains("HttpOnly"), "{cookie}");
    assert!(cookie.contains("Path=/portal"), "{cookie}");
    cookie.split(';').next().expect("name=value").to_owned()
}

async fn page(app: &TestApp, cookie: &str, path: &str) -> (StatusCode, String) {
    let response = browser()
        .get(app.url(path))
        .header("cookie", cookie)
        .send()
        .await
        .expect("GET page");
    let status = response.status();
    (status, response.text().await.expect("body"))
}

/// A form POST with the session's CSRF token (read from its home page).
async fn post_form(
    app: &TestApp,
    cookie: &str,
    path: &str,
    fields: &[(&str, &str)],
) -> (StatusCode, String) {
    let csrf = csrf_of(app, cookie).await;
    let mut all = vec![("csrf", csrf.as_str())];
    all.extend_from_slice(fields);
    let response = browser()
        .post(app.url(path))
        .header("cookie", cookie)
        .form(&all)
        .send()
        .await
        .expect("POST form");
    let status = response.status();
    (status, response.text().await.expect("body"))
}

async fn csrf_of(app: &TestApp, cookie: &str) -> String {
    let (status, html) = page(app, cookie, "/portal").await;
    assert_eq!(status, StatusCode::OK, "{html}");
    let at = html
        .find("name=\"csrf\" value=\"")
        .expect("the logout form's CSRF field")
        + 19;
    html[at..at + 64].to_owned()
}

async fn access(app: &TestApp, app_id: &str, body: Value) -> (StatusCode, Value) {
    app.post(&format!("/api/v1/auth/app-portal-access/{app_id}"), body)
        .await
}

#[tokio::test]
async fn the_svix_sdk_mints_portal_links_expires_them_and_logs_tokens_out() {
    let app = spawn_app(&[]).await;
    let admin = sdk(&app, TOKEN);
    // Inline creation, as Svix does it, when the uid names no app.
    let mut body = AppPortalAccessIn::new();
    body.application = Some(ApplicationIn {
        uid: Some("acme".into()),
        ..ApplicationIn::new("Acme".into())
    });
    body.session_id = Some("s-1".into());
    let out = admin
        .authentication()
        .app_portal_access("acme".into(), body, None)
        .await
        .expect("app-portal-access through the SDK");
    assert!(
        out.url
            .starts_with(&format!("{}/portal/login?code=", app.base)),
        "{}",
        out.url
    );
    assert!(out.token.starts_with("hrld_app_"));
    let (status, acme) = app.get("/api/v1/app/acme").await;
    assert_eq!(status, StatusCode::OK, "created inline: {acme}");

    // The token is an application token with every capability.
    let tenant = sdk(&app, &out.token);
    tenant
        .endpoint()
        .list("acme".into(), None)
        .await
        .expect("reads its app");
    let (status, _) = app.as_token(&out.token).get("/api/v1/app").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "still an application token");

    // A read-only one may read, not change.
    let mut ro = AppPortalAccessIn::new();
    #[allow(deprecated)]
    {
        ro.read_only = Some(true);
    }
    let read_only = admin
        .authentication()
        .app_portal_access("acme".into(), ro, None)
        .await
        .expect("read-only link");
    let (status, _) = app
        .as_token(&read_only.token)
        .get("/api/v1/app/acme/endpoint")
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, err) = app
        .as_token(&read_only.token)
        .post(
            "/api/v1/app/acme/endpoint",
            json!({"url": "https://example.com/hook"}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{err}");
    assert!(
        err["detail"]
            .as_str()
            .unwrap_or("")
            .contains("ManageEndpoint"),
        "{err}"
    );

    // expire-all by sessionId ends only that one.
    admin
        .authentication()
        .expire_all(
            "acme".into(),
            ApplicationTokenExpireIn {
                expiry: Some(0),
                session_ids: Some(vec!["s-1".into()]),
            },
            None,
        )
        .await
        .expect("expire-all through the SDK");
    let (status, _) = app
        .as_token(&out.token)
        .get("/api/v1/app/acme/endpoint")
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "expired at once");
    let (status, _) = app
        .as_token(&read_only.token)
        .get("/api/v1/app/acme/endpoint")
        .await;
    assert_eq!(status, StatusCode::OK, "another sessionId is untouched");

    // logout ends the calling token.
    sdk(&app, &read_only.token)
        .authentication()
        .logout(None)
        .await
        .expect("logout through the SDK");
    let (status, _) = app
        .as_token(&read_only.token)
        .get("/api/v1/app/acme/endpoint")
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = app.post("/api/v1/auth/logout", json!({})).await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "the admin token is not logged out"
    );

    // The deprecated alias answers the same shape.
    let (status, alias) = app
        .post("/api/v1/auth/dashboard-access/acme", json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{alias}");
    assert!(alias["url"]
        .as_str()
        .unwrap_or("")
        .contains("/portal/login?code="));
    assert!(alias["token"]
        .as_str()
        .unwrap_or("")
        .starts_with("hrld_app_"));
}

#[tokio::test]
async fn access_requests_are_validated_with_named_fields() {
    let app = spawn_app(&[]).await;
    let id = app.create_app().await;
    for (body, field) in [
        (json!({"expiry": 60}), "expiry"),
        (json!({"expiry": 604801}), "expiry"),
        (json!({"expiry": -1}), "expiry"),
        (json!({"capabilities": ["Everything"]}), "capabilities"),
        (json!({"sessionId": "a\u{0}b"}), "sessionId"),
    ] {
        let (status, err) = access(&app, &id, body.clone()).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {err}");
        assert!(
            err.to_string().contains(field),
            "{body} names {field}: {err}"
        );
    }
    let (status, _) = access(&app, "no-such-app", json!({})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, err) = app
        .post(
            &format!("/api/v1/auth/app/{id}/expire-all"),
            json!({"expiry": -5}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{err}");
    assert!(err.to_string().contains("expiry"));
    // An application token cannot mint links.
    let (_, made) = app
        .post(&format!("/api/v1/app/{id}/token"), json!({}))
        .await;
    let token = made["token"].as_str().expect("token");
    let (status, _) = app
        .as_token(token)
        .post(&format!("/api/v1/auth/app-portal-access/{id}"), json!({}))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn a_link_works_once_and_its_session_ends_with_expire_all() {
    let app = spawn_app(&[]).await;
    let id = app.create_app().await;
    let (status, out) = access(&app, &id, json!({})).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    let url = out["url"].as_str().expect("url");
    let cookie = open_link(&app, url).await;
    let (status, html) = page(&app, &cookie, "/portal").await;
    assert_eq!(status, StatusCode::OK);
    assert!(html.contains("Endpoints"), "{html}");

    // Used once: the same link now shows the expired page, not an error.
    let again = browser()
        .get(app.url(&path_of(url)))
        .send()
        .await
        .expect("GET");
    assert_eq!(again.status(), StatusCode::GONE);
    let text = again.text().await.expect("body");
    assert!(text.contains("This link has expired"), "{text}");
    let (status, text) = page(&app, "", "/portal/login?code=nonsense").await;
    assert_eq!(status, StatusCode::GONE);
    assert!(text.contains("This link has expired"));
    // No session: the expired page too (401).
    let (status, text) = page(&app, "herald_portal=forged", "/portal").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(text.contains("This link has expired"));

    // expire-all ends the browser session and the token.
    let (status, _) = app
        .post(&format!("/api/v1/auth/app/{id}/expire-all"), json!({}))
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = page(&app, &cookie, "/portal").await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "the session died with its token"
    );
    let token = out["token"].as_str().expect("token");
    let (status, _) = app
        .as_token(token)
        .get(&format!("/api/v1/app/{id}/endpoint"))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn logout_of_the_token_ends_its_browser_sessions() {
    let app = spawn_app(&[]).await;
    let id = app.create_app().await;
    let (_, out) = access(&app, &id, json!({})).await;
    let cookie = open_link(&app, out["url"].as_str().expect("url")).await;
    assert_eq!(page(&app, &cookie, "/portal").await.0, StatusCode::OK);
    let token = out["token"].as_str().expect("token");
    let (status, _) = app
        .as_token(token)
        .request(reqwest::Method::POST, "/api/v1/auth/logout", None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(
        page(&app, &cookie, "/portal").await.0,
        StatusCode::UNAUTHORIZED
    );
}

/// Every portal route, with `{endpoint_id}` to be filled with another
/// application's endpoint: the router is built from the same list
/// (`herald::portal::route_paths`), so a route added without a row here
/// fails `every_portal_route_is_in_the_table`.
const ROUTES: &[(&str, &str)] = &[
    ("GET", "/"),
    ("GET", "/login"),
    ("POST", "/logout"),
    ("GET", "/event-types"),
    ("GET", "/endpoint/new"),
    ("POST", "/endpoint/new"),
    ("GET", "/endpoint/{endpoint_id}"),
    ("GET", "/endpoint/{endpoint_id}/edit"),
    ("POST", "/endpoint/{endpoint_id}/edit"),
    ("GET", "/endpoint/{endpoint_id}/delete"),
    ("POST", "/endpoint/{endpoint_id}/delete"),
    ("GET", "/endpoint/{endpoint_id}/secret"),
    ("POST", "/endpoint/{endpoint_id}/rotate"),
    ("POST", "/endpoint/{endpoint_id}/enable"),
    ("POST", "/endpoint/{endpoint_id}/disable"),
    ("POST", "/endpoint/{endpoint_id}/send-example"),
    ("POST", "/endpoint/{endpoint_id}/recover"),
    ("GET", "/messages"),
    ("GET", "/msg/{msg_id}"),
    ("POST", "/msg/{msg_id}/endpoint/{endpoint_id}/resend"),
];

#[test]
fn every_portal_route_is_in_the_table() {
    let mut ours: Vec<&str> = ROUTES.iter().map(|(_, p)| *p).collect();
    ours.dedup();
    let mut theirs = herald::portal::route_paths();
    theirs.sort_unstable();
    ours.sort_unstable();
    ours.dedup();
    assert_eq!(
        ours, theirs,
        "the portal's routes and this test's table differ"
    );
}

#[tokio::test]
async fn a_portal_session_sees_nothing_of_another_application() {
    let app = spawn_app(&[]).await;
    let rx = Receiver::start().await;
    let a = app.create_app().await;
    let b = app.create_app().await;
    let a_ep = app
        .create_endpoint(&a, &rx.url("/a"), json!({"description": "alpha-endpoint"}))
        .await;
    let b_ep = app
        .create_endpoint(
            &b,
            &rx.url("/b-secret-path"),
            json!({"description": "bravo-endpoint"}),
        )
        .await;
    let b_ep_id = b_ep["id"].as_str().expect("id");
    let (status, msg) = app
        .post(
            &format!("/api/v1/app/{b}/msg"),
            json!({"eventType": "bravo.event", "eventId": "bravo-evt", "payload": {"k": 1}}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{msg}");
    let (status, a_msg) = app
        .post(
            &format!("/api/v1/app/{a}/msg"),
            json!({"eventType": "alpha.event", "payload": {"k": 2}}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{a_msg}");
    let a_msg_id = a_msg["id"].as_str().expect("msg id");
    let (_, out) = access(&app, &a, json!({})).await;
    let cookie = open_link(&app, out["url"].as_str().expect("url")).await;

    let (_, home) = page(&app, &cookie, "/portal").await;
    assert!(home.contains("alpha-endpoint"), "{home}");
    // B's ids: its endpoint's, and (for the same-shaped routes) its app's
    // and message's, which no portal route takes as anything but an
    // endpoint and must 404 as well.
    let b_ids = [
        b_ep_id.to_owned(),
        b.clone(),
        msg["id"].as_str().expect("msg id").to_owned(),
        "bravo-evt".to_owned(),
    ];
    let csrf = csrf_of(&app, &cookie).await;
    for (method, route) in ROUTES {
        if !route.contains("{endpoint_id}") && !route.contains("{msg_id}") {
            continue;
        }
        for b_id in &b_ids {
            let path = format!(
                "/portal{}",
                route
                    .replace("{endpoint_id}", b_id)
                    .replace("{msg_id}", b_id)
            );
            let request = if *method == "GET" {
                browser().get(app.url(&path))
            } else {
                browser().post(app.url(&path)).form(&[
                    ("csrf", csrf.as_str()),
                    ("url", "https://example.com/x"),
                    ("eventType", "svix.ping"),
                    ("since", "2020-01-01T00:00"),
                ])
            };
            let response = request
                .header("cookie", &cookie)
                .send()
                .await
                .expect("request");
            let status = response.status();
            let body = response.text().await.expect("body");
            assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}: {body}");
            for leak in ["bravo-endpoint", "b-secret-path", "bravo.event"] {
                assert!(!body.contains(leak), "{method} {path} shows {leak}");
            }
        }
    }
    // B's endpoint is untouched.
    let (status, still) = app
        .get(&format!("/api/v1/app/{b}/endpoint/{b_ep_id}"))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(still["url"], b_ep["url"]);
    // And every page of A shows nothing of B.
    let a_ep_id = a_ep["id"].as_str().expect("id");
    for (method, route) in ROUTES {
        if *method != "GET" || route.contains("login") {
            continue;
        }
        let path = format!(
            "/portal{}",
            route
                .replace("{endpoint_id}", a_ep_id)
                .replace("{msg_id}", a_msg_id)
        );
        let (status, body) = page(&app, &cookie, &path).await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
        for leak in ["bravo-endpoint", "b-secret-path", b_ep_id, "bravo"] {
            assert!(!body.contains(leak), "{path} shows {leak}");
        }
    }
    // The message log is A's own: its message is listed; B's, searched for
    // by id, eventId or event type, or by naming B's application, is not.
    let (status, log) = page(&app, &cookie, "/portal/messages").await;
    assert_eq!(status, StatusCode::OK, "{log}");
    assert!(log.contains(a_msg_id), "{log}");
    let b_msg_id = msg["id"].as_str().expect("msg id");
    // (The form echoes what was typed, so the check is for links to
    // messages, not for the text.)
    for (query, finds_a) in [
        (format!("id={b_msg_id}"), false),
        ("id=bravo-evt".to_owned(), false),
        ("event_type=bravo.event".to_owned(), false),
        (format!("app={b}"), true),
    ] {
        let path = format!("/portal/messages?{query}");
        let (status, body) = page(&app, &cookie, &path).await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
        assert!(
            !body.contains(&format!("/msg/{b_msg_id}")),
            "{path} links B's message"
        );
        assert!(!body.contains("{\"k\":1}"), "{path} shows B's payload");
        assert_eq!(
            body.contains(&format!("/portal/msg/{a_msg_id}")),
            finds_a,
            "{path}: {body}"
        );
    }
}

#[tokio::test]
async fn capabilities_hide_forms_and_the_server_refuses_what_they_do_not_allow() {
    let app = spawn_app(&[]).await;
    let rx = Receiver::start().await;
    let id = app.create_app().await;
    let ep = app.create_endpoint(&id, &rx.url("/hook"), json!({})).await;
    let ep_id = ep["id"].as_str().expect("id");
    let here = format!("/portal/endpoint/{ep_id}");
    // (capabilities, form actions that must be absent, POSTs refused)
    let cases: &[(Value, &[&str], &[&str])] = &[
        (
            json!({"readOnly": true}),
            &[
                "/rotate",
                "/send-example",
                "/recover",
                "/edit",
                "/delete",
                "/disable",
                "reveal",
            ],
            &[
                "/rotate",
                "/send-example",
                "/recover",
                "/edit",
                "/delete",
                "/disable",
            ],
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

#[tokio::test]
async fn a_full_session_adds_an_endpoint_sends_a_test_event_and_rotates_the_secret() {
    let app = spawn_app(&[]).await;
    let rx = Receiver::start().await;
    let id = app.create_app().await;
    let (_, out) = access(&app, &id, json!({})).await;
    let cookie = open_link(&app, out["url"].as_str().expect("url")).await;
    // A bad form is shown again with the API's error naming the field.
    let (status, html) = post_form(
        &app,
        &cookie,
        "/portal/endpoint/new",
        &[("url", "not a url"), ("throttleRate", "fast")],
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{html}");
    assert!(html.contains("class=\"error\""), "{html}");
    let (status, html) = post_form(
        &app,
        &cookie,
        "/portal/endpoint/new",
        &[
            ("url", &rx.url("/portal-hook")),
            ("description", "from the portal"),
            ("throttleRate", "7"),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{html}");
    let (_, list) = app.get(&format!("/api/v1/app/{id}/endpoint")).await;
    let ep = &list["data"][0];
    assert_eq!(ep["description"], "from the portal");
    assert_eq!(ep["rateLimit"], 7);
    let ep_id = ep["id"].as_str().expect("id");
    let here = format!("/portal/endpoint/{ep_id}");

    let (status, _) = post_form(
        &app,
        &cookie,
        &format!("{here}/send-example"),
        &[("eventType", "svix.ping")],
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let got = rx.wait_for(1).await;
    assert!(got[0].headers.contains_key("webhook-signature"), "signed");
    // The attempt appears on the endpoint's page (bounded wait).
    let mut shown = false;
    for _ in 0..100 {
        let (_, html) = page(&app, &cookie, &here).await;
        if html.contains("succeeded") {
            shown = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(shown, "the attempt shows on the endpoint page");

    let (_, before) = app
        .get(&format!("/api/v1/app/{id}/endpoint/{ep_id}/secret"))
        .await;
    let (status, secret) = page(&app, &cookie, &format!("{here}/secret")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(secret, before["key"].as_str().expect("key"));
    let (status, _) = post_form(&app, &cookie, &format!("{here}/rotate"), &[]).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let (_, after) = app
        .get(&format!("/api/v1/app/{id}/endpoint/{ep_id}/secret"))
        .await;
    assert_ne!(before["key"], after["key"], "rotated");

    // The audit log names the portal session, never its cookie.
    let (_, audit) = app.get("/api/v1/audit-log").await;
    let entries = audit["data"].as_array().expect("entries");
    let rotated = entries
        .iter()
        .find(|e| e["action"] == "endpoint.secret_rotated")
        .expect("the rotation is audited");
    assert_eq!(rotated["actorKind"], "portal", "{rotated}");
    let value = cookie.split('=').nth(1).expect("value");
    assert!(
        !audit.to_string().contains(value),
        "no cookie in the audit log"
    );

    // A form without its CSRF token, or from another origin, is refused.
    let response = browser()
        .post(app.url(&format!("{here}/rotate")))
        .header("cookie", &cookie)
        .form(&[("csrf", "wrong")])
        .send()
        .await
        .expect("POST");
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    let csrf = csrf_of(&app, &cookie).await;
    let response = browser()
        .post(app.url(&format!("{here}/rotate")))
        .header("cookie", &cookie)
        .header("origin", "https://evil.example")
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .expect("POST");
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn embedding_sets_frame_ancestors_and_a_cross_site_cookie() {
    let app = spawn_app(&[("HERALD_PORTAL_FRAME_ANCESTORS", "https://app.example.com")]).await;
    let id = app.create_app().await;
    let (_, out) = access(&app, &id, json!({})).await;
    let url = out["url"].as_str().expect("url");
    let response = browser()
        .get(app.url(&format!(
            "{}&primaryColor=%23ff6600&darkMode=true&productName=Acme+Hooks",
            path_of(url)
        )))
        .send()
        .await
        .expect("GET");
    let cookie = response.headers()["set-cookie"]
        .to_str()
        .expect("text")
        .to_owned();
    assert!(
        cookie.contains("SameSite=None; Secure; Partitioned"),
        "{cookie}"
    );
    let cookie = cookie.split(';').next().expect("pair").to_owned();
    let response = browser()
        .get(app.url("/portal"))
        .header("cookie", &cookie)
        .send()
        .await
        .expect("GET");
    let csp = response.headers()["content-security-policy"]
        .to_str()
        .expect("text")
        .to_owned();
    assert!(
        csp.contains("frame-ancestors https://app.example.com"),
        "{csp}"
    );
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert!(response.headers().get("x-frame-options").is_none());
    let html = response.text().await.expect("body");
    assert!(html.contains("Acme Hooks"), "the link's product name");
    assert!(html.contains("#ff6600"), "the link's colour");
    assert!(html.contains("#0d1117"), "dark mode");

    // Without embedding: 'self' and a Lax cookie; a bad link colour is
    // ignored for the configured one.
    let plain = spawn_app(&[("HERALD_PORTAL_PRIMARY_COLOR", "#123456")]).await;
    let id = plain.create_app().await;
    let (_, out) = access(&plain, &id, json!({})).await;
    let url = out["url"].as_str().expect("url");
    let response = browser()
        .get(plain.url(&format!("{}&primaryColor=red;}}body{{x", path_of(url))))
        .send()
        .await
        .expect("GET");
    let cookie = response.headers()["set-cookie"]
        .to_str()
        .expect("text")
        .to_owned();
    assert!(cookie.contains("SameSite=Lax"), "{cookie}");
    let cookie = cookie.split(';').next().expect("pair").to_owned();
    let response = browser()
        .get(plain.url("/portal"))
        .header("cookie", &cookie)
        .send()
        .await
        .expect("GET");
    let csp = response.headers()["content-security-policy"]
        .to_str()
        .expect("text")
        .to_owned();
    assert!(csp.contains("frame-ancestors 'self'"), "{csp}");
    let html = response.text().await.expect("body");
    assert!(
        html.contains("#123456") && !html.contains("red;"),
        "the configured colour"
    );
}

/// A session made through one API process is accepted by another on the
/// same PostgreSQL database (sessions live in the store).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_made_by_one_process_works_in_another_on_postgres() {
    let name = "portal::a_session_made_by_one_process_works_in_another_on_postgres";
    let Some(pg) = PgSchema::new(name) else {
        return;
    };
    let backend = Backend::Postgres(pg);
    let one = backend.spawn_stepped(&[]).await;
    let two = backend.spawn_stepped(&[]).await;
    let id = one.create_app().await;
    let (_, out) = access(&one, &id, json!({})).await;
    let cookie = open_link(&one, out["url"].as_str().expect("url")).await;
    let (status, html) = page(&two, &cookie, "/portal").await;
    assert_eq!(status, StatusCode::OK, "{html}");
    // Ended through the first, refused by the second at once.
    let (status, _) = one
        .post(&format!("/api/v1/auth/app/{id}/expire-all"), json!({}))
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(
        page(&two, &cookie, "/portal").await.0,
        StatusCode::UNAUTHORIZED
    );
    // The dashboard's sessions too.
    let response = browser()
        .post(one.url("/dashboard/login"))
        .form(&[("token", TOKEN)])
        .send()
        .await
        .expect("log in");
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let dash = response.headers()["set-cookie"]
        .to_str()
        .expect("text")
        .split(';')
        .next()
        .expect("pair")
        .to_owned();
    let (status, html) = page(&two, &dash, "/dashboard").await;
    assert_eq!(status, StatusCode::OK, "{html}");
    if let Backend::Postgres(pg) = backend {
        drop(one);
        drop(two);
        pg.drop_schema().await;
    }
}

/// Portal and dashboard sessions are in the store: they survive a restart
/// of the real binary (SQLite).
#[tokio::test]
async fn sessions_survive_a_restart_of_the_binary() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("sessions.db");
    let envs = [("HERALD_ADMIN_TOKEN", TOKEN)];
    let mut first = crate::helpers::binary::serve(&db, &envs).await;
    let base = format!("http://{}", first.addr);
    let client = browser();
    let created: Value = client
        .post(format!("{base}/api/v1/app"))
        .bearer_auth(TOKEN)
        .json(&json!({"name": "Acme"}))
        .send()
        .await
        .expect("create app")
        .json()
        .await
        .expect("json");
    let id = created["id"].as_str().expect("id");
    let out: Value = client
        .post(format!("{base}/api/v1/auth/app-portal-access/{id}"))
        .bearer_auth(TOKEN)
        .json(&json!({}))
        .send()
        .await
        .expect("mint")
        .json()
        .await
        .expect("json");
    let link = out["url"].as_str().expect("url");
    assert!(
        link.starts_with(&base),
        "HERALD_PUBLIC_URL defaults to the listen address: {link}"
    );
    let response = client.get(link).send().await.expect("open link");
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let portal = response.headers()["set-cookie"]
        .to_str()
        .expect("text")
        .split(';')
        .next()
        .expect("pair")
        .to_owned();
    let response = client
        .post(format!("{base}/dashboard/login"))
        .form(&[("token", TOKEN)])
        .send()
        .await
        .expect("log in");
    let dash = response.headers()["set-cookie"]
        .to_str()
        .expect("text")
        .split(';')
        .next()
        .expect("pair")
        .to_owned();

    first.child.kill().await.expect("stop");
    let second = crate::helpers::binary::serve(&db, &envs).await;
    let base = format!("http://{}", second.addr);
    for (cookie, path) in [(&portal, "/portal"), (&dash, "/dashboard")] {
        let response = client
            .get(format!("{base}{path}"))
            .header("cookie", cookie)
            .send()
            .await
            .expect("GET after restart");
        assert_eq!(response.status(), StatusCode::OK, "{path} after a restart");
    }
}

/// Capabilities in the API: each call needs its capability, and a portal
/// token never creates messages; the per-caller rate limit applies to
/// portal sessions.
#[tokio::test]
async fn portal_tokens_need_their_capability_for_each_api_call() {
    let app = spawn_app(&[]).await;
    let rx = Receiver::start().await;
    let id = app.create_app().await;
    let ep = app.create_endpoint(&id, &rx.url("/hook"), json!({})).await;
    let ep_id = ep["id"].as_str().expect("id");
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
        app.as_token(&base)
            .post(&example_path, json!({"eventType": "svix.ping"}))
            .await
            .0,
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
        app.as_token(&attempts)
            .post(&example_path, json!({"eventType": "svix.ping"}))
            .await
            .0,
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

/// Failed link exchanges are limited per address, by a limit apart from
/// the dashboard's; a right link (and the admin token) always gets in.
#[tokio::test]
async fn failed_link_exchanges_are_limited_per_address_apart_from_the_dashboard() {
    let app = spawn_app(&[("HERALD_LOGIN_FAILURE_LIMIT", "2")]).await;
    let id = app.create_app().await;
    let (_, out) = access(&app, &id, json!({})).await;
    for _ in 0..2 {
        assert_eq!(
            page(&app, "", "/portal/login?code=guess").await.0,
            StatusCode::GONE
        );
    }
    let (status, text) = page(&app, "", "/portal/login?code=guess").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{text}");
    // A right code opens even now.
    assert!(
        !open_link(&app, out["url"].as_str().expect("url"))
            .await
            .is_empty(),
        "the link opened a session"
    );
    // The portal's failures do not touch the dashboard's log-in limit: a
    // wrong admin token is still a plain 401 there.
    let browser = cookie_client();
    let resp = browser
        .post(app.url("/dashboard/login"))
        .form(&[("token", "guess")])
        .send()
        .await
        .expect("herald answers");
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
}

/// The message log's resend: shown and done with `CreateAttempts`, absent
/// and refused (403) without it; the receiver gets the one more attempt.
#[tokio::test]
async fn the_message_page_resends_only_with_create_attempts() {
    let app = spawn_app(&[]).await;
    let rx = Receiver::start().await;
    let id = app.create_app().await;
    let ep = app.create_endpoint(&id, &rx.url("/hook"), json!({})).await;
    let ep_id = ep["id"].as_str().expect("id");
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
    let csrf = csrf_of(&app, &viewer).await;
    let refused = browser()
        .post(app.url(&resend))
        .header("cookie", &viewer)
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .expect("post");
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);

    let (_, out) = access(
        &app,
        &id,
        json!({"capabilities": ["ViewBase", "CreateAttempts"]}),
    )
    .await;
    let operator = open_link(&app, out["url"].as_str().expect("url")).await;
    let (_, body) = page(&app, &operator, &format!("/portal/msg/{msg}")).await;
    assert!(body.contains(&resend), "the resend form: {body}");
    let csrf = csrf_of(&app, &operator).await;
    let done = browser()
        .post(app.url(&resend))
        .header("cookie", &operator)
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .expect("post");
    assert_eq!(done.status(), StatusCode::SEE_OTHER);
    let got = rx.wait_for(2).await;
    assert_eq!(got.len(), 2, "one more attempt reached the receiver");
    assert_eq!(got[1].header("x-attempt"), "2");
}

/// Every inline style of `html`, each allowed by the page's CSP (by its
/// hash): a style the CSP leaves out would not apply in a browser.
fn styles_allowed_by(csp: &str, html: &str) -> Vec<String> {
    use base64::Engine as _;
    use sha2::Digest as _;
    let mut styles = Vec::new();
    let mut rest = html;
    while let Some(at) = rest.find("<style>") {
        let inner = &rest[at + 7..];
        let end = inner.find("</style>").expect("a closed style");
        let style = &inner[..end];
        let hash = base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(style));
        assert!(
            csp.contains(&format!("'sha256-{hash}'")),
            "a style the CSP does not allow: {style}\nCSP: {csp}"
        );
        styles.push(style.to_owned());
        rest = &inner[end..];
    }
    styles
}

/// Error pages (a 404, the expired link) wear the session's theme, or the
/// configured one without a session, with a CSP that lets it apply.
#[tokio::test]
async fn error_pages_wear_the_session_theme_or_the_configured_one() {
    let app = spawn_app(&[("HERALD_PORTAL_PRIMARY_COLOR", "#123456")]).await;
    let id = app.create_app().await;

    // No session: the expired-link page, in the configured colour.
    let response = browser()
        .get(app.url("/portal/event-types"))
        .send()
        .await
        .expect("GET");
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let csp = response.headers()["content-security-policy"]
        .to_str()
        .expect("text")
        .to_owned();
    let html = response.text().await.expect("body");
    assert!(html.contains("This link has expired"), "{html}");
    let styles = styles_allowed_by(&csp, &html);
    assert!(
        styles.iter().any(|s| s.contains("--accent:#123456")),
        "{styles:?}"
    );

    // A session whose link set a colour, a product name and dark mode:
    // a 404 and a 403 in that theme.
    let (_, out) = access(&app, &id, json!({"readOnly": true})).await;
    let url = out["url"].as_str().expect("url");
    let cookie = open_link(
        &app,
        &format!("{url}&primaryColor=%23ff6600&darkMode=true&productName=Acme+Hooks"),
    )
    .await;
    for (method, path, status) in [
        (
            Method::GET,
            "/portal/endpoint/ep_2ZZZZZZZZZZZZZZZZZZZZZZZZZ",
            StatusCode::NOT_FOUND,
        ),
        (Method::GET, "/portal/no-such-page", StatusCode::NOT_FOUND),
        (Method::GET, "/portal/endpoint/new", StatusCode::FORBIDDEN),
    ] {
        let response = browser()
            .request(method, app.url(path))
            .header("cookie", &cookie)
            .send()
            .await
            .expect("GET");
        assert_eq!(response.status(), status, "{path}");
        let csp = response.headers()["content-security-policy"]
            .to_str()
            .expect("text")
            .to_owned();
        let html = response.text().await.expect("body");
        assert!(html.contains("Acme Hooks"), "{path}: {html}");
        let styles = styles_allowed_by(&csp, &html);
        assert!(
            styles
                .iter()
                .any(|s| s.contains("--accent:#ff6600") && s.contains("#0d1117")),
            "{path}: {styles:?}"
        );
        assert!(
            !html.contains("#123456"),
            "{path}: the session's theme, not the configured one"
        );
    }
}

/// The endpoint lists (the portal's home, the dashboard's overview and
/// application page) show each endpoint's open circuit breaker and its
/// throttle, read for the whole page at once; so does the portal's
/// endpoint page.
#[tokio::test]
async fn endpoint_lists_show_an_open_circuit_and_a_throttle() {
    let app = crate::helpers::spawn_stepped(&[
        ("HERALD_BREAKER_MIN_ATTEMPTS", "4"),
        ("HERALD_BREAKER_WINDOW", "1m"),
        ("HERALD_BREAKER_FAILURE_RATE", "50%"),
        ("HERALD_BREAKER_COOLDOWN", "1h"),
    ])
    .await;
    let rx = Receiver::start().await;
    rx.always(Reply::status(500));
    let app_id = app.create_app().await;
    let failing = app
        .create_endpoint(&app_id, &rx.url("/failing"), json!({}))
        .await;
    for n in 0..4 {
        app.send_message(&app_id, "t.x", json!({ "n": n })).await;
    }
    let r = app.step().await;
    assert_eq!((r.claimed, r.retried), (4, 4), "four failures open it");
    // Created after the messages, so nothing is sent to it.
    let throttled = app
        .create_endpoint(&app_id, &rx.url("/throttled"), json!({ "throttleRate": 4 }))
        .await;
    let healthy = app
        .create_endpoint(&app_id, &rx.url("/quiet"), json!({}))
        .await;

    let (_, link) = access(&app, &app_id, json!({})).await;
    let cookie = open_link(&app, link["url"].as_str().expect("url")).await;
    let (status, home) = page(&app, &cookie, "/portal").await;
    assert_eq!(status, StatusCode::OK, "{home}");

    let operator = logged_in(&app).await;
    // The portal's endpoint page says it too (the dashboard's has rows of
    // its own for the breaker and the throttle).
    for (ep, text) in [(&failing, "circuit open"), (&throttled, "throttled at 4/s")] {
        let id = ep["id"].as_str().expect("id");
        let (status, html) = page(&app, &cookie, &format!("/portal/endpoint/{id}")).await;
        assert_eq!(status, StatusCode::OK, "{html}");
        assert!(html.contains(text), "{id}: {text}");
    }
    let mut pages = vec![("portal home", home)];
    for path in [
        format!("/dashboard?app={app_id}"),
        format!("/dashboard/app/{app_id}"),
    ] {
        let resp = operator.get(app.url(&path)).send().await.expect("GET");
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
        pages.push(("dashboard list", resp.text().await.expect("page")));
    }
    for (which, html) in &pages {
        let row = |ep: &Value| {
            let id = ep["id"].as_str().expect("id");
            let at = html
                .find(id)
                .unwrap_or_else(|| panic!("{which} lists {id}"));
            let end = html[at..].find("</tr>").map_or(html.len(), |e| at + e);
            html[at..end].to_owned()
        };
        assert!(
            row(&failing).contains("circuit open"),
            "{which}: {}",
            row(&failing)
        );
        assert!(
            row(&throttled).contains("throttled at 4/s"),
            "{which}: {}",
            row(&throttled)
        );
        assert!(!row(&throttled).contains("circuit open"), "{which}");
        let quiet = row(&healthy);
        assert!(
            !quiet.contains("circuit") && !quiet.contains("throttled"),
            "{which}: {quiet}"
        );
    }
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

on_both_stores!(flagged_event_types_are_seen_only_with_their_flags);

/// As Svix: an event type with feature flags is hidden (list and get, API
/// and portal pages) from application tokens and portal sessions unless
/// their link carried its flags (all of them); the admin sees every type.
async fn flagged_event_types_are_seen_only_with_their_flags(backend: &Backend) {
    let app = backend.spawn_stepped(&[]).await;
    for (name, flags) in [
        ("plain.evt", json!(null)),
        ("beta.evt", json!(["beta"])),
        ("both.evt", json!(["beta", "gamma"])),
    ] {
        let (s, out) = app
            .post(
                "/api/v1/event-type",
                json!({"name": name, "featureFlags": flags}),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{out}");
    }
    let app_id = app.create_app().await;
    let (s, plain) = app
        .post(&format!("/api/v1/app/{app_id}/token"), json!({}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{plain}");
    let plain = plain["token"].as_str().expect("token").to_owned();
    let mut links = Vec::new();
    for flags in [
        json!(null),
        json!(["beta"]),
        json!(["gamma", "beta", "other"]),
    ] {
        let (s, out) = access(&app, &app_id, json!({"featureFlags": flags})).await;
        assert_eq!(s, StatusCode::OK, "{out}");
        links.push(out);
    }

    let all = ["beta.evt", "both.evt", "plain.evt"];
    let cases: Vec<(&str, &str, Vec<&str>)> = vec![
        ("admin", TOKEN, all.to_vec()),
        ("app token", &plain, vec!["plain.evt"]),
        (
            "portal, no flags",
            links[0]["token"].as_str().expect("token"),
            vec!["plain.evt"],
        ),
        (
            "portal, beta",
            links[1]["token"].as_str().expect("token"),
            vec!["beta.evt", "plain.evt"],
        ),
        (
            "portal, beta+gamma",
            links[2]["token"].as_str().expect("token"),
            all.to_vec(),
        ),
    ];
    for (who, token, seen) in &cases {
        // Pages of one walk past the hidden types to the end.
        let mut names = Vec::new();
        let mut path = "/api/v1/event-type?limit=1".to_owned();
        for _ in 0..10 {
            let (s, page) = app.as_token(token).get(&path).await;
            assert_eq!(s, StatusCode::OK, "{who}: {page}");
            for e in page["data"].as_array().expect("data") {
                names.push(e["name"].as_str().expect("name").to_owned());
            }
            if page["done"] == json!(true) {
                break;
            }
            let it = page["iterator"].as_str().expect("iterator");
            path = format!("/api/v1/event-type?limit=1&iterator={it}");
        }
        assert_eq!(names, *seen, "{who}");
        for name in all {
            let (s, out) = app
                .as_token(token)
                .get(&format!("/api/v1/event-type/{name}"))
                .await;
            let expected = if seen.contains(&name) {
                StatusCode::OK
            } else {
                StatusCode::NOT_FOUND
            };
            assert_eq!(s, expected, "{who} GET {name}: {out}");
        }
    }

    // The portal's own pages follow the link's flags.
    for (link, seen) in links.iter().zip([
        vec!["plain.evt"],
        vec!["beta.evt", "plain.evt"],
        all.to_vec(),
    ]) {
        let cookie = open_link(&app, link["url"].as_str().expect("url")).await;
        for path in ["/portal/event-types", "/portal/endpoint/new"] {
            let (s, html) = page(&app, &cookie, path).await;
            assert_eq!(s, StatusCode::OK, "{path}");
            for name in all {
                assert_eq!(
                    html.contains(name),
                    seen.contains(&name),
                    "{path} {name}: {seen:?}"
                );
            }
        }
    }
    app.shutdown().await;
}

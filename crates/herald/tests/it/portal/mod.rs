//! The customer portal (issue #12): Svix-compatible access links and
//! tokens, the one-time code exchange, sessions in the store, capability
//! checks, and every portal route scoped to the session's application.

use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::*;

mod capabilities;
mod links;
mod pages;
mod scope;

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
    let cookie = header_text(headers, "set-cookie");
    assert!(cookie.contains("HttpOnly"), "{cookie}");
    assert!(cookie.contains("Path=/portal"), "{cookie}");
    cookie_pair(headers)
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
    let csrf = session_csrf(app, cookie).await;
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

/// The session's CSRF token, from its home page's logout form.
async fn session_csrf(app: &TestApp, cookie: &str) -> String {
    let (status, html) = page(app, cookie, "/portal").await;
    assert_eq!(status, StatusCode::OK, "{html}");
    csrf_of(&html)
}

async fn access(app: &TestApp, app_id: &str, body: Value) -> (StatusCode, Value) {
    app.post(&format!("/api/v1/auth/app-portal-access/{app_id}"), body)
        .await
}

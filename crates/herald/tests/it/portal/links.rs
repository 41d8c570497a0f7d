//! Access links and their tokens through Svix's SDK and API, the one-time
//! code exchange and its limit, and sessions kept in the store.

use reqwest::StatusCode;
use serde_json::{json, Value};
use svix::models::{AppPortalAccessIn, ApplicationIn, ApplicationTokenExpireIn};

use super::*;

crate::on_both_stores!(postgres: a_session_made_by_one_process_works_in_another);

#[tokio::test]
async fn the_svix_sdk_mints_portal_links_expires_them_and_logs_tokens_out() {
    let app = spawn_app(&[]).await;
    let admin = app.sdk();
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
    let tenant = app.sdk_as(&out.token);
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
    app.sdk_as(&read_only.token)
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
    let resp = login_with(&browser, &app, "guess").await;
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
}

/// A session made through one API process is accepted by another on the
/// same PostgreSQL database (sessions live in the store).
async fn a_session_made_by_one_process_works_in_another(pg: PgSchema) {
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
    let response = login_with(&browser(), &one, TOKEN).await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let dash = cookie_pair(response.headers());
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
        .json_answer()
        .await;
    let id = created["id"].as_str().expect("id");
    let out: Value = client
        .post(format!("{base}/api/v1/auth/app-portal-access/{id}"))
        .bearer_auth(TOKEN)
        .json(&json!({}))
        .json_answer()
        .await;
    let link = out["url"].as_str().expect("url");
    assert!(
        link.starts_with(&base),
        "HERALD_PUBLIC_URL defaults to the listen address: {link}"
    );
    let response = client.get(link).send().await.expect("open link");
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let portal = cookie_pair(response.headers());
    let response = client
        .post(format!("{base}/dashboard/login"))
        .form(&[("token", TOKEN)])
        .send()
        .await
        .expect("log in");
    let dash = cookie_pair(response.headers());

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

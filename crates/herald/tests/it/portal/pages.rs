//! The pages themselves: a full session, embedding, themes and CSP, and
//! what the endpoint lists show.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use super::*;

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
    // In the form's words, not the JSON parser's ("expected u16").
    assert!(
        html.contains("a whole number of messages a second") && !html.contains("u16"),
        "{html}"
    );
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
    let csrf = session_csrf(&app, &cookie).await;
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

/// The edit form shows some of an endpoint's fields: saving it changes
/// those and leaves the rest (uid, metadata, ordering) as they were; its
/// headers are saved too, and a refused header saves nothing.
#[tokio::test]
async fn editing_an_endpoint_keeps_what_the_form_does_not_show() {
    let app = spawn_app(&[]).await;
    let id = app.create_app().await;
    let (status, ep) = app
        .post(
            &format!("/api/v1/app/{id}/endpoint"),
            json!({
                "url": "https://example.com/hook",
                "uid": "billing",
                "metadata": {"team": "payments"},
                "ordering": "fifo",
                "channels": ["eu"],
                "headers": {"X-Tenant": "t1"},
            }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{ep}");
    let ep_id = ep["id"].as_str().expect("id");
    let (_, out) = access(&app, &id, json!({})).await;
    let cookie = open_link(&app, out["url"].as_str().expect("url")).await;
    let edit = format!("/portal/endpoint/{ep_id}/edit");

    let (status, html) = post_form(
        &app,
        &cookie,
        &edit,
        &[
            ("url", "https://example.com/hook"),
            ("description", "now described"),
            ("channels", ""),
            ("headers", "X-Tenant: t2\nX-Region: eu"),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{html}");
    let (status, after) = app.get(&format!("/api/v1/app/{id}/endpoint/billing")).await;
    assert_eq!(status, StatusCode::OK, "still found by its uid: {after}");
    assert_eq!(after["description"], "now described");
    assert_eq!(after["uid"], "billing");
    assert_eq!(after["metadata"], json!({"team": "payments"}));
    assert_eq!(after["ordering"], "fifo");
    assert_eq!(
        after["channels"],
        Value::Null,
        "emptied in the form: cleared"
    );
    let (_, headers) = app
        .get(&format!("/api/v1/app/{id}/endpoint/{ep_id}/headers"))
        .await;
    assert_eq!(
        headers["headers"],
        json!({"X-Tenant": "t2", "X-Region": "eu"}),
        "{headers}"
    );

    // A header Herald sets itself is refused, and nothing else is saved.
    let (status, html) = save_edit(&app, &cookie, &edit, "not saved", "webhook-id: forged").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{html}");
    assert!(html.contains("class=\"error\""), "{html}");
    let (_, unchanged) = app.get(&format!("/api/v1/app/{id}/endpoint/{ep_id}")).await;
    assert_eq!(unchanged["description"], "now described");

    // A credential header is never shown, and an unchanged save keeps it;
    // event types the form does not offer (hidden by a feature flag the
    // link lacks, archived) stay in the filter, which does not become
    // "every type".
    for (name, flags) in [
        ("flagged.evt", json!(["beta"])),
        ("old.evt", json!(null)),
        ("gone.evt", json!(null)),
    ] {
        app.create_event_type(json!({"name": name, "featureFlags": flags}))
            .await;
    }
    let (s, _) = app.delete("/api/v1/event-type/old.evt").await;
    assert_eq!(s, StatusCode::NO_CONTENT, "archived");
    let (s, out) = app
        .patch(
            &format!("/api/v1/app/{id}/endpoint/{ep_id}"),
            json!({"filterTypes": ["flagged.evt", "old.evt", "gone.evt"]}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{out}");
    // Deleted for good since: not kept (the API would refuse the save).
    let (s, _) = app.delete("/api/v1/event-type/gone.evt?expunge=true").await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, out) = app
        .put(
            &format!("/api/v1/app/{id}/endpoint/{ep_id}/headers"),
            json!({"headers": {"Authorization": "Bearer SUPERSECRET", "X-Tenant": "t2"}}),
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{out}");
    let (status, form) = page(&app, &cookie, &edit).await;
    assert_eq!(status, StatusCode::OK);
    assert!(!form.contains("SUPERSECRET"), "{form}");
    assert!(form.contains("Authorization: ••••••"), "{form}");
    // Nothing ticked is not "all" with types kept that the form does not
    // list: the form says so (it said "none ticked: all").
    assert!(
        form.contains("also gets 2 types not listed here, which stay; none ticked: those alone"),
        "{form}"
    );
    let (status, html) = save_edit(
        &app,
        &cookie,
        &edit,
        "now described",
        "Authorization: ••••••\nX-Tenant: t3",
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{html}");
    let after = app
        .get(&format!("/api/v1/app/{id}/endpoint/{ep_id}"))
        .await
        .1;
    assert_eq!(
        after["filterTypes"],
        json!(["flagged.evt", "old.evt"]),
        "{after}"
    );
    // The headers as stored, values in the clear.
    let stored_headers = || async {
        app.running()
            .store
            .get_endpoint(&herald::ids::AppId::parse(&id).expect("id"), ep_id)
            .await
            .expect("read")
            .expect("endpoint")
            .headers
    };
    let stored = stored_headers().await;
    assert_eq!(
        stored.get("Authorization").map(String::as_str),
        Some("Bearer SUPERSECRET")
    );
    assert_eq!(stored.get("X-Tenant").map(String::as_str), Some("t3"));

    // The placeholder keeps the stored value under a name in another case
    // (one name, as the API has it), and one with no stored value to keep
    // is refused naming it, the endpoint unchanged: it was saved as the
    // header's value, sent to the receiver and the credential lost.
    let unchanged = stored_headers().await;
    let (status, html) = save_edit(
        &app,
        &cookie,
        &edit,
        "now described",
        "authorization: ••••••\nX-New-Token: ••••••",
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{html}");
    assert!(html.contains("no `X-New-Token` header to keep"), "{html}");
    assert_eq!(stored_headers().await, unchanged);
    let (status, html) = save_edit(
        &app,
        &cookie,
        &edit,
        "now described",
        "authorization: ••••••\nX-Tenant: t3",
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{html}");
    let stored = stored_headers().await;
    assert_eq!(
        stored.get("authorization").map(String::as_str),
        Some("Bearer SUPERSECRET"),
        "{stored:?}"
    );
    let fields = [
        ("url", "https://example.com/other"),
        ("headers", "Authorization: ••••••"),
    ];
    let (status, html) = post_form(&app, &cookie, "/portal/endpoint/new", &fields).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{html}");
    assert!(html.contains("no `Authorization` header to keep"), "{html}");
}

#[tokio::test]
async fn embedding_sets_frame_ancestors_and_a_cross_site_cookie() {
    let app = spawn_app(&[("HERALD_PORTAL_FRAME_ANCESTORS", "https://app.example.com")]).await;
    let id = app.create_app().await;
    let (_, out) = access(&app, &id, json!({})).await;
    let url = out["url"].as_str().expect("url");
    let (cookie, response) = open_home(
        &app,
        url,
        "&primaryColor=%23ff6600&darkMode=true&productName=Acme+Hooks",
    )
    .await;
    assert!(
        cookie.contains("SameSite=None; Secure; Partitioned"),
        "{cookie}"
    );
    let csp = header_text(response.headers(), "content-security-policy");
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
    let (cookie, response) = open_home(&plain, url, "&primaryColor=red;}body{x").await;
    assert!(cookie.contains("SameSite=Lax"), "{cookie}");
    let csp = header_text(response.headers(), "content-security-policy");
    assert!(csp.contains("frame-ancestors 'self'"), "{csp}");
    let html = response.text().await.expect("body");
    assert!(
        html.contains("#123456") && !html.contains("red;"),
        "the configured colour"
    );
}

/// The edit form at `edit` posted with the endpoint's URL as it was
/// created (`https://example.com/hook`), `description` and `headers`.
async fn save_edit(
    app: &TestApp,
    cookie: &str,
    edit: &str,
    description: &str,
    headers: &str,
) -> (StatusCode, String) {
    let fields = [
        ("url", "https://example.com/hook"),
        ("description", description),
        ("headers", headers),
    ];
    post_form(app, cookie, edit, &fields).await
}

/// Opens the link `url` with `extra` added to its query, then the
/// portal's home with the session it set: the link's `Set-Cookie`, and
/// the home page's answer.
async fn open_home(app: &TestApp, url: &str, extra: &str) -> (String, reqwest::Response) {
    let response = browser()
        .get(app.url(&format!("{}{extra}", path_of(url))))
        .send()
        .await
        .expect("GET");
    let set_cookie = header_text(response.headers(), "set-cookie");
    let cookie = cookie_pair(response.headers());
    let response = browser()
        .get(app.url("/portal"))
        .header("cookie", &cookie)
        .send()
        .await
        .expect("GET");
    (set_cookie, response)
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
    let csp = header_text(response.headers(), "content-security-policy");
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
        let csp = header_text(response.headers(), "content-security-policy");
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

/// The home page lists every endpoint a page at a time, with the real
/// count; an endpoint's page offers as test events only `svix.ping` and
/// the types with an example to send.
#[tokio::test]
async fn home_pages_through_every_endpoint_and_test_events_have_examples() {
    let app = spawn_app(&[]).await;
    let id = app.create_app().await;
    let mut ids = Vec::new();
    for i in 0..101 {
        let ep = app
            .create_endpoint(&id, &format!("https://example.com/e{i}"), json!({}))
            .await;
        ids.push(ep["id"].as_str().expect("id").to_owned());
    }
    let (_, out) = access(&app, &id, json!({})).await;
    let cookie = open_link(&app, out["url"].as_str().expect("url")).await;
    let linked = |html: &str| -> Vec<String> {
        ids.iter()
            .filter(|ep| html.contains(&format!("/portal/endpoint/{ep}\"")))
            .cloned()
            .collect()
    };
    let (status, first) = page(&app, &cookie, "/portal").await;
    assert_eq!(status, StatusCode::OK);
    assert!(first.contains("101 of this application"), "{first}");
    assert!(first.contains("/portal?offset=100"), "a next page: {first}");
    let (status, second) = page(&app, &cookie, "/portal?offset=100").await;
    assert_eq!(status, StatusCode::OK);
    assert!(second.contains("/portal?offset=0"), "a previous page");
    let (a, b) = (linked(&first), linked(&second));
    assert_eq!((a.len(), b.len()), (100, 1));
    assert!(!a.contains(&b[0]), "no endpoint on both pages");
    // Past the end (an old or hand-made link): it says so and leads to the
    // first page, where it said "No endpoints yet." beside "101 of this
    // application" and led to another empty page.
    let (status, past) = page(&app, &cookie, "/portal?offset=5000").await;
    assert_eq!(status, StatusCode::OK);
    assert!(past.contains("No endpoints this far"), "{past}");
    assert!(
        past.contains("href=\"/portal?offset=0\" rel=\"prev\">← First page"),
        "{past}"
    );

    for (name, schemas) in [
        ("with.example", json!({"1": {"examples": [{"a": 1}]}})),
        ("without.example", json!(null)),
    ] {
        app.create_event_type(json!({"name": name, "schemas": schemas}))
            .await;
    }
    let (_, ep_page) = page(&app, &cookie, &format!("/portal/endpoint/{}", ids[0])).await;
    assert!(ep_page.contains("option value=\"svix.ping\""), "{ep_page}");
    assert!(
        ep_page.contains("option value=\"with.example\""),
        "{ep_page}"
    );
    assert!(
        !ep_page.contains("option value=\"without.example\""),
        "{ep_page}"
    );

    // Recover from a time a browser sends with seconds, or without.
    let here = format!("/portal/endpoint/{}", ids[0]);
    for since in [
        "2020-01-01T00:00",
        "2020-01-01T00:00:30",
        "2020-01-01T00:00:30.5",
    ] {
        let (status, text) = post_form(
            &app,
            &cookie,
            &format!("{here}/recover"),
            &[("since", since)],
        )
        .await;
        assert_eq!(status, StatusCode::SEE_OTHER, "{since}: {text}");
        let (_, shown) = page(&app, &cookie, &here).await;
        assert!(shown.contains("are being sent again"), "{since}: {shown}");
    }
}

//! The operator dashboard: log-in, sessions and CSRF over real HTTP, then
//! the replay flow clicked through in headless Chromium (chromedriver).

use std::time::{Duration, Instant};

use axum::http::StatusCode;
use fantoccini::{Client, Locator};
use serde_json::{json, Value};

use crate::helpers::browser::{
    assert_every_field_is_labelled, assert_fits_the_window, browser_installed, click, screenshot,
    type_into, wait_for_text, Chromedriver,
};
use crate::helpers::*;

fn location(resp: &reqwest::Response) -> String {
    header_text(resp.headers(), "location")
}

/// A dashboard action: its form posted from `client` with only the
/// page's CSRF token.
async fn post_action(
    client: &reqwest::Client,
    app: &TestApp,
    path: &str,
    csrf: &str,
) -> reqwest::Response {
    post_form(client, app, path, &[("csrf", csrf)]).await
}

/// Whether the API says endpoint `ep_id` of `app_id` is disabled.
async fn disabled_in_api(app: &TestApp, app_id: &str, ep_id: &str) -> Value {
    let (_, ep_json) = app
        .get(&format!("/api/v1/app/{app_id}/endpoint/{ep_id}"))
        .await;
    ep_json["disabled"].clone()
}

async fn post_form(
    client: &reqwest::Client,
    app: &TestApp,
    path: &str,
    form: &[(&str, &str)],
) -> reqwest::Response {
    client
        .post(app.url(path))
        .form(form)
        .send()
        .await
        .expect("herald answers")
}

/// The CSRF token the page's forms carry.
async fn delivery_state(app: &TestApp, app_id: &str, msg: &str) -> String {
    app.deliveries(app_id, msg).await[0]["state"]
        .as_str()
        .expect("state")
        .to_owned()
}

/// An app (named `name`) with one endpoint at `rx` whose one message went
/// dead (the receiver answered 400). Returns (app id, endpoint id, message
/// id, delivery id).
async fn dead_delivery(
    app: &TestApp,
    rx: &Receiver,
    name: &str,
) -> (String, String, String, String) {
    rx.script([Reply::status(400).body("rejected: bad amount")]);
    let (status, body) = app.post("/api/v1/app", json!({ "name": name })).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let app_id = body["id"].as_str().expect("app id").to_owned();
    let ep = app
        .create_endpoint(&app_id, &rx.url("/hooks/billing"), json!({}))
        .await;
    let ep_id = ep["id"].as_str().expect("endpoint id").to_owned();
    let msg = app
        .send_message(
            &app_id,
            "invoice.paid",
            json!({"invoice": "in_1", "amount": 4200}),
        )
        .await;
    let report = app.step().await;
    assert_eq!((report.claimed, report.dead), (1, 1));
    let dlv = app.deliveries(&app_id, &msg).await[0]["id"]
        .as_str()
        .expect("delivery id")
        .to_owned();
    assert_eq!(delivery_state(app, &app_id, &msg).await, "dead");
    (app_id, ep_id, msg, dlv)
}

#[tokio::test]
async fn dashboard_needs_a_login_and_a_csrf_token_for_every_change() {
    let app = spawn_stepped(&[]).await;
    let rx = Receiver::start().await;
    let evil_name = "<script>alert('pwned')</script> & Co";
    let (app_id, ep_id, msg, dlv) = dead_delivery(&app, &rx, evil_name).await;
    let browser = cookie_client();

    // Nothing without a session: pages and forms alike go to the log-in.
    for path in [
        "/dashboard",
        "/dashboard/dead",
        &format!("/dashboard/app/{app_id}/delivery/{dlv}"),
        &format!("/dashboard/app/{app_id}/endpoint/{ep_id}/secret"),
    ] {
        let resp = get_answer(&browser, &app, path).await;
        assert_eq!(resp.status(), 303, "{path}");
        assert_eq!(location(&resp), "/dashboard/login", "{path}");
    }
    let resp = post_form(
        &browser,
        &app,
        "/dashboard/dead/replay",
        &[("scope", "selected"), ("id", &dlv)],
    )
    .await;
    assert_eq!(resp.status(), 303);
    assert_eq!(delivery_state(&app, &app_id, &msg).await, "dead");
    let (status, login_page) = get_page(&browser, &app, "/dashboard/login").await;
    assert_eq!(status, 200);
    assert!(login_page.contains(r#"name="token""#), "{login_page}");

    // A wrong token is refused and starts no session.
    let resp = post_form(&browser, &app, "/dashboard/login", &[("token", "guess")]).await;
    assert_eq!(resp.status(), 401);
    assert!(resp.headers().get("set-cookie").is_none());
    assert!(resp
        .text()
        .await
        .expect("body")
        .contains("not the admin token"));
    let resp = get_answer(&browser, &app, "/dashboard").await;
    assert_eq!(resp.status(), 303);

    // The right one: a session cookie the page's script cannot read and
    // other sites' requests do not carry.
    let resp = post_form(&browser, &app, "/dashboard/login", &[("token", TOKEN)]).await;
    assert_eq!(resp.status(), 303);
    assert_eq!(location(&resp), "/dashboard");
    let cookie = header_text(resp.headers(), "set-cookie");
    assert!(cookie.starts_with("herald_session="), "{cookie}");
    for attribute in [
        "HttpOnly",
        "SameSite=Strict",
        "Path=/dashboard",
        "Max-Age=43200",
    ] {
        assert!(cookie.contains(attribute), "{attribute} in {cookie}");
    }
    let session_value = cookie
        .trim_start_matches("herald_session=")
        .split(';')
        .next()
        .expect("value")
        .to_owned();

    // The overview lists the endpoint, failing, with the app's name escaped.
    let resp = get_answer(&browser, &app, "/dashboard").await;
    assert_eq!(resp.status(), 200);
    assert!(header_text(resp.headers(), "content-type").starts_with("text/html"));
    let csp = header_text(resp.headers(), "content-security-policy");
    assert!(csp.contains("script-src 'sha256-"), "{csp}");
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    let overview = resp.text().await.expect("body");
    assert!(overview.contains(&ep_id), "the endpoint is listed");
    assert!(overview.contains(&rx.url("/hooks/billing")));
    assert!(overview.contains("failing ×1"), "{overview}");
    assert!(overview.contains("HTTP 400"), "its last error");
    assert!(
        overview.contains("<polyline class=\"latency\""),
        "its chart draws the hour's mean latency"
    );
    assert!(
        overview.contains("&lt;script&gt;alert('pwned')&lt;/script&gt; &amp; Co"),
        "the app's name is escaped"
    );
    assert!(!overview.contains("<script>alert"), "and never raw");

    // The dead letter is listed; replaying it without the page's token is
    // refused and changes nothing.
    let (status, dead_page) = get_page(&browser, &app, "/dashboard/dead").await;
    assert_eq!(status, 200);
    assert!(dead_page.contains(&format!(r#"name="id" value="{dlv}""#)));
    assert!(dead_page.contains("permanent_status"));
    let csrf = csrf_of(&dead_page);
    let forged = [
        vec![("scope", "selected"), ("id", dlv.as_str())],
        vec![
            ("scope", "selected"),
            ("id", dlv.as_str()),
            ("csrf", "0123abcd"),
        ],
        vec![("scope", "matching"), ("csrf", "")],
    ];
    for form in &forged {
        let resp = post_form(&browser, &app, "/dashboard/dead/replay", form).await;
        assert_eq!(resp.status(), 403, "{form:?}");
        assert_eq!(delivery_state(&app, &app_id, &msg).await, "dead");
    }
    // The right token from another site's page: refused too.
    let resp = browser
        .post(app.url("/dashboard/dead/replay"))
        .header("origin", "http://evil.example")
        .form(&[("scope", "selected"), ("id", &dlv), ("csrf", &csrf)])
        .send()
        .await
        .expect("answer");
    assert_eq!(resp.status(), 403);
    assert_eq!(delivery_state(&app, &app_id, &msg).await, "dead");

    // With the token (and our own origin): replayed, back to the list with
    // the count, and delivered by the next step.
    rx.always(Reply::status(200));
    let resp = browser
        .post(app.url("/dashboard/dead/replay"))
        .header("origin", app.base.as_str())
        .form(&[("scope", "selected"), ("id", &dlv), ("csrf", &csrf)])
        .send()
        .await
        .expect("answer");
    assert_eq!(resp.status(), 303);
    assert_eq!(location(&resp), "/dashboard/dead");
    let (_, after) = get_page(&browser, &app, "/dashboard/dead").await;
    assert!(after.contains("Replayed 1"), "the flash");
    assert!(
        !after.contains(&format!(r#"value="{dlv}""#)),
        "no longer dead"
    );
    let (_, again) = get_page(&browser, &app, "/dashboard/dead").await;
    assert!(!again.contains("Replayed 1"), "a flash shows once");
    assert_eq!(app.step().await.delivered, 1);
    assert_eq!(rx.requests().len(), 2);
    assert_eq!(delivery_state(&app, &app_id, &msg).await, "delivered");

    // The delivery's page: payload, the headers, both attempts.
    let (status, page) = get_page(
        &browser,
        &app,
        &format!("/dashboard/app/{app_id}/delivery/{dlv}"),
    )
    .await;
    assert_eq!(status, 200);
    assert!(page.contains("delivered"));
    assert!(page.contains(&msg), "webhook-id");
    assert!(page.contains("idempotency-key"));
    assert!(page.contains("v1,…"));
    assert!(
        page.contains("&quot;amount&quot;: 4200"),
        "the payload, indented"
    );
    assert!(page.contains("rejected: bad amount"), "the 400's response");
    assert!(
        !page.contains(&format!("{dlv}/replay")),
        "no replay button once delivered"
    );

    // The endpoint's page: disable with a reason (escaped when shown),
    // then enable, each through the operator's rules.
    let ep_path = format!("/dashboard/app/{app_id}/endpoint/{ep_id}");
    let (status, ep_page) = get_page(&browser, &app, &ep_path).await;
    assert_eq!(status, 200);
    assert!(ep_page.contains("whsec_••••"), "the secret is masked");
    let csrf = csrf_of(&ep_page);
    // A reason the API refuses (1,200 bytes in 600 characters) is said on
    // the endpoint's page, not as a bare error page; nothing changes.
    let long = "é".repeat(600);
    let resp = post_form(
        &browser,
        &app,
        &format!("{ep_path}/disable"),
        &[("reason", long.as_str()), ("csrf", &csrf)],
    )
    .await;
    assert_eq!(resp.status(), 303);
    let (_, ep_page) = get_page(&browser, &app, &ep_path).await;
    assert!(ep_page.contains("Not disabled: reason"), "{ep_page}");
    let resp = post_form(
        &browser,
        &app,
        &format!("{ep_path}/disable"),
        &[("reason", "maintenance <b>now</b>")],
    )
    .await;
    assert_eq!(resp.status(), 403, "no token, no change");
    assert_eq!(disabled_in_api(&app, &app_id, &ep_id).await, false);
    let resp = post_form(
        &browser,
        &app,
        &format!("{ep_path}/disable"),
        &[("reason", "maintenance <b>now</b>"), ("csrf", &csrf)],
    )
    .await;
    assert_eq!(resp.status(), 303);
    assert_eq!(location(&resp), ep_path);
    assert_eq!(disabled_in_api(&app, &app_id, &ep_id).await, true);
    let (_, ep_page) = get_page(&browser, &app, &ep_path).await;
    assert!(ep_page.contains("maintenance &lt;b&gt;now&lt;/b&gt;"));
    assert!(ep_page.contains("Disabled: nothing is sent"), "the flash");
    let resp = post_action(&browser, &app, &format!("{ep_path}/enable"), &csrf).await;
    assert_eq!(resp.status(), 303);
    assert_eq!(disabled_in_api(&app, &app_id, &ep_id).await, false);

    // Rotation: refused without the token; with it, a new secret.
    let before = app.endpoint_secret(&app_id, &ep_id).await;
    let resp = post_form(&browser, &app, &format!("{ep_path}/rotate"), &[]).await;
    assert_eq!(resp.status(), 403);
    let resp = post_action(&browser, &app, &format!("{ep_path}/rotate"), &csrf).await;
    assert_eq!(resp.status(), 303);
    let (_, ep_page) = get_page(&browser, &app, &ep_path).await;
    assert!(ep_page.contains("Secret rotated"), "the flash");

    // The reveal link gives the secret the API gives: the new one.
    let (status, secret) = get_page(&browser, &app, &format!("{ep_path}/secret")).await;
    assert_eq!(status, 200);
    assert_ne!(secret, before, "rotated");
    assert_eq!(secret, app.endpoint_secret(&app_id, &ep_id).await);

    // Log-out needs the token too, then ends the session on the server:
    // the old cookie, sent again, is worth nothing.
    let resp = post_form(&browser, &app, "/dashboard/logout", &[]).await;
    assert_eq!(resp.status(), 403);
    let resp = post_action(&browser, &app, "/dashboard/logout", &csrf).await;
    assert_eq!(resp.status(), 303);
    assert_eq!(location(&resp), "/dashboard/login");
    assert!(header_text(resp.headers(), "set-cookie").contains("Max-Age=0"));
    let resp = get_answer(&browser, &app, "/dashboard").await;
    assert_eq!(resp.status(), 303);
    let replayed_cookie = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
        .get(app.url("/dashboard"))
        .header("cookie", format!("herald_session={session_value}"))
        .send()
        .await
        .expect("answer");
    assert_eq!(replayed_cookie.status(), 303);
    assert_eq!(location(&replayed_cookie), "/dashboard/login");
    app.shutdown().await;
}

#[tokio::test]
async fn dashboard_replays_all_matching_dead_letters_of_a_filter() {
    let app = spawn_stepped(&[]).await;
    let rx_a = Receiver::start().await;
    let rx_b = Receiver::start().await;
    let (app_a, _, msg_a, _) = dead_delivery(&app, &rx_a, "A").await;
    let (app_b, ep_b, msg_b, _) = dead_delivery(&app, &rx_b, "B").await;
    let browser = cookie_client();
    post_form(&browser, &app, "/dashboard/login", &[("token", TOKEN)]).await;

    // Filtered to B's endpoint: only B's dead letter shows and is replayed.
    let filter = format!("/dashboard/dead?app={app_b}&endpoint={ep_b}");
    let (status, page) = get_page(&browser, &app, &filter).await;
    assert_eq!(status, 200);
    let csrf = csrf_of(&page);
    let resp = post_form(
        &browser,
        &app,
        "/dashboard/dead/replay",
        &[
            ("scope", "matching"),
            ("app", &app_b),
            ("endpoint", &ep_b),
            ("csrf", &csrf),
        ],
    )
    .await;
    assert_eq!(resp.status(), 303);
    assert_eq!(
        location(&resp),
        format!("/dashboard/dead?app={app_b}&endpoint={ep_b}")
    );
    let (_, page) = get_page(&browser, &app, &filter).await;
    assert!(page.contains("Replayed 1"));
    assert_eq!(delivery_state(&app, &app_b, &msg_b).await, "pending");
    assert_eq!(delivery_state(&app, &app_a, &msg_a).await, "dead");

    // A filter that names nothing is explained, not a crash.
    let (status, page) = get_page(&browser, &app, "/dashboard/dead?since=yesterday").await;
    assert_eq!(status, 422);
    assert!(page.contains("since: write a time"), "{page}");
    let (status, _) = get_page(&browser, &app, "/dashboard/dead?app=app_nosuch").await;
    assert_eq!(status, 422);
    app.shutdown().await;
}

/// Saves a screenshot into docs/ when asked to (`HERALD_UPDATE_SCREENSHOT=1`),
/// so that ordinary runs leave the tree alone.
async fn save_screenshot(browser: &Client, name: &str) {
    screenshot(browser, name, "HERALD_UPDATE_SCREENSHOT").await;
}

#[tokio::test]
async fn dashboard_in_chromium_replays_a_dead_letter() {
    if !browser_installed("dashboard_in_chromium_replays_a_dead_letter") {
        return;
    }
    let app = spawn_stepped(&[]).await;
    // Some traffic so the overview has something to show: a healthy
    // endpoint, a disabled one, and the one whose delivery goes dead.
    let rx = Receiver::start().await;
    let rx_orders = Receiver::start().await;
    let (app_id, ep_id, msg, dlv) = dead_delivery(&app, &rx, "Acme Shop").await;
    let (status, body) = app.post("/api/v1/app", json!({"name": "Initech"})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let initech = body["id"].as_str().expect("app id").to_owned();
    app.create_endpoint(
        &initech,
        &rx_orders.url("/webhooks/orders"),
        json!({"description": "order sync"}),
    )
    .await;
    for i in 0..6 {
        app.send_message(&initech, "order.created", json!({"order": i}))
            .await;
    }
    // One more whose receiver stumbles once (a retried 503), so the
    // figures show a failure rate on a healthy endpoint.
    let rx_flaky = Receiver::start().await;
    rx_flaky.script([Reply::status(503)]);
    let (status, body) = app.post("/api/v1/app", json!({"name": "Umbrella"})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let umbrella = body["id"].as_str().expect("app id").to_owned();
    app.create_endpoint(&umbrella, &rx_flaky.url("/ingest/herald"), json!({}))
        .await;
    for i in 0..4 {
        app.send_message(&umbrella, "shipment.updated", json!({"shipment": i}))
            .await;
    }
    let (status, body) = app.post("/api/v1/app", json!({"name": "Globex"})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let globex = body["id"].as_str().expect("app id").to_owned();
    let paused = app
        .create_endpoint(&globex, &rx_orders.url("/globex/events"), json!({}))
        .await;
    app.disable_endpoint(
        &globex,
        paused["id"].as_str().expect("id"),
        json!({"reason": "receiver migrating to a new cluster"}),
    )
    .await;
    let deadline = Instant::now() + PATIENCE;
    while rx_orders.requests().len() < 6 || rx_flaky.requests().len() < 5 {
        app.step().await;
        assert!(Instant::now() < deadline, "the orders were never delivered");
    }
    // The dead delivery's receiver is fixed now.
    rx.always(Reply::status(200));

    let driver = Chromedriver::start().await;
    let browser = driver.browser().await;
    browser
        .set_window_size(1400, 1000)
        .await
        .expect("window size");

    // Log in through the form the redirect leads to.
    browser
        .goto(&app.url("/dashboard"))
        .await
        .expect("open the dashboard");
    let url = browser.current_url().await.expect("url");
    assert_eq!(url.path(), "/dashboard/login");
    type_into(&browser, "input[name=token]", TOKEN).await;
    click(&browser, "button[type=submit]").await;
    let cards = wait_for_text(&browser, ".cards", "Dead letters").await;
    assert!(cards.contains("Disabled endpoints"));
    let table = wait_for_text(&browser, "table", "Acme Shop").await;
    assert!(table.contains("failing ×1"), "{table}");
    assert!(table.contains("disabled"), "{table}");
    // The inline style ran (its hash is in the CSP): the header is dark.
    let background = browser
        .execute(
            "return getComputedStyle(document.querySelector('header')).backgroundColor",
            vec![],
        )
        .await
        .expect("script runs");
    assert_eq!(background, json!("rgb(36, 41, 47)"));
    save_screenshot(&browser, "dashboard.png").await;

    // Dead letters: tick the row, replay the selection.
    browser
        .goto(&app.url("/dashboard/dead"))
        .await
        .expect("open dead letters");
    let checkbox = browser
        .wait()
        .at_most(PATIENCE)
        .for_element(Locator::Css(&format!(r#"input[name="id"][value="{dlv}"]"#)))
        .await
        .expect("the delivery's row");
    checkbox.click().await.expect("tick it");
    // The inline script ran too: it counts the ticked rows.
    wait_for_text(&browser, "[data-selected-count]", "1 selected").await;
    save_screenshot(&browser, "dashboard-dead-letters.png").await;
    click(&browser, r#"button[name="scope"][value="selected"]"#).await;
    wait_for_text(&browser, ".flash", "Replayed 1").await;

    // The dispatcher sends it again; the receiver, fixed, takes it.
    assert_eq!(app.step().await.delivered, 1);
    let got = rx.wait_for(2).await;
    assert_eq!(got[1].header("idempotency-key"), dlv);
    assert_eq!(got[1].header("x-attempt"), "2");

    browser
        .goto(&app.url(&format!("/dashboard/app/{app_id}/delivery/{dlv}")))
        .await
        .expect("open the delivery");
    let facts = wait_for_text(&browser, "dl.facts", "delivered").await;
    assert!(facts.contains(&msg), "{facts}");
    let attempts = wait_for_text(&browser, "main", "success").await;
    assert!(
        attempts.contains("failed"),
        "the first attempt is listed too"
    );

    // "What happened to event inv-42 of Acme?" in two clicks: search the
    // eventId, open the message.
    let (status, out) = app
        .post(
            &format!("/api/v1/app/{app_id}/msg"),
            json!({"eventType": "invoice.paid", "eventId": "inv-42", "payload": {"invoice": "inv-42"}}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{out}");
    let inv42 = out["id"].as_str().expect("msg id").to_owned();
    assert_eq!(app.step().await.delivered, 1);
    browser
        .goto(&app.url("/dashboard/messages"))
        .await
        .expect("open messages");
    type_into(&browser, r#"form.filters input[name="id"]"#, "inv-42").await;
    click(&browser, "form.filters button[type=submit]").await;
    // The unfiltered list had inv-42 too: wait for the search's own page.
    let deadline = Instant::now() + PATIENCE;
    while !browser
        .current_url()
        .await
        .is_ok_and(|u| u.query().is_some_and(|q| q.contains("id=inv-42")))
    {
        assert!(Instant::now() < deadline, "the search never loaded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let found = wait_for_text(&browser, "table.messages", "inv-42").await;
    assert!(found.contains("1 delivered"), "{found}");
    assert!(!found.contains(&msg), "only the matching message: {found}");
    save_screenshot(&browser, "dashboard-messages.png").await;
    click(
        &browser,
        &format!(r#"table.messages a[href$="/msg/{inv42}"]"#),
    )
    .await;
    let deliveries = wait_for_text(&browser, "table.deliveries", "delivered").await;
    assert!(deliveries.contains("/hooks/billing"), "{deliveries}");
    let payload = wait_for_text(&browser, "pre.payload", "inv-42").await;
    assert!(payload.contains("\"invoice\""), "{payload}");
    wait_for_text(&browser, "table.attempts", "success").await;
    save_screenshot(&browser, "dashboard-message.png").await;

    // The secret's reveal shows it; once the session has ended it says
    // so, where it showed the sign-in page's HTML as the secret.
    let ep_page = app.url(&format!("/dashboard/app/{app_id}/endpoint/{ep_id}"));
    browser.goto(&ep_page).await.expect("open the endpoint");
    click(&browser, "a[data-reveal]").await;
    wait_for_text(&browser, "#secret", "whsec_").await;
    browser.goto(&ep_page).await.expect("open the endpoint");
    browser.delete_all_cookies().await.expect("end the session");
    click(&browser, "a[data-reveal]").await;
    wait_for_text(&browser, "a[data-reveal]", "could not load it (signed out").await;
    let secret = browser
        .find(Locator::Css("#secret"))
        .await
        .expect("the secret's place")
        .text()
        .await
        .expect("text");
    assert!(secret.starts_with("whsec_••••"), "{secret}");

    // On a phone's width (and with a name too long to break) every page
    // fits it: the header wraps, the columns stack, long words break.
    let (status, out) = app
        .post("/api/v1/app", json!({"name": "N".repeat(256)}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{out}");
    browser
        .goto(&app.url("/dashboard/login"))
        .await
        .expect("login page");
    type_into(&browser, "input[name=token]", TOKEN).await;
    click(&browser, "button[type=submit]").await;
    wait_for_text(&browser, ".cards", "Dead letters").await;
    browser
        .set_window_size(375, 800)
        .await
        .expect("window size");
    for page in [
        "/dashboard".to_owned(),
        "/dashboard/apps".to_owned(),
        format!("/dashboard/app/{app_id}/endpoint/{ep_id}"),
        format!("/dashboard/app/{app_id}/msg/{msg}"),
    ] {
        browser.goto(&app.url(&page)).await.expect("open");
        assert_fits_the_window(&browser, &page).await;
        assert_every_field_is_labelled(&browser, &page).await;
    }
    browser.close().await.expect("browser closes");
    drop(driver);
    app.shutdown().await;
}

/// The dashboard's endpoint actions are the API's: a secret rotated there
/// is said to the operator webhook as `endpoint.updated`, as Svix and the
/// API say it, and audited as the dashboard's.
#[tokio::test]
async fn a_rotation_in_the_dashboard_is_an_endpoint_update_for_the_operator() {
    let ops = Receiver::start().await;
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let app = spawn_app(&[
        ("HERALD_OPERATOR_WEBHOOK_URL", &ops.url("/ops")),
        ("HERALD_OPERATOR_WEBHOOK_SECRET", secret),
    ])
    .await;
    let rx = Receiver::start().await;
    let (app_id, ep_id) = app.app_with_endpoint(&rx.url("/"), json!({})).await;
    let browser = logged_in(&app).await;
    let ep_path = format!("/dashboard/app/{app_id}/endpoint/{ep_id}");
    let (_, ep_page) = get_page(&browser, &app, &ep_path).await;
    let csrf = csrf_of(&ep_page);
    let resp = post_action(&browser, &app, &format!("{ep_path}/rotate"), &csrf).await;
    assert_eq!(resp.status(), 303);

    let events = crate::endpoint_health::operator_events(&ops, secret, &["endpoint.updated"]).await;
    let updated: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "endpoint.updated")
        .collect();
    assert_eq!(updated.len(), 1, "{events:?}");
    assert_eq!(updated[0]["data"]["endpointId"], ep_id.as_str());
    let (_, entries) = app
        .get("/api/v1/audit-log?action=endpoint.secret_rotated")
        .await;
    let entry = &entries["data"][0];
    assert_eq!(entry["actorKind"], "dashboard", "{entries}");
    assert_eq!(entry["target"], ep_id.as_str());
    assert_eq!(entry["details"]["keyGiven"], false);
    app.shutdown().await;
}

crate::on_both_stores!(pages_refuse_control_characters_in_their_parameters);

/// A NUL (or another control character) in a page's path or query reaches
/// no store: the dashboard and the portal answer 400 naming the parameter
/// on either store, as the API does, where PostgreSQL (which refuses a
/// NUL in text) made it a 500.
async fn pages_refuse_control_characters_in_their_parameters(backend: &Backend) {
    let app = backend.spawn_stepped(&[]).await;
    let app_id = app.create_app().await;
    let dashboard = logged_in(&app).await;
    let (status, out) = app
        .post(
            &format!("/api/v1/auth/app-portal-access/{app_id}"),
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{out}");
    let link = url::Url::parse(out["url"].as_str().expect("url")).expect("a URL");
    let portal = cookie_client();
    let (status, _) = get_page(
        &portal,
        &app,
        &format!("{}?{}", link.path(), link.query().unwrap_or_default()),
    )
    .await;
    assert_eq!(status, 303, "the link opens a portal session");
    let pages = [
        (&dashboard, "/dashboard/app/a%00b".to_owned()),
        (&dashboard, format!("/dashboard/app/{app_id}/msg/a%00b")),
        (&dashboard, "/dashboard/audit?action=a%00b".to_owned()),
        (&dashboard, "/dashboard/apps?q=a%00b".to_owned()),
        (
            &dashboard,
            format!("/dashboard/messages?app={app_id}&event_type=a%00b"),
        ),
        (&dashboard, "/dashboard/dead?after=a%01b".to_owned()),
        (&portal, "/portal/endpoint/a%00b".to_owned()),
        (&portal, "/portal/msg/a%00b".to_owned()),
        (&portal, "/portal/messages?event_type=a%00b".to_owned()),
        (&portal, "/portal/messages?channel=a%00b".to_owned()),
    ];
    for (client, path) in pages {
        let (status, page) = get_page(client, &app, &path).await;
        assert_eq!(status, 400, "{path}: {page}");
        assert!(page.contains("control characters"), "{path}: {page}");
    }
    // The same pages with text in those places still answer.
    let (status, _) = get_page(&dashboard, &app, "/dashboard/apps?q=ab").await;
    assert_eq!(status, 200);
    let (status, _) = get_page(&portal, &app, "/portal/messages?event_type=ab").await;
    assert_eq!(status, 200);
    app.shutdown().await;
}

//! The customer portal in headless Chromium: a link from the official
//! SDK, an endpoint added to a real receiver, a signed test event seen
//! on the endpoint's page, a secret rotated, a used link's expired page,
//! and the portal embedded in an iframe of another origin and used there.
//! Screenshots go to `docs/portal-*.png` with `HERALD_SCREENSHOTS=1`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fantoccini::{Client, Locator};
use svix::api::Svix;
use svix::models::AppPortalAccessIn;

use crate::helpers::browser::{
    assert_every_field_is_labelled, assert_fits_the_window, browser_installed, click, screenshot,
    type_into, wait_for_text, Chromedriver,
};
use crate::helpers::*;

async fn shot(browser: &Client, name: &str) {
    screenshot(browser, name, "HERALD_SCREENSHOTS").await;
}

async fn mint(svix: &Svix, app: &str) -> String {
    svix.authentication()
        .app_portal_access(app.to_owned(), AppPortalAccessIn::new(), None)
        .await
        .expect("app-portal-access")
        .url
}

/// A page on `http://localhost:PORT/` framing whatever `src` holds.
async fn framing_page(listener: tokio::net::TcpListener, src: Arc<Mutex<String>>) {
    let router = axum::Router::new().route(
        "/",
        axum::routing::get(move || {
            let src = src.lock().map(|s| s.clone()).unwrap_or_default();
            async move {
                axum::response::Html(format!(
                    "<!doctype html><title>Operator's product</title><h1>Operator's product</h1>\
                     <iframe id=portal src=\"{src}\" width=1200 height=800></iframe>"
                ))
            }
        }),
    );
    let _ = axum::serve(listener, router).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portal_in_chromium_from_an_sdk_link_to_an_embedded_frame() {
    if !browser_installed("portal_in_chromium_from_an_sdk_link_to_an_embedded_frame") {
        return;
    }
    // The operator's product, on another origin (localhost vs 127.0.0.1).
    let framer = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let framer_port = framer.local_addr().expect("addr").port();
    let src = Arc::new(Mutex::new(String::new()));
    tokio::spawn(framing_page(framer, src.clone()));
    let ancestors = format!("http://localhost:{framer_port}");
    let app = spawn_app(&[("HERALD_PORTAL_FRAME_ANCESTORS", ancestors.as_str())]).await;
    let rx = Receiver::start().await;
    let (status, created) = app
        .post(
            "/api/v1/app",
            serde_json::json!({"name": "Acme", "uid": "acme"}),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    app.create_event_type(serde_json::json!({"name": "invoice.paid",
        "description": "An invoice was paid",
        "schemas": {"1": {"type": "object", "examples": [{"invoice": "inv-42", "amount": 1200}]}}}))
        .await;
    let svix = app.sdk();
    let link = mint(&svix, "acme").await;

    let driver = Chromedriver::start().await;
    let browser = driver.browser().await;
    browser.goto(&link).await.expect("open the link");
    let url = browser.current_url().await.expect("url");
    assert_eq!(url.path(), "/portal");
    assert!(
        url.query().is_none(),
        "the code left the address bar: {url}"
    );
    wait_for_text(&browser, "h1", "Endpoints").await;

    // Add an endpoint pointing at the receiver.
    click(&browser, "a[href='/portal/endpoint/new']").await;
    wait_for_text(&browser, "h1", "Add endpoint").await;
    type_into(&browser, "input[name=url]", &rx.url("/hook")).await;
    type_into(&browser, "input[name=description]", "Billing receiver").await;
    shot(&browser, "portal-endpoint-form.png").await;
    click(&browser, "form button.primary").await;
    wait_for_text(&browser, ".flash", "Endpoint added").await;
    shot(&browser, "portal-endpoints.png").await;

    // Its page: send a test event of the catalogue's type.
    click(&browser, "td a.clip").await;
    wait_for_text(&browser, "h1", "Endpoint").await;
    click(
        &browser,
        "select[name=eventType] option[value='invoice.paid']",
    )
    .await;
    click(&browser, "form[action$='/send-example'] button").await;
    wait_for_text(&browser, ".flash", "Sent a test invoice.paid event").await;
    let got = rx.wait_for(1).await;
    assert!(got[0].headers.contains_key("webhook-signature"), "signed");
    assert!(
        String::from_utf8_lossy(&got[0].body).contains("inv-42"),
        "the schema's example"
    );
    let deadline = Instant::now() + PATIENCE;
    loop {
        browser.refresh().await.expect("reload");
        let text = browser
            .find(Locator::Css("body"))
            .await
            .expect("body")
            .text()
            .await
            .unwrap_or_default();
        if text.contains("succeeded") {
            break;
        }
        assert!(Instant::now() < deadline, "the attempt never showed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    shot(&browser, "portal-endpoint.png").await;
    click(&browser, "form[action$='/rotate'] button").await;
    wait_for_text(&browser, ".flash", "Secret rotated").await;

    click(&browser, "a[href='/portal/event-types']").await;
    wait_for_text(&browser, "body", "inv-42").await;
    shot(&browser, "portal-event-types.png").await;

    // The message log: the test event is there; its page shows the attempt.
    click(&browser, "a[href='/portal/messages']").await;
    wait_for_text(&browser, "h1", "Messages").await;
    wait_for_text(&browser, "body", "invoice.paid").await;
    shot(&browser, "portal-messages.png").await;
    click(&browser, "td a[href^='/portal/msg/']").await;
    wait_for_text(&browser, "body", "inv-42").await;
    shot(&browser, "portal-message.png").await;

    // On a phone's width every page fits: the header wraps, the columns
    // stack, wide tables scroll within themselves.
    browser
        .set_window_size(375, 800)
        .await
        .expect("window size");
    for page in ["/portal", "/portal/messages", "/portal/event-types"] {
        browser.goto(&app.url(page)).await.expect("open");
        assert_fits_the_window(&browser, page).await;
        assert_every_field_is_labelled(&browser, page).await;
    }
    browser.goto(&app.url("/portal")).await.expect("open");
    click(&browser, "td a.clip").await;
    wait_for_text(&browser, "h1", "Endpoint").await;
    assert_fits_the_window(&browser, "the endpoint's page").await;
    assert_every_field_is_labelled(&browser, "the endpoint's page").await;
    browser
        .set_window_size(1400, 1000)
        .await
        .expect("window size");

    // The same link again: used.
    browser.goto(&link).await.expect("open the used link");
    wait_for_text(&browser, "h1", "This link has expired").await;
    shot(&browser, "portal-expired.png").await;

    // Embedded in the operator's product, on another origin.
    let framed_link = mint(&svix, "acme").await;
    if let Ok(mut s) = src.lock() {
        *s = framed_link;
    }
    browser
        .goto(&format!("http://localhost:{framer_port}/"))
        .await
        .expect("open the framing page");
    wait_for_text(&browser, "h1", "Operator's product").await;
    let frame = browser
        .find(Locator::Css("iframe#portal"))
        .await
        .expect("the iframe");
    frame.enter_frame().await.expect("into the frame");
    wait_for_text(&browser, "h1", "Endpoints").await;
    click(&browser, "td a.clip").await;
    wait_for_text(&browser, "h1", "Endpoint").await;
    click(&browser, "form[action$='/rotate'] button").await;
    wait_for_text(&browser, ".flash", "Secret rotated").await;
    browser.enter_parent_frame().await.expect("back out");
    shot(&browser, "portal-embedded.png").await;
    let _ = browser.close().await;
}

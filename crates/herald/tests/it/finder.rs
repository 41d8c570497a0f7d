//! The dashboard's finding tools over real HTTP: the messages search by
//! each filter (and never another application's messages), a message's
//! page with its attempts, a resend that reaches a real receiver, the
//! applications → endpoints pages, and the overview and `/metrics`
//! telling held deliveries (a disabled endpoint) apart from due ones.

use std::collections::BTreeSet;
use std::time::Duration;

use axum::http::StatusCode;
use serde_json::{json, Value};

use crate::helpers::*;

/// The message ids a messages page links to.
fn linked_messages(html: &str) -> BTreeSet<String> {
    html.split("/msg/")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .filter(|id| id.starts_with("msg_"))
        .map(str::to_owned)
        .collect()
}

fn set(ids: &[&String]) -> BTreeSet<String> {
    ids.iter().map(|s| (*s).clone()).collect()
}

async fn new_app(app: &TestApp, name: &str, uid: &str) -> String {
    let (status, body) = app
        .post("/api/v1/app", json!({ "name": name, "uid": uid }))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    body["id"].as_str().expect("app id").to_owned()
}

async fn send(app: &TestApp, app_id: &str, event_type: &str, event_id: Option<&str>) -> String {
    let mut body =
        json!({ "eventType": event_type, "payload": { "invoice": event_id, "amount": 4200 } });
    if let Some(e) = event_id {
        body["eventId"] = json!(e);
    }
    let (status, out) = app.post(&format!("/api/v1/app/{app_id}/msg"), body).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{out}");
    out["id"].as_str().expect("msg id").to_owned()
}

/// Herald (stepped) and a receiver, with two applications: Acme
/// (`acme_name`, uid `acme`), with one endpoint at `acme_path` on the
/// receiver, and `other` (name, uid), as yet without one.
struct TwoApps {
    app: TestApp,
    rx: Receiver,
    acme: String,
    acme_ep: String,
    other: String,
}

async fn two_apps(acme_name: &str, acme_path: &str, other: (&str, &str)) -> TwoApps {
    let app = spawn_stepped(&[]).await;
    let rx = Receiver::start().await;
    let acme = new_app(&app, acme_name, "acme").await;
    let other = new_app(&app, other.0, other.1).await;
    let ep = app
        .create_endpoint(&acme, &rx.url(acme_path), json!({}))
        .await;
    let acme_ep = ep["id"].as_str().expect("endpoint id").to_owned();
    TwoApps {
        app,
        rx,
        acme,
        acme_ep,
        other,
    }
}

/// Steps the dispatcher until the receiver has seen `n` requests (bounded).
async fn deliver_until(app: &TestApp, rx: &Receiver, n: usize) {
    for _ in 0..50 {
        if rx.requests().len() >= n {
            return;
        }
        app.step().await;
    }
    panic!("the receiver saw {} of {n} requests", rx.requests().len());
}

#[tokio::test]
async fn messages_search_finds_exactly_the_matching_messages_of_each_filter() {
    let TwoApps {
        app,
        rx,
        acme,
        other,
        ..
    } = two_apps("Acme", "/acme", ("Other Corp", "other")).await;
    app.create_endpoint(&other, &rx.url("/other"), json!({}))
        .await;

    // Delivered: inv-42 and the other app's message with the same eventId.
    let inv42 = send(&app, &acme, "invoice.paid", Some("inv-42")).await;
    let other42 = send(&app, &other, "invoice.paid", Some("inv-42")).await;
    deliver_until(&app, &rx, 2).await;
    // Dead: the receiver refuses the order (400 is final).
    rx.script([Reply::status(400).body("no such order")]);
    let order = send(&app, &acme, "order.created", None).await;
    deliver_until(&app, &rx, 3).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let between = herald::store::rfc3339(herald::store::now_millis());
    tokio::time::sleep(Duration::from_millis(5)).await;
    // Pending: never stepped.
    let inv43 = send(&app, &acme, "invoice.paid", Some("inv-43")).await;
    assert_eq!(app.deliveries(&acme, &order).await[0]["state"], "dead");
    assert_eq!(app.deliveries(&acme, &inv42).await[0]["state"], "delivered");

    let client = logged_in(&app).await;
    let search = |query: Vec<(&'static str, String)>| {
        let client = client.clone();
        let app = &app;
        async move {
            let q = url::form_urlencoded::Serializer::new(String::new())
                .extend_pairs(&query)
                .finish();
            let (status, html) = get_page(&client, app, &format!("/dashboard/messages?{q}")).await;
            assert_eq!(status, 200, "{q}: {html}");
            linked_messages(&html)
        }
    };
    let v = |s: &str| s.to_owned();
    assert_eq!(
        search(vec![]).await,
        set(&[&inv42, &other42, &order, &inv43])
    );
    for app_key in [acme.clone(), v("acme")] {
        assert_eq!(
            search(vec![("app", app_key)]).await,
            set(&[&inv42, &order, &inv43])
        );
    }
    assert_eq!(
        search(vec![("id", v("inv-42"))]).await,
        set(&[&inv42, &other42])
    );
    assert_eq!(
        search(vec![("app", v("acme")), ("id", v("inv-42"))]).await,
        set(&[&inv42])
    );
    assert_eq!(
        search(vec![("app", v("other")), ("id", order.clone())]).await,
        set(&[]),
        "another app's message id finds nothing"
    );
    assert_eq!(search(vec![("id", order.clone())]).await, set(&[&order]));
    assert_eq!(
        search(vec![("app", v("acme")), ("event_type", v("invoice.paid"))]).await,
        set(&[&inv42, &inv43])
    );
    assert_eq!(
        search(vec![("app", v("acme")), ("status", v("delivered"))]).await,
        set(&[&inv42])
    );
    assert_eq!(search(vec![("status", v("failed"))]).await, set(&[&order]));
    assert_eq!(search(vec![("status", v("dead"))]).await, set(&[&order]));
    assert_eq!(search(vec![("status", v("pending"))]).await, set(&[&inv43]));
    assert_eq!(
        search(vec![("created_after", between.clone())]).await,
        set(&[&inv43])
    );
    assert_eq!(
        search(vec![
            ("app", v("acme")),
            ("created_before", between.clone())
        ])
        .await,
        set(&[&inv42, &order])
    );

    // Wrong filters: a clear 400 naming the field, the form kept.
    for (query, field) in [
        ("status=lost", "status:"),
        ("created_after=yesterday", "created_after:"),
        ("app=nobody", "app:"),
    ] {
        let (status, html) = get_page(&client, &app, &format!("/dashboard/messages?{query}")).await;
        assert_eq!(status, 400, "{query}");
        assert!(html.contains(field), "{query}: {html}");
        assert!(
            html.contains(r#"name="event_type""#),
            "the form is still there"
        );
    }

    // Paging: 50 a page, newest first, "Older" leads to the rest.
    for i in 0..55 {
        send(&app, &other, "bulk.event", Some(&format!("bulk-{i}"))).await;
    }
    let (_, first) = get_page(&client, &app, "/dashboard/messages?event_type=bulk.event").await;
    let first_ids = linked_messages(&first);
    assert_eq!(first_ids.len(), 50);
    let older = first
        .split("rel=\"next\"")
        .next()
        .and_then(|before| before.rsplit("href=\"").next())
        .and_then(|rest| rest.split('"').next())
        .expect("an Older link")
        .replace("&amp;", "&");
    let (status, second) = get_page(&client, &app, &older).await;
    assert_eq!(status, 200);
    let second_ids = linked_messages(&second);
    assert_eq!(second_ids.len(), 5);
    assert!(first_ids.is_disjoint(&second_ids));
    app.shutdown().await;
}

#[tokio::test]
async fn message_page_shows_every_attempt_and_resend_reaches_the_receiver() {
    let TwoApps {
        app,
        rx,
        acme,
        acme_ep: ep_id,
        other,
    } = two_apps("Acme", "/billing", ("Other Corp", "other")).await;
    rx.script([Reply::status(503).body("busy, try later")]);
    let msg = send(&app, &acme, "invoice.paid", Some("inv-42")).await;
    // A 503 then a 200: two attempts.
    deliver_until(&app, &rx, 2).await;
    assert_eq!(app.deliveries(&acme, &msg).await[0]["state"], "delivered");

    let client = logged_in(&app).await;
    // By id and by eventId alike.
    for key in [msg.as_str(), "inv-42"] {
        let (status, html) =
            get_page(&client, &app, &format!("/dashboard/app/acme/msg/{key}")).await;
        assert_eq!(status, 200, "{html}");
        assert!(html.contains(&msg));
        assert!(
            html.contains("&quot;amount&quot;: 4200") || html.contains("\"amount\": 4200"),
            "payload shown: {html}"
        );
        assert!(
            html.contains("busy, try later"),
            "the 503's response excerpt"
        );
        assert!(
            html.contains(">503<") && html.contains(">200<"),
            "both statuses"
        );
        assert_eq!(
            html.matches("<tr").count(),
            5,
            "two tables' header rows, one delivery, two attempts"
        );
        assert!(html.contains(&format!("/dashboard/app/{acme}/endpoint/{ep_id}")));
        assert!(html.contains("Resend"));
    }
    // Another application's path: as if the message did not exist.
    let (status, _) = get_page(&client, &app, &format!("/dashboard/app/{other}/msg/{msg}")).await;
    assert_eq!(status, 404);
    let (status, _) = get_page(
        &client,
        &app,
        &format!("/dashboard/app/{acme}/msg/msg_nothing"),
    )
    .await;
    assert_eq!(status, 404);

    // Resend: a POST with the session's CSRF token, through the API's resend.
    let (_, html) = get_page(&client, &app, &format!("/dashboard/app/{acme}/msg/{msg}")).await;
    let csrf = csrf_of(&html);
    let action = format!("/dashboard/app/{acme}/msg/{msg}/endpoint/{ep_id}/resend");
    assert!(html.contains(&action), "{html}");
    let refused = client
        .post(app.url(&action))
        .form(&[("csrf", "forged")])
        .send()
        .await
        .expect("answer");
    assert_eq!(refused.status(), 403, "no resend without the CSRF token");
    let other_app = client
        .post(app.url(&format!(
            "/dashboard/app/{other}/msg/{msg}/endpoint/{ep_id}/resend"
        )))
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .expect("answer");
    assert_eq!(other_app.status(), 404);
    let resend = || async {
        client
            .post(app.url(&action))
            .form(&[("csrf", csrf.as_str())])
            .send()
            .await
            .expect("answer")
            .status()
    };
    assert_eq!(resend().await, 303);
    deliver_until(&app, &rx, 3).await;
    let arrivals = rx.requests();
    assert_eq!(arrivals.len(), 3, "exactly one more request");
    assert_eq!(arrivals[2].header("webhook-id"), msg);
    let attempts = app.attempts_of_msg(&acme, &msg).await;
    assert_eq!(attempts.len(), 3);
    assert_eq!(attempts[2]["triggerType"], 1, "a manual attempt");
    let (_, html) = get_page(&client, &app, &format!("/dashboard/app/{acme}/msg/{msg}")).await;
    assert!(html.contains("Resent"), "the flash says so");
    assert!(html.contains("manual"));

    // Audited as the dashboard session.
    let (status, log) = app.get("/api/v1/audit-log?action=message.resent").await;
    assert_eq!(status, StatusCode::OK, "{log}");
    let entries = log["data"].as_array().expect("entries");
    assert_eq!(entries.len(), 1, "{log}");
    assert_eq!(entries[0]["actorKind"], "dashboard", "{log}");
    assert_eq!(entries[0]["target"], Value::String(msg.clone()), "{log}");

    // To a disabled endpoint a resend is held, and the flash and the table
    // say so (they said "one more attempt is queued now" and showed a
    // next attempt long past).
    app.disable_endpoint(&acme, &ep_id, json!({})).await;
    assert_eq!(resend().await, 303);
    let (_, html) = get_page(&client, &app, &format!("/dashboard/app/{acme}/msg/{msg}")).await;
    assert!(
        html.contains("Resent, but held: the endpoint is disabled"),
        "{html}"
    );
    assert!(html.contains("until the endpoint is enabled"), "{html}");

    // Its endpoint deleted, the attempts stay, named but no longer linked
    // to a page that is gone.
    let (status, _) = app
        .delete(&format!("/api/v1/app/{acme}/endpoint/{ep_id}"))
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, html) = get_page(&client, &app, &format!("/dashboard/app/{acme}/msg/{msg}")).await;
    assert_eq!(status, 200, "{html}");
    assert!(html.contains("(deleted)"), "{html}");
    assert!(
        !html.contains(&format!("/dashboard/app/{acme}/endpoint/{ep_id}\"")),
        "no link to the deleted endpoint: {html}"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn applications_lead_to_their_endpoints_and_messages() {
    let TwoApps {
        app,
        rx,
        acme,
        acme_ep: ep_id,
        other: initech,
    } = two_apps("Acme Shop", "/acme/hooks", ("Initech", "initech")).await;
    app.create_endpoint(&initech, &rx.url("/initech/hooks"), json!({}))
        .await;
    let client = logged_in(&app).await;

    let (status, html) = get_page(&client, &app, "/dashboard/apps").await;
    assert_eq!(status, 200);
    assert!(html.contains("Acme Shop") && html.contains("Initech"));
    assert!(
        html.contains(r#"href="/dashboard/apps""#),
        "in the navigation"
    );
    assert!(
        html.contains(r#"href="/dashboard/messages""#),
        "in the navigation"
    );
    for q in ["acme", "ACME", "Shop", &acme] {
        let (status, html) = get_page(&client, &app, &format!("/dashboard/apps?q={q}")).await;
        assert_eq!(status, 200);
        assert!(html.contains(&format!("/dashboard/app/{acme}\"")), "{q}");
        assert!(!html.contains("Initech"), "{q}: {html}");
    }
    let (_, html) = get_page(&client, &app, "/dashboard/apps?q=globex").await;
    assert!(html.contains("No application matches"));

    for key in [acme.as_str(), "acme"] {
        let (status, html) = get_page(&client, &app, &format!("/dashboard/app/{key}")).await;
        assert_eq!(status, 200, "{html}");
        assert!(html.contains(&format!("/dashboard/app/{acme}/endpoint/{ep_id}")));
        assert!(html.contains("/acme/hooks"));
        assert!(!html.contains("/initech/hooks"), "only its own endpoints");
        assert!(html.contains(&format!("/dashboard/messages?app={acme}")));
    }
    let (status, _) = get_page(&client, &app, "/dashboard/app/nobody").await;
    assert_eq!(status, 404);
    app.shutdown().await;
}

/// `name`'s value in a Prometheus text (no labels).
fn gauge(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
}

#[tokio::test]
async fn overview_and_metrics_count_held_deliveries_apart_from_due_ones() {
    let app = spawn_stepped(&[]).await;
    let rx = Receiver::start().await;
    let acme = new_app(&app, "Acme", "acme").await;
    app.create_endpoint(&acme, &rx.url("/open"), json!({}))
        .await;
    let paused = app
        .create_endpoint(&acme, &rx.url("/paused"), json!({}))
        .await;
    for i in 0..3 {
        send(&app, &acme, "invoice.paid", Some(&format!("inv-{i}"))).await;
    }
    app.disable_endpoint(
        &acme,
        paused["id"].as_str().expect("id"),
        json!({"reason": "receiver migrating"}),
    )
    .await;

    let card = |html: &str, label: &str| -> String {
        let at = html
            .find(&format!(r#"<div class="label">{label}</div>"#))
            .unwrap_or_else(|| panic!("no {label} card in {html}"));
        let rest = &html[at..];
        let start =
            rest.find(r#"<div class="value">"#).expect("value") + r#"<div class="value">"#.len();
        rest[start..start + rest[start..].find('<').expect("end")].to_owned()
    };
    let client = logged_in(&app).await;
    let (_, html) = get_page(&client, &app, "/dashboard").await;
    assert_eq!(card(&html, "Due now"), "3", "the open endpoint's three");
    assert_eq!(card(&html, "Held"), "3", "the disabled endpoint's three");
    assert_eq!(card(&html, "Pending"), "6");
    let metrics = app.metrics_text().await;
    assert_eq!(gauge(&metrics, "herald_due_backlog"), 3.0, "{metrics}");
    assert_eq!(gauge(&metrics, "herald_deliveries_held"), 3.0, "{metrics}");

    // Once the open endpoint's are delivered, nothing is due: the held
    // ones do not look like a stuck queue.
    deliver_until(&app, &rx, 3).await;
    app.step().await;
    let (_, html) = get_page(&client, &app, "/dashboard").await;
    assert_eq!(card(&html, "Due now"), "0");
    assert_eq!(card(&html, "Oldest due"), "–");
    assert_eq!(card(&html, "Held"), "3");
    let metrics = app.metrics_text().await;
    assert_eq!(gauge(&metrics, "herald_due_backlog"), 0.0, "{metrics}");
    assert_eq!(
        gauge(&metrics, "herald_oldest_due_age_seconds"),
        0.0,
        "{metrics}"
    );
    assert_eq!(gauge(&metrics, "herald_deliveries_held"), 3.0, "{metrics}");
    assert_eq!(
        rx.requests().len(),
        3,
        "nothing went to the disabled endpoint"
    );
    app.shutdown().await;
}

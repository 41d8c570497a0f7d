//! Every portal route scoped to the session's application, and event
//! types hidden by feature flags.

use reqwest::StatusCode;
use serde_json::json;

use super::*;
use crate::on_both_stores;

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
    let csrf = session_csrf(&app, &cookie).await;
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
        app.create_event_type(json!({"name": name, "featureFlags": flags}))
            .await;
    }
    let (app_id, ep) = app
        .app_with_endpoint("http://127.0.0.1:9/hook", json!({}))
        .await;
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
            // The cursors name only types the caller sees.
            for cursor in ["iterator", "prevIterator"] {
                let named = page[cursor].as_str().unwrap_or_default();
                let named = named.trim_start_matches('-');
                assert!(
                    named.is_empty() || seen.contains(&named),
                    "{who}: {cursor} names {named}: {page}"
                );
            }
            if page["done"] == json!(true) {
                break;
            }
            let it = page["iterator"].as_str().expect("iterator");
            path = format!("/api/v1/event-type?limit=1&iterator={it}");
        }
        assert_eq!(names, *seen, "{who}");
        // And back from the last one seen, past the hidden ones again.
        let mut back = Vec::new();
        let mut path = format!(
            "/api/v1/event-type?limit=1&iterator=-{}",
            seen[seen.len() - 1]
        );
        for _ in 0..10 {
            let (s, page) = app.as_token(token).get(&path).await;
            assert_eq!(s, StatusCode::OK, "{who}: {page}");
            let data = page["data"].as_array().expect("data");
            for e in data.iter().rev() {
                back.insert(0, e["name"].as_str().expect("name").to_owned());
            }
            let Some(prev) = page["prevIterator"].as_str().filter(|_| !data.is_empty()) else {
                break;
            };
            if page["done"] == json!(true) {
                break;
            }
            path = format!("/api/v1/event-type?limit=1&iterator={prev}");
        }
        assert_eq!(back, seen[..seen.len() - 1], "{who}, backwards");
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
            // Nor can a hidden type be sent as an example (its schema's
            // example is as hidden as the type); a seen one without an
            // example is refused otherwise.
            let (s, out) = app
                .as_token(token)
                .post(
                    &format!("/api/v1/app/{app_id}/endpoint/{ep}/send-example"),
                    json!({"eventType": name}),
                )
                .await;
            assert_eq!(
                s == StatusCode::NOT_FOUND,
                !seen.contains(&name),
                "{who} send-example {name}: {s} {out}"
            );
            // A hidden type in an endpoint's filter is as unknown as a
            // type that does not exist: the answer does not tell it exists.
            let filter = json!({"url": "http://127.0.0.1:9/f", "filterTypes": [name]});
            for (how, (s, out)) in [
                (
                    "create",
                    app.as_token(token)
                        .post(&format!("/api/v1/app/{app_id}/endpoint"), filter.clone())
                        .await,
                ),
                (
                    "patch",
                    app.as_token(token)
                        .patch(
                            &format!("/api/v1/app/{app_id}/endpoint/{ep}"),
                            json!({"filterTypes": [name]}),
                        )
                        .await,
                ),
            ] {
                let unknown = s == StatusCode::UNPROCESSABLE_ENTITY
                    && out
                        .to_string()
                        .contains(&format!("unknown event types: {name}"));
                assert_eq!(
                    unknown,
                    !seen.contains(&name),
                    "{who} {how} {name}: {s} {out}"
                );
            }
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

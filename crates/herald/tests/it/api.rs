//! The HTTP API's contract: auth, shapes, and clear errors for bad input.

use axum::http::StatusCode;
use serde_json::json;

use crate::helpers::*;

#[tokio::test]
async fn every_api_route_needs_the_bearer_token() {
    let app = spawn_app(&[]).await;
    let app_id = app.create_app().await;
    for (method, path) in [
        (reqwest::Method::GET, "/api/v1/app".to_owned()),
        (reqwest::Method::POST, "/api/v1/app".to_owned()),
        (reqwest::Method::GET, format!("/api/v1/app/{app_id}")),
        (reqwest::Method::POST, format!("/api/v1/app/{app_id}/msg")),
        (
            reqwest::Method::GET,
            format!("/api/v1/app/{app_id}/dead-letter"),
        ),
        (reqwest::Method::GET, "/api/v1/nonexistent".to_owned()),
    ] {
        for auth in [None, Some("Bearer wrong-token-wrong-token"), Some(TOKEN)] {
            if auth == Some(TOKEN) {
                continue;
            }
            let mut req = app.client.request(method.clone(), app.url(&path));
            if let Some(a) = auth {
                req = req.header("authorization", a);
            }
            let resp = req.send().await.expect("send");
            assert_eq!(resp.status(), 401, "{method} {path} with {auth:?}");
            let body: serde_json::Value = resp.json().await.expect("JSON error body");
            assert_eq!(body["code"], "authentication_failed");
        }
    }
    let resp = app
        .client
        .get(app.url("/healthz"))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 200, "healthz needs no token");
    app.shutdown().await;
}

#[tokio::test]
async fn applications_and_endpoints_have_svix_shapes() {
    let app = spawn_app(&[]).await;
    let (s, a) = app
        .post(
            "/api/v1/app",
            json!({"name": "Acme", "uid": "acme", "metadata": {"tier": "gold"}}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let id = a["id"].as_str().expect("id");
    assert!(id.starts_with("app_"));
    assert_eq!(a["uid"], "acme");
    assert_eq!(a["metadata"], json!({"tier": "gold"}));
    assert!(a["createdAt"].as_str().expect("createdAt").ends_with('Z'));
    assert!(a["updatedAt"].is_string());

    // uid works wherever an id does; trailing slashes are optional.
    let (s, by_uid) = app.get("/api/v1/app/acme/").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(by_uid["id"], id);
    let (s, _) = app
        .post("/api/v1/app", json!({"name": "Again", "uid": "acme"}))
        .await;
    assert_eq!(s, StatusCode::CONFLICT);
    let (s, same) = app
        .post(
            "/api/v1/app?get_if_exists=true",
            json!({"name": "Again", "uid": "acme"}),
        )
        .await;
    assert_eq!((s, same["id"].clone()), (StatusCode::OK, json!(id)));

    let (s, list) = app.get("/api/v1/app").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(list["data"].as_array().expect("data").len(), 1);
    assert_eq!(list["done"], true);
    assert!(list.as_object().expect("object").contains_key("iterator"));
    assert!(list
        .as_object()
        .expect("object")
        .contains_key("prevIterator"));

    let ep = app
        .create_endpoint(
            id,
            "https://93.184.215.14/hook",
            json!({"description": "main", "metadata": {"k": "v"}}),
        )
        .await;
    let ep_id = ep["id"].as_str().expect("id");
    assert!(ep_id.starts_with("ep_"));
    assert_eq!(ep["disabled"], false);
    assert_eq!(ep["description"], "main");
    assert!(ep["filterTypes"].is_null());

    app.create_event_types(&["a.b"]).await;
    let (s, patched) = app
        .patch(
            &format!("/api/v1/app/{id}/endpoint/{ep_id}"),
            json!({"disabled": true, "filterTypes": ["a.b"]}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{patched}");
    assert_eq!(patched["disabled"], true);
    assert_eq!(
        patched["description"], "main",
        "PATCH keeps what it does not name"
    );
    assert_eq!(patched["eventTypes"], json!(["a.b"]));

    let (s, put) = app
        .put(
            &format!("/api/v1/app/{id}/endpoint/{ep_id}"),
            json!({"url": "https://93.184.215.14/v2"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{put}");
    assert_eq!(put["url"], "https://93.184.215.14/v2");
    assert_eq!(put["description"], "", "PUT replaces the whole endpoint");
    assert_eq!(put["disabled"], true, "but the flag only when it is given");
    assert!(put["filterTypes"].is_null());
    let (s, put) = app
        .put(
            &format!("/api/v1/app/{id}/endpoint/{ep_id}"),
            json!({"url": "https://93.184.215.14/v2", "disabled": false}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{put}");
    assert_eq!(put["disabled"], false);

    let (s, _) = app
        .delete(&format!("/api/v1/app/{id}/endpoint/{ep_id}"))
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _) = app.get(&format!("/api/v1/app/{id}/endpoint/{ep_id}")).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    app.shutdown().await;
}

#[tokio::test]
async fn bad_input_gets_clear_4xx_errors_naming_the_problem() {
    let app = spawn_app(&[]).await;
    let app_id = app.create_app().await;
    let msg_path = format!("/api/v1/app/{app_id}/msg");

    let raw = |path: String, body: &'static str| {
        let req = app
            .client
            .post(app.url(&path))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .body(body);
        async move {
            let resp = req.send().await.expect("send");
            let status = resp.status().as_u16();
            let body: serde_json::Value = resp.json().await.expect("every error body is JSON");
            (status, body)
        }
    };
    let (s, b) = raw(msg_path.clone(), "{not json").await;
    assert_eq!(s, 400, "{b}");
    assert_eq!(b["code"], "bad_request");

    // A route that exists, with a method it does not take: a JSON error as
    // every other (the SDKs parse it), with axum's `Allow` header kept.
    let resp = app
        .client
        .delete(app.url("/api/v1/app"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status().as_u16(), 405);
    let allow = resp
        .headers()
        .get("allow")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    assert!(
        allow
            .as_deref()
            .is_some_and(|a| a.contains("GET") && a.contains("POST")),
        "{allow:?}"
    );
    let b: serde_json::Value = resp.json().await.expect("a 405 body is JSON");
    assert_eq!(b["code"], "method_not_allowed", "{b}");

    let (s, b) = raw(msg_path.clone(), r#"{"payload": {}}"#).await;
    assert_eq!(s, 422, "{b}");
    assert!(
        b["detail"][0]["msg"]
            .as_str()
            .expect("msg")
            .contains("eventType"),
        "{b}"
    );

    let (s, b) = raw(msg_path.clone(), r#"{"eventType": 5, "payload": {}}"#).await;
    assert_eq!(s, 422, "{b}");
    assert_eq!(b["detail"][0]["loc"], json!(["body", "eventType"]));

    let (s, b) = raw(
        msg_path.clone(),
        r#"{"eventType": "bad type!", "payload": {}}"#,
    )
    .await;
    assert_eq!(s, 422, "{b}");
    assert_eq!(b["detail"][0]["loc"], json!(["body", "eventType"]));

    let (s, b) = raw(
        format!("/api/v1/app/{app_id}/endpoint"),
        r#"{"url": "ftp://example.com/"}"#,
    )
    .await;
    assert_eq!(s, 422, "{b}");
    assert_eq!(b["detail"][0]["loc"], json!(["body", "url"]));
    let (s, _) = raw(
        format!("/api/v1/app/{app_id}/endpoint"),
        r#"{"url": "not a url"}"#,
    )
    .await;
    assert_eq!(s, 422);
    let (s, b) = raw(
        format!("/api/v1/app/{app_id}/endpoint"),
        r#"{"url": "http://127.0.0.1/", "secret": "nope"}"#,
    )
    .await;
    assert_eq!(s, 422);
    assert_eq!(b["detail"][0]["loc"], json!(["body", "secret"]));
    let (s, b) = raw(
        format!("/api/v1/app/{app_id}/endpoint"),
        r#"{"url": "http://127.0.0.1/", "filterTypes": []}"#,
    )
    .await;
    assert_eq!(s, 422);
    assert_eq!(b["detail"][0]["loc"], json!(["body", "filterTypes"]));
    let (s, _) = raw("/api/v1/app".into(), r#"{"name": ""}"#).await;
    assert_eq!(s, 422);

    let (s, b) = raw(
        "/api/v1/app/app_nope/msg".into(),
        r#"{"eventType": "a", "payload": {}}"#,
    )
    .await;
    assert_eq!((s, b["code"].clone()), (404, json!("not_found")));
    let (s, _) = app.get(&format!("/api/v1/app/{app_id}/msg/msg_nope")).await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    let (s, b) = app.get("/api/v1/app?limit=0").await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(b["detail"][0]["loc"], json!(["query", "limit"]));
    let (s, _) = app.get("/api/v1/app?limit=abc").await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    let (s, _) = app
        .get("/api/v1/app?with_content=false&expanded_statuses=true")
        .await;
    assert_eq!(s, StatusCode::OK, "unknown query parameters are ignored");

    // A payload over 1 MiB: 413, and nothing stored.
    let big = format!(
        r#"{{"eventType": "a.b", "payload": {{"x": "{}"}}}}"#,
        "y".repeat(1024 * 1024)
    );
    let resp = app
        .client
        .post(app.url(&msg_path))
        .bearer_auth(TOKEN)
        .body(big)
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 413);
    let b: serde_json::Value = resp.json().await.expect("JSON");
    assert_eq!(b["code"], "payload_too_large");
    let huge = format!(
        r#"{{"eventType": "a.b", "payload": {{"x": "{}"}}}}"#,
        "y".repeat(2 * 1024 * 1024)
    );
    let resp = app
        .client
        .post(app.url(&msg_path))
        .bearer_auth(TOKEN)
        .body(huge)
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 413);
    app.shutdown().await;
}

#[tokio::test]
async fn a_repeated_event_id_is_a_conflict_and_stores_nothing_new() {
    let app = spawn_stepped(&[]).await;
    let rx = Receiver::start().await;
    let (app_id, _) = app.app_with_endpoint(&rx.url("/"), json!({})).await;
    let body = json!({"eventType": "a.b", "eventId": "order-42", "payload": {"n": 1}});
    let (s, first) = app
        .post(&format!("/api/v1/app/{app_id}/msg"), body.clone())
        .await;
    assert_eq!(s, StatusCode::ACCEPTED);
    assert_eq!(first["eventId"], "order-42");
    let (s, second) = app.post(&format!("/api/v1/app/{app_id}/msg"), body).await;
    assert_eq!(s, StatusCode::CONFLICT, "{second}");
    assert_eq!(second["code"], "conflict");
    // The same eventId in another app is fine.
    let other = app.create_app().await;
    let (s, _) = app
        .post(
            &format!("/api/v1/app/{other}/msg"),
            json!({"eventType": "a.b", "eventId": "order-42", "payload": {}}),
        )
        .await;
    assert_eq!(s, StatusCode::ACCEPTED);
    // Get by eventId too.
    let (s, got) = app.get(&format!("/api/v1/app/{app_id}/msg/order-42")).await;
    assert_eq!(
        (s, got["id"].clone()),
        (StatusCode::OK, first["id"].clone())
    );
    assert_eq!(
        app.step().await.delivered,
        1,
        "one delivery for the one stored message"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn sdk_headers_do_not_break_anything() {
    let app = spawn_app(&[]).await;
    let resp = app
        .client
        .post(app.url("/api/v1/app/"))
        .bearer_auth(TOKEN)
        .header(
            "idempotency-key",
            "auto_6f1c5a2e-2c54-4d0e-9a59-3a1f0b3f7a11",
        )
        .header("svix-req-id", "12345")
        .json(&json!({"name": "sdk"}))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 201);
    app.shutdown().await;
}

#[tokio::test]
async fn many_concurrent_messages_are_all_stored_in_group_commits() {
    let app = spawn_stepped(&[]).await;
    let rx = Receiver::start().await;
    let (app_id, _) = app.app_with_endpoint(&rx.url("/"), json!({})).await;
    let app = std::sync::Arc::new(app);
    let mut tasks = Vec::new();
    for i in 0..200 {
        let (app, app_id) = (app.clone(), app_id.clone());
        tasks.push(tokio::spawn(async move {
            app.send_message(&app_id, "a.b", json!({ "i": i })).await
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.expect("task"));
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 200);
    let mut delivered = 0;
    for _ in 0..50 {
        delivered += app.step().await.delivered;
        if delivered == 200 {
            break;
        }
    }
    assert_eq!(delivered, 200);
    assert_eq!(rx.requests().len(), 200);
}

#[tokio::test]
async fn event_types_are_a_catalogue_that_endpoint_filters_must_name() {
    let app = spawn_stepped(&[]).await;
    let et = app
        .create_event_type(json!({"name": "order.created", "description": "An order",
            "schemas": {"1": {"type": "object"}}, "featureFlags": ["beta"]}))
        .await;
    assert_eq!(et["name"], "order.created");
    assert_eq!(et["deprecated"], false);
    assert_eq!(et["featureFlags"], json!(["beta"]));
    assert_eq!(et["schemas"]["1"]["type"], "object");
    let (s, dup) = app
        .post("/api/v1/event-type", json!({"name": "order.created"}))
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{dup}");
    let (s, bad) = app
        .post("/api/v1/event-type", json!({"name": "no spaces"}))
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
    assert_eq!(bad["detail"][0]["loc"], json!(["body", "name"]));
    let (s, bad) = app
        .post("/api/v1/event-type", json!({"name": "x", "schemas": [1]}))
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{bad}");

    // PUT creates (201) then replaces (200); PATCH keeps what it does not name.
    let (s, _) = app
        .put(
            "/api/v1/event-type/order.paid",
            json!({"description": "paid"}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, put) = app
        .put(
            "/api/v1/event-type/order.paid",
            json!({"description": "paid!", "deprecated": true}),
        )
        .await;
    assert_eq!(
        (s, put["deprecated"].clone()),
        (StatusCode::OK, json!(true))
    );
    let (s, patched) = app
        .patch(
            "/api/v1/event-type/order.paid",
            json!({"groupName": "orders"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{patched}");
    assert_eq!(
        (patched["description"].clone(), patched["groupName"].clone()),
        (json!("paid!"), json!("orders"))
    );

    // Filters must name existing event types.
    let app_id = app.create_app().await;
    let (s, bad) = app
        .post(
            &format!("/api/v1/app/{app_id}/endpoint"),
            json!({"url": "https://93.184.215.14/", "filterTypes": ["order.created", "order.shipped"]}),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
    assert_eq!(bad["detail"][0]["loc"], json!(["body", "filterTypes"]));
    assert!(
        bad["detail"][0]["msg"]
            .as_str()
            .is_some_and(|m| m.contains("order.shipped")),
        "{bad}"
    );
    app.create_endpoint(
        &app_id,
        "https://93.184.215.14/",
        json!({"filterTypes": ["order.created", "order.paid"]}),
    )
    .await;

    // DELETE archives: hidden from the list unless asked for.
    let (s, _) = app.delete("/api/v1/event-type/order.paid").await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (_, list) = app.get("/api/v1/event-type").await;
    assert_eq!(list["data"].as_array().map(Vec::len), Some(1));
    let (_, list) = app.get("/api/v1/event-type?include_archived=true").await;
    assert_eq!(list["data"].as_array().map(Vec::len), Some(2));
    assert_eq!(list["data"][1]["archived"], true);
    let (s, _) = app
        .delete("/api/v1/event-type/order.paid?expunge=true")
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _) = app.get("/api/v1/event-type/order.paid").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = app.get("/api/v1/event-type?include_archived=maybe").await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    app.shutdown().await;
}

#[tokio::test]
async fn applications_upsert_patch_and_delete_with_everything_under_them() {
    let app = spawn_stepped(&[]).await;
    let (s, created) = app
        .put("/api/v1/app/billing", json!({"name": "Billing"}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{created}");
    assert_eq!(created["uid"], "billing");
    let id = created["id"].as_str().expect("id").to_owned();
    // Repeated as an SDK retries it: the same application, its uid kept
    // (not cleared by a body that names none, which made the next repeat
    // create a second application).
    for _ in 0..2 {
        let (s, again) = app
            .put("/api/v1/app/billing", json!({"name": "Billing"}))
            .await;
        assert_eq!(s, StatusCode::OK, "{again}");
        assert_eq!(
            (again["id"].clone(), again["uid"].clone()),
            (json!(id), json!("billing"))
        );
    }
    let (_, listed) = app.get("/api/v1/app?limit=250").await;
    let billing = listed["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter(|a| a["name"] == "Billing");
    assert_eq!(billing.count(), 1, "{listed}");
    let rx = Receiver::start().await;
    let hook = |u: &str| json!({"url": u});
    let (s, ep) = app
        .put("/api/v1/app/billing/endpoint/hook", hook(&rx.url("/")))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{ep}");
    for _ in 0..2 {
        let (s, again) = app
            .put("/api/v1/app/billing/endpoint/hook", hook(&rx.url("/")))
            .await;
        assert_eq!(s, StatusCode::OK, "{again}");
        assert_eq!(
            (again["id"].clone(), again["uid"].clone()),
            (ep["id"].clone(), json!("hook"))
        );
    }
    let (_, endpoints) = app.get("/api/v1/app/billing/endpoint").await;
    assert_eq!(
        endpoints["data"].as_array().map(Vec::len),
        Some(1),
        "{endpoints}"
    );
    let (s, _) = app.delete("/api/v1/app/billing/endpoint/hook").await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, replaced) = app
        .put(
            "/api/v1/app/billing",
            json!({"name": "Billing 2", "uid": "billing", "metadata": {"team": "a"}}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{replaced}");
    assert_eq!(
        (replaced["id"].clone(), replaced["name"].clone()),
        (json!(id), json!("Billing 2"))
    );
    let (s, _) = app
        .put(
            "/api/v1/app/app_01ARZ3NDEKTSV4RRFFQ69G5FAV",
            json!({"name": "x"}),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "an app id cannot be chosen");

    let (s, patched) = app
        .patch(&format!("/api/v1/app/{id}"), json!({"uid": "invoicing"}))
        .await;
    assert_eq!(s, StatusCode::OK, "{patched}");
    assert_eq!(
        (
            patched["uid"].clone(),
            patched["name"].clone(),
            patched["metadata"]["team"].clone()
        ),
        (json!("invoicing"), json!("Billing 2"), json!("a"))
    );
    let (s, _) = app.get("/api/v1/app/billing").await;
    assert_eq!(s, StatusCode::NOT_FOUND, "the old uid is free again");
    let other = app.create_app().await;
    let (s, _) = app
        .patch(&format!("/api/v1/app/{other}"), json!({"uid": "invoicing"}))
        .await;
    assert_eq!(s, StatusCode::CONFLICT);
    let (s, bad) = app
        .patch(&format!("/api/v1/app/{id}"), json!({"name": ""}))
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{bad}");

    app.create_endpoint("invoicing", &rx.url("/"), json!({}))
        .await;
    let msg = app.send_message("invoicing", "a.b", json!({})).await;
    let (s, _) = app.delete("/api/v1/app/invoicing").await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    for path in [
        format!("/api/v1/app/{id}"),
        format!("/api/v1/app/{id}/msg/{msg}"),
        format!("/api/v1/app/{id}/endpoint"),
    ] {
        let (s, _) = app.get(&path).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{path}");
    }
    let (s, _) = app
        .post(
            "/api/v1/app/invoicing/msg",
            json!({"eventType": "a.b", "payload": {}}),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "the uid is no longer cached");
    assert_eq!(app.step().await.claimed, 0, "its deliveries went with it");

    // Deleted behind this process's back (as by another API process): the
    // cached id is refused by the store, answered 404, never 500.
    let third = app.create_app().await;
    app.send_message(&third, "a.b", json!({})).await;
    let app_id = herald::ids::AppId::parse(&third).expect("id");
    assert!(app
        .running()
        .store
        .delete_app(&app_id)
        .await
        .expect("delete"));
    let (s, out) = app
        .post(
            &format!("/api/v1/app/{third}/msg"),
            json!({"eventType": "a.b", "payload": {}}),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{out}");
    app.shutdown().await;
}

crate::on_both_stores!(
    a_message_the_store_refuses_fails_no_other_of_its_batch,
    attempt_and_endpoint_message_lists_take_svix_filters
);

/// The filters Svix's SDKs send on the attempt lists and an endpoint's
/// message list (`event_types`, `channel`, `tag`, `before`, `after`,
/// `status`, and by message `endpoint_id`) narrow what they answer.
async fn attempt_and_endpoint_message_lists_take_svix_filters(backend: &Backend) {
    let app = backend.spawn_stepped(&[]).await;
    let rx = Receiver::start().await;
    let app_id = app.create_app().await;
    let a = app
        .create_endpoint(&app_id, &rx.url("/a"), json!({"uid": "first"}))
        .await;
    let b = app.create_endpoint(&app_id, &rx.url("/b"), json!({})).await;
    let (a, b) = (a["id"].as_str().expect("id"), b["id"].as_str().expect("id"));
    let (s, out) = app
        .post(
            &format!("/api/v1/app/{app_id}/msg"),
            json!({"eventType": "order.paid", "payload": {}, "channels": ["eu"], "tags": ["vip"]}),
        )
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{out}");
    let paid = out["id"].as_str().expect("id").to_owned();
    let shipped = app.send_message(&app_id, "order.shipped", json!({})).await;
    app.step().await;
    rx.wait_for(4).await;

    let ids = |v: &serde_json::Value, field: &str| -> Vec<String> {
        let mut ids: Vec<String> = v["data"]
            .as_array()
            .unwrap_or_else(|| panic!("{v}"))
            .iter()
            .map(|x| x[field].as_str().expect("field").to_owned())
            .collect();
        ids.sort();
        ids
    };
    let by_msg = format!("/api/v1/app/{app_id}/attempt/msg/{paid}");
    let by_ep = format!("/api/v1/app/{app_id}/attempt/endpoint/{a}");
    let ep_msgs = format!("/api/v1/app/{app_id}/endpoint/{a}/msg");
    let mut both = vec![paid.clone(), shipped.clone()];
    both.sort();
    let past = "2000-01-01T00:00:00Z";
    for (query, field, expected) in [
        (
            format!("{by_msg}?endpoint_id={a}"),
            "endpointId",
            vec![a.to_owned()],
        ),
        (
            format!("{by_msg}?endpoint_id=first"),
            "endpointId",
            vec![a.to_owned()],
        ),
        (format!("{by_msg}?endpoint_id=nobody"), "endpointId", vec![]),
        (by_msg.clone(), "endpointId", {
            let mut v = vec![a.to_owned(), b.to_owned()];
            v.sort();
            v
        }),
        (
            format!("{by_ep}?event_types=order.shipped"),
            "msgId",
            vec![shipped.clone()],
        ),
        (
            format!("{by_ep}?event_types=order.paid,order.shipped"),
            "msgId",
            both.clone(),
        ),
        // Repeated, as Svix's description has clients send a list.
        (
            format!("{by_ep}?event_types=order.paid&limit=50&event_types=order.shipped"),
            "msgId",
            both.clone(),
        ),
        (
            format!("/api/v1/app/{app_id}/msg?event_types=order.shipped&event_types=nothing.else"),
            "id",
            vec![shipped.clone()],
        ),
        (format!("{by_ep}?channel=eu"), "msgId", vec![paid.clone()]),
        (format!("{by_ep}?tag=vip"), "msgId", vec![paid.clone()]),
        (format!("{by_ep}?before={past}"), "msgId", vec![]),
        (format!("{by_ep}?after={past}"), "msgId", both.clone()),
        (
            format!("{ep_msgs}?event_types=order.shipped"),
            "id",
            vec![shipped.clone()],
        ),
        (
            format!("{ep_msgs}?channel=eu&status=0"),
            "id",
            vec![paid.clone()],
        ),
        (format!("{ep_msgs}?status=1"), "id", vec![]),
        (format!("{ep_msgs}?before={past}"), "id", vec![]),
        (
            format!("{ep_msgs}?after={past}&tag=vip"),
            "id",
            vec![paid.clone()],
        ),
    ] {
        let (s, page) = app.get(&query).await;
        assert_eq!(s, StatusCode::OK, "{query}: {page}");
        assert_eq!(ids(&page, field), expected, "{query}");
    }
    for (query, names) in [
        (format!("{ep_msgs}?status=9"), "status"),
        (format!("{by_ep}?before=yesterday"), "before"),
        (
            format!("{by_msg}?endpoint_id=nobody&before=yesterday"),
            "before",
        ),
    ] {
        let (s, body) = app.get(&query).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{query}: {body}");
        assert_eq!(body["detail"][0]["loc"][1], names, "{body}");
    }
    app.shutdown().await;
}

/// Messages of concurrent requests share one transaction. One the store
/// refuses (here a NUL in its payload, which PostgreSQL's text cannot
/// hold; the API refuses it before, but whatever else a database may
/// refuse) fails alone: the others of its batch are stored and answered
/// as such. (SQLite holds the NUL.)
async fn a_message_the_store_refuses_fails_no_other_of_its_batch(backend: &Backend) {
    use herald::store::{InsertOutcome, NewMessage};
    let app = backend.spawn_stepped(&[]).await;
    let app_id = herald::ids::AppId::parse(&app.create_app().await).expect("id");
    let running = app.running();
    let ingest = herald::ingest::Ingest::start(
        running.store.clone(),
        std::sync::Arc::new(tokio::sync::Notify::new()),
        running.dispatcher.clone(),
    );
    const REFUSED: usize = 5;
    let messages: Vec<NewMessage> = (0..11)
        .map(|i| {
            let payload = if i == REFUSED { "\"a\u{0}b\"" } else { "{}" };
            NewMessage::plain(
                &app_id,
                "a.b",
                payload.into(),
                1_000 + i64::try_from(i).expect("small"),
            )
        })
        .collect();
    // Submitted together: they share a batch (or a few).
    let answers =
        futures::future::join_all(messages.iter().map(|m| ingest.submit(m.clone()))).await;
    for (i, answer) in answers.iter().enumerate() {
        if i != REFUSED {
            assert!(
                matches!(answer, Ok(InsertOutcome::Inserted { .. })),
                "message {i}: {answer:?}"
            );
        }
    }
    for (i, m) in messages.iter().enumerate().filter(|(i, _)| *i != REFUSED) {
        let (status, read) = app.get(&format!("/api/v1/app/{app_id}/msg/{}", m.id)).await;
        assert_eq!(status, StatusCode::OK, "message {i} is stored: {read}");
    }
    app.shutdown().await;
}

#[tokio::test]
async fn lists_page_forward_with_iterator_and_back_with_prev_iterator() {
    let app = spawn_stepped(&[]).await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(app.create_app().await);
    }
    let names = |v: &serde_json::Value| {
        v["data"]
            .as_array()
            .expect("data")
            .iter()
            .map(|a| a["id"].as_str().expect("id").to_owned())
            .collect::<Vec<_>>()
    };
    let (_, p1) = app.get("/api/v1/app?limit=2").await;
    assert_eq!(names(&p1), ids[0..2]);
    assert_eq!(p1["done"], false);
    let it = p1["iterator"].as_str().expect("iterator");
    let (_, p2) = app.get(&format!("/api/v1/app?limit=2&iterator={it}")).await;
    assert_eq!(names(&p2), ids[2..4]);
    let prev = p2["prevIterator"].as_str().expect("prevIterator");
    assert!(prev.starts_with('-'), "{prev}");
    let (_, back) = app
        .get(&format!("/api/v1/app?limit=2&iterator={prev}"))
        .await;
    assert_eq!(
        names(&back),
        ids[0..2],
        "the page before, in the same order"
    );
    let (_, desc) = app
        .get(&format!(
            "/api/v1/app?limit=2&order=descending&iterator=-{}",
            ids[1]
        ))
        .await;
    assert_eq!(names(&desc), vec![ids[3].clone(), ids[2].clone()]);
    let (_, last) = app
        .get(&format!("/api/v1/app?limit=2&iterator={}", ids[3]))
        .await;
    assert_eq!(
        (names(&last), last["done"].clone()),
        (ids[4..].to_vec(), json!(true))
    );

    // The endpoints a message went to, paged in memory, the same way.
    let rx = Receiver::start().await;
    let mut eps = Vec::new();
    for _ in 0..5 {
        let ep = app.create_endpoint(&ids[0], &rx.url("/"), json!({})).await;
        eps.push(ep["id"].as_str().expect("id").to_owned());
    }
    eps.sort();
    let msg = app.send_message(&ids[0], "a.b", json!({})).await;
    let dest = format!("/api/v1/app/{}/msg/{msg}/endpoint?limit=2", ids[0]);
    let (_, p1) = app.get(&format!("{dest}&order=ascending")).await;
    assert_eq!(names(&p1), eps[0..2]);
    let it = p1["iterator"].as_str().expect("iterator");
    let (_, p2) = app
        .get(&format!("{dest}&order=ascending&iterator={it}"))
        .await;
    assert_eq!(names(&p2), eps[2..4]);
    let prev = p2["prevIterator"].as_str().expect("prevIterator");
    let (_, back) = app
        .get(&format!("{dest}&order=ascending&iterator={prev}"))
        .await;
    assert_eq!(
        names(&back),
        eps[0..2],
        "the page before, in the same order"
    );
    let (_, desc) = app
        .get(&format!("{dest}&order=descending&iterator=-{}", eps[1]))
        .await;
    assert_eq!(names(&desc), vec![eps[3].clone(), eps[2].clone()]);
    app.shutdown().await;
}

/// An application's token list pages as every list does (`limit`,
/// `order`, `iterator`, `prevIterator`), where it ignored them all and a
/// passed-back iterator gave the same page again.
#[tokio::test]
async fn the_token_list_pages_like_every_list() {
    let app = spawn_stepped(&[]).await;
    let app_id = app.create_app().await;
    let path = format!("/api/v1/app/{app_id}/token");
    let mut ids = Vec::new();
    for name in ["one", "two", "three"] {
        let (status, token) = app.post(&path, json!({"name": name})).await;
        assert_eq!(status, StatusCode::CREATED, "{token}");
        ids.push(token["id"].as_str().expect("id").to_owned());
    }
    ids.sort();
    let listed = |page: &serde_json::Value| -> Vec<String> {
        page["data"]
            .as_array()
            .expect("data")
            .iter()
            .map(|t| t["id"].as_str().expect("id").to_owned())
            .collect()
    };
    let (status, first) = app.get(&format!("{path}?limit=2")).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(listed(&first), ids[..2], "{first}");
    assert_eq!(first["done"], false);
    let iterator = first["iterator"].as_str().expect("iterator");
    let (_, second) = app
        .get(&format!("{path}?limit=2&iterator={iterator}"))
        .await;
    assert_eq!(listed(&second), ids[2..], "{second}");
    assert_eq!(second["done"], true);
    let prev = second["prevIterator"].as_str().expect("prevIterator");
    let (_, back) = app.get(&format!("{path}?limit=2&iterator={prev}")).await;
    assert_eq!(listed(&back), ids[..2], "{back}");
    let (_, newest) = app.get(&format!("{path}?order=descending&limit=1")).await;
    assert_eq!(listed(&newest), ids[2..], "{newest}");
    for bad in ["limit=0", "limit=9999", "order=sideways"] {
        let (status, out) = app.get(&format!("{path}?{bad}")).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {out}");
    }
    app.shutdown().await;
}

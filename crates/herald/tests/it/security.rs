//! Review findings of issue 15, API side, each kept fixed: a held request
//! cannot write into another application, forbidden IPv6 ranges and
//! headers are refused, stored strings are bounded and text, malformed
//! paths and queries answer the API's JSON error, and failed
//! authentications are limited per address.

use axum::http::StatusCode;
use reqwest::Method;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::*;

crate::on_both_stores!(
    a_held_request_writes_only_where_its_headers_pointed,
    a_held_request_fails_when_its_app_is_deleted_and_the_uid_reused,
    stored_strings_are_bounded_and_free_of_control_characters,
    malformed_paths_and_queries_answer_the_apis_json_error,
    an_application_has_at_most_the_configured_number_of_endpoints,
);

/// A request whose headers are sent and whose body is held back. It is
/// made once Herald has begun to read the body (it answers `100 Continue`
/// to `Expect: 100-continue` then), so everything that runs before the
/// handler, the token check included, has run.
struct Held {
    stream: TcpStream,
    body: String,
}

impl Held {
    async fn start(app: &TestApp, token: &str, method: &str, path: &str, body: Value) -> Held {
        let addr = app.base.trim_start_matches("http://").to_owned();
        let body = body.to_string();
        let mut stream = TcpStream::connect(&addr).await.expect("connect to herald");
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\
             Expect: 100-continue\r\nConnection: close\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await.expect("send head");
        let interim = tokio::time::timeout(PATIENCE, read_head(&mut stream))
            .await
            .expect("herald starts reading the body");
        assert!(
            interim.starts_with("HTTP/1.1 100"),
            "{method} {path}: expected 100 Continue, got {interim}"
        );
        Held { stream, body }
    }

    /// Sends the body; the final status and JSON body.
    async fn finish(mut self) -> (StatusCode, Value) {
        self.stream
            .write_all(self.body.as_bytes())
            .await
            .expect("send body");
        let mut raw = Vec::new();
        tokio::time::timeout(PATIENCE, self.stream.read_to_end(&mut raw))
            .await
            .expect("herald answers")
            .expect("read answer");
        let text = String::from_utf8(raw).expect("answer is text");
        let (head, body) = text.split_once("\r\n\r\n").expect("head and body");
        let status: u16 = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .expect("status line");
        let body = if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            dechunk(body)
        } else {
            body.to_owned()
        };
        let value = if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&body).unwrap_or_else(|_| panic!("not JSON: {body}"))
        };
        (StatusCode::from_u16(status).expect("status"), value)
    }
}

/// Reads up to and including the first blank line.
async fn read_head(stream: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        let n = stream.read(&mut byte).await.expect("read");
        assert_eq!(n, 1, "herald closed the connection: {got:?}");
        got.push(byte[0]);
    }
    String::from_utf8(got).expect("head is text")
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).expect("chunk size");
        if size == 0 {
            break;
        }
        out.push_str(&rest[..size]);
        body = &rest[size + 2..];
    }
    out
}

/// An application with this uid; its id.
async fn app_with_uid(app: &TestApp, name: &str, uid: &str) -> String {
    let (s, out) = app
        .post("/api/v1/app", json!({"name": name, "uid": uid}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{out}");
    out["id"].as_str().expect("id").to_owned()
}

async fn app_token(app: &TestApp, app_id: &str) -> String {
    let (s, out) = app
        .post(&format!("/api/v1/app/{app_id}/token"), json!({}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{out}");
    out["token"].as_str().expect("token").to_owned()
}

async fn endpoint_urls(app: &TestApp, app_id: &str) -> Vec<String> {
    let (s, out) = app.get(&format!("/api/v1/app/{app_id}/endpoint")).await;
    assert_eq!(s, StatusCode::OK, "{out}");
    let mut urls: Vec<String> = out["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|e| e["url"].as_str().expect("url").to_owned())
        .collect();
    urls.sort();
    urls
}

async fn message_count(app: &TestApp, app_id: &str) -> usize {
    let (s, out) = app.get(&format!("/api/v1/app/{app_id}/msg")).await;
    assert_eq!(s, StatusCode::OK, "{out}");
    out["data"].as_array().expect("data").len()
}

/// Holding a request's body while the admin moves its uid to another
/// application: every write lands in the application the path named when
/// the headers arrived, for an application token and the admin alike.
async fn held_writes_stay_in_the_app_resolved_at_header_time(app: TestApp) {
    app.create_event_types(&["a.b"]).await;
    let a = app_with_uid(&app, "A", "alpha").await;
    let b = app_with_uid(&app, "B", "beta").await;
    for id in [&a, &b] {
        app.create_endpoint(id, "http://127.0.0.1:9/main", json!({"uid": "main"}))
            .await;
    }
    let token_a = app_token(&app, &a).await;
    let (secret_a, secret_b) = (
        app.endpoint_secret(&a, "main").await,
        app.endpoint_secret(&b, "main").await,
    );

    let held = vec![
        Held::start(
            &app,
            &token_a,
            "POST",
            "/api/v1/app/alpha/endpoint",
            json!({"url": "http://127.0.0.1:9/held-by-token"}),
        )
        .await,
        Held::start(
            &app,
            &token_a,
            "POST",
            "/api/v1/app/alpha/msg",
            json!({"eventType": "a.b", "payload": {"held": true}}),
        )
        .await,
        Held::start(
            &app,
            &token_a,
            "POST",
            "/api/v1/app/alpha/endpoint/main/secret/rotate",
            json!({}),
        )
        .await,
        // The admin's: an application token cannot change its application.
        Held::start(
            &app,
            TOKEN,
            "PATCH",
            "/api/v1/app/alpha",
            json!({"name": "patched through a held request"}),
        )
        .await,
        Held::start(
            &app,
            TOKEN,
            "POST",
            "/api/v1/app/alpha/endpoint",
            json!({"url": "http://127.0.0.1:9/held-by-admin"}),
        )
        .await,
    ];

    // Meanwhile `alpha` comes to name B.
    let (s, out) = app
        .patch(&format!("/api/v1/app/{a}"), json!({"uid": "alpha-old"}))
        .await;
    assert_eq!(s, StatusCode::OK, "{out}");
    let (s, out) = app
        .patch(&format!("/api/v1/app/{b}"), json!({"uid": "alpha"}))
        .await;
    assert_eq!(s, StatusCode::OK, "{out}");

    for h in held {
        let (s, out) = h.finish().await;
        assert!(s.is_success(), "the held write succeeds in A: {s} {out}");
    }

    // B is untouched ...
    assert_eq!(
        endpoint_urls(&app, &b).await,
        vec!["http://127.0.0.1:9/main".to_owned()]
    );
    assert_eq!(message_count(&app, &b).await, 0, "no message sent as B");
    assert_eq!(
        app.endpoint_secret(&b, "main").await,
        secret_b,
        "B's secret kept"
    );
    let (_, b_now) = app.get(&format!("/api/v1/app/{b}")).await;
    assert_eq!(b_now["name"], "B");
    // ... and every write is A's.
    assert_eq!(
        endpoint_urls(&app, &a).await,
        vec![
            "http://127.0.0.1:9/held-by-admin".to_owned(),
            "http://127.0.0.1:9/held-by-token".to_owned(),
            "http://127.0.0.1:9/main".to_owned(),
        ]
    );
    assert_eq!(message_count(&app, &a).await, 1);
    assert_ne!(
        app.endpoint_secret(&a, "main").await,
        secret_a,
        "A's secret rotated"
    );
    let (_, a_now) = app.get(&format!("/api/v1/app/{a}")).await;
    assert_eq!(a_now["name"], "patched through a held request");
    app.shutdown().await;
}

/// The application is deleted while the body is held and another one takes
/// its uid: the held writes fail (404), and nothing lands in the newcomer.
async fn held_writes_fail_when_their_app_is_deleted(app: TestApp) {
    app.create_event_types(&["a.b"]).await;
    let a = app_with_uid(&app, "A", "alpha").await;
    let held = vec![
        Held::start(
            &app,
            TOKEN,
            "POST",
            "/api/v1/app/alpha/endpoint",
            json!({"url": "http://127.0.0.1:9/held"}),
        )
        .await,
        Held::start(
            &app,
            TOKEN,
            "POST",
            "/api/v1/app/alpha/msg",
            json!({"eventType": "a.b", "payload": {}}),
        )
        .await,
        Held::start(
            &app,
            TOKEN,
            "POST",
            "/api/v1/app/alpha/token",
            json!({"name": "x"}),
        )
        .await,
    ];
    let (s, _) = app.delete(&format!("/api/v1/app/{a}")).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let c = app_with_uid(&app, "C", "alpha").await;

    for h in held {
        let (s, out) = h.finish().await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{out}");
        assert_eq!(out["code"], "not_found", "{out}");
    }
    assert!(endpoint_urls(&app, &c).await.is_empty());
    assert_eq!(message_count(&app, &c).await, 0);
    let (_, tokens) = app.get(&format!("/api/v1/app/{c}/token")).await;
    assert_eq!(tokens["data"], json!([]));
    app.shutdown().await;
}

async fn a_held_request_writes_only_where_its_headers_pointed(backend: &Backend) {
    held_writes_stay_in_the_app_resolved_at_header_time(backend.spawn_stepped(&[]).await).await;
}

async fn a_held_request_fails_when_its_app_is_deleted_and_the_uid_reused(backend: &Backend) {
    held_writes_fail_when_their_app_is_deleted(backend.spawn_stepped(&[]).await).await;
}

#[tokio::test]
async fn endpoints_on_ipv4_translated_and_local_nat64_addresses_are_refused() {
    let app = spawn_stepped(&[("HERALD_ALLOW_PRIVATE_NETWORKS", "false")]).await;
    let a = app.create_app().await;
    for url in [
        "http://[::ffff:0:7f00:1]/hook",
        "http://[64:ff9b:1::a9fe:a9fe]/hook",
        "http://[2001::1]/hook",
        "http://[3fff::1]/hook",
    ] {
        let (s, out) = app
            .post(&format!("/api/v1/app/{a}/endpoint"), json!({"url": url}))
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{url}: {out}");
        assert_eq!(out["detail"][0]["loc"], json!(["body", "url"]), "{out}");
    }
    app.shutdown().await;
}

#[tokio::test]
async fn hop_by_hop_and_framing_headers_are_refused_and_headers_are_bounded() {
    let app = spawn_stepped(&[("HERALD_MAX_HEADERS_PER_ENDPOINT", "3")]).await;
    let rx = Receiver::start().await;
    let a = app.create_app().await;
    let ep = app
        .create_endpoint(
            &a,
            &rx.url("/h"),
            json!({"headers": {"Authorization": "Bearer customer-secret"}}),
        )
        .await;
    let ep = ep["id"].as_str().expect("id").to_owned();

    for name in [
        "TE",
        "Upgrade",
        "Expect",
        "Keep-Alive",
        "Proxy-Connection",
        "Proxy-Authorization",
        "Trailer",
        "Content-Encoding",
        "Accept-Encoding",
        "Forwarded",
        "Connection",
        "Transfer-Encoding",
        "Content-Length",
        "Host",
    ] {
        let headers = json!({ (name): "x" });
        let (s, out) = app
            .post(
                &format!("/api/v1/app/{a}/endpoint"),
                json!({"url": rx.url("/x"), "headers": headers}),
            )
            .await;
        assert_eq!(
            s,
            StatusCode::UNPROCESSABLE_ENTITY,
            "create with {name}: {out}"
        );
        assert_eq!(
            out["detail"][0]["loc"],
            json!(["body", "headers", name]),
            "{out}"
        );
        assert!(
            out["detail"][0]["msg"]
                .as_str()
                .expect("msg")
                .contains(name),
            "{out}"
        );
        for method in [Method::PUT, Method::PATCH] {
            let (s, out) = app
                .as_token(TOKEN)
                .request(
                    method.clone(),
                    &format!("/api/v1/app/{a}/endpoint/{ep}/headers"),
                    Some(json!({ "headers": headers })),
                )
                .await;
            assert_eq!(
                s,
                StatusCode::UNPROCESSABLE_ENTITY,
                "{method} {name}: {out}"
            );
            assert_eq!(out["detail"][0]["loc"], json!(["body", "headers", name]));
        }
    }

    // HERALD_MAX_HEADERS_PER_ENDPOINT, and the lengths of names and values.
    let four = json!({"headers": {"a": "1", "b": "2", "c": "3", "d": "4"}});
    let (s, out) = app
        .put(&format!("/api/v1/app/{a}/endpoint/{ep}/headers"), four)
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{out}");
    assert_eq!(out["detail"][0]["loc"], json!(["body", "headers"]));
    let long_name = "x".repeat(257);
    let long_value = "v".repeat(4097);
    for headers in [
        json!({ (long_name.clone()): "1" }),
        json!({ "x-long": long_value }),
    ] {
        let (s, out) = app
            .put(
                &format!("/api/v1/app/{a}/endpoint/{ep}/headers"),
                json!({ "headers": headers }),
            )
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{out}");
        assert_eq!(out["detail"][0]["loc"][1], "headers", "{out}");
    }

    // Credentials stay allowed, and are sent.
    let (s, out) = app
        .patch(
            &format!("/api/v1/app/{a}/endpoint/{ep}/headers"),
            json!({"headers": {"X-Api-Key": "k", "Cookie": "session=1"}}),
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{out}");
    app.send_message(&a, "any.type", json!({})).await;
    app.step().await;
    let got = rx.wait_for(1).await;
    assert_eq!(got[0].header("authorization"), "Bearer customer-secret");
    assert_eq!(got[0].header("x-api-key"), "k");
    app.shutdown().await;
}

/// Header names are case-insensitive: two spellings of one name are
/// refused, and a patch's `authorization` replaces (or `deleteHeaders`'s
/// `AUTHORIZATION` removes) a kept `Authorization`, where both were kept
/// and sent, the receiver reading the old credential first.
#[tokio::test]
async fn custom_header_names_are_one_whatever_their_case() {
    let app = spawn_stepped(&[]).await;
    let rx = Receiver::start().await;
    let a = app.create_app().await;
    let (s, out) = app
        .post(
            &format!("/api/v1/app/{a}/endpoint"),
            json!({"url": rx.url("/x"), "headers": {"Content-Type": "a/b", "content-type": "c/d"}}),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{out}");
    assert_eq!(out["detail"][0]["loc"][1], "headers", "{out}");
    let ep = app
        .create_endpoint(
            &a,
            &rx.url("/h"),
            json!({"headers": {"Authorization": "Bearer OLD"}}),
        )
        .await;
    let headers_path = format!(
        "/api/v1/app/{a}/endpoint/{}/headers",
        ep["id"].as_str().expect("id")
    );
    let (s, out) = app
        .patch(
            &headers_path,
            json!({"headers": {"authorization": "Bearer NEW"}}),
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{out}");
    let (_, kept) = app.get(&headers_path).await;
    assert_eq!(kept["sensitive"], json!(["authorization"]), "{kept}");
    app.send_message(&a, "any.type", json!({})).await;
    app.step().await;
    let got = rx.wait_for(1).await;
    let sent: Vec<_> = got[0].headers.get_all("authorization").iter().collect();
    assert_eq!(sent, ["Bearer NEW"], "one credential, the new one");
    let (s, out) = app
        .patch(
            &headers_path,
            json!({"headers": {}, "deleteHeaders": ["AUTHORIZATION"]}),
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{out}");
    let (_, kept) = app.get(&headers_path).await;
    assert_eq!(kept["sensitive"], json!([]), "{kept}");
    app.shutdown().await;
}

/// A URL's credentials go as Basic authorization, unless the endpoint's
/// own Authorization header says which credential to send: then it alone
/// goes (both were sent).
#[tokio::test]
async fn a_custom_authorization_header_replaces_the_urls_credentials() {
    let app = spawn_stepped(&[]).await;
    let rx = Receiver::start().await;
    let a = app.create_app().await;
    let with_userinfo = rx.url("/basic").replace("http://", "http://hook:pw@");
    app.create_endpoint(&a, &with_userinfo, json!({})).await;
    app.create_endpoint(
        &a,
        &with_userinfo.replace("/basic", "/bearer"),
        json!({"headers": {"authorization": "Bearer T"}}),
    )
    .await;
    app.send_message(&a, "any.type", json!({})).await;
    app.step().await;
    let got = rx.wait_for(2).await;
    for (path, credential) in [("/basic", "Basic aG9vazpwdw=="), ("/bearer", "Bearer T")] {
        let request = got
            .iter()
            .find(|r| r.path == path)
            .unwrap_or_else(|| panic!("{path} received"));
        let sent: Vec<_> = request.headers.get_all("authorization").iter().collect();
        assert_eq!(sent, [credential], "{path}");
    }
    app.shutdown().await;
}

/// Every stored string is bounded and text: a 422 naming the field.
async fn stored_strings_are_bounded_and_text(app: TestApp) {
    app.create_event_types(&["a.b"]).await;
    let a = app_with_uid(&app, "A", "alpha").await;
    let ep = app
        .create_endpoint(&a, "http://127.0.0.1:9/x", json!({}))
        .await;
    let ep = ep["id"].as_str().expect("id").to_owned();
    let huge = "n".repeat(1024 * 1024 - 100);
    let cases: Vec<(Method, String, Value, Value)> = vec![
        (
            Method::POST,
            "/api/v1/app".into(),
            json!({"name": huge}),
            json!(["body", "name"]),
        ),
        (
            Method::POST,
            "/api/v1/app".into(),
            json!({"name": "n".repeat(257)}),
            json!(["body", "name"]),
        ),
        (
            Method::POST,
            "/api/v1/app".into(),
            json!({"name": "nul\u{0}name"}),
            json!(["body", "name"]),
        ),
        (
            Method::POST,
            "/api/v1/app".into(),
            json!({"name": "line\nbreak"}),
            json!(["body", "name"]),
        ),
        (
            Method::PATCH,
            format!("/api/v1/app/{a}"),
            json!({"name": "x\u{0}"}),
            json!(["body", "name"]),
        ),
        (
            Method::PUT,
            format!("/api/v1/app/{a}"),
            json!({"name": "x\u{7}"}),
            json!(["body", "name"]),
        ),
        (
            Method::POST,
            "/api/v1/app".into(),
            json!({"name": "m", "metadata": {"k\u{0}": "v"}}),
            json!(["body", "metadata", "k\u{0}"]),
        ),
        (
            Method::POST,
            "/api/v1/app".into(),
            json!({"name": "m", "metadata": {"k": "v\u{0}"}}),
            json!(["body", "metadata", "k"]),
        ),
        (
            Method::POST,
            "/api/v1/app".into(),
            json!({"name": "m", "metadata": {("k".repeat(257)): "v"}}),
            json!(["body", "metadata", "k".repeat(257)]),
        ),
        (
            Method::POST,
            format!("/api/v1/app/{a}/endpoint"),
            json!({"url": "http://127.0.0.1:9/", "description": "d\u{0}"}),
            json!(["body", "description"]),
        ),
        (
            Method::POST,
            format!("/api/v1/app/{a}/endpoint"),
            json!({"url": format!("http://127.0.0.1:9/{}", "p".repeat(65536))}),
            json!(["body", "url"]),
        ),
        (
            Method::POST,
            format!("/api/v1/app/{a}/msg"),
            json!({"eventType": "a.b", "payload": {}, "eventId": "e\u{0}"}),
            json!(["body", "eventId"]),
        ),
        (
            Method::POST,
            format!("/api/v1/app/{a}/token"),
            json!({"name": "t\u{0}"}),
            json!(["body", "name"]),
        ),
        (
            Method::POST,
            format!("/api/v1/app/{a}/endpoint/{ep}/disable"),
            json!({"reason": "r\u{0}"}),
            json!(["body", "reason"]),
        ),
        (
            Method::POST,
            "/api/v1/event-type".into(),
            json!({"name": "c.d", "description": "d\u{0}"}),
            json!(["body", "description"]),
        ),
        (
            Method::POST,
            "/api/v1/dead-letter/replay".into(),
            json!({"eventType": "a\u{0}"}),
            json!(["body", "event_type"]),
        ),
    ];
    for (method, path, body, loc) in cases {
        let (s, out) = app
            .as_token(TOKEN)
            .request(method.clone(), &path, Some(body))
            .await;
        // An answer that echoes the megabyte name is cut short.
        let shown: String = out.to_string().chars().take(300).collect();
        assert_eq!(
            s,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{method} {path}: {shown}"
        );
        assert_eq!(out["detail"][0]["loc"], loc, "{method} {path}: {shown}");
    }
    // At the bounds: accepted; descriptions keep their line breaks.
    let (s, out) = app
        .post(
            "/api/v1/app",
            json!({"name": "n".repeat(256), "metadata": {"k": "two\nlines"}}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{out}");
    let (s, out) = app
        .patch(
            &format!("/api/v1/app/{a}/endpoint/{ep}"),
            json!({"description": "first\nsecond\tcolumn"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{out}");
    let (_, apps) = app.get("/api/v1/app?limit=250").await;
    assert!(
        apps["data"]
            .as_array()
            .expect("data")
            .iter()
            .all(|a| !a["name"].as_str().expect("name").contains(['\0', '\n'])),
        "nothing refused was stored: {apps}"
    );
    app.shutdown().await;
}

async fn stored_strings_are_bounded_and_free_of_control_characters(backend: &Backend) {
    stored_strings_are_bounded_and_text(backend.spawn_stepped(&[]).await).await;
}

/// Paths and queries that are not text get the API's JSON error naming
/// the parameter, never axum's text/plain one nor a database error.
async fn malformed_paths_and_queries_answer_json(app: TestApp) {
    let a = app_with_uid(&app, "A", "alpha").await;
    for (path, status, named) in [
        ("/api/v1/app/%FF%FE".to_owned(), 400, "app_id"),
        ("/api/v1/app/alpha%00".to_owned(), 400, "app_id"),
        (
            format!("/api/v1/app/{a}/endpoint/%C3%28"),
            400,
            "endpoint_id",
        ),
        (
            format!("/api/v1/app/{a}/endpoint/ep%00x"),
            400,
            "endpoint_id",
        ),
        (format!("/api/v1/app/{a}/msg/%00"), 400, "msg_id"),
        ("/api/v1/event-type/%FF".to_owned(), 400, "event_type_name"),
        ("/api/v1/event-type/a%00".to_owned(), 400, "event_type_name"),
        (format!("/api/v1/app/{a}/msg?channel=%FF"), 400, "channel"),
        (format!("/api/v1/app/{a}/msg?channel=%00"), 422, "channel"),
        (
            format!("/api/v1/app/{a}/endpoint?iterator=%00"),
            422,
            "iterator",
        ),
        ("/api/v1/dead-letter?app_id=%00".to_owned(), 422, "app_id"),
    ] {
        let resp = app
            .client
            .get(app.url(&path))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("herald answers");
        assert_eq!(resp.status().as_u16(), status, "{path}");
        assert_eq!(
            header_text(resp.headers(), "content-type"),
            "application/json",
            "{path}"
        );
        let body: Value = resp.json().await.expect("a JSON body");
        assert!(body.to_string().contains(named), "{path}: {body}");
    }
    app.shutdown().await;
}

async fn malformed_paths_and_queries_answer_the_apis_json_error(backend: &Backend) {
    malformed_paths_and_queries_answer_json(backend.spawn_stepped(&[]).await).await;
}

/// A failure limit slows guessing but never locks out a valid token nor
/// tells a wrong one anything but 401: behind a NAT or a reverse proxy one
/// client's stale token must not stop every producer on that address.
#[tokio::test]
async fn failed_authentications_never_refuse_a_valid_token_and_stay_401() {
    let app = spawn_stepped(&[("HERALD_AUTH_FAILURE_LIMIT", "3")]).await;
    let a = app.create_app().await;
    // Well past the burst: every wrong token is still a 401 with the JSON
    // error, never a 429.
    for i in 0..8 {
        let (s, out) = app.as_token(&format!("guess-{i}")).get("/api/v1/app").await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "wrong token {i}: {out}");
        assert_eq!(out["code"], "authentication_failed", "{out}");
    }
    // The address is over its limit now; a token that never authenticated
    // from it before, and the admin token, are served all the same.
    let fresh = app_token(&app, &a).await;
    let (s, out) = app.as_token(&fresh).get(&format!("/api/v1/app/{a}")).await;
    assert_eq!(s, StatusCode::OK, "{out}");
    let (s, out) = app.as_token(TOKEN).get("/api/v1/app").await;
    assert_eq!(s, StatusCode::OK, "{out}");
    let (s, out) = app
        .as_token(TOKEN)
        .post(
            &format!("/api/v1/app/{a}/msg"),
            json!({"eventType": "a.b", "payload": {}}),
        )
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "a producer's message: {out}");
    let (s, _) = app.as_token("").get("/api/v1/app").await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "no token is no guess");
    app.shutdown().await;
}

async fn an_application_has_at_most_the_configured_number_of_endpoints(backend: &Backend) {
    let app = backend
        .spawn_stepped(&[("HERALD_MAX_ENDPOINTS_PER_APP", "2")])
        .await;
    let a = app.create_app().await;
    let b = app.create_app().await;
    for _ in 0..2 {
        app.create_endpoint(&a, "http://127.0.0.1:9/", json!({}))
            .await;
    }
    let (status, body) = app
        .post(
            &format!("/api/v1/app/{a}/endpoint"),
            json!({"url": "http://127.0.0.1:9/"}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body.to_string().contains("HERALD_MAX_ENDPOINTS_PER_APP"),
        "{body}"
    );
    // The limit is per application; deleting one makes room again.
    app.create_endpoint(&b, "http://127.0.0.1:9/", json!({}))
        .await;
    let (_, list) = app.get(&format!("/api/v1/app/{a}/endpoint")).await;
    assert_eq!(list["data"].as_array().map(Vec::len), Some(2));
    let first = list["data"][0]["id"].as_str().expect("id").to_owned();
    let (status, _) = app
        .delete(&format!("/api/v1/app/{a}/endpoint/{first}"))
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    app.create_endpoint(&a, "http://127.0.0.1:9/", json!({}))
        .await;
    app.shutdown().await;
}

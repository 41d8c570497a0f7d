//! What a hostile tenant or client could do to the server, over real
//! sockets: payloads nested to blow up a page, connections that never
//! finish (or never start) a request, a crowd of connections from one
//! address, guessing the dashboard's log-in, and taking the operator
//! application's uid.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use herald::ids::{AppId, MsgId};
use herald::server::{self, Role};
use herald::store::{ApiToken, App, Endpoint, NewMessage, Store};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::helpers::*;

const OPS_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn nested(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

#[tokio::test]
async fn deeply_nested_payloads_are_refused_at_ingest_and_kept_small_on_the_dashboard() {
    let app = spawn_stepped(&[]).await;
    let rx = Receiver::start().await;
    let (app_id, _) = app.app_with_endpoint(&rx.url("/"), json!({})).await;

    // A tenant's 100,000 nested arrays (200 KB, well under the size
    // limit), and 20,000: a 422 naming the payload, nothing stored.
    for depth in [100_000, 20_000, 129, 128] {
        let body = format!(r#"{{"eventType":"deep","payload":{}}}"#, nested(depth));
        let resp = app
            .client
            .post(app.url(&format!("/api/v1/app/{app_id}/msg")))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("herald answers");
        assert_eq!(resp.status(), 422, "depth {depth}");
        let out: Value = resp.json().await.expect("JSON error");
        assert_eq!(out["detail"][0]["loc"], json!(["body", "payload"]), "{out}");
    }
    let (_, listed) = app.get(&format!("/api/v1/app/{app_id}/msg")).await;
    assert_eq!(listed["data"], json!([]), "nothing was stored");
    // As deep as serde_json itself reads is fine.
    let body = format!(r#"{{"eventType":"deep","payload":{}}}"#, nested(127));
    let resp = app
        .client
        .post(app.url(&format!("/api/v1/app/{app_id}/msg")))
        .bearer_auth(TOKEN)
        .body(body)
        .send()
        .await
        .expect("herald answers");
    assert_eq!(resp.status(), 202);

    // Payloads stored before the limit (or by another path) are shown
    // cut, in a page of bounded size; the API still reads them byte-exact.
    let browser = logged_in(&app).await;
    let app_key = AppId::parse(&app_id).expect("app id");
    for depth in [5_000, 100_000] {
        let payload = nested(depth);
        let msg = MsgId::generate();
        app.running()
            .store
            .insert_messages(&[NewMessage {
                id: msg.clone(),
                app_id: app_key.clone(),
                event_type: "deep".into(),
                event_id: None,
                payload: payload.clone(),
                channels: None,
                created_at: now_ms(),
                traceparent: None,
                tags: None,
                deliver_at: None,
                payload_expires_at: None,
                application: None,
            }])
            .await
            .expect("stored");
        let dlv = app.deliveries(&app_id, msg.as_str()).await[0]["id"]
            .as_str()
            .expect("delivery id")
            .to_owned();
        let resp = browser
            .get(app.url(&format!("/dashboard/app/{app_id}/delivery/{dlv}")))
            .send()
            .await
            .expect("herald answers");
        assert_eq!(resp.status(), 200, "depth {depth}");
        let page = resp.bytes().await.expect("page");
        assert!(
            page.len() < 2_000_000,
            "depth {depth}: a page of {} bytes",
            page.len()
        );
        let page = String::from_utf8_lossy(&page);
        assert!(page.contains("Only the first 256 KiB"), "depth {depth}");

        let resp = app
            .client
            .get(app.url(&format!("/api/v1/app/{app_id}/msg/{msg}")))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("herald answers");
        assert_eq!(resp.status(), 200);
        let text = resp.text().await.expect("body");
        assert!(
            text.contains(&format!(r#""payload":{payload}"#)),
            "depth {depth}: the payload comes back as it was stored"
        );
    }
    app.shutdown().await;
}

/// Reads until the server closes the connection (bounded); returns what
/// it sent before. A reset counts as closed.
async fn read_until_closed(stream: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return got,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => panic!(
                "the server kept the connection open; it sent {:?}",
                String::from_utf8_lossy(&got)
            ),
        }
    }
}

/// Reads one response (headers and a Content-Length body) off `stream`,
/// leaving the connection open; None if the server closed it first.
async fn read_response(stream: &mut TcpStream) -> Option<(u16, String)> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let head = &text[..end];
            let length: usize = head
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().ok())
                        .flatten()
                })
                .unwrap_or(0);
            if got.len() >= end + 4 + length {
                let status = head
                    .split(' ')
                    .nth(1)
                    .and_then(|s| s.parse().ok())
                    .expect("a status line");
                return Some((status, text[end + 4..end + 4 + length].to_owned()));
            }
        }
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return None,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => panic!("no response: {:?}", String::from_utf8_lossy(&got)),
        }
    }
}

async fn connect(app: &TestApp) -> TcpStream {
    let addr = app.running().addr.expect("the API listens");
    TcpStream::connect(addr).await.expect("connects")
}

const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: herald\r\n\r\n";

#[tokio::test]
async fn slow_silent_and_idle_connections_are_closed_and_late_bodies_get_408() {
    let app = spawn_app(&[
        ("HERALD_HEADER_TIMEOUT", "1s"),
        ("HERALD_BODY_TIMEOUT", "1s"),
    ])
    .await;

    // Half a request line, then nothing.
    let mut half = connect(&app).await;
    half.write_all(b"GET /healthz HT").await.expect("write");
    read_until_closed(&mut half).await;
    // Nothing at all.
    let mut silent = connect(&app).await;
    read_until_closed(&mut silent).await;
    // A request answered, then an idle kept-alive connection.
    let mut idle = connect(&app).await;
    idle.write_all(HEALTHZ).await.expect("write");
    assert_eq!(read_response(&mut idle).await.map(|r| r.0), Some(200));
    read_until_closed(&mut idle).await;

    // A body that never comes, on the unauthenticated log-in and on the
    // API: 408, and the connection is closed.
    let mut withheld = connect(&app).await;
    withheld
        .write_all(
            b"POST /dashboard/login HTTP/1.1\r\nHost: herald\r\n\
              Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\ntoken=ab",
        )
        .await
        .expect("write");
    let answer = String::from_utf8_lossy(&read_until_closed(&mut withheld).await).into_owned();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    let app_id = app.create_app().await;
    let mut withheld = connect(&app).await;
    withheld
        .write_all(
            format!(
                "POST /api/v1/app/{app_id}/msg HTTP/1.1\r\nHost: herald\r\n\
                 Authorization: Bearer {TOKEN}\r\nContent-Length: 100\r\n\r\n{{\"eventType\":"
            )
            .as_bytes(),
        )
        .await
        .expect("write");
    let answer = String::from_utf8_lossy(&read_until_closed(&mut withheld).await).into_owned();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains(r#""code":"request_timeout""#), "{answer}");

    // A body dribbled a byte at a time still has to be in by the deadline.
    let mut dribble = connect(&app).await;
    dribble
        .write_all(
            b"POST /dashboard/login HTTP/1.1\r\nHost: herald\r\nContent-Length: 1000\r\n\r\n",
        )
        .await
        .expect("write");
    let started = Instant::now();
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    while answer.is_empty() {
        assert!(
            started.elapsed() < PATIENCE,
            "the dribble was never cut off"
        );
        if dribble.write_all(b"t").await.is_err() {
            break;
        }
        if let Ok(Ok(n)) =
            tokio::time::timeout(Duration::from_millis(200), dribble.read(&mut buf)).await
        {
            if n == 0 {
                break;
            }
            answer.extend_from_slice(&buf[..n]);
        }
    }
    let answer = String::from_utf8_lossy(&answer).into_owned();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");

    // Requests that do send what they promise are served as ever.
    let (status, _) = app.get("/healthz").await;
    assert_eq!(status, StatusCode::OK);
    app.shutdown().await;
}

#[tokio::test]
async fn connections_beyond_the_per_address_bound_are_closed_at_once() {
    let app = spawn_app(&[
        ("HERALD_MAX_CONNECTIONS_PER_IP", "4"),
        // The four must stay open while the test looks.
        ("HERALD_HEADER_TIMEOUT", "60s"),
    ])
    .await;
    let mut open = Vec::new();
    for _ in 0..4 {
        let mut stream = connect(&app).await;
        stream.write_all(HEALTHZ).await.expect("write");
        assert_eq!(read_response(&mut stream).await.map(|r| r.0), Some(200));
        open.push(stream);
    }
    let mut fifth = connect(&app).await;
    // The write may already fail: the server may have closed it.
    let _ = fifth.write_all(HEALTHZ).await;
    let answer = read_until_closed(&mut fifth).await;
    assert!(
        answer.is_empty(),
        "the fifth was served: {}",
        String::from_utf8_lossy(&answer)
    );

    // One closes: another gets its place.
    drop(open.pop());
    let deadline = Instant::now() + PATIENCE;
    loop {
        let mut stream = connect(&app).await;
        if stream.write_all(HEALTHZ).await.is_ok() {
            if let Some((200, _)) = read_response(&mut stream).await {
                break;
            }
        }
        assert!(Instant::now() < deadline, "no place was given back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(open);
    app.shutdown().await;
}

#[tokio::test]
async fn failed_dashboard_logins_are_limited_per_address_but_never_the_right_token() {
    let app = spawn_stepped(&[("HERALD_LOGIN_FAILURE_LIMIT", "3")]).await;
    let browser = cookie_client();
    for _ in 0..3 {
        assert_eq!(login_with(&browser, &app, "guess").await.status(), 401);
    }
    let limited = login_with(&browser, &app, "guess").await;
    assert_eq!(limited.status(), 429);
    let retry_after: u64 = header_text(limited.headers(), "retry-after")
        .parse()
        .expect("Retry-After in seconds");
    assert!((1..=2).contains(&retry_after), "{retry_after}");
    let page = limited.text().await.expect("page");
    assert!(page.contains("Too many failed log-ins"), "{page}");
    // While the address is limited, the right token still logs in: behind
    // a proxy, someone else's failures must not hold the operator out.
    let resp = login_with(&browser, &app, TOKEN).await;
    assert_eq!(resp.status(), 303);
    assert!(resp.headers().get("set-cookie").is_some());
    let resp = browser
        .get(app.url("/dashboard"))
        .send()
        .await
        .expect("herald answers");
    assert_eq!(resp.status(), 200, "the session works");
    app.shutdown().await;
}

#[tokio::test]
async fn the_binary_logs_failed_logins_with_the_address_and_never_the_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = closed_port().await;
    let mut cmd = crate::helpers::binary::serve_command(&dir.path().join("h.db"), port);
    let mut child = cmd
        .env("HERALD_ADMIN_TOKEN", TOKEN)
        .env("HERALD_LOG", "info")
        .env("NO_COLOR", "1")
        // Its userinfo is a credential, logged masked at start.
        .env(
            "HERALD_OPERATOR_WEBHOOK_URL",
            "http://opuser:oppass123@127.0.0.1:9/ops",
        )
        .env(
            "HERALD_OPERATOR_WEBHOOK_SECRET",
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        )
        // Logs go to stderr (stdout is for what Herald prints to people).
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("herald starts");
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut reader = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let kept = lines.clone();
    tokio::spawn(async move {
        while let Ok(Some(line)) = reader.next_line().await {
            kept.lock().expect("lock").push(line);
        }
    });
    wait_healthy(format!("127.0.0.1:{port}")).await;
    let guess = "a-wrong-guess-0123456789";
    let resp = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/dashboard/login"))
        .form(&[("token", guess)])
        .send()
        .await
        .expect("herald answers");
    assert_eq!(resp.status(), 401);
    let deadline = Instant::now() + PATIENCE;
    let line = loop {
        let found = lines
            .lock()
            .expect("lock")
            .iter()
            .find(|l| l.contains("dashboard log-in failed"))
            .cloned();
        if let Some(line) = found {
            break line;
        }
        assert!(Instant::now() < deadline, "no log line for the failure");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(line.contains("127.0.0.1"), "{line}");
    assert!(line.contains("INFO"), "{line}");
    let logged = lines.lock().expect("lock").join("\n");
    assert!(!logged.contains(guess), "the token is never logged");
    assert!(
        logged.contains("operator webhooks are on"),
        "the operator webhook's line: {logged}"
    );
    assert!(
        !logged.contains("opuser") && !logged.contains("oppass123"),
        "the operator webhook URL's credentials are never logged: {logged}"
    );
    let _ = child.kill().await;
}

#[tokio::test]
async fn herald_uids_are_refused_to_the_api() {
    let app = spawn_stepped(&[]).await;
    let refused = |out: &Value| out["detail"][0]["loc"] == json!(["body", "uid"]);
    for uid in ["herald-operator", "HERALD-ops", "herald-"] {
        let (status, out) = app
            .post("/api/v1/app", json!({"name": "Mallory", "uid": uid}))
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{uid}: {out}");
        assert!(refused(&out), "{out}");
    }
    let (status, out) = app
        .post(
            "/api/v1/app?get_if_exists=true",
            json!({"name": "Mallory", "uid": "herald-operator"}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{out}");
    let (status, out) = app
        .put("/api/v1/app/herald-operator", json!({"name": "Mallory"}))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{out}");
    let (status, out) = app
        .post(
            "/api/v1/app",
            json!({"name": "Heraldic", "uid": "heraldic"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{out}");
    let (status, out) = app
        .patch("/api/v1/app/heraldic", json!({"uid": "herald-operator"}))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{out}");
    assert!(refused(&out), "{out}");
    let (_, apps) = app.get("/api/v1/app").await;
    assert_eq!(apps["data"].as_array().map(Vec::len), Some(1), "{apps}");
    app.shutdown().await;
}

fn endpoint(app: &AppId, uid: &str, url: &str, secret: &str) -> Endpoint {
    Endpoint {
        uid: Some(uid.to_owned()),
        ..Endpoint::new(app.clone(), url, secret, now_ms())
    }
}

fn app_with_uid(uid: &str, name: &str) -> App {
    App {
        id: AppId::generate(),
        uid: Some(uid.to_owned()),
        name: name.to_owned(),
        rate_limit: None,
        metadata: Default::default(),
        created_at: now_ms(),
        updated_at: now_ms(),
    }
}

/// Starts Herald (stepped) on the store `overrides` name, which the test
/// filled before.
async fn start_on(dir: tempfile::TempDir, overrides: &[(&str, &str)]) -> TestApp {
    spawn_in(dir, overrides, Role::Api).await
}

fn verify_operator(r: &Recorded) -> Value {
    r.verified_by(OPS_SECRET)
        .expect("operator events are signed with the configured secret");
    serde_json::from_slice(&r.body).expect("JSON event")
}

/// The state an earlier Herald could leave: a customer's application with
/// uid `herald-operator` (made before operator webhooks were configured),
/// holding an application token, an endpoint of its own on loopback, and
/// the `operator` endpoint an earlier Herald put in it.
struct Hijacked {
    app: App,
    token: String,
}

async fn hijack(store: &dyn Store, ops_url: &str, customer_url: &str) -> Hijacked {
    let app = app_with_uid("herald-operator", "Mallory");
    store.create_app(&app).await.expect("app");
    store
        .create_endpoint(&endpoint(
            &app.id,
            "hooks",
            customer_url,
            "whsec_bWFsbG9yeS1tYWxsb3J5LW1hbGxvcnk=",
        ))
        .await
        .expect("endpoint");
    store
        .create_endpoint(&endpoint(&app.id, "operator", ops_url, OPS_SECRET))
        .await
        .expect("endpoint");
    let token = "hrld_app_mallory_0123456789abcdef".to_owned();
    store
        .create_token(
            &ApiToken::plain(
                "tok_mallory".into(),
                app.id.clone(),
                "mallory".into(),
                now_ms(),
            ),
            &hex::encode(herald::api::token_sha256(&token)),
        )
        .await
        .expect("token");
    Hijacked { app, token }
}

/// With operator webhooks configured on a store where a customer's
/// application holds `herald-operator`, that application stays a
/// customer's: its endpoints are guarded, its token reaches nothing of the
/// operator's, and operator events travel in an application of Herald's.
async fn a_customer_app_holding_the_operator_uid_stays_a_customer(
    (ops, customer, mallory): (Receiver, Receiver, Hijacked),
    dir: tempfile::TempDir,
    db: &[(&str, &str)],
) {
    let ops_url = ops.url("/ops");
    let mut overrides = vec![
        ("HERALD_ALLOW_PRIVATE_NETWORKS", "false"),
        ("HERALD_OPERATOR_WEBHOOK_URL", ops_url.as_str()),
        ("HERALD_OPERATOR_WEBHOOK_SECRET", OPS_SECRET),
    ];
    overrides.extend_from_slice(db);
    let app = start_on(dir, &overrides).await;
    let mallory_id = mallory.app.id.as_str();

    let (_, apps) = app.get("/api/v1/app").await;
    let apps = apps["data"].as_array().expect("apps").clone();
    assert_eq!(apps.len(), 2, "{apps:?}");
    let operator = apps
        .iter()
        .find(|a| a["id"] != mallory_id)
        .expect("Herald made an operator application of its own");
    let operator_id = operator["id"].as_str().expect("id").to_owned();
    assert_eq!(operator["name"], "Herald operator events");
    assert_eq!(operator["uid"], Value::Null, "the uid is taken");

    // Mallory's messages go nowhere private, the operator's URL included.
    let (sent, _) = app
        .as_token(&mallory.token)
        .post(
            &format!("/api/v1/app/{mallory_id}/msg"),
            json!({"eventType": "forged.event", "payload": {"forged": true}}),
        )
        .await;
    assert_eq!(sent, StatusCode::ACCEPTED);
    for _ in 0..4 {
        app.step().await;
    }
    assert!(customer.requests().is_empty(), "loopback reached");
    let (_, dead) = app
        .get(&format!("/api/v1/app/{mallory_id}/dead-letter"))
        .await;
    let dead = dead["data"].as_array().expect("dead letters").clone();
    assert_eq!(dead.len(), 2, "both endpoints refused: {dead:?}");
    for d in &dead {
        let error = d["lastError"].as_str().unwrap_or_default();
        assert!(error.contains("refused"), "{d}");
    }

    // Mallory's deaths are reported to the operator like any customer's,
    // from Herald's application; nothing Mallory sent arrives there.
    let got = ops.wait_for(2).await;
    for r in &got {
        let event = verify_operator(r);
        assert_eq!(event["type"], "message.attempt.exhausted", "{event}");
        assert_eq!(event["data"]["appId"], mallory_id);
        assert!(!String::from_utf8_lossy(&r.body).contains("forged"));
    }

    // The unguarded lane is the operator endpoint's alone: another
    // endpoint in Herald's application (slipped into the store) is guarded.
    let sneaky = Receiver::start().await;
    let operator_key = AppId::parse(&operator_id).expect("app id");
    app.running()
        .store
        .create_endpoint(&endpoint(
            &operator_key,
            "sneaky",
            &sneaky.url("/"),
            OPS_SECRET,
        ))
        .await
        .expect("endpoint");
    let hooks = app
        .get(&format!("/api/v1/app/{mallory_id}/endpoint/hooks"))
        .await
        .1["id"]
        .as_str()
        .expect("endpoint id")
        .to_owned();
    app.disable_endpoint(mallory_id, &hooks, json!({})).await;
    for _ in 0..4 {
        app.step().await;
    }
    let got = ops.wait_for(3).await;
    assert_eq!(verify_operator(&got[2])["type"], "endpoint.disabled");
    assert!(sneaky.requests().is_empty(), "loopback reached unguarded");

    // Mallory's token reaches nothing of the operator application's, and
    // no token can be made for it.
    for path in [
        format!("/api/v1/app/{operator_id}"),
        format!("/api/v1/app/{operator_id}/endpoint"),
        format!("/api/v1/app/{operator_id}/msg"),
    ] {
        let (status, _) = app.as_token(&mallory.token).get(&path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
    }
    let (status, out) = app
        .post(&format!("/api/v1/app/{operator_id}/token"), json!({}))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{out}");
    // Nor a portal link and its token (whose session could read the
    // operator secret and send examples to the unguarded URL).
    for route in ["app-portal-access", "dashboard-access"] {
        let (status, out) = app
            .post(&format!("/api/v1/auth/{route}/{operator_id}"), json!({}))
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{route}: {out}");
        assert_eq!(out["code"], "forbidden", "{out}");
        assert!(
            out.get("token").is_none() && out.get("url").is_none(),
            "{out}"
        );
    }
    let (_, tokens) = app.get(&format!("/api/v1/app/{operator_id}/token")).await;
    assert_eq!(tokens["data"], json!([]), "{tokens}");
    let (_, log) = app.get("/api/v1/audit-log?action=token.refused").await;
    let routes: Vec<&Value> = log["data"]
        .as_array()
        .expect("entries")
        .iter()
        .inspect(|e| assert_eq!(e["appId"], operator_id.as_str(), "{e}"))
        .map(|e| &e["details"]["route"])
        .collect();
    assert_eq!(
        routes,
        [
            &json!("portal-access"),
            &json!("portal-access"),
            &json!("token")
        ],
        "{log}"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_customer_app_holding_the_operator_uid_stays_a_customer_sqlite() {
    let (ops, customer) = (Receiver::start().await, Receiver::start().await);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = test_config(dir.path(), &[]);
    let backend = server::open_store(&config).await.expect("store");
    let mallory = hijack(
        backend.store().as_ref(),
        &ops.url("/ops"),
        &customer.url("/mallory"),
    )
    .await;
    backend.close().await;
    a_customer_app_holding_the_operator_uid_stays_a_customer((ops, customer, mallory), dir, &[])
        .await;
}

#[tokio::test]
async fn a_customer_app_holding_the_operator_uid_stays_a_customer_postgres() {
    let name = "security::a_customer_app_holding_the_operator_uid_stays_a_customer_postgres";
    let Some(f) = crate::helpers::postgres::postgres(name).await else {
        return;
    };
    let (url, schema) = (f.url.clone(), f.schema.clone());
    f.run_postgres(|store| async move {
        let (ops, customer) = (Receiver::start().await, Receiver::start().await);
        let mallory = hijack(store.as_ref(), &ops.url("/ops"), &customer.url("/mallory")).await;
        let dir = tempfile::tempdir().expect("tempdir");
        a_customer_app_holding_the_operator_uid_stays_a_customer(
            (ops, customer, mallory),
            dir,
            &[
                ("HERALD_DATABASE_URL", &url),
                ("HERALD_DATABASE_SCHEMA", &schema),
            ],
        )
        .await;
    })
    .await;
}

#[tokio::test]
async fn the_operator_app_an_earlier_herald_made_is_adopted_and_gets_no_token() {
    let ops = Receiver::start().await;
    let rx = Receiver::start().await;
    let ops_url = ops.url("/ops");
    let overrides = [
        ("HERALD_OPERATOR_WEBHOOK_URL", ops_url.as_str()),
        ("HERALD_OPERATOR_WEBHOOK_SECRET", OPS_SECRET),
    ];
    let dir = tempfile::tempdir().expect("tempdir");
    let config = test_config(dir.path(), &[]);
    let backend = server::open_store(&config).await.expect("store");
    let old = app_with_uid("herald-operator", "Herald operator events");
    let store = backend.store();
    store.create_app(&old).await.expect("app");
    store
        .create_endpoint(&endpoint(&old.id, "operator", &ops_url, OPS_SECRET))
        .await
        .expect("endpoint");
    backend.close().await;

    let app = start_on(dir, &overrides).await;
    let (_, apps) = app.get("/api/v1/app").await;
    assert_eq!(
        apps["data"].as_array().map(Vec::len),
        Some(1),
        "adopted, not made again: {apps}"
    );
    let (status, out) = app
        .post("/api/v1/app/herald-operator/token", json!({}))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{out}");
    for route in ["app-portal-access", "dashboard-access"] {
        let (status, out) = app
            .post(&format!("/api/v1/auth/{route}/herald-operator"), json!({}))
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{route}: {out}");
    }

    // It carries the events.
    let (app_id, ep_id) = app.app_with_endpoint(&rx.url("/"), json!({})).await;
    app.disable_endpoint(&app_id, &ep_id, json!({})).await;
    app.step().await;
    let got = ops.wait_for(2).await;
    let types: Vec<Value> = got
        .iter()
        .map(|r| verify_operator(r)["type"].clone())
        .collect();
    assert_eq!(
        types,
        vec![json!("endpoint.created"), json!("endpoint.disabled")]
    );
    let (_, msgs) = app.get(&format!("/api/v1/app/{}/msg", old.id)).await;
    assert_eq!(msgs["data"].as_array().map(Vec::len), Some(2), "{msgs}");
    app.shutdown().await;
}

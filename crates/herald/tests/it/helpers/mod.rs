//! What every test shares, written once: `spawn_app()` (Herald in this
//! process, called as `app.get(…)` or `app.as_token(t).post(…)`), a
//! scriptable receiver, small waiting helpers; the PostgreSQL fixture and
//! the macro that runs a test on both stores (`postgres`); the real binary
//! (`binary`); headless Chromium (`browser`).

pub mod binary;
pub mod browser;
mod idempotency;
pub mod postgres;

pub use postgres::{Backend, OnPostgres, PgSchema};

use std::collections::{BTreeMap, VecDeque};
use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use herald::config::Config;
use herald::server::{self, Role, Running};
use serde_json::Value;
use tokio::sync::Notify;

pub const TOKEN: &str = "test-admin-token-0123456789";

/// How long any wait in a test may take before the test fails. Generous:
/// it bounds a hang, it does not measure speed.
pub const PATIENCE: Duration = Duration::from_secs(30);

pub struct TestApp {
    pub running: Option<Running>,
    pub base: String,
    pub client: reqwest::Client,
    pub _dir: tempfile::TempDir,
}

/// Builds a test config: private networks allowed (receivers are on
/// loopback), a fast retry schedule, no jitter. `overrides` are `HERALD_*`
/// keys as an operator would set them.
pub fn test_config(dir: &std::path::Path, overrides: &[(&str, &str)]) -> Config {
    let mut values: BTreeMap<String, String> = [
        (
            "HERALD_DATABASE_URL",
            format!("sqlite://{}", dir.join("herald.db").display()),
        ),
        ("HERALD_ADMIN_TOKEN", TOKEN.to_owned()),
        ("HERALD_ALLOW_PRIVATE_NETWORKS", "true".to_owned()),
        ("HERALD_RETRY_SCHEDULE", "0ms,0ms".to_owned()),
        ("HERALD_JITTER", "none".to_owned()),
        ("HERALD_REQUEST_TIMEOUT", "2s".to_owned()),
        ("HERALD_LEASE", "6s".to_owned()),
        ("HERALD_POLL_INTERVAL", "200ms".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    for (k, v) in overrides {
        values.insert((*k).to_owned(), (*v).to_owned());
    }
    Config::from_values(&values).expect("test config is valid")
}

/// Starts Herald with the dispatcher running in the background.
pub async fn spawn_app(overrides: &[(&str, &str)]) -> TestApp {
    spawn_with_role(overrides, Role::All).await
}

/// Starts Herald without the background dispatcher: the test steps it with
/// `process_batch()`, so nothing depends on timing.
pub async fn spawn_stepped(overrides: &[(&str, &str)]) -> TestApp {
    spawn_with_role(overrides, Role::Api).await
}

pub(crate) async fn spawn_with_role(overrides: &[(&str, &str)], role: Role) -> TestApp {
    spawn_in(tempfile::tempdir().expect("tempdir"), overrides, role).await
}

/// Starts Herald with its data in `dir` (which a test may have filled).
pub async fn spawn_in(dir: tempfile::TempDir, overrides: &[(&str, &str)], role: Role) -> TestApp {
    let config = test_config(dir.path(), overrides);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let running = server::start(config, Some(listener), role)
        .await
        .expect("herald starts");
    let base = format!("http://{}", running.addr.expect("the API listens"));
    TestApp {
        running: Some(running),
        base,
        client: reqwest::Client::new(),
        _dir: dir,
    }
}

impl TestApp {
    pub fn running(&self) -> &Running {
        self.running.as_ref().expect("app is running")
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// `/metrics` as text.
    pub async fn metrics_text(&self) -> String {
        reqwest::get(self.url("/metrics"))
            .await
            .expect("herald answers")
            .text()
            .await
            .expect("text")
    }

    /// The official Svix SDK pointed at this Herald, with the admin token.
    pub fn sdk(&self) -> svix::api::Svix {
        self.sdk_as(TOKEN)
    }

    /// The official Svix SDK pointed at this Herald, with `token`.
    pub fn sdk_as(&self, token: &str) -> svix::api::Svix {
        let options = svix::api::SvixOptions {
            server_url: Some(self.base.clone()),
            ..svix::api::SvixOptions::default()
        };
        svix::api::Svix::new(token.to_owned(), Some(options))
    }

    /// Requests with `token` (any bearer token) instead of the admin's.
    pub fn as_token<'a>(&'a self, token: &'a str) -> AsToken<'a> {
        AsToken { app: self, token }
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.as_token(TOKEN).get(path).await
    }

    pub async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.as_token(TOKEN).post(path, body).await
    }

    pub async fn put(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.as_token(TOKEN).put(path, body).await
    }

    pub async fn patch(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.as_token(TOKEN).patch(path, body).await
    }

    pub async fn delete(&self, path: &str) -> (StatusCode, Value) {
        self.as_token(TOKEN).delete(path).await
    }

    pub async fn create_app(&self) -> String {
        let (status, body) = self
            .post("/api/v1/app", serde_json::json!({"name": "test app"}))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body["id"].as_str().expect("app id").to_owned()
    }

    /// Enables endpoint `ep` of `app` through the API; its answer.
    pub async fn enable_endpoint(&self, app: &str, ep: &str) -> Value {
        let path = format!("/api/v1/app/{app}/endpoint/{ep}/enable");
        let (status, out) = self.post(&path, serde_json::json!({})).await;
        assert_eq!(status, StatusCode::OK, "{out}");
        out
    }

    /// Disables endpoint `ep` of `app` through the API, `body` giving a
    /// reason or `{}`.
    pub async fn disable_endpoint(&self, app: &str, ep: &str, body: Value) {
        let path = format!("/api/v1/app/{app}/endpoint/{ep}/disable");
        let (status, out) = self.post(&path, body).await;
        assert_eq!(status, StatusCode::OK, "{out}");
    }

    /// The signing secret (`whsec_…`) of endpoint `ep` of `app`, as the
    /// API shows it.
    pub async fn endpoint_secret(&self, app: &str, ep: &str) -> String {
        let (status, out) = self
            .get(&format!("/api/v1/app/{app}/endpoint/{ep}/secret"))
            .await;
        assert_eq!(status, StatusCode::OK, "{out}");
        out["key"].as_str().expect("key").to_owned()
    }

    pub async fn create_endpoint(&self, app: &str, url: &str, extra: Value) -> Value {
        let mut body = serde_json::json!({ "url": url });
        if let (Some(obj), Some(more)) = (body.as_object_mut(), extra.as_object()) {
            obj.extend(more.clone());
        }
        let (status, out) = self
            .post(&format!("/api/v1/app/{app}/endpoint"), body)
            .await;
        assert_eq!(status, StatusCode::CREATED, "{out}");
        out
    }

    /// A new application with one endpoint at `url` (plus `extra` fields):
    /// their ids.
    pub async fn app_with_endpoint(&self, url: &str, extra: Value) -> (String, String) {
        let app = self.create_app().await;
        let ep = self.create_endpoint(&app, url, extra).await;
        let ep = ep["id"].as_str().expect("endpoint id").to_owned();
        (app, ep)
    }

    /// Creates these event types (endpoint filters must name existing ones).
    pub async fn create_event_types(&self, names: &[&str]) {
        for name in names {
            self.create_event_type(serde_json::json!({ "name": name }))
                .await;
        }
    }

    /// Creates the event type `body` describes; the API's answer.
    pub async fn create_event_type(&self, body: Value) -> Value {
        let (status, out) = self.post("/api/v1/event-type", body).await;
        assert_eq!(status, StatusCode::CREATED, "{out}");
        out
    }

    pub async fn send_message(&self, app: &str, event_type: &str, payload: Value) -> String {
        let (status, out) = self
            .post(
                &format!("/api/v1/app/{app}/msg"),
                serde_json::json!({"eventType": event_type, "payload": payload}),
            )
            .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{out}");
        out["id"].as_str().expect("msg id").to_owned()
    }

    /// Asks (body `{}`) for a resend of message `msg` of `app` to its
    /// endpoint `ep`: the API's answer.
    pub async fn resend(&self, app: &str, msg: &str, ep: &str) -> (StatusCode, Value) {
        let path = format!("/api/v1/app/{app}/msg/{msg}/endpoint/{ep}/resend");
        self.post(&path, serde_json::json!({})).await
    }

    /// Asks (body `{}`) for a replay of the dead delivery `dlv` of `app`:
    /// the API's answer.
    pub async fn replay_dead(&self, app: &str, dlv: &str) -> (StatusCode, Value) {
        let path = format!("/api/v1/app/{app}/dead-letter/{dlv}/replay");
        self.post(&path, serde_json::json!({})).await
    }

    /// `n` messages `order.created` `{"n": i}`, one after another; their ids.
    pub async fn send_n(&self, app: &str, n: usize) -> Vec<String> {
        let mut ids = Vec::with_capacity(n);
        for i in 0..n {
            ids.push(
                self.send_message(app, "order.created", serde_json::json!({ "n": i }))
                    .await,
            );
        }
        ids
    }

    pub async fn deliveries(&self, app: &str, msg: &str) -> Vec<Value> {
        let (status, out) = self
            .get(&format!("/api/v1/app/{app}/msg/{msg}/delivery"))
            .await;
        assert_eq!(status, StatusCode::OK, "{out}");
        out["data"].as_array().expect("data").clone()
    }

    pub async fn attempts_of_msg(&self, app: &str, msg: &str) -> Vec<Value> {
        let (status, out) = self
            .get(&format!(
                "/api/v1/app/{app}/attempt/msg/{msg}?order=ascending"
            ))
            .await;
        assert_eq!(status, StatusCode::OK, "{out}");
        out["data"].as_array().expect("data").clone()
    }

    pub async fn step(&self) -> herald::dispatch::BatchReport {
        self.running()
            .dispatcher
            .process_batch()
            .await
            .expect("batch processed")
    }

    /// Waits (bounded) until every delivery of `msg` is in `state`.
    pub async fn wait_for_state(&self, app: &str, msg: &str, state: &str) -> Vec<Value> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let ds = self.deliveries(app, msg).await;
            if !ds.is_empty() && ds.iter().all(|d| d["state"] == state) {
                return ds;
            }
            assert!(
                Instant::now() < deadline,
                "deliveries never reached {state}: {ds:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn shutdown(mut self) {
        if let Some(r) = self.running.take() {
            r.shutdown().await.expect("clean shutdown");
        }
    }
}

/// A claim from `store` at `now`, leased until `lease_until`, of up to
/// `n` deliveries with nothing in flight and every cap `n`.
pub async fn claim_up_to(
    store: &Arc<dyn herald::store::Store>,
    now: herald::store::Millis,
    lease_until: herald::store::Millis,
    n: usize,
) -> Vec<herald::store::ClaimedDelivery> {
    store
        .claim(&herald::store::ClaimRequest {
            now,
            lease_until,
            limit: n,
            in_flight: &std::collections::HashMap::new(),
            endpoint_cap: n,
            unlisted_cap: n,
        })
        .await
        .expect("claim")
}

/// The application `name` with the uid `uid`, as the SDK takes it.
pub fn app_in(uid: &str, name: &str) -> svix::models::ApplicationIn {
    svix::models::ApplicationIn {
        uid: Some(uid.to_owned()),
        ..svix::models::ApplicationIn::new(name.to_owned())
    }
}

/// A file of the repository, by its path from the repository's root.
pub fn repo_file(name: &str) -> String {
    std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(name),
    )
    .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// A browser-like client: it keeps cookies and shows redirects instead of
/// following them.
pub fn cookie_client() -> reqwest::Client {
    reqwest::Client::builder()
        .cookie_store(true)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client builds")
}

/// The value of a page's CSRF form field.
pub fn csrf_of(html: &str) -> String {
    let marker = r#"name="csrf" value=""#;
    let start = html.find(marker).expect("the page has a CSRF field") + marker.len();
    let len = html[start..].find('"').expect("the value ends");
    html[start..start + len].to_owned()
}

/// A request sent and its answer (`answer`) or the answer read whole; the
/// test fails if Herald does not answer or (`json_answer`) answers with
/// no JSON.
#[allow(async_fn_in_trait)]
pub trait Answered {
    async fn answer(self) -> reqwest::Response;
    async fn text_answer(self) -> String;
    async fn json_answer(self) -> Value;
}

impl Answered for reqwest::RequestBuilder {
    async fn answer(self) -> reqwest::Response {
        self.send().await.expect("herald answers")
    }

    async fn text_answer(self) -> String {
        let answer = self.answer().await;
        answer.text().await.expect("the answer's body")
    }

    async fn json_answer(self) -> Value {
        let answer = self.answer().await;
        answer.json().await.expect("the answer is JSON")
    }
}

/// `GET url` from `client` with the bearer token `token`: the answer.
pub async fn get_as(client: &reqwest::Client, url: String, token: &str) -> reqwest::Response {
    client.get(url).bearer_auth(token).answer().await
}

/// Whether every program in `programs` is installed. When one is not, the
/// test named `test` says on stderr that it is skipped, unless CI requires
/// those programs (`required_by` set), where it fails instead.
pub fn installed(programs: &[&str], required_by: &str, test: &str) -> bool {
    let Some(missing) = programs.iter().find(|p| !std::path::Path::new(p).exists()) else {
        return true;
    };
    assert!(
        std::env::var_os(required_by).is_none(),
        "{required_by} is set but {missing} is missing"
    );
    // Past the test harness's capture, so that a run shows what it skipped.
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED ({missing} not installed): {test}"
    );
    false
}

/// A [`cookie_client`] logged in to the dashboard as the operator.
pub async fn logged_in(app: &TestApp) -> reqwest::Client {
    let client = cookie_client();
    let resp = login_with(&client, app, TOKEN).await;
    assert_eq!(resp.status(), 303, "logged in");
    client
}

/// `GET path` from `client` (a browser, with its cookies): the status and
/// the page.
pub async fn get_page(client: &reqwest::Client, app: &TestApp, path: &str) -> (u16, String) {
    let resp = get_answer(client, app, path).await;
    let status = resp.status().as_u16();
    (status, resp.text().await.expect("body"))
}

/// `GET path` from `client` (a browser, with its cookies): the answer,
/// its body unread.
pub async fn get_answer(client: &reqwest::Client, app: &TestApp, path: &str) -> reqwest::Response {
    client
        .get(app.url(path))
        .send()
        .await
        .expect("herald answers")
}

/// The dashboard's log-in form posted from `browser` with `token`.
pub async fn login_with(
    browser: &reqwest::Client,
    app: &TestApp,
    token: &str,
) -> reqwest::Response {
    browser
        .post(app.url("/dashboard/login"))
        .form(&[("token", token)])
        .send()
        .await
        .expect("herald answers")
}

/// Herald's API called with one bearer token: each answer is the status
/// and the JSON body (`Null` when empty).
pub struct AsToken<'a> {
    app: &'a TestApp,
    token: &'a str,
}

impl AsToken<'_> {
    pub async fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let url = self.app.url(path);
        let (status, value) = json_call(&self.app.client, method, url, self.token, body).await;
        (StatusCode::from_u16(status).expect("valid status"), value)
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.request(reqwest::Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.request(reqwest::Method::POST, path, Some(body)).await
    }

    pub async fn put(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.request(reqwest::Method::PUT, path, Some(body)).await
    }

    pub async fn patch(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.request(reqwest::Method::PATCH, path, Some(body)).await
    }

    pub async fn delete(&self, path: &str) -> (StatusCode, Value) {
        self.request(reqwest::Method::DELETE, path, None).await
    }
}

/// `method url` with `token` and `body` as JSON: the status and the JSON
/// body of the answer (`Null` when empty).
async fn json_call(
    client: &reqwest::Client,
    method: reqwest::Method,
    url: String,
    token: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = client.request(method, url).bearer_auth(token);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.expect("request reaches herald");
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    let value = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("{status}: not JSON: {text}"))
    };
    (status, value)
}

/// One scripted answer of the receiver.
#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub delay: Duration,
    pub body: Vec<u8>,
    /// Answered only once the test adds a permit (see [`Reply::held`]).
    pub gate: Option<Arc<tokio::sync::Semaphore>>,
}

impl Reply {
    pub fn status(status: u16) -> Self {
        Reply {
            status,
            headers: vec![],
            delay: Duration::ZERO,
            body: Vec::new(),
            gate: None,
        }
    }
    /// A body of any bytes, text or not.
    pub fn bytes(mut self, b: &[u8]) -> Self {
        self.body = b.to_vec();
        self
    }
    /// Holds the answer (the request has arrived and is recorded) until
    /// `gate` gets a permit: `gate.add_permits(1)`.
    pub fn held(mut self, gate: &Arc<tokio::sync::Semaphore>) -> Self {
        self.gate = Some(gate.clone());
        self
    }
    pub fn header(mut self, k: &str, v: &str) -> Self {
        self.headers.push((k.to_owned(), v.to_owned()));
        self
    }
    pub fn delay(mut self, d: Duration) -> Self {
        self.delay = d;
        self
    }
    pub fn body(mut self, b: &str) -> Self {
        self.body = b.as_bytes().to_vec();
        self
    }
}

#[derive(Clone, Debug)]
pub struct Recorded {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// When the request arrived.
    pub at: Instant,
    /// The status it is answered with.
    pub status: u16,
    /// Whether the answer went out (false while held or delayed, and for
    /// a request whose sender went away first).
    pub answered: bool,
}

impl Recorded {
    pub fn header(&self, name: &str) -> String {
        header_text(&self.headers, name)
    }

    /// The delivery's `Idempotency-Key`.
    pub fn key(&self) -> String {
        self.header("idempotency-key")
    }

    /// The `X-Attempt` number (0 when missing).
    pub fn attempt(&self) -> u32 {
        self.header("x-attempt").parse().unwrap_or(0)
    }

    /// Whether its Standard Webhooks signature verifies with `secret`, by
    /// the `standardwebhooks` crate (a header whose signatures include one
    /// by this secret verifies).
    pub fn verified_by(&self, secret: &str) -> Result<(), String> {
        let wh = standardwebhooks::Webhook::new(secret).map_err(|e| format!("secret: {e}"))?;
        let mut headers = HeaderMap::new();
        for name in ["webhook-id", "webhook-timestamp", "webhook-signature"] {
            let value = self
                .header(name)
                .parse()
                .map_err(|e| format!("{name}: {e}"))?;
            headers.insert(name, value);
        }
        wh.verify(&self.body, &headers).map_err(|e| e.to_string())
    }
}

/// Answers chosen per request, once the script is used up.
type Answerer = Arc<dyn Fn(&Recorded) -> Reply + Send + Sync>;

#[derive(Default)]
struct ReceiverState {
    script: Mutex<VecDeque<Reply>>,
    default: Mutex<Option<Reply>>,
    answerer: Mutex<Option<Answerer>>,
    requests: Mutex<Vec<Recorded>>,
    /// Requests open now, per path and per `Idempotency-Key`, and how
    /// often one arrived while another of the same was open.
    open_paths: Mutex<BTreeMap<String, usize>>,
    open_keys: Mutex<BTreeMap<String, usize>>,
    path_overlaps: Mutex<usize>,
    key_overlaps: Mutex<usize>,
    arrived: Notify,
}

/// Marks a request no longer open however it ends (a sender killed
/// mid-request drops the handler).
struct Open {
    state: Arc<ReceiverState>,
    path: String,
    key: String,
}

impl Open {
    fn new(state: &Arc<ReceiverState>, path: &str, key: &str) -> Open {
        for (open, overlaps, name) in [
            (&state.open_paths, &state.path_overlaps, path),
            (&state.open_keys, &state.key_overlaps, key),
        ] {
            let mut open = open.lock().expect("lock");
            let n = open.entry(name.to_owned()).or_default();
            *n += 1;
            if *n > 1 {
                *overlaps.lock().expect("lock") += 1;
            }
        }
        Open {
            state: state.clone(),
            path: path.to_owned(),
            key: key.to_owned(),
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        for (open, name) in [
            (&self.state.open_paths, &self.path),
            (&self.state.open_keys, &self.key),
        ] {
            if let Ok(mut open) = open.lock() {
                if let Some(n) = open.get_mut(name) {
                    *n = n.saturating_sub(1);
                }
            }
        }
    }
}

/// A real HTTP receiver on 127.0.0.1 that answers from a script (then 200).
#[derive(Clone)]
pub struct Receiver {
    pub addr: SocketAddr,
    state: Arc<ReceiverState>,
}

async fn answer(
    State(state): State<Arc<ReceiverState>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut recorded = Recorded {
        path: uri.path().to_owned(),
        headers,
        body,
        at: Instant::now(),
        status: 0,
        answered: false,
    };
    let _open = Open::new(&state, &recorded.path, &recorded.key());
    let reply = {
        let next = state.script.lock().expect("lock").pop_front();
        let answerer = state.answerer.lock().expect("lock").clone();
        next.or_else(|| answerer.map(|answer| answer(&recorded)))
            .or_else(|| state.default.lock().expect("lock").clone())
            .unwrap_or_else(|| Reply::status(200))
    };
    recorded.status = reply.status;
    let index = {
        let mut requests = state.requests.lock().expect("lock");
        requests.push(recorded);
        requests.len() - 1
    };
    state.arrived.notify_waiters();
    if let Some(gate) = &reply.gate {
        let _ = gate.acquire().await.map(|p| p.forget());
    }
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    state.requests.lock().expect("lock")[index].answered = true;
    state.arrived.notify_waiters();
    let mut response = (
        StatusCode::from_u16(reply.status).expect("valid status"),
        reply.body,
    )
        .into_response();
    for (k, v) in reply.headers {
        response.headers_mut().insert(
            axum::http::HeaderName::from_bytes(k.as_bytes()).expect("header name"),
            v.parse().expect("header value"),
        );
    }
    response
}

impl Receiver {
    pub async fn start() -> Receiver {
        let state = Arc::new(ReceiverState::default());
        let app = axum::Router::new()
            .fallback(answer)
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind receiver");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await });
        Receiver { addr, state }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Queues answers, used in order by the next requests (any path).
    pub fn script(&self, replies: impl IntoIterator<Item = Reply>) {
        self.state.script.lock().expect("lock").extend(replies);
    }

    /// The answer once the script is used up (200 unless set).
    pub fn always(&self, reply: Reply) {
        *self.state.default.lock().expect("lock") = Some(reply);
    }

    /// Answers chosen per request by `answer` once the script is used up
    /// (ahead of `always`).
    pub fn answer_with(&self, answer: impl Fn(&Recorded) -> Reply + Send + Sync + 'static) {
        *self.state.answerer.lock().expect("lock") = Some(Arc::new(answer));
    }

    /// Requests open now (arrived, not yet answered or dropped).
    pub fn open_requests(&self) -> usize {
        self.state.open_paths.lock().expect("lock").values().sum()
    }

    /// How often a request arrived while another to the same path was open.
    pub fn path_overlaps(&self) -> usize {
        *self.state.path_overlaps.lock().expect("lock")
    }

    /// How often a request arrived while another with the same
    /// `Idempotency-Key` (the same delivery) was open.
    pub fn key_overlaps(&self) -> usize {
        *self.state.key_overlaps.lock().expect("lock")
    }

    /// Waits (bounded by `within`) until `done` holds of the requests so
    /// far, looking again as they arrive (at most every 10 ms).
    pub async fn wait_until(&self, within: Duration, done: impl Fn(&[Recorded]) -> bool) {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let notified = self.state.arrived.notified();
            if done(&self.state.requests.lock().expect("lock")) {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err()
                && !done(&self.state.requests.lock().expect("lock"))
            {
                let got = self.requests();
                panic!(
                    "the receiver did not see what was expected in time: {} requests: {:?}",
                    got.len(),
                    got.iter()
                        .take(50)
                        .map(|r| (&r.path, r.attempt(), r.status))
                        .collect::<Vec<_>>()
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.state.requests.lock().expect("lock").clone()
    }

    /// Waits (bounded) until at least `n` requests have arrived.
    pub async fn wait_for(&self, n: usize) -> Vec<Recorded> {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let notified = self.state.arrived.notified();
            let got = self.requests();
            if got.len() >= n {
                return got;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                panic!(
                    "only {} of {n} requests arrived: {:?}",
                    got.len(),
                    got.iter().map(|r| &r.path).collect::<Vec<_>>()
                );
            }
        }
    }
}

/// A local port with nothing listening on it.
pub async fn closed_port() -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = l.local_addr().expect("addr").port();
    drop(l);
    port
}

/// A client of a Herald that runs as a separate process (the real binary).
#[derive(Clone)]
pub struct Remote {
    pub client: reqwest::Client,
    /// `http://addr/api/v1`
    pub base: String,
}

impl Remote {
    pub fn new(addr: impl std::fmt::Display) -> Self {
        Remote {
            client: reqwest::Client::new(),
            base: format!("http://{addr}/api/v1"),
        }
    }

    /// `method path` (below `/api/v1`) with the admin token: status and
    /// JSON body (`Null` when empty).
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let url = format!("{}{path}", self.base);
        json_call(&self.client, method, url, TOKEN, body).await
    }

    /// Creates an application with one endpoint at `url`; returns the app id.
    pub async fn app_with_endpoint(&self, url: &str) -> String {
        let (app_id, _) = self
            .app_with_endpoint_of(serde_json::json!({ "url": url }))
            .await;
        app_id
    }

    /// Creates an application with one endpoint made of `endpoint` (its
    /// JSON body); returns the app's id and the endpoint's.
    pub async fn app_with_endpoint_of(&self, endpoint: Value) -> (String, String) {
        let post = reqwest::Method::POST;
        let name = serde_json::json!({"name": "remote"});
        let (status, app) = self.call(post.clone(), "/app", Some(name)).await;
        assert_eq!(status, 201, "{app}");
        let app_id = app["id"].as_str().expect("app id").to_owned();
        let path = format!("/app/{app_id}/endpoint");
        let (status, ep) = self.call(post, &path, Some(endpoint)).await;
        assert_eq!(status, 201, "{ep}");
        (app_id, ep["id"].as_str().expect("endpoint id").to_owned())
    }

    /// Sends `n` messages `{"i": i}`, `concurrency` at a time; every one
    /// must be answered 202. Returns the accepted message ids.
    pub async fn send_all(
        &self,
        app_id: &str,
        event_type: &str,
        n: usize,
        concurrency: usize,
    ) -> Vec<String> {
        let accepted = Arc::new(Mutex::new(Vec::with_capacity(n)));
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let url = format!("{}/app/{app_id}/msg", self.base);
        let mut senders = Vec::new();
        for _ in 0..concurrency {
            let (client, url, accepted, next) = (
                self.client.clone(),
                url.clone(),
                accepted.clone(),
                next.clone(),
            );
            let event_type = event_type.to_owned();
            senders.push(tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if i >= n {
                        return;
                    }
                    let resp = client
                        .post(&url)
                        .bearer_auth(TOKEN)
                        .json(&serde_json::json!({"eventType": event_type, "payload": {"i": i}}))
                        .send()
                        .await
                        .expect("herald is up while sending");
                    assert_eq!(resp.status(), 202);
                    let body: Value = resp.json().await.expect("json");
                    accepted
                        .lock()
                        .expect("lock")
                        .push(body["id"].as_str().expect("id").to_owned());
                }
            }));
        }
        for s in senders {
            s.await.expect("sender");
        }
        let ids = accepted.lock().expect("lock").clone();
        ids
    }
}

/// Waits (bounded) until `addr`'s /healthz answers 200.
pub async fn wait_healthy(addr: impl std::fmt::Display) {
    let client = reqwest::Client::new();
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Ok(r) = client.get(format!("http://{addr}/healthz")).send().await {
            if r.status() == 200 {
                return;
            }
        }
        assert!(Instant::now() < deadline, "herald never became healthy");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The `name=value` of the cookie an answer sets (the test fails without
/// one).
pub fn cookie_pair(headers: &HeaderMap) -> String {
    let set = header_text(headers, "set-cookie");
    let pair = set.split(';').next().unwrap_or_default();
    assert!(pair.contains('='), "no cookie set: {set:?}");
    pair.to_owned()
}

/// A header's value as text, or empty when absent or not text.
pub fn header_text(headers: &HeaderMap, name: &str) -> String {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

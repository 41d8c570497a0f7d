//! Issue 13's claim rules end to end: an enforced `throttleRate` and
//! ordered (FIFO) endpoints, in one process on SQLite, across a SIGKILL of
//! the real binary, and with two worker processes on PostgreSQL. Real
//! receivers on 127.0.0.1 record every arrival's time, message and
//! `X-Attempt`, and whether two requests to one endpoint were ever open
//! at once.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::process::{Child, Command};

use crate::helpers::{
    closed_port, cookie_client, spawn_app, wait_healthy, Answered, PgSchema, Receiver, Reply,
    PATIENCE, TOKEN,
};

/// One request as the probe saw it.
#[derive(Debug, Clone)]
struct Arrival {
    /// The message's payload `{"i": i}`.
    i: u64,
    attempt: u32,
    at: Instant,
}

/// The shared receiver, answering as these tests script it: after `delay`
/// (longer while `stall` lasts), and 500 to chosen messages' first
/// attempts. It counts requests open at once per path.
struct Probe {
    rx: Receiver,
    /// (path, i) → how many more times to answer 500.
    failures: Arc<Mutex<HashMap<(String, u64), usize>>>,
    delay: Arc<Mutex<Duration>>,
    /// Requests arriving before the instant are held this much longer (a
    /// receiver that stalls for a while).
    stall: Arc<Mutex<Option<(Instant, Duration)>>>,
}

fn payload_i(body: &[u8]) -> u64 {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v["i"].as_u64())
        .unwrap_or(u64::MAX)
}

impl Probe {
    async fn start() -> (Arc<Probe>, String) {
        let rx = Receiver::start().await;
        let failures: Arc<Mutex<HashMap<(String, u64), usize>>> = Arc::default();
        let delay: Arc<Mutex<Duration>> = Arc::default();
        let stall: Arc<Mutex<Option<(Instant, Duration)>>> = Arc::default();
        {
            let (failures, delay, stall) = (failures.clone(), delay.clone(), stall.clone());
            rx.answer_with(move |req| {
                let mut wait = *delay.lock().expect("lock");
                if let Some((until, longer)) = *stall.lock().expect("lock") {
                    if Instant::now() < until {
                        wait += longer;
                    }
                }
                let key = (req.path.clone(), payload_i(&req.body));
                let fail = match failures.lock().expect("lock").get_mut(&key) {
                    Some(n) if *n > 0 => {
                        *n -= 1;
                        true
                    }
                    _ => false,
                };
                Reply::status(if fail { 500 } else { 200 }).delay(wait)
            });
        }
        let url = rx.url("");
        let probe = Probe {
            rx,
            failures,
            delay,
            stall,
        };
        (Arc::new(probe), url)
    }

    fn fail(&self, path: &str, i: u64, times: usize) {
        self.failures
            .lock()
            .expect("lock")
            .insert((path.to_owned(), i), times);
    }

    fn arrivals(&self, path: &str) -> Vec<Arrival> {
        self.rx
            .requests()
            .into_iter()
            .filter(|r| r.path == path)
            .map(|r| Arrival {
                i: payload_i(&r.body),
                attempt: r.attempt(),
                at: r.at,
            })
            .collect()
    }

    fn overlaps(&self) -> usize {
        self.rx.path_overlaps()
    }

    /// Waits (bounded by `within`) until `done` holds of what arrived,
    /// looking every 10 ms.
    async fn wait_until(&self, within: Duration, done: impl Fn(&Probe) -> bool) {
        let deadline = Instant::now() + within;
        while !done(self) {
            if Instant::now() >= deadline {
                panic!(
                    "the receiver did not see what was expected in time: {:?}",
                    self.rx
                        .requests()
                        .iter()
                        .map(|r| (&r.path, payload_i(&r.body), r.attempt()))
                        .collect::<Vec<_>>()
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// The most arrivals in any one-second window (each window starting at an
/// arrival, which is where the most can fit).
fn busiest_second(arrivals: &[Arrival]) -> usize {
    let mut at: Vec<Instant> = arrivals.iter().map(|a| a.at).collect();
    at.sort();
    (0..at.len())
        .map(|s| {
            at[s..]
                .iter()
                .take_while(|t| t.duration_since(at[s]) < Duration::from_secs(1))
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// An HTTP client of a Herald at `base` (`http://addr`).
struct Api {
    client: reqwest::Client,
    base: String,
}

impl Api {
    fn new(base: String) -> Self {
        Api {
            client: reqwest::Client::new(),
            base,
        }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Value) -> (u16, Value) {
        let resp = self
            .client
            .request(method, format!("{}/api/v1{path}", self.base))
            .bearer_auth(TOKEN)
            .json(&body)
            .send()
            .await
            .expect("herald answers");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn app(&self) -> String {
        let (status, app) = self
            .call(reqwest::Method::POST, "/app", json!({"name": "engine"}))
            .await;
        assert_eq!(status, 201, "{app}");
        app["id"].as_str().expect("id").to_owned()
    }

    async fn endpoint(&self, app: &str, url: String, extra: Value) -> Value {
        let mut body = json!({ "url": url });
        if let (Some(o), Some(more)) = (body.as_object_mut(), extra.as_object()) {
            o.extend(more.clone());
        }
        let (status, ep) = self
            .call(reqwest::Method::POST, &format!("/app/{app}/endpoint"), body)
            .await;
        assert_eq!(status, 201, "{ep}");
        ep
    }

    /// Sends messages `{"i": 0}` … `{"i": n-1}` one after another (so in
    /// creation order), each answered 202.
    async fn send(&self, app: &str, n: u64) {
        for i in 0..n {
            let (status, body) = self
                .call(
                    reqwest::Method::POST,
                    &format!("/app/{app}/msg"),
                    json!({"eventType": "engine.test", "payload": {"i": i}}),
                )
                .await;
            assert_eq!(status, 202, "{body}");
        }
    }
}

/// Throttled: at most rate + 1 in any second, spread over the time the rate
/// needs, all first attempts. The neighbour: everything at once.
fn assert_throttled_beside_free_neighbour(p: &Probe, sent_at: Instant, n: usize, rate: usize) {
    let slow = p.arrivals("/slow");
    let fast = p.arrivals("/fast");
    assert_eq!(
        (slow.len(), fast.len()),
        (n, n),
        "each message arrived once at each endpoint"
    );
    assert!(
        slow.iter().chain(&fast).all(|a| a.attempt == 1),
        "waiting for a slot spends no attempt: {:?}",
        slow.iter().map(|a| a.attempt).collect::<Vec<_>>()
    );
    let busiest = busiest_second(&slow);
    assert!(
        busiest <= rate + 1,
        "{busiest} requests in one second at {rate}/s"
    );
    let first = slow.iter().map(|a| a.at).min().expect("arrivals");
    let last = slow.iter().map(|a| a.at).max().expect("arrivals");
    let needed = Duration::from_millis(((n - rate - 1) * 1000 / rate) as u64);
    assert!(
        last.duration_since(first) >= needed,
        "{n} requests at {rate}/s took {:?}, at least {needed:?} expected",
        last.duration_since(first)
    );
    let fast_done = fast.iter().map(|a| a.at).max().expect("arrivals");
    assert!(
        fast_done.duration_since(sent_at) < Duration::from_secs(2),
        "the neighbour's deliveries waited for the throttled endpoint: last after {:?}",
        fast_done.duration_since(sent_at)
    );
}

#[tokio::test]
async fn a_throttled_endpoint_is_spread_and_its_neighbour_is_not_slowed() {
    const N: u64 = 24;
    let app_under_test = spawn_app(&[]).await;
    let api = Api::new(app_under_test.base.clone());
    let (p, rx) = Probe::start().await;
    let app = api.app().await;
    let ep = api
        .endpoint(&app, format!("{rx}/slow"), json!({"throttleRate": 4}))
        .await;
    assert_eq!(ep["throttleRate"], 4);
    api.endpoint(&app, format!("{rx}/fast"), json!({})).await;
    let sent_at = Instant::now();
    api.send(&app, N).await;
    // While they wait, the metric counts them.
    p.wait_until(PATIENCE, |p| p.arrivals("/slow").len() >= 2)
        .await;
    let ep_id = ep["id"].as_str().expect("id");
    let scrape = reqwest::get(format!("{}/metrics", app_under_test.base))
        .await
        .expect("scrape")
        .text()
        .await
        .expect("text");
    let waiting: f64 = scrape
        .lines()
        .find(|l| l.starts_with("herald_throttle_waiting") && l.contains(ep_id))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no herald_throttle_waiting for {ep_id}: {scrape}"));
    assert!(
        (10.0..=22.0).contains(&waiting),
        "{waiting} waiting for a slot after two of {N} were sent"
    );
    p.wait_until(PATIENCE, |p| {
        p.arrivals("/slow").len() >= N as usize && p.arrivals("/fast").len() >= N as usize
    })
    .await;
    assert_throttled_beside_free_neighbour(&p, sent_at, N as usize, 4);

    // The waiting shows in the health API while it lasts; here, the rate.
    let (status, health) = api
        .call(
            reqwest::Method::GET,
            &format!(
                "/app/{app}/endpoint/{}/health",
                ep["id"].as_str().expect("id")
            ),
            Value::Null,
        )
        .await;
    assert_eq!(status, 200, "{health}");
    assert_eq!(health["throttled"], "throttled at 4/s", "{health}");
    assert_eq!(health["throttleWaiting"], 0, "all sent: {health}");
    // The dashboard's endpoint page says it too.
    let browser = cookie_client();
    let login = browser
        .post(format!("{}/dashboard/login", app_under_test.base))
        .form(&[("token", TOKEN)])
        .send()
        .await
        .expect("log-in");
    assert_eq!(login.status(), 303);
    let page = browser
        .get(format!(
            "{}/dashboard/app/{app}/endpoint/{ep_id}",
            app_under_test.base
        ))
        .text_answer()
        .await;
    assert!(page.contains("throttled at 4/s"), "{page}");
    app_under_test.shutdown().await;
}

#[tokio::test]
async fn changing_throttle_rate_takes_effect_at_once() {
    let app_under_test = spawn_app(&[]).await;
    let api = Api::new(app_under_test.base.clone());
    let (p, rx) = Probe::start().await;
    let app = api.app().await;
    let ep = api
        .endpoint(&app, format!("{rx}/slow"), json!({"throttleRate": 1}))
        .await;
    api.endpoint(&app, format!("{rx}/fast"), json!({})).await;
    api.send(&app, 6).await;
    p.wait_until(PATIENCE, |p| !p.arrivals("/slow").is_empty())
        .await;
    // At 1/s the six would take five seconds; lifted, the rest go at once.
    let (status, out) = api
        .call(
            reqwest::Method::PATCH,
            &format!("/app/{app}/endpoint/{}", ep["id"].as_str().expect("id")),
            json!({"throttleRate": null}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    let lifted = Instant::now();
    p.wait_until(PATIENCE, |p| p.arrivals("/slow").len() >= 6)
        .await;
    let last = p
        .arrivals("/slow")
        .iter()
        .map(|a| a.at)
        .max()
        .expect("arrivals");
    assert!(
        last.duration_since(lifted) < Duration::from_secs(2),
        "the lifted limit took {:?} to show",
        last.duration_since(lifted)
    );
    app_under_test.shutdown().await;
}

/// The FIFO endpoint's arrivals: message 0 three times (it fails twice),
/// then 1 … n-1, attempts 1, 2, 3, 1, …, never two open at once.
fn assert_fifo(p: &Probe, n: u64) {
    let got: Vec<(u64, u32)> = p
        .arrivals("/ordered")
        .iter()
        .map(|a| (a.i, a.attempt))
        .collect();
    let mut want = vec![(0, 1), (0, 2), (0, 3)];
    want.extend((1..n).map(|i| (i, 1)));
    assert_eq!(got, want, "arrivals (message, X-Attempt) in order");
    assert_eq!(p.overlaps(), 0, "never two requests open at once");
}

#[tokio::test]
async fn a_fifo_endpoint_gets_one_request_at_a_time_in_creation_order() {
    const N: u64 = 10;
    let app_under_test = spawn_app(&[("HERALD_RETRY_SCHEDULE", "50ms,50ms,50ms")]).await;
    let api = Api::new(app_under_test.base.clone());
    let (p, rx) = Probe::start().await;
    *p.delay.lock().expect("lock") = Duration::from_millis(20);
    p.fail("/ordered", 0, 2);
    let app = api.app().await;
    let ep = api
        .endpoint(&app, format!("{rx}/ordered"), json!({"ordering": "fifo"}))
        .await;
    assert_eq!(ep["ordering"], "fifo");
    api.send(&app, N).await;
    p.wait_until(PATIENCE, |p| p.arrivals("/ordered").len() >= N as usize + 2)
        .await;
    // Nothing more comes (no duplicate, nothing reordered late).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_fifo(&p, N);
    app_under_test.shutdown().await;
}

#[tokio::test]
async fn ordering_is_validated_and_kept_by_put_and_patch() {
    let app_under_test = spawn_app(&[]).await;
    let api = Api::new(app_under_test.base.clone());
    let app = api.app().await;
    let (status, body) = api
        .call(
            reqwest::Method::POST,
            &format!("/app/{app}/endpoint"),
            json!({"url": "http://127.0.0.1:9/x", "ordering": "lifo"}),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body.to_string().contains("ordering"),
        "the error names the field: {body}"
    );
    let ep = api
        .endpoint(&app, "http://127.0.0.1:9/x".to_owned(), json!({}))
        .await;
    assert_eq!(ep["ordering"], "none");
    let path = format!("/app/{app}/endpoint/{}", ep["id"].as_str().expect("id"));
    let (status, out) = api
        .call(reqwest::Method::PATCH, &path, json!({"ordering": "fifo"}))
        .await;
    assert_eq!(
        (status, out["ordering"].clone()),
        (200, json!("fifo")),
        "{out}"
    );
    let (status, out) = api
        .call(reqwest::Method::PATCH, &path, json!({"description": "d"}))
        .await;
    assert_eq!(
        (status, out["ordering"].clone()),
        (200, json!("fifo")),
        "a PATCH without it keeps it"
    );
    let (status, out) = api
        .call(reqwest::Method::PATCH, &path, json!({"ordering": 7}))
        .await;
    assert_eq!(status, 422, "{out}");
    let (status, out) = api
        .call(
            reqwest::Method::PUT,
            &path,
            json!({"url": "http://127.0.0.1:9/x"}),
        )
        .await;
    assert_eq!(
        (status, out["ordering"].clone()),
        (200, json!("none")),
        "PUT replaces: default"
    );
    let (_, read) = api.call(reqwest::Method::GET, &path, Value::Null).await;
    assert_eq!(read["ordering"], "none");
    app_under_test.shutdown().await;
}

/// `herald` (a clean environment) with short timeouts, leases and
/// retries, on loopback receivers, its output dropped.
fn quick_herald() -> Command {
    let mut cmd = crate::helpers::binary::herald();
    cmd.env("HERALD_ADMIN_TOKEN", TOKEN)
        .env("HERALD_ALLOW_PRIVATE_NETWORKS", "true")
        .env("HERALD_REQUEST_TIMEOUT", "1s")
        .env("HERALD_LEASE", "3500ms")
        .env("HERALD_RETRY_SCHEDULE", "50ms,50ms,50ms")
        .env("HERALD_JITTER", "none")
        .stdout(Stdio::null());
    cmd
}

/// `herald serve` on SQLite file `db` (role all), healthy.
async fn serve_sqlite(db: &std::path::Path) -> (Child, String) {
    let port = closed_port().await;
    let child = quick_herald()
        .arg("serve")
        .env("HERALD_LISTEN", format!("127.0.0.1:{port}"))
        .env("HERALD_DATABASE_URL", format!("sqlite://{}", db.display()))
        .spawn()
        .expect("herald starts");
    wait_healthy(format!("127.0.0.1:{port}")).await;
    (child, format!("http://127.0.0.1:{port}"))
}

#[tokio::test]
async fn fifo_order_holds_across_a_sigkill_of_the_binary() {
    const N: u64 = 10;
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("herald.db");
    let (p, rx) = Probe::start().await;
    // Slow answers, so the kill comes with a request open.
    *p.delay.lock().expect("lock") = Duration::from_millis(150);
    let (mut first, base) = serve_sqlite(&db).await;
    let api = Api::new(base);
    let app = api.app().await;
    api.endpoint(&app, format!("{rx}/ordered"), json!({"ordering": "fifo"}))
        .await;
    api.send(&app, N).await;
    p.wait_until(PATIENCE, |p| p.arrivals("/ordered").len() >= 4)
        .await;
    first.kill().await.expect("SIGKILL");
    let (_second, _) = serve_sqlite(&db).await;
    p.wait_until(PATIENCE, |p| {
        let got = p.arrivals("/ordered");
        got.iter().any(|a| a.i == N - 1) && p.rx.open_requests() == 0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let got: Vec<u64> = p.arrivals("/ordered").iter().map(|a| a.i).collect();
    // The request open at the kill may come again (its lease ends), right
    // after itself; nothing else repeats and nothing overtakes.
    let mut distinct = got.clone();
    distinct.dedup();
    assert_eq!(
        distinct,
        (0..N).collect::<Vec<_>>(),
        "arrivals in order: {got:?}"
    );
    assert!(
        got.len() <= N as usize + 1,
        "at most the open request again: {got:?}"
    );
    assert_eq!(p.overlaps(), 0, "never two requests open at once: {got:?}");
}

/// For how long from the start the receiver stalls, and by how much.
type Stall = (Duration, Duration);

crate::on_both_stores!(postgres:
    throttle_holds_across_two_workers_on_postgres,
    throttle_holds_across_two_workers_after_a_receiver_stalls,
    fifo_order_holds_across_two_workers_on_postgres,
);

/// On PostgreSQL: an API process and two workers; `check` runs once the
/// receiver has what `done` waits for.
async fn on_postgres_with_two_workers(
    pg: PgSchema,
    setup: impl AsyncFnOnce(&Api, &str) -> String,
    done: impl Fn(&Probe) -> bool,
    check: impl FnOnce(&Probe, Instant),
    probe_delay: Duration,
    fail: Option<(&str, u64, usize)>,
    (env, stall): (&[(&str, &str)], Option<Stall>),
) {
    pg.run(|pg| async move {
        crate::helpers::binary::succeeds(quick_herald().arg("migrate").envs(pg.env())).await;
        let port = closed_port().await;
        let spawn = |role: &str| {
            quick_herald()
                .args(["serve", "--role", role])
                .envs(env.iter().copied())
                .envs(pg.env())
                .env("HERALD_LISTEN", format!("127.0.0.1:{port}"))
                .spawn()
                .expect("herald starts")
        };
        let _api: Child = spawn("api");
        let _workers: Vec<Child> = (0..2).map(|_| spawn("worker")).collect();
        wait_healthy(format!("127.0.0.1:{port}")).await;
        let (p, rx) = Probe::start().await;
        *p.delay.lock().expect("lock") = probe_delay;
        if let Some((for_how_long, longer)) = stall {
            *p.stall.lock().expect("lock") = Some((Instant::now() + for_how_long, longer));
        }
        if let Some((path, i, times)) = fail {
            p.fail(path, i, times);
        }
        let api = Api::new(format!("http://127.0.0.1:{port}"));
        let sent_at = Instant::now();
        let _app = setup(&api, &rx).await;
        p.wait_until(PATIENCE, &done).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        check(&p, sent_at);
    })
    .await;
}

async fn throttle_holds_across_two_workers_on_postgres(pg: PgSchema) {
    const N: u64 = 24;
    on_postgres_with_two_workers(
        pg,
        async |api, rx| {
            let app = api.app().await;
            api.endpoint(&app, format!("{rx}/slow"), json!({"throttleRate": 4}))
                .await;
            api.endpoint(&app, format!("{rx}/fast"), json!({})).await;
            api.send(&app, N).await;
            app
        },
        |p| p.arrivals("/slow").len() >= N as usize && p.arrivals("/fast").len() >= N as usize,
        |p, sent_at| assert_throttled_beside_free_neighbour(p, sent_at, N as usize, 4),
        Duration::ZERO,
        None,
        (&[], None),
    )
    .await;
}

/// Two workers, a receiver that stalls for its first 900 ms (each request
/// then held that long), and an endpoint cap of 4: claimed deliveries wait
/// at their gates past their slots. Sent when the stall ends, each
/// worker's late ones bunched with the other's on-time slots (31 in one
/// second at 20/s was seen); given back for a new slot instead, no second
/// holds more than the rate + 1.
async fn throttle_holds_across_two_workers_after_a_receiver_stalls(pg: PgSchema) {
    const N: u64 = 60;
    on_postgres_with_two_workers(
        pg,
        async |api, rx| {
            let app = api.app().await;
            api.endpoint(&app, format!("{rx}/slow"), json!({"throttleRate": 20}))
                .await;
            api.endpoint(&app, format!("{rx}/fast"), json!({})).await;
            api.send(&app, N).await;
            app
        },
        |p| p.arrivals("/slow").len() >= N as usize && p.arrivals("/fast").len() >= N as usize,
        |p, _| {
            let slow = p.arrivals("/slow");
            assert_eq!(slow.len(), N as usize, "each message once");
            let busiest = busiest_second(&slow);
            assert!(busiest <= 21, "{busiest} requests in one second at 20/s");
        },
        Duration::ZERO,
        None,
        (
            &[("HERALD_ENDPOINT_CONCURRENCY", "4")],
            Some((Duration::from_millis(900), Duration::from_millis(900))),
        ),
    )
    .await;
}

async fn fifo_order_holds_across_two_workers_on_postgres(pg: PgSchema) {
    const N: u64 = 10;
    on_postgres_with_two_workers(
        pg,
        async |api, rx| {
            let app = api.app().await;
            api.endpoint(&app, format!("{rx}/ordered"), json!({"ordering": "fifo"}))
                .await;
            api.send(&app, N).await;
            app
        },
        |p| p.arrivals("/ordered").len() >= N as usize + 2,
        |p, _| assert_fifo(p, N),
        Duration::from_millis(20),
        Some(("/ordered", 0, 2)),
        (&[], None),
    )
    .await;
}

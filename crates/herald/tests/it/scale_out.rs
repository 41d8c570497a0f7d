//! Scale-out on PostgreSQL with the real binary: one API process and three
//! worker processes on one database, a worker SIGKILLed mid-run.

use std::collections::{HashMap, HashSet};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::process::{Child, Command};

use crate::helpers::{
    closed_port, wait_healthy, PgSchema, Receiver, Remote, Reply, PATIENCE, TOKEN,
};

crate::on_both_stores!(postgres:
    one_api_three_workers_and_a_killed_worker_lose_nothing,
    postgres_outage_answers_503_and_loses_nothing,
    start_up_waits_for_a_database_that_comes_up_later,
);

/// `herald` (a clean environment) on `pg`, as these tests run it.
fn herald_on(pg: &PgSchema) -> Command {
    let mut cmd = crate::helpers::binary::herald();
    cmd.envs(pg.env())
        .env("HERALD_ADMIN_TOKEN", TOKEN)
        .env("HERALD_ALLOW_PRIVATE_NETWORKS", "true")
        .env("HERALD_REQUEST_TIMEOUT", "5s")
        .env("HERALD_LEASE", "12s")
        .env("HERALD_MAX_IN_FLIGHT", "64")
        .stdout(Stdio::null());
    cmd
}

/// The shared receiver as these tests want it: 200 after 2 ms (a little
/// work per request keeps deliveries in flight when a kill comes).
async fn watch() -> Receiver {
    let rx = Receiver::start().await;
    rx.always(Reply::status(200).delay(Duration::from_millis(2)));
    rx
}

/// Waits (bounded by `within`) until every message in `accepted` has
/// been answered at least once.
async fn wait_for_all(rx: &Receiver, accepted: &HashSet<String>, within: Duration) {
    rx.wait_until(within, |got| {
        let arrived: HashSet<String> = got
            .iter()
            .filter(|r| r.answered)
            .map(|r| r.header("webhook-id"))
            .collect();
        accepted.iter().all(|id| arrived.contains(id))
    })
    .await;
}

async fn one_api_three_workers_and_a_killed_worker_lose_nothing(pg: PgSchema) {
    const MESSAGES: usize = 10_000;

    let w = watch().await;
    let rx_addr = w.addr;

    // `herald migrate` prepares the schema; nobody serves yet.
    crate::helpers::binary::succeeds(herald_on(&pg).arg("migrate")).await;

    let port = closed_port().await;
    let _api: Child = herald_on(&pg)
        .args(["serve", "--role", "api"])
        .env("HERALD_LISTEN", format!("127.0.0.1:{port}"))
        .spawn()
        .expect("api starts");
    let mut workers: Vec<Child> = (0..3)
        .map(|_| {
            herald_on(&pg)
                .args(["serve", "--role", "worker"])
                .spawn()
                .expect("worker starts")
        })
        .collect();
    wait_healthy(format!("127.0.0.1:{port}")).await;

    let remote = Remote::new(format!("127.0.0.1:{port}"));
    let app_id = remote
        .app_with_endpoint(&format!("http://{rx_addr}/hook"))
        .await;

    let sending = {
        let (remote, app_id) = (remote.clone(), app_id.clone());
        tokio::spawn(async move { remote.send_all(&app_id, "scale.test", MESSAGES, 32).await })
    };

    // Kill one worker once deliveries are well under way.
    w.wait_until(PATIENCE, |got| got.len() >= 2_000).await;
    workers[0].kill().await.expect("SIGKILL a worker");
    let killed_at = Instant::now();
    let accepted: HashSet<String> = sending.await.expect("sender").into_iter().collect();
    assert_eq!(accepted.len(), MESSAGES);

    wait_for_all(&w, &accepted, Duration::from_secs(180)).await;
    assert_eq!(
        w.key_overlaps(),
        0,
        "no delivery may be sent by two workers at once"
    );
    // Repeats are only the killed worker's: first seen before the kill, and
    // no more than it could have sent without their outcomes written: its
    // 64 requests in flight (HERALD_MAX_IN_FLIGHT) and the finished ones
    // whose outcomes were not written yet (a finished request frees its
    // slot before then): the completer's batch being written and its
    // queue, each at most 4 × 64 (+ 1). The bound used to be 64 alone,
    // which a loaded machine (slower completion transactions) overstepped
    // with 80.
    let unrecorded_at_most = 64 + 2 * (4 * 64 + 1);
    let mut per_key: HashMap<String, usize> = HashMap::new();
    let mut first_seen: HashMap<String, Instant> = HashMap::new();
    for r in w.requests() {
        *per_key.entry(r.key()).or_default() += 1;
        let first = first_seen.entry(r.key()).or_insert(r.at);
        *first = (*first).min(r.at);
    }
    let repeated: Vec<String> = per_key
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(k, _)| k.clone())
        .collect();
    assert!(
        repeated.len() <= unrecorded_at_most,
        "{} repeats is more than one worker could have sent unrecorded",
        repeated.len()
    );
    for key in &repeated {
        assert!(
            first_seen[key] < killed_at,
            "{key} was repeated without an expired lease"
        );
    }
    drop(workers);
}

fn pg_ctl(action: &str) {
    let version = std::fs::read_dir("/etc/postgresql")
        .ok()
        .and_then(|mut d| d.next())
        .and_then(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .expect("a PostgreSQL cluster under /etc/postgresql");
    let status = std::process::Command::new("pg_ctlcluster")
        .args(["--skip-systemctl-redirect", &version, "main", action])
        .status()
        .expect("pg_ctlcluster runs");
    assert!(status.success(), "pg_ctlcluster {action} failed");
}

/// Stops the shared PostgreSQL server mid-run, so it only runs when asked
/// (`HERALD_TEST_PG_RESTART=1`): `.ci/run` runs it on its own, after the
/// rest of the suite.
async fn postgres_outage_answers_503_and_loses_nothing(pg: PgSchema) {
    if std::env::var("HERALD_TEST_PG_RESTART").as_deref() != Ok("1") {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED (HERALD_TEST_PG_RESTART unset; it stops the shared server): \
             scale_out::postgres_only::postgres_outage_answers_503_and_loses_nothing"
        );
        return;
    }
    let w = watch().await;
    let rx_addr = w.addr;

    let port = closed_port().await;
    let _herald: Child = herald_on(&pg)
        .args(["serve"])
        .env("HERALD_LISTEN", format!("127.0.0.1:{port}"))
        .spawn()
        .expect("herald starts");
    wait_healthy(format!("127.0.0.1:{port}")).await;
    let remote = Remote::new(format!("127.0.0.1:{port}"));
    let (base, client) = (remote.base.clone(), remote.client.clone());
    let app_id = remote
        .app_with_endpoint(&format!("http://{rx_addr}/hook"))
        .await;
    let send = |i: usize| {
        let (client, base, app_id) = (client.clone(), base.clone(), app_id.clone());
        async move {
            let resp = client
                .post(format!("{base}/app/{app_id}/msg"))
                .bearer_auth(TOKEN)
                .json(&json!({"eventType": "outage.test", "payload": {"i": i}}))
                .send()
                .await
                .expect("herald answers even while the database is down");
            let status = resp.status().as_u16();
            let body: serde_json::Value = resp.json().await.expect("every answer is JSON");
            (status, body)
        }
    };
    let mut accepted = HashSet::new();
    for i in 0..200 {
        let (status, body) = send(i).await;
        assert_eq!(status, 202, "{body}");
        accepted.insert(body["id"].as_str().expect("id").to_owned());
    }

    pg_ctl("stop");
    let (status, body) = send(1000).await;
    let health = client
        .get(format!("http://127.0.0.1:{port}/healthz"))
        .send()
        .await
        .expect("healthz")
        .status();
    pg_ctl("start");
    assert_eq!(status, 503, "while the database is down: {body}");
    assert_eq!(body["code"], "unavailable");
    assert_eq!(health, 503);

    // Back up: accepted again (bounded retries while connections return).
    let deadline = Instant::now() + PATIENCE;
    let mut i = 2000;
    while accepted.len() < 400 {
        let (status, body) = send(i).await;
        i += 1;
        match status {
            202 => {
                accepted.insert(body["id"].as_str().expect("id").to_owned());
            }
            503 => assert!(
                Instant::now() < deadline,
                "still 503 long after the database came back"
            ),
            other => panic!("unexpected {other}: {body}"),
        }
    }
    wait_for_all(&w, &accepted, Duration::from_secs(120)).await;
}

/// Forwards every connection to `127.0.0.1:port_to` from a listener on
/// `port_from`: a database "coming up" on a port Herald was already trying.
async fn forward(port_from: u16, port_to: u16) -> tokio::task::JoinHandle<()> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port_from))
        .await
        .expect("bind the forwarder");
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            tokio::spawn(async move {
                if let Ok(mut outbound) =
                    tokio::net::TcpStream::connect(("127.0.0.1", port_to)).await
                {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    })
}

/// A database that is not reachable yet when Herald starts (it is still
/// starting, or too busy to hand out a connection) delays the start for up
/// to `HERALD_DATABASE_WAIT` instead of failing it; `0s` fails at once.
async fn start_up_waits_for_a_database_that_comes_up_later(pg: PgSchema) {
    use tokio::io::AsyncBufReadExt;
    let mut real = reqwest::Url::parse(&pg.url).expect("HERALD_TEST_POSTGRES_URL is a URL");
    let real_port = real.port().unwrap_or(5432);
    let late_port = closed_port().await;
    real.set_port(Some(late_port)).expect("a port can be set");
    let late = PgSchema {
        url: real.to_string(),
        ..pg
    };

    // Nothing listens there: the start fails, once its patience is spent,
    // saying so; its stderr.
    let given_up = |wait: &'static str| {
        let late = &late;
        async move {
            let out = herald_on(late)
                .args(["serve"])
                .env(
                    "HERALD_LISTEN",
                    format!("127.0.0.1:{}", closed_port().await),
                )
                .env("HERALD_DATABASE_WAIT", wait)
                .stderr(Stdio::piped())
                .output();
            let out = tokio::time::timeout(PATIENCE, out)
                .await
                .expect("herald gives up within the patience")
                .expect("herald runs");
            let said = String::from_utf8_lossy(&out.stderr).into_owned();
            assert!(!out.status.success(), "{said}");
            said
        }
    };
    // With no patience, at once, naming it.
    let said = given_up("0s").await;
    assert!(
        said.contains("opening store") && said.contains("unavailable"),
        "{said}"
    );
    // A short patience, spent: the error says how long it was unreachable.
    let said = given_up("1s").await;
    assert!(
        said.contains("unreachable for 1s (HERALD_DATABASE_WAIT)"),
        "{said}"
    );

    // With patience, it waits (and says so) until the database is there.
    let port = closed_port().await;
    let mut waiting = herald_on(&late)
        .args(["serve"])
        .env("HERALD_LISTEN", format!("127.0.0.1:{port}"))
        .env("HERALD_DATABASE_WAIT", "5m")
        .stderr(Stdio::piped())
        .spawn()
        .expect("herald starts");
    let mut lines =
        tokio::io::BufReader::new(waiting.stderr.take().expect("stderr is piped")).lines();
    let said_waiting = tokio::time::timeout(PATIENCE, async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("waiting for it (HERALD_DATABASE_WAIT)") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(said_waiting, Ok(true), "herald says it waits for the store");
    // Keeps reading, so that a full pipe never blocks its log.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    assert!(
        waiting.try_wait().expect("try_wait").is_none(),
        "herald is still waiting, not gone"
    );

    let forwarder = forward(late_port, real_port).await;
    wait_healthy(format!("127.0.0.1:{port}")).await;
    let remote = Remote::new(format!("127.0.0.1:{port}"));
    let app_id = remote.app_with_endpoint("http://127.0.0.1:9/hook").await;
    assert!(app_id.starts_with("app_"), "{app_id}");

    drop(waiting);
    forwarder.abort();
}

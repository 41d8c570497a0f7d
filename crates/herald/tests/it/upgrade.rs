//! Upgrades from real older stores: fixtures written by earlier Herald
//! binaries (`tests/fixtures/upgrade/<commit>/`, each with the recipe that
//! made it: `make-fixture`), opened by today's binary. Every pending
//! delivery is delivered, the ones in flight when the old process was
//! killed are sent again after their lease, dead letters are listed and
//! replayable, the old signing secrets still verify at the receiver, the
//! old application token still works, and the kept counts equal a fresh
//! count of the rows.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::helpers::binary::serve;
use crate::helpers::{PgSchema, Receiver, Recorded, PATIENCE};

/// The commits whose stores are kept as fixtures.
const MADE_BY: [&str; 2] = ["4735332", "c08890d"];

fn fixture(commit: &str, store: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/upgrade")
        .join(commit)
        .join(store)
}

fn facts(dir: &Path) -> Value {
    let text = std::fs::read_to_string(dir.join("facts.json")).expect("facts.json");
    serde_json::from_str(&text).expect("facts.json is JSON")
}

fn verify(secret: &str, r: &Recorded) {
    r.verified_by(secret)
        .unwrap_or_else(|e| panic!("{} does not verify with the old secret: {e}", r.path));
}

/// Deliveries per (endpoint, state) counted from the rows.
type Fresh = BTreeMap<(String, i64), i64>;

async fn call(method: reqwest::Method, url: String, token: &str, body: Value) -> (u16, Value) {
    let client = reqwest::Client::new();
    let mut request = client.request(method, &url).bearer_auth(token);
    if !body.is_null() {
        request = request.json(&body);
    }
    let response = request.send().await.expect("request");
    let status = response.status().as_u16();
    let text = response.text().await.expect("body");
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Runs today's binary on the fixture's store (already in place: `env`
/// points at it) and checks everything the old one left behind.
/// `point_at` sets each endpoint's URL to the receiver before the start;
/// `fresh` counts the rows.
async fn carried_forward<P, PF, F, FF>(
    facts: &Value,
    db: &Path,
    env: &[(&str, &str)],
    point_at: P,
    fresh: F,
) where
    P: FnOnce(Vec<(String, String)>) -> PF,
    PF: std::future::Future<Output = ()>,
    F: Fn() -> FF,
    FF: std::future::Future<Output = Fresh>,
{
    let rx = Receiver::start().await;
    let endpoints = &facts["endpoints"];
    let id = |t: &str| endpoints[t]["id"].as_str().expect("id").to_owned();
    let secret = |t: &str| endpoints[t]["secret"].as_str().expect("secret").to_owned();
    point_at(
        ["ok", "retry", "dead", "slow"]
            .iter()
            .map(|t| (id(t), rx.url(&format!("/{t}"))))
            .collect(),
    )
    .await;

    let admin = facts["admin_token"].as_str().expect("admin token");
    let mut all_env = vec![
        ("HERALD_ADMIN_TOKEN", admin),
        ("HERALD_ALLOW_PRIVATE_NETWORKS", "true"),
        ("HERALD_RETRY_SCHEDULE", "100ms,100ms,100ms"),
    ];
    all_env.extend_from_slice(env);
    let proc = serve(db, &all_env).await;
    let base = format!("http://{}/api/v1", proc.addr);

    // The retries scheduled and the deliveries in flight at the kill (their
    // leases long over) arrive, signed with the old secrets.
    rx.wait_until(PATIENCE, |got| {
        let at = |p: &str| got.iter().filter(|r| r.path == p && r.answered).count();
        at("/retry") >= 3 && at("/slow") >= 3
    })
    .await;
    for r in rx.requests() {
        let t = r.path.trim_start_matches('/');
        verify(&secret(t), &r);
    }

    // A new message keeps the endpoint's custom header.
    let (status, _) = call(
        reqwest::Method::POST,
        format!("{base}/app/acme/msg"),
        admin,
        json!({"eventType": "t.ok", "payload": {"after": "upgrade"}}),
    )
    .await;
    assert_eq!(status, 202);
    rx.wait_until(PATIENCE, |got| got.iter().any(|r| r.path == "/ok"))
        .await;
    let ok = rx
        .requests()
        .into_iter()
        .find(|r| r.path == "/ok")
        .expect("the new message");
    verify(&secret("ok"), &ok);
    assert_eq!(ok.header("x-fixture"), "kept");

    // Dead letters are listed and replay.
    let (status, dead) = call(
        reqwest::Method::GET,
        format!("{base}/app/acme/dead-letter"),
        admin,
        Value::Null,
    )
    .await;
    assert_eq!(status, 200, "{dead}");
    assert_eq!(
        dead["data"].as_array().map(Vec::len),
        Some(3),
        "the old dead letters: {dead}"
    );
    let (status, body) = call(
        reqwest::Method::POST,
        format!("{base}/app/acme/endpoint/{}/dead-letter/replay", id("dead")),
        admin,
        Value::Null,
    )
    .await;
    assert!((200..300).contains(&status), "replay: {status} {body}");
    rx.wait_until(PATIENCE, |got| {
        got.iter()
            .filter(|r| r.path == "/dead" && r.answered)
            .count()
            >= 3
    })
    .await;
    for r in rx.requests().iter().filter(|r| r.path == "/dead") {
        verify(&secret("dead"), r);
    }

    // The old application token still works, for its own application.
    let app_token = facts["app_token"].as_str().expect("app token");
    let (status, app) = call(
        reqwest::Method::GET,
        format!("{base}/app/acme"),
        app_token,
        Value::Null,
    )
    .await;
    assert_eq!(status, 200, "{app}");

    // Everything has settled: the kept counts equal the rows.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let rows = fresh().await;
        let settled = rows.keys().all(|(_, state)| *state >= 2);
        let mut kept = Fresh::new();
        for t in ["ok", "retry", "dead", "slow"] {
            let (status, stats) = call(
                reqwest::Method::GET,
                format!("{base}/app/acme/endpoint/{}/stats", id(t)),
                admin,
                Value::Null,
            )
            .await;
            assert_eq!(status, 200, "{stats}");
            for (state, field) in [(0, "pending"), (1, "sending"), (2, "success"), (3, "fail")] {
                let n = stats[field].as_i64().expect("a count");
                if n > 0 {
                    kept.insert((id(t), state), n);
                }
            }
        }
        if settled && kept == rows {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "kept counts {kept:?} against the rows {rows:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    drop(proc);
}

fn sqlite_fresh(path: &Path) -> Fresh {
    let conn =
        rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .expect("open read-only");
    let mut statement = conn
        .prepare("SELECT endpoint_id, state, count(*) FROM deliveries GROUP BY endpoint_id, state")
        .expect("prepare");
    let rows = statement
        .query_map([], |r| Ok(((r.get(0)?, r.get(1)?), r.get(2)?)))
        .expect("query")
        .collect::<Result<Fresh, _>>()
        .expect("rows");
    rows
}

async fn sqlite_store_carries_forward(commit: &str) {
    let dir = fixture(commit, "sqlite");
    let facts = facts(&dir);
    let tmp = tempfile::tempdir().expect("tempdir");
    let db = tmp.path().join("herald.db");
    std::fs::copy(dir.join("store.db"), &db).expect("copy the fixture");
    let point_at = |urls: Vec<(String, String)>| {
        let db = db.clone();
        async move {
            let conn = rusqlite::Connection::open(&db).expect("open");
            for (id, url) in urls {
                conn.execute("UPDATE endpoints SET url = ?1 WHERE id = ?2", [&url, &id])
                    .expect("point the endpoint at the receiver");
            }
        }
    };
    let fresh = || {
        let db = db.clone();
        async move { sqlite_fresh(&db) }
    };
    carried_forward(&facts, &db, &[], point_at, fresh).await;
}

async fn postgres_store_carries_forward(commit: &str, pg: &PgSchema) {
    use sqlx::Connection;
    let dir = fixture(commit, "postgres");
    let facts = facts(&dir);
    let dump = std::fs::read_to_string(dir.join("store.sql")).expect("store.sql");
    let dump = dump.replace("herald_fixture", &pg.schema);
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = tmp.path().join("store.sql");
    std::fs::write(&file, dump).expect("write the dump");
    let status = tokio::process::Command::new("psql")
        .args([pg.url.as_str(), "-q", "-v", "ON_ERROR_STOP=1", "-f"])
        .arg(&file)
        .env("PGOPTIONS", "-c client_min_messages=warning")
        .stdout(std::process::Stdio::null())
        .status()
        .await
        .expect("psql runs");
    assert!(status.success(), "the dump loads");

    let connect = || async {
        let mut conn = sqlx::PgConnection::connect(&pg.url).await.expect("connect");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SET search_path TO \"{}\"",
            pg.schema
        )))
        .execute(&mut conn)
        .await
        .expect("search_path");
        conn
    };
    let point_at = |urls: Vec<(String, String)>| async move {
        let mut conn = connect().await;
        for (id, url) in urls {
            sqlx::query("UPDATE endpoints SET url = $1 WHERE id = $2")
                .bind(url)
                .bind(id)
                .execute(&mut conn)
                .await
                .expect("point the endpoint at the receiver");
        }
    };
    let fresh = || async {
        let mut conn = connect().await;
        let rows: Vec<(String, i16, i64)> = sqlx::query_as(
            "SELECT endpoint_id, state::int2, count(*) FROM deliveries GROUP BY endpoint_id, state",
        )
        .fetch_all(&mut conn)
        .await
        .expect("count the rows");
        rows.into_iter()
            .map(|(ep, state, n)| ((ep, i64::from(state)), n))
            .collect::<Fresh>()
    };
    carried_forward(
        &facts,
        &tmp.path().join("unused.db"),
        &pg.env(),
        point_at,
        fresh,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_stores_of_earlier_versions_are_carried_forward() {
    for commit in MADE_BY {
        sqlite_store_carries_forward(commit).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stores_of_earlier_versions_are_carried_forward() {
    for commit in MADE_BY {
        let name = "upgrade::postgres_stores_of_earlier_versions_are_carried_forward";
        let Some(pg) = PgSchema::new(name) else {
            return;
        };
        pg.run(|pg| async move { postgres_store_carries_forward(commit, &pg).await })
            .await;
    }
}

//! The real `herald` binary: configuration errors, the generated admin
//! token, SIGTERM, and crash safety under SIGKILL.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;
use serde_json::json;

use crate::helpers::binary::{herald, run, serve};
use crate::helpers::{
    closed_port, get_as, Answered, Receiver, Recorded, Remote, Reply, PATIENCE, TOKEN,
};

#[tokio::test]
async fn an_invalid_setting_stops_the_binary_naming_the_key() {
    for (key, value) in [
        ("HERALD_MAX_AGE", "forever"),
        ("HERALD_RETRY_SCHEDULE", "1m,x"),
        ("HERALD_JITTER", "some"),
    ] {
        let out = herald()
            .arg("serve")
            .env(key, value)
            .output()
            .await
            .expect("runs");
        assert!(!out.status.success(), "{key}={value} must stop herald");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(key), "{key}: {stderr}");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("herald.toml");
    std::fs::write(&file, "max_age = \"1 week\"\n").expect("write");
    let out = herald()
        .args(["serve", "--config"])
        .arg(&file)
        .output()
        .await
        .expect("runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("HERALD_MAX_AGE"));
}

/// An API-only process on SQLite never has a dispatcher beside it (one
/// process per file): it starts (CI's fuzzing wants an API that sends
/// nothing) but says so, where it said nothing and accepted messages that
/// were never sent.
#[tokio::test]
async fn an_api_only_process_on_sqlite_says_it_delivers_nothing() {
    use tokio::io::AsyncBufReadExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = crate::helpers::binary::serve_command(
        &dir.path().join("h.db"),
        crate::helpers::closed_port().await,
    )
    .args(["--role", "api"])
    .stderr(Stdio::piped())
    .spawn()
    .expect("herald starts");
    let mut lines =
        tokio::io::BufReader::new(child.stderr.take().expect("stderr is piped")).lines();
    let warned = tokio::time::timeout(crate::helpers::PATIENCE, async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("--role api on SQLite") {
                return line;
            }
        }
        String::new()
    })
    .await
    .expect("herald says it within the patience");
    assert!(
        warned.contains("nothing accepted here is delivered"),
        "{warned}"
    );
    child.kill().await.expect("kill");
}

#[tokio::test]
async fn the_admin_token_is_generated_once_printed_once_and_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("h.db");
    let mut first = serve(&db, &[]).await;
    let token = first
        .first_line
        .rsplit(' ')
        .next()
        .expect("token")
        .to_owned();
    assert!(
        first.first_line.contains("admin token"),
        "{}",
        first.first_line
    );
    assert!(token.starts_with("hrld_"), "{token}");
    let client = reqwest::Client::new();
    let ok = get_as(&client, format!("http://{}/api/v1/app", first.addr), &token).await;
    assert_eq!(ok.status(), 200);
    first.child.kill().await.expect("kill");

    let mut second = serve(&db, &[]).await;
    assert!(
        !second.first_line.contains("admin token"),
        "printed only once: {}",
        second.first_line
    );
    let ok = get_as(
        &client,
        format!("http://{}/api/v1/app", second.addr),
        &token,
    )
    .await;
    assert_eq!(ok.status(), 200, "the generated token survives a restart");
    let bad = client
        .get(format!("http://{}/api/v1/app", second.addr))
        .bearer_auth("hrld_guess")
        .send()
        .await
        .expect("send");
    assert_eq!(bad.status(), 401);
    // Killed and waited for: a process that is still going holds the
    // store's lock, and the next start would be refused.
    second.child.kill().await.expect("kill");

    // Replaced by HERALD_ADMIN_TOKEN (the generated one leaked, say), it is
    // retired for good: unset again, the token set last stands, not it.
    let status_with = |addr: std::net::SocketAddr, token: String| {
        let client = client.clone();
        async move {
            client
                .get(format!("http://{addr}/api/v1/app"))
                .bearer_auth(token)
                .send()
                .await
                .expect("send")
                .status()
        }
    };
    let mut third = serve(&db, &[("HERALD_ADMIN_TOKEN", TOKEN)]).await;
    assert_eq!(status_with(third.addr, token.clone()).await, 401);
    third.child.kill().await.expect("kill");
    let fourth = serve(&db, &[]).await;
    assert!(
        !fourth.first_line.contains("admin token"),
        "{}",
        fourth.first_line
    );
    assert_eq!(
        status_with(fourth.addr, token.clone()).await,
        401,
        "not back"
    );
    assert_eq!(status_with(fourth.addr, TOKEN.to_owned()).await, 200);
}

/// The shared receiver, failing the first attempt of every delivery (by
/// its `Idempotency-Key`) after 2 ms of work, which keeps deliveries in
/// flight when the kill comes.
async fn crash_receiver() -> Receiver {
    let rx = Receiver::start().await;
    let keys_seen: Mutex<HashSet<String>> = Mutex::default();
    rx.answer_with(move |req| {
        let first_time = keys_seen.lock().expect("lock").insert(req.key());
        Reply::status(if first_time { 500 } else { 200 }).delay(Duration::from_millis(2))
    });
    rx
}

/// Message id → the keys it was delivered (answered 200) under.
fn delivered(got: &[Recorded]) -> HashMap<String, HashSet<String>> {
    let mut delivered: HashMap<String, HashSet<String>> = HashMap::new();
    for r in got.iter().filter(|r| r.answered && r.status == 200) {
        delivered
            .entry(r.header("webhook-id"))
            .or_default()
            .insert(r.key());
    }
    delivered
}

#[tokio::test]
async fn sigkill_mid_flight_loses_nothing_after_restart() {
    const MESSAGES: usize = 1000;
    let rx = crash_receiver().await;
    let rx_addr = rx.addr;

    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("crash.db");
    let envs = [
        ("HERALD_ADMIN_TOKEN", TOKEN),
        ("HERALD_ALLOW_PRIVATE_NETWORKS", "true"),
        (
            "HERALD_RETRY_SCHEDULE",
            "200ms,200ms,200ms,200ms,200ms,200ms",
        ),
        ("HERALD_JITTER", "full"),
        ("HERALD_REQUEST_TIMEOUT", "1s"),
        ("HERALD_LEASE", "4s"),
        ("HERALD_MAX_IN_FLIGHT", "64"),
        // The receiver fails every delivery's first attempt, which the
        // circuit breaker rightly takes for an outage and pauses; this
        // test is about the kill, so the breaker is off.
        ("HERALD_BREAKER_MIN_ATTEMPTS", "0"),
    ];
    let mut first = serve(&db, &envs).await;
    let remote = Remote::new(first.addr);
    let app_id = remote
        .app_with_endpoint(&format!("http://{rx_addr}/hook"))
        .await;

    // Send everything, 16 at a time; keep the ids answered 202.
    let accepted = remote.send_all(&app_id, "crash.test", MESSAGES, 16).await;
    // Kill while deliveries are under way: some arrived, most not yet.
    rx.wait_until(PATIENCE, |got| got.len() >= 200).await;
    first.child.kill().await.expect("SIGKILL");
    let delivered_before = delivered(&rx.requests()).len();
    assert!(
        delivered_before < MESSAGES,
        "the kill must come mid-run ({delivered_before} delivered)"
    );

    let _second = serve(&db, &envs).await;
    let accepted: HashSet<String> = accepted.into_iter().collect();
    assert_eq!(accepted.len(), MESSAGES);
    rx.wait_until(Duration::from_secs(120), |got| {
        let delivered = delivered(got);
        accepted.iter().all(|id| delivered.contains_key(id))
    })
    .await;
    // At least once, and every repeat of a message carried the same key.
    for (msg, keys) in delivered(&rx.requests()).iter() {
        assert_eq!(keys.len(), 1, "{msg} arrived under several keys: {keys:?}");
    }
}

#[tokio::test]
async fn sigterm_finishes_in_flight_requests_and_exits_cleanly_and_sighup_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("term.db");
    // The receiver answers after 1 s: SIGTERM arrives while it is waiting.
    let rx = Receiver::start().await;
    rx.always(Reply::status(200).delay(Duration::from_secs(1)));
    let rx_addr = rx.addr;

    let envs = [
        ("HERALD_ADMIN_TOKEN", TOKEN),
        ("HERALD_ALLOW_PRIVATE_NETWORKS", "true"),
    ];
    let mut proc = serve(&db, &envs).await;
    let remote = Remote::new(proc.addr);
    let (base, client) = (remote.base.clone(), remote.client.clone());
    let app_id = remote
        .app_with_endpoint(&format!("http://{rx_addr}/"))
        .await;
    let msg: serde_json::Value = client
        .post(format!("{base}/app/{app_id}/msg"))
        .bearer_auth(TOKEN)
        .json(&json!({"eventType": "a.b", "payload": {}}))
        .json_answer()
        .await;
    rx.wait_for(1).await;
    let pid = i32::try_from(proc.child.id().expect("pid")).expect("pid fits");
    // SIGHUP without TLS (a service manager's "reload") changes nothing:
    // its default action ended the process at once, in-flight work and all.
    // SAFETY: sending a signal to our own child process.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        proc.child.try_wait().expect("status").is_none(),
        "SIGHUP ended the process"
    );
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = tokio::time::timeout(PATIENCE, proc.child.wait())
        .await
        .expect("exits")
        .expect("status");
    assert!(status.success(), "clean exit on SIGTERM: {status:?}");

    // The in-flight attempt finished and was recorded before exit.
    let store = herald::store::sqlite::SqliteStore::open(&format!("sqlite://{}", db.display()))
        .await
        .expect("open");
    use herald::store::History;
    let app_key = herald::ids::AppId::parse(&app_id).expect("id");
    let msg_key = herald::ids::MsgId::parse(msg["id"].as_str().expect("id")).expect("id");
    let ds = store
        .list_deliveries_of_message(&app_key, &msg_key)
        .await
        .expect("list");
    assert_eq!(ds[0].state, herald::store::DeliveryState::Delivered);
}

/// Runs `herald <args>` against `addr` with `token`; returns (ok, stdout,
/// stderr).
async fn cli(addr: SocketAddr, token: &str, args: &[&str]) -> (bool, String, String) {
    let out = herald()
        .args(args)
        .env("HERALD_URL", format!("http://{addr}"))
        .env("HERALD_ADMIN_TOKEN", token)
        .output()
        .await
        .expect("runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn the_cli_lists_and_replays_dead_letters_and_toggles_endpoints() {
    let rx = crate::helpers::Receiver::start().await;
    rx.always(crate::helpers::Reply::status(400));
    let dir = tempfile::tempdir().expect("tempdir");
    let mut proc = serve(
        &dir.path().join("h.db"),
        &[
            ("HERALD_ADMIN_TOKEN", TOKEN),
            ("HERALD_ALLOW_PRIVATE_NETWORKS", "true"),
        ],
    )
    .await;
    let remote = Remote::new(proc.addr);
    let (app_id, ep_id) = remote
        .app_with_endpoint_of(json!({ "url": rx.url("/hook") }))
        .await;
    remote.send_all(&app_id, "order.created", 3, 1).await;
    rx.wait_for(3).await;
    // Dead after one attempt (400): wait until all three are listed.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let listing = loop {
        let (ok, out, err) = cli(proc.addr, TOKEN, &["dead", "list", "--app", &app_id]).await;
        assert!(ok, "{err}");
        if out.matches("dlv_").count() == 3 {
            break out;
        }
        assert!(tokio::time::Instant::now() < deadline, "{out}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(listing.contains("permanent_status"), "{listing}");
    assert!(listing.contains("HTTP 400"), "{listing}");
    let (ok, page, _) = cli(proc.addr, TOKEN, &["dead", "list", "--limit", "2"]).await;
    assert!(ok);
    assert!(page.contains("more: --iterator dlv_"), "{page}");

    let (ok, _, err) = cli(proc.addr, "wrong-token-0123456789", &["dead", "list"]).await;
    assert!(!ok);
    assert!(err.contains("401"), "{err}");
    let (ok, _, err) = cli(proc.addr, TOKEN, &["dead", "replay"]).await;
    assert!(!ok);
    assert!(err.contains("--all"), "{err}");

    rx.always(crate::helpers::Reply::status(200));
    let first = listing
        .split_whitespace()
        .find(|w| w.starts_with("dlv_"))
        .expect("an id")
        .to_owned();
    let (ok, out, err) = cli(proc.addr, TOKEN, &["dead", "replay", &first]).await;
    assert!(ok, "{err}");
    assert!(out.contains("replayed 1 of 1"), "{out}");
    let (ok, out, err) = cli(
        proc.addr,
        TOKEN,
        &["dead", "replay", "--all", "--app", &app_id],
    )
    .await;
    assert!(ok, "{err}");
    assert!(out.contains("replayed 2"), "{out}");
    assert!(err.contains("so far"), "progress is shown: {err}");
    rx.wait_for(6).await;

    let (ok, out, err) = cli(
        proc.addr,
        TOKEN,
        &[
            "endpoint",
            "disable",
            &app_id,
            &ep_id,
            "--reason",
            "maintenance",
        ],
    )
    .await;
    assert!(ok, "{err}");
    assert!(out.contains("disabled"), "{out}");
    let path = format!("/app/{app_id}/endpoint/{ep_id}/health");
    let (_, health) = remote.call(reqwest::Method::GET, &path, None).await;
    assert_eq!(health["disabledReason"], "maintenance");
    let (ok, out, err) = cli(proc.addr, TOKEN, &["endpoint", "enable", &app_id, &ep_id]).await;
    assert!(ok, "{err}");
    assert!(out.contains("enabled"), "{out}");
    let (ok, _, err) = cli(
        proc.addr,
        TOKEN,
        &["endpoint", "enable", &app_id, "ep_missing"],
    )
    .await;
    assert!(!ok);
    assert!(err.contains("404"), "{err}");

    // An application token from the CLI reaches its application only.
    let (ok, out, err) = cli(
        proc.addr,
        TOKEN,
        &["token", "create", "--app", &app_id, "--name", "ci"],
    )
    .await;
    assert!(ok, "{err}");
    let app_token = out
        .split_whitespace()
        .find(|w| w.starts_with("hrld_app_"))
        .expect("the token is printed")
        .to_owned();
    let token_id = out
        .split_whitespace()
        .find(|w| w.starts_with("tok_"))
        .expect("its id is printed")
        .to_owned();
    let get_app = |token: String| {
        let (client, url) = (
            remote.client.clone(),
            format!("{}/app/{app_id}", remote.base),
        );
        async move {
            client
                .get(url)
                .bearer_auth(token)
                .send()
                .await
                .expect("get")
                .status()
        }
    };
    assert_eq!(get_app(app_token.clone()).await, 200);
    let listing = get_as(&remote.client, format!("{}/app", remote.base), &app_token).await;
    assert_eq!(listing.status(), 403);
    let (ok, _, err) = cli(
        proc.addr,
        TOKEN,
        &["token", "revoke", "--app", &app_id, &token_id],
    )
    .await;
    assert!(ok, "{err}");
    assert_eq!(get_app(app_token).await, 401);
    // Refused, with the server's reason; unreachable, without --url's
    // password.
    let (ok, _, err) = cli(
        proc.addr,
        TOKEN,
        &["token", "revoke", "--app", "nosuch", &token_id],
    )
    .await;
    assert!(
        !ok && err.contains("404") && err.contains("not found"),
        "{err}"
    );
    let closed = format!("http://user:s3cretpw@127.0.0.1:{}", closed_port().await);
    let out = herald()
        .args(["dead", "list", "--url", &closed])
        .env("HERALD_ADMIN_TOKEN", TOKEN)
        .output()
        .await
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("cannot reach Herald"),
        "{err}"
    );
    assert!(!err.contains("s3cretpw"), "{err}");
    proc.child.kill().await.expect("kill");
}

/// The upgrade steps an operator scripts: `migrate --status` (0: nothing
/// pending, 1: some, 2: the store could not be read) and `--dry-run` apply nothing; with
/// `HERALD_AUTO_MIGRATE=false` `serve` refuses a store with migrations
/// pending, naming them, until `herald migrate` ran; a store a newer
/// Herald migrated is refused by all of them; `--version` names the
/// commit and the newest schema.
async fn migrations_are_listed_gated_and_refused_when_newer(store: &[(&str, String)]) {
    let (code, out, err) = run(&["migrate", "--status"], store).await;
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(out.contains("0 applied"), "{out}");
    assert!(out.contains("pending  0001 initial"), "{out}");
    let (code, out, _) = run(&["migrate", "--dry-run"], store).await;
    assert_eq!(code, Some(0));
    assert!(out.contains("would run  0001 initial"), "{out}");
    let (code, _, _) = run(&["migrate", "--status"], store).await;
    assert_eq!(code, Some(1), "the dry run applied nothing");
    // Piped into a reader that is gone (`| head -1`, `| true`): it ends
    // as Unix tools do, without a panic's exit 101 and backtrace.
    let mut piped = herald();
    piped
        .args(["migrate", "--status"])
        .envs(store.iter().map(|(k, v)| (*k, v.as_str())));
    let mut child = piped
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    drop(child.stdout.take());
    let out = child.wait_with_output().await.expect("wait");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() != Some(101) && !err.contains("panicked"),
        "{:?}: {err}",
        out.status
    );

    let mut gated = store.to_vec();
    gated.push(("HERALD_AUTO_MIGRATE", "false".into()));
    gated.push((
        "HERALD_LISTEN",
        format!("127.0.0.1:{}", closed_port().await),
    ));
    let (code, _, err) = run(&["serve"], &gated).await;
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("HERALD_AUTO_MIGRATE"), "{err}");
    assert!(err.contains("0001 initial"), "names what is pending: {err}");

    let (code, out, err) = run(&["migrate"], &gated).await;
    assert_eq!(code, Some(0), "{out}{err}");
    let (code, out, _) = run(&["migrate", "--status"], store).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains(" 0 pending"), "{out}");
    let (code, out, _) = run(&["migrate", "--dry-run"], store).await;
    assert_eq!(code, Some(0));
    assert!(out.contains("nothing to run"), "{out}");

    let (code, version, _) = run(&["--version"], &[]).await;
    assert_eq!(code, Some(0));
    assert!(version.contains("commit "), "{version}");
    assert!(version.contains("newest schema: SQLite "), "{version}");
}

/// `migrate --status` and `--dry-run` wait for a store they cannot reach
/// for `HERALD_DATABASE_WAIT`, as a start does, and `--status` then exits
/// 2, so that a deploy's gate tells "database down" from "migrations
/// pending" (1). Both failed at once, with the exit code of "pending".
#[tokio::test]
async fn migrate_status_waits_for_an_unreachable_store_and_exits_2() {
    let store = [
        (
            "HERALD_DATABASE_URL",
            format!("postgres://postgres@127.0.0.1:{}/x", closed_port().await),
        ),
        ("HERALD_DATABASE_WAIT", "1s".to_owned()),
    ];
    let (code, out, err) = run(&["migrate", "--status"], &store).await;
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(
        err.contains("reading the migrations of") && err.contains("unreachable for 1s"),
        "{err}"
    );
    assert!(
        err.contains("waiting for it (HERALD_DATABASE_WAIT)"),
        "{err}"
    );
    let (code, _, err) = run(&["migrate", "--dry-run"], &store).await;
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("unreachable for 1s"), "{err}");
}

/// `migrate --status`, `migrate` and `serve` all refuse the store a newer
/// Herald migrated.
async fn refused_as_newer(store: &[(&str, String)]) {
    let mut store = store.to_vec();
    store.push((
        "HERALD_LISTEN",
        format!("127.0.0.1:{}", closed_port().await),
    ));
    for args in [&["migrate", "--status"][..], &["migrate"], &["serve"]] {
        let (code, _, err) = run(args, &store).await;
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert!(err.contains("newer than this Herald"), "{args:?}: {err}");
    }
}

#[tokio::test]
async fn sqlite_migrations_are_listed_gated_and_refused_when_newer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("h.db");
    let store = [("HERALD_DATABASE_URL", format!("sqlite://{}", db.display()))];
    migrations_are_listed_gated_and_refused_when_newer(&store).await;
    // A newer Herald's schema.
    let conn = rusqlite::Connection::open(&db).expect("open");
    conn.pragma_update(None, "user_version", 999)
        .expect("bump the schema version");
    drop(conn);
    refused_as_newer(&store).await;
}

#[tokio::test]
async fn postgres_migrations_are_listed_gated_and_refused_when_newer() {
    let Some(pg) = crate::helpers::PgSchema::new(
        "binary::postgres_migrations_are_listed_gated_and_refused_when_newer",
    ) else {
        return;
    };
    let store = [
        ("HERALD_DATABASE_URL", pg.url.clone()),
        ("HERALD_DATABASE_SCHEMA", pg.schema.clone()),
    ];
    migrations_are_listed_gated_and_refused_when_newer(&store).await;
    let pool = sqlx::PgPool::connect(&pg.url).await.expect("connect");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO \"{}\"._sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (9999, 'from the future', TRUE, '\\x00'::bytea, 0)",
        pg.schema
    )))
    .execute(&pool)
    .await
    .expect("a newer Herald's migration");
    pool.close().await;
    refused_as_newer(&store).await;
    pg.drop_schema().await;
}

/// One serving process per SQLite file: a second `serve` on it is refused
/// with a clear error (two writers would each believe their leases and
/// counts their own), and the file can be served again once the first
/// process is gone, however it ended.
#[tokio::test]
async fn a_second_serve_on_one_sqlite_file_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("h.db");
    let mut first = serve(&db, &[("HERALD_ADMIN_TOKEN", TOKEN)]).await;
    let store = [
        ("HERALD_DATABASE_URL", format!("sqlite://{}", db.display())),
        (
            "HERALD_LISTEN",
            format!("127.0.0.1:{}", closed_port().await),
        ),
        ("HERALD_ADMIN_TOKEN", TOKEN.to_owned()),
    ];
    let (code, _, err) = run(&["serve"], &store).await;
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("another Herald process is serving the SQLite store"),
        "{err}"
    );
    // Safe beside it: the migration step.
    let (code, _, err) = run(&["migrate"], &store).await;
    assert_eq!(code, Some(0), "{err}");
    first.child.kill().await.expect("kill -9");
    let second = serve(&db, &[("HERALD_ADMIN_TOKEN", TOKEN)]).await;
    drop(second);
}

/// The message ids (`webhook-id`) a receiver got after its first `skip`
/// requests.
fn received_ids(rx: &crate::helpers::Receiver, skip: usize) -> HashSet<String> {
    rx.requests()
        .iter()
        .skip(skip)
        .map(|r| r.header("webhook-id"))
        .collect()
}

/// `herald backup` while Herald serves and accepts messages, then `herald
/// restore` of it: refused while serving, onto a served store, over an
/// existing file without --force, from a corrupt file or a newer schema;
/// once restored, every message answered 202 before the backup began is
/// delivered, the ones in flight at the snapshot after their lease, and
/// the replaced store is kept aside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_while_serving_then_restore_loses_nothing() {
    use crate::helpers::{Receiver, Reply};
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("h.db");
    let store_url = format!("sqlite://{}", db.display());
    let timing = [
        ("HERALD_ADMIN_TOKEN", TOKEN),
        ("HERALD_ALLOW_PRIVATE_NETWORKS", "true"),
        ("HERALD_REQUEST_TIMEOUT", "1s"),
        ("HERALD_LEASE", "3500ms"),
        ("HERALD_RETRY_SCHEDULE", "100ms,100ms,100ms,100ms"),
        ("HERALD_JITTER", "none"),
    ];
    let rx = Receiver::start().await;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    rx.always(Reply::status(200).held(&gate));
    let mut first = serve(&db, &timing).await;
    let remote = Remote::new(first.addr);
    let app = remote.app_with_endpoint(&rx.url("/hook")).await;
    let before = remote.send_all(&app, "backup.test", 20, 4).await;
    assert_eq!(before.len(), 20);
    rx.wait_for(1).await;

    // The backup runs while more messages come in.
    let target = dir.path().join("copy.db");
    let envs = [("HERALD_DATABASE_URL", store_url.clone())];
    let more = {
        let (remote, app) = (remote.clone(), app.clone());
        tokio::spawn(async move { remote.send_all(&app, "backup.test", 20, 2).await })
    };
    let (code, out, err) = run(&["backup", target.to_str().expect("path")], &envs).await;
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("messages") && out.contains("pending"), "{out}");
    // One self-contained file: nothing beside it (no -wal, -shm, .partial).
    let name = target
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    let beside: Vec<String> = std::fs::read_dir(dir.path())
        .expect("list")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&name) && *n != name)
        .collect();
    assert!(beside.is_empty(), "left beside the backup: {beside:?}");
    more.await.expect("more messages");
    // The store's write-ahead log holds what is not checkpointed yet.
    let wal = format!("{}-wal", db.display());
    for (args, says) in [
        (vec!["backup", "--force", wal.as_str()], "companion file"),
        (vec!["backup", target.to_str().expect("path")], "exists"),
        (
            vec!["backup", "--force", db.to_str().expect("path")],
            "serves",
        ),
        (vec!["restore", target.to_str().expect("path")], "serving"),
    ] {
        let (code, _, err) = run(&args, &envs).await;
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let (code, _, err) = run(
        &["backup", "--force", target.to_str().expect("path")],
        &envs,
    )
    .await;
    assert_eq!(code, Some(0), "{err}");

    // Bad backups are refused.
    let garbage = dir.path().join("garbage.db");
    std::fs::write(&garbage, b"not a database at all, not even close").expect("write");
    let newer = dir.path().join("newer.db");
    std::fs::copy(&target, &newer).expect("copy");
    rusqlite::Connection::open(&newer)
        .expect("open")
        .pragma_update(None, "user_version", 999)
        .expect("bump");
    first.child.kill().await.expect("kill -9");
    for (file, says) in [(&garbage, "not a Herald SQLite store"), (&newer, "newer")] {
        let (code, _, err) = run(&["restore", file.to_str().expect("path")], &envs).await;
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains(says), "{err}");
    }

    // Restored over the store that went on after the backup.
    // Twice at once, as an operator might: each replaced store is kept,
    // under names of their own even within one second.
    for _ in 0..2 {
        let (code, out, err) = run(&["restore", target.to_str().expect("path")], &envs).await;
        assert_eq!(code, Some(0), "{out}{err}");
        assert!(out.contains("the replaced store is at"), "{out}");
    }
    let aside: Vec<_> = std::fs::read_dir(dir.path())
        .expect("dir")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| {
            name.contains(".replaced-") && !name.ends_with("-wal") && !name.ends_with("-shm")
        })
        .collect();
    assert_eq!(
        aside.len(),
        2,
        "both replaced stores are kept aside: {aside:?}"
    );

    gate.add_permits(1_000_000);
    // Only what the restored store sends counts.
    let seen = rx.requests().len();
    let second = serve(&db, &timing).await;
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let got = received_ids(&rx, seen);
        let missing: Vec<_> = before.iter().filter(|id| !got.contains(*id)).collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "accepted before the backup, never delivered from the restored store: {missing:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(second);
}

#[tokio::test]
async fn backup_and_restore_on_postgres_name_the_tools_to_use() {
    let envs = [
        (
            "HERALD_DATABASE_URL",
            "postgres://postgres@127.0.0.1:5432/test".to_owned(),
        ),
        ("HERALD_DATABASE_SCHEMA", "herald_backup_advice".to_owned()),
    ];
    for args in [&["backup", "/tmp/x.db"][..], &["restore", "/tmp/x.db"]] {
        let (code, _, err) = run(args, &envs).await;
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("pg_dump"), "{err}");
    }
}

/// The admin token from a file (a Docker or Kubernetes secret): the real
/// binary serves with it, and never prints a generated one.
#[tokio::test]
async fn the_admin_token_can_come_from_a_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = dir.path().join("admin-token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).expect("write");
    let path = token_file.display().to_string();
    let proc = serve(
        &dir.path().join("h.db"),
        &[("HERALD_ADMIN_TOKEN_FILE", path.as_str())],
    )
    .await;
    assert!(
        !proc.first_line.contains("Generated admin token"),
        "{}",
        proc.first_line
    );
    let resp = reqwest::Client::new()
        .get(format!("http://{}/api/v1/app", proc.addr))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("herald answers");
    assert_eq!(resp.status(), StatusCode::OK);
}

/// `herald healthcheck` (a container's HEALTHCHECK): 0 while a Herald
/// serves on HERALD_LISTEN, 1 with the reason when nothing answers.
#[tokio::test]
async fn the_healthcheck_command_says_whether_herald_serves() {
    let dir = tempfile::tempdir().expect("tempdir");
    let proc = serve(&dir.path().join("h.db"), &[("HERALD_ADMIN_TOKEN", TOKEN)]).await;
    let (code, out, err) = run(
        &["healthcheck"],
        &[("HERALD_LISTEN", proc.addr.to_string())],
    )
    .await;
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("/healthz: 200"), "{out}");
    let wildcard = format!("0.0.0.0:{}", proc.addr.port());
    let (code, _, err) = run(&["healthcheck"], &[("HERALD_LISTEN", wildcard)]).await;
    assert_eq!(
        code,
        Some(0),
        "a wildcard address is asked on loopback: {err}"
    );
    drop(proc);
    let closed = closed_port().await;
    let (code, _, err) = run(
        &[
            "healthcheck",
            "--url",
            &format!("http://127.0.0.1:{closed}"),
        ],
        &[],
    )
    .await;
    assert_eq!(code, Some(1));
    assert!(
        err.contains("/healthz"),
        "the reason names what was asked: {err}"
    );
    // A `--url` that is no base URL is refused before anything is asked
    // ("builder error" at the request before), its password left out.
    for args in [
        &["healthcheck", "--url", "127.0.0.1:8080"][..],
        &[
            "dead",
            "list",
            "--token",
            TOKEN,
            "--url",
            "admin:hunter2@herald:8080",
        ],
        &[
            "token",
            "revoke",
            "tok_x",
            "--app",
            "app_x",
            "--token",
            TOKEN,
            "--url",
            "ftp://herald",
        ],
    ] {
        let (code, _, err) = run(args, &[]).await;
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains("a base URL like http://"), "{args:?}: {err}");
        assert!(!err.contains("hunter2"), "{err}");
    }
}

/// Listening on a wildcard address (as the container image does) with
/// `HERALD_PUBLIC_URL` unset, portal links name `localhost` and the
/// port, which a browser can open, where they named `0.0.0.0`.
#[tokio::test]
async fn portal_links_of_a_wildcard_listener_name_localhost() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = closed_port().await;
    let mut child = crate::helpers::binary::serve_command(&dir.path().join("h.db"), port)
        .env("HERALD_LISTEN", format!("0.0.0.0:{port}"))
        .env("HERALD_ADMIN_TOKEN", TOKEN)
        .stdout(Stdio::null())
        .spawn()
        .expect("herald starts");
    let addr = format!("127.0.0.1:{port}");
    crate::helpers::wait_healthy(&addr).await;
    let remote = Remote::new(&addr);
    let post = reqwest::Method::POST;
    let (_, app) = remote
        .call(post.clone(), "/app", Some(json!({"name": "wildcard"})))
        .await;
    let app_id = app["id"].as_str().expect("id");
    let (_, access) = remote
        .call(
            post,
            &format!("/auth/app-portal-access/{app_id}"),
            Some(json!({})),
        )
        .await;
    let url = access["url"].as_str().expect("url");
    assert!(
        url.starts_with(&format!("http://localhost:{port}/portal/")),
        "{access}"
    );
    let _ = child.kill().await;
    let _ = child.wait().await;
}

//! `herald copy-store`: the table list it copies by, against the schemas
//! the binary migrates; then the real binary moving a served store's
//! rows to another backend, interrupted and resumed, and refusing what it
//! must.

use std::time::{Duration, Instant};

use herald::store::copy::{to_target, ColumnKind, CopyValue, Present, TABLES};
use herald::store::postgres::copy::{insert_page, read_page as pg_read_page};
use herald::store::sqlite::copy::{insert_page as sqlite_insert_page, read_page};
use reqwest::Method;
use serde_json::{json, Value};
use sqlx::Connection;

use crate::helpers::binary::{herald, run, serve};
use crate::helpers::{get_as, PgSchema, Receiver, Remote, Reply, PATIENCE, TOKEN};

const KEY: &str = "BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=";
const OTHER_KEY: &str = "CQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQk=";

fn serve_env(key: &str) -> Vec<(&'static str, String)> {
    vec![
        ("HERALD_ADMIN_TOKEN", TOKEN.to_owned()),
        ("HERALD_ALLOW_PRIVATE_NETWORKS", "true".to_owned()),
        ("HERALD_ENCRYPTION_KEY", key.to_owned()),
    ]
}

fn with<'a>(envs: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    envs.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// A Herald serving a SQLite store (`source.db` in `dir`) sealed with
/// [`KEY`], and a receiver answering 200.
struct Source {
    dir: tempfile::TempDir,
    db: std::path::PathBuf,
    rx: Receiver,
    env: Vec<(&'static str, String)>,
    herald: crate::helpers::binary::Proc,
    remote: Remote,
}

impl Source {
    async fn start() -> Source {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("source.db");
        let rx = Receiver::start().await;
        rx.always(Reply::status(200));
        let env = serve_env(KEY);
        let herald = serve(&db, &with(&env)).await;
        let remote = Remote::new(herald.addr);
        Source {
            dir,
            db,
            rx,
            env,
            herald,
            remote,
        }
    }

    /// Stops Herald (kill -9): the store is the source of a copy now.
    async fn stop(&mut self) {
        self.herald.child.kill().await.expect("stop herald");
        let _ = self.herald.child.wait().await;
    }

    /// The serving environment with `HERALD_DATABASE_URL` on the source.
    fn copy_env(&self) -> Vec<(&'static str, String)> {
        let mut env = self.env.clone();
        env.push((
            "HERALD_DATABASE_URL",
            format!("sqlite://{}", self.db.display()),
        ));
        env
    }
}

/// Order 17, due at `due`, sent with the Idempotency-Key `order-17`: the
/// status and the answer.
async fn send_order_17(remote: &Remote, due: chrono::DateTime<chrono::Utc>) -> (u16, Value) {
    let sent = remote
        .client
        .post(format!("{}/app/shop/msg", remote.base))
        .bearer_auth(TOKEN)
        .header("idempotency-key", "order-17")
        .json(&json!({"eventType": "order.paid", "payload": {"order": 17}, "deliverAt": due.to_rfc3339()}))
        .send()
        .await
        .expect("send");
    let status = sent.status().as_u16();
    (status, sent.json().await.expect("json"))
}

/// The row of `table` in copy-store's closing table: (source, target).
fn tallied(out: &str, table: &str) -> (u64, u64) {
    let line = out
        .lines()
        .find(|l| l.split_whitespace().next() == Some(table))
        .unwrap_or_else(|| panic!("no row for {table} in:\n{out}"));
    let n: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(2)
        .map(|n| n.parse().expect("a count"))
        .collect();
    (n[0], n[1])
}

/// The table list names exactly the tables, columns and keys of a freshly
/// migrated PostgreSQL schema, so a new migration cannot be left out of
/// the copy unnoticed (the SQLite side: `store::copy`'s unit test).
#[tokio::test]
async fn table_list_covers_every_postgres_table_and_column() {
    PgSchema::for_test(
        "table_list_covers_every_postgres_table_and_column",
        |pg| async move {
            drop(pg.open().await);
            let mut conn = sqlx::PgConnection::connect(&pg.url).await.expect("connect");
            let columns: Vec<(String, String)> = sqlx::query_as(
                "SELECT table_name::text, column_name::text FROM information_schema.columns \
             WHERE table_schema = $1 AND table_name <> '_sqlx_migrations' \
             ORDER BY table_name, column_name",
            )
            .bind(&pg.schema)
            .fetch_all(&mut conn)
            .await
            .expect("columns");
            let mut want: Vec<(String, String)> = TABLES
                .iter()
                .filter(|t| t.on(true))
                .flat_map(|t| {
                    t.columns_on(true)
                        .map(move |c| (t.name.to_owned(), c.name.to_owned()))
                })
                .collect();
            want.sort();
            assert_eq!(columns, want);
            for t in TABLES.iter().filter(|t| t.present != Present::SqliteOnly) {
                let key: Vec<String> = sqlx::query_scalar(
                    "SELECT a.attname::text FROM pg_index i \
                 JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) \
                 WHERE i.indrelid = to_regclass($1) AND i.indisprimary \
                 ORDER BY array_position(i.indkey::int2[], a.attnum)",
                )
                .bind(format!("\"{}\".{}", pg.schema, t.name))
                .fetch_all(&mut conn)
                .await
                .expect("key");
                assert_eq!(key, t.key, "key of {}", t.name);
            }
            let _ = conn.close().await;
        },
    )
    .await;
}

/// A page read from SQLite, converted and inserted on PostgreSQL, arrives
/// with its types (JSON, booleans, NULLs); sent again, as a resumed copy
/// may, it inserts nothing and changes nothing.
#[tokio::test]
async fn a_sqlite_page_lands_on_postgres_once() {
    PgSchema::for_test("a_sqlite_page_lands_on_postgres_once", |pg| async move {
        drop(pg.open().await);
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("source.db");
        drop(
            herald::store::sqlite::SqliteStore::open(&format!("sqlite://{}", path.display()))
                .await
                .expect("open sqlite"),
        );
        let source = rusqlite::Connection::open(&path).expect("source");
        source
            .execute_batch(
                "INSERT INTO applications (id, uid, name, rate_limit, metadata, created_at, updated_at) \
                 VALUES ('app_1', NULL, 'One', 5, '{\"k\":\"v\"}', 1, 2), \
                        ('app_2', 'u2', 'Two', NULL, '{}', 3, 4);
                 INSERT INTO event_types (name, description, archived, deprecated, schemas, created_at, updated_at) \
                 VALUES ('a.b', 'AB', 1, 0, '{}', 1, 1);",
            )
            .expect("source rows");
        let mut conn = sqlx::PgConnection::connect(&pg.url).await.expect("connect");
        for name in ["applications", "event_types"] {
            let table = TABLES.iter().find(|t| t.name == name).expect("listed");
            let page = read_page(&source, table, None, 100).expect("page");
            let rows: Vec<_> = page
                .iter()
                .map(|r| to_target(table, r, false, true))
                .collect();
            let first = insert_page(&mut conn, &pg.schema, table, &rows)
                .await
                .expect("insert");
            assert_eq!(first, page.len() as u64, "{name}");
            let again = insert_page(&mut conn, &pg.schema, table, &rows)
                .await
                .expect("insert again");
            assert_eq!(again, 0, "{name} sent again");
        }
        let apps: Vec<(String, Option<String>, Option<i32>, serde_json::Value)> =
            sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "SELECT id, uid, rate_limit, metadata FROM \"{}\".applications ORDER BY id",
                pg.schema
            )))
            .fetch_all(&mut conn)
            .await
            .expect("apps");
        assert_eq!(
            apps,
            [
                ("app_1".into(), None, Some(5), serde_json::json!({"k": "v"})),
                ("app_2".into(), Some("u2".into()), None, serde_json::json!({})),
            ]
        );
        let archived: bool = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT archived FROM \"{}\".event_types WHERE name = 'a.b'",
            pg.schema
        )))
        .fetch_one(&mut conn)
        .await
        .expect("event type");
        assert!(archived);

        // And back, a row per page, into a second SQLite store: the same rows.
        let back_path = dir.path().join("back.db");
        drop(
            herald::store::sqlite::SqliteStore::open(&format!("sqlite://{}", back_path.display()))
                .await
                .expect("open sqlite"),
        );
        let mut back = rusqlite::Connection::open(&back_path).expect("back");
        for name in ["applications", "event_types"] {
            let table = TABLES.iter().find(|t| t.name == name).expect("listed");
            let mut after = None;
            loop {
                let page = pg_read_page(&mut conn, &pg.schema, table, after.as_deref(), 1)
                    .await
                    .expect("pg page");
                let Some(last) = page.last() else { break };
                after = Some(table.key_of(last, true));
                let rows: Vec<_> = page
                    .iter()
                    .map(|r| to_target(table, r, true, false))
                    .collect();
                assert_eq!(sqlite_insert_page(&mut back, table, &rows).expect("insert"), 1);
            }
            // jsonb keeps the JSON, not its spacing: compared as JSON.
            let as_json = |rows: Vec<Vec<CopyValue>>| -> Vec<Vec<CopyValue>> {
                rows.into_iter()
                    .map(|row| {
                        row.into_iter()
                            .zip(table.columns_on(false))
                            .map(|(v, c)| match (v, c.kind) {
                                (CopyValue::Text(t), ColumnKind::Json) => CopyValue::Text(
                                    serde_json::from_str::<serde_json::Value>(&t)
                                        .expect("json")
                                        .to_string(),
                                ),
                                (v, _) => v,
                            })
                            .collect()
                    })
                    .collect()
            };
            assert_eq!(
                as_json(read_page(&back, table, None, 100).expect("back page")),
                as_json(read_page(&source, table, None, 100).expect("source page")),
                "{name} round trip"
            );
        }
        let _ = conn.close().await;
    })
    .await;
}

/// A served SQLite store with rows of most kinds (sealed credentials,
/// headers, a throttle, delivered and scheduled messages, attempts,
/// stats, an app token, an idempotent request, the audit log) is copied
/// to PostgreSQL; Herald started there answers as before (the same
/// secret, the same idempotent answer, the token works) and delivers
/// the messages that were still pending, signed with the same secret.
/// Copied back to SQLite, every table holds the same rows again.
#[tokio::test]
async fn a_sqlite_store_moves_to_postgres_and_delivers_there() {
    PgSchema::for_test("a_sqlite_store_moves_to_postgres_and_delivers_there", |pg| async move {
        let mut source = Source::start().await;
        let (env, remote) = (source.env.clone(), source.remote.clone());
        let (status, _) = remote
            .call(Method::POST, "/event-type", Some(json!({"name": "order.paid", "description": "Paid"})))
            .await;
        assert_eq!(status, 201);
        let (status, app) = remote
            .call(Method::POST, "/app", Some(json!({"name": "Shop", "uid": "shop", "metadata": {"tier": "gold"}})))
            .await;
        assert_eq!(status, 201, "{app}");
        let (status, ep) = remote
            .call(
                Method::POST,
                "/app/shop/endpoint",
                Some(json!({
                    "url": source.rx.url("/hook"),
                    "uid": "main",
                    "rateLimit": 50,
                    "headers": {"X-Tenant": "t-1"},
                    "secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
                })),
            )
            .await;
        assert_eq!(status, 201, "{ep}");
        // Delivered now: attempts, stats, a throttle slot.
        for i in 0..5 {
            let (status, _) = remote
                .call(Method::POST, "/app/shop/msg", Some(json!({"eventType": "order.paid", "payload": {"i": i}})))
                .await;
            assert_eq!(status, 202);
        }
        source.rx.wait_until(PATIENCE, |got| got.len() >= 5).await;
        // Due after the move: pending when Herald stops.
        let due = chrono::Utc::now() + chrono::Duration::seconds(4);
        let mut pending = Vec::new();
        for i in 0..3 {
            let (status, msg) = remote
                .call(
                    Method::POST,
                    "/app/shop/msg",
                    Some(json!({"eventType": "order.paid", "payload": {"later": i}, "deliverAt": due.to_rfc3339()})),
                )
                .await;
            assert_eq!(status, 202, "{msg}");
            pending.push(msg["id"].as_str().expect("id").to_owned());
        }
        let (status, idempotent) = send_order_17(&remote, due).await;
        assert_eq!(status, 202);
        pending.push(idempotent["id"].as_str().expect("id").to_owned());
        let (status, token) = remote
            .call(Method::POST, "/app/shop/token", Some(json!({"name": "ci"})))
            .await;
        assert_eq!(status, 201, "{token}");
        let app_token = token["token"].as_str().expect("token").to_owned();
        let (_, secret_before) = remote.call(Method::GET, "/app/shop/endpoint/main/secret", None).await;
        source.stop().await;

        let copy_env = source.copy_env();
        let (code, out, err) = run(
            &["copy-store", "--to", &pg.url, "--to-schema", &pg.schema],
            &copy_env,
        )
        .await;
        assert_eq!(code, Some(0), "{out}\n{err}");
        for table in ["applications", "endpoints", "event_types", "messages", "deliveries", "attempts", "endpoint_stats", "api_tokens", "idempotency", "audit_log"] {
            let (from, to) = tallied(&out, table);
            assert!(from > 0, "{table} has rows to copy:\n{out}");
            assert_eq!(from, to, "{table}:\n{out}");
        }
        assert_eq!(tallied(&out, "messages").0, 9);
        assert!(out.contains("kept delivery counts:") && out.contains("equal"), "{out}");
        assert!(out.contains("throttle slots: 1"), "{out}");

        // Herald on the copy.
        let mut pg_env = env.clone();
        pg_env.push(("HERALD_DATABASE_URL", pg.url.clone()));
        pg_env.push(("HERALD_DATABASE_SCHEMA", pg.schema.clone()));
        let herald_pg = serve(&source.dir.path().join("unused.db"), &with(&pg_env)).await;
        let remote = Remote::new(herald_pg.addr);
        let (_, secret_after) = remote.call(Method::GET, "/app/shop/endpoint/main/secret", None).await;
        assert_eq!(secret_after, secret_before);
        let (status, ep) = remote.call(Method::GET, "/app/shop/endpoint/main", None).await;
        assert_eq!(status, 200);
        assert_eq!(ep["rateLimit"], 50);
        let (_, headers) = remote.call(Method::GET, "/app/shop/endpoint/main/headers", None).await;
        assert_eq!(headers["headers"]["X-Tenant"], "t-1", "{headers}");
        let (_, again) = send_order_17(&remote, due).await;
        assert_eq!(again["id"], idempotent["id"], "the stored idempotent answer moved too");
        let by_token = get_as(&remote.client, format!("{}/app/shop/msg", remote.base), &app_token).await;
        assert_eq!(by_token.status(), 200, "the app token moved too");
        let listed: Value = by_token.json().await.expect("json");
        assert_eq!(listed["data"].as_array().map(Vec::len), Some(9));

        source.rx.wait_until(PATIENCE, |got| {
            pending.iter().all(|id| got.iter().any(|r| r.header("webhook-id") == *id))
        })
        .await;
        let secret = secret_before["key"].as_str().expect("secret");
        for r in source.rx.requests().iter().filter(|r| pending.contains(&r.header("webhook-id"))) {
            r.verified_by(secret).expect("signed with the moved secret");
            assert_eq!(r.header("x-tenant"), "t-1");
        }
        drop(herald_pg);

        // And back to SQLite: the same rows in every table.
        let back = source.dir.path().join("back.db");
        let (code, out_back, err) = run(
            &["copy-store", "--to", &format!("sqlite://{}", back.display())],
            &pg_env,
        )
        .await;
        assert_eq!(code, Some(0), "{out_back}\n{err}");
        for table in ["endpoints", "messages", "deliveries", "attempts", "idempotency", "audit_log"] {
            let (from, to) = tallied(&out_back, table);
            assert_eq!(from, to, "{table}:\n{out_back}");
        }
        assert!(tallied(&out_back, "deliveries").0 >= 9);
    })
    .await;
}

/// `kill -9` in the middle of a copy: the target holds what was committed
/// and its progress; a run without `--resume` refuses it, a run with it
/// finishes, and every table then holds what the source holds.
#[tokio::test]
async fn an_interrupted_copy_refuses_a_plain_rerun_and_resumes() {
    PgSchema::for_test(
        "an_interrupted_copy_refuses_a_plain_rerun_and_resumes",
        |pg| async move {
            let mut source = Source::start().await;
            let remote = source.remote.clone();
            let app = remote.app_with_endpoint(&source.rx.url("/hook")).await;
            let sent = remote.send_all(&app, "bulk.test", 300, 8).await;
            assert_eq!(sent.len(), 300);
            source.stop().await;

            let copy_env = source.copy_env();
            // A row per page, so that the kill lands mid-table.
            let args = [
                "copy-store",
                "--to",
                pg.url.as_str(),
                "--to-schema",
                pg.schema.as_str(),
                "--page-rows",
                "1",
            ];
            let mut cmd = herald();
            cmd.args(args)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null());
            for (k, v) in &copy_env {
                cmd.env(k, v);
            }
            let mut copying = cmd.spawn().expect("copy-store starts");
            let mut conn = sqlx::PgConnection::connect(&pg.url).await.expect("connect");
            let progress_sql = format!(
                "SELECT count(*) FROM \"{}\".settings WHERE key = 'copy-store:messages'",
                pg.schema
            );
            let deadline = Instant::now() + PATIENCE;
            loop {
                let seen: Option<i64> =
                    sqlx::query_scalar(sqlx::AssertSqlSafe(progress_sql.clone()))
                        .fetch_one(&mut conn)
                        .await
                        .ok();
                if seen == Some(1) {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "the copy never reached the messages"
                );
                assert!(
                    copying.try_wait().expect("poll").is_none(),
                    "the copy ended before the kill"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            copying.kill().await.expect("SIGKILL");
            let _ = copying.wait().await;
            let copied: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "SELECT count(*) FROM \"{}\".messages",
                pg.schema
            )))
            .fetch_one(&mut conn)
            .await
            .expect("count");
            assert!(
                (1..300).contains(&copied),
                "killed mid-table: {copied} of 300"
            );

            let plain: Vec<&str> = args[..5].to_vec();
            let (code, out, err) = run(&plain, &copy_env).await;
            assert_eq!(code, Some(1), "{out}\n{err}");
            assert!(err.contains("--resume"), "{err}");

            let mut resume = plain.clone();
            resume.push("--resume");
            let (code, out, err) = run(&resume, &copy_env).await;
            assert_eq!(code, Some(0), "{out}\n{err}");
            assert_eq!(tallied(&out, "messages"), (300, 300), "{out}");
            assert_eq!(tallied(&out, "deliveries"), (300, 300), "{out}");
            let (attempts_from, attempts_to) = tallied(&out, "attempts");
            assert_eq!(attempts_from, attempts_to);
            let left: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "SELECT count(*) FROM \"{}\".settings WHERE key LIKE 'copy-store:%'",
                pg.schema
            )))
            .fetch_one(&mut conn)
            .await
            .expect("count");
            assert_eq!(left, 0, "a complete copy forgets its progress");
            let _ = conn.close().await;
        },
    )
    .await;
}

/// Bad input gets a message and exit 1, and never a target that looks
/// complete: not a URL, the store itself, a served source, a non-empty
/// target, a key that does not open the source's secrets.
#[tokio::test]
async fn copy_store_refuses_what_it_cannot_do_safely() {
    let mut source = Source::start().await;
    source
        .remote
        .app_with_endpoint(&source.rx.url("/hook"))
        .await;
    let (env, copy_env) = (source.env.clone(), source.copy_env());
    let source_url = format!("sqlite://{}", source.db.display());
    let target = source.dir.path().join("target.db");
    let target_url = format!("sqlite://{}", target.display());

    let (code, _, err) = run(&["copy-store", "--to", &target_url], &copy_env).await;
    assert_eq!(code, Some(1));
    assert!(err.contains("serving the source store"), "{err}");
    source.stop().await;

    let (code, _, err) = run(&["copy-store", "--to", "mysql://db/herald"], &copy_env).await;
    assert_eq!(code, Some(1));
    assert!(err.contains("--to") && err.contains("sqlite://"), "{err}");
    let (code, _, err) = run(&["copy-store", "--to", &source_url], &copy_env).await;
    assert_eq!(code, Some(1));
    assert!(err.contains("configured store itself"), "{err}");
    // A schema `serve` would refuse is refused before anything is opened.
    let (code, _, err) = run(
        &[
            "copy-store",
            "--to",
            "postgres://127.0.0.1:1/x",
            "--to-schema",
            "Bad-Schema",
        ],
        &copy_env,
    )
    .await;
    assert_eq!(code, Some(1));
    assert!(
        err.contains("--to-schema") && err.contains("lower-case"),
        "{err}"
    );

    // The source's secrets are sealed with KEY; a configuration without
    // it cannot open them, and the copy stops at the endpoints.
    let mut wrong = copy_env.clone();
    wrong.retain(|(k, _)| *k != "HERALD_ENCRYPTION_KEY");
    wrong.push(("HERALD_ENCRYPTION_KEY", OTHER_KEY.to_owned()));
    let (code, out, err) = run(&["copy-store", "--to", &target_url], &wrong).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(
        err.contains("column url") || err.contains("column secret"),
        "names the endpoint's column: {err}"
    );
    assert!(err.contains("HERALD_ENCRYPTION_KEY"), "{err}");
    assert!(!err.contains("whsec_"), "no secret in the error: {err}");
    let (code, _, err) = run(&["copy-store", "--to", &target_url], &copy_env).await;
    assert_eq!(code, Some(1));
    assert!(
        err.contains("interrupted copy") && err.contains("--resume"),
        "{err}"
    );
    let (code, out, err) = run(&["copy-store", "--to", &target_url, "--resume"], &copy_env).await;
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert_eq!(tallied(&out, "endpoints"), (1, 1), "{out}");

    // Complete now: neither a plain run nor --resume writes into it again.
    let (code, _, err) = run(&["copy-store", "--to", &target_url], &copy_env).await;
    assert_eq!(code, Some(1));
    assert!(err.contains("not empty"), "{err}");
    let (code, _, err) = run(&["copy-store", "--to", &target_url, "--resume"], &copy_env).await;
    assert_eq!(code, Some(1));
    assert!(err.contains("no copy in progress"), "{err}");

    // The copy serves: its endpoint opens with the same key.
    let copy = serve(&target, &with(&env)).await;
    let remote = Remote::new(copy.addr);
    let (status, apps) = remote.call(Method::GET, "/app", None).await;
    assert_eq!(status, 200);
    assert_eq!(apps["data"].as_array().map(Vec::len), Some(1));
}

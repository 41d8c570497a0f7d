//! Secrets at rest: endpoint secrets (current and rotated-out) and header
//! values are AES-256-GCM ciphertext in the SQLite file and the PostgreSQL
//! table, delivered signed all the same; plain rows are encrypted at the
//! first start with a key; a wrong or missing key stops the start; `herald
//! rotate-encryption-key` (the real binary) moves everything to the first
//! key while Herald serves.

use axum::http::StatusCode;
use base64::Engine as _;
use serde_json::json;

use herald::config::Config;
use herald::server::{self, Role};

use crate::helpers::*;

crate::on_both_stores!(Db =>
    secrets_are_ciphertext_at_rest_and_delivered_signed,
    idempotent_answers_keep_no_secret,
    plain_rows_are_encrypted_at_the_first_start_with_a_key,
    rotate_encryption_key_moves_everything_to_the_first_key,
    one_unreadable_row_spoils_nothing_else,
    url_credentials_are_sealed_and_masked,
    idempotent_requests_are_kept_as_keyed_digests,
);

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const NEW_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
const AUTH: &str = "Bearer customer-credential-7f3a";

fn key(seed: u8) -> String {
    base64::engine::general_purpose::STANDARD.encode([seed; 32])
}

fn key_id(seed: u8) -> String {
    herald::crypto::key_id(&[seed; 32])
}

/// Where the data lives across restarts.
enum Db {
    Sqlite(tempfile::TempDir),
    Postgres(PgSchema),
}

impl Db {
    fn sqlite() -> Db {
        Db::Sqlite(tempfile::tempdir().expect("tempdir"))
    }

    fn postgres(test: &str) -> Option<Db> {
        PgSchema::new(test).map(Db::Postgres)
    }

    fn url(&self) -> String {
        match self {
            Db::Sqlite(dir) => format!("sqlite://{}", dir.path().join("herald.db").display()),
            Db::Postgres(pg) => pg.url.clone(),
        }
    }

    fn env(&self) -> Vec<(String, String)> {
        let mut env = vec![("HERALD_DATABASE_URL".to_owned(), self.url())];
        if let Db::Postgres(pg) = self {
            env.push(("HERALD_DATABASE_SCHEMA".to_owned(), pg.schema.clone()));
        }
        env
    }

    fn config(&self, keys: Option<&str>) -> Config {
        let env = self.env();
        let mut overrides: Vec<(&str, &str)> =
            env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        if let Some(k) = keys {
            overrides.push(("HERALD_ENCRYPTION_KEY", k));
        }
        let dir = tempfile::tempdir().expect("tempdir");
        test_config(dir.path(), &overrides)
    }

    async fn try_start(&self, keys: Option<&str>) -> anyhow::Result<TestApp> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let running = server::start(self.config(keys), Some(listener), Role::Api).await?;
        let base = format!("http://{}", running.addr.expect("the API listens"));
        Ok(TestApp {
            running: Some(running),
            base,
            client: reqwest::Client::new(),
            _dir: tempfile::tempdir().expect("tempdir"),
        })
    }

    async fn start(&self, keys: Option<&str>) -> TestApp {
        self.try_start(keys).await.expect("herald starts")
    }

    async fn start_fails(&self, keys: Option<&str>) -> String {
        match self.try_start(keys).await {
            Ok(app) => {
                app.shutdown().await;
                panic!("herald must not start with keys {keys:?}");
            }
            Err(e) => format!("{e:#}"),
        }
    }

    /// The endpoint's `secret`, `old_secrets` and `headers` as stored.
    async fn raw(&self, ep: &str) -> (String, String, String) {
        (
            self.raw_column(ep, "secret").await,
            self.raw_column(ep, "old_secrets").await,
            self.raw_column(ep, "headers").await,
        )
    }

    /// One column of the endpoint's row, as stored.
    async fn raw_column(&self, ep: &str, column: &str) -> String {
        match self {
            Db::Sqlite(dir) => {
                let conn = rusqlite::Connection::open(dir.path().join("herald.db")).expect("open");
                conn.query_row(
                    &format!("SELECT {column} FROM endpoints WHERE id = ?1"),
                    [ep],
                    |r| r.get(0),
                )
                .expect("row")
            }
            Db::Postgres(pg) => {
                let pool = sqlx::PgPool::connect(&pg.url).await.expect("connect");
                let value: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "SELECT {column} FROM \"{}\".endpoints WHERE id = $1",
                    pg.schema
                )))
                .bind(ep)
                .fetch_one(&pool)
                .await
                .expect("row");
                pool.close().await;
                value
            }
        }
    }

    /// Overwrites one column of the endpoint's row.
    async fn set_raw_column(&self, ep: &str, column: &str, stored: &str) {
        match self {
            Db::Sqlite(dir) => {
                let conn = rusqlite::Connection::open(dir.path().join("herald.db")).expect("open");
                conn.busy_timeout(PATIENCE).expect("busy timeout");
                conn.execute(
                    &format!("UPDATE endpoints SET {column} = ?1 WHERE id = ?2"),
                    [stored, ep],
                )
                .expect("update");
            }
            Db::Postgres(pg) => {
                let pool = sqlx::PgPool::connect(&pg.url).await.expect("connect");
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE \"{}\".endpoints SET {column} = $1 WHERE id = $2",
                    pg.schema
                )))
                .bind(stored)
                .bind(ep)
                .execute(&pool)
                .await
                .expect("update");
                pool.close().await;
            }
        }
    }

    /// Every kept Idempotency-Key answer: its status and body as stored.
    /// The kept answers: status, body and the request's digest as kept.
    async fn idempotency_rows(&self) -> Vec<(i64, String, String)> {
        match self {
            Db::Sqlite(dir) => {
                let conn = rusqlite::Connection::open(dir.path().join("herald.db")).expect("open");
                let mut stmt = conn
                    .prepare(
                        "SELECT status, body, request_hash FROM idempotency ORDER BY created_at",
                    )
                    .expect("prepare");
                let rows = stmt
                    .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                    .expect("query")
                    .collect::<Result<Vec<(i64, String, String)>, _>>()
                    .expect("rows");
                rows
            }
            Db::Postgres(pg) => {
                use sqlx::Row;
                let pool = sqlx::PgPool::connect(&pg.url).await.expect("connect");
                let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
                    "SELECT status, body, request_hash FROM \"{}\".idempotency ORDER BY created_at",
                    pg.schema
                )))
                .fetch_all(&pool)
                .await
                .expect("rows");
                pool.close().await;
                rows.iter()
                    .map(|r| (i64::from(r.get::<i32, _>(0)), r.get(1), r.get(2)))
                    .collect()
            }
        }
    }

    async fn done(self) {
        if let Db::Postgres(pg) = self {
            pg.drop_schema().await;
        }
    }
}

fn verifies_with(secret: &str, r: &Recorded) -> bool {
    r.verified_by(secret).is_ok()
}

/// An endpoint with [`SECRET`] and an `Authorization` header.
async fn endpoint(app: &TestApp, rx: &Receiver) -> (String, String) {
    let extra = json!({"secret": SECRET, "headers": {"Authorization": AUTH}});
    app.app_with_endpoint(&rx.url("/hook"), extra).await
}

fn assert_sealed(value: &str, key: u8, plain: &[&str]) {
    assert!(
        value.starts_with(&format!("enc:v1:{}:", key_id(key))),
        "sealed with key {key}: {value}"
    );
    for p in plain {
        assert!(!value.contains(p), "no plain text in {value}");
    }
}

async fn secrets_are_ciphertext_at_rest_and_delivered_signed(db: Db) {
    let k1 = key(1);
    let app = db.start(Some(&k1)).await;
    let rx = Receiver::start().await;
    let (app_id, ep) = endpoint(&app, &rx).await;

    let (secret, old, headers) = db.raw(&ep).await;
    assert_sealed(&secret, 1, &[SECRET, "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]);
    assert_sealed(&headers, 1, &[AUTH, "customer-credential"]);
    assert_eq!(old, "[]", "no rotated secrets: nothing to hide");

    // The API shows what it always showed.
    assert_eq!(app.endpoint_secret(&app_id, &ep).await, SECRET);
    let (_, got) = app
        .get(&format!("/api/v1/app/{app_id}/endpoint/{ep}/headers"))
        .await;
    // A credential's value is never shown again, only its name.
    assert!(got["headers"].get("Authorization").is_none(), "{got}");
    assert_eq!(got["sensitive"], json!(["Authorization"]), "{got}");

    app.send_message(&app_id, "a.b", json!({"n": 1})).await;
    app.step().await;
    let got = rx.wait_for(1).await;
    assert!(
        verifies_with(SECRET, &got[0]),
        "signed with the plain secret"
    );
    assert_eq!(got[0].header("authorization"), AUTH);

    // A rotation keeps the old secret, encrypted too.
    let (status, body) = app
        .post(
            &format!("/api/v1/app/{app_id}/endpoint/{ep}/secret/rotate"),
            json!({"key": NEW_SECRET, "gracePeriodSeconds": 3600}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (secret, old, _) = db.raw(&ep).await;
    assert_sealed(&secret, 1, &[NEW_SECRET, SECRET]);
    assert_sealed(&old, 1, &[SECRET, "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]);
    app.send_message(&app_id, "a.b", json!({"n": 2})).await;
    app.step().await;
    let got = rx.wait_for(2).await;
    assert!(verifies_with(NEW_SECRET, &got[1]));
    assert!(
        verifies_with(SECRET, &got[1]),
        "the old one during the grace"
    );
    app.shutdown().await;
    db.done().await;
}

/// `POST path` with the admin token and an `Idempotency-Key`: status,
/// whether it was a replay, and the JSON body.
async fn post_with_key(
    app: &TestApp,
    path: &str,
    key: &str,
    body: serde_json::Value,
) -> (StatusCode, bool, serde_json::Value) {
    let (status, replayed, text) = app.as_token(TOKEN).post_keyed(path, key, body).await;
    let body = serde_json::from_str(&text).expect("a JSON body");
    (status, replayed, body)
}

/// The answers that show a secret once (a rotated endpoint secret, an
/// application token, a portal link's code and token), asked for with an
/// `Idempotency-Key` as the SDKs do, leave no secret in the stored
/// answers, with no encryption key at all; a repeat with the same key is
/// a 409 that shows none and changes nothing; other answers still replay.
async fn idempotent_answers_keep_no_secret(db: Db) {
    let app = db.start(None).await;
    let rx = Receiver::start().await;
    let (app_id, ep) = endpoint(&app, &rx).await;
    let calls = [
        (
            format!("/api/v1/app/{app_id}/endpoint/{ep}/secret/rotate"),
            json!({"key": NEW_SECRET}),
        ),
        (format!("/api/v1/app/{app_id}/token"), json!({"name": "ci"})),
        (
            format!("/api/v1/auth/app-portal-access/{app_id}"),
            json!({}),
        ),
        (format!("/api/v1/auth/dashboard-access/{app_id}"), json!({})),
    ];
    let mut secrets = vec![
        NEW_SECRET.to_owned(),
        "C2FVsBQIhrscChlQIMV".to_owned(),
        SECRET.to_owned(),
    ];
    for (i, (path, body)) in calls.iter().enumerate() {
        let (status, replayed, out) =
            post_with_key(&app, path, &format!("auto_{i}"), body.clone()).await;
        assert!(status.is_success(), "{path}: {status} {out}");
        assert!(!replayed, "{path}");
        for field in ["key", "token"] {
            if let Some(secret) = out[field].as_str() {
                secrets.push(secret.to_owned());
            }
        }
        if let Some(url) = out["url"].as_str() {
            let code = url.split("code=").nth(1).expect("the link's code");
            secrets.push(code.to_owned());
        }
    }
    assert_eq!(secrets.len(), 3 + 1 + 1 + 2 + 2, "{secrets:?}");

    let rows = db.idempotency_rows().await;
    assert_eq!(rows.len(), calls.len(), "one record a key: {rows:?}");
    for (status, body, _) in &rows {
        assert_eq!(*status, 409, "{body}");
        for secret in &secrets {
            assert!(!body.contains(secret.as_str()), "{secret} is kept: {body}");
        }
        assert!(
            !body.contains("whsec_") && !body.contains("hrld_app_"),
            "{body}"
        );
    }

    // A repeat (the SDK retrying) shows no secret and does nothing again.
    for (i, (path, body)) in calls.iter().enumerate() {
        let (status, replayed, out) =
            post_with_key(&app, path, &format!("auto_{i}"), body.clone()).await;
        assert_eq!(status, StatusCode::CONFLICT, "{path}: {out}");
        assert!(replayed, "{path}");
        assert_eq!(out["code"], "conflict", "{out}");
        assert!(
            out["detail"]
                .as_str()
                .expect("detail")
                .contains("new Idempotency-Key"),
            "{out}"
        );
        let text = out.to_string();
        for secret in &secrets {
            assert!(
                !text.contains(secret.as_str()),
                "{secret} shown again: {text}"
            );
        }
    }
    let (status, tokens) = app.get(&format!("/api/v1/app/{app_id}/token")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        tokens["data"].as_array().map(Vec::len),
        Some(3),
        "one token per call, none for the repeats: {tokens}"
    );
    let current = app.endpoint_secret(&app_id, &ep).await;
    assert_eq!(current, NEW_SECRET, "not rotated again");

    // An answer with no secret is kept and replayed as before.
    let path = format!("/api/v1/app/{app_id}/msg");
    let msg = json!({"eventType": "a.b", "payload": {"n": 1}});
    let (first, _, sent) = post_with_key(&app, &path, "auto_msg", msg.clone()).await;
    assert_eq!(first, StatusCode::ACCEPTED, "{sent}");
    let (again, replayed, resent) = post_with_key(&app, &path, "auto_msg", msg).await;
    assert_eq!((again, replayed), (StatusCode::ACCEPTED, true));
    assert_eq!(resent["id"], sent["id"]);

    // An answer that shows an endpoint URL's credentials (creating the
    // endpoint, disabling and enabling it) is kept with them masked: the
    // caller got them whole, a repeat gets the same endpoint masked.
    let with_password = rx.url("/hook").replace("http://", "http://bob:hunter2@");
    let (status, _, created) = post_with_key(
        &app,
        &format!("/api/v1/app/{app_id}/endpoint"),
        "auto_ep",
        json!({"url": with_password}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["url"], with_password.as_str());
    let ep2 = created["id"].as_str().expect("id");
    for (i, action) in ["disable", "enable"].iter().enumerate() {
        let path = format!("/api/v1/app/{app_id}/endpoint/{ep2}/{action}");
        let (status, _, out) =
            post_with_key(&app, &path, &format!("auto_{action}"), json!({})).await;
        assert!(status.is_success(), "{action}: {status} {out}");
        let shown = if i == 0 {
            &out["url"]
        } else {
            &out["endpoint"]["url"]
        };
        assert_eq!(*shown, with_password.as_str(), "{action}: {out}");
    }
    let rows = db.idempotency_rows().await;
    assert!(rows.len() >= calls.len() + 4, "{rows:?}");
    for (_, body, _) in &rows {
        assert!(
            !body.contains("hunter2"),
            "the URL's password is kept: {body}"
        );
    }
    let (again, replayed, out) = post_with_key(
        &app,
        &format!("/api/v1/app/{app_id}/endpoint"),
        "auto_ep",
        json!({"url": with_password}),
    )
    .await;
    assert_eq!((again, replayed), (StatusCode::CREATED, true), "{out}");
    assert_eq!(out["id"], created["id"], "the same endpoint, not a second");
    assert!(out["url"].as_str().expect("url").contains("****@"), "{out}");
    app.shutdown().await;
    db.done().await;
}

async fn plain_rows_are_encrypted_at_the_first_start_with_a_key(db: Db) {
    let rx = Receiver::start().await;
    let app = db.start(None).await;
    let (app_id, ep) = endpoint(&app, &rx).await;
    let (secret, _, headers) = db.raw(&ep).await;
    assert_eq!(secret, SECRET, "without a key: plain text");
    assert!(headers.contains(AUTH));
    app.shutdown().await;

    // The first start with a key encrypts what was plain.
    let app = db.start(Some(&key(1))).await;
    let (secret, _, headers) = db.raw(&ep).await;
    assert_sealed(&secret, 1, &[SECRET]);
    assert_sealed(&headers, 1, &[AUTH]);
    app.shutdown().await;
    // Nor are the plain values left in the file's free space or its log.
    if let Db::Sqlite(dir) = &db {
        let plain = SECRET.trim_start_matches("whsec_");
        for file in ["herald.db", "herald.db-wal"] {
            let bytes = std::fs::read(dir.path().join(file)).unwrap_or_default();
            for needle in [plain, AUTH] {
                assert!(
                    !bytes.windows(needle.len()).any(|w| w == needle.as_bytes()),
                    "{needle} is still in {file}"
                );
            }
        }
    }

    // Without the key, or with another: no start, and the message says why.
    for keys in [None, Some(key(2))] {
        let err = db.start_fails(keys.as_deref()).await;
        assert!(err.contains("HERALD_ENCRYPTION_KEY"), "{err}");
        assert!(err.contains(&key_id(1)), "names the key id: {err}");
        assert!(!err.contains(SECRET) && !err.contains(&key(1)), "{err}");
    }

    // A new key first, the old one after: starts, reads, delivers.
    let app = db.start(Some(&format!("{},{}", key(2), key(1)))).await;
    assert_eq!(app.endpoint_secret(&app_id, &ep).await, SECRET);
    app.send_message(&app_id, "a.b", json!({})).await;
    app.step().await;
    let got = rx.wait_for(1).await;
    assert!(verifies_with(SECRET, &got[0]));
    assert_eq!(got[0].header("authorization"), AUTH);
    // Reading does not re-encrypt: that is rotate-encryption-key's job.
    assert_sealed(&db.raw(&ep).await.0, 1, &[SECRET]);
    app.shutdown().await;
    db.done().await;
}

async fn rotate_encryption_key_moves_everything_to_the_first_key(db: Db) {
    let rx = Receiver::start().await;
    let app = db.start(Some(&key(1))).await;
    let (app_id, ep) = endpoint(&app, &rx).await;
    // A second endpoint with a rotated-out secret, so all three columns move.
    let (_, ep2) = endpoint(&app, &rx).await;
    let (status, _) = app
        .post(
            &format!("/api/v1/app/{app_id}/endpoint/{ep}/secret/rotate"),
            json!({"key": NEW_SECRET, "gracePeriodSeconds": 3600}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    app.shutdown().await;

    // Rolled: new key first, old kept; the command runs while it serves.
    let both = format!("{},{}", key(2), key(1));
    let app = db.start(Some(&both)).await;
    let stdout = rotate_encryption_key(&db, &both).await;
    assert!(stdout.contains("re-encrypted 2 endpoint rows"), "{stdout}");
    for id in [&ep, &ep2] {
        let (secret, old, headers) = db.raw(id).await;
        assert_sealed(&secret, 2, &[SECRET, NEW_SECRET]);
        assert_sealed(&headers, 2, &[AUTH]);
        if *id == ep {
            assert_sealed(&old, 2, &[SECRET]);
        }
    }
    // The serving process goes on reading and sending.
    app.send_message(&app_id, "a.b", json!({})).await;
    app.step().await;
    let got = rx.wait_for(1).await;
    assert_eq!(got[0].header("authorization"), AUTH);
    assert!(verifies_with(NEW_SECRET, &got[0]));
    assert!(verifies_with(SECRET, &got[0]), "the rotated-out one too");
    app.shutdown().await;

    // Run again: nothing left to do.
    let stdout = rotate_encryption_key(&db, &both).await;
    assert!(stdout.contains("re-encrypted 0 endpoint rows"), "{stdout}");

    // The old key alone no longer opens anything; the new one alone does.
    let err = db.start_fails(Some(&key(1))).await;
    assert!(err.contains("HERALD_ENCRYPTION_KEY"), "{err}");
    let app = db.start(Some(&key(2))).await;
    assert_eq!(app.endpoint_secret(&app_id, &ep).await, NEW_SECRET);
    app.shutdown().await;
    db.done().await;
}

/// `herald rotate-encryption-key` with `keys`, on `db`'s store; its stdout.
async fn rotate_encryption_key(db: &Db, keys: &str) -> String {
    let mut cmd = crate::helpers::binary::herald();
    cmd.arg("rotate-encryption-key")
        .env("HERALD_ENCRYPTION_KEY", keys)
        .envs(db.env());
    crate::helpers::binary::succeeds(&mut cmd).await
}

/// A secret this process cannot decrypt (written by one with another key)
/// is never sent: the attempt fails as a network error saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_that_does_not_decrypt_is_never_sent() {
    let db = Db::sqlite();
    let app = db.start(Some(&key(1))).await;
    let rx = Receiver::start().await;
    let (app_id, ep) = endpoint(&app, &rx).await;
    // Another process, with only key 3, rotated the secret meanwhile.
    let other = herald::crypto::Keyring::from_keys(&[[3; 32]]);
    let sealed =
        herald::store::seal_column(&other, &ep, herald::store::SecretColumn::Secret, NEW_SECRET);
    let Db::Sqlite(dir) = &db else { unreachable!() };
    let conn = rusqlite::Connection::open(dir.path().join("herald.db")).expect("open");
    conn.busy_timeout(PATIENCE).expect("busy timeout");
    conn.execute(
        "UPDATE endpoints SET secret = ?1 WHERE id = ?2",
        [&sealed, &ep],
    )
    .expect("update");
    let msg = app.send_message(&app_id, "a.b", json!({})).await;
    app.step().await;
    let attempts = app.attempts_of_msg(&app_id, &msg).await;
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    let text = attempts[0].to_string();
    assert!(text.contains("HERALD_ENCRYPTION_KEY"), "{text}");
    assert!(text.contains("not sent"), "{text}");
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(rx.requests().is_empty(), "nothing reached the receiver");
    app.shutdown().await;
}

/// One endpoint whose stored secret does not open (here: another row's
/// ciphertext swapped in, as a bad restore or a key roll would leave it)
/// is shown as unreadable and sent nothing; the list, the dashboard and
/// the other endpoints carry on.
async fn one_unreadable_row_spoils_nothing_else(db: Db) {
    let app = db.start(Some(&key(1))).await;
    let rx = Receiver::start().await;
    let (app_id, bad) = endpoint(&app, &rx).await;
    let good = app
        .create_endpoint(&app_id, &rx.url("/good"), json!({"secret": NEW_SECRET}))
        .await;
    let good = good["id"].as_str().expect("id").to_owned();
    let good_secret = db.raw_column(&good, "secret").await;
    db.set_raw_column(&bad, "secret", &good_secret).await;

    let (status, list) = app.get(&format!("/api/v1/app/{app_id}/endpoint")).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let data = list["data"].as_array().expect("data");
    assert_eq!(data.len(), 2, "{list}");
    for ep in data {
        let unreadable = ep["id"] == json!(bad);
        assert_eq!(
            ep.get("unreadable").cloned().unwrap_or(json!(false)),
            json!(unreadable),
            "{ep}"
        );
    }
    for what in ["secret", "headers"] {
        let (status, out) = app
            .get(&format!("/api/v1/app/{app_id}/endpoint/{bad}/{what}"))
            .await;
        assert_eq!(status, StatusCode::CONFLICT, "{what}: {out}");
        assert!(out.to_string().contains("HERALD_ENCRYPTION_KEY"), "{out}");
        assert!(!out.to_string().contains(NEW_SECRET), "{out}");
    }
    let browser = logged_in(&app).await;
    let page = browser
        .get(app.url("/dashboard"))
        .send()
        .await
        .expect("herald answers");
    assert_eq!(page.status(), StatusCode::OK);
    assert!(page.text().await.expect("page").contains("unreadable"));

    let msg = app.send_message(&app_id, "a.b", json!({})).await;
    app.step().await;
    let got = rx.wait_for(1).await;
    assert_eq!(got.len(), 1, "only the readable endpoint got it");
    assert!(got[0].path.ends_with("/good"), "{:?}", got[0].path);
    assert!(verifies_with(NEW_SECRET, &got[0]));
    let attempts = app.attempts_of_msg(&app_id, &msg).await;
    assert!(
        attempts.iter().any(|a| a.to_string().contains("not sent")),
        "{attempts:?}"
    );
    app.shutdown().await;
    db.done().await;
}

/// Credentials in an endpoint's URL (userinfo) are sealed at rest like the
/// secret, used when sending, and shown masked to whoever may not read the
/// secret (a read-only portal token, its pages) and in the attempt log.
async fn url_credentials_are_sealed_and_masked(db: Db) {
    const PASS: &str = "url-pass-93e1";
    let app = db.start(Some(&key(1))).await;
    let rx = Receiver::start().await;
    let app_id = app.create_app().await;
    let url = rx
        .url("/hook")
        .replace("http://", &format!("http://hook-user:{PASS}@"));
    let ep = app
        .create_endpoint(&app_id, &url, json!({"secret": SECRET}))
        .await;
    let ep = ep["id"].as_str().expect("id").to_owned();

    let stored = db.raw_column(&ep, "url").await;
    assert_sealed(&stored, 1, &[PASS, "hook-user"]);

    // The admin (who may read the secret) sees the URL as given.
    let (status, got) = app
        .get(&format!("/api/v1/app/{app_id}/endpoint/{ep}"))
        .await;
    assert_eq!(status, StatusCode::OK, "{got}");
    assert_eq!(got["url"], json!(url));

    // Sent with the credentials (reqwest makes them Basic auth).
    let msg = app.send_message(&app_id, "a.b", json!({})).await;
    app.step().await;
    let got = rx.wait_for(1).await;
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("hook-user:{PASS}"));
    assert_eq!(got[0].header("authorization"), format!("Basic {basic}"));
    assert!(verifies_with(SECRET, &got[0]));

    // A read-only portal token sees it masked, in the API and its pages;
    // the attempt log holds it masked.
    let (status, out) = app
        .post(
            &format!("/api/v1/auth/app-portal-access/{app_id}"),
            json!({"capabilities": ["ViewBase"]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{out}");
    let token = out["token"].as_str().expect("token");
    for path in [
        format!("/api/v1/app/{app_id}/endpoint/{ep}"),
        format!("/api/v1/app/{app_id}/endpoint"),
        format!("/api/v1/app/{app_id}/attempt/endpoint/{ep}"),
        format!("/api/v1/app/{app_id}/msg/{msg}/endpoint"),
    ] {
        let (status, got) = app.as_token(token).get(&path).await;
        assert_eq!(status, StatusCode::OK, "{path}: {got}");
        let text = got.to_string();
        assert!(!text.contains(PASS), "{path}: {text}");
        assert!(!text.contains("hook-user"), "{path}: {text}");
    }
    let (_, one) = app
        .as_token(token)
        .get(&format!("/api/v1/app/{app_id}/endpoint/{ep}"))
        .await;
    assert!(one["url"].as_str().expect("url").contains("****@"), "{one}");
    let link = out["url"].as_str().expect("link");
    let parsed = url::Url::parse(link).expect("link");
    let browser = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let login = browser
        .get(app.url(&format!(
            "{}?{}",
            parsed.path(),
            parsed.query().unwrap_or("")
        )))
        .send()
        .await
        .expect("login");
    let cookie = cookie_pair(login.headers());
    for page in [
        "/portal".to_owned(),
        format!("/portal/endpoint/{ep}"),
        format!("/portal/msg/{msg}"),
    ] {
        let html = browser
            .get(app.url(&page))
            .header("cookie", &cookie)
            .text_answer()
            .await;
        assert!(!html.contains(PASS), "{page}: {html}");
        assert!(html.contains("****@"), "{page} shows the endpoint masked");
    }
    app.shutdown().await;
    db.done().await;
}

/// With a key, a request sent with an Idempotency-Key is kept as a keyed
/// digest, not the SHA-256 of its method, path and body, against which
/// whoever holds the database could test guesses of a credential it
/// carried; a repeat replays, also once a new key is put first.
async fn idempotent_requests_are_kept_as_keyed_digests(db: Db) {
    // Kept before the key was set: still replayed after.
    let app = db.start(None).await;
    let (status, _, before) =
        post_with_key(&app, "/api/v1/app", "before", json!({"name": "B"})).await;
    assert_eq!(status, StatusCode::CREATED, "{before}");
    app.shutdown().await;
    let app = db.start(Some(&key(1))).await;
    let (status, replayed, again) =
        post_with_key(&app, "/api/v1/app", "before", json!({"name": "B"})).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, true), "{again}");
    assert_eq!(again["id"], before["id"]);
    let app_id = app.create_app().await;
    let path = format!("/api/v1/app/{app_id}/endpoint");
    let body = json!({"url": "https://admin:hunter2@example.com/x"});
    let (status, _, created) = post_with_key(&app, &path, "guess", body.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let hex = |d: [u8; 32]| d.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let plain: Vec<String> = [path.clone(), format!("/app/{app_id}/endpoint")]
        .iter()
        .map(|p| {
            let uri = p.parse().expect("uri");
            let method = axum::http::Method::POST;
            hex(herald::api::idempotency::request_digest(
                &method,
                &uri,
                body.to_string().as_bytes(),
            ))
        })
        .collect();
    let rows = db.idempotency_rows().await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(!plain.contains(&rows[1].2), "kept as the plain digest");
    app.shutdown().await;

    let app = db.start(Some(&format!("{},{}", key(2), key(1)))).await;
    let (status, replayed, again) = post_with_key(&app, &path, "guess", body).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, true), "{again}");
    assert_eq!(again["id"], created["id"]);
    app.shutdown().await;
    db.done().await;
}

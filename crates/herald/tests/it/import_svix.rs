//! `herald import-svix`, against a real second Herald as the source
//! (Herald speaks Svix's API v1): every field carried over, the source's
//! secret signing on the target, a second run changing nothing, and a
//! source that fails or does not speak the API refused with nothing
//! reported as done.

use reqwest::Method;
use serde_json::{json, Value};

use crate::helpers::binary::{run, serve, Proc};
use crate::helpers::{get_as, Receiver, Remote, Reply, PATIENCE, TOKEN};

fn env() -> Vec<(&'static str, String)> {
    vec![
        ("HERALD_ADMIN_TOKEN", TOKEN.to_owned()),
        ("HERALD_ALLOW_PRIVATE_NETWORKS", "true".to_owned()),
    ]
}

fn on(db: &std::path::Path) -> Vec<(&'static str, String)> {
    let mut e = env();
    e.push(("HERALD_DATABASE_URL", format!("sqlite://{}", db.display())));
    e
}

/// `herald serve` on `db` with the admin token, allowed to reach the
/// receivers on loopback; and a client of its API.
async fn serve_reaching_receivers(db: &std::path::Path) -> (Proc, Remote) {
    let proc = serve(
        db,
        &[
            ("HERALD_ADMIN_TOKEN", TOKEN),
            ("HERALD_ALLOW_PRIVATE_NETWORKS", "true"),
        ],
    )
    .await;
    let remote = Remote::new(proc.addr);
    (proc, remote)
}

/// Creates the application `uid`, named as its uid.
async fn app_named(remote: &Remote, uid: &str) -> Value {
    ok(
        remote,
        Method::POST,
        "/app",
        json!({"name": uid, "uid": uid}),
    )
    .await
}

async fn ok(remote: &Remote, method: Method, path: &str, body: Value) -> Value {
    let (status, answer) = remote.call(method, path, Some(body)).await;
    assert!((200..300).contains(&status), "{path}: {status} {answer}");
    answer
}

async fn get(remote: &Remote, path: &str) -> Value {
    let (status, answer) = remote.call(Method::GET, path, None).await;
    assert_eq!(status, 200, "{path}: {answer}");
    answer
}

/// `data` of a list, each object with only `fields`, sorted.
async fn listed(remote: &Remote, path: &str, fields: &[&str]) -> Vec<Value> {
    let page = get(remote, path).await;
    let mut rows: Vec<Value> = page["data"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|o| {
            json!(fields
                .iter()
                .map(|f| (f.to_string(), o[f].clone()))
                .collect::<serde_json::Map<_, _>>())
        })
        .collect();
    rows.sort_by_key(Value::to_string);
    rows
}

/// The target lists at `path` what the source does (`fields` of each).
async fn assert_listed_alike(target: &Remote, source: &Remote, path: &str, fields: &[&str]) {
    assert_eq!(
        listed(target, path, fields).await,
        listed(source, path, fields).await,
        "{path}"
    );
}

/// `herald import-svix --url base --token TOKEN extra…` into `target_db`.
async fn import(
    base: &str,
    target_db: &std::path::Path,
    extra: &[&str],
) -> (Option<i32>, String, String) {
    let mut args = vec!["import-svix", "--url", base, "--token", TOKEN];
    args.extend_from_slice(extra);
    run(&args, &on(target_db)).await
}

/// The (created, updated, unchanged, failed) row of `kind` in the summary.
fn row(out: &str, kind: &str) -> [u64; 4] {
    let line = out
        .lines()
        .find(|l| l.starts_with(kind))
        .unwrap_or_else(|| panic!("no {kind} row in:\n{out}"));
    let n: Vec<u64> = line[kind.len()..]
        .split_whitespace()
        .map(|n| n.parse().expect("a count"))
        .collect();
    [n[0], n[1], n[2], n[3]]
}

#[tokio::test]
async fn import_svix_carries_every_field_and_the_secret_and_runs_again_unchanged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::start().await;
    rx.always(Reply::status(200));
    let source_db = dir.path().join("source.db");
    let (_source_proc, source) = serve_reaching_receivers(&source_db).await;
    ok(&source, Method::POST, "/event-type", json!({"name": "order.paid", "description": "Paid", "schemas": {"1": {"type": "object"}}, "groupName": "orders"})).await;
    ok(
        &source,
        Method::POST,
        "/event-type",
        json!({"name": "order.beta", "description": "Beta", "featureFlag": "beta"}),
    )
    .await;
    ok(
        &source,
        Method::POST,
        "/event-type",
        json!({"name": "order.old", "description": "Old", "archived": true, "deprecated": true}),
    )
    .await;
    ok(
        &source,
        Method::POST,
        "/app",
        json!({"name": "Shop", "uid": "shop", "metadata": {"tier": "gold"}, "rateLimit": 70}),
    )
    .await;
    let no_uid = ok(&source, Method::POST, "/app", json!({"name": "No uid"})).await;
    let main = ok(
        &source,
        Method::POST,
        "/app/shop/endpoint",
        json!({
            "url": rx.url("/main"),
            "uid": "main",
            "description": "Main receiver",
            "filterTypes": ["order.paid", "order.beta"],
            "channels": ["eu", "vip"],
            "rateLimit": 25,
            "metadata": {"team": "payments"},
            "headers": {"X-Tenant": "t-1", "Authorization": "Bearer hidden"}
        }),
    )
    .await;
    ok(
        &source,
        Method::POST,
        "/app/shop/endpoint",
        json!({"url": rx.url("/off"), "uid": "off", "disabled": true}),
    )
    .await;
    ok(
        &source,
        Method::POST,
        &format!("/app/{}/endpoint", no_uid["id"].as_str().expect("id")),
        json!({"url": rx.url("/anon"), "description": "no uid"}),
    )
    .await;
    ok(
        &source,
        Method::POST,
        "/app/shop/endpoint/main/secret/rotate",
        json!({"key": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}),
    )
    .await;
    let source_secret = get(&source, "/app/shop/endpoint/main/secret").await["key"].clone();
    assert_eq!(source_secret, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");

    let target_db = dir.path().join("target.db");
    let base = source.base.replace("/api/v1", "");
    let (code, out, err) = import(&base, &target_db, &[]).await;
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert_eq!(row(&out, "event types"), [3, 0, 0, 0], "{out}");
    assert_eq!(row(&out, "applications"), [2, 0, 0, 0], "{out}");
    assert_eq!(row(&out, "endpoints"), [3, 0, 0, 0], "{out}");
    assert!(
        out.contains("endpoint main") && out.contains("Authorization"),
        "hidden headers are named: {out}"
    );
    assert!(
        out.contains("messages and attempts are not copied"),
        "{out}"
    );
    let _ = main;

    // Run again: nothing to do.
    let (code, again, err) = import(&base, &target_db, &[]).await;
    assert_eq!(code, Some(0), "{again}\n{err}");
    assert_eq!(row(&again, "event types"), [0, 0, 3, 0], "{again}");
    assert_eq!(row(&again, "applications"), [0, 0, 2, 0], "{again}");
    assert_eq!(row(&again, "endpoints"), [0, 0, 3, 0], "{again}");

    // What only Herald has (an endpoint's FIFO ordering, set on the
    // target since) is kept by an update from the source.
    {
        let target_proc = serve(&target_db, &[("HERALD_ADMIN_TOKEN", TOKEN)]).await;
        let target = Remote::new(target_proc.addr);
        ok(
            &target,
            Method::PATCH,
            "/app/shop/endpoint/off",
            json!({"ordering": "fifo"}),
        )
        .await;
    }
    // A change on the source is carried by the next run, as an update.
    ok(
        &source,
        Method::PUT,
        "/app/shop/endpoint/off",
        json!({"url": rx.url("/off"), "description": "now described", "disabled": true}),
    )
    .await;
    let (code, third, err) = import(&base, &target_db, &[]).await;
    assert_eq!(code, Some(0), "{third}\n{err}");
    assert_eq!(row(&third, "endpoints"), [0, 1, 2, 0], "{third}");

    let (_target_proc, target) = serve_reaching_receivers(&target_db).await;
    let type_fields = [
        "name",
        "description",
        "archived",
        "deprecated",
        "schemas",
        "featureFlag",
        "groupName",
    ];
    assert_listed_alike(
        &target,
        &source,
        "/event-type?include_archived=true",
        &type_fields,
    )
    .await;
    let app_fields = ["name", "uid", "metadata", "rateLimit"];
    assert_listed_alike(&target, &source, "/app", &app_fields).await;
    let ep_fields = [
        "url",
        "uid",
        "description",
        "filterTypes",
        "channels",
        "disabled",
        "rateLimit",
        "metadata",
    ];
    assert_listed_alike(&target, &source, "/app/shop/endpoint", &ep_fields).await;
    let target_no_uid = get(&target, "/app").await["data"]
        .as_array()
        .expect("apps")
        .iter()
        .find(|a| a["uid"].is_null())
        .expect("the app without uid")["id"]
        .as_str()
        .expect("id")
        .to_owned();
    assert_eq!(
        listed(
            &target,
            &format!("/app/{target_no_uid}/endpoint"),
            &ep_fields
        )
        .await,
        listed(
            &source,
            &format!("/app/{}/endpoint", no_uid["id"].as_str().expect("id")),
            &ep_fields
        )
        .await
    );
    let updated = get(&target, "/app/shop/endpoint").await["data"]
        .as_array()
        .expect("endpoints")
        .iter()
        .find(|e| e["description"] == "now described")
        .cloned()
        .expect("the endpoint updated by the third run");
    assert_eq!(updated["ordering"], "fifo", "{updated}");
    assert_eq!(
        get(&target, "/app/shop/endpoint/main/secret").await["key"],
        source_secret
    );
    let headers = get(&target, "/app/shop/endpoint/main/headers").await;
    assert_eq!(headers["headers"]["X-Tenant"], "t-1", "{headers}");
    assert!(
        headers["headers"].get("Authorization").is_none(),
        "a hidden value is not invented: {headers}"
    );

    // A message through the target verifies with the source's secret.
    let msg = ok(
        &target,
        Method::POST,
        "/app/shop/msg",
        json!({"eventType": "order.paid", "channels": ["eu"], "payload": {"n": 1}}),
    )
    .await;
    let id = msg["id"].as_str().expect("id").to_owned();
    rx.wait_until(PATIENCE, |got| {
        got.iter().any(|r| r.header("webhook-id") == id)
    })
    .await;
    let got = rx
        .requests()
        .into_iter()
        .find(|r| r.header("webhook-id") == id)
        .expect("delivered");
    got.verified_by(source_secret.as_str().expect("secret"))
        .expect("the source's secret verifies");
    assert_eq!(got.header("x-tenant"), "t-1");
}

/// `--dry-run` says what it would do and writes nothing; `--app` limits;
/// lists longer than a page (250) are followed to the end.
#[tokio::test]
async fn a_dry_run_writes_nothing_and_app_limits_the_import() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::start().await;
    let (_source_proc, source) = serve_reaching_receivers(&dir.path().join("source.db")).await;
    for i in 0..260 {
        ok(
            &source,
            Method::POST,
            "/event-type",
            json!({"name": format!("type.{i:03}")}),
        )
        .await;
    }
    for uid in ["one", "two"] {
        app_named(&source, uid).await;
        ok(
            &source,
            Method::POST,
            &format!("/app/{uid}/endpoint"),
            json!({"url": rx.url("/")}),
        )
        .await;
    }
    let base = source.base.replace("/api/v1", "");
    let target_db = dir.path().join("target.db");
    let (code, out, err) = import(&base, &target_db, &["--dry-run"]).await;
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert_eq!(row(&out, "event types"), [260, 0, 0, 0], "two pages: {out}");
    assert_eq!(row(&out, "applications"), [2, 0, 0, 0], "{out}");
    assert_eq!(row(&out, "endpoints"), [2, 0, 0, 0], "{out}");
    assert!(out.contains("would create"), "{out}");
    let (code, out, err) = import(&base, &target_db, &["--app", "two"]).await;
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert_eq!(row(&out, "event types"), [260, 0, 0, 0], "{out}");
    assert_eq!(
        row(&out, "applications"),
        [1, 0, 0, 0],
        "the dry run created nothing: {out}"
    );
    assert_eq!(row(&out, "endpoints"), [1, 0, 0, 0], "{out}");
    let (code, out, _) = import(&base, &target_db, &["--app", "three"]).await;
    assert_eq!(code, Some(1), "an --app the source lacks fails: {out}");
    assert!(out.contains("application three"), "{out}");
}

/// Another Herald with operator webhooks has its own application for
/// them (`herald-operator`), a uid this Herald refuses: it is skipped and
/// said so, where the import failed on it and no second run could help.
#[tokio::test]
async fn another_heralds_own_application_is_skipped_and_said() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::start().await;
    let operator_url = rx.url("/operator");
    let source_proc = serve(
        &dir.path().join("source.db"),
        &[
            ("HERALD_ADMIN_TOKEN", TOKEN),
            ("HERALD_ALLOW_PRIVATE_NETWORKS", "true"),
            ("HERALD_OPERATOR_WEBHOOK_URL", &operator_url),
            (
                "HERALD_OPERATOR_WEBHOOK_SECRET",
                "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            ),
        ],
    )
    .await;
    let source = Remote::new(source_proc.addr);
    app_named(&source, "one").await;
    let base = source.base.replace("/api/v1", "");
    let target_db = dir.path().join("target.db");
    for extra in [&["--dry-run"][..], &[]] {
        let (code, out, err) = import(&base, &target_db, extra).await;
        assert_eq!(code, Some(0), "{extra:?}: {out}\n{err}");
        assert_eq!(row(&out, "applications"), [1, 0, 0, 0], "{out}");
        assert!(
            out.lines()
                .any(|l| l.starts_with("skipped: application herald-operator")),
            "{out}"
        );
    }
}

/// A source that refuses the token, fails, or does not speak the API:
/// a clear error, exit 1, and no object reported as imported.
#[tokio::test]
async fn a_source_that_fails_or_is_not_the_api_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let target_db = dir.path().join("target.db");
    let source_proc = serve(
        &dir.path().join("source.db"),
        &[("HERALD_ADMIN_TOKEN", TOKEN)],
    )
    .await;
    let base = format!("http://{}", source_proc.addr);
    let (code, out, err) = run(
        &[
            "import-svix",
            "--url",
            &base,
            "--token",
            "wrong-token-0123456789",
        ],
        &on(&target_db),
    )
    .await;
    assert_eq!(code, Some(1), "{out}");
    assert!(err.contains("401") && err.contains("token"), "{err}");
    assert!(!out.contains("created"), "nothing reported as done: {out}");
    assert!(
        !err.contains("wrong-token"),
        "the token is not repeated: {err}"
    );

    let broken = Receiver::start().await;
    broken.always(Reply::status(500).body("{\"detail\":\"boom\"}"));
    let (code, out, err) = import(&broken.url(""), &target_db, &[]).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(err.contains("500"), "{err}");

    let garbage = Receiver::start().await;
    garbage.always(Reply::status(200).body("<html>hello</html>"));
    let (code, out, err) = import(&garbage.url(""), &target_db, &[]).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(err.contains("not JSON"), "{err}");

    let (code, _, err) = import("ftp://example", &target_db, &[]).await;
    assert_eq!(code, Some(1));
    assert!(err.contains("--url"), "{err}");
    assert!(
        !target_db.exists() || {
            let target = serve(&target_db, &[("HERALD_ADMIN_TOKEN", TOKEN)]).await;
            let apps = get(&Remote::new(target.addr), "/app").await;
            apps["data"].as_array().is_some_and(Vec::is_empty)
        }
    );
}

/// The import's own API on the store is its own: the store's generated
/// admin token still opens it afterwards, and neither the listener's TLS
/// nor the per-caller rate limit of the configuration gets in its way.
#[tokio::test]
async fn the_import_leaves_the_admin_token_tls_and_rate_limit_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let source_proc = serve(
        &dir.path().join("source.db"),
        &[("HERALD_ADMIN_TOKEN", TOKEN)],
    )
    .await;
    let source = Remote::new(source_proc.addr);
    for uid in ["one", "two", "three"] {
        app_named(&source, uid).await;
    }
    // The target's first start, without HERALD_ADMIN_TOKEN: generated.
    let target_db = dir.path().join("target.db");
    let mut first = serve(&target_db, &[]).await;
    let generated = first
        .first_line
        .rsplit(' ')
        .next()
        .expect("token")
        .to_owned();
    assert!(generated.starts_with("hrld_"), "{}", first.first_line);
    // Waited for: while it goes on it holds the store's lock.
    first.child.kill().await.expect("kill");

    let ca = crate::egress_parts::TestCa::new("import test CA");
    let (cert, key) = ca.issue(&["localhost"]).write(dir.path(), "listener");
    let base = format!("http://{}", source_proc.addr);
    let (code, out, err) = run(
        &["import-svix", "--url", &base, "--token", TOKEN],
        &[
            (
                "HERALD_DATABASE_URL",
                format!("sqlite://{}", target_db.display()),
            ),
            ("HERALD_TLS_CERT", cert.display().to_string()),
            ("HERALD_TLS_KEY", key.display().to_string()),
            ("HERALD_API_RATE_LIMIT", "1".to_owned()),
        ],
    )
    .await;
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert_eq!(row(&out, "applications"), [3, 0, 0, 0], "{out}");

    let again = serve(&target_db, &[]).await;
    let answer = get_as(
        &reqwest::Client::new(),
        format!("http://{}/api/v1/app", again.addr),
        &generated,
    )
    .await;
    assert_eq!(answer.status(), 200, "the generated token still opens it");
    let apps: Value = answer.json().await.expect("json");
    assert_eq!(apps["data"].as_array().map(Vec::len), Some(3), "{apps}");
}

/// A source over its rate limit (429 with Retry-After, as Svix's API has
/// one) is read again after the wait it names: the import completes.
#[tokio::test]
async fn a_rate_limited_source_is_read_again_after_its_wait() {
    let dir = tempfile::tempdir().expect("tempdir");
    let source_db = dir.path().join("source.db");
    let mut first = serve(&source_db, &[("HERALD_ADMIN_TOKEN", TOKEN)]).await;
    let source = Remote::new(first.addr);
    for i in 0..4 {
        let uid = format!("app{i}");
        app_named(&source, &uid).await;
    }
    // Waited for: while it goes on it holds the store's lock.
    first.child.kill().await.expect("kill");
    // Two requests a second: the import's reads run into 429s.
    let limited = serve(
        &source_db,
        &[
            ("HERALD_ADMIN_TOKEN", TOKEN),
            ("HERALD_API_RATE_LIMIT", "2"),
        ],
    )
    .await;
    let base = format!("http://{}", limited.addr);
    let (code, out, err) = import(&base, &dir.path().join("target.db"), &[]).await;
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert_eq!(row(&out, "applications"), [4, 0, 0, 0], "{out}");
}

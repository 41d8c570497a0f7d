//! The listener's HTTPS (`HERALD_TLS_CERT`, `HERALD_TLS_KEY`, reloaded on
//! SIGHUP) and the per-caller API rate limit (`HERALD_API_RATE_LIMIT`),
//! both through the real binary where a signal or a whole process matters.

use std::process::Stdio;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::egress_parts::TestCa;
use crate::helpers::binary::{serve, serve_command};
use crate::helpers::{closed_port, get_as, spawn_app, Answered, PATIENCE, TOKEN};

/// A client that trusts only `ca` and keeps no connection between calls,
/// so each call sees the certificate served at that moment.
fn client_trusting(ca: &TestCa) -> reqwest::Client {
    reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(ca.pem().as_bytes()).expect("pem"))
        .redirect(reqwest::redirect::Policy::none())
        .pool_max_idle_per_host(0)
        .build()
        .expect("client")
}

#[tokio::test]
async fn over_https_cookies_are_secure_and_hsts_is_sent() {
    let ca = TestCa::new("listener CA");
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = ca.issue(&["localhost"]).write(dir.path(), "listener");
    let app = spawn_app(&[
        ("HERALD_TLS_CERT", cert.to_str().expect("path")),
        ("HERALD_TLS_KEY", key.to_str().expect("path")),
    ])
    .await;
    let port = app.running().addr.expect("addr").port();
    let base = format!("https://localhost:{port}");
    let client = client_trusting(&ca);

    let resp = client.get(format!("{base}/healthz")).answer().await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        resp.headers()
            .get("strict-transport-security")
            .and_then(|v| v.to_str().ok()),
        Some("max-age=31536000")
    );
    let resp = get_as(&client, format!("{base}/api/v1/app"), TOKEN).await;
    assert_eq!(resp.status(), StatusCode::OK);

    let resp = client
        .post(format!("{base}/dashboard/login"))
        .form(&[("token", TOKEN)])
        .answer()
        .await;
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    let cookies: Vec<_> = resp
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    assert!(!cookies.is_empty());
    for cookie in cookies {
        assert!(
            cookie.ends_with("; Secure") && cookie.contains("HttpOnly"),
            "{cookie}"
        );
    }

    // Plain HTTP is not served on an HTTPS listener.
    let plain = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/healthz"))
        .send()
        .await;
    assert!(plain.is_err() || plain.is_ok_and(|r| r.status() != StatusCode::OK));
    app.shutdown().await;
}

/// A certificate that cannot be read stops `serve` before the store is
/// opened (it was found after the file was made and migrated), and the
/// fault is said in words, not as the byte values of a PEM marker.
#[tokio::test]
async fn an_unreadable_certificate_stops_the_start_before_the_store_is_touched() {
    let ca = TestCa::new("a CA");
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = ca.issue(&["localhost"]).write(dir.path(), "listener");
    let pem = std::fs::read_to_string(&cert).expect("read");
    let cut = pem.find("-----END").expect("an end line");
    std::fs::write(&cert, &pem[..cut]).expect("write");
    let db = dir.path().join("h.db");
    let out = serve_command(&db, closed_port().await)
        .env("HERALD_TLS_CERT", &cert)
        .env("HERALD_TLS_KEY", &key)
        .output()
        .await
        .expect("herald runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("HERALD_TLS_CERT") && err.contains("no `-----END CERTIFICATE-----` line"),
        "{err}"
    );
    assert!(!db.exists(), "the store was not made: {err}");
}

#[tokio::test]
async fn sighup_reloads_the_listener_certificate_and_a_bad_file_keeps_the_old_one() {
    let old_ca = TestCa::new("old CA");
    let new_ca = TestCa::new("new CA");
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = old_ca.issue(&["localhost"]).write(dir.path(), "listener");
    let port = closed_port().await;
    let mut child = serve_command(&dir.path().join("h.db"), port)
        .env("HERALD_ADMIN_TOKEN", TOKEN)
        .env("HERALD_TLS_CERT", &cert)
        .env("HERALD_TLS_KEY", &key)
        .stdout(Stdio::null())
        .spawn()
        .expect("herald starts");
    let healthz = format!("https://localhost:{port}/healthz");
    let answers = |ca: &TestCa| {
        let client = client_trusting(ca);
        let url = healthz.clone();
        async move {
            client
                .get(url)
                .send()
                .await
                .is_ok_and(|r| r.status() == StatusCode::OK)
        }
    };
    let deadline = Instant::now() + PATIENCE;
    while !answers(&old_ca).await {
        assert!(Instant::now() < deadline, "herald never served HTTPS");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !answers(&new_ca).await,
        "the new CA's clients do not trust it yet"
    );

    // A broken file and SIGHUP: the certificate in use stays.
    std::fs::write(&cert, "garbage").expect("write");
    let pid = child.id().expect("pid") as i32;
    // SAFETY: signalling the child process this test started.
    unsafe { libc::kill(pid, libc::SIGHUP) };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        answers(&old_ca).await,
        "a failed reload keeps the old certificate"
    );

    // The renewed certificate and SIGHUP: new connections get it.
    new_ca.issue(&["localhost"]).write(dir.path(), "listener");
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGHUP) };
    let deadline = Instant::now() + PATIENCE;
    while !answers(&new_ca).await {
        assert!(
            Instant::now() < deadline,
            "the certificate was never reloaded"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!answers(&old_ca).await);
    assert!(child.try_wait().expect("wait").is_none(), "still running");
    let _ = child.kill().await;
}

#[tokio::test]
async fn the_api_rate_limit_answers_429_with_retry_after_per_caller() {
    let dir = tempfile::tempdir().expect("tempdir");
    let proc = serve(
        &dir.path().join("h.db"),
        &[
            ("HERALD_ADMIN_TOKEN", TOKEN),
            ("HERALD_API_RATE_LIMIT", "5"),
        ],
    )
    .await;
    let base = format!("http://{}", proc.addr);
    let client = reqwest::Client::new();
    let created: Value = client
        .post(format!("{base}/api/v1/app"))
        .bearer_auth(TOKEN)
        .json(&json!({"name": "a"}))
        .json_answer()
        .await;
    let app_id = created["id"].as_str().expect("id").to_owned();
    let token: Value = client
        .post(format!("{base}/api/v1/app/{app_id}/token"))
        .bearer_auth(TOKEN)
        .json(&json!({}))
        .json_answer()
        .await;
    let app_token = token["token"].as_str().expect("token").to_owned();

    // Far more than 5 per second from the admin token.
    let mut limited = None;
    for _ in 0..50 {
        let resp = get_as(&client, format!("{base}/api/v1/app"), TOKEN).await;
        if resp.status() == StatusCode::TOO_MANY_REQUESTS {
            limited = Some(resp);
            break;
        }
        assert_eq!(resp.status(), StatusCode::OK);
    }
    let limited = limited.expect("the admin token was limited");
    let retry_after: u64 = limited
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("Retry-After in whole seconds");
    assert!((1..=2).contains(&retry_after), "{retry_after}");
    let body: Value = limited.json().await.expect("JSON error body");
    assert_eq!(body["code"], "too_many_requests", "{body}");

    // Another caller has its own budget; writes are limited like reads.
    let resp = get_as(&client, format!("{base}/api/v1/app/{app_id}"), &app_token).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let resp = client
        .post(format!("{base}/api/v1/app"))
        .bearer_auth(TOKEN)
        .json(&json!({"name": "b"}))
        .answer()
        .await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    // Unauthenticated probes are not the callers' budget.
    let resp = client.get(format!("{base}/healthz")).answer().await;
    assert_eq!(resp.status(), StatusCode::OK);

    // The bucket refills: after the wait it asked for, the admin is served.
    tokio::time::sleep(Duration::from_secs(retry_after)).await;
    let resp = get_as(&client, format!("{base}/api/v1/app"), TOKEN).await;
    assert_eq!(resp.status(), StatusCode::OK);
    drop(proc);
}

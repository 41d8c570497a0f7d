//! Reaching receivers: HTTPS with an operator's CA (`HERALD_CA_BUNDLE`),
//! certificate errors, the egress proxy (`HERALD_PROXY_URL`, real tinyproxy
//! and dante-server), and the SSRF guard behind a proxy that resolves
//! names.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};

use crate::egress_parts::{have, HttpsReceiver, ProxyServer, TestCa, DANTED, TINYPROXY};
use crate::helpers::{spawn_app, spawn_stepped, test_config, Receiver, Remote, TestApp, PATIENCE};

/// Waits (bounded) for the first attempt of `msg` and returns it.
async fn first_attempt(app: &TestApp, app_id: &str, msg: &str) -> Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(a) = app.attempts_of_msg(app_id, msg).await.into_iter().next() {
            return a;
        }
        assert!(
            Instant::now() < deadline,
            "no attempt of {msg} was recorded"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn an_https_receiver_behind_an_internal_ca_is_reached_with_the_ca_bundle() {
    let ca = TestCa::new("Herald test CA");
    let rx = HttpsReceiver::start(&ca.issue(&["localhost"])).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let bundle = ca.write(dir.path(), "ca.pem");
    let app = spawn_app(&[("HERALD_CA_BUNDLE", bundle.to_str().expect("path"))]).await;
    let (app_id, _) = app.app_with_endpoint(&rx.url("/hook"), json!({})).await;
    let msg = app
        .send_message(&app_id, "user.created", json!({"n": 1}))
        .await;
    let got = rx.inner.wait_for(1).await;
    assert_eq!(got[0].path, "/hook");
    assert!(got[0].header("webhook-signature").starts_with("v1,"));
    app.wait_for_state(&app_id, &msg, "delivered").await;
    app.shutdown().await;
}

#[tokio::test]
async fn untrusted_and_misnamed_certificates_are_retried_network_errors_with_clear_text() {
    let ca = TestCa::new("Herald test CA");
    let rx = HttpsReceiver::start(&ca.issue(&["localhost"])).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let bundle = ca.write(dir.path(), "ca.pem");

    // Without the CA: the compiled-in roots do not know it.
    let app = spawn_stepped(&[]).await;
    let (app_id, _) = app.app_with_endpoint(&rx.url("/"), json!({})).await;
    let msg = app.send_message(&app_id, "user.created", json!({})).await;
    app.step().await;
    let attempt = first_attempt(&app, &app_id, &msg).await;
    let error = attempt["error"].as_str().unwrap_or_default().to_owned();
    assert!(
        error.contains("invalid peer certificate") && error.contains("UnknownIssuer"),
        "{attempt}"
    );
    let d = app.deliveries(&app_id, &msg).await;
    assert_eq!(d[0]["state"], "pending", "retried, not dead: {d:?}");
    assert!(
        rx.inner.requests().is_empty(),
        "nothing reached the receiver"
    );
    app.shutdown().await;

    // With the CA but another name than the certificate's: the hostname
    // check holds even though the resolver is Herald's own.
    let app = spawn_stepped(&[("HERALD_CA_BUNDLE", bundle.to_str().expect("path"))]).await;
    let url = format!("https://127.0.0.1:{}/", rx.addr.port());
    let (app_id, _) = app.app_with_endpoint(&url, json!({})).await;
    let msg = app.send_message(&app_id, "user.created", json!({})).await;
    app.step().await;
    let attempt = first_attempt(&app, &app_id, &msg).await;
    let error = attempt["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("certificate not valid for name"),
        "{attempt}"
    );
    assert!(rx.inner.requests().is_empty());
    app.shutdown().await;
}

#[tokio::test]
async fn a_ca_bundle_that_is_not_pem_stops_the_start_naming_the_setting() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bundle = dir.path().join("ca.pem");
    std::fs::write(&bundle, "not a certificate").expect("write");
    let config = test_config(
        dir.path(),
        &[("HERALD_CA_BUNDLE", bundle.to_str().expect("path"))],
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let err = herald::server::start(config, Some(listener), herald::server::Role::All)
        .await
        .err()
        .expect("refused");
    assert!(format!("{err:#}").contains("HERALD_CA_BUNDLE"), "{err:#}");
}

#[tokio::test]
async fn customer_requests_pass_through_an_http_proxy_with_credentials() {
    if !have(
        TINYPROXY,
        "egress::customer_requests_pass_through_an_http_proxy_with_credentials",
    ) {
        return;
    }
    let proxy = ProxyServer::tinyproxy("herald", "s3cret").await;
    let ca = TestCa::new("Herald test CA");
    let https_rx = HttpsReceiver::start(&ca.issue(&["localhost"])).await;
    let rx = Receiver::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let bundle = ca.write(dir.path(), "ca.pem");
    let proxy_url = format!("http://herald:s3cret@127.0.0.1:{}", proxy.port);
    let app = spawn_app(&[
        ("HERALD_PROXY_URL", &proxy_url),
        ("HERALD_CA_BUNDLE", bundle.to_str().expect("path")),
    ])
    .await;

    // Plain HTTP: forwarded by the proxy, which says so in `Via`.
    let (app_id, _) = app.app_with_endpoint(&rx.url("/plain"), json!({})).await;
    let msg = app.send_message(&app_id, "user.created", json!({})).await;
    let got = rx.wait_for(1).await;
    assert!(
        got[0].header("via").contains("tinyproxy"),
        "{:?}",
        got[0].headers
    );
    assert!(got[0].header("webhook-signature").starts_with("v1,"));
    app.wait_for_state(&app_id, &msg, "delivered").await;
    proxy
        .wait_for_log(&format!("POST http://127.0.0.1:{}/plain", rx.addr.port()))
        .await;

    // HTTPS: a CONNECT tunnel, TLS end to end with the receiver.
    let (app_id, _) = app
        .app_with_endpoint(&https_rx.url("/tls"), json!({}))
        .await;
    let msg = app.send_message(&app_id, "user.created", json!({})).await;
    let got = https_rx.inner.wait_for(1).await;
    assert_eq!(got[0].path, "/tls");
    assert!(got[0].header("via").is_empty(), "a tunnel adds nothing");
    app.wait_for_state(&app_id, &msg, "delivered").await;
    proxy
        .wait_for_log(&format!("CONNECT localhost:{}", https_rx.addr.port()))
        .await;
    assert!(!proxy.log().contains("s3cret"));
    app.shutdown().await;
}

#[tokio::test]
async fn hosts_in_no_proxy_are_reached_directly() {
    if !have(TINYPROXY, "egress::hosts_in_no_proxy_are_reached_directly") {
        return;
    }
    let proxy = ProxyServer::tinyproxy("herald", "s3cret").await;
    let rx = Receiver::start().await;
    let proxy_url = format!("http://herald:s3cret@127.0.0.1:{}", proxy.port);
    let app = spawn_app(&[
        ("HERALD_PROXY_URL", &proxy_url),
        ("HERALD_NO_PROXY", "127.0.0.1"),
    ])
    .await;
    let (app_id, _) = app.app_with_endpoint(&rx.url("/direct"), json!({})).await;
    let msg = app.send_message(&app_id, "user.created", json!({})).await;
    let got = rx.wait_for(1).await;
    assert!(got[0].header("via").is_empty(), "{:?}", got[0].headers);
    app.wait_for_state(&app_id, &msg, "delivered").await;
    assert!(!proxy.log().contains("/direct"), "{}", proxy.log());
    app.shutdown().await;
}

#[tokio::test]
async fn customer_requests_pass_through_a_socks5_proxy() {
    if !have(
        DANTED,
        "egress::customer_requests_pass_through_a_socks5_proxy",
    ) {
        return;
    }
    let proxy = ProxyServer::dante().await;
    let rx = Receiver::start().await;
    let proxy_url = format!("socks5://127.0.0.1:{}", proxy.port);
    let app = spawn_app(&[("HERALD_PROXY_URL", &proxy_url)]).await;
    let (app_id, _) = app.app_with_endpoint(&rx.url("/socks"), json!({})).await;
    let msg = app.send_message(&app_id, "user.created", json!({})).await;
    rx.wait_for(1).await;
    app.wait_for_state(&app_id, &msg, "delivered").await;
    // dante logs each relayed connection as `… -> client target.port`.
    proxy
        .wait_for_log(&format!("127.0.0.1.{}", rx.addr.port()))
        .await;
    app.shutdown().await;
}

/// An endpoint stored while private networks were allowed, then served by
/// a process that forbids them, behind a proxy that resolves names: the
/// proxy would connect to `localhost` for Herald, so Herald resolves and
/// checks the name first.
#[tokio::test]
async fn behind_a_name_resolving_proxy_private_targets_are_still_refused() {
    if !have(
        TINYPROXY,
        "egress::behind_a_name_resolving_proxy_private_targets_are_still_refused",
    ) {
        return;
    }
    let proxy = ProxyServer::tinyproxy("herald", "s3cret").await;
    let rx = Receiver::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("http://localhost:{}/internal", rx.addr.port());

    let start = |overrides: Vec<(&'static str, String)>| {
        let config = test_config(
            dir.path(),
            &overrides
                .iter()
                .map(|(k, v)| (*k, v.as_str()))
                .collect::<Vec<_>>(),
        );
        async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            herald::server::start(config, Some(listener), herald::server::Role::Api)
                .await
                .expect("herald starts")
        }
    };
    let first = start(vec![]).await;
    let app_id = Remote::new(first.addr.expect("addr"))
        .app_with_endpoint(&url)
        .await;
    first.shutdown().await.expect("shutdown");

    let proxy_url = format!("http://herald:s3cret@127.0.0.1:{}", proxy.port);
    let second = start(vec![
        ("HERALD_ALLOW_PRIVATE_NETWORKS", "false".into()),
        ("HERALD_PROXY_URL", proxy_url),
    ])
    .await;
    let remote = Remote::new(second.addr.expect("addr"));
    let message = json!({"eventType": "user.created", "payload": {}});
    let (status, msg) = remote
        .call(Method::POST, &format!("/app/{app_id}/msg"), Some(message))
        .await;
    assert_eq!(status, 202, "{msg}");
    let msg_id = msg["id"].as_str().expect("id");
    second.dispatcher.process_batch().await.expect("batch");
    let (_, attempts) = remote
        .call(
            Method::GET,
            &format!("/app/{app_id}/attempt/msg/{msg_id}"),
            None,
        )
        .await;
    let error = attempts["data"][0]["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with("refused:") && error.contains("localhost"),
        "{attempts}"
    );
    assert!(
        rx.requests().is_empty(),
        "nothing reached the private receiver"
    );
    assert!(!proxy.log().contains("/internal"), "{}", proxy.log());
    second.shutdown().await.expect("shutdown");
}

/// A proxy refusing Herald's credentials (407) is retried like an
/// unreachable one: it says nothing of the receiver, and a password put
/// right lets the delivery through; it was a permanent status that made
/// every plain-HTTP delivery dead at its first attempt.
#[tokio::test]
async fn a_proxy_refusing_its_credentials_is_retried_not_dead() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let proxy = tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf).await;
            let _ = conn
                .write_all(
                    b"HTTP/1.1 407 Proxy Authentication Required\r\n\
                      Proxy-Authenticate: Basic realm=\"p\"\r\n\
                      Content-Length: 0\r\nConnection: close\r\n\r\n",
                )
                .await;
        }
    });
    let rx = Receiver::start().await;
    let proxy_url = format!("http://herald:wrong@127.0.0.1:{port}");
    let app = spawn_app(&[("HERALD_PROXY_URL", &proxy_url)]).await;
    let (app_id, _) = app.app_with_endpoint(&rx.url("/plain"), json!({})).await;
    let msg = app.send_message(&app_id, "user.created", json!({})).await;
    let attempt = first_attempt(&app, &app_id, &msg).await;
    assert_eq!(attempt["responseStatusCode"], 407, "{attempt}");
    // The tests' schedule is three quick attempts: all of them spent.
    let ds = app.wait_for_state(&app_id, &msg, "dead").await;
    assert_eq!(ds[0]["deadReason"], "exhausted", "{ds:?}");
    assert!(ds[0]["attempts"].as_u64() > Some(1), "{ds:?}");
    assert!(rx.requests().is_empty(), "the proxy let nothing through");
    app.shutdown().await;
    proxy.abort();
}

//! OpenTelemetry export (`HERALD_OTLP_ENDPOINT`): the real binary sends its
//! spans over OTLP/HTTP to a receiver started here, which decodes them with
//! the OpenTelemetry project's own protobuf types; the caller's
//! `traceparent` reaches the webhook receiver, and no payload or secret
//! reaches the spans.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use serde_json::json;

use crate::helpers::binary::serve;
use crate::helpers::{Receiver, Remote, Reply, PATIENCE, TOKEN};

/// Spans received, decoded.
#[derive(Clone, Default)]
struct Collector(Arc<Mutex<Vec<Span>>>);

impl Collector {
    async fn start() -> (Collector, String) {
        let collector = Collector::default();
        let app = axum::Router::new()
            .route(
                "/v1/traces",
                axum::routing::post(|State(c): State<Collector>, body: Bytes| async move {
                    let request = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                    let mut spans = c.0.lock().expect("lock");
                    for resource in request.resource_spans {
                        let service = resource
                            .resource
                            .iter()
                            .flat_map(|r| &r.attributes)
                            .find(|kv| kv.key == "service.name")
                            .and_then(|kv| kv.value.as_ref()?.value.clone());
                        assert_eq!(
                            service,
                            Some(AnyValue::StringValue("herald-under-test".into()))
                        );
                        for scope in resource.scope_spans {
                            spans.extend(scope.spans);
                        }
                    }
                    "{}"
                }),
            )
            .with_state(collector.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        (collector, url)
    }

    fn spans(&self) -> Vec<Span> {
        self.0.lock().expect("lock").clone()
    }

    /// Waits (bounded) until `ready` holds for the spans received.
    async fn wait_until(&self, what: &str, ready: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let spans = self.spans();
            if ready(&spans) {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "never received {what}; got {:?}",
                spans.iter().map(|s| &s.name).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn attribute(span: &Span, key: &str) -> Option<AnyValue> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.clone())
}

#[tokio::test]
async fn spans_go_to_an_otlp_receiver_and_the_callers_trace_reaches_the_webhook() {
    let (collector, otlp) = Collector::start().await;
    let rx = Receiver::start().await;
    // First answer fails, so the retry goes through a claim too.
    rx.script([Reply::status(500)]);
    let dir = tempfile::tempdir().expect("tempdir");
    let proc = serve(
        &dir.path().join("h.db"),
        &[
            ("HERALD_ADMIN_TOKEN", TOKEN),
            ("HERALD_ALLOW_PRIVATE_NETWORKS", "true"),
            ("HERALD_RETRY_SCHEDULE", "0ms"),
            ("HERALD_JITTER", "none"),
            ("HERALD_OTLP_ENDPOINT", &otlp),
            ("HERALD_OTLP_SERVICE_NAME", "herald-under-test"),
            // The SDK's batch delay, shortened so the test does not wait 5 s.
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    )
    .await;
    let base = format!("http://{}", proc.addr);
    let client = reqwest::Client::new();
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let (app_id, _) = Remote::new(proc.addr)
        .app_with_endpoint_of(json!({
            "url": rx.url("/traced"),
            "secret": secret,
            "headers": {"X-Api-Key": "hidden-value-1"},
        }))
        .await;

    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let resp = client
        .post(format!("{base}/api/v1/app/{app_id}/msg"))
        .bearer_auth(TOKEN)
        .header("traceparent", format!("00-{trace_id}-{caller_span}-01"))
        .json(&json!({"eventType": "order.paid", "payload": {"card": "payload-marker-4242"}}))
        .send()
        .await
        .expect("herald");
    assert_eq!(resp.status(), reqwest::StatusCode::ACCEPTED);

    // Both attempts carry a traceparent of the caller's trace, each naming
    // the attempt's own span as parent.
    let got = rx.wait_for(2).await;
    let mut parents = Vec::new();
    for r in &got {
        let tp = r.header("traceparent");
        let parts: Vec<&str> = tp.split('-').collect();
        assert_eq!(parts.len(), 4, "{tp}");
        assert_eq!(parts[1], trace_id, "{tp}");
        assert_ne!(
            parts[2], caller_span,
            "the attempt's span, not the caller's"
        );
        parents.push(parts[2].to_owned());
    }
    assert_ne!(parents[0], parents[1], "one span per attempt");

    let spans = collector
        .wait_until(
            "the request, ingest, claim and both attempt spans",
            |spans| {
                let named = |n: &str| spans.iter().filter(|s| s.name == n).count();
                named("webhook.attempt") >= 2
                    && named("dispatch.claim") >= 1
                    && named("ingest.batch") >= 1
                    && spans
                        .iter()
                        .any(|s| s.name == "POST /api/v1/app/{app_id}/msg")
            },
        )
        .await;
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let request = spans
        .iter()
        .find(|s| s.name == "POST /api/v1/app/{app_id}/msg")
        .expect("request span");
    assert_eq!(hex(&request.trace_id), trace_id);
    assert_eq!(hex(&request.parent_span_id), caller_span);
    let attempts: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name == "webhook.attempt")
        .collect();
    for a in &attempts {
        assert_eq!(
            hex(&a.trace_id),
            trace_id,
            "attempts join the caller's trace"
        );
        assert!(
            parents.contains(&hex(&a.span_id)),
            "the receiver saw this span"
        );
        assert!(
            matches!(attribute(a, "endpoint.id"), Some(AnyValue::StringValue(id)) if id.starts_with("ep_"))
        );
    }
    let statuses: Vec<_> = attempts
        .iter()
        .filter_map(|a| attribute(a, "http.response.status_code"))
        .collect();
    assert!(statuses.contains(&AnyValue::IntValue(500)), "{statuses:?}");
    assert!(statuses.contains(&AnyValue::IntValue(200)), "{statuses:?}");

    // Nothing a tenant or receiver sent is in any span.
    let everything = format!("{spans:?}");
    for secret_text in ["payload-marker-4242", secret, "hidden-value-1", TOKEN] {
        assert!(
            !everything.contains(secret_text),
            "{secret_text} leaked into a span"
        );
    }
    drop(proc);
}

#[tokio::test]
async fn without_export_the_callers_traceparent_is_forwarded_as_it_came() {
    let app = crate::helpers::spawn_app(&[]).await;
    let rx = Receiver::start().await;
    let (app_id, _) = app.app_with_endpoint(&rx.url("/"), json!({})).await;
    let send = |traceparent: &'static str| {
        app.client
            .post(app.url(&format!("/api/v1/app/{app_id}/msg")))
            .bearer_auth(TOKEN)
            .header("traceparent", traceparent)
            .json(&json!({"eventType": "a.b", "payload": {}}))
            .send()
    };
    let good = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    assert_eq!(send(good).await.expect("herald").status(), 202);
    assert_eq!(
        send("00-not-a-trace-01").await.expect("herald").status(),
        202
    );
    let got = rx.wait_for(2).await;
    let mut seen: Vec<String> = got.iter().map(|r| r.header("traceparent")).collect();
    seen.sort();
    assert_eq!(
        seen,
        vec![String::new(), good.to_owned()],
        "only the well-formed one"
    );
    app.shutdown().await;
}

/// A collector that cannot be reached is said in the log at the default
/// levels (the SDK's own failure, which was dropped in silence: traces
/// were lost with no word).
#[tokio::test]
async fn an_unreachable_collector_is_logged() {
    use tokio::io::AsyncBufReadExt as _;
    let dir = tempfile::tempdir().expect("tempdir");
    let port = crate::helpers::closed_port().await;
    let collector = crate::helpers::closed_port().await;
    let mut child = crate::helpers::binary::serve_command(&dir.path().join("h.db"), port)
        .env("HERALD_ADMIN_TOKEN", TOKEN)
        .env(
            "HERALD_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{collector}"),
        )
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("herald starts");
    let mut log = tokio::io::BufReader::new(child.stderr.take().expect("stderr")).lines();
    crate::helpers::wait_healthy(format!("127.0.0.1:{port}")).await;
    // A traced request, so that there is a span to export.
    let status = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/api/v1/app"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("herald answers")
        .status();
    assert_eq!(status, reqwest::StatusCode::OK);
    let deadline = Instant::now() + PATIENCE;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, log.next_line()).await {
            Ok(Ok(Some(line))) if line.contains("ExportError") => {
                assert!(line.contains("ERROR"), "{line}");
                break;
            }
            Ok(Ok(Some(line))) => seen.push(line),
            other => panic!("no export error logged ({other:?}): {seen:#?}"),
        }
    }
    let _ = child.kill().await;
    let _ = child.wait().await;
}

//! A webhook receiver as a Herald customer would write it: it verifies the
//! Standard Webhooks signature with the `standardwebhooks` crate and
//! handles each delivery once, however often it arrives (every attempt of
//! a delivery carries the same `Idempotency-Key`).
//!
//! Run: `WEBHOOK_SECRET=whsec_… cargo run -p herald --example receiver`
//! (listens on 127.0.0.1:9000; point an endpoint at http://127.0.0.1:9000/
//! with HERALD_ALLOW_PRIVATE_NETWORKS=true).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;

struct Receiver {
    verifier: standardwebhooks::Webhook,
    /// Idempotency-Keys already handled. A real receiver keeps these in
    /// its database, in the same transaction as the work they guard.
    seen: Mutex<HashSet<String>>,
}

async fn webhook(State(rx): State<Arc<Receiver>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    // 1. Authentic and recent (the crate checks the timestamp's age too).
    if rx.verifier.verify(&body, &headers).is_err() {
        return StatusCode::UNAUTHORIZED;
    }
    // 2. Once per delivery: a retry after a lost answer is acknowledged
    //    without doing the work again.
    let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()) else {
        return StatusCode::BAD_REQUEST;
    };
    let first_time = rx
        .seen
        .lock()
        .map(|mut seen| seen.insert(key.to_owned()))
        .unwrap_or(false);
    if first_time {
        let event_type = headers
            .get("x-event-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("?");
        println!("{event_type}: {}", String::from_utf8_lossy(&body));
    }
    // 2xx: delivered. Anything else makes Herald retry (or give up on 4xx).
    StatusCode::NO_CONTENT
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let secret = std::env::var("WEBHOOK_SECRET")
        .map_err(|_| anyhow::anyhow!("set WEBHOOK_SECRET to the endpoint's whsec_… secret"))?;
    let rx = Arc::new(Receiver {
        verifier: standardwebhooks::Webhook::new(&secret)
            .map_err(|e| anyhow::anyhow!("WEBHOOK_SECRET: {e:?}"))?,
        seen: Mutex::new(HashSet::new()),
    });
    let app = Router::new().route("/", post(webhook)).with_state(rx);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:9000").await?;
    println!("receiving webhooks on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}

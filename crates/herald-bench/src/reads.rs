//! `herald-bench --reads`: what the API's and dashboard's reads cost over
//! a store of N deliveries, seeded through the store's own ingest.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use herald::config::Config;
use herald::server::{self, Role};

use crate::bench::*;

/// Endpoints the `--reads` rows spread their deliveries over.
const READS_ENDPOINTS: usize = 100;
/// Timed repeats of each read (after one untimed); the median is shown.
const READS_REPEATS: usize = 5;
/// Messages per ingest batch (and deliveries per claim) when seeding.
const READS_BATCH: usize = 5_000;

/// One `--reads` row: seeding time and each read's median.
struct ReadTimes {
    seed: Duration,
    reads: Vec<(&'static str, Duration)>,
}

/// The reads timed, as (column, path); `{ep}` and `{evt}` are filled in.
const READS: [(&str, &str); 8] = [
    ("/metrics", "/metrics"),
    ("endpoint stats", "/api/v1/app/bench/endpoint/{ep}/stats"),
    (
        "attempts ?status=0",
        "/api/v1/app/bench/attempt/endpoint/{ep}?status=0",
    ),
    ("dashboard overview", "/dashboard"),
    ("dead letters page", "/dashboard/dead"),
    ("messages page", "/dashboard/messages"),
    (
        "messages by eventId",
        "/dashboard/messages?app=bench&id={evt}",
    ),
    ("messages ?status=dead", "/dashboard/messages?status=dead"),
];

/// `herald-bench --reads`: the table of read costs (see `--reads`).
pub(crate) async fn reads(args: &BenchArgs) -> anyhow::Result<()> {
    let n = args.deliveries;
    if let Some(path) = &args.seed_store {
        if path.exists() {
            bail!("--seed-store: {} exists; give a new path", path.display());
        }
        let mut config = Config::load(None)?;
        config.store.database_url = format!("sqlite://{}", path.display());
        let backend = server::open_store(&config).await?;
        let began = Instant::now();
        let store = backend.store();
        // Disabled, so that a Herald started on the copy holds these
        // deliveries (stored, not sent): a big store beside a bench run.
        for ep in seed_app(&store, n).await? {
            store
                .disable_endpoint(
                    &ep,
                    "seeded by herald-bench",
                    false,
                    None,
                    herald::store::now_millis(),
                )
                .await?;
        }
        backend.close().await;
        println!(
            "seeded {} with {n} deliveries in {:.0} s",
            path.display(),
            began.elapsed().as_secs_f64()
        );
        return Ok(());
    }
    println!(
        "herald-bench --reads: {n} pending deliveries (one per message, {READS_ENDPOINTS} endpoints, \
         a failed attempt for the oldest tenth), median of {READS_REPEATS}, {}",
        machine()
    );
    let header: Vec<&str> = READS.iter().map(|(name, _)| *name).collect();
    println!("| store | deliveries | seed | {} |", header.join(" | "));
    println!("|---|---|---|{}", "---|".repeat(READS.len()));
    let targets = Target::store_only(args);
    for (label, target) in targets {
        let r = reads_run(&target, n).await?;
        let cells: Vec<String> = r
            .reads
            .iter()
            .map(|(_, d)| format!("{:.1} ms", d.as_secs_f64() * 1000.0))
            .collect();
        println!(
            "| {label} | {n} | {:.0} s | {} |",
            r.seed.as_secs_f64(),
            cells.join(" | ")
        );
    }
    Ok(())
}

async fn reads_run(target: &Target, n: usize) -> anyhow::Result<ReadTimes> {
    let dir = tempfile::tempdir()?;
    let token = "bench-admin-token-0123456789";
    let mut config = Config::load(None)?;
    let schema = target.store_for(&mut config, &dir.path().join("reads.db"));
    config.security.admin_token = Some(token.into());
    let backend = server::open_store(&config).await?;
    let began = Instant::now();
    let ep = seed_app(&backend.store(), n)
        .await?
        .into_iter()
        .next()
        .context("no endpoint")?;
    backend.close().await;
    if let Some(schema) = &schema {
        schema.analyze().await?;
    }
    let seed = began.elapsed();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let running = server::start(config.clone(), Some(listener), Role::Api).await?;
    let base = format!("http://{}", running.addr.context("the API listens")?);
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let login = client
        .post(format!("{base}/dashboard/login"))
        .form(&[("token", token)])
        .send()
        .await?;
    let cookie = login
        .headers()
        .get(reqwest::header::SET_COOKIE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .context("the dashboard log-in set no cookie")?
        .to_owned();
    let event_id = format!("evt-{}", n / 2);
    let mut times = Vec::new();
    for (name, path) in READS {
        let path = path
            .replace("{ep}", ep.as_str())
            .replace("{evt}", &event_id);
        let mut took = Vec::with_capacity(READS_REPEATS);
        for i in 0..=READS_REPEATS {
            if path == "/metrics" {
                // A scrape within SCRAPE_FRESH of another reads nothing.
                tokio::time::sleep(herald::metrics::SCRAPE_FRESH + Duration::from_millis(100))
                    .await;
            }
            let began = Instant::now();
            let resp = client
                .get(format!("{base}{path}"))
                .bearer_auth(token)
                .header(reqwest::header::COOKIE, &cookie)
                .send()
                .await?;
            let status = resp.status();
            let body = resp.bytes().await?;
            let elapsed = began.elapsed();
            if !status.is_success() {
                bail!(
                    "{path}: {status}: {}",
                    String::from_utf8_lossy(&body[..body.len().min(300)])
                );
            }
            if i > 0 {
                took.push(u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX));
            }
        }
        took.sort_unstable();
        times.push((name, percentile(&took, 50.0)));
    }
    running.shutdown().await?;
    if let Some(schema) = schema {
        schema.drop_it().await;
    }
    Ok(ReadTimes { seed, reads: times })
}

/// An application with [`READS_ENDPOINTS`] endpoints and `n` deliveries
/// ([`seed`]); the endpoints' ids.
async fn seed_app(
    store: &std::sync::Arc<dyn herald::store::Store>,
    n: usize,
) -> anyhow::Result<Vec<herald::ids::EndpointId>> {
    use herald::ids::AppId;
    use herald::store::{App, Endpoint};

    let now = herald::store::now_millis();
    let app = App {
        id: AppId::generate(),
        uid: Some("bench".to_owned()),
        name: "bench".to_owned(),
        rate_limit: None,
        metadata: Default::default(),
        created_at: now,
        updated_at: now,
    };
    store.create_app(&app).await?;
    let mut endpoints = Vec::with_capacity(READS_ENDPOINTS);
    for k in 0..READS_ENDPOINTS {
        let mut e = Endpoint::new(
            app.id.clone(),
            "http://127.0.0.1:9/",
            herald_signing::Secret::generate().expose(),
            now,
        );
        e.filter_types = Some(vec![format!("bench.event.{k}")]);
        store.create_endpoint(&e).await?;
        endpoints.push(e.id);
    }

    // Created over the last day, all due, all pending.
    let t0 = now - 86_400_000;
    seed(store, &app.id, READS_ENDPOINTS, n, t0).await?;
    Ok(endpoints)
}

/// `n` messages with one pending, due delivery each (round-robin over the
/// endpoints, each of which takes its own event type), created over the
/// day from `t0`, through the store's own ingest in batches; then a failed
/// attempt for a tenth of them (the oldest), written as the dispatcher
/// writes one: claimed, then completed with a retry due at once.
async fn seed(
    store: &std::sync::Arc<dyn herald::store::Store>,
    app: &herald::ids::AppId,
    endpoints: usize,
    n: usize,
    t0: i64,
) -> anyhow::Result<()> {
    use herald::ids::AttemptId;
    use herald::store::{AttemptRecord, ClaimRequest, Completion, NewMessage, NextState};

    let step = 86_400_000 / i64::try_from(n.max(1))?;
    let mut from = 0usize;
    while from < n {
        let to = (from + READS_BATCH).min(n);
        let batch: Vec<NewMessage> = (from..to)
            .map(|i| {
                let event_type = format!("bench.event.{}", i % endpoints);
                let at = t0 + step * i64::try_from(i).unwrap_or(0);
                NewMessage {
                    event_id: Some(format!("evt-{i}")),
                    ..NewMessage::plain(app, &event_type, "{\"n\":1}".to_owned(), at)
                }
            })
            .collect();
        store.insert_messages(&batch).await?;
        from = to;
    }
    let in_flight = std::collections::HashMap::new();
    let mut failed = 0usize;
    while failed < n / 10 {
        let now = herald::store::now_millis();
        let claimed = store
            .claim(&ClaimRequest {
                now,
                lease_until: now + 60_000,
                limit: (n / 10 - failed).min(READS_BATCH),
                in_flight: &in_flight,
                endpoint_cap: usize::MAX / 4,
                unlisted_cap: usize::MAX / 4,
            })
            .await?;
        if claimed.is_empty() {
            bail!("seeding claimed nothing after {failed} failed attempts");
        }
        let batch: Vec<Completion> = claimed
            .iter()
            .map(|d| Completion {
                attempt: AttemptRecord {
                    id: AttemptId::generate(),
                    delivery_id: d.id.clone(),
                    msg_id: d.msg_id.clone(),
                    endpoint_id: d.endpoint_id.clone(),
                    app_id: d.app_id.clone(),
                    url: d.url.clone(),
                    attempt_number: d.attempts + 1,
                    started_at: now,
                    duration_ms: 5,
                    status_code: Some(500),
                    response: "busy".to_owned(),
                    error: None,
                    success: false,
                    manual: false,
                },
                lease_token: d.lease_token.clone(),
                next: NextState::Retry { at: now },
                now,
                cycle_attempt: 1,
            })
            .collect();
        store.complete(&batch).await?;
        failed += claimed.len();
    }
    Ok(())
}

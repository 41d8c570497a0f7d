//! `herald-bench --claim-cost N`: the store's claims (and `next_due_at`)
//! timed against N overdue deliveries, all claimable or all held.

use std::time::{Duration, Instant};

use std::sync::Arc;

use herald::config::Config;
use herald::server;
use tokio::sync::Notify;

use crate::bench::*;

/// Endpoints the claim-cost rows spread their overdue deliveries over.
const CLAIM_COST_ENDPOINTS: usize = 200;
/// Claims (and `next_due_at` calls) timed per claim-cost row.
const CLAIM_COST_CLAIMS: usize = 40;

/// What one claim-cost row measured.
struct ClaimCost {
    first: Duration,
    p50: Duration,
    max: Duration,
    claimed_per_claim: f64,
    next_due_p50: Duration,
}

/// Fills a fresh store with `overdue` pending deliveries due an hour or
/// more ago, over [`CLAIM_COST_ENDPOINTS`] endpoints; with `held`, disables
/// those endpoints (as auto-disable does) and adds claimable work due after
/// them. Then times claims of the dispatcher's usual size, each taking
/// what it finds (leased for an hour, so they stay out of the next one's
/// way), and `next_due_at`.
async fn claim_cost_run(target: &Target, overdue: usize, held: bool) -> anyhow::Result<ClaimCost> {
    use herald::ids::AppId;
    use herald::store::{App, ClaimRequest, Endpoint, NewMessage};

    let dir = tempfile::tempdir()?;
    let mut config = Config::load(None)?;
    let schema = target.store_for(&mut config, &dir.path().join("claims.db"));
    let backend = server::open_store(&config).await?;
    let store = backend.store();
    let now = herald::store::now_millis();
    let hour = 3_600_000;

    let new_app = |name: &str| App {
        id: AppId::generate(),
        uid: None,
        name: name.to_owned(),
        rate_limit: None,
        metadata: Default::default(),
        created_at: now,
        updated_at: now,
    };
    let new_endpoint = |app: &AppId| {
        Endpoint::new(
            app.clone(),
            "http://127.0.0.1:9/",
            herald_signing::Secret::generate().expose(),
            now,
        )
    };
    // Messages of `app` created evenly over [from, from + span), so their
    // deliveries fall due in that order.
    let fill = |app: AppId, messages: usize, from: i64, span: i64| {
        let store = store.clone();
        async move {
            let step = span / i64::try_from(messages.max(1)).unwrap_or(i64::MAX);
            let all: Vec<NewMessage> = (0..messages)
                .map(|i| {
                    let at = from + step * i64::try_from(i).unwrap_or(0);
                    NewMessage::plain(&app, "bench.event", "{}".to_owned(), at)
                })
                .collect();
            for chunk in all.chunks(500) {
                store.insert_messages(chunk).await?;
            }
            anyhow::Ok(())
        }
    };

    let backlog = new_app("backlog");
    store.create_app(&backlog).await?;
    let mut endpoints = Vec::new();
    for _ in 0..CLAIM_COST_ENDPOINTS {
        let e = new_endpoint(&backlog.id);
        store.create_endpoint(&e).await?;
        endpoints.push(e.id);
    }
    fill(
        backlog.id.clone(),
        overdue.div_ceil(CLAIM_COST_ENDPOINTS),
        now - 2 * hour,
        hour,
    )
    .await?;
    let limit = config.delivery.max_in_flight;
    let cap = config.delivery.endpoint_concurrency.saturating_mul(2);
    if held {
        let op = herald::operator::Operator::new(store.clone(), &config, Arc::new(Notify::new()));
        for ep in &endpoints {
            op.disable(&backlog.id, ep, "bench", true, None).await?;
        }
        // Claimable work, due after every held delivery: enough for every
        // timed claim to fill up.
        let live = new_app("live");
        store.create_app(&live).await?;
        let live_endpoints = 50;
        for _ in 0..live_endpoints {
            store.create_endpoint(&new_endpoint(&live.id)).await?;
        }
        let needed = 2 * CLAIM_COST_CLAIMS * limit;
        fill(
            live.id.clone(),
            needed.div_ceil(live_endpoints),
            now - hour / 2,
            hour / 4,
        )
        .await?;
    }

    let in_flight = std::collections::HashMap::new();
    let mut times = Vec::with_capacity(CLAIM_COST_CLAIMS);
    let mut claimed = 0;
    for _ in 0..CLAIM_COST_CLAIMS {
        let began = Instant::now();
        let got = store
            .claim(&ClaimRequest {
                now,
                lease_until: now + hour,
                limit,
                in_flight: &in_flight,
                endpoint_cap: cap,
                unlisted_cap: cap,
            })
            .await?;
        times.push(began.elapsed());
        claimed += got.len();
    }
    let mut next_due = Vec::with_capacity(CLAIM_COST_CLAIMS);
    for _ in 0..CLAIM_COST_CLAIMS {
        let began = Instant::now();
        store.next_due_at().await?;
        next_due.push(began.elapsed());
    }
    backend.close().await;
    if let Some(schema) = schema {
        schema.drop_it().await;
    }
    let first = times.first().copied().unwrap_or_default();
    let nanos = |v: &[Duration]| {
        let mut n: Vec<u64> = v
            .iter()
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
            .collect();
        n.sort_unstable();
        n
    };
    let sorted = nanos(&times);
    Ok(ClaimCost {
        first,
        p50: percentile(&sorted, 50.0),
        max: percentile(&sorted, 100.0),
        claimed_per_claim: claimed as f64 / CLAIM_COST_CLAIMS as f64,
        next_due_p50: percentile(&nanos(&next_due), 50.0),
    })
}

/// The claim-cost table (see `--claim-cost`).
pub(crate) async fn claim_cost(args: &BenchArgs, overdue: usize) -> anyhow::Result<()> {
    println!(
        "herald-bench --claim-cost: {overdue} overdue deliveries over {CLAIM_COST_ENDPOINTS} endpoints, \
         {CLAIM_COST_CLAIMS} claims of HERALD_MAX_IN_FLIGHT each, {}",
        machine()
    );
    println!("| store | overdue deliveries | claims found | first claim | claim p50 | claim max | next_due_at p50 |");
    println!("|---|---|---|---|---|---|---|");
    let targets = Target::store_only(args);
    for (name, target) in &targets {
        for held in [false, true] {
            let c = claim_cost_run(target, overdue, held).await?;
            let kind = if held {
                "all held (endpoints disabled), claimable work after them"
            } else {
                "all claimable, no endpoint full"
            };
            println!(
                "| {name} | {overdue}: {kind} | {:.0} per claim | {:.1?} | {:.1?} | {:.1?} | {:.1?} |",
                c.claimed_per_claim, c.first, c.p50, c.max, c.next_due_p50
            );
        }
    }
    Ok(())
}

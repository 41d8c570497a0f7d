//! `herald-bench --engine MODE`: issue 13's claim rules measured end to
//! end, on SQLite and (with `--postgres URL`) on PostgreSQL, one process
//! (role `all`) with a receiver in this process.
//!
//! - `throttle`: one endpoint at `throttleRate` 10, 100 and 1,000/s; the
//!   requests per second the receiver saw against the setting, and the
//!   busiest one-second window.
//! - `fifo`: one ordered endpoint, the receiver answering after 0, 5 and
//!   20 ms, then after 0 ms beside 5,000 idle FIFO endpoints (PostgreSQL:
//!   just made, then analyzed); deliveries per second against the round
//!   trip.
//! - `backlog`: healthy traffic (`--messages` to one endpoint), alone and
//!   beside 100,000 pending deliveries of a stuck endpoint (it never
//!   answers in time), 2 s and 12 s after the last of them went in;
//!   healthy deliveries per second.
//! - `storm`: fresh traffic alone, and while `--messages` retries of
//!   another endpoint fall due at once; the fresh deliveries' p99 (the
//!   k-th arrival against the k-th send, a close stand-in for each
//!   message's own latency when they are sent and answered in order).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use herald::config::Config;
use herald::server::{self, Role};

use crate::bench::BenchArgs;
use crate::receiver::Receiver;

const TOKEN: &str = "bench-admin-token-0123456789";

/// One Herald (role `all`) on SQLite or a fresh PostgreSQL schema, with a
/// client of its API.
struct Instance {
    running: server::Running,
    client: reqwest::Client,
    base: String,
    rx: Arc<Receiver>,
    rx_base: String,
    _dir: tempfile::TempDir,
    schema: Option<(String, String)>,
}

impl Instance {
    async fn start(
        args: &BenchArgs,
        postgres: Option<&str>,
        overrides: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let mut values: BTreeMap<String, String> = [
            (
                "HERALD_DATABASE_URL",
                format!("sqlite://{}", dir.path().join("bench.db").display()),
            ),
            ("HERALD_ADMIN_TOKEN", TOKEN.to_owned()),
            ("HERALD_ALLOW_PRIVATE_NETWORKS", "true".to_owned()),
            ("HERALD_LOG", "warn".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let mut schema = None;
        if let Some(url) = postgres {
            let name = format!(
                "herald_bench_{}",
                ulid::Ulid::new().to_string().to_ascii_lowercase()
            );
            values.insert("HERALD_DATABASE_URL".into(), url.to_owned());
            values.insert("HERALD_DATABASE_SCHEMA".into(), name.clone());
            schema = Some((url.to_owned(), name));
        }
        for (k, v) in overrides {
            values.insert((*k).to_owned(), (*v).to_owned());
        }
        let mut config = Config::from_values(&values)?;
        crate::bench::admit_the_bench_client(&mut config, args.concurrency);
        let (rx, rx_base) = Receiver::start(0, 0, Instant::now()).await?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let running = server::start(config, Some(listener), Role::All).await?;
        let addr = running.addr.context("the API listens")?;
        Ok(Instance {
            running,
            client: reqwest::Client::builder()
                .pool_max_idle_per_host(64)
                .build()?,
            base: format!("http://{addr}/api/v1"),
            rx,
            rx_base,
            _dir: dir,
            schema,
        })
    }

    async fn post(&self, path: &str, body: serde_json::Value) -> anyhow::Result<serde_json::Value> {
        Ok(self
            .client
            .post(format!("{}{path}", self.base))
            .bearer_auth(TOKEN)
            .json(&body)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?)
    }

    /// This process's claims so far that found nothing and that found
    /// work (`herald_dispatch_claims_total`; every Herald of the bench
    /// shares the one recorder, so take differences).
    async fn claims(&self) -> anyhow::Result<(f64, f64)> {
        let text = self
            .client
            .get(self.base.replace("/api/v1", "/metrics"))
            .bearer_auth(TOKEN)
            .send()
            .await?
            .error_for_status()?
            .text()
            .await?;
        let of = |found: &str| {
            text.lines()
                .find(|l| l.starts_with("herald_dispatch_claims_total") && l.contains(found))
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        Ok((of("found=\"none\""), of("found=\"work\"")))
    }

    async fn app(&self) -> anyhow::Result<String> {
        let app = self
            .post("/app", serde_json::json!({"name": "bench"}))
            .await?;
        Ok(app["id"].as_str().context("app id")?.to_owned())
    }

    /// An application with one endpoint at `path` of the receiver.
    async fn app_with(&self, path: &str, extra: serde_json::Value) -> anyhow::Result<String> {
        let app = self.app().await?;
        let mut body = serde_json::json!({ "url": format!("{}{path}", self.rx_base) });
        if let (Some(o), Some(more)) = (body.as_object_mut(), extra.as_object()) {
            o.extend(more.clone());
        }
        self.post(&format!("/app/{app}/endpoint"), body).await?;
        Ok(app)
    }

    /// `n` FIFO endpoints, to which no message is sent, made through the
    /// API by 16 tasks, each in an application of its own (an application
    /// may have `HERALD_MAX_ENDPOINTS_PER_APP`, 1,000).
    async fn idle_fifo_endpoints(&self, n: usize) -> anyhow::Result<()> {
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..16 {
            let app = self.app().await?;
            let (client, url, target, next) = (
                self.client.clone(),
                format!("{}/app/{app}/endpoint", self.base),
                format!("{}/idle", self.rx_base),
                next.clone(),
            );
            tasks.spawn(async move {
                while next.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < n {
                    client
                        .post(&url)
                        .bearer_auth(TOKEN)
                        .json(&serde_json::json!({"url": target, "ordering": "fifo"}))
                        .send()
                        .await?
                        .error_for_status()?;
                }
                Ok::<_, anyhow::Error>(())
            });
        }
        while let Some(done) = tasks.join_next().await {
            done??;
        }
        Ok(())
    }

    /// When this Herald started each attempt to `app`'s endpoints, as its
    /// attempt log says (milliseconds): what it sent, apart from when the
    /// receiver, on the same cores, got round to reading it.
    async fn attempts_started(&self, app: &str) -> anyhow::Result<Vec<i64>> {
        let store = &self.running.store;
        let app = herald::ids::AppId::from_trusted(app.to_owned());
        let endpoints = store
            .list_endpoints(
                &app,
                &herald::store::PageReq {
                    limit: 10,
                    ..Default::default()
                },
            )
            .await?;
        let mut started = Vec::new();
        for ep in &endpoints.items {
            let mut page = herald::store::PageReq {
                limit: 250,
                ..Default::default()
            };
            loop {
                let got = store.list_attempts_of_endpoint(&app, &ep.id, &page).await?;
                started.extend(got.items.iter().map(|a| a.started_at));
                match got.items.last() {
                    Some(last) if got.has_more => page.after = Some(last.id.as_str().to_owned()),
                    _ => break,
                }
            }
        }
        Ok(started)
    }

    /// Sends `n` messages to `app`, `concurrency` at a time; returns when
    /// each was sent (by message number).
    async fn send(&self, app: &str, n: usize, concurrency: usize) -> anyhow::Result<Vec<Instant>> {
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let sent = Arc::new(Mutex::new(vec![None; n]));
        let mut tasks = Vec::new();
        for _ in 0..concurrency.max(1) {
            let (client, url, next, sent) = (
                self.client.clone(),
                format!("{}/app/{app}/msg", self.base),
                next.clone(),
                sent.clone(),
            );
            tasks.push(tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if i >= n {
                        return Ok::<_, anyhow::Error>(());
                    }
                    let at = Instant::now();
                    client
                        .post(&url)
                        .bearer_auth(TOKEN)
                        .json(&serde_json::json!({"eventType": "bench.event", "payload": {"i": i}}))
                        .send()
                        .await?
                        .error_for_status()?;
                    sent.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(at);
                }
            }));
        }
        for t in tasks {
            t.await??;
        }
        let sent = sent.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Ok(sent
            .into_iter()
            .map(|s| s.unwrap_or_else(Instant::now))
            .collect())
    }

    /// On PostgreSQL, what autovacuum's analyze would do a while after
    /// many rows went in: the planner's statistics of this schema's tables.
    async fn analyze(&self) -> anyhow::Result<()> {
        if let Some((url, name)) = &self.schema {
            let pool = sqlx::PgPool::connect(url).await?;
            let tables: Vec<String> = sqlx::query_scalar(
                "SELECT quote_ident(schemaname) || '.' || quote_ident(tablename) \
                 FROM pg_tables WHERE schemaname = $1",
            )
            .bind(name)
            .fetch_all(&pool)
            .await?;
            for table in tables {
                sqlx::query(sqlx::AssertSqlSafe(format!("ANALYZE {table}")))
                    .execute(&pool)
                    .await?;
            }
            pool.close().await;
        }
        Ok(())
    }

    async fn stop(self) -> anyhow::Result<()> {
        self.running.shutdown().await?;
        if let Some((url, name)) = self.schema {
            if let Ok(pool) = sqlx::PgPool::connect(&url).await {
                let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                    "DROP SCHEMA IF EXISTS {name} CASCADE"
                )))
                .execute(&pool)
                .await;
                pool.close().await;
            }
        }
        Ok(())
    }
}

/// The most of `at` that any window shorter than `second` holds (times
/// as `Instant`s, or milliseconds with `second` = 1,000).
fn busiest_second<T, D>(at: &[T], second: D) -> usize
where
    T: Copy + Ord + std::ops::Sub<Output = D>,
    D: PartialOrd,
{
    let mut at = at.to_vec();
    at.sort();
    (0..at.len())
        .map(|s| at[s..].iter().take_while(|t| **t - at[s] < second).count())
        .max()
        .unwrap_or(0)
}

fn per_sec(at: &[Instant]) -> f64 {
    let (Some(first), Some(last)) = (at.iter().min(), at.iter().max()) else {
        return 0.0;
    };
    (at.len().saturating_sub(1)) as f64 / last.duration_since(*first).as_secs_f64().max(1e-9)
}

fn p99(mut d: Vec<Duration>) -> Duration {
    d.sort();
    d.get((d.len() * 99 / 100).min(d.len().saturating_sub(1)))
        .copied()
        .unwrap_or_default()
}

async fn throttle(args: &BenchArgs, pg: Option<&str>, store: &str) -> anyhow::Result<()> {
    for rate in [10usize, 100, 1000] {
        let h = Instance::start(args, pg, &[]).await?;
        let app = h
            .app_with("/throttled", serde_json::json!({"throttleRate": rate}))
            .await?;
        let n = (rate * 5).clamp(50, 5000);
        h.send(&app, n, 16).await?;
        h.rx.wait_for("/throttled", n, args.timeout).await?;
        let at = h.rx.times("/throttled");
        let sent = h.attempts_started(&app).await?;
        println!(
            "| throttle | {store} | throttleRate {rate}/s, {n} messages | {:.1}/s seen | busiest second {} | busiest second as sent {} |",
            per_sec(&at),
            busiest_second(&at, Duration::from_secs(1)),
            busiest_second(&sent, 1000),
        );
        h.stop().await?;
    }
    Ok(())
}

async fn fifo(args: &BenchArgs, pg: Option<&str>, store: &str) -> anyhow::Result<()> {
    // The last runs: the same ordered endpoint beside this many idle FIFO
    // endpoints (on PostgreSQL a claim locks the row of each FIFO
    // endpoint it may take from); on PostgreSQL once just after they were
    // made and once analyzed, as autovacuum does within a minute of that
    // many new rows.
    const IDLE: usize = 5_000;
    let mut runs = vec![
        (0u64, 0, false),
        (5, 0, false),
        (20, 0, false),
        (0, IDLE, false),
    ];
    if pg.is_some() {
        runs.push((0, IDLE, true));
    }
    for (rtt, idle, analyze) in runs {
        let h = Instance::start(args, pg, &[]).await?;
        h.rx.rule("/ordered", Duration::from_millis(rtt), false);
        if idle > 0 {
            h.idle_fifo_endpoints(idle).await?;
        }
        if analyze {
            h.analyze().await?;
        }
        let app = h
            .app_with("/ordered", serde_json::json!({"ordering": "fifo"}))
            .await?;
        let n = 300;
        h.send(&app, n, 1).await?;
        h.rx.wait_for("/ordered", n, args.timeout).await?;
        let beside = match (idle, analyze) {
            (0, _) => String::new(),
            (_, false) if pg.is_some() => format!(", beside {idle} idle FIFO endpoints just made"),
            (_, false) => format!(", beside {idle} idle FIFO endpoints"),
            (_, true) => format!(", beside {idle} idle FIFO endpoints, analyzed"),
        };
        println!(
            "| fifo | {store} | receiver answers after {rtt} ms{beside} | {:.0} deliveries/s |",
            per_sec(&h.rx.times("/ordered"))
        );
        h.stop().await?;
    }
    Ok(())
}

async fn backlog(args: &BenchArgs, pg: Option<&str>, store: &str) -> anyhow::Result<()> {
    const STUCK: usize = 100_000;
    // Healthy traffic alone; then beside the backlog 2 s after its last
    // message went in (the claims may still be setting its newest rows
    // aside, and PostgreSQL's autovacuum may be at the rows they moved);
    // then 12 s after (settled).
    for settle in [None, Some(2u64), Some(12)] {
        let h = Instance::start(
            args,
            pg,
            &[("HERALD_REQUEST_TIMEOUT", "30s"), ("HERALD_LEASE", "70s")],
        )
        .await?;
        if let Some(settle) = settle {
            h.rx.rule("/stuck", Duration::from_secs(3600), false);
            let stuck = h.app_with("/stuck", serde_json::json!({})).await?;
            h.send(&stuck, STUCK, args.concurrency).await?;
            // Let the stuck endpoint fill its slots and its backlog age.
            tokio::time::sleep(Duration::from_secs(settle)).await;
        }
        let healthy = h.app_with("/healthy", serde_json::json!({})).await?;
        let claims_before = h.claims().await?;
        let start = Instant::now();
        h.send(&healthy, args.messages, args.concurrency).await?;
        h.rx.wait_for("/healthy", args.messages, args.timeout)
            .await?;
        let claims_after = h.claims().await?;
        let at = h.rx.times("/healthy");
        let last = at.iter().max().copied().unwrap_or(start);
        let beside = match settle {
            None => "alone".to_owned(),
            Some(s) => format!("beside 100,000 pending for a stuck endpoint, {s} s after the last"),
        };
        println!(
            "| backlog | {store} | {beside} | {:.0} healthy deliveries/s | claims meanwhile: {:.0} found nothing, {:.0} found work |",
            args.messages as f64 / last.duration_since(start).as_secs_f64().max(1e-9),
            claims_after.0 - claims_before.0,
            claims_after.1 - claims_before.1,
        );
        h.stop().await?;
    }
    Ok(())
}

async fn storm(args: &BenchArgs, pg: Option<&str>, store: &str) -> anyhow::Result<()> {
    for with_storm in [false, true] {
        let h = Instance::start(
            args,
            pg,
            &[("HERALD_RETRY_SCHEDULE", "3s"), ("HERALD_JITTER", "none")],
        )
        .await?;
        if with_storm {
            // Every first attempt fails; the retries fall due together 3 s
            // later, when the endpoint answers again.
            h.rx.rule("/storm", Duration::ZERO, true);
            let stormy = h.app_with("/storm", serde_json::json!({})).await?;
            h.send(&stormy, args.messages, args.concurrency).await?;
            tokio::time::sleep(Duration::from_millis(2500)).await;
            h.rx.rule("/storm", Duration::from_millis(5), false);
            tokio::time::sleep(Duration::from_millis(600)).await;
        }
        let fresh = h.app_with("/fresh", serde_json::json!({})).await?;
        let n = (args.messages / 4).max(100);
        let sent = h.send(&fresh, n, args.concurrency).await?;
        h.rx.wait_for("/fresh", n, args.timeout).await?;
        let mut at = h.rx.times("/fresh");
        at.sort();
        let mut sent = sent;
        sent.sort();
        let lat: Vec<Duration> = at
            .iter()
            .zip(&sent)
            .map(|(a, s)| a.saturating_duration_since(*s))
            .collect();
        println!(
            "| storm | {store} | {} | fresh p99 {:?} |",
            if with_storm {
                format!("while {} retries fall due at once", args.messages)
            } else {
                "fresh traffic alone".to_owned()
            },
            p99(lat)
        );
        h.stop().await?;
    }
    Ok(())
}

/// Runs `mode` on SQLite and, with `--postgres`, on PostgreSQL.
pub async fn run(args: &BenchArgs, mode: &str) -> anyhow::Result<()> {
    let mut targets = vec![(None, "SQLite")];
    if let Some(url) = args.postgres.as_deref() {
        targets.push((Some(url), "PostgreSQL"));
    }
    for (pg, store) in targets {
        match mode {
            "throttle" => throttle(args, pg, store).await?,
            "fifo" => fifo(args, pg, store).await?,
            "backlog" => backlog(args, pg, store).await?,
            "storm" => storm(args, pg, store).await?,
            other => bail!("unknown --engine mode `{other}`: throttle, fifo, backlog or storm"),
        }
    }
    Ok(())
}

//! `herald-bench`: starts Herald on a fresh SQLite file with an embedded
//! receiver, pushes messages through the real HTTP API, and reports ingest
//! rate, end-to-end deliveries/s and enqueue→arrival latency. It also
//! measures this machine's HTTP ceiling (the same client POSTing straight
//! to the receiver) and, with `--fairness`, the latency of healthy
//! endpoints next to one that answers only after a delay. With
//! `--claim-cost N` it instead times the store's claims (and `next_due_at`)
//! against N overdue deliveries: all claimable, or all held for disabled
//! endpoints with fresh work behind them.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio::sync::Notify;

use herald::config::Config;
use herald::server::{self, Role};

use crate::receiver::Receiver;

#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Messages to send in each run.
    #[arg(long, default_value_t = 20_000)]
    pub messages: usize,
    /// Concurrent API requests (and concurrent requests in the ceiling run).
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Approximate payload size in bytes.
    #[arg(long, default_value_t = 1024)]
    pub payload_bytes: usize,
    /// Also run the fairness rows: three healthy endpoints with and without
    /// a fourth that answers only after `--slow-delay` (with `--postgres`,
    /// on PostgreSQL too, for each `--worker-processes` count).
    #[arg(long)]
    pub fairness: bool,
    /// How long the slow endpoint takes to answer in the fairness rows.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub slow_delay: Duration,
    /// Endpoints in the fairness rows, the stuck ones included: one row has
    /// the healthy ones alone, the other adds `--stuck` endpoints that
    /// answer after `--slow-delay` (default: 3 healthy + 1 stuck).
    #[arg(long, default_value_t = 4)]
    pub fairness_endpoints: usize,
    /// How many of the fairness rows' endpoints are stuck.
    #[arg(long, default_value_t = 1)]
    pub stuck: usize,
    /// Give up waiting for deliveries after this long.
    #[arg(long, default_value = "300s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Also run on this PostgreSQL (each run in a fresh schema, dropped
    /// after), with the API in this process and `--worker-processes`
    /// separate `herald serve --role worker` processes (0: no worker
    /// process, the dispatcher runs beside the API as with `--role all`).
    #[arg(long)]
    pub postgres: Option<String>,
    /// Worker-process counts to run on PostgreSQL, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub worker_processes: Vec<usize>,
    /// Instead of the delivery runs, time claims against this many overdue
    /// pending deliveries, pre-filled over many endpoints straight into the
    /// store (SQLite, and PostgreSQL with `--postgres`): once all claimable
    /// with no endpoint full, once all held (their endpoints disabled) with
    /// claimable work due after them.
    #[arg(long)]
    pub claim_cost: Option<usize>,
    /// The `herald` binary the PostgreSQL runs start as worker processes
    /// (default: the one beside `herald-bench`, where `cargo build -p
    /// herald -p herald-bench` leaves both).
    #[arg(long)]
    pub herald: Option<std::path::PathBuf>,
    /// Instead of the delivery runs, time the reads an operator and
    /// Prometheus make (`/metrics`, an endpoint's stats, the dashboard's
    /// overview, dead letters and messages pages, an endpoint's attempts
    /// filtered by status) against `--deliveries` pending deliveries
    /// seeded through the store's own ingest (SQLite, and PostgreSQL with
    /// `--postgres`, then analyzed as autovacuum would).
    #[arg(long)]
    pub reads: bool,
    /// With `--reads`: only seed a new SQLite store at this path with
    /// `--deliveries` (as the read runs do) and keep it, for the
    /// `copy-store` and `backup` figures.
    #[arg(long, requires = "reads", value_name = "PATH")]
    pub seed_store: Option<std::path::PathBuf>,
    /// The SQLite runs start from a copy of this store (e.g. one made by
    /// `--seed-store`, whose endpoints are disabled: its deliveries are
    /// held, stored but not sent), not from an empty one.
    #[arg(long, value_name = "PATH")]
    pub store_from: Option<std::path::PathBuf>,
    /// During each SQLite run, half a second after sending begins, take a
    /// `herald backup` of the run's store and print how long it took.
    #[arg(long)]
    pub backup_during: bool,
    /// Deliveries (one per message, over 100 endpoints) for `--reads`.
    #[arg(long, default_value_t = 1_000_000)]
    pub deliveries: usize,
    /// Instead of the delivery runs, one of issue 13's claim-rule runs
    /// (`throttle`, `fifo`, `backlog`, `storm`; see `engine.rs`).
    #[arg(long)]
    pub engine: Option<String>,
}

/// Where a run keeps its data.
#[derive(Debug, Clone)]
enum Target {
    Sqlite,
    Postgres { url: String, workers: usize },
}

/// `--herald`, or the `herald` beside this executable.
fn herald_binary(args: &BenchArgs) -> anyhow::Result<std::path::PathBuf> {
    let path = match &args.herald {
        Some(path) => path.clone(),
        None => std::env::current_exe()
            .context("locating herald-bench")?
            .with_file_name("herald"),
    };
    if !path.is_file() {
        bail!(
            "{}: no herald binary for the worker processes; build it (cargo build --release -p herald) \
             or name it with --herald",
            path.display()
        );
    }
    Ok(path)
}

impl Target {
    /// Points `config` at this run's store: the SQLite file `sqlite` in a
    /// folder of the run's, or a fresh PostgreSQL schema, returned so the
    /// run can drop it.
    fn store_for(&self, config: &mut Config, sqlite: &std::path::Path) -> Option<Schema> {
        match self {
            Target::Sqlite => {
                config.store.database_url = format!("sqlite://{}", sqlite.display());
                None
            }
            Target::Postgres { url, .. } => {
                let name = format!(
                    "herald_bench_{}",
                    ulid::Ulid::new().to_string().to_ascii_lowercase()
                );
                config.store.database_url = url.clone();
                config.store.database_schema = name.clone();
                Some(Schema {
                    url: url.clone(),
                    name,
                })
            }
        }
    }
}

/// A fresh PostgreSQL schema for one run, dropped afterwards.
pub(crate) struct Schema {
    pub(crate) url: String,
    pub(crate) name: String,
}

impl Schema {
    /// What autovacuum would do soon after a bulk load: the planner's
    /// figures for the new rows.
    pub(crate) async fn analyze(&self) -> anyhow::Result<()> {
        let pool = sqlx::PgPool::connect(&self.url).await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ANALYZE {}.deliveries",
            self.name
        )))
        .execute(&pool)
        .await?;
        for table in ["messages", "attempts", "endpoints"] {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "ANALYZE {}.{table}",
                self.name
            )))
            .execute(&pool)
            .await?;
        }
        pool.close().await;
        Ok(())
    }

    pub(crate) async fn drop_it(&self) {
        if let Ok(pool) = sqlx::PgPool::connect(&self.url).await {
            let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP SCHEMA IF EXISTS {} CASCADE",
                self.name
            )))
            .execute(&pool)
            .await;
            pool.close().await;
        }
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    herald_policy::parse_duration(s)
}

fn payload(seq: usize, size: usize) -> String {
    let head = format!("{{\"seq\":{seq},\"pad\":\"");
    let pad = size.saturating_sub(head.len() + 2);
    format!("{head}{}\"}}", "x".repeat(pad))
}

/// Runs `n` jobs with `concurrency` workers; returns each job's start time
/// (ns since `epoch`) and the wall time of the whole run.
async fn drive<F, Fut>(
    n: usize,
    concurrency: usize,
    epoch: Instant,
    job: F,
) -> anyhow::Result<(Vec<u64>, Duration)>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let job = Arc::new(job);
    let next = Arc::new(AtomicUsize::new(0));
    let starts: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
    let began = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency.max(1) {
        let (job, next, starts) = (job.clone(), next.clone(), starts.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= n {
                    return Ok::<(), anyhow::Error>(());
                }
                starts[i].store(
                    u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX),
                    Ordering::SeqCst,
                );
                job(i).await?;
            }
        }));
    }
    for t in tasks {
        t.await.context("bench worker panicked")??;
    }
    let elapsed = began.elapsed();
    let starts = starts.iter().map(|a| a.load(Ordering::SeqCst)).collect();
    Ok((starts, elapsed))
}

fn percentile(sorted: &[u64], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    Duration::from_nanos(sorted[rank.min(sorted.len() - 1)])
}

struct RunResult {
    ingest_per_sec: f64,
    deliveries_per_sec: f64,
    p50: Duration,
    p99: Duration,
    /// CPU time per delivery, when everything ran in this process.
    cpu_per_delivery: Option<Duration>,
}

/// CPU time (user + system) this process has used so far. Per delivery,
/// set against the ceiling's per request, it says how much dearer a
/// delivery is than a bare HTTP exchange, whether or not the cores were
/// kept busy (throughput mixes the two).
fn cpu_time() -> Duration {
    // SAFETY: getrusage only writes into the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return Duration::ZERO;
    }
    let of = |t: libc::timeval| {
        Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
    };
    of(usage.ru_utime) + of(usage.ru_stime)
}

/// `cpu` spread over `n` operations.
fn per_op(cpu: Duration, n: usize) -> Duration {
    cpu / u32::try_from(n.max(1)).unwrap_or(u32::MAX)
}

/// One run's line of the table; the share of `ceiling` when given.
fn row(label: &str, r: &RunResult, ceiling: Option<f64>) -> String {
    let share = ceiling
        .map(|c| format!("{:.1} %", 100.0 * r.deliveries_per_sec / c))
        .unwrap_or_default();
    format!(
        "| {label} | {:.0} | {:.0} | {:.1?} | {:.1?} | {share} | {} |",
        r.ingest_per_sec,
        r.deliveries_per_sec,
        r.p50,
        r.p99,
        cpu_cell(r.cpu_per_delivery)
    )
}

/// A CPU figure for the table, blank when not measured.
fn cpu_cell(cpu: Option<Duration>) -> String {
    cpu.map(|d| format!("{:.1} µs", d.as_secs_f64() * 1e6))
        .unwrap_or_default()
}

/// One run on a fresh Herald: `fast` healthy endpoints and `slow` ones that
/// answer after `--slow-delay` (each endpoint gets every message).
async fn herald_run(args: &BenchArgs, fast: usize, slow: usize) -> anyhow::Result<RunResult> {
    herald_run_on(args, fast, slow, &Target::Sqlite).await
}

async fn herald_run_on(
    args: &BenchArgs,
    fast: usize,
    slow: usize,
    target: &Target,
) -> anyhow::Result<RunResult> {
    let epoch = Instant::now();
    let (rx, rx_base) = Receiver::start(fast, args.messages, epoch).await?;
    rx.rule("/slow/", args.slow_delay, false);
    let dir = tempfile::tempdir()?;
    let token = "bench-admin-token-0123456789";
    // HERALD_* variables tune the run (e.g. HERALD_ENDPOINT_CONCURRENCY);
    // the store, token and network policy are the bench's own.
    let mut config = Config::load(None)?;
    let schema = target.store_for(&mut config, &dir.path().join("bench.db"));
    if let (Target::Sqlite, Some(from)) = (target, &args.store_from) {
        // With its -wal: a store closed by another process may keep
        // committed pages there.
        for suffix in ["", "-wal"] {
            let from = std::path::PathBuf::from(format!("{}{suffix}", from.display()));
            if suffix.is_empty() || from.exists() {
                std::fs::copy(&from, dir.path().join(format!("bench.db{suffix}")))
                    .with_context(|| format!("--store-from: cannot copy {}", from.display()))?;
            }
        }
    }
    config.security.admin_token = Some(token.into());
    config.egress.allow_private_networks = true;
    admit_the_bench_client(&mut config, args.concurrency);
    let role = match target {
        Target::Postgres { workers, .. } if *workers > 0 => Role::Api,
        _ => Role::All,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let running = server::start(config.clone(), Some(listener), role).await?;
    let mut workers = Vec::new();
    if let Target::Postgres { url, workers: n } = target {
        let exe = herald_binary(args)?;
        for _ in 0..*n {
            workers.push(
                tokio::process::Command::new(&exe)
                    .args(["serve", "--role", "worker"])
                    .env("HERALD_DATABASE_URL", url)
                    .env("HERALD_DATABASE_SCHEMA", &config.store.database_schema)
                    .env("HERALD_ALLOW_PRIVATE_NETWORKS", "true")
                    .env("HERALD_LOG", "warn")
                    .stdout(std::process::Stdio::null())
                    .kill_on_drop(true)
                    .spawn()
                    .context("starting a worker process")?,
            );
        }
    }
    let addr = running.addr.context("the API listens")?;
    let base = format!("http://{addr}/api/v1");
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency)
        .build()?;
    let auth = format!("Bearer {token}");

    let app: serde_json::Value = client
        .post(format!("{base}/app"))
        .header("authorization", &auth)
        .json(&serde_json::json!({"name": "bench"}))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let app_id = app["id"].as_str().context("app id")?.to_owned();
    let mut urls: Vec<String> = (0..fast).map(|i| format!("{rx_base}/fast/{i}")).collect();
    urls.extend((0..slow).map(|i| format!("{rx_base}/slow/{i}")));
    for url in urls {
        client
            .post(format!("{base}/app/{app_id}/endpoint"))
            .header("authorization", &auth)
            .json(&serde_json::json!({ "url": url }))
            .send()
            .await?
            .error_for_status()?;
    }

    rx.expect(fast * args.messages);
    let size = args.payload_bytes;
    let (c, b, a) = (
        client.clone(),
        format!("{base}/app/{app_id}/msg"),
        auth.clone(),
    );
    let backup = (args.backup_during && matches!(target, Target::Sqlite)).then(|| {
        let (config, path) = (config.clone(), dir.path().join("during.db"));
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let began = Instant::now();
            let summary = server::backup(&config, path, false).await;
            (began.elapsed(), summary)
        })
    });
    let cpu_before = cpu_time();
    let (starts, ingest_time) = drive(args.messages, args.concurrency, epoch, move |i| {
        let (c, b, a) = (c.clone(), b.clone(), a.clone());
        async move {
            let body = format!(
                "{{\"eventType\":\"bench.event\",\"payload\":{}}}",
                payload(i, size)
            );
            let status = c
                .post(&b)
                .header("authorization", &a)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await?
                .status();
            if status != reqwest::StatusCode::ACCEPTED {
                bail!("message {i} was answered {status}");
            }
            Ok(())
        }
    })
    .await?;

    let waited = tokio::time::timeout(args.timeout, rx.all_arrived()).await;
    if waited.is_err() {
        bail!(
            "only {} of {} deliveries arrived within {:?}",
            rx.received(),
            fast * args.messages,
            args.timeout
        );
    }
    if let Some(backup) = backup {
        let (took, summary) = backup.await.context("the backup task")?;
        println!(
            "backup during the run: {:.2} s, {}",
            took.as_secs_f64(),
            summary.context("the backup during the run")?
        );
    }
    let mut latencies = Vec::with_capacity(fast * args.messages);
    let mut last_arrival = 0;
    for per_endpoint in rx.firsts() {
        for (i, at) in per_endpoint.into_iter().enumerate() {
            last_arrival = last_arrival.max(at);
            latencies.push(at.saturating_sub(starts[i]));
        }
    }
    // With worker processes (PostgreSQL) much of the work is elsewhere.
    let cpu_per_delivery = matches!(target, Target::Sqlite)
        .then(|| per_op(cpu_time().saturating_sub(cpu_before), fast * args.messages));
    latencies.sort_unstable();
    let first_start = starts.iter().copied().min().unwrap_or(0);
    let span = Duration::from_nanos(last_arrival.saturating_sub(first_start)).as_secs_f64();
    let result = RunResult {
        ingest_per_sec: args.messages as f64 / ingest_time.as_secs_f64(),
        deliveries_per_sec: (fast * args.messages) as f64 / span,
        p50: percentile(&latencies, 50.0),
        p99: percentile(&latencies, 99.0),
        cpu_per_delivery,
    };
    running.shutdown().await?;
    for mut w in workers {
        if let Some(pid) = w.id().and_then(|p| i32::try_from(p).ok()) {
            // SAFETY: signalling a child process this function started.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let _ = tokio::time::timeout(Duration::from_secs(60), w.wait()).await;
    }
    if let Some(schema) = schema {
        schema.drop_it().await;
    }
    Ok(result)
}

/// Every bench request comes from 127.0.0.1 over up to `concurrency`
/// connections, and the client's pool may open a few more while a finished
/// one is on its way back: at `--concurrency 256` the default per-address
/// bound (256) reset connections and ended the run.
pub(crate) fn admit_the_bench_client(config: &mut Config, concurrency: usize) {
    config.listener.max_connections_per_ip = config
        .listener
        .max_connections_per_ip
        .max(concurrency.saturating_mul(2));
}

/// The same client and receiver, without Herald in between.
async fn ceiling_run(args: &BenchArgs) -> anyhow::Result<(f64, Duration)> {
    let epoch = Instant::now();
    let (_rx, rx_base) = Receiver::start(1, args.messages, epoch).await?;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency)
        .build()?;
    let size = args.payload_bytes;
    let url = format!("{rx_base}/fast/0");
    let cpu_before = cpu_time();
    let (_, elapsed) = drive(args.messages, args.concurrency, epoch, move |i| {
        let (c, u) = (client.clone(), url.clone());
        async move {
            c.post(&u)
                .body(payload(i, size))
                .send()
                .await?
                .error_for_status()?;
            Ok(())
        }
    })
    .await?;
    let cpu = per_op(cpu_time().saturating_sub(cpu_before), args.messages);
    Ok((args.messages as f64 / elapsed.as_secs_f64(), cpu))
}

pub(crate) fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    format!("{cores} cores, {cpu}")
}

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
    use herald::ids::{AppId, MsgId};
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
                .map(|i| NewMessage {
                    id: MsgId::generate(),
                    app_id: app.clone(),
                    event_type: "bench.event".to_owned(),
                    event_id: None,
                    payload: "{}".to_owned(),
                    channels: None,
                    created_at: from + step * i64::try_from(i).unwrap_or(0),
                    traceparent: None,
                    tags: None,
                    deliver_at: None,
                    payload_expires_at: None,
                    application: None,
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
async fn claim_cost(args: &BenchArgs, overdue: usize) -> anyhow::Result<()> {
    println!(
        "herald-bench --claim-cost: {overdue} overdue deliveries over {CLAIM_COST_ENDPOINTS} endpoints, \
         {CLAIM_COST_CLAIMS} claims of HERALD_MAX_IN_FLIGHT each, {}",
        machine()
    );
    println!("| store | overdue deliveries | claims found | first claim | claim p50 | claim max | next_due_at p50 |");
    println!("|---|---|---|---|---|---|---|");
    let mut targets = vec![("SQLite", Target::Sqlite)];
    if let Some(url) = &args.postgres {
        targets.push((
            "PostgreSQL",
            Target::Postgres {
                url: url.clone(),
                workers: 0,
            },
        ));
    }
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

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.reads {
        return reads(&args).await;
    }
    if let Some(mode) = &args.engine {
        return crate::engine::run(&args, mode).await;
    }
    if let Some(overdue) = args.claim_cost {
        return claim_cost(&args, overdue).await;
    }
    println!(
        "herald-bench: {} messages, concurrency {}, ~{} B payloads, {}",
        args.messages,
        args.concurrency,
        args.payload_bytes,
        machine()
    );
    let (ceiling, ceiling_cpu) = ceiling_run(&args).await?;
    println!("| run | ingest msg/s | deliveries/s | p50 | p99 | % of ceiling | CPU per delivery |");
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| HTTP ceiling (client → receiver) | | {ceiling:.0} | | | 100 % | {} |",
        cpu_cell(Some(ceiling_cpu))
    );
    let r = herald_run(&args, 1, 0).await?;
    println!("{}", row("Herald, SQLite, 1 endpoint", &r, Some(ceiling)));
    if let Some(url) = &args.postgres {
        for &workers in &args.worker_processes {
            let target = Target::Postgres {
                url: url.clone(),
                workers,
            };
            let r = herald_run_on(&args, 1, 0, &target).await?;
            let processes = if workers == 0 {
                "1 process (API + dispatcher)".to_owned()
            } else {
                format!("1 API + {workers} worker process(es)")
            };
            let label = format!("Herald, PostgreSQL, {processes}, 1 endpoint");
            println!("{}", row(&label, &r, Some(ceiling)));
        }
    }
    if args.fairness {
        let all = args.fairness_endpoints.max(2);
        let stuck = args.stuck.clamp(1, all - 1);
        // The baseline is the same healthy endpoints without the stuck ones.
        let base = herald_run(&args, all - stuck, 0).await?;
        println!(
            "{}",
            row(
                &format!("fairness: {} healthy endpoints", all - stuck),
                &base,
                None
            )
        );
        let with_slow = herald_run(&args, all - stuck, stuck).await?;
        let label = format!(
            "fairness: {} healthy + {stuck} answering after {:?}",
            all - stuck,
            args.slow_delay
        );
        println!("{}", row(&label, &with_slow, None));
        let ratio = with_slow.p99.as_secs_f64() / base.p99.as_secs_f64().max(1e-9);
        println!("healthy endpoints' p99 with the stuck ones / without: {ratio:.2}×");
        // The same two rows on PostgreSQL, for each worker-process count.
        if let Some(url) = &args.postgres {
            for &workers in &args.worker_processes {
                let target = Target::Postgres {
                    url: url.clone(),
                    workers,
                };
                let base = herald_run_on(&args, all - stuck, 0, &target).await?;
                let with_slow = herald_run_on(&args, all - stuck, stuck, &target).await?;
                let label = format!("fairness on PostgreSQL ({workers} worker processes)");
                println!(
                    "{}",
                    row(&format!("{label}: {} healthy", all - stuck), &base, None)
                );
                println!(
                    "{}",
                    row(
                        &format!("{label}: {} healthy + {stuck} stuck", all - stuck),
                        &with_slow,
                        None
                    )
                );
                let ratio = with_slow.p99.as_secs_f64() / base.p99.as_secs_f64().max(1e-9);
                println!(
                    "{label}: healthy endpoints' p99 with the stuck ones / without: {ratio:.2}×"
                );
            }
        }
    }
    Ok(())
}

/// Endpoints the `--reads` rows spread their deliveries over.
const READS_ENDPOINTS: usize = 100;
/// Timed repeats of each read (after one untimed); the median is shown.
const READS_REPEATS: usize = 5;
/// Rows seeded per statement.
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
async fn reads(args: &BenchArgs) -> anyhow::Result<()> {
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
    let mut targets = vec![("SQLite", Target::Sqlite)];
    if let Some(url) = &args.postgres {
        targets.push((
            "PostgreSQL",
            Target::Postgres {
                url: url.clone(),
                workers: 0,
            },
        ));
    }
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
    use herald::ids::{AttemptId, MsgId};
    use herald::store::{AttemptRecord, ClaimRequest, Completion, NewMessage, NextState};

    let step = 86_400_000 / i64::try_from(n.max(1))?;
    let mut from = 0usize;
    while from < n {
        let to = (from + READS_BATCH).min(n);
        let batch: Vec<NewMessage> = (from..to)
            .map(|i| NewMessage {
                id: MsgId::generate(),
                app_id: app.clone(),
                event_type: format!("bench.event.{}", i % endpoints),
                event_id: Some(format!("evt-{i}")),
                payload: "{\"n\":1}".to_owned(),
                channels: None,
                created_at: t0 + step * i64::try_from(i).unwrap_or(0),
                traceparent: None,
                tags: None,
                deliver_at: None,
                payload_expires_at: None,
                application: None,
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

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

use herald::config::Config;
use herald::server::{self, Role};

use crate::claim_cost::claim_cost;
use crate::reads::reads;
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
pub(crate) enum Target {
    Sqlite,
    Postgres { url: String, workers: usize },
}

impl Target {
    /// SQLite, and PostgreSQL with `--postgres`, without worker processes:
    /// for the runs that time the store itself (`--claim-cost`, `--reads`).
    pub(crate) fn store_only(args: &BenchArgs) -> Vec<(&'static str, Target)> {
        let mut targets = vec![("SQLite", Target::Sqlite)];
        if let Some(url) = &args.postgres {
            let url = url.clone();
            targets.push(("PostgreSQL", Target::Postgres { url, workers: 0 }));
        }
        targets
    }
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
    pub(crate) fn store_for(
        &self,
        config: &mut Config,
        sqlite: &std::path::Path,
    ) -> Option<Schema> {
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

pub(crate) fn percentile(sorted: &[u64], p: f64) -> Duration {
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

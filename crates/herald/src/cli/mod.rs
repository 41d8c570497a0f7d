//! Operator commands for the terminal: `herald dead list|replay` and
//! `herald endpoint enable|disable` call a running Herald's API (the
//! same calls the dashboard makes), so the rules, the wake-ups and the
//! operator events are the server's, whatever the store. `copy-store`'s
//! progress and summary are drawn here; `import-svix` is `import_svix.rs`.

pub mod import_svix;

use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::{json, Value};

/// Where the server is and how to reach it.
#[derive(Debug, Clone, clap::Args)]
pub struct Target {
    /// Herald's base URL.
    #[arg(long, env = "HERALD_URL", default_value = "http://127.0.0.1:8080", value_parser = BaseUrl)]
    pub url: String,
    /// The admin token.
    #[arg(long, env = "HERALD_ADMIN_TOKEN", hide_env_values = true)]
    pub token: String,
}

/// A `--url` naming a Herald: `http(s)://host[:port]`, refused at once
/// when it is not one (`localhost:8080` failed at the request with
/// "builder error"). A parser of its own, because clap's message for a
/// plain function's error repeats the value, password and all.
#[derive(Clone)]
pub struct BaseUrl;

impl clap::builder::TypedValueParser for BaseUrl {
    type Value = String;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<String, clap::Error> {
        let name = arg.map_or_else(|| "--url".to_owned(), |a| a.get_id().to_string());
        base_url(&value.to_string_lossy()).map_err(|message| {
            clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!("--{name}: {message}\n"),
            )
            .with_cmd(cmd)
        })
    }
}

fn base_url(text: &str) -> Result<String, String> {
    let shown = crate::config::redact_url(text);
    let like = "a base URL like http://127.0.0.1:8080";
    match url::Url::parse(text) {
        Ok(url) if matches!(url.scheme(), "http" | "https") && url.host_str().is_some() => {
            Ok(text.trim_end_matches('/').to_owned())
        }
        Ok(_) => Err(format!("`{shown}` is not {like} (http or https)")),
        Err(e) => Err(format!("`{shown}` is not {like}: {e}")),
    }
}

#[derive(Debug, Clone, Default, clap::Args)]
pub struct DeadFilterArgs {
    /// Application id or uid.
    #[arg(long)]
    pub app: Option<String>,
    /// Endpoint id (or uid, with --app).
    #[arg(long)]
    pub endpoint: Option<String>,
    /// Event type name.
    #[arg(long)]
    pub event_type: Option<String>,
    /// exhausted, permanent_status or too_old.
    #[arg(long)]
    pub reason: Option<String>,
    /// Dead-lettered at or after this RFC 3339 time.
    #[arg(long)]
    pub since: Option<String>,
    /// Dead-lettered before this RFC 3339 time.
    #[arg(long)]
    pub until: Option<String>,
}

impl DeadFilterArgs {
    fn pairs(&self) -> Vec<(&'static str, String)> {
        [
            ("app_id", &self.app),
            ("endpoint_id", &self.endpoint),
            ("event_type", &self.event_type),
            ("reason", &self.reason),
            ("since", &self.since),
            ("until", &self.until),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.clone().map(|v| (k, v)))
        .collect()
    }
}

#[derive(Debug, clap::Subcommand)]
pub enum DeadCommand {
    /// List dead deliveries, newest first.
    List {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        filter: DeadFilterArgs,
        /// At most this many (1-250).
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Continue after this delivery id (printed at the end of a page).
        #[arg(long)]
        iterator: Option<String>,
    },
    /// Replay dead deliveries: the ones named, or every one matching the
    /// filters (with --all), in batches, showing progress.
    Replay {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        filter: DeadFilterArgs,
        /// Delivery ids (dlv_…) to replay.
        ids: Vec<String>,
        /// Replay every dead delivery matching the filters.
        #[arg(long)]
        all: bool,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum EndpointCommand {
    /// Enable an endpoint: its held deliveries resume (those past the age
    /// cap become dead, "too old").
    Enable {
        #[command(flatten)]
        target: Target,
        /// Application id or uid.
        app: String,
        /// Endpoint id or uid.
        endpoint: String,
    },
    /// Disable an endpoint: nothing is sent to it until it is enabled.
    Disable {
        #[command(flatten)]
        target: Target,
        /// Application id or uid.
        app: String,
        /// Endpoint id or uid.
        endpoint: String,
        /// Why it is disabled: kept with the endpoint, shown on the dashboard.
        #[arg(long)]
        reason: Option<String>,
    },
}

struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Client {
    fn new(target: &Target) -> anyhow::Result<Self> {
        Ok(Client {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()?,
            // Checked and without its trailing slash (`BaseUrl`).
            base: target.url.clone(),
            token: target.token.clone(),
        })
    }

    /// Herald could not be reached: said with `--url`'s password left out
    /// (the request error's own copy of the URL too).
    fn unreachable(&self, e: reqwest::Error) -> anyhow::Error {
        anyhow::anyhow!(
            "cannot reach Herald at {}: {}",
            crate::config::redact_url(&self.base),
            e.without_url()
        )
    }

    /// Sends a request; a non-2xx answer becomes an error quoting the
    /// server's `detail`.
    async fn call(&self, req: reqwest::RequestBuilder) -> anyhow::Result<Value> {
        let resp = req
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        let status = resp.status();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            let detail = match &body["detail"] {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            };
            bail!("Herald answered {status}: {detail}");
        }
        Ok(body)
    }

    /// The server's clock (ms), from the `Date` header of a cheap call;
    /// rounded up to the next second, as the header has no finer unit.
    async fn server_time(&self) -> anyhow::Result<i64> {
        let resp = self
            .http
            .get(self.url("/dead-letter"))
            .query(&[("limit", "1")])
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        if !resp.status().is_success() {
            bail!("Herald answered {}", resp.status());
        }
        let date = resp
            .headers()
            .get(http::header::DATE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| httpdate::parse_http_date(v).ok())
            .context("Herald's answer has no valid Date header")?;
        let secs = date
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Ok(i64::try_from(secs.saturating_add(1)).unwrap_or(i64::MAX) * 1000)
    }

    fn url(&self, path: &str) -> String {
        format!("{}/api/v1{path}", self.base)
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

pub async fn dead(command: DeadCommand) -> anyhow::Result<()> {
    match command {
        DeadCommand::List {
            target,
            filter,
            limit,
            iterator,
        } => {
            let client = Client::new(&target)?;
            let mut query = filter.pairs();
            query.push(("limit", limit.to_string()));
            if let Some(it) = iterator {
                query.push(("iterator", it));
            }
            let page = client
                .call(client.http.get(client.url("/dead-letter")).query(&query))
                .await?;
            let rows = page["data"].as_array().cloned().unwrap_or_default();
            println!(
                "{:<32} {:<32} {:<20} {:<17} {:>8} {:<12} DEAD SINCE",
                "DELIVERY", "ENDPOINT", "EVENT TYPE", "REASON", "ATTEMPTS", "LAST"
            );
            for d in &rows {
                let last = match (&d["lastStatusCode"], &d["lastError"]) {
                    (Value::Number(n), _) => format!("HTTP {n}"),
                    (_, Value::String(e)) => e.chars().take(12).collect(),
                    _ => "-".to_owned(),
                };
                println!(
                    "{:<32} {:<32} {:<20} {:<17} {:>8} {:<12} {}",
                    text(&d["id"]),
                    text(&d["endpointId"]),
                    text(&d["eventType"]),
                    text(&d["deadReason"]),
                    text(&d["attempts"]),
                    last,
                    text(&d["updatedAt"]),
                );
            }
            if page["done"] == Value::Bool(false) {
                println!("more: --iterator {}", text(&page["iterator"]));
            } else {
                println!("({} shown, no more)", rows.len());
            }
            Ok(())
        }
        DeadCommand::Replay {
            target,
            filter,
            ids,
            all,
        } => {
            if ids.is_empty() && !all {
                bail!("name delivery ids to replay, or pass --all to replay every one matching the filters");
            }
            if !ids.is_empty() && all {
                bail!("pass delivery ids or --all, not both");
            }
            let client = Client::new(&target)?;
            let mut body = serde_json::Map::new();
            for (k, v) in filter.pairs() {
                body.insert(k.to_owned(), Value::String(v));
            }
            if !ids.is_empty() {
                let mut total: u64 = 0;
                for chunk in ids.chunks(crate::api::dead::MAX_REPLAY_BATCH) {
                    let mut b = body.clone();
                    b.insert("ids".to_owned(), json!(chunk));
                    b.insert("limit".to_owned(), json!(chunk.len()));
                    let out = client
                        .call(client.http.post(client.url("/dead-letter/replay")).json(&b))
                        .await?;
                    total += out["replayed"].as_u64().unwrap_or(0);
                }
                // Ids that were not dead (or not found) are skipped.
                println!("replayed {total} of {}", ids.len());
                return Ok(());
            }
            // Only what was dead when the replay began: a delivery that
            // fails again while this runs is not replayed a second time.
            // "Began" on the server's clock (its Date header), so a skewed
            // clock here cannot keep the loop going.
            if !body.contains_key("until") {
                let began = client.server_time().await?;
                body.insert(
                    "until".to_owned(),
                    Value::String(crate::api::rfc3339(began)),
                );
            }
            let mut total: u64 = 0;
            loop {
                let out = client
                    .call(
                        client
                            .http
                            .post(client.url("/dead-letter/replay"))
                            .json(&body),
                    )
                    .await?;
                total += out["replayed"].as_u64().unwrap_or(0);
                eprintln!("replayed {total} so far…");
                if out["done"] != Value::Bool(false) {
                    break;
                }
            }
            println!("replayed {total}");
            Ok(())
        }
    }
}

#[derive(Debug, clap::Subcommand)]
pub enum TokenCommand {
    /// Create an application-scoped API token (printed once).
    Create {
        #[command(flatten)]
        target: Target,
        /// Application id or uid.
        #[arg(long)]
        app: String,
        /// A name to tell the token by in lists.
        #[arg(long)]
        name: Option<String>,
    },
    /// Revoke an application token.
    Revoke {
        #[command(flatten)]
        target: Target,
        /// Application id or uid.
        #[arg(long)]
        app: String,
        /// The token's id (tok_…).
        id: String,
    },
}

pub async fn token(command: TokenCommand) -> anyhow::Result<()> {
    match command {
        TokenCommand::Create { target, app, name } => {
            let client = Client::new(&target)?;
            let out = client
                .call(
                    client
                        .http
                        .post(client.url(&format!("/app/{app}/token")))
                        .json(&json!({ "name": name })),
                )
                .await?;
            println!("token id: {}", text(&out["id"]));
            println!(
                "token (shown only now; keep it safe): {}",
                text(&out["token"])
            );
            Ok(())
        }
        TokenCommand::Revoke { target, app, id } => {
            let client = Client::new(&target)?;
            // The server's reason on a refusal (no such application, no
            // such token), as every other command says it.
            let url = client.url(&format!("/app/{app}/token/{id}"));
            client.call(client.http.delete(url)).await?;
            println!("token {id} revoked");
            Ok(())
        }
    }
}

pub async fn endpoint(command: EndpointCommand) -> anyhow::Result<()> {
    match command {
        EndpointCommand::Enable {
            target,
            app,
            endpoint,
        } => {
            let client = Client::new(&target)?;
            let out = client
                .call(
                    client
                        .http
                        .post(client.url(&format!("/app/{app}/endpoint/{endpoint}/enable"))),
                )
                .await?;
            println!(
                "endpoint {} enabled; {} held deliveries were past the age cap and are now dead (too_old)",
                text(&out["endpoint"]["id"]),
                text(&out["expiredDeliveries"])
            );
            Ok(())
        }
        EndpointCommand::Disable {
            target,
            app,
            endpoint,
            reason,
        } => {
            let client = Client::new(&target)?;
            let body = match reason {
                Some(r) => json!({ "reason": r }),
                None => json!({}),
            };
            let out = client
                .call(
                    client
                        .http
                        .post(client.url(&format!("/app/{app}/endpoint/{endpoint}/disable")))
                        .json(&body),
                )
                .await?;
            println!("endpoint {} disabled", text(&out["id"]));
            Ok(())
        }
    }
}

/// `herald copy-store`: its options, beside `--config`.
#[derive(Debug, Clone, clap::Args)]
pub struct CopyStoreArgs {
    /// The store to copy into: sqlite://PATH or postgres://… (a password
    /// is better given in PGPASSWORD than on the command line). It must
    /// be empty, or hold an interrupted copy with --resume.
    #[arg(long, value_name = "URL")]
    pub to: String,
    /// The target's PostgreSQL schema (default: HERALD_DATABASE_SCHEMA).
    #[arg(long, value_name = "NAME")]
    pub to_schema: Option<String>,
    /// A file holding the HERALD_ENCRYPTION_KEY the target will be served
    /// with; endpoint secrets are sealed with it (default: the source's).
    #[arg(long, value_name = "PATH")]
    pub to_encryption_key_file: Option<std::path::PathBuf>,
    /// Continue a copy that was interrupted, after the last page it wrote.
    #[arg(long)]
    pub resume: bool,
    /// Rows read and written at a time.
    #[arg(long, default_value_t = crate::server::copy_store::PAGE_ROWS, hide = true)]
    pub page_rows: usize,
}

/// Copies the configured store into `--to`, drawing a progress bar per
/// table on a terminal (a line per table elsewhere), then prints each
/// table's rows on both sides; an error when any differ.
pub async fn copy_store(config: &crate::config::Config, args: CopyStoreArgs) -> anyhow::Result<()> {
    use crate::server::copy_store::{copy_store, CopyStoreOptions};
    let to_keys = match &args.to_encryption_key_file {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| {
                format!("--to-encryption-key-file: cannot read {}", path.display())
            })?;
            Some(std::sync::Arc::new(
                crate::crypto::Keyring::parse(&text)
                    .map_err(|e| anyhow::anyhow!("--to-encryption-key-file: {e}"))?,
            ))
        }
        None => None,
    };
    let options = CopyStoreOptions {
        to: args.to.clone(),
        to_schema: args.to_schema.clone(),
        to_keys,
        resume: args.resume,
        page_rows: args.page_rows,
    };
    let bars = Bars::default();
    let report = copy_store(config, options, &bars).await?;
    println!(
        "copied {} rows in {:.1} s into {}",
        report.rows_copied(),
        report.elapsed.as_secs_f64(),
        crate::config::redact_url(&args.to)
    );
    println!("{:<18} {:>12} {:>12}", "table", "source", "target");
    for t in &report.tables {
        let mark = if t.source == t.target {
            ""
        } else {
            "  DIFFERS"
        };
        println!("{:<18} {:>12} {:>12}{mark}", t.table, t.source, t.target);
    }
    println!(
        "kept delivery counts: {} (endpoint, state) rows, {}; throttle slots: {}",
        report.kept_counts,
        if report.kept_counts_equal {
            "equal"
        } else {
            "DIFFER"
        },
        report.throttle_slots
    );
    if !report.complete() {
        bail!(
            "the target's rows differ from the source's (above): the copy is not complete; \
             the target keeps its progress, so run again with --resume once the cause is fixed"
        );
    }
    Ok(())
}

/// Progress of a copy: indicatif's bar on a terminal; a line per table
/// when stderr is not one (logs, CI).
#[derive(Default)]
struct Bars {
    current: std::sync::Mutex<Option<(indicatif::ProgressBar, std::time::Instant)>>,
}

impl crate::server::copy_store::CopyProgress for Bars {
    fn table_started(&self, table: &'static str, rows: u64, already: u64) {
        let bar = indicatif::ProgressBar::new(rows);
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{prefix:>18} [{bar:30}] {pos}/{len} rows, {per_sec}, ETA {eta}",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix(table);
        bar.set_position(already);
        bar.reset_eta();
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((bar, std::time::Instant::now()));
    }

    fn page_copied(&self, _table: &'static str, rows: u64) {
        if let Some((bar, _)) = &*self.current.lock().unwrap_or_else(|p| p.into_inner()) {
            bar.inc(rows);
        }
    }

    fn table_done(&self, table: &'static str) {
        if let Some((bar, started)) = self
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            bar.finish();
            if bar.is_hidden() {
                let secs = started.elapsed().as_secs_f64();
                eprintln!(
                    "{table}: {} rows in {secs:.1} s ({:.0} rows/s)",
                    bar.position(),
                    bar.position() as f64 / secs.max(0.001)
                );
            }
        }
    }
}

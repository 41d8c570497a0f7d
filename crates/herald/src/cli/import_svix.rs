//! `herald import-svix --url URL --token TOKEN`: event types, applications
//! and their endpoints (with headers and signing secrets) copied from any
//! server that speaks Svix's API v1 into the configured Herald store.
//!
//! Both sides are spoken to through the API: the source at `--url`, and
//! Herald through an API of its own started on a loopback port over the
//! configured store (with a one-off admin token), so that every object is
//! checked, stored and audited exactly as a client's request would be.
//! Event types are matched by name; applications and endpoints by their
//! source id, which Herald keeps in its settings
//! (`import-svix:<source>:<kind>:<id>` → Herald's id; not a uid, which
//! may not look like an id), then by uid: a second run finds every
//! object, even one whose uid changed, updates what changed and
//! duplicates nothing.
//! Messages and attempts are not copied: the source keeps delivering what
//! it accepted until the producer is pointed at Herald.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use reqwest::Method;
use serde_json::{json, Map, Value};

use crate::config::{redact_url, Config};
use crate::store::Store;

/// Objects per page asked of the source (Svix's limit is 250).
const PAGE: usize = 250;

#[derive(Debug, Clone, clap::Args)]
pub struct ImportSvixArgs {
    /// The source's base URL (e.g. https://api.eu.svix.com, or another
    /// Herald's http://host:8080); `/api/v1/…` is appended.
    #[arg(long, value_name = "URL")]
    pub url: String,
    /// The source's API token (better given in SVIX_TOKEN than on the
    /// command line).
    #[arg(long, env = "SVIX_TOKEN", hide_env_values = true)]
    pub token: String,
    /// Print what would be created and updated; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Only this application (uid or source id); repeatable. Event types
    /// are imported either way.
    #[arg(long = "app", value_name = "UID")]
    pub apps: Vec<String>,
}

/// What happened to one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Created,
    Updated,
    Unchanged,
    Failed,
}

#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    created: u64,
    updated: u64,
    unchanged: u64,
    failed: u64,
}

impl Tally {
    fn add(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Created => self.created += 1,
            Outcome::Updated => self.updated += 1,
            Outcome::Unchanged => self.unchanged += 1,
            Outcome::Failed => self.failed += 1,
        }
    }
}

/// The import's result, kind by kind.
#[derive(Debug, Default)]
pub struct ImportReport {
    event_types: Tally,
    applications: Tally,
    endpoints: Tally,
    /// Header names whose values the source would not show, per endpoint.
    headers_not_copied: Vec<(String, Vec<String>)>,
    /// Source objects left out on purpose, with why.
    skipped: Vec<String>,
    failures: Vec<String>,
    dry_run: bool,
}

impl ImportReport {
    pub fn failed(&self) -> bool {
        self.event_types.failed + self.applications.failed + self.endpoints.failed > 0
    }
}

impl fmt::Display for ImportReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (created, updated) = if self.dry_run {
            ("would create", "would update")
        } else {
            ("created", "updated")
        };
        writeln!(
            f,
            "{:<14} {:>12} {:>12} {:>10} {:>7}",
            "kind", created, updated, "unchanged", "failed"
        )?;
        for (kind, t) in [
            ("event types", self.event_types),
            ("applications", self.applications),
            ("endpoints", self.endpoints),
        ] {
            writeln!(
                f,
                "{kind:<14} {:>12} {:>12} {:>10} {:>7}",
                t.created, t.updated, t.unchanged, t.failed
            )?;
        }
        for (endpoint, names) in &self.headers_not_copied {
            writeln!(
                f,
                "headers not copied (the source hides their values): {endpoint}: {}",
                names.join(", ")
            )?;
        }
        for skipped in &self.skipped {
            writeln!(f, "skipped: {skipped}")?;
        }
        for failure in &self.failures {
            writeln!(f, "failed: {failure}")?;
        }
        write!(
            f,
            "messages and attempts are not copied: the source keeps delivering what it \
             accepted until the producer sends to Herald"
        )
    }
}

/// An API answered with an error, or not with JSON.
#[derive(Debug)]
struct CallError(String);

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CallError {}

/// How often a read the source answers 429 is asked again.
const RATE_LIMITED_RETRIES: u32 = 5;

/// One side: a base URL and a token.
struct Api {
    client: reqwest::Client,
    base: String,
    token: String,
    /// For errors: "the source" or "Herald".
    name: &'static str,
}

impl Api {
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Option<Value>, CallError> {
        let url = format!("{}/api/v1{path}", self.base);
        let mut waited = 0;
        let response = loop {
            let mut request = self
                .client
                .request(method.clone(), &url)
                .bearer_auth(&self.token);
            if let Some(body) = body {
                request = request.json(body);
            }
            let response = request.send().await.map_err(|e| {
                CallError(format!(
                    "{} could not be reached ({method} {path}): {e}",
                    self.name
                ))
            })?;
            // Over a source's rate limit (Svix's API has one): a read is
            // asked again after the `Retry-After` it names, a few times.
            if response.status() == reqwest::StatusCode::TOO_MANY_REQUESTS
                && method == Method::GET
                && waited < RATE_LIMITED_RETRIES
            {
                let wait = response
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .unwrap_or(1)
                    .clamp(1, 60);
                tokio::time::sleep(Duration::from_secs(wait)).await;
                waited += 1;
                continue;
            }
            break response;
        };
        let status = response.status();
        let text = response.text().await.map_err(|e| {
            CallError(format!(
                "{} ({method} {path}): reading the answer: {e}",
                self.name
            ))
        })?;
        if status == reqwest::StatusCode::NOT_FOUND && method == Method::GET {
            return Ok(None);
        }
        if !status.is_success() {
            let detail: String = text.chars().take(300).collect();
            let hint = if status == reqwest::StatusCode::UNAUTHORIZED
                || status == reqwest::StatusCode::FORBIDDEN
            {
                " (check the token)"
            } else {
                ""
            };
            return Err(CallError(format!(
                "{} answered {status} to {method} {path}{hint}: {detail}",
                self.name
            )));
        }
        if text.trim().is_empty() {
            return Ok(Some(Value::Null));
        }
        serde_json::from_str(&text).map(Some).map_err(|_| {
            CallError(format!(
                "{} answered {method} {path} with something that is not JSON: is this Svix's API v1?",
                self.name
            ))
        })
    }

    async fn get(&self, path: &str) -> Result<Option<Value>, CallError> {
        self.call(Method::GET, path, None).await
    }

    /// Every object of a list, following `iterator` until `done`.
    async fn list(&self, path: &str) -> Result<Vec<Value>, CallError> {
        let mut all = Vec::new();
        let mut iterator: Option<String> = None;
        let join = if path.contains('?') { '&' } else { '?' };
        // Bounded: a source that never says done is cut off.
        for _ in 0..100_000 {
            let mut page_path = format!("{path}{join}limit={PAGE}");
            if let Some(it) = &iterator {
                page_path.push_str("&iterator=");
                page_path.push_str(&urlencode(it));
            }
            let page = self
                .get(&page_path)
                .await?
                .ok_or_else(|| CallError(format!("{} has no {path} (404)", self.name)))?;
            let data = page.get("data").and_then(Value::as_array).ok_or_else(|| {
                CallError(format!(
                    "{} answered {path} without a `data` list",
                    self.name
                ))
            })?;
            all.extend(data.iter().cloned());
            let done = page.get("done").and_then(Value::as_bool).unwrap_or(true);
            let next = page
                .get("iterator")
                .and_then(Value::as_str)
                .map(str::to_owned);
            match next {
                Some(next) if !done && Some(&next) != iterator.as_ref() && !data.is_empty() => {
                    iterator = Some(next);
                }
                _ => return Ok(all),
            }
        }
        Err(CallError(format!(
            "{} never finished listing {path}",
            self.name
        )))
    }
}

fn urlencode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// What decides an object's outcome, printed as it goes.
struct Run<'a> {
    source: Api,
    herald: Api,
    store: Arc<dyn Store>,
    /// The source as the mapping keys name it (no credentials, no slash).
    source_key: String,
    dry_run: bool,
    report: ImportReport,
    progress: &'a indicatif::ProgressBar,
}

/// `herald import-svix`: see the module's comment. The report's summary is
/// printed by the caller; an error here is one that stopped the run
/// (the source unreachable or not speaking the API, Herald not starting).
pub async fn import_svix(config: &Config, args: &ImportSvixArgs) -> anyhow::Result<ImportReport> {
    let base = args.url.trim_end_matches('/').to_owned();
    let parsed = url::Url::parse(&base)
        .with_context(|| format!("--url: `{}` is not a URL", redact_url(&base)))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        bail!("--url: `{}` is not an http(s) URL", redact_url(&base));
    }
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .context("building the HTTP client")?;
    let source = Api {
        client: client.clone(),
        base: base.clone(),
        token: args.token.clone(),
        name: "the source",
    };
    // The source first: a wrong URL or token ends the run before Herald
    // is touched.
    source.get("/app?limit=1").await?.ok_or_else(|| {
        anyhow::anyhow!("the source has no /api/v1/app (404): is --url the base URL of Svix's API?")
    })?;

    // The import's own API on the store: its token passes with it (the
    // store's admin token stays as it is), plain HTTP on loopback whatever
    // the listener is configured with, and no rate limit on itself.
    let token = format!("import_{}", crate::api::auth::random_hex(24));
    let mut herald_config = config.clone();
    herald_config.security.admin_token = Some(token.clone());
    herald_config.security.admin_token_kept = false;
    herald_config.security.api_rate_limit = 0;
    herald_config.listener.tls = None;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("opening a loopback port for Herald's API")?;
    let running = crate::server::start(herald_config, Some(listener), crate::server::Role::Api)
        .await
        .context("starting Herald's API on the configured store")?;
    let addr = running.addr.context("Herald's API has no address")?;
    let herald = Api {
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .no_proxy()
            .build()
            .context("building the HTTP client")?,
        base: format!("http://{addr}"),
        token,
        name: "Herald",
    };
    let progress = indicatif::ProgressBar::new_spinner();
    progress.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    progress.enable_steady_tick(Duration::from_millis(200));
    let mut run = Run {
        source,
        herald,
        store: running.store.clone(),
        source_key: format!(
            "{}://{}{}",
            parsed.scheme(),
            parsed.host_str().unwrap_or_default(),
            parsed.port().map(|p| format!(":{p}")).unwrap_or_default()
        ) + parsed.path().trim_end_matches('/'),
        dry_run: args.dry_run,
        report: ImportReport {
            dry_run: args.dry_run,
            ..ImportReport::default()
        },
        progress: &progress,
    };
    let outcome = run.everything(&args.apps).await;
    progress.finish_and_clear();
    running.shutdown().await?;
    outcome?;
    Ok(run.report)
}

impl Run<'_> {
    async fn everything(&mut self, only: &[String]) -> anyhow::Result<()> {
        let types = self
            .source
            .list("/event-type?with_content=true&include_archived=true")
            .await?;
        for t in &types {
            let name = t
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_owned();
            let outcome = self.event_type(t).await;
            self.record(Kind::EventType, &format!("event type {name}"), outcome);
        }
        let apps = self.source.list("/app").await?;
        // `--app` names an application by uid or source id.
        let named = |a: &Value, o: &str| {
            a.get("uid").and_then(Value::as_str) == Some(o)
                || a.get("id").and_then(Value::as_str) == Some(o)
        };
        let mut wanted: Vec<&Value> = apps
            .iter()
            .filter(|a| only.is_empty() || only.iter().any(|o| named(a, o)))
            .collect();
        for o in only {
            if !apps.iter().any(|a| named(a, o)) {
                self.report.applications.add(Outcome::Failed);
                self.report.failures.push(format!(
                    "application {o}: the source has none by that uid or id"
                ));
            }
        }
        // Another Herald's own applications (its operator events') have a
        // uid this Herald refuses: this one keeps its own, made at start.
        wanted.retain(|a| {
            let reserved = str_field(a, "uid")
                .is_some_and(|uid| uid.starts_with(crate::operator::RESERVED_UID_PREFIX));
            if reserved {
                self.report.skipped.push(format!(
                    "{}: the source Herald's own application (its operator events); \
                     this Herald keeps its own",
                    label_of("application", a)
                ));
            }
            !reserved
        });
        wanted.sort_by_key(|a| a.get("id").and_then(Value::as_str).map(str::to_owned));
        for app in wanted {
            let label = label_of("application", app);
            match self.application(app).await {
                Ok((outcome, herald_id)) => {
                    self.record(Kind::Application, &label, Ok(outcome));
                    self.endpoints_of(app, herald_id.as_deref(), &label).await;
                }
                Err(e) => self.record(Kind::Application, &label, Err(e)),
            }
        }
        Ok(())
    }

    fn record(&mut self, kind: Kind, label: &str, outcome: Result<Outcome, CallError>) {
        let tally = match kind {
            Kind::EventType => &mut self.report.event_types,
            Kind::Application => &mut self.report.applications,
            Kind::Endpoint => &mut self.report.endpoints,
        };
        match outcome {
            Ok(o) => {
                tally.add(o);
                if self.dry_run && matches!(o, Outcome::Created | Outcome::Updated) {
                    let verb = if o == Outcome::Created {
                        "would create"
                    } else {
                        "would update"
                    };
                    self.progress.println(format!("{verb} {label}"));
                }
            }
            Err(e) => {
                tally.add(Outcome::Failed);
                self.report.failures.push(format!("{label}: {e}"));
            }
        }
        let r = &self.report;
        self.progress.set_message(format!(
            "event types {}, applications {}, endpoints {}",
            done(&r.event_types),
            done(&r.applications),
            done(&r.endpoints)
        ));
    }

    async fn event_type(&mut self, t: &Value) -> Result<Outcome, CallError> {
        let name =
            str_field(t, "name").ok_or_else(|| CallError("the source gave no name".into()))?;
        let mut wanted = Map::new();
        wanted.insert(
            "description".into(),
            json!(str_field(t, "description").unwrap_or_default()),
        );
        for key in ["archived", "deprecated"] {
            wanted.insert(
                key.into(),
                json!(t.get(key).and_then(Value::as_bool).unwrap_or(false)),
            );
        }
        for key in ["schemas", "featureFlag", "featureFlags", "groupName"] {
            if let Some(v) = t.get(key).filter(|v| !v.is_null()) {
                wanted.insert(key.into(), v.clone());
            }
        }
        let path = format!("/event-type/{}", urlencode(&name));
        match self.herald.get(&path).await? {
            None => {
                let mut body = wanted;
                body.insert("name".into(), json!(name));
                self.change(Method::POST, "/event-type", Value::Object(body))
                    .await?;
                Ok(Outcome::Created)
            }
            Some(have) if same(&have, &wanted) => Ok(Outcome::Unchanged),
            Some(_) => {
                self.change(Method::PUT, &path, Value::Object(wanted))
                    .await?;
                Ok(Outcome::Updated)
            }
        }
    }

    /// A write to Herald, skipped in a dry run.
    async fn change(&self, method: Method, path: &str, body: Value) -> Result<(), CallError> {
        if !self.dry_run {
            self.herald.call(method, path, Some(&body)).await?;
        }
        Ok(())
    }

    fn mapping_key(&self, kind: &str, source_id: &str) -> String {
        format!("import-svix:{}:{kind}:{source_id}", self.source_key)
    }

    /// The Herald object a source object without uid was imported as.
    async fn mapped(&self, kind: &str, source_id: &str) -> Result<Option<String>, CallError> {
        self.store
            .get_setting(&self.mapping_key(kind, source_id))
            .await
            .map_err(|e| CallError(format!("reading the import mapping: {e}")))
    }

    async fn remember(
        &self,
        kind: &str,
        source_id: &str,
        herald_id: &str,
    ) -> Result<(), CallError> {
        self.store
            .put_setting(&self.mapping_key(kind, source_id), herald_id)
            .await
            .map_err(|e| {
                CallError(format!(
                    "{herald_id} was imported, but recording its source id failed: {e}"
                ))
            })
    }

    /// The application's outcome and its Herald id (none in a dry run
    /// that would create it).
    async fn application(&mut self, app: &Value) -> Result<(Outcome, Option<String>), CallError> {
        let source_id =
            str_field(app, "id").ok_or_else(|| CallError("the source gave no id".into()))?;
        let uid = str_field(app, "uid");
        let mut wanted = Map::new();
        wanted.insert(
            "name".into(),
            json!(str_field(app, "name").unwrap_or_else(|| source_id.clone())),
        );
        wanted.insert(
            "metadata".into(),
            app.get("metadata")
                .cloned()
                .filter(Value::is_object)
                .unwrap_or_else(|| json!({})),
        );
        wanted.insert("rateLimit".into(), rate_of(app));
        wanted.insert("uid".into(), uid.clone().map_or(Value::Null, Value::from));
        // By the source id first (a uid may have changed), then by uid.
        let mut existing = match self.mapped("app", &source_id).await? {
            Some(id) => self.herald.get(&format!("/app/{}", urlencode(&id))).await?,
            None => None,
        };
        if let (None, Some(uid)) = (&existing, &uid) {
            existing = self.herald.get(&format!("/app/{}", urlencode(uid))).await?;
        }
        match existing {
            None => {
                if self.dry_run {
                    return Ok((Outcome::Created, None));
                }
                let made = self
                    .herald
                    .call(Method::POST, "/app", Some(&Value::Object(wanted)))
                    .await?
                    .unwrap_or_default();
                let id = str_field(&made, "id")
                    .ok_or_else(|| CallError("Herald answered without an id".into()))?;
                self.remember("app", &source_id, &id).await?;
                Ok((Outcome::Created, Some(id)))
            }
            Some(have) => {
                let id = str_field(&have, "id")
                    .ok_or_else(|| CallError("Herald answered without an id".into()))?;
                if !self.dry_run {
                    self.remember("app", &source_id, &id).await?;
                }
                if same(&have, &wanted) {
                    return Ok((Outcome::Unchanged, Some(id)));
                }
                self.change(Method::PUT, &format!("/app/{id}"), Value::Object(wanted))
                    .await?;
                Ok((Outcome::Updated, Some(id)))
            }
        }
    }

    /// The endpoints of `app`, into Herald's application `herald_app`
    /// (`None`: a dry run's application that does not exist yet, whose
    /// endpoints would all be created).
    async fn endpoints_of(&mut self, app: &Value, herald_app: Option<&str>, app_label: &str) {
        let source_app = str_field(app, "id").unwrap_or_default();
        let endpoints = match self
            .source
            .list(&format!("/app/{}/endpoint", urlencode(&source_app)))
            .await
        {
            Ok(list) => list,
            Err(e) => {
                self.report.endpoints.add(Outcome::Failed);
                self.report
                    .failures
                    .push(format!("endpoints of {app_label}: {e}"));
                return;
            }
        };
        for ep in &endpoints {
            let label = format!("{app_label}, {}", label_of("endpoint", ep));
            let outcome = match herald_app {
                Some(herald_app) => self.endpoint(&source_app, herald_app, ep, &label).await,
                None => Ok(Outcome::Created),
            };
            self.record(Kind::Endpoint, &label, outcome);
        }
    }

    async fn endpoint(
        &mut self,
        source_app: &str,
        herald_app: &str,
        ep: &Value,
        label: &str,
    ) -> Result<Outcome, CallError> {
        let source_id =
            str_field(ep, "id").ok_or_else(|| CallError("the source gave no id".into()))?;
        let source_path = format!(
            "/app/{}/endpoint/{}",
            urlencode(source_app),
            urlencode(&source_id)
        );
        let secret = self
            .source
            .get(&format!("{source_path}/secret"))
            .await?
            .and_then(|s| str_field(&s, "key"))
            .ok_or_else(|| CallError("the source did not give its signing secret".into()))?;
        let headers_answer = self
            .source
            .get(&format!("{source_path}/headers"))
            .await?
            .unwrap_or_default();
        let (headers, hidden) = copyable_headers(&headers_answer);
        if !hidden.is_empty() {
            self.report
                .headers_not_copied
                .push((label.to_owned(), hidden.clone()));
        }
        let uid = str_field(ep, "uid");
        let mut wanted = Map::new();
        wanted.insert(
            "url".into(),
            json!(str_field(ep, "url").unwrap_or_default()),
        );
        wanted.insert(
            "description".into(),
            json!(str_field(ep, "description").unwrap_or_default()),
        );
        let filter = ep
            .get("filterTypes")
            .or_else(|| ep.get("eventTypes"))
            .cloned()
            .filter(|v| v.as_array().is_some_and(|a| !a.is_empty()))
            .unwrap_or(Value::Null);
        wanted.insert("filterTypes".into(), filter);
        wanted.insert(
            "channels".into(),
            ep.get("channels")
                .cloned()
                .filter(|v| v.as_array().is_some_and(|a| !a.is_empty()))
                .unwrap_or(Value::Null),
        );
        wanted.insert(
            "disabled".into(),
            json!(ep.get("disabled").and_then(Value::as_bool).unwrap_or(false)),
        );
        wanted.insert("rateLimit".into(), rate_of(ep));
        wanted.insert(
            "metadata".into(),
            ep.get("metadata")
                .cloned()
                .filter(Value::is_object)
                .unwrap_or_else(|| json!({})),
        );

        let app_path = format!("/app/{}", urlencode(herald_app));
        wanted.insert("uid".into(), uid.clone().map_or(Value::Null, Value::from));
        // By the source id first (a uid may have changed), then by uid.
        let mut existing = match self.mapped("endpoint", &source_id).await? {
            Some(id) => {
                self.herald
                    .get(&format!("{app_path}/endpoint/{}", urlencode(&id)))
                    .await?
            }
            None => None,
        };
        if let (None, Some(uid)) = (&existing, &uid) {
            existing = self
                .herald
                .get(&format!("{app_path}/endpoint/{}", urlencode(uid)))
                .await?;
        }
        let Some(have) = existing else {
            if self.dry_run {
                return Ok(Outcome::Created);
            }
            let mut body = wanted.clone();
            body.insert("secret".into(), json!(secret));
            if !headers.is_empty() {
                body.insert("headers".into(), json!(headers));
            }
            let made = self
                .herald
                .call(
                    Method::POST,
                    &format!("{app_path}/endpoint"),
                    Some(&Value::Object(body)),
                )
                .await?
                .unwrap_or_default();
            let id = str_field(&made, "id")
                .ok_or_else(|| CallError("Herald answered without an id".into()))?;
            self.remember("endpoint", &source_id, &id).await?;
            return Ok(Outcome::Created);
        };
        let id = str_field(&have, "id")
            .ok_or_else(|| CallError("Herald answered without an id".into()))?;
        if !self.dry_run {
            self.remember("endpoint", &source_id, &id).await?;
        }
        let path = format!("{app_path}/endpoint/{}", urlencode(&id));
        let mut changed = false;
        if !same(&have, &wanted) {
            changed = true;
            let mut body = wanted;
            // Herald's own, unknown to Svix: the PUT would reset it.
            if let Some(ordering) = have.get("ordering") {
                body.insert("ordering".into(), ordering.clone());
            }
            self.change(Method::PUT, &path, Value::Object(body)).await?;
        }
        // Herald's headers as stored: its API hides sensitive values too.
        let stored = match (
            crate::ids::AppId::parse(herald_app),
            crate::ids::EndpointId::parse(&id),
        ) {
            (Some(app), Some(_)) => self
                .store
                .get_endpoint(&app, &id)
                .await
                .map_err(|e| CallError(format!("reading Herald's endpoint: {e}")))?
                .map(|e| e.headers)
                .unwrap_or_default(),
            _ => BTreeMap::new(),
        };
        let mut merged = headers.clone();
        // A header whose value the source hides keeps Herald's value.
        for name in &hidden {
            if let Some((k, v)) = stored.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)) {
                merged.insert(k.clone(), v.clone());
            }
        }
        if merged != stored {
            changed = true;
            self.change(
                Method::PUT,
                &format!("{path}/headers"),
                json!({ "headers": merged }),
            )
            .await?;
        }
        let herald_secret = self
            .herald
            .get(&format!("{path}/secret"))
            .await?
            .and_then(|s| str_field(&s, "key"));
        if herald_secret.as_deref() != Some(secret.as_str()) {
            changed = true;
            self.change(
                Method::POST,
                &format!("{path}/secret/rotate"),
                json!({ "key": secret }),
            )
            .await?;
        }
        Ok(if changed {
            Outcome::Updated
        } else {
            Outcome::Unchanged
        })
    }
}

#[derive(Clone, Copy)]
enum Kind {
    EventType,
    Application,
    Endpoint,
}

fn done(t: &Tally) -> u64 {
    t.created + t.updated + t.unchanged + t.failed
}

fn str_field(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::to_owned)
}

/// "application shop (app_…)": its uid when it has one, and its source id.
fn label_of(kind: &str, v: &Value) -> String {
    let id = str_field(v, "id").unwrap_or_else(|| "?".into());
    match str_field(v, "uid") {
        Some(uid) => format!("{kind} {uid} ({id})"),
        None => format!("{kind} {id}"),
    }
}

/// Svix's `rateLimit`, or its newer `throttleRate`; `null` when neither.
fn rate_of(v: &Value) -> Value {
    v.get("throttleRate")
        .filter(|r| !r.is_null())
        .or_else(|| v.get("rateLimit"))
        .cloned()
        .unwrap_or(Value::Null)
}

/// Whether `have` (Herald's answer) already holds every field of `wanted`.
fn same(have: &Value, wanted: &Map<String, Value>) -> bool {
    wanted.iter().all(|(k, want)| {
        let got = have.get(k).unwrap_or(&Value::Null);
        match (k.as_str(), got, want) {
            // Lists compared as sets: order carries no meaning here.
            ("filterTypes" | "channels", Value::Array(a), Value::Array(b)) => {
                let mut a: Vec<String> = a.iter().map(Value::to_string).collect();
                let mut b: Vec<String> = b.iter().map(Value::to_string).collect();
                a.sort();
                b.sort();
                a == b
            }
            _ => got == want,
        }
    })
}

/// The headers whose values the answer shows, and the names of those it
/// hides (Svix's `sensitive`).
fn copyable_headers(answer: &Value) -> (BTreeMap<String, String>, Vec<String>) {
    let hidden: Vec<String> = answer
        .get("sensitive")
        .and_then(Value::as_array)
        .map(|names| {
            names
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let headers = answer
        .get("headers")
        .and_then(Value::as_object)
        .map(|h| {
            h.iter()
                .filter(|(k, _)| !hidden.iter().any(|s| s.eq_ignore_ascii_case(k)))
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
                .collect()
        })
        .unwrap_or_default();
    (headers, hidden)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_headers_are_named_not_copied() {
        let (headers, hidden) = copyable_headers(&json!({
            "headers": {"X-Tenant": "t-1", "Authorization": ""},
            "sensitive": ["authorization"]
        }));
        assert_eq!(headers.len(), 1);
        assert_eq!(headers["X-Tenant"], "t-1");
        assert_eq!(hidden, ["authorization"]);
    }

    #[test]
    fn lists_compare_as_sets_and_missing_fields_as_null() {
        let have = json!({"filterTypes": ["b", "a"], "channels": null, "disabled": false});
        let mut wanted = Map::new();
        wanted.insert("filterTypes".into(), json!(["a", "b"]));
        wanted.insert("channels".into(), Value::Null);
        wanted.insert("rateLimit".into(), Value::Null);
        assert!(same(&have, &wanted));
        wanted.insert("disabled".into(), json!(true));
        assert!(!same(&have, &wanted));
    }

    #[test]
    fn the_newer_rate_name_wins() {
        assert_eq!(
            rate_of(&json!({"throttleRate": 5, "rateLimit": 9})),
            json!(5)
        );
        assert_eq!(
            rate_of(&json!({"throttleRate": null, "rateLimit": 9})),
            json!(9)
        );
        assert_eq!(rate_of(&json!({})), Value::Null);
    }
}

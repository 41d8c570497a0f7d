//! Prometheus metrics, served as text at `GET /metrics`.
//!
//! Every metric Herald exports is listed here, and nowhere else:
//!
//! | name | type | labels | what |
//! |---|---|---|---|
//! | `herald_attempts_total` | counter | `endpoint`, `outcome` | finished attempts; `outcome` is `success`, `retry` or `dead` (the state the policy chose) |
//! | `herald_attempt_duration_seconds` | histogram | `endpoint` | time of one attempt: connect, send, response headers, excerpt |
//! | `herald_messages_ingested_total` | counter | | messages accepted by the API (committed, answered 202) |
//! | `herald_dispatch_claims_total` | counter | `found` | claims the dispatcher's loop made; `found` is `work` or `none` (nothing was due: wasted store work, which should stay near one per poll interval) |
//! | `herald_dispatch_released_total` | counter | `reason` | claimed deliveries given back unsent (pending, due now, no attempt spent): `lease` (too little of the lease was left to cover a whole request when the endpoint's gate let it through), `disabled` (the endpoint was disabled or answered 410 while it waited), `circuit` (its circuit breaker opened while it waited, or it is half-open and this was not the probe), `late` (a throttled delivery more than 10 ms past its send slot: it gets a new slot), `shutdown` |
//! | `herald_completions_unrecorded_total` | counter | | finished attempts whose outcome could not be written (the store unreachable for a lease, or at shutdown; or refusing the row even without its response text): each is logged at error level with its delivery id, and the delivery stays as it was until its lease ends |
//! | `herald_deliveries` | gauge | `state` | deliveries `pending`, `delivering` or `dead` in the store |
//! | `herald_due_backlog` | gauge | | pending deliveries due now for enabled endpoints (busy ones included; held deliveries are not counted), counted up to `DUE_COUNT_CAP` (10,000; that value means "at least") |
//! | `herald_oldest_due_age_seconds` | gauge | | how long the oldest due delivery (not held) has been waiting; 0 when none is due |
//! | `herald_deliveries_held` | gauge | | pending deliveries held for disabled endpoints: they wait for the endpoint's enabling, not for a slot |
//! | `herald_endpoints_disabled` | gauge | | endpoints currently disabled |
//! | `herald_endpoint_circuit_open` | gauge | `endpoint` | 1 while the endpoint's circuit breaker is open or half-open, as this process's dispatcher sees it (refreshed every 250 ms); `endpoint="other"` counts those past the label bound |
//! | `herald_endpoint_circuit_openings_total` | counter | | circuit breakers this process's completer opened (closed → open, and half-open → open after a failed probe) |
//! | `herald_throttle_paced_total` | counter | | sends to a throttled endpoint that would have left more than 10 ms after their send slot (a loaded host, a busy gate) and went back unsent for a new slot, so that no second holds more than `throttleRate` + 1 (see the throttle in README) |
//! | `herald_backup_last_success_timestamp_seconds` | gauge | | when the last scheduled backup of the SQLite store succeeded (Unix seconds; absent until one has) |
//! | `herald_backup_failures_total` | counter | | scheduled backups that failed (each logged at warn level; delivery goes on) |
//! | `herald_throttle_waiting` | gauge | `endpoint` | per endpoint with a `throttleRate`: pending deliveries a claim found waiting for a send slot (the first [`MAX_THROTTLE_LABELS`] such endpoints by id; the rest summed under `endpoint="other"`) |
//!
//! The counters and the histogram are per process (they restart at zero);
//! the gauges describe the whole store, so with several processes on one
//! PostgreSQL database every process reports the same gauge values.
//!
//! **Label cardinality is bounded.** An `endpoint` label value is the
//! endpoint's id for the first `HERALD_METRICS_MAX_ENDPOINTS` endpoints that
//! have an attempt in this process; every later endpoint is counted under
//! `endpoint="other"`. An id once given its own label keeps it until the
//! process restarts (also if the endpoint is deleted), so a series never
//! moves between labels.
//!
//! Only processes that serve HTTP install the recorder (the first
//! [`Exporter`]): a `--role worker` has nowhere to serve `/metrics` from and
//! nothing to run the recorder's upkeep, so its `metrics` calls stay no-ops
//! rather than keeping samples nobody reads.
//!
//! The recorder is installed once per process, on first use: the `metrics`
//! facade has one global recorder, and tests start many Herald instances in
//! one process. The queue gauges are therefore global too: each instance's
//! background loop refreshes them every [`REFRESH_EVERY`], and a scrape
//! reads its own instance's store again unless it already did within
//! [`SCRAPE_FRESH`] (see [`Exporter::render`]).

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio_util::sync::CancellationToken;

use crate::ids::EndpointId;
use crate::store::{
    now_millis, Millis, NextState, QueueStats, Store, StoreResult, ThrottleWaiting,
};

pub const ATTEMPTS: &str = "herald_attempts_total";
pub const ATTEMPT_DURATION: &str = "herald_attempt_duration_seconds";
pub const MESSAGES_INGESTED: &str = "herald_messages_ingested_total";
pub const THROTTLE_PACED: &str = "herald_throttle_paced_total";
pub const BACKUP_LAST_SUCCESS: &str = "herald_backup_last_success_timestamp_seconds";
pub const BACKUP_FAILURES: &str = "herald_backup_failures_total";
pub const CLAIMS: &str = "herald_dispatch_claims_total";
pub const RELEASED: &str = "herald_dispatch_released_total";
pub const COMPLETIONS_UNRECORDED: &str = "herald_completions_unrecorded_total";
pub const DELIVERIES: &str = "herald_deliveries";
pub const DUE_BACKLOG: &str = "herald_due_backlog";
pub const OLDEST_DUE_AGE: &str = "herald_oldest_due_age_seconds";
pub const DELIVERIES_HELD: &str = "herald_deliveries_held";
pub const THROTTLE_WAITING: &str = "herald_throttle_waiting";
/// Throttled endpoints with a `herald_throttle_waiting` series of their
/// own; any tenant may set a rate, so the labels are bounded.
pub const MAX_THROTTLE_LABELS: usize = 100;
pub const ENDPOINTS_DISABLED: &str = "herald_endpoints_disabled";
pub const CIRCUIT_OPEN: &str = "herald_endpoint_circuit_open";
pub const CIRCUIT_OPENINGS: &str = "herald_endpoint_circuit_openings_total";

/// The `endpoint` label of every endpoint past the cardinality bound.
pub const OTHER_ENDPOINT: &str = "other";

/// The Prometheus text exposition format's content type.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Attempt durations: from a fast local receiver (10 ms) to the default
/// request timeout (30 s), roughly ×2.5 apart.
const DURATION_BUCKETS: [f64; 11] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// How often the background loop refreshes the queue gauges.
pub const REFRESH_EVERY: Duration = Duration::from_secs(5);
/// A scrape re-reads the store unless a scrape did within this (and this
/// process changed nothing since): a burst of scrapes costs one read.
pub const SCRAPE_FRESH: Duration = Duration::from_secs(1);

/// The process's recorder: installed on first use. `None` when another
/// global recorder was installed first (Herald embedded as a library in a
/// program with its own); then Herald's metrics go to that one and
/// `/metrics` has nothing to render.
fn recorder() -> Option<&'static PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let builder = match PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Full(ATTEMPT_DURATION.into()), &DURATION_BUCKETS)
            {
                Ok(b) => b,
                Err(e) => {
                    tracing::error!(error = %e, "cannot configure the metrics recorder");
                    return None;
                }
            };
            match builder.install_recorder() {
                Ok(handle) => {
                    describe();
                    // Unlabelled counters are shown from the start at 0:
                    // `increase(…) > 0` alerts see their first increment.
                    for counter in [
                        COMPLETIONS_UNRECORDED,
                        BACKUP_FAILURES,
                        THROTTLE_PACED,
                        CIRCUIT_OPENINGS,
                        MESSAGES_INGESTED,
                    ] {
                        ::metrics::counter!(counter).increment(0);
                    }
                    Some(handle)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "another metrics recorder is installed; /metrics stays empty");
                    None
                }
            }
        })
        .as_ref()
}

/// The `# HELP` lines; registered once, right after the recorder.
fn describe() {
    use ::metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        ATTEMPTS,
        Unit::Count,
        "Finished delivery attempts by endpoint and outcome (success, retry, dead)."
    );
    describe_histogram!(
        ATTEMPT_DURATION,
        Unit::Seconds,
        "Duration of one delivery attempt, by endpoint."
    );
    describe_counter!(
        MESSAGES_INGESTED,
        Unit::Count,
        "Messages accepted by the API (committed before the 202)."
    );
    describe_counter!(
        CLAIMS,
        Unit::Count,
        "Claims of due deliveries by the dispatcher loop, by whether they found any (work, none)."
    );
    describe_counter!(
        RELEASED,
        Unit::Count,
        "Claimed deliveries given back unsent, by reason (lease, disabled, shutdown)."
    );
    describe_counter!(
        COMPLETIONS_UNRECORDED,
        Unit::Count,
        "Finished attempts whose outcome could not be written; their deliveries are left to their leases."
    );
    describe_gauge!(
        DELIVERIES,
        Unit::Count,
        "Deliveries in the store by state (pending, delivering, dead)."
    );
    describe_gauge!(
        DUE_BACKLOG,
        Unit::Count,
        "Pending deliveries due now for enabled endpoints (held ones are not counted)."
    );
    describe_gauge!(
        DELIVERIES_HELD,
        Unit::Count,
        "Pending deliveries held for disabled endpoints."
    );
    describe_gauge!(
        OLDEST_DUE_AGE,
        Unit::Seconds,
        "How long the oldest due delivery has been waiting (0 when none is due)."
    );
    describe_gauge!(
        THROTTLE_WAITING,
        Unit::Count,
        "Pending deliveries waiting for a send slot of their throttled endpoint, by endpoint."
    );
    describe_gauge!(
        ENDPOINTS_DISABLED,
        Unit::Count,
        "Endpoints currently disabled."
    );
    describe_gauge!(
        CIRCUIT_OPEN,
        Unit::Count,
        "Endpoints whose circuit breaker is open or half-open (by endpoint, bounded)."
    );
    describe_counter!(
        THROTTLE_PACED,
        Unit::Count,
        "Throttled sends that came late for their slot and went back unsent for a new one."
    );
    describe_gauge!(
        BACKUP_LAST_SUCCESS,
        Unit::Seconds,
        "When the last scheduled backup succeeded (Unix time)."
    );
    describe_counter!(
        BACKUP_FAILURES,
        Unit::Count,
        "Scheduled backups that failed."
    );
    describe_counter!(
        CIRCUIT_OPENINGS,
        Unit::Count,
        "Circuit breakers opened (or reopened after a failed probe) by this process."
    );
}

/// Sets `herald_endpoint_circuit_open` for one `endpoint` label value.
pub fn circuit_open(label: &str, value: f64) {
    ::metrics::gauge!(CIRCUIT_OPEN, "endpoint" => label.to_owned()).set(value);
}

/// Notes a scheduled backup that succeeded at `at` (ms since the epoch).
pub fn backup_succeeded(at: Millis) {
    ::metrics::gauge!(BACKUP_LAST_SUCCESS).set(at as f64 / 1000.0);
}

/// Counts one scheduled backup that failed.
pub fn backup_failed() {
    ::metrics::counter!(BACKUP_FAILURES).increment(1);
}

/// Counts one throttled send given back for a new slot: it came late.
pub fn throttle_paced() {
    ::metrics::counter!(THROTTLE_PACED).increment(1);
}

/// Counts one opening of a circuit breaker.
pub fn circuit_opened() {
    ::metrics::counter!(CIRCUIT_OPENINGS).increment(1);
}

/// Counts messages that an ingest batch committed. Without a recorder
/// (a worker process) this is a no-op.
pub fn messages_ingested(count: u64) {
    if count > 0 {
        ::metrics::counter!(MESSAGES_INGESTED).increment(count);
        note_change();
    }
}

/// Counts one claim of the dispatcher loop and whether it found work.
pub fn claimed(found: usize) {
    let found = if found > 0 { "work" } else { "none" };
    ::metrics::counter!(CLAIMS, "found" => found).increment(1);
}

/// Counts one claimed delivery given back unsent, and why.
pub fn released(reason: &'static str) {
    ::metrics::counter!(RELEASED, "reason" => reason).increment(1);
}

/// Counts outcomes the completer gave up writing (each is also logged).
pub fn completions_unrecorded(count: usize) {
    if count > 0 {
        ::metrics::counter!(COMPLETIONS_UNRECORDED)
            .increment(u64::try_from(count).unwrap_or(u64::MAX));
    }
}

/// Records finished attempts under bounded endpoint labels. One per
/// dispatcher: the bound comes from that process's configuration.
pub struct AttemptMetrics {
    max_endpoints: usize,
    /// The endpoints that have their own label value.
    labelled: Mutex<HashSet<EndpointId>>,
}

impl AttemptMetrics {
    pub fn new(max_endpoints: usize) -> Self {
        AttemptMetrics {
            max_endpoints,
            labelled: Mutex::new(HashSet::new()),
        }
    }

    /// The `endpoint` label value for `endpoint`: its id while there is
    /// room (or it already has one), otherwise [`OTHER_ENDPOINT`].
    pub fn label(&self, endpoint: &EndpointId) -> String {
        let mut labelled = self.labelled.lock().unwrap_or_else(|p| p.into_inner());
        if labelled.contains(endpoint)
            || (labelled.len() < self.max_endpoints && labelled.insert(endpoint.clone()))
        {
            endpoint.to_string()
        } else {
            OTHER_ENDPOINT.to_owned()
        }
    }

    /// One finished attempt: `next` is the state the policy chose for it,
    /// `took` the time the attempt itself took.
    pub fn record_attempt(&self, endpoint: &EndpointId, next: &NextState, took: Duration) {
        let endpoint = self.label(endpoint);
        let outcome = match next {
            NextState::Delivered => "success",
            NextState::Retry { .. } => "retry",
            NextState::Dead(_) => "dead",
        };
        ::metrics::counter!(ATTEMPTS, "endpoint" => endpoint.clone(), "outcome" => outcome)
            .increment(1);
        ::metrics::histogram!(ATTEMPT_DURATION, "endpoint" => endpoint).record(took.as_secs_f64());
        // Before the outcome is written: a scrape in between may show the
        // store as it was, for at most SCRAPE_FRESH.
        note_change();
    }
}

/// Bumped by every change this process makes that the queue gauges show
/// (a committed ingest batch, a finished attempt), so a scrape after it
/// re-reads the store even within [`SCRAPE_FRESH`].
static CHANGES: AtomicU64 = AtomicU64::new(0);

fn note_change() {
    CHANGES.fetch_add(1, Ordering::Relaxed);
}

/// Who set the queue gauges last, so that a scrape knows whether it may
/// render them as they are.
#[derive(Clone, Copy)]
struct Written {
    exporter: u64,
    at: Instant,
    /// [`CHANGES`] when the store was read.
    changes: u64,
    /// Set by a scrape (the background loop's values never count as fresh:
    /// it may have read the store just before a change whose counters a
    /// scrape then shows).
    by_scrape: bool,
}

static GAUGES_WRITTEN: Mutex<Option<Written>> = Mutex::new(None);

fn gauges_written() -> MutexGuard<'static, Option<Written>> {
    GAUGES_WRITTEN.lock().unwrap_or_else(|p| p.into_inner())
}

fn set_queue_gauges(stats: &QueueStats, now: Millis) {
    // Counts far below 2^53: exact as f64.
    let n = |v: u64| v as f64;
    ::metrics::gauge!(DELIVERIES, "state" => "pending").set(n(stats.pending));
    ::metrics::gauge!(DELIVERIES, "state" => "delivering").set(n(stats.delivering));
    ::metrics::gauge!(DELIVERIES, "state" => "dead").set(n(stats.dead));
    ::metrics::gauge!(DUE_BACKLOG).set(n(stats.due));
    ::metrics::gauge!(DELIVERIES_HELD).set(n(stats.held));
    let oldest_ms = stats
        .oldest_due_at
        .map_or(0, |at| now.saturating_sub(at).max(0));
    ::metrics::gauge!(OLDEST_DUE_AGE).set(oldest_ms as f64 / 1000.0);
    ::metrics::gauge!(ENDPOINTS_DISABLED).set(n(stats.disabled_endpoints));
}

/// The `herald_throttle_waiting` series set last, so that an endpoint no
/// longer throttled (or no longer listed) goes back to 0.
static THROTTLE_LABELS: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn set_throttle_gauges(waiting: &[ThrottleWaiting]) {
    let mut values: Vec<(String, u64)> = waiting
        .iter()
        .take(MAX_THROTTLE_LABELS)
        .map(|w| (w.endpoint_id.to_string(), w.waiting))
        .collect();
    if waiting.len() > MAX_THROTTLE_LABELS {
        let rest = waiting[MAX_THROTTLE_LABELS..]
            .iter()
            .map(|w| w.waiting)
            .sum();
        values.push((OTHER_ENDPOINT.to_owned(), rest));
    }
    let mut last = THROTTLE_LABELS.lock().unwrap_or_else(|p| p.into_inner());
    for gone in last.iter().filter(|l| !values.iter().any(|(v, _)| v == *l)) {
        ::metrics::gauge!(THROTTLE_WAITING, "endpoint" => gone.clone()).set(0.0);
    }
    for (label, n) in &values {
        ::metrics::gauge!(THROTTLE_WAITING, "endpoint" => label.clone()).set(*n as f64);
    }
    *last = values.into_iter().map(|(l, _)| l).collect();
}

/// One Herald instance's `/metrics`: renders the process's metrics with
/// the queue gauges read from this instance's store.
pub struct Exporter {
    store: Arc<dyn Store>,
    id: u64,
}

impl Exporter {
    /// Installs the process's recorder if this is the first exporter.
    pub fn new(store: Arc<dyn Store>) -> Self {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        recorder();
        Exporter {
            store,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Reads the queue statistics and sets the gauges; returns the lock on
    /// them, so a caller can render before another instance writes. The
    /// store is read before the lock is taken: no lock is held across it.
    async fn refresh(&self, by_scrape: bool) -> StoreResult<MutexGuard<'static, Option<Written>>> {
        let changes = CHANGES.load(Ordering::Relaxed);
        let now = now_millis();
        let stats = self.store.queue_stats(now).await?;
        let throttled = self.store.throttle_waiting().await?;
        let mut written = gauges_written();
        set_queue_gauges(&stats, now);
        set_throttle_gauges(&throttled);
        *written = Some(Written {
            exporter: self.id,
            at: Instant::now(),
            changes,
            by_scrape,
        });
        Ok(written)
    }

    /// The Prometheus text, or `None` when this process has no recorder of
    /// its own. The gauges are read from the store first, unless a scrape
    /// of this exporter did so within [`SCRAPE_FRESH`] and this process
    /// changed nothing since: so a scrape after a known run is exact, and
    /// scraping (which needs no token) costs the store at most one read a
    /// second. If the store cannot be read, the last values are rendered
    /// (`/readyz` tells that the store is down).
    pub async fn render(&self) -> Option<String> {
        let handle = recorder()?;
        {
            let written = gauges_written();
            let fresh = written.is_some_and(|w| {
                w.exporter == self.id
                    && w.by_scrape
                    && w.changes == CHANGES.load(Ordering::Relaxed)
                    && w.at.elapsed() < SCRAPE_FRESH
            });
            if fresh {
                // Rendered under the lock: no other instance's refresh can
                // slip in between.
                return Some(handle.render());
            }
        }
        match self.refresh(true).await {
            Ok(_written) => Some(handle.render()),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read queue statistics for /metrics");
                Some(handle.render())
            }
        }
    }

    /// Refreshes the gauges every [`REFRESH_EVERY`] until `shutdown`, and
    /// runs the recorder's upkeep: histogram samples are only folded into
    /// their buckets by a render or by upkeep, so without it a process that
    /// is never scraped would keep every sample.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            if let Err(e) = self.refresh(false).await.map(drop) {
                tracing::warn!(error = %e, "cannot refresh the queue gauges");
            }
            if let Some(handle) = recorder() {
                handle.run_upkeep();
            }
            tokio::select! {
                _ = tokio::time::sleep(REFRESH_EVERY) => {}
                _ = shutdown.cancelled() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_past_the_bound_share_the_other_label() {
        let m = AttemptMetrics::new(2);
        let (a, b, c, d) = (
            EndpointId::generate(),
            EndpointId::generate(),
            EndpointId::generate(),
            EndpointId::generate(),
        );
        assert_eq!(m.label(&a), a.as_str());
        assert_eq!(m.label(&b), b.as_str());
        assert_eq!(m.label(&c), OTHER_ENDPOINT);
        // Those with a label keep it; the bound does not move.
        assert_eq!(m.label(&a), a.as_str());
        assert_eq!(m.label(&d), OTHER_ENDPOINT);
        assert_eq!(m.label(&c), OTHER_ENDPOINT);
        assert_eq!(m.label(&b), b.as_str());
    }

    #[test]
    fn a_zero_bound_labels_every_endpoint_other() {
        let m = AttemptMetrics::new(0);
        assert_eq!(m.label(&EndpointId::generate()), OTHER_ENDPOINT);
    }
}

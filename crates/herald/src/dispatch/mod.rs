//! The dispatcher: claims due deliveries in batches, sends them with bounded
//! concurrency (globally and per endpoint), asks the policy what comes next,
//! and hands the outcomes to the completer, which records them in batches.
//!
//! Invariant: no database transaction is open while a request is in flight.
//! The claim commits before the first byte is sent; the outcome is written
//! by a later transaction. A crash in between leaves the delivery
//! `delivering` with a lease that expires, after which it is claimed again.
//!
//! Per endpoint, at most `endpoint_concurrency` requests are in flight, and
//! about as many more claimed deliveries wait for one of them to finish
//! (a prefetch, so that a finished request is followed at once by the next
//! rather than by a database round trip). A stuck endpoint therefore holds
//! about twice its cap of the process's `max_in_flight` claims; the rest
//! go to endpoints that can use them.
//!
//! Invariant: a lease outlives the request it covers. Concurrent claims
//! (the loop's and up to two ingest handoffs) each give an endpoint the
//! room they saw, so more may wait at its gate than one request's worth,
//! and any wait (a slow receiver, a busy runtime) eats into the lease. So
//! the check is made where it matters, when the gate lets a delivery
//! through: it is sent only if its lease still covers a whole request
//! ([`LEASE_MARGIN`] beyond the request timeout); otherwise it is released
//! (pending, due now, no attempt spent) and claimed again with a new lease.
//! A lease that ended before the send is thus never sent under, whatever
//! the mix of handoffs and claims, so no other process can be sending the
//! same delivery.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use herald_policy::{decide, is_gone, should_disable, Decision, DisableRule, RetryPolicy};
use rand::Rng;
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::Config;
use crate::ids::{AttemptId, EndpointId};
use crate::operator::Operator;
use crate::store::{
    now_millis, AttemptRecord, ClaimRequest, ClaimedDelivery, Completed, Completion, NextState,
    Store, StoreError, StoreResult,
};

pub mod breaker;
mod claimed;
mod completer;
pub mod lanes;
pub mod sender;

use claimed::{Claimed, Lease};
use completer::unrecorded;
pub use lanes::Lanes;
pub use sender::Sender;

/// After a finished request wakes the idle loop, how long to let others
/// finish before claiming, so claims come in batches.
const CLAIM_GATHER: Duration = Duration::from_millis(1);

/// The loop's first claim after an idle wait asks for at most this many
/// deliveries; the next ask follows what the last one found (twice as
/// many, doubling while claims come back full). A claim reserves the slots
/// it asks for until it returns, and a reserved slot is one an ingest
/// batch's handoff cannot take: asking for every free slot each time made
/// each of the many empty claims beside a stuck endpoint's due backlog
/// turn new messages away from the handoff, to be claimed by yet another
/// claim (PostgreSQL's healthy traffic 17–24 % slower beside such a
/// backlog).
const CLAIM_START: usize = 64;

/// How much of a lease must be left beyond the request timeout for a
/// delivery to be sent: time to hand its outcome to the completer and
/// write it before another process may claim it. The configuration keeps
/// a lease longer than two request timeouts and this margin, so a delivery
/// that waited at its gate no longer than one request is always sent.
pub const LEASE_MARGIN: Duration = Duration::from_secs(1);

/// While due work is held back by the store's rules (a throttle's next
/// slot, a FIFO queue) or by busy endpoints, how long the idle loop waits
/// at most before claiming again; doubled after each claim that finds
/// nothing, up to [`BLOCKED_RECHECK_MAX`]. (A FIFO endpoint's next delivery
/// and a busy endpoint's room wake the loop themselves: the completer and
/// [`Claimed::room`].)
const BLOCKED_RECHECK: Duration = Duration::from_millis(25);
/// A throttle's claims reserve its send slots up to
/// [`crate::store::THROTTLE_HORIZON_MS`] ahead: looking again at least this
/// often finds each slot before it is due.
const BLOCKED_RECHECK_MAX: Duration =
    Duration::from_millis(crate::store::THROTTLE_HORIZON_MS as u64);

/// The endpoints a claim left without room: what they held (as the claim
/// counted it, `in_flight`) and what it gave them (`claimed`, one endpoint
/// per delivery) reach `room_each`; for an endpoint `in_flight` did not
/// list, what it was given reaches `unlisted_room` (it may have more due,
/// and once its requests come back a claim gives it its lane's room).
fn short_of_room<'a>(
    in_flight: &'a HashMap<EndpointId, usize>,
    (room_each, unlisted_room): (usize, usize),
    claimed: impl IntoIterator<Item = &'a EndpointId>,
) -> std::collections::HashSet<EndpointId> {
    let mut held = HashMap::<&EndpointId, usize>::new();
    for ep in claimed {
        *held.entry(ep).or_insert(0) += 1;
    }
    for (ep, n) in in_flight {
        *held.entry(ep).or_insert(0) += n;
    }
    held.into_iter()
        .filter(|(ep, n)| {
            let room = if in_flight.contains_key(*ep) {
                room_each
            } else {
                unlisted_room
            };
            *n >= room
        })
        .map(|(ep, _)| ep.clone())
        .collect()
}

/// Whether a throttled delivery's send at `now` is later than its slot
/// `send_at` allows (the slots' spacing absorbs `THROTTLE_DRIFT_US`).
fn is_late(send_at: Option<crate::store::Millis>, now: crate::store::Millis) -> bool {
    send_at.is_some_and(|at| now > at.saturating_add(crate::store::THROTTLE_DRIFT_US / 1000))
}

/// Until `d`'s throttle slot, if it has one (never longer than the claim's
/// horizon, whatever the clock says).
async fn wait_for_slot(d: &ClaimedDelivery) {
    let Some(at) = d.send_at else { return };
    let ahead = at
        .saturating_sub(now_millis())
        .clamp(0, crate::store::THROTTLE_HORIZON_MS + 1);
    if ahead > 0 {
        tokio::time::sleep(Duration::from_millis(u64::try_from(ahead).unwrap_or(0))).await;
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Woke {
    SlotFreed,
    Other,
}

/// After shutdown begins, in-flight requests take at most the request
/// timeout; the completer may then go on trying a store that does not take
/// outcomes for this much longer before it gives up on them.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// The error note of an attempt recorded without the receiver's text.
pub const UNSTORABLE_NOTE: &str =
    "the store refused this attempt's response excerpt or error text: recorded without them";

/// Counts of what one [`Dispatcher::process_batch`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BatchReport {
    pub claimed: usize,
    pub delivered: usize,
    pub retried: usize,
    pub dead: usize,
    /// Outcomes that could not be written (see [`RecordReport`]).
    pub unrecorded: usize,
}

/// What became of a batch of outcomes given to [`Dispatcher::record`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RecordReport {
    /// Written as they were.
    pub recorded: usize,
    /// Refused by the store as they were, written without their response
    /// excerpt and error text ([`UNSTORABLE_NOTE`] instead).
    pub degraded: usize,
    /// Not written, each logged at error level and counted in
    /// `herald_completions_unrecorded_total`: their deliveries stay as they
    /// were until their leases end.
    pub unrecorded: usize,
}

/// Why a part of a batch was not written.
enum Unwritten {
    /// The store refused these rows (an error about what they hold): a
    /// smaller part, or the row in a plainer form, may still be taken.
    Refused(StoreError),
    /// The store could not be reached in time, or shutdown's bound passed.
    Unreachable(StoreError),
}

pub struct Dispatcher {
    store: Arc<dyn Store>,
    sender: Sender,
    policy: RetryPolicy,
    lease: Duration,
    poll_interval: Duration,
    max_in_flight: usize,
    endpoint_cap: usize,
    /// A request takes at most this (connect, send, the excerpt's read).
    request_timeout: Duration,
    claimed: Arc<Claimed>,
    /// Signalled when new work may be due: a commit, a replay, a retry.
    wake: Arc<Notify>,
    disable_rule: DisableRule,
    operator: Operator,
    /// Attempt counters and durations, labelled by endpoint (bounded).
    metrics: crate::metrics::AttemptMetrics,
    /// The circuit breakers that are not closed, as this process sees them.
    breakers: breaker::Breakers,
    /// Set while [`Dispatcher::run`] runs: where ingest's handoffs go.
    running: OnceLock<(mpsc::WeakSender<Finished>, CancellationToken)>,
    /// Each endpoint's share of the slots, sized by how it answers.
    lanes: Lanes,
}

/// A finished attempt on its way to the completer.
struct Finished {
    completion: Completion,
    /// Its endpoint delivers in order: once this outcome is written, the
    /// endpoint's next delivery may be claimed, and the loop is woken for it.
    ordered: bool,
}

/// Sending slots reserved for one ingest batch's handoff (see
/// [`Dispatcher::reserve_handoff`]): give it back with
/// [`Dispatcher::accept_handoff`] or [`Dispatcher::cancel_handoff`].
#[must_use]
pub struct HandoffTicket {
    reserved: usize,
    in_flight: HashMap<EndpointId, usize>,
    /// The room of an endpoint `in_flight` does not list (a new lane's).
    unlisted_cap: usize,
    now: crate::store::Millis,
    lease_until: crate::store::Millis,
    endpoint_cap: usize,
}

impl HandoffTicket {
    /// The claim the store makes of the batch's new deliveries.
    pub fn request(&self) -> ClaimRequest<'_> {
        ClaimRequest {
            now: self.now,
            lease_until: self.lease_until,
            limit: self.reserved,
            in_flight: &self.in_flight,
            endpoint_cap: self.endpoint_cap,
            unlisted_cap: self.unlisted_cap,
        }
    }
}

impl Dispatcher {
    pub fn new(
        store: Arc<dyn Store>,
        config: &Config,
        wake: Arc<Notify>,
        operator: Operator,
    ) -> anyhow::Result<Self> {
        let claimed = Arc::new(Claimed::new());
        // An endpoint disabled here (API, dashboard, auto-disable) stops the
        // deliveries already waiting at its gate.
        let stopping = claimed.clone();
        operator.on_disabled(Box::new(move |ep| stopping.stop(ep, now_millis())));
        Ok(Dispatcher {
            disable_rule: DisableRule {
                after: config.delivery.disable_after,
                min_window: config.delivery.disable_min_window,
            },
            operator,
            metrics: crate::metrics::AttemptMetrics::new(config.telemetry.metrics_max_endpoints),
            breakers: breaker::Breakers::new(config.delivery.breaker, config.delivery.lease),
            store,
            sender: Sender::new(config)?,
            policy: config.delivery.retry.clone(),
            lease: config.delivery.lease,
            poll_interval: config.delivery.poll_interval,
            max_in_flight: config.delivery.max_in_flight,
            endpoint_cap: config.delivery.endpoint_concurrency,
            request_timeout: config.delivery.request_timeout,
            claimed,
            wake,
            running: OnceLock::new(),
            lanes: Lanes::new(config.delivery.endpoint_concurrency),
        })
    }

    fn lease_from(&self, now: crate::store::Millis) -> crate::store::Millis {
        now.saturating_add(i64::try_from(self.lease.as_millis()).unwrap_or(i64::MAX))
    }

    /// `per_endpoint`: the room of an endpoint `in_flight` lists (less what
    /// it counts); `unlisted`: of any other.
    async fn claim(
        &self,
        limit: usize,
        (per_endpoint, unlisted): (usize, usize),
        in_flight: &HashMap<EndpointId, usize>,
    ) -> StoreResult<(Vec<ClaimedDelivery>, Lease)> {
        let now = now_millis();
        let lease = Lease {
            claimed_at: now,
            until: self.lease_from(now),
        };
        let span = tracing::trace_span!(
            target: crate::telemetry::TARGET, "dispatch.claim",
            limit, claimed = tracing::field::Empty,
        );
        // Broken circuits: no room when open, the probe when half-open.
        self.refresh_breakers(now, false).await;
        let mut shaped = in_flight.clone();
        let probing = self.breakers.shape(&mut shaped, per_endpoint, true, |ep| {
            self.claimed.registered(ep)
        });
        let claimed = self
            .store
            .claim(&ClaimRequest {
                now,
                lease_until: lease.until,
                limit,
                in_flight: &shaped,
                endpoint_cap: per_endpoint,
                unlisted_cap: unlisted,
            })
            .instrument(span.clone())
            .await;
        self.breakers.settle(&probing, |ep| {
            claimed
                .as_ref()
                .is_ok_and(|c| c.iter().any(|d| d.endpoint_id == *ep))
        });
        let claimed = claimed?;
        self.claimed.set_short_of_room(short_of_room(
            &shaped,
            (per_endpoint, unlisted),
            claimed.iter().map(|d| &d.endpoint_id),
        ));
        span.record("claimed", claimed.len());
        crate::metrics::claimed(claimed.len());
        Ok((claimed, lease))
    }

    /// Re-reads the broken circuit breakers when the view is stale (or
    /// `force`) and tries to win the probes that are due (see
    /// [`breaker::Breakers::refresh`]). A failure leaves the view as it was.
    async fn refresh_breakers(&self, now: crate::store::Millis, force: bool) {
        if let Err(e) = self
            .breakers
            .refresh(&*self.store, now, force, &self.metrics)
            .await
        {
            tracing::warn!(error = %e, "cannot read the circuit breakers; keeping the last view");
        }
    }

    /// Reserves free sending slots (at most `want`) so that an ingest batch
    /// can claim its new deliveries in the transaction that stores them and
    /// hand them straight here, sparing a claim transaction and the wait
    /// for it. `None` when the background loop is not running in this
    /// process, is shutting down, or has no free slot.
    pub fn reserve_handoff(&self, want: usize) -> Option<HandoffTicket> {
        self.running.get()?;
        let (reserved, mut in_flight) = self.claimed.reserve(self.max_in_flight, want);
        if reserved < want {
            self.lanes.contended();
        }
        if reserved == 0 {
            return None;
        }
        let unlisted_cap = self.lanes.narrow(&mut in_flight, 2);
        // No room for a broken circuit's endpoint (not even a half-open
        // probe: that is the loop's claim's alone).
        let _ = self.breakers.shape(
            &mut in_flight,
            self.endpoint_cap.saturating_mul(2),
            false,
            |ep| self.claimed.registered(ep),
        );
        let now = now_millis();
        Some(HandoffTicket {
            reserved,
            in_flight,
            unlisted_cap,
            now,
            lease_until: self.lease_from(now),
            // As the loop's claims: the endpoint's cap in flight, as many
            // more waiting at its gate.
            endpoint_cap: self.endpoint_cap.saturating_mul(2),
        })
    }

    /// Sends the deliveries the store claimed with `ticket`'s request, and
    /// frees the slots they did not use.
    pub fn accept_handoff(self: &Arc<Self>, ticket: HandoffTicket, claimed: Vec<ClaimedDelivery>) {
        // Reserved slots hold `run` from finishing, so it is still there.
        if let Some((done_tx, shutdown)) = self
            .running
            .get()
            .and_then(|(tx, token)| Some((tx.upgrade()?, token)))
        {
            let lease = Lease {
                claimed_at: ticket.now,
                until: ticket.lease_until,
            };
            for d in claimed {
                self.spawn_delivery(d, lease, &done_tx, shutdown);
            }
        }
        self.claimed
            .unreserve(ticket.reserved, Some(self.max_in_flight));
    }

    /// The batch was not stored: its reserved slots are free again.
    pub fn cancel_handoff(&self, ticket: HandoffTicket) {
        self.claimed
            .unreserve(ticket.reserved, Some(self.max_in_flight));
    }

    /// Sends one claimed delivery and decides its next state.
    async fn attempt(&self, d: ClaimedDelivery) -> Completion {
        let attempt_number = d.attempts.saturating_add(1);
        let started_at = now_millis();
        let trusted = self.operator.sends_unguarded(&d);
        // Disabled (a no-op) unless traces are exported; then a child of
        // the message's trace, and the receiver gets this span as parent.
        let span = tracing::trace_span!(
            target: crate::telemetry::TARGET, "webhook.attempt",
            otel.kind = "client",
            endpoint.id = %d.endpoint_id, message.id = %d.msg_id, delivery.id = %d.id,
            attempt = attempt_number,
            http.response.status_code = tracing::field::Empty,
            duration_ms = tracing::field::Empty,
            error = tracing::field::Empty,
        );
        crate::telemetry::set_parent(&span, d.traceparent.as_deref());
        let traceparent = crate::telemetry::traceparent_of(&span).or_else(|| d.traceparent.clone());
        // An expunged message (stored as the empty payload) is never sent,
        // neither empty nor in any other form: the delivery dies.
        let expunged = d.payload.is_empty();
        let observed = if expunged {
            sender::Observed {
                outcome: herald_policy::Outcome::NetworkError,
                status: None,
                excerpt: String::new(),
                error: Some("not sent: the message's payload was expunged".to_owned()),
                duration: Duration::ZERO,
            }
        } else {
            self.sender
                .send(&d, attempt_number, trusted, traceparent.as_deref())
                .instrument(span.clone())
                .await
        };
        if !span.is_disabled() {
            if let Some(status) = observed.status {
                span.record("http.response.status_code", i64::from(status));
            }
            span.record("duration_ms", observed.duration.as_millis() as u64);
            if observed.status.is_none_or(|s| !(200..300).contains(&s)) {
                // The kind of failure, not the receiver's words.
                span.record("error", format!("{:?}", observed.outcome).as_str());
            }
        }
        let now = now_millis();
        let age = Duration::from_millis(u64::try_from(now - d.cycle_started_at).unwrap_or(0));
        let in_cycle = attempt_number.saturating_sub(d.cycle_base);
        let jitter_unit: f64 = rand::thread_rng().gen();
        let next = match decide(&self.policy, &observed.outcome, in_cycle, age, jitter_unit) {
            _ if expunged => NextState::Dead(herald_policy::DeadReason::Expunged),
            Decision::Delivered => NextState::Delivered,
            Decision::Retry { delay } => NextState::Retry {
                at: now.saturating_add(i64::try_from(delay.as_millis()).unwrap_or(i64::MAX)),
            },
            Decision::Dead(reason) => NextState::Dead(reason),
        };
        self.metrics
            .record_attempt(&d.endpoint_id, &next, observed.duration);
        self.lanes.finished(&d.endpoint_id, observed.duration);
        tracing::debug!(
            delivery = %d.id, endpoint = %d.endpoint_id, attempt = attempt_number,
            status = ?observed.status, error = ?observed.error, next = ?next, "attempt finished"
        );
        Completion {
            attempt: AttemptRecord {
                id: AttemptId::generate(),
                delivery_id: d.id,
                msg_id: d.msg_id,
                endpoint_id: d.endpoint_id,
                app_id: d.app_id,
                // The attempt log is read by whoever reads the endpoint's
                // history: credentials in the URL stay out of it.
                url: crate::net::masked_url(&d.url),
                attempt_number,
                started_at,
                duration_ms: i64::try_from(observed.duration.as_millis()).unwrap_or(i64::MAX),
                status_code: observed.status,
                response: observed.excerpt,
                error: observed.error,
                success: next == NextState::Delivered,
                manual: d.manual,
            },
            lease_token: d.lease_token,
            next,
            now,
            cycle_attempt: in_cycle,
        }
    }

    /// Claims what is due (at most the endpoint cap per endpoint), sends it
    /// all at once, and records every outcome before returning. The
    /// background loop does the same work pipelined; tests call this to
    /// step the engine without sleeping.
    pub async fn process_batch(&self) -> StoreResult<BatchReport> {
        let (free, mut in_flight) = self.claimed.reserve(self.max_in_flight, self.max_in_flight);
        // Stepping gives an endpoint it has not seen its whole cap (tests
        // step a known number of deliveries at once); the loop does not.
        self.lanes.narrow(&mut in_flight, 1);
        // Stepping sees the breakers as stored now, not as of 250 ms ago.
        self.refresh_breakers(now_millis(), true).await;
        let claimed = self
            .claim(free, (self.endpoint_cap, self.endpoint_cap), &in_flight)
            .await;
        self.claimed.unreserve(free, None);
        let (claimed, _lease) = claimed?;
        for d in &claimed {
            self.lanes.claimed(&d.endpoint_id);
        }
        let mut report = BatchReport {
            claimed: claimed.len(),
            ..BatchReport::default()
        };
        let completions = futures::future::join_all(claimed.into_iter().map(|d| async move {
            wait_for_slot(&d).await;
            self.attempt(d).await
        }))
        .await;
        for c in &completions {
            match c.next {
                NextState::Delivered => report.delivered += 1,
                NextState::Retry { .. } => report.retried += 1,
                NextState::Dead(_) => report.dead += 1,
            }
        }
        report.unrecorded = self.record(&completions).await.unrecorded;
        Ok(report)
    }

    /// The background loop. Returns after `shutdown` once every request in
    /// flight has finished and its outcome has been written, and every
    /// claimed delivery that had not started has been released.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        // Cancelled by the process's shutdown, or when the completer fails:
        // without it no outcome is written, so claiming stops, and the
        // completer's panic is this task's (the process stops, see
        // `server::tasks`).
        let shutdown = shutdown.child_token();
        let (done_tx, done_rx) = mpsc::channel::<Finished>(self.max_in_flight.max(64) * 4);
        // Cancelled once shutdown's bound has passed: then nothing waits
        // any longer for a store that does not answer.
        let give_up = CancellationToken::new();
        let completer = {
            let (this, give_up, stop) = (self.clone(), give_up.clone(), shutdown.clone());
            tokio::spawn(async move {
                // Dropped by a panic's unwinding too.
                let stop_claiming = stop.drop_guard();
                this.run_completer(done_rx, give_up).await;
                stop_claiming.disarm();
            })
        };
        if self
            .running
            .set((done_tx.downgrade(), shutdown.clone()))
            .is_err()
        {
            tracing::error!("the dispatcher loop is already running");
            return;
        }
        let mut backoff = Duration::from_millis(50);
        let per_endpoint = self.endpoint_cap.saturating_mul(2);
        let mut claim_size = CLAIM_START.min(self.max_in_flight);
        let mut recheck = BLOCKED_RECHECK;
        while !shutdown.is_cancelled() {
            let (free, mut in_flight) = self.claimed.reserve(self.max_in_flight, claim_size);
            if free == 0 {
                self.lanes.contended();
                tokio::select! {
                    _ = self.claimed.freed.notified() => {}
                    _ = shutdown.cancelled() => break,
                }
                continue;
            }
            let unlisted = self.lanes.narrow(&mut in_flight, 2);
            let claimed = self
                .claim(free, (per_endpoint, unlisted), &in_flight)
                .await
                .map(|(claimed, lease)| {
                    let n = claimed.len();
                    for d in claimed {
                        self.spawn_delivery(d, lease, &done_tx, &shutdown);
                    }
                    n
                });
            // The claimed ones are registered now; the rest is free again.
            self.claimed.unreserve(free, None);
            match claimed {
                Ok(n) => {
                    backoff = Duration::from_millis(50);
                    if n == free {
                        if free < claim_size {
                            // Every free slot is taken.
                            self.lanes.contended();
                        }
                        // There may be more due right now.
                        claim_size = claim_size.saturating_mul(2).min(self.max_in_flight);
                        continue;
                    }
                    claim_size = n.saturating_mul(2).max(CLAIM_START).min(self.max_in_flight);
                    if n > 0 {
                        recheck = BLOCKED_RECHECK;
                    }
                    let look_again = recheck;
                    if n == 0 {
                        recheck = recheck.saturating_mul(2).min(BLOCKED_RECHECK_MAX);
                    }
                    // Everything claimable is under way: sleep until that
                    // changes. When a finished request is what woke us, let
                    // others finish too, so the next claim is a batch
                    // rather than one row per finished request.
                    if self.idle_wait(&shutdown, n == 0, look_again).await == Woke::SlotFreed {
                        tokio::select! {
                            _ = tokio::time::sleep(CLAIM_GATHER) => {}
                            _ = shutdown.cancelled() => break,
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "claim failed; backing off");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = shutdown.cancelled() => break,
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
        // Stop claiming; let what is in flight finish (bounded by the
        // request timeout), release what had not started, then let the
        // completer write it all down: all within the request timeout and
        // STOP_GRACE, however the store fares.
        self.claimed.close();
        let stop_by = tokio::time::Instant::now() + self.request_timeout + STOP_GRACE;
        let deadline = {
            let give_up = give_up.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until(stop_by).await;
                give_up.cancel();
            })
        };
        while self.claimed.busy() > 0 {
            tokio::select! {
                _ = self.claimed.freed.notified() => {}
                _ = give_up.cancelled() => {
                    tracing::error!(
                        count = self.claimed.busy(),
                        "stopping with claimed deliveries unfinished (the store does not answer); their leases will bring them back"
                    );
                    break;
                }
            }
        }
        drop(done_tx);
        let completed = completer.await;
        deadline.abort();
        if let Err(e) = completed {
            match e.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                Err(e) => tracing::error!(error = %e, "completer task failed"),
            }
        }
    }

    /// Sends `d` once its endpoint's gate lets it, if it may still be sent
    /// then (see the module's lease invariant); otherwise, or at shutdown,
    /// releases it unsent.
    fn spawn_delivery(
        self: &Arc<Self>,
        d: ClaimedDelivery,
        lease: Lease,
        done_tx: &mpsc::Sender<Finished>,
        shutdown: &CancellationToken,
    ) {
        let gate = self.claimed.add(&d.endpoint_id, self.endpoint_cap);
        self.lanes.claimed(&d.endpoint_id);
        let (this, done_tx, shutdown) = (self.clone(), done_tx.clone(), shutdown.clone());
        tokio::spawn(async move {
            let endpoint = d.endpoint_id.clone();
            let ordered = d.ordered;
            // A throttled endpoint's delivery goes at its slot (at most
            // THROTTLE_HORIZON_MS after its claim), then through the gate
            // like any other.
            let slot = tokio::select! {
                biased;
                _ = shutdown.cancelled() => false,
                _ = wait_for_slot(&d) => true,
            };
            let permit = if slot {
                tokio::select! {
                    biased;
                    p = gate.acquire_owned() => p.ok(),
                    _ = shutdown.cancelled() => None,
                }
            } else {
                None
            };
            match permit.map(|p| (p, this.may_send(&d, lease))) {
                Some((_permit, Ok(()))) => {
                    let completion = this.attempt(d).await;
                    if is_gone(completion.attempt.status_code) {
                        // Disabled at once once recorded: the deliveries
                        // waiting behind this one must not be sent meanwhile.
                        this.claimed.stop(&endpoint, completion.now);
                        this.claimed.hold_until_recorded(&endpoint);
                    }
                    // Fails only when the completer is gone (it stopped
                    // waiting at shutdown); the lease then brings the
                    // delivery back.
                    if let Err(unsent) = done_tx
                        .send(Finished {
                            completion,
                            ordered,
                        })
                        .await
                    {
                        unrecorded(
                            std::slice::from_ref(&unsent.0.completion),
                            &StoreError::Unavailable(
                                "shutting down: the completer has stopped".into(),
                            ),
                        );
                    }
                }
                Some((_permit, Err(reason))) => this.release(&d, reason).await,
                None => this.release(&d, "shutdown").await,
            }
            this.claimed.remove(&endpoint);
        });
    }

    /// Whether `d`, through its gate now, may be sent: its endpoint was not
    /// stopped since it was claimed, and its lease covers a whole request.
    fn may_send(&self, d: &ClaimedDelivery, lease: Lease) -> Result<(), &'static str> {
        // A throttled send later than its slot's drift margin (its timer
        // on a loaded host, a wait at a busy gate) would share a second
        // with the slots after it, claimed by this process or another:
        // it goes back for a new slot instead, so the receiver never
        // counts more than `rate + 1` in a second, however many processes
        // send.
        if is_late(d.send_at, now_millis()) {
            crate::metrics::throttle_paced();
            return Err("late");
        }
        if self.claimed.is_stopped(&d.endpoint_id, lease.claimed_at) {
            return Err("disabled");
        }
        if self.breakers.holds(&d.endpoint_id, lease.claimed_at) {
            return Err("circuit");
        }
        let needed = self.request_timeout.saturating_add(LEASE_MARGIN);
        let needed = i64::try_from(needed.as_millis()).unwrap_or(i64::MAX);
        if now_millis().saturating_add(needed) > lease.until {
            return Err("lease");
        }
        Ok(())
    }

    /// Gives `d` back unsent: pending and due now (held if its endpoint is
    /// disabled), its attempt count unchanged.
    async fn release(&self, d: &ClaimedDelivery, reason: &'static str) {
        crate::metrics::released(reason);
        tracing::debug!(delivery = %d.id, endpoint = %d.endpoint_id, reason, "released unsent");
        match self
            .store
            .release(&d.id, &d.lease_token, now_millis())
            .await
        {
            // Due now: the loop may be idle. Not for a stopped endpoint:
            // the next claim holds what is released, and a 410 not yet
            // recorded would otherwise be claimed and released in a loop
            // until it is (the poll comes soon enough).
            Ok(()) if reason != "shutdown" && reason != "disabled" => self.wake.notify_one(),
            Ok(()) => {}
            Err(e) => {
                tracing::warn!(error = %e, delivery = %d.id, "release failed; the lease will expire")
            }
        }
    }

    /// Nothing claimable now: sleep until new work, the next known due
    /// time, the poll, or, when due work is held back, a freed slot of an
    /// endpoint the last claim left short of room, or `recheck` (the store
    /// holds back a throttle's next slot, a FIFO queue).
    async fn idle_wait(
        &self,
        shutdown: &CancellationToken,
        last_found_none: bool,
        recheck: Duration,
    ) -> Woke {
        let mut wait = self.poll_interval;
        // With nothing due yet, a finished request frees a slot that no due
        // delivery waits for: claiming then would find nothing. (New work
        // wakes the loop itself: ingest, replays, and recorded retries.)
        let mut held_back = true;
        match self.store.next_due_at().await {
            Ok(Some(at)) => {
                let until = at - now_millis();
                if until > 0 {
                    wait = wait.min(Duration::from_millis(u64::try_from(until).unwrap_or(0)));
                    held_back = false;
                } else if self.breakers.next_change(now_millis()).is_some() {
                    // Due work may be what an open breaker holds back:
                    // claiming again at once would find it again. Look
                    // again once the view may have changed (a cooldown
                    // ending is seen by the next refresh).
                    wait = wait.min(breaker::REFRESH);
                } else if self.claimed.slots().claimed == 0 && !last_found_none {
                    // Due work that no busy endpoint is holding back: the
                    // last claim's window missed it. Claim again at once.
                    return Woke::Other;
                } else {
                    // Due work the store holds back (a throttle without a
                    // slot yet, a FIFO endpoint's queue behind its head) or
                    // a busy endpoint: look again soon, whether or not a
                    // request finishes, rather than at once (a spin) or
                    // after a whole poll.
                    wait = wait.min(recheck);
                }
            }
            Ok(None) => held_back = false,
            Err(e) => tracing::warn!(error = %e, "cannot read next due time"),
        }
        let freed = async {
            if held_back {
                self.claimed.room.notified().await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            _ = self.wake.notified() => Woke::Other,
            _ = freed => Woke::SlotFreed,
            _ = tokio::time::sleep(wait) => Woke::Other,
            _ = shutdown.cancelled() => Woke::Other,
        }
    }
}

#[cfg(test)]
mod tests;

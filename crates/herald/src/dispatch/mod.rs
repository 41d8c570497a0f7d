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
//! at most as many more claimed deliveries wait for one of them to finish
//! (a prefetch, so that a finished request is followed at once by the next
//! rather than by a database round trip). A stuck endpoint therefore holds
//! at most twice its cap of the process's `max_in_flight` claims; the rest
//! go to endpoints that can use them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use herald_policy::{decide, is_gone, should_disable, Decision, DisableRule, RetryPolicy};
use rand::Rng;
use tokio::sync::{mpsc, Notify, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::ids::{AttemptId, EndpointId};
use crate::operator::Operator;
use crate::store::{
    now_millis, AttemptRecord, ClaimRequest, ClaimedDelivery, Completion, NextState, Store,
    StoreResult, StreakUpdate,
};

pub mod sender;
pub use sender::Sender;

/// After a finished request wakes the idle loop, how long to let others
/// finish before claiming, so claims come in batches.
const CLAIM_GATHER: Duration = Duration::from_millis(1);

#[derive(Debug, PartialEq, Eq)]
enum Woke {
    SlotFreed,
    Other,
}

/// Counts of what one [`Dispatcher::process_batch`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BatchReport {
    pub claimed: usize,
    pub delivered: usize,
    pub retried: usize,
    pub dead: usize,
}

/// Claimed deliveries not yet finished, in total and per endpoint, and
/// each endpoint's gate that lets `endpoint_cap` of them send at once.
struct Claimed {
    slots: Mutex<Slots>,
    /// Signalled whenever a claimed delivery is finished or released, or
    /// reserved slots are given back.
    freed: Notify,
}

#[derive(Default)]
struct Slots {
    per_endpoint: HashMap<EndpointId, (usize, Arc<Semaphore>)>,
    /// Registered deliveries, over all endpoints.
    claimed: usize,
    /// Slots promised to a claim (of the loop, or of an ingest batch's
    /// handoff) whose deliveries are not registered yet.
    reserved: usize,
    /// Shutting down: no more reservations.
    closed: bool,
}

impl Claimed {
    fn slots(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reserves up to `want` of the `max` slots that are neither claimed
    /// nor reserved, and returns how many with each endpoint's count of
    /// claimed deliveries. Reserving is what keeps the loop's claims and
    /// ingest's handoffs from both filling the same free slots.
    fn reserve(&self, max: usize, want: usize) -> (usize, HashMap<EndpointId, usize>) {
        let mut slots = self.slots();
        let taken = slots.claimed + slots.reserved;
        let n = if slots.closed {
            0
        } else {
            max.saturating_sub(taken).min(want)
        };
        slots.reserved += n;
        let counts = slots
            .per_endpoint
            .iter()
            .map(|(k, (n, _))| (k.clone(), *n))
            .collect();
        (n, counts)
    }

    /// Gives back `n` reserved slots (those used were registered by `add`
    /// meanwhile). `max`: wake the loop if it may be waiting for a slot,
    /// that is if all `max` were taken before.
    fn unreserve(&self, n: usize, max: Option<usize>) {
        if n == 0 {
            return;
        }
        let was_full = {
            let mut slots = self.slots();
            let taken = slots.claimed + slots.reserved;
            slots.reserved -= n;
            max.is_some_and(|max| taken >= max)
        };
        if was_full {
            self.freed.notify_one();
        }
    }

    /// Claimed or reserved, in all.
    fn busy(&self) -> usize {
        let slots = self.slots();
        slots.claimed + slots.reserved
    }

    fn close(&self) {
        self.slots().closed = true;
    }

    /// Registers a claimed delivery; returns its endpoint's gate.
    fn add(&self, ep: &EndpointId, cap: usize) -> Arc<Semaphore> {
        let mut slots = self.slots();
        slots.claimed += 1;
        let entry = slots
            .per_endpoint
            .entry(ep.clone())
            .or_insert_with(|| (0, Arc::new(Semaphore::new(cap))));
        entry.0 += 1;
        entry.1.clone()
    }

    fn remove(&self, ep: &EndpointId) {
        {
            let mut slots = self.slots();
            slots.claimed -= 1;
            if let Some(entry) = slots.per_endpoint.get_mut(ep) {
                entry.0 -= 1;
                if entry.0 == 0 {
                    slots.per_endpoint.remove(ep);
                }
            }
        }
        self.freed.notify_one();
    }
}

pub struct Dispatcher {
    store: Arc<dyn Store>,
    sender: Sender,
    policy: RetryPolicy,
    lease: Duration,
    poll_interval: Duration,
    max_in_flight: usize,
    endpoint_cap: usize,
    claimed: Claimed,
    /// Signalled when new work may be due: a commit, a replay, a retry.
    wake: Arc<Notify>,
    disable_rule: DisableRule,
    operator: Operator,
    /// Attempt counters and durations, labelled by endpoint (bounded).
    metrics: crate::metrics::AttemptMetrics,
    /// Set while [`Dispatcher::run`] runs: where ingest's handoffs go.
    running: OnceLock<(mpsc::WeakSender<Completion>, CancellationToken)>,
}

/// Sending slots reserved for one ingest batch's handoff (see
/// [`Dispatcher::reserve_handoff`]): give it back with
/// [`Dispatcher::accept_handoff`] or [`Dispatcher::cancel_handoff`].
#[must_use]
pub struct HandoffTicket {
    reserved: usize,
    in_flight: HashMap<EndpointId, usize>,
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
        Ok(Dispatcher {
            disable_rule: DisableRule {
                after: config.disable_after,
                min_window: config.disable_min_window,
            },
            operator,
            metrics: crate::metrics::AttemptMetrics::new(config.metrics_max_endpoints),
            store,
            sender: Sender::new(config)?,
            policy: config.retry.clone(),
            lease: config.lease,
            poll_interval: config.poll_interval,
            max_in_flight: config.max_in_flight,
            endpoint_cap: config.endpoint_concurrency,
            claimed: Claimed {
                slots: Mutex::new(Slots::default()),
                freed: Notify::new(),
            },
            wake,
            running: OnceLock::new(),
        })
    }

    fn lease_from(&self, now: crate::store::Millis) -> crate::store::Millis {
        now.saturating_add(i64::try_from(self.lease.as_millis()).unwrap_or(i64::MAX))
    }

    async fn claim(
        &self,
        limit: usize,
        per_endpoint: usize,
        in_flight: &HashMap<EndpointId, usize>,
    ) -> StoreResult<Vec<ClaimedDelivery>> {
        let now = now_millis();
        let claimed = self
            .store
            .claim(&ClaimRequest {
                now,
                lease_until: self.lease_from(now),
                limit,
                in_flight,
                endpoint_cap: per_endpoint,
            })
            .await;
        if let Ok(found) = &claimed {
            crate::metrics::claimed(found.len());
        }
        claimed
    }

    /// Reserves free sending slots (at most `want`) so that an ingest batch
    /// can claim its new deliveries in the transaction that stores them and
    /// hand them straight here, sparing a claim transaction and the wait
    /// for it. `None` when the background loop is not running in this
    /// process, is shutting down, or has no free slot.
    pub fn reserve_handoff(&self, want: usize) -> Option<HandoffTicket> {
        self.running.get()?;
        let (reserved, in_flight) = self.claimed.reserve(self.max_in_flight, want);
        if reserved == 0 {
            return None;
        }
        let now = now_millis();
        Some(HandoffTicket {
            reserved,
            in_flight,
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
            for d in claimed {
                self.spawn_delivery(d, &done_tx, shutdown);
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
        let observed = self.sender.send(&d, attempt_number, trusted).await;
        let now = now_millis();
        let age = Duration::from_millis(u64::try_from(now - d.cycle_started_at).unwrap_or(0));
        let in_cycle = attempt_number.saturating_sub(d.cycle_base);
        let jitter_unit: f64 = rand::thread_rng().gen();
        let next = match decide(&self.policy, &observed.outcome, in_cycle, age, jitter_unit) {
            Decision::Delivered => NextState::Delivered,
            Decision::Retry { delay } => NextState::Retry {
                at: now.saturating_add(i64::try_from(delay.as_millis()).unwrap_or(i64::MAX)),
            },
            Decision::Dead(reason) => NextState::Dead(reason),
        };
        self.metrics
            .record_attempt(&d.endpoint_id, &next, observed.duration);
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
                url: d.url,
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
        }
    }

    /// Claims what is due (at most the endpoint cap per endpoint), sends it
    /// all at once, and records every outcome before returning. The
    /// background loop does the same work pipelined; tests call this to
    /// step the engine without sleeping.
    pub async fn process_batch(&self) -> StoreResult<BatchReport> {
        let (free, in_flight) = self.claimed.reserve(self.max_in_flight, self.max_in_flight);
        let claimed = self.claim(free, self.endpoint_cap, &in_flight).await;
        self.claimed.unreserve(free, None);
        let claimed = claimed?;
        let mut report = BatchReport {
            claimed: claimed.len(),
            ..BatchReport::default()
        };
        let completions =
            futures::future::join_all(claimed.into_iter().map(|d| self.attempt(d))).await;
        for c in &completions {
            match c.next {
                NextState::Delivered => report.delivered += 1,
                NextState::Retry { .. } => report.retried += 1,
                NextState::Dead(_) => report.dead += 1,
            }
        }
        let streaks = self.store.complete(&completions).await?;
        self.after_recorded(&completions, &streaks).await;
        Ok(report)
    }

    /// After outcomes are on disk: disables the endpoints the policy says
    /// must be (a failing streak, or 410 Gone), and reports what went dead.
    async fn after_recorded(&self, batch: &[Completion], streaks: &[StreakUpdate]) {
        let now = now_millis();
        for s in streaks.iter().filter(|s| !s.disabled) {
            let gone = batch
                .iter()
                .any(|c| c.attempt.endpoint_id == s.endpoint_id && is_gone(c.attempt.status_code));
            let lasted = Duration::from_millis(
                u64::try_from(now - s.streak_started_at.unwrap_or(now)).unwrap_or(0),
            );
            let Some(cause) = should_disable(&self.disable_rule, gone, s.fail_streak, lasted)
            else {
                continue;
            };
            // A streak is disabled only if no success ended it meanwhile.
            let guard = match cause {
                herald_policy::DisableCause::Gone => None,
                herald_policy::DisableCause::FailingStreak { .. } => s.streak_started_at,
            };
            if let Err(e) = self
                .operator
                .disable(&s.app_id, &s.endpoint_id, &cause.describe(), true, guard)
                .await
            {
                tracing::warn!(error = %e, endpoint = %s.endpoint_id, "could not disable endpoint");
            }
        }
        self.operator.report_dead(batch).await;
    }

    /// The background loop. Returns after `shutdown` once every request in
    /// flight has finished and its outcome has been written, and every
    /// claimed delivery that had not started has been released.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let (done_tx, done_rx) = mpsc::channel::<Completion>(self.max_in_flight.max(64) * 4);
        let completer = tokio::spawn(self.clone().run_completer(done_rx));
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
        while !shutdown.is_cancelled() {
            let (free, in_flight) = self.claimed.reserve(self.max_in_flight, usize::MAX);
            if free == 0 {
                tokio::select! {
                    _ = self.claimed.freed.notified() => {}
                    _ = shutdown.cancelled() => break,
                }
                continue;
            }
            let claimed = self
                .claim(free, per_endpoint, &in_flight)
                .await
                .map(|claimed| {
                    let n = claimed.len();
                    for d in claimed {
                        self.spawn_delivery(d, &done_tx, &shutdown);
                    }
                    n
                });
            // The claimed ones are registered now; the rest is free again.
            self.claimed.unreserve(free, None);
            match claimed {
                Ok(n) => {
                    backoff = Duration::from_millis(50);
                    let full = n == free;
                    if full {
                        continue; // there may be more due right now
                    }
                    // Everything claimable is under way: sleep until that
                    // changes. When a finished request is what woke us, let
                    // others finish too, so the next claim is a batch
                    // rather than one row per finished request.
                    if self.idle_wait(&shutdown).await == Woke::SlotFreed {
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
        // completer write it all down.
        self.claimed.close();
        while self.claimed.busy() > 0 {
            self.claimed.freed.notified().await;
        }
        drop(done_tx);
        if let Err(e) = completer.await {
            tracing::error!(error = %e, "completer task failed");
        }
    }

    /// Sends `d` once its endpoint's gate lets it; at shutdown, a delivery
    /// still waiting at the gate is released instead of sent.
    fn spawn_delivery(
        self: &Arc<Self>,
        d: ClaimedDelivery,
        done_tx: &mpsc::Sender<Completion>,
        shutdown: &CancellationToken,
    ) {
        let gate = self.claimed.add(&d.endpoint_id, self.endpoint_cap);
        let (this, done_tx, shutdown) = (self.clone(), done_tx.clone(), shutdown.clone());
        tokio::spawn(async move {
            let endpoint = d.endpoint_id.clone();
            let permit = tokio::select! {
                biased;
                p = gate.acquire_owned() => p.ok(),
                _ = shutdown.cancelled() => None,
            };
            match permit {
                Some(_permit) => {
                    let completion = this.attempt(d).await;
                    // Fails only when the completer is gone; the lease
                    // then brings the delivery back.
                    let _ = done_tx.send(completion).await;
                }
                None => {
                    if let Err(e) = this
                        .store
                        .release(&d.id, &d.lease_token, now_millis())
                        .await
                    {
                        tracing::warn!(error = %e, delivery = %d.id, "release failed; the lease will expire");
                    }
                }
            }
            this.claimed.remove(&endpoint);
        });
    }

    /// Nothing claimable now: sleep until new work, the next known due
    /// time, the poll, or, when due work is held back by busy endpoints, a
    /// freed slot (such an endpoint may have room again).
    async fn idle_wait(&self, shutdown: &CancellationToken) -> Woke {
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
                } else if self.claimed.slots().claimed == 0 {
                    // Due work that no busy endpoint is holding back: the
                    // last claim's window missed it. Claim again at once.
                    return Woke::Other;
                }
            }
            Ok(None) => held_back = false,
            Err(e) => tracing::warn!(error = %e, "cannot read next due time"),
        }
        let freed = async {
            if held_back {
                self.claimed.freed.notified().await;
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

impl Dispatcher {
    /// Writes outcomes in batches: whatever queued up while the previous
    /// batch was being written goes into the next transaction.
    async fn run_completer(self: Arc<Self>, mut rx: mpsc::Receiver<Completion>) {
        const MAX_BATCH: usize = 2000;
        let mut batch = Vec::with_capacity(MAX_BATCH);
        while let Some(first) = rx.recv().await {
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(c) => batch.push(c),
                    Err(_) => break,
                }
            }
            let mut delay = Duration::from_millis(20);
            for attempt in 1..=30 {
                match self.store.complete(&batch).await {
                    Ok(streaks) => {
                        self.after_recorded(&batch, &streaks).await;
                        break;
                    }
                    Err(e) if attempt == 30 => {
                        // Leases bring these deliveries back: at least once holds.
                        tracing::error!(error = %e, count = batch.len(), "giving up recording outcomes; leases will expire");
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, retry_in = ?delay, "recording outcomes failed; retrying");
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(5));
                    }
                }
            }
            // A retry may now be the earliest due work: let the loop re-plan.
            if batch
                .iter()
                .any(|c| matches!(c.next, NextState::Retry { .. }))
            {
                self.wake.notify_one();
            }
            batch.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claimed() -> Claimed {
        Claimed {
            slots: Mutex::new(Slots::default()),
            freed: Notify::new(),
        }
    }

    #[test]
    fn reservations_and_claims_share_the_free_slots() {
        let c = claimed();
        let ep = EndpointId::generate();
        let _gate = c.add(&ep, 2);
        // One of four slots is claimed; a batch asks for more than is left.
        let (first, counts) = c.reserve(4, 10);
        assert_eq!(first, 3);
        assert_eq!(counts.get(&ep), Some(&1));
        // Nothing is left for the loop or another batch until they settle.
        assert_eq!(c.reserve(4, 10).0, 0);
        assert_eq!(c.busy(), 4);
        // The batch used one slot (registered) and gives its three back.
        let _gate = c.add(&ep, 2);
        c.unreserve(first, Some(4));
        assert_eq!(c.busy(), 2);
        use futures::FutureExt;
        assert!(
            c.freed.notified().now_or_never().is_some(),
            "all slots were taken: the loop may be waiting and is woken"
        );
        assert_eq!(c.reserve(4, 1).0, 1, "at most what is asked for");
        c.unreserve(1, Some(4));
        assert!(
            c.freed.notified().now_or_never().is_none(),
            "slots were free all along: the loop is not woken for nothing"
        );
    }

    #[test]
    fn a_closed_dispatcher_reserves_nothing() {
        let c = claimed();
        c.close();
        assert_eq!(c.reserve(4, 4).0, 0);
        assert_eq!(c.busy(), 0);
    }
}

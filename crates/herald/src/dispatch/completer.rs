//! The completer: gathers finished attempts and writes them in batches
//! (`Dispatcher::record_until` splits a batch the store refuses), then
//! acts on what was written (`Dispatcher::after_recorded`).

use super::*;

impl Dispatcher {
    /// Writes outcomes in batches: whatever queued up while the previous
    /// batch was being written goes into the next transaction (see
    /// [`Dispatcher::record_until`]). After `give_up`, what is still queued
    /// is logged as not written, and the completer stops.
    pub(super) async fn run_completer(
        self: Arc<Self>,
        mut rx: mpsc::Receiver<Finished>,
        give_up: CancellationToken,
    ) {
        const MAX_BATCH: usize = 2000;
        let mut batch = Vec::with_capacity(MAX_BATCH);
        loop {
            let mut ordered = false;
            let first = tokio::select! {
                biased;
                first = rx.recv() => first,
                // Some sender is stuck (its store call does not return).
                _ = give_up.cancelled() => None,
            };
            let Some(first) = first else { break };
            ordered |= first.ordered;
            batch.push(first.completion);
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(f) => {
                        ordered |= f.ordered;
                        batch.push(f.completion);
                    }
                    Err(_) => break,
                }
            }
            self.record_until(&batch, &give_up).await;
            // A retry may now be the earliest due work, and an ordered
            // endpoint's next delivery claimable (its head's outcome is
            // written): let the loop re-plan.
            if ordered
                || batch
                    .iter()
                    .any(|c| matches!(c.next, NextState::Retry { .. }))
            {
                self.wake.notify_one();
            }
            batch.clear();
        }
        rx.close();
        while let Ok(f) = rx.try_recv() {
            batch.push(f.completion);
        }
        if !batch.is_empty() {
            unrecorded(
                &batch,
                &StoreError::Unavailable("shutting down: no more time to write outcomes".into()),
            );
        }
    }
}

/// `c` as the store may take it when it refused `c` itself: without what
/// the receiver had a say in (the response excerpt, the error text), and
/// saying so. Its status, timing and next state are kept.
pub(super) fn without_receiver_text(c: &Completion) -> Completion {
    let mut plain = c.clone();
    plain.attempt.response = String::new();
    plain.attempt.error = Some(UNSTORABLE_NOTE.to_owned());
    plain
}

/// Outcomes given up on: each is logged with its ids (the attempt is not in
/// the log, the delivery stays as it was until its lease ends) and counted.
pub(super) fn unrecorded(part: &[Completion], error: &StoreError) {
    for c in part {
        tracing::error!(
            delivery = %c.attempt.delivery_id, attempt = %c.attempt.id,
            endpoint = %c.attempt.endpoint_id, error = %error,
            "could not record an outcome; the delivery is left to its lease"
        );
    }
    crate::metrics::completions_unrecorded(part.len());
}

impl Dispatcher {
    /// Writes a batch of outcomes as the completer does, then acts on what
    /// was written (see [`Dispatcher::after_recorded`]).
    pub async fn record(&self, batch: &[Completion]) -> RecordReport {
        self.record_until(batch, &CancellationToken::new()).await
    }

    /// Writes `batch` so that no row holds back the others: a batch the
    /// store refuses is split in halves until the row it refuses is alone
    /// (one such row costs O(log n) transactions), and that row is written
    /// without the receiver's text if the store takes it so. A store that
    /// cannot be reached is retried with backoff for at most one lease (by
    /// then the deliveries are claimable again anyway), and not after
    /// `give_up`. Whatever is not written is logged and counted, never
    /// dropped in silence.
    async fn record_until(
        &self,
        batch: &[Completion],
        give_up: &CancellationToken,
    ) -> RecordReport {
        let mut report = RecordReport::default();
        let until = tokio::time::Instant::now() + self.lease;
        // Parts still to write, the next on top.
        let mut parts: Vec<&[Completion]> = vec![batch];
        while let Some(part) = parts.pop() {
            let error = match self.write(part, until, give_up).await {
                Ok(done) => {
                    self.after_recorded(part, &done).await;
                    report.recorded += part.len();
                    continue;
                }
                Err(Unwritten::Refused(e)) if part.len() > 1 => {
                    tracing::warn!(error = %e, count = part.len(), "the store refused a batch of outcomes; writing it in halves");
                    let (first, second) = part.split_at(part.len() / 2);
                    parts.push(second);
                    parts.push(first);
                    continue;
                }
                Err(Unwritten::Refused(e)) => {
                    let plain = [without_receiver_text(&part[0])];
                    match self.write(&plain, until, give_up).await {
                        Ok(done) => {
                            tracing::warn!(
                                error = %e, delivery = %plain[0].attempt.delivery_id,
                                attempt = %plain[0].attempt.id,
                                "the store refused an outcome; recorded it without the response excerpt and error text"
                            );
                            self.after_recorded(&plain, &done).await;
                            report.degraded += 1;
                            continue;
                        }
                        Err(Unwritten::Refused(e) | Unwritten::Unreachable(e)) => e,
                    }
                }
                Err(Unwritten::Unreachable(e)) => e,
            };
            unrecorded(part, &error);
            // A 410 not recorded disabled nothing: its endpoint must not
            // stay held here (every later claim of it released at once,
            // and claimed again, for as long as the process runs). Its
            // delivery comes back with its lease and is sent again.
            for c in part.iter().filter(|c| is_gone(c.attempt.status_code)) {
                self.claimed.gone_recorded(&c.attempt.endpoint_id);
            }
            report.unrecorded += part.len();
        }
        report
    }

    /// One try at writing `part`, and more while the store is unreachable,
    /// with backoff, until `until` or `give_up`.
    async fn write(
        &self,
        part: &[Completion],
        until: tokio::time::Instant,
        give_up: &CancellationToken,
    ) -> Result<Completed, Unwritten> {
        let mut delay = Duration::from_millis(20);
        loop {
            let written = tokio::select! {
                biased;
                _ = give_up.cancelled() => Err(StoreError::Unavailable("shutting down: no more time to write outcomes".into())),
                _ = tokio::time::sleep_until(until) => Err(StoreError::Unavailable("the store did not take the outcomes within a lease".into())),
                written = self.store.complete_with_circuits(part, self.breakers.rule()) => written,
            };
            match written {
                Ok(done) => return Ok(done),
                Err(e @ StoreError::Unavailable(_)) => {
                    if give_up.is_cancelled() || tokio::time::Instant::now() + delay >= until {
                        return Err(Unwritten::Unreachable(e));
                    }
                    tracing::warn!(error = %e, retry_in = ?delay, count = part.len(), "recording outcomes failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = give_up.cancelled() => {}
                    }
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
                Err(e) => return Err(Unwritten::Refused(e)),
            }
        }
    }

    /// After outcomes are on disk: disables the endpoints the policy says
    /// must be (a failing streak, or 410 Gone), and reports what went dead.
    ///
    /// Only completions that moved their delivery report it dead: a stale
    /// one (the delivery was resent or re-claimed meanwhile) changed
    /// nothing. The streaks, though, count every attempt written, stale or
    /// not: they are the endpoint's answers in a row, not its deliveries'
    /// states, and a stale attempt was as real a request, answered (or not)
    /// by the endpoint, as logged in its attempts and stats buckets. A
    /// success since the streak began still wins: the disable is guarded by
    /// the streak's start.
    async fn after_recorded(&self, batch: &[Completion], done: &Completed) {
        let now = now_millis();
        // Breakers this batch opened or closed: the view knows at once, and
        // so do the operators (once per transition: this batch made it).
        self.breakers.note(&done.circuits, &self.metrics);
        for change in &done.circuits {
            self.operator.circuit_changed(change).await;
        }
        // Disabled elsewhere (another process, or meanwhile): what waits at
        // its gate here is not sent.
        for s in done.streaks.iter().filter(|s| s.disabled) {
            self.claimed.stop(&s.endpoint_id, now);
        }
        for s in done.streaks.iter().filter(|s| !s.disabled) {
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
        // A 410 whose endpoint's streak a later success of the batch ended
        // is not among the streaks; it disables the endpoint all the same.
        let mut gone_unlisted: Vec<&Completion> = batch
            .iter()
            .filter(|c| is_gone(c.attempt.status_code))
            .filter(|c| {
                !done
                    .streaks
                    .iter()
                    .any(|s| s.endpoint_id == c.attempt.endpoint_id)
            })
            .collect();
        gone_unlisted.sort_by(|a, b| {
            a.attempt
                .endpoint_id
                .as_str()
                .cmp(b.attempt.endpoint_id.as_str())
        });
        gone_unlisted.dedup_by(|a, b| a.attempt.endpoint_id == b.attempt.endpoint_id);
        for c in gone_unlisted {
            // The policy's verdict on a 410, as for a listed endpoint.
            let Some(cause) = should_disable(&self.disable_rule, true, 0, Duration::ZERO) else {
                continue;
            };
            let (app, ep) = (&c.attempt.app_id, &c.attempt.endpoint_id);
            if let Err(e) = self
                .operator
                .disable(app, ep, &cause.describe(), true, None)
                .await
            {
                tracing::warn!(error = %e, endpoint = %ep, "could not disable endpoint");
            }
        }
        // Their 410s are recorded and the endpoints disabled (above): the
        // stop marks hold what was claimed before, the store the rest.
        for c in batch.iter().filter(|c| is_gone(c.attempt.status_code)) {
            self.claimed.gone_recorded(&c.attempt.endpoint_id);
        }
        let changed: Vec<&Completion> = batch
            .iter()
            .zip(&done.moved)
            .filter_map(|(c, moved)| moved.then_some(c))
            .collect();
        self.operator.report_attempts(&changed).await;
    }
}

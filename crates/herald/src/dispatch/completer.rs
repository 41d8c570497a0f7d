//! The completer: gathers finished attempts and writes them in batches
//! (`Dispatcher::record_until` splits a batch the store refuses).

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

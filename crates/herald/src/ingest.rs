//! Group commit of new messages: concurrent create-message requests share
//! one transaction (one fsync). Each request is answered only after the
//! commit that holds its message, so a 202 always means "on disk". A batch
//! the store refuses for one of its messages is stored again message by
//! message, so that only that one's request fails.
//!
//! Handoff: when the dispatcher runs in this process and has free slots,
//! the batch's transaction also claims its new deliveries (stored
//! `delivering` under a lease, exactly as a claim leaves them) and they go
//! straight to the dispatcher, without a claim transaction of their own.
//! A crash after the commit leaves them to the lease, like any claim.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Notify};
use tracing::Instrument;

use crate::dispatch::Dispatcher;
use crate::store::{InsertOutcome, NewMessage, Store, StoreError, StoreResult};

/// Messages per batch at most; more wait for the next one.
const MAX_BATCH: usize = 1000;
const BATCHES_IN_FLIGHT: usize = 2;
/// Slots a batch reserves for its handoff, per message: room for a small
/// fan-out; deliveries beyond it are claimed by the dispatcher's loop.
const HANDOFF_PER_MESSAGE: usize = 4;

type Reply = oneshot::Sender<StoreResult<InsertOutcome>>;

#[derive(Clone)]
pub struct Ingest {
    tx: mpsc::Sender<(NewMessage, Reply)>,
}

impl Ingest {
    /// Starts the batching task. `wake` is signalled after each commit that
    /// left deliveries for the dispatcher to claim, so it picks them up at
    /// once; `dispatcher` takes handoffs while its loop runs.
    pub fn start(store: Arc<dyn Store>, wake: Arc<Notify>, dispatcher: Arc<Dispatcher>) -> Self {
        let (tx, rx) = mpsc::channel(MAX_BATCH * 4);
        tokio::spawn(run(store, rx, wake, dispatcher));
        Ingest { tx }
    }

    /// Stores one message (and its deliveries) durably.
    pub async fn submit(&self, message: NewMessage) -> StoreResult<InsertOutcome> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send((message, reply))
            .await
            .map_err(|_| StoreError::Unavailable("ingest is shutting down".into()))?;
        answer
            .await
            .map_err(|_| StoreError::Unavailable("ingest is shutting down".into()))?
    }
}

async fn run(
    store: Arc<dyn Store>,
    mut rx: mpsc::Receiver<(NewMessage, Reply)>,
    wake: Arc<Notify>,
    dispatcher: Arc<Dispatcher>,
) {
    // Two batches may be committing at once: the next one gathers and is
    // queued at the store while the previous one is being written, and the
    // store's own group commit may put both in one transaction.
    let in_flight = Arc::new(tokio::sync::Semaphore::new(BATCHES_IN_FLIGHT));
    while let Some((m, r)) = rx.recv().await {
        // Sized to what is queued: a batch is mostly a few messages, and
        // room for MAX_BATCH of them (hundreds of KB) was fresh memory,
        // page-faulted (and zeroed by the kernel) anew for each batch:
        // 2.7–5.8 % of the samples in a profile of the headline bench.
        let queued = rx.len().min(MAX_BATCH - 1) + 1;
        let mut messages = Vec::with_capacity(queued);
        let mut replies = Vec::with_capacity(queued);
        messages.push(m);
        replies.push(r);
        while messages.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok((m, r)) => {
                    messages.push(m);
                    replies.push(r);
                }
                Err(_) => break,
            }
        }
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        let (store, wake, dispatcher) = (store.clone(), wake.clone(), dispatcher.clone());
        tokio::spawn(async move {
            let _permit = permit;
            match store_batch(store.as_ref(), &wake, &dispatcher, &messages).await {
                Ok(outcomes) => {
                    for (reply, outcome) in replies.into_iter().zip(outcomes) {
                        // The requester may have gone away; the message is stored.
                        let _ = reply.send(Ok(outcome));
                    }
                }
                // One message the store refuses (a value its database
                // cannot hold, such as a NUL in PostgreSQL's text) must not
                // fail the others of its batch: each is stored alone and
                // answered with its own result. An unreachable store fails
                // them all alike.
                Err(e) if messages.len() > 1 && !matches!(e, StoreError::Unavailable(_)) => {
                    for (message, reply) in messages.iter().zip(replies) {
                        let alone = std::slice::from_ref(message);
                        let outcome = store_batch(store.as_ref(), &wake, &dispatcher, alone)
                            .await
                            .and_then(|outcomes| {
                                outcomes.into_iter().next().ok_or_else(|| {
                                    StoreError::Internal("an insert gave no outcome".into())
                                })
                            });
                        let _ = reply.send(outcome);
                    }
                }
                Err(e) => {
                    for reply in replies {
                        let _ = reply.send(Err(e.clone()));
                    }
                }
            }
        });
    }
}

/// Stores `messages` in one transaction, handing what fits to the
/// dispatcher, and wakes it for the rest.
async fn store_batch(
    store: &dyn Store,
    wake: &Notify,
    dispatcher: &Arc<Dispatcher>,
    messages: &[NewMessage],
) -> StoreResult<Vec<InsertOutcome>> {
    let ticket = dispatcher.reserve_handoff(messages.len().saturating_mul(HANDOFF_PER_MESSAGE));
    let span = tracing::trace_span!(
        target: crate::telemetry::TARGET, "ingest.batch",
        messages = messages.len(), handed_off = tracing::field::Empty,
    );
    let stored = match &ticket {
        Some(t) => {
            store
                .insert_messages_claiming(messages, &t.request())
                .instrument(span.clone())
                .await
        }
        None => store
            .insert_messages(messages)
            .instrument(span.clone())
            .await
            .map(|outcomes| (outcomes, Vec::new())),
    };
    if let Ok((_, claimed)) = &stored {
        span.record("handed_off", claimed.len());
    }
    match stored {
        Ok((outcomes, claimed)) => {
            let fanned: usize = outcomes
                .iter()
                .map(|o| match o {
                    InsertOutcome::Inserted { deliveries } => *deliveries,
                    _ => 0,
                })
                .sum();
            let left_to_claim = fanned > claimed.len();
            if let Some(ticket) = ticket {
                dispatcher.accept_handoff(ticket, claimed);
            }
            // Committed: each of these is answered 202. Duplicates (409)
            // were not accepted, so they do not count.
            let inserted = outcomes
                .iter()
                .filter(|o| matches!(o, InsertOutcome::Inserted { .. }))
                .count();
            crate::metrics::messages_ingested(u64::try_from(inserted).unwrap_or(u64::MAX));
            if left_to_claim {
                wake.notify_one();
            }
            Ok(outcomes)
        }
        Err(e) => {
            if let Some(ticket) = ticket {
                dispatcher.cancel_handoff(ticket);
            }
            tracing::warn!(error = %e, count = messages.len(), "ingest batch failed; nothing of it was stored");
            Err(e)
        }
    }
}

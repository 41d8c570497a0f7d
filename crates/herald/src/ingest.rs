//! Group commit of new messages: concurrent create-message requests share
//! one transaction (one fsync). Each request is answered only after the
//! commit that holds its message, so a 202 always means "on disk".

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Notify};

use crate::store::{InsertOutcome, NewMessage, Store, StoreError, StoreResult};

/// Messages per batch at most; more wait for the next one.
const MAX_BATCH: usize = 1000;
const BATCHES_IN_FLIGHT: usize = 2;

type Reply = oneshot::Sender<StoreResult<InsertOutcome>>;

#[derive(Clone)]
pub struct Ingest {
    tx: mpsc::Sender<(NewMessage, Reply)>,
}

impl Ingest {
    /// Starts the batching task. `wake` is signalled after each commit so
    /// the dispatcher picks new deliveries up at once.
    pub fn start(store: Arc<dyn Store>, wake: Arc<Notify>) -> Self {
        let (tx, rx) = mpsc::channel(MAX_BATCH * 4);
        tokio::spawn(run(store, rx, wake));
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
) {
    // Two batches may be committing at once: the next one gathers and is
    // queued at the store while the previous one is being written, and the
    // store's own group commit may put both in one transaction.
    let in_flight = Arc::new(tokio::sync::Semaphore::new(BATCHES_IN_FLIGHT));
    while let Some((m, r)) = rx.recv().await {
        let mut messages = Vec::with_capacity(MAX_BATCH);
        let mut replies = Vec::with_capacity(MAX_BATCH);
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
        let (store, wake) = (store.clone(), wake.clone());
        tokio::spawn(async move {
            let _permit = permit;
            match store.insert_messages(&messages).await {
                Ok(outcomes) => {
                    let any = outcomes.iter().any(
                        |o| matches!(o, InsertOutcome::Inserted { deliveries } if *deliveries > 0),
                    );
                    // Committed: each of these is answered 202. Duplicates
                    // (409) were not accepted, so they do not count.
                    let inserted = outcomes
                        .iter()
                        .filter(|o| matches!(o, InsertOutcome::Inserted { .. }))
                        .count();
                    crate::metrics::messages_ingested(u64::try_from(inserted).unwrap_or(u64::MAX));
                    for (reply, outcome) in replies.into_iter().zip(outcomes) {
                        // The requester may have gone away; the message is stored.
                        let _ = reply.send(Ok(outcome));
                    }
                    if any {
                        wake.notify_one();
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, count = messages.len(), "ingest batch failed; nothing of it was stored");
                    for reply in replies {
                        let _ = reply.send(Err(e.clone()));
                    }
                }
            }
        });
    }
}

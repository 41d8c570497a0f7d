//! Retention: what ages out of the store (history, held deliveries past
//! the age cap, stats buckets, idempotency records, audit log entries).

use super::*;

/// What retention ages out of the store.
#[async_trait]
pub trait Retention: Send + Sync {
    /// Deletes old history in small batches: messages older than
    /// `finished_before` whose deliveries are all delivered (or that have
    /// none), with their deliveries and attempts; and dead deliveries last
    /// changed before `dead_before`, with their attempts (their message
    /// goes too once it has no delivery left and is older than
    /// `finished_before`). At most `batch` messages and `batch` dead
    /// deliveries per call; the caller repeats while `more` is set.
    async fn prune(
        &self,
        finished_before: Millis,
        dead_before: Millis,
        batch: usize,
    ) -> StoreResult<PruneReport>;
    /// Retention's age cap on held deliveries (pending, of a disabled
    /// endpoint): those whose cycle started before `too_old_before` become
    /// dead ("too old"), replayable like any other, as enabling the
    /// endpoint would have made them. At most `batch` per call; returns
    /// how many, and the caller repeats while a batch was full.
    async fn expire_held(
        &self,
        too_old_before: Millis,
        now: Millis,
        batch: usize,
    ) -> StoreResult<u64>;
    /// Drops endpoint stats buckets that started before `before`.
    async fn prune_stats(&self, before: Millis) -> StoreResult<u64>;
    /// Drops idempotency records created before `before`.
    async fn prune_idempotency(&self, before: Millis) -> StoreResult<u64>;
    /// Deletes at most `batch` audit log entries made before `before`,
    /// oldest first; returns how many (the caller repeats while a batch
    /// was full).
    async fn prune_audit(&self, before: Millis, batch: usize) -> StoreResult<u64>;
    /// Erases a message's payload (stored as the empty text from then on;
    /// the message, its deliveries and attempts stay) and, in the same
    /// transaction, makes its pending deliveries dead (`expunged`): none is
    /// ever sent without its payload. One in flight finishes the request
    /// it began; if that fails, the claim that would retry it finds the
    /// payload gone and the dispatcher makes it dead too. None if there is
    /// no such message; else how many deliveries it made dead.
    async fn expunge_message(
        &self,
        app: &AppId,
        msg: &MsgId,
        now: Millis,
    ) -> StoreResult<Option<u64>>;
    /// Erases an attempt's response excerpt. False if there is no such
    /// attempt.
    async fn expunge_attempt(&self, app: &AppId, attempt: &AttemptId) -> StoreResult<bool>;
    /// Payload retention: erases, as [`Retention::expunge_message`] does,
    /// the payloads of at most `batch` messages created before `before`
    /// (oldest first); returns how many.
    async fn expunge_payloads(&self, before: Millis, now: Millis, batch: usize)
        -> StoreResult<u64>;
    /// The same for messages whose own `payloadRetentionPeriod` has ended
    /// by `now` (at most `batch`, soonest first).
    async fn expunge_expired_payloads(&self, now: Millis, batch: usize) -> StoreResult<u64>;
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PruneReport {
    pub messages: u64,
    pub dead_deliveries: u64,
    /// A batch was full: call again.
    pub more: bool,
}

impl PruneReport {
    /// The report of one [`Retention::prune`] batch of `batch`: `messages`
    /// deleted in all and `dead` dead deliveries; `picked` old finished
    /// messages were taken of the `budget` the batch had left for them.
    pub fn of_batch(
        batch: usize,
        messages: usize,
        dead: usize,
        budget: usize,
        picked: usize,
    ) -> Self {
        PruneReport {
            messages: u64::try_from(messages).unwrap_or(u64::MAX),
            dead_deliveries: u64::try_from(dead).unwrap_or(u64::MAX),
            // (No budget left means the dead batch was full.)
            more: dead >= batch || (budget > 0 && picked >= budget),
        }
    }
}

//! Retention on PostgreSQL: pruning history, stats and idempotency
//! records, and the age cap on held deliveries.

use super::*;

#[async_trait]
impl Retention for PostgresStore {
    async fn prune(
        &self,
        finished_before: Millis,
        dead_before: Millis,
        batch: usize,
    ) -> StoreResult<PruneReport> {
        if batch == 0 {
            return Ok(PruneReport::default());
        }
        let limit = i64_of(batch);
        let mut tx = self.pool.begin().await?;

        // Dead deliveries past their retention, oldest first. SKIP LOCKED:
        // one being replayed or resent right now is left alone. Locked by
        // one statement and deleted by the next: as a subquery of the
        // DELETE, the LIMIT may be applied more than once.
        let locked: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM deliveries WHERE state = 3 AND updated_at < $1 \
             ORDER BY updated_at LIMIT $2 FOR UPDATE SKIP LOCKED",
        )
        .bind(dead_before)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        let dead = if locked.is_empty() {
            Vec::new()
        } else {
            sqlx::query("DELETE FROM deliveries WHERE id = ANY($1) RETURNING id, msg_id")
                .bind(&locked)
                .fetch_all(&mut *tx)
                .await?
        };
        let mut dead_ids = Vec::with_capacity(dead.len());
        let mut dead_msgs = Vec::with_capacity(dead.len());
        for r in &dead {
            dead_ids.push(get::<String>(r, "id")?);
            dead_msgs.push(get::<String>(r, "msg_id")?);
        }
        dead_msgs.sort_unstable();
        dead_msgs.dedup();
        let mut messages: Vec<String> = Vec::new();
        if !dead_ids.is_empty() {
            sqlx::query("DELETE FROM attempts WHERE msg_id = ANY($1) AND delivery_id = ANY($2)")
                .bind(&dead_msgs)
                .bind(&dead_ids)
                .execute(&mut *tx)
                .await?;
            // Their messages go too once old enough and left with no
            // delivery. Locked first (one a resend holds is skipped: with
            // no delivery left, a later prune takes it), then checked by a
            // new statement, whose snapshot sees any delivery committed
            // before the lock was taken.
            let locked: Vec<String> = sqlx::query_scalar(
                "SELECT id FROM messages WHERE id = ANY($1) AND created_at < $2 \
                 ORDER BY id FOR UPDATE SKIP LOCKED",
            )
            .bind(&dead_msgs)
            .bind(finished_before)
            .fetch_all(&mut *tx)
            .await?;
            if !locked.is_empty() {
                messages = sqlx::query_scalar(
                    "DELETE FROM messages m WHERE m.id = ANY($1) \
                       AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.msg_id = m.id) \
                     RETURNING m.id",
                )
                .bind(&locked)
                .fetch_all(&mut *tx)
                .await?;
            }
        }

        // Old messages whose deliveries are all delivered (or that have
        // none), oldest first, within what is left of the batch. Locked,
        // then checked again as above; their deliveries go with them.
        let budget = batch.saturating_sub(messages.len());
        let mut taken = 0;
        if budget > 0 {
            let locked: Vec<String> = sqlx::query_scalar(
                "SELECT m.id FROM messages m WHERE m.created_at < $1 \
                   AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.msg_id = m.id AND d.state <> 2) \
                 ORDER BY m.created_at LIMIT $2 FOR UPDATE SKIP LOCKED",
            )
            .bind(finished_before)
            .bind(i64_of(budget))
            .fetch_all(&mut *tx)
            .await?;
            taken = locked.len();
            if !locked.is_empty() {
                let gone: Vec<String> = sqlx::query_scalar(
                    "DELETE FROM messages m WHERE m.id = ANY($1) \
                       AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.msg_id = m.id AND d.state <> 2) \
                     RETURNING m.id",
                )
                .bind(&locked)
                .fetch_all(&mut *tx)
                .await?;
                // No foreign key cascades them (migration 0008); a resend
                // adding one waits on the message's lock, then finds it gone.
                sqlx::query("DELETE FROM deliveries WHERE msg_id = ANY($1)")
                    .bind(&gone)
                    .execute(&mut *tx)
                    .await?;
                messages.extend(gone);
            }
        }
        if !messages.is_empty() {
            // Attempts are history without a foreign key: the message's
            // go with it, including those of endpoints deleted since.
            sqlx::query("DELETE FROM attempts WHERE msg_id = ANY($1)")
                .bind(&messages)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(PruneReport::of_batch(
            batch,
            messages.len(),
            dead_ids.len(),
            budget,
            taken,
        ))
    }

    async fn expire_held(
        &self,
        too_old_before: Millis,
        now: Millis,
        batch: usize,
    ) -> StoreResult<u64> {
        // Per disabled endpoint, a seek into its held deliveries by cycle
        // start (LATERAL: a plain join may be planned as a scan of every
        // delivery). SKIP LOCKED: one being enabled (or resent) right now
        // is left to that; a later pass sees what it became.
        self.expire_too_old(
            "SELECT h.id FROM endpoints e \
             CROSS JOIN LATERAL ( \
                 SELECT d.id FROM deliveries d \
                 WHERE d.held AND d.endpoint_id = e.id AND d.cycle_started_at < $1 \
                 LIMIT $2 FOR UPDATE OF d SKIP LOCKED) h \
             WHERE e.disabled LIMIT $2",
            too_old_before,
            now,
            batch,
        )
        .await
    }

    async fn prune_idempotency(&self, before: Millis) -> StoreResult<u64> {
        self.changed_rows(sqlx::query("DELETE FROM idempotency WHERE created_at < $1").bind(before))
            .await
    }

    async fn prune_stats(&self, before: Millis) -> StoreResult<u64> {
        // SKIP LOCKED: a bucket some transaction holds (an application's
        // deletion, which takes them in its own order) is left to it or to
        // the next round, never waited for.
        self.changed_rows(sqlx::query(
            "DELETE FROM endpoint_stats s USING (SELECT endpoint_id, bucket FROM endpoint_stats \
             WHERE bucket < $1 FOR UPDATE SKIP LOCKED) AS old \
             WHERE s.endpoint_id = old.endpoint_id AND s.bucket = old.bucket",
        )
        .bind(before)).await
    }

    async fn prune_audit(&self, before: Millis, batch: usize) -> StoreResult<u64> {
        if batch == 0 {
            return Ok(0);
        }
        self.changed_rows(
            sqlx::query(
                "DELETE FROM audit_log WHERE id IN \
             (SELECT id FROM audit_log WHERE at < $1 ORDER BY at LIMIT $2)",
            )
            .bind(before)
            .bind(i64_of(batch)),
        )
        .await
    }

    async fn expunge_message(
        &self,
        app: &AppId,
        msg: &MsgId,
        now: Millis,
    ) -> StoreResult<Option<u64>> {
        let mut tx = self.pool.begin().await?;
        // The message first, then its deliveries: the store's lock order.
        let found = sqlx::query(
            "UPDATE messages SET payload = '', expunged_at = COALESCE(expunged_at, $3) \
             WHERE id = $1 AND app_id = $2",
        )
        .bind(msg.as_str())
        .bind(app.as_str())
        .bind(now)
        .execute(&mut *tx)
        .await?;
        if found.rows_affected() == 0 {
            tx.rollback().await?;
            return Ok(None);
        }
        let dead = kill_pending_of(&mut tx, &[msg.as_str().to_owned()], now).await?;
        tx.commit().await?;
        Ok(Some(dead))
    }

    async fn expunge_attempt(&self, app: &AppId, attempt: &AttemptId) -> StoreResult<bool> {
        let done = sqlx::query("UPDATE attempts SET response = '' WHERE id = $1 AND app_id = $2")
            .bind(attempt.as_str())
            .bind(app.as_str())
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn expunge_payloads(
        &self,
        before: Millis,
        now: Millis,
        batch: usize,
    ) -> StoreResult<u64> {
        self.expunge_picked(
            "SELECT id FROM messages WHERE created_at < $1 AND expunged_at IS NULL \
             AND payload_expires_at IS NULL \
             ORDER BY created_at LIMIT $3 FOR UPDATE SKIP LOCKED",
            before,
            now,
            batch,
        )
        .await
    }

    async fn expunge_expired_payloads(&self, now: Millis, batch: usize) -> StoreResult<u64> {
        self.expunge_picked(
            "SELECT id FROM messages WHERE payload_expires_at <= $1 AND expunged_at IS NULL \
             ORDER BY payload_expires_at LIMIT $3 FOR UPDATE SKIP LOCKED",
            now,
            now,
            batch,
        )
        .await
    }
}

/// Makes the pending deliveries of `msgs` dead (`expunged`).
async fn kill_pending_of(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    msgs: &[String],
    now: Millis,
) -> StoreResult<u64> {
    let done = sqlx::query(
        "UPDATE deliveries SET state = 3, dead_reason = 'expunged', lease_token = NULL, \
         held = FALSE, parked = FALSE, updated_at = $2 WHERE msg_id = ANY($1::text[]) AND state = 0",
    )
    .bind(msgs)
    .bind(now)
    .execute(&mut **tx)
    .await?;
    Ok(done.rows_affected())
}

impl PostgresStore {
    /// The age cap (see `Retention::expire_held`): makes dead ("too old")
    /// the pending deliveries `picked` selects by id and locks (`$1`:
    /// `too_old_before`, `$2`: at most `batch`), as enabling their
    /// endpoint would; how many.
    pub(super) async fn expire_too_old(
        &self,
        picked: &str,
        too_old_before: Millis,
        now: Millis,
        batch: usize,
    ) -> StoreResult<u64> {
        if batch == 0 {
            return Ok(0);
        }
        self.changed_rows(
            sqlx::query(AssertSqlSafe(format!(
                "WITH old AS MATERIALIZED ({picked}) \
                 UPDATE deliveries d SET state = 3, dead_reason = 'too_old', held = FALSE, \
                        parked = FALSE, next_attempt_at = $3, updated_at = $3 \
                 FROM old WHERE d.id = old.id"
            )))
            .bind(too_old_before)
            .bind(i64_of(batch))
            .bind(now),
        )
        .await
    }

    /// Expunges the messages `select` picks (`$1`: `bound`, `$3`: `batch`;
    /// `$2`, the time, is the update's).
    async fn expunge_picked(
        &self,
        select: &'static str,
        bound: Millis,
        now: Millis,
        batch: usize,
    ) -> StoreResult<u64> {
        let mut tx = self.pool.begin().await?;
        let ids: Vec<String> = sqlx::query_scalar(AssertSqlSafe(format!(
            "UPDATE messages SET payload = '', expunged_at = $2 WHERE id IN ({select}) RETURNING id"
        )))
        .bind(bound)
        .bind(now)
        .bind(i64::try_from(batch).unwrap_or(i64::MAX))
        .fetch_all(&mut *tx)
        .await?;
        if !ids.is_empty() {
            kill_pending_of(&mut tx, &ids, now).await?;
        }
        tx.commit().await?;
        Ok(ids.len() as u64)
    }
}

//! Retention on SQLite: pruning history, stats and idempotency records,
//! and the age cap on held deliveries.

use super::*;

/// One batch of retention (see `Retention::prune`), in the writer's
/// transaction. Dead deliveries go first, so a message whose only
/// unfinished delivery was one of them can go in the same call.
fn prune_tx(
    conn: &Connection,
    finished_before: Millis,
    dead_before: Millis,
    batch: usize,
) -> StoreResult<PruneReport> {
    let limit = i64::try_from(batch).unwrap_or(i64::MAX);
    let mut dead = Vec::new();
    {
        let mut stmt = conn.prepare_cached(
            "SELECT id, msg_id FROM deliveries WHERE state = 3 AND updated_at < ?1 \
                 ORDER BY updated_at LIMIT ?2",
        )?;
        let mut rs = stmt.query(params![dead_before, limit])?;
        while let Some(r) = rs.next()? {
            dead.push((get::<String>(r, "id")?, get::<String>(r, "msg_id")?));
        }
    }
    let mut delete_attempts_of_delivery =
        conn.prepare_cached("DELETE FROM attempts WHERE msg_id = ?1 AND delivery_id = ?2")?;
    let mut delete_delivery = conn.prepare_cached("DELETE FROM deliveries WHERE id = ?1")?;
    // Attempts are history without a foreign key: a message's go with it,
    // including those of endpoints deleted since.
    let mut delete_attempts_of_message =
        conn.prepare_cached("DELETE FROM attempts WHERE msg_id = ?1")?;
    let mut delete_orphan = conn.prepare_cached(
        "DELETE FROM messages WHERE id = ?1 AND created_at < ?2 \
               AND NOT EXISTS (SELECT 1 FROM deliveries WHERE msg_id = ?1)",
    )?;
    let mut messages: usize = 0;
    for (id, msg) in &dead {
        delete_attempts_of_delivery.execute(params![msg, id])?;
        delete_delivery.execute(params![id])?;
    }
    let mut dead_msgs: Vec<&String> = dead.iter().map(|(_, m)| m).collect();
    dead_msgs.sort_unstable();
    dead_msgs.dedup();
    for msg in dead_msgs {
        if delete_orphan.execute(params![msg, finished_before])? == 1 {
            delete_attempts_of_message.execute(params![msg])?;
            messages += 1;
        }
    }

    // Old messages whose deliveries are all delivered (or that have none),
    // oldest first, within what is left of the batch.
    let budget = batch.saturating_sub(messages);
    let mut finished = Vec::new();
    if budget > 0 {
        let mut stmt = conn
            .prepare_cached(
                "SELECT id FROM messages m WHERE created_at < ?1 \
                   AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.msg_id = m.id AND d.state <> 2) \
                 ORDER BY created_at LIMIT ?2",
            )?;
        let mut rs = stmt.query(params![
            finished_before,
            i64::try_from(budget).unwrap_or(i64::MAX)
        ])?;
        while let Some(r) = rs.next()? {
            finished.push(get::<String>(r, "id")?);
        }
    }
    let mut delete_deliveries_of_message =
        conn.prepare_cached("DELETE FROM deliveries WHERE msg_id = ?1")?;
    let mut delete_message = conn.prepare_cached("DELETE FROM messages WHERE id = ?1")?;
    for msg in &finished {
        delete_attempts_of_message.execute(params![msg])?;
        delete_deliveries_of_message.execute(params![msg])?;
        delete_message.execute(params![msg])?;
    }
    messages += finished.len();
    Ok(PruneReport::of_batch(
        batch,
        messages,
        dead.len(),
        budget,
        finished.len(),
    ))
}

#[async_trait]
impl Retention for SqliteStore {
    async fn prune(
        &self,
        finished_before: Millis,
        dead_before: Millis,
        batch: usize,
    ) -> StoreResult<PruneReport> {
        if batch == 0 {
            return Ok(PruneReport::default());
        }
        self.write(move |c| securely(c, || prune_tx(c, finished_before, dead_before, batch)))
            .await
    }

    async fn expire_held(
        &self,
        too_old_before: Millis,
        now: Millis,
        batch: usize,
    ) -> StoreResult<u64> {
        // Per disabled endpoint, one seek into its held deliveries by
        // cycle start, whatever else is held.
        self.expire_too_old(
            "SELECT d.id FROM endpoints e INDEXED BY endpoints_disabled \
             JOIN deliveries d INDEXED BY deliveries_held ON d.endpoint_id = e.id \
             WHERE e.disabled = 1 AND d.parked = 2 AND d.cycle_started_at < ?2 \
             LIMIT ?3",
            too_old_before,
            now,
            batch,
        )
        .await
    }

    async fn prune_idempotency(&self, before: Millis) -> StoreResult<u64> {
        self.changed_rows("DELETE FROM idempotency WHERE created_at < ?1", (before,))
            .await
    }

    async fn prune_stats(&self, before: Millis) -> StoreResult<u64> {
        self.changed_rows("DELETE FROM endpoint_stats WHERE bucket < ?1", (before,))
            .await
    }

    async fn prune_audit(&self, before: Millis, batch: usize) -> StoreResult<u64> {
        if batch == 0 {
            return Ok(0);
        }
        let limit = i64::try_from(batch).unwrap_or(i64::MAX);
        self.changed_rows(
            "DELETE FROM audit_log WHERE id IN \
             (SELECT id FROM audit_log WHERE at < ?1 ORDER BY at LIMIT ?2)",
            (before, limit),
        )
        .await
    }

    async fn expunge_message(
        &self,
        app: &AppId,
        msg: &MsgId,
        now: Millis,
    ) -> StoreResult<Option<u64>> {
        let (app, msg) = (app.as_str().to_owned(), msg.as_str().to_owned());
        self.write(move |c| {
            let found = c
                .query_row(
                    "SELECT 1 FROM messages WHERE id = ?1 AND app_id = ?2",
                    params![msg, app],
                    |_| Ok(()),
                )
                .optional()?;
            if found.is_none() {
                return Ok(None);
            }
            Ok(Some(securely(c, || expunge_tx(c, &msg, now))?))
        })
        .await
    }

    async fn expunge_attempt(&self, app: &AppId, attempt: &AttemptId) -> StoreResult<bool> {
        let (app, attempt) = (app.as_str().to_owned(), attempt.as_str().to_owned());
        self.write(move |c| {
            let n = securely(c, || {
                c.execute(
                    "UPDATE attempts SET response = '' WHERE id = ?1 AND app_id = ?2",
                    params![attempt, app],
                )
                .map_err(map_err)
            })?;
            Ok(n == 1)
        })
        .await
    }

    async fn expunge_payloads(
        &self,
        before: Millis,
        now: Millis,
        batch: usize,
    ) -> StoreResult<u64> {
        let limit = i64::try_from(batch).unwrap_or(i64::MAX);
        self.write(move |c| {
            expunge_picked(
                c,
                "SELECT id FROM messages WHERE created_at < ?1 AND expunged_at IS NULL \
                 AND payload_expires_at IS NULL \
                 ORDER BY created_at LIMIT ?2",
                before,
                limit,
                now,
            )
        })
        .await
    }

    async fn expunge_expired_payloads(&self, now: Millis, batch: usize) -> StoreResult<u64> {
        let limit = i64::try_from(batch).unwrap_or(i64::MAX);
        self.write(move |c| {
            expunge_picked(
                c,
                "SELECT id FROM messages WHERE payload_expires_at <= ?1 AND expunged_at IS NULL \
                 ORDER BY payload_expires_at LIMIT ?2",
                now,
                limit,
                now,
            )
        })
        .await
    }
}

impl SqliteStore {
    /// The age cap (see `Retention::expire_held`): makes dead ("too old")
    /// the pending deliveries `picked` selects by id (`?2`:
    /// `too_old_before`, `?3`: at most `batch`), as enabling their
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
        let limit = i64::try_from(batch).unwrap_or(i64::MAX);
        self.changed_rows(
            format!(
                "UPDATE deliveries SET state = 3, dead_reason = 'too_old', parked = 0, \
                 next_attempt_at = ?1, updated_at = ?1 WHERE id IN ({picked})"
            ),
            (now, too_old_before, limit),
        )
        .await
    }
}

/// Empties a message's payload and makes its pending deliveries dead.
fn expunge_tx(c: &Connection, msg: &str, now: Millis) -> StoreResult<u64> {
    c.execute(
        "UPDATE messages SET payload = '', expunged_at = COALESCE(expunged_at, ?2) WHERE id = ?1",
        params![msg, now],
    )?;
    let dead = c.execute(
        "UPDATE deliveries SET state = 3, dead_reason = 'expunged', lease_token = NULL, \
             parked = 0, updated_at = ?2 WHERE msg_id = ?1 AND state = 0",
        params![msg, now],
    )?;
    Ok(dead as u64)
}

/// Expunges the messages `select` picks (`?1`: `bound`, `?2`: `limit`).
fn expunge_picked(
    c: &Connection,
    select: &str,
    bound: Millis,
    limit: i64,
    now: Millis,
) -> StoreResult<u64> {
    let ids: Vec<String> = {
        let mut stmt = c.prepare_cached(select)?;
        let found = stmt
            .query_map(params![bound, limit], |r| r.get(0))?
            .collect::<Result<Vec<String>, _>>()?;
        found
    };
    securely(c, || {
        for id in &ids {
            expunge_tx(c, id, now)?;
        }
        Ok(())
    })?;
    Ok(ids.len() as u64)
}

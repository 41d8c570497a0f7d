//! Replays of dead deliveries and resends on PostgreSQL.

use super::*;

/// A fresh retry cycle, due now (`$1`), asked for by an operator.
/// A new cycle; `queued_at` cleared, so a FIFO endpoint's claim queues it
/// again at its `updated_at`: the back of the queue.
const REPLAY_SET: &str =
    "state = 0, next_attempt_at = $1, cycle_started_at = $1, cycle_base = attempts, \
     manual = TRUE, lease_token = NULL, dead_reason = NULL, parked = FALSE, updated_at = $1, \
     queued_at = NULL";

#[async_trait]
impl Replay for PostgresStore {
    async fn replay_dead_matching(
        &self,
        filter: &DeadFilter,
        ids: Option<&[DeliveryId]>,
        limit: usize,
        now: Millis,
    ) -> StoreResult<u64> {
        // $1 is REPLAY_SET's time, the filter's follow, then the id list,
        // then the channel.
        let (mut cond, args) = postgres_where(filter.conditions(Dialect::Postgres { first: 2 }));
        // Nothing is sent for an expunged message: its dead stay dead.
        cond.push_str(" AND m.payload <> ''");
        let mut next = args.len() + 2;
        if ids.is_some() {
            cond.push_str(&format!(" AND d.id = ANY(${next}::text[])"));
            next += 1;
        }
        // A sweep over a filter leaves rows another replay holds to it; named
        // deliveries wait for that replay and are then seen no longer dead.
        let skip = if ids.is_none() { "SKIP LOCKED" } else { "" };
        let sql = waking(
            &format!(
                "UPDATE deliveries SET {REPLAY_SET} WHERE id IN (SELECT d.id FROM deliveries d \
                 JOIN messages m ON m.id = d.msg_id WHERE {cond} LIMIT {limit} FOR UPDATE OF d {skip}) \
                 RETURNING TRUE AS wakes"
            ),
            next,
        );
        let mut query = sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql)).bind(now);
        for a in args {
            query = query.bind(a);
        }
        if let Some(ids) = ids {
            query = query.bind(
                ids.iter()
                    .map(|i| i.as_str().to_owned())
                    .collect::<Vec<_>>(),
            );
        }
        let n = query.bind(&self.wake_channel).fetch_one(&self.pool).await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn deliver_missing(
        &self,
        app: &AppId,
        ep: &EndpointId,
        window: (Millis, Millis),
        after: &MsgId,
        limit: usize,
        now: Millis,
    ) -> StoreResult<Option<MissingBatch>> {
        let mut tx = self.pool.begin().await?;
        // NO KEY UPDATE on the endpoint serialises replay-missing of one
        // endpoint (ingest's KEY SHARE is not held up); SHARE on the
        // messages serialises it with resends of them (NO KEY UPDATE).
        // Endpoint, then messages, then deliveries: the store's lock order.
        let routing = sqlx::query(
            "SELECT filter_types::text AS filter_types, channels FROM endpoints \
             WHERE id = $1 AND app_id = $2 FOR NO KEY UPDATE",
        )
        .bind(ep.as_str())
        .bind(app.as_str())
        .fetch_optional(&mut *tx)
        .await?;
        let Some(routing) = routing else {
            tx.rollback().await?;
            return Ok(None);
        };
        let sub = Subscriber::from_stored(
            ep.as_str().to_owned(),
            get::<Option<String>>(&routing, "filter_types")?.as_deref(),
            get::<Option<String>>(&routing, "channels")?.as_deref(),
        )?;
        let looked: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM messages WHERE app_id = $1 AND id > $2 \
               AND created_at >= $3 AND created_at < $4 ORDER BY id LIMIT $5 FOR SHARE",
        )
        .bind(app.as_str())
        .bind(after.as_str())
        .bind(window.0)
        .bind(window.1)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&mut *tx)
        .await?;
        // A statement of its own, so its snapshot sees every delivery
        // committed before the locks above were granted.
        let missing = sqlx::query(
            "SELECT m.id, m.event_type, m.channels FROM messages m WHERE m.id = ANY($1::text[]) \
               AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.endpoint_id = $2 AND d.msg_id = m.id)",
        )
        .bind(&looked)
        .bind(ep.as_str())
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(|r| Ok((get(r, "id")?, get(r, "event_type")?, get(r, "channels")?)))
        .collect::<StoreResult<Vec<_>>>()?;
        let wanted = wanted_by(&sub, missing)?;
        if !wanted.is_empty() {
            insert_manual(&mut tx, &wanted, ep, app, now).await?;
            self.notify_in(&mut tx).await?;
        }
        tx.commit().await?;
        Ok(Some(MissingBatch {
            delivered: wanted.len() as u64,
            last: looked.last().cloned().map(MsgId::from_trusted),
        }))
    }

    async fn resend(
        &self,
        app: &AppId,
        msg: &MsgId,
        ep: &EndpointId,
        now: Millis,
    ) -> StoreResult<ResendOutcome> {
        let mut tx = self.pool.begin().await?;
        // KEY SHARE on the endpoint keeps it from being deleted meanwhile;
        // NO KEY UPDATE on the message serialises resends of it, so two at
        // once cannot both find no delivery and both create one. Endpoint
        // first: the lock order deleting an application takes them in.
        let has_ep =
            sqlx::query("SELECT 1 FROM endpoints WHERE id = $1 AND app_id = $2 FOR KEY SHARE")
                .bind(ep.as_str())
                .bind(app.as_str())
                .fetch_optional(&mut *tx)
                .await?
                .is_some();
        let msg_row = sqlx::query(
            "SELECT payload = '' AS expunged FROM messages WHERE id = $1 AND app_id = $2 FOR NO KEY UPDATE",
        )
        .bind(msg.as_str())
        .bind(app.as_str())
        .fetch_optional(&mut *tx)
        .await?;
        let has_msg = msg_row.is_some();
        if let Some(row) = &msg_row {
            if get::<bool>(row, "expunged")? {
                tx.rollback().await?;
                return Ok(ResendOutcome::Expunged);
            }
        }
        if !has_msg || !has_ep {
            tx.rollback().await?;
            return Ok(if has_msg {
                ResendOutcome::NoSuchEndpoint
            } else {
                ResendOutcome::NoSuchMessage
            });
        }
        // Reuse the delivery so the Idempotency-Key stays the same. Not
        // one that is delivering: its attempt is in flight, and a resend
        // would send it again beside it (see `ResendOutcome::InFlight`). A
        // claim committing meanwhile holds the row's lock: the update
        // waits for it and then finds the row delivering.
        let done = sqlx::query(AssertSqlSafe(format!(
            "UPDATE deliveries SET {REPLAY_SET} WHERE msg_id = $2 AND endpoint_id = $3 AND state <> 1"
        )))
        .bind(now)
        .bind(msg.as_str())
        .bind(ep.as_str())
        .execute(&mut *tx)
        .await?;
        let in_flight = done.rows_affected() == 0
            && sqlx::query("SELECT 1 FROM deliveries WHERE msg_id = $1 AND endpoint_id = $2")
                .bind(msg.as_str())
                .bind(ep.as_str())
                .fetch_optional(&mut *tx)
                .await?
                .is_some();
        if in_flight {
            tx.rollback().await?;
            return Ok(ResendOutcome::InFlight);
        }
        if done.rows_affected() == 0 {
            insert_manual(&mut tx, &[msg.as_str().to_owned()], ep, app, now).await?;
        }
        self.notify_in(&mut tx).await?;
        tx.commit().await?;
        Ok(ResendOutcome::Queued)
    }
}

/// New manual deliveries of `msgs` to `ep`: pending, due `now`, in a fresh
/// cycle (a resend, or a replay of missing ones).
async fn insert_manual(
    tx: &mut sqlx::PgConnection,
    msgs: &[String],
    ep: &EndpointId,
    app: &AppId,
    now: Millis,
) -> StoreResult<()> {
    let ids: Vec<String> = msgs
        .iter()
        .map(|_| DeliveryId::generate().into_string())
        .collect();
    sqlx::query(
        "INSERT INTO deliveries (id, msg_id, endpoint_id, app_id, state, next_attempt_at, \
         cycle_started_at, manual, created_at, updated_at) \
         SELECT id, msg_id, $3, $4, 0, $5, $5, TRUE, $5, $5 \
         FROM UNNEST($1::text[], $2::text[]) AS u(id, msg_id)",
    )
    .bind(&ids)
    .bind(msgs)
    .bind(ep.as_str())
    .bind(app.as_str())
    .bind(now)
    .execute(tx)
    .await?;
    Ok(())
}

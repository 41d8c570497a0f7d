//! Replays of dead deliveries and resends on SQLite.

use super::*;

/// A new cycle; `queued_at` cleared, so a FIFO endpoint's claim queues it
/// again at its `updated_at`: the back of the queue.
pub(super) const REPLAY_SET: &str =
    "state = 0, next_attempt_at = ?1, cycle_started_at = ?1, cycle_base = attempts, \
     manual = 1, lease_token = NULL, dead_reason = NULL, parked = 0, updated_at = ?1, \
     queued_at = NULL";

#[async_trait]
impl Replay for SqliteStore {
    async fn replay_dead_matching(
        &self,
        filter: &DeadFilter,
        ids: Option<&[DeliveryId]>,
        limit: usize,
        now: Millis,
    ) -> StoreResult<u64> {
        let (mut cond, filter_args) = sqlite_where(filter.conditions(Dialect::Sqlite));
        // Nothing is sent for an expunged message: its dead stay dead.
        cond.push_str(" AND m.payload <> ''");
        let mut args: Vec<Value> = vec![now.into()];
        args.extend(filter_args);
        if let Some(ids) = ids {
            let list: Vec<&str> = ids.iter().map(|i| i.as_str()).collect();
            cond.push_str(" AND d.id IN (SELECT value FROM json_each(?))");
            args.push(to_json(&list)?.into());
        }
        // REPLAY_SET's time is ?1; the filter's parameters follow it.
        let sql = format!(
            "UPDATE deliveries SET {REPLAY_SET} WHERE id IN (SELECT d.id FROM deliveries d \
             JOIN messages m ON m.id = d.msg_id WHERE {} LIMIT {limit})",
            renumber_from(&cond, 2)
        );
        self.write(move |c| {
            let n = c.execute(&sql, rusqlite::params_from_iter(args))?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
        .await
    }

    async fn resend(
        &self,
        app: &AppId,
        msg: &MsgId,
        ep: &EndpointId,
        now: Millis,
    ) -> StoreResult<ResendOutcome> {
        let (app, msg, ep) = (
            app.as_str().to_owned(),
            msg.as_str().to_owned(),
            ep.as_str().to_owned(),
        );
        self.write(move |c| {
            let exists = |sql: &str, id: &str| -> StoreResult<bool> {
                c.query_row(sql, params![id, app], |_| Ok(()))
                    .optional()
                    .map(|o| o.is_some())
                    .map_err(map_err)
            };
            let expunged: Option<bool> = c
                .query_row(
                    "SELECT payload = '' FROM messages WHERE id = ?1 AND app_id = ?2",
                    params![msg, app],
                    |r| r.get(0),
                )
                .optional()?;
            match expunged {
                None => return Ok(ResendOutcome::NoSuchMessage),
                Some(true) => return Ok(ResendOutcome::Expunged),
                Some(false) => {}
            }
            if !exists("SELECT 1 FROM endpoints WHERE id = ?1 AND app_id = ?2", &ep)? {
                return Ok(ResendOutcome::NoSuchEndpoint);
            }
            // Reuse the delivery so the Idempotency-Key stays the same. Not
            // one that is delivering: its attempt is in flight, and a resend
            // would send it again beside it (see `ResendOutcome::InFlight`).
            let state: Option<i64> = c
                .query_row(
                    "SELECT state FROM deliveries WHERE msg_id = ?1 AND endpoint_id = ?2",
                    params![msg, ep],
                    |r| r.get(0),
                )
                .optional()?;
            if state == Some(DeliveryState::Delivering as i64) {
                return Ok(ResendOutcome::InFlight);
            }
            let n = c.execute(
                &format!(
                    "UPDATE deliveries SET {REPLAY_SET} WHERE msg_id = ?2 AND endpoint_id = ?3"
                ),
                params![now, msg, ep],
            )?;
            if n == 0 {
                insert_manual(c, &msg, &ep, &app, now)?;
            }
            Ok(ResendOutcome::Queued)
        })
        .await
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
        let (app, ep, after) = (
            app.as_str().to_owned(),
            ep.as_str().to_owned(),
            after.as_str().to_owned(),
        );
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        // One writer: nothing else makes deliveries while this runs.
        self.write(move |c| {
            let routing = c
                .query_row(
                    "SELECT filter_types, channels FROM endpoints WHERE id = ?1 AND app_id = ?2",
                    params![ep, app],
                    |r| {
                        Ok((
                            r.get::<_, Option<String>>(0)?,
                            r.get::<_, Option<String>>(1)?,
                        ))
                    },
                )
                .optional()?;
            let Some((filter_types, channels)) = routing else {
                return Ok(None);
            };
            let sub =
                Subscriber::from_stored(ep.clone(), filter_types.as_deref(), channels.as_deref())?;
            let mut looked = c.prepare_cached(
                "SELECT id, event_type, channels, EXISTS ( \
                   SELECT 1 FROM deliveries d WHERE d.endpoint_id = ?1 AND d.msg_id = m.id) \
                 FROM messages m WHERE m.app_id = ?2 AND m.id > ?3 \
                   AND m.created_at >= ?4 AND m.created_at < ?5 ORDER BY m.id LIMIT ?6",
            )?;
            let mut last = None;
            let mut missing = Vec::new();
            let mut rows = looked.query(params![ep, app, after, window.0, window.1, limit])?;
            while let Some(r) = rows.next()? {
                let id: String = r.get(0)?;
                last = Some(id.clone());
                if !r.get::<_, bool>(3)? {
                    missing.push((id, r.get(1)?, r.get(2)?));
                }
            }
            drop(rows);
            let wanted = wanted_by(&sub, missing)?;
            for msg in &wanted {
                insert_manual(c, msg, &ep, &app, now)?;
            }
            Ok(Some(MissingBatch {
                delivered: wanted.len() as u64,
                last: last.map(MsgId::from_trusted),
            }))
        })
        .await
    }
}

/// A new manual delivery of `msg` to `ep`: pending, due `now`, in a fresh
/// cycle (a resend, or a replay of a missing one), counted.
fn insert_manual(c: &Connection, msg: &str, ep: &str, app: &str, now: Millis) -> StoreResult<()> {
    c.prepare_cached(
        "INSERT INTO deliveries (id, msg_id, endpoint_id, app_id, state, next_attempt_at, \
         cycle_started_at, manual, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, 0, ?5, ?5, 1, ?5, ?5)",
    )?
    .execute(params![DeliveryId::generate().as_str(), msg, ep, app, now])?;
    counts::counted(ep, 0, false, 1)
}

/// Numbers a fragment's bare `?` parameters from `first` on, so that it
/// can follow numbered ones (numbered and bare ones must not mix).
fn renumber_from(sql: &str, first: usize) -> String {
    let mut out = String::with_capacity(sql.len() + 16);
    let mut n = first;
    for ch in sql.chars() {
        if ch == '?' {
            out.push_str(&format!("?{n}"));
            n += 1;
        } else {
            out.push(ch);
        }
    }
    out
}

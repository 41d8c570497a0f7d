//! The hot path on SQLite: ingest (fan-out, and the batch's own claim),
//! claim (the walk of the due head, parking and holding), complete (attempts,
//! streaks, stats buckets) and release, each a job on the writer thread.

use super::claim::claim_tx;
use super::*;
use crate::crypto::Keyring;

fn insert_messages_tx(
    conn: &Connection,
    keys: &Keyring,
    batch: &[NewMessage],
    mut claim: Option<IngestClaim>,
) -> StoreResult<(Vec<InsertOutcome>, Vec<ClaimedDelivery>)> {
    let mut insert_msg = conn
        .prepare_cached(
            "INSERT INTO messages (id, app_id, event_type, event_id, payload, created_at, channels, traceparent, \
             tags, deliver_at, payload_expires_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11) \
             ON CONFLICT DO NOTHING",
        )?;
    let mut endpoints_q = conn
        .prepare_cached(
            "SELECT id, filter_types, channels, disabled, url, secret, old_secrets, headers, rate_limit, ordering \
             FROM endpoints WHERE app_id = ?1 AND (disabled = 0 OR disabled_by = 'auto')",
        )?;
    // A delivery claimed at ingest is born `delivering` under a lease, just
    // as `claim_tx` would leave it; the others are born pending. A
    // scheduled message's cycle starts at its `deliverAt` (the age cap
    // counts from there).
    let mut insert_delivery = conn
        .prepare_cached(
            "INSERT INTO deliveries (id, msg_id, endpoint_id, app_id, state, next_attempt_at, lease_token, \
             cycle_started_at, created_at, updated_at, queued_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?9, ?8, ?8, ?10)",
        )?;
    // A FIFO endpoint's deliveries take their queue place here, in the
    // order the writer stores them (which is the order of the commits):
    // after every live delivery's place (among them the one in flight), and
    // at least their message's `created_at`, so the keys stay times, as
    // those claims give. `created_at` alone is taken before, in the API
    // handler, so a message could be stored after a later one a claim had
    // taken already, and then came before that one's retry. A scheduled
    // message's (`deliverAt` ahead) gets none: a head not due would hold
    // the queue; it takes its place when a claim meets it due. One index
    // seek per FIFO endpoint and batch (its last place), none per delivery.
    let mut last_place = conn.prepare_cached(
        "SELECT MAX(queued_at) FROM deliveries INDEXED BY deliveries_fifo \
             WHERE endpoint_id = ?1 AND queued_at IS NOT NULL AND state < 2",
    )?;
    let mut fifo_last: HashMap<String, Option<Millis>> = HashMap::new();
    let mut app_exists = conn.prepare_cached("SELECT 1 FROM applications WHERE id = ?1")?;
    let mut claimed = Vec::new();
    let mut apps_known: HashMap<String, bool> = HashMap::new();
    let mut endpoints_of: HashMap<String, Vec<FanoutTarget>> = HashMap::new();
    let mut outcomes = Vec::with_capacity(batch.len());
    for m in batch {
        // Svix's inline application: the message goes to the app with its
        // uid, created first (here, in this transaction) if there is none.
        let inline;
        let m = match &m.application {
            None => m,
            Some(app) => {
                let app_id = create_app_unless_uid_taken(conn, app)?;
                apps_known.insert(app_id.as_str().to_owned(), true);
                inline = NewMessage {
                    app_id,
                    application: None,
                    ..m.clone()
                };
                &inline
            }
        };
        // An app deleted after the API looked it up: refuse that message
        // alone rather than fail the batch on the foreign key.
        let known = match apps_known.get(m.app_id.as_str()) {
            Some(k) => *k,
            None => {
                let k = app_exists.exists(params![m.app_id.as_str()])?;
                apps_known.insert(m.app_id.as_str().to_owned(), k);
                k
            }
        };
        if !known {
            outcomes.push(InsertOutcome::NoSuchApp);
            continue;
        }
        let inserted = insert_msg.execute(params![
            m.id.as_str(),
            m.app_id.as_str(),
            m.event_type,
            m.event_id,
            m.payload,
            m.created_at,
            m.channels.as_ref().map(to_json).transpose()?,
            m.traceparent,
            m.tags.as_ref().map(to_json).transpose()?,
            m.deliver_at,
            m.payload_expires_at
        ])?;
        if inserted == 0 {
            outcomes.push(InsertOutcome::DuplicateEventId);
            continue;
        }
        if !endpoints_of.contains_key(m.app_id.as_str()) {
            let mut eps = Vec::new();
            let mut rs = endpoints_q.query(params![m.app_id.as_str()])?;
            while let Some(r) = rs.next()? {
                if EndpointOrdering::from_stored(&get::<String>(r, "ordering")?)
                    == EndpointOrdering::Fifo
                {
                    if let std::collections::hash_map::Entry::Vacant(slot) =
                        fifo_last.entry(get::<String>(r, "id")?)
                    {
                        let last: Option<Millis> =
                            last_place.query_row(params![slot.key()], |row| row.get(0))?;
                        slot.insert(last);
                    }
                }
                eps.push(FanoutTarget::from_row(
                    get(r, "id")?,
                    get::<Option<String>>(r, "filter_types")?.as_deref(),
                    get::<Option<String>>(r, "channels")?.as_deref(),
                    may_hand_off(
                        get::<i64>(r, "disabled")? == 0,
                        get(r, "rate_limit")?,
                        &get::<String>(r, "ordering")?,
                    ),
                    claim.as_ref(),
                    |now| {
                        SendTo::from_columns(
                            keys,
                            &get::<String>(r, "id")?,
                            get(r, "url")?,
                            &get::<String>(r, "secret")?,
                            &get::<String>(r, "old_secrets")?,
                            &get::<String>(r, "headers")?,
                            now,
                        )
                    },
                )?);
            }
            endpoints_of.insert(m.app_id.as_str().to_owned(), eps);
        }
        let deliveries = fan_out(&endpoints_of, m, &mut claim);
        let fanned = deliveries.len();
        let scheduled = m.due_at() > m.created_at;
        for d in deliveries {
            let place = match fifo_last.get_mut(d.endpoint_id) {
                Some(last) if !scheduled => {
                    let place = last.map_or(m.created_at, |l| (l + 1).max(m.created_at));
                    *last = Some(place);
                    Some(place)
                }
                _ => None,
            };
            insert_delivery.execute(params![
                d.id.as_str(),
                m.id.as_str(),
                d.endpoint_id,
                m.app_id.as_str(),
                d.state as i64,
                d.due,
                d.lease_token(),
                m.created_at,
                m.due_at(),
                place
            ])?;
            counts::counted(d.endpoint_id, d.state as i64, false, 1)?;
            claimed.extend(d.claimed);
        }
        outcomes.push(InsertOutcome::Inserted { deliveries: fanned });
    }
    Ok((outcomes, claimed))
}

/// The id of the application named by `app`'s uid (as an id or a uid, as
/// the API resolves a path), creating `app` when there is none. On the
/// writer, inside the ingest transaction: nothing can come in between.
fn create_app_unless_uid_taken(conn: &Connection, app: &App) -> StoreResult<AppId> {
    let key = app.uid.as_deref().unwrap_or(app.id.as_str());
    let existing: Option<String> = conn
        .prepare_cached(
            "SELECT id FROM applications WHERE id = ?1 OR uid = ?1 ORDER BY id = ?1 DESC LIMIT 1",
        )?
        .query_row(params![key], |r| r.get(0))
        .optional()?;
    if let Some(id) = existing {
        return Ok(AppId::from_trusted(id));
    }
    conn.prepare_cached(
        "INSERT INTO applications (id, uid, name, rate_limit, metadata, created_at, updated_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute(params![
        app.id.as_str(),
        app.uid,
        app.name,
        app.rate_limit,
        to_json(&app.metadata)?,
        app.created_at,
        app.updated_at
    ])?;
    Ok(app.id.clone())
}

fn complete_tx(
    conn: &Connection,
    batch: &[Completion],
    breaker: &BreakerRule,
) -> StoreResult<Completed> {
    let mut insert = conn
        .prepare_cached(
            "INSERT INTO attempts (id, delivery_id, msg_id, endpoint_id, app_id, url, attempt_number, started_at, \
             duration_ms, status_code, response, error, success, manual) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
        )?;
    // The lease token guard leaves a re-claimed delivery to its new holder.
    let mut update = conn
        .prepare_cached(
            "UPDATE deliveries SET state = ?1, attempts = ?2, next_attempt_at = ?3, lease_token = NULL, manual = 0, \
             dead_reason = ?4, last_status = ?5, last_error = ?6, updated_at = ?7 \
             WHERE id = ?8 AND lease_token = ?9",
        )?;
    let mut moved = Vec::with_capacity(batch.len());
    for c in batch {
        let a = &c.attempt;
        insert.execute(params![
            a.id.as_str(),
            a.delivery_id.as_str(),
            a.msg_id.as_str(),
            a.endpoint_id.as_str(),
            a.app_id.as_str(),
            a.url,
            i64::from(a.attempt_number),
            a.started_at,
            a.duration_ms,
            a.status_code.map(i64::from),
            a.response,
            a.error,
            i64::from(a.success),
            i64::from(a.manual),
        ])?;
        let (state, next_at, reason) = c.next_state();
        let changed = update.execute(params![
            state as i64,
            i64::from(a.attempt_number),
            next_at,
            reason,
            a.status_code.map(i64::from),
            a.error,
            c.now,
            a.delivery_id.as_str(),
            c.lease_token,
        ])?;
        // Names no `parked`: counts itself (counts.rs). Leased, so it was
        // delivering, and never held (only pending rows are parked or
        // held). No RETURNING: SQLite would build a table for its rows on
        // every completion.
        if changed == 1 {
            counts::moved(
                a.endpoint_id.as_str(),
                DeliveryState::Delivering as i64,
                state as i64,
                false,
            )?;
        }
        moved.push(changed == 1);
    }
    let (streaks, circuits) = record_endpoint_health(conn, batch, breaker)?;
    Ok(Completed {
        moved,
        streaks,
        circuits,
    })
}

/// Moves each endpoint's failing streak and circuit breaker on and adds
/// the batch to its stats buckets: one read and one write per endpoint and
/// one write per bucket, whatever the batch size.
fn record_endpoint_health(
    conn: &Connection,
    batch: &[Completion],
    breaker: &BreakerRule,
) -> StoreResult<(Vec<StreakUpdate>, Vec<CircuitChange>)> {
    let mut read_circuit = conn.prepare_cached(&format!(
        "SELECT {CIRCUIT_COLUMNS} FROM endpoints WHERE id = ?1"
    ))?;
    let mut streak = conn
        .prepare_cached(
            "UPDATE endpoints SET \
               fail_streak = CASE WHEN ?1 THEN ?2 ELSE fail_streak + ?2 END, \
               streak_started_at = CASE WHEN ?1 THEN ?3 ELSE COALESCE(streak_started_at, ?3) END, \
               last_success_at = CASE WHEN ?1 THEN MAX(COALESCE(last_success_at, 0), ?4) ELSE last_success_at END, \
               last_error = COALESCE(?5, last_error), last_error_at = COALESCE(?6, last_error_at), \
               circuit_state = ?8, circuit_since = ?9, circuit_until = ?10, circuit_cooldown_ms = ?11, \
               circuit_probe_by = ?12, circuit_window_at = ?13, circuit_attempts = ?14, \
               circuit_failures = ?15, circuit_prev_attempts = ?16, circuit_prev_failures = ?17 \
             WHERE id = ?7 RETURNING fail_streak, streak_started_at, disabled",
        )?;
    let seen = fold_seen(batch);
    // The store reads no clock: the batch's latest "now" is its time.
    let now = batch.iter().map(|c| c.now).max().unwrap_or_default();
    let mut out = Vec::new();
    let mut changes = Vec::new();
    for e in fold_endpoint_batches(batch) {
        let (error, error_at) = match &e.last_error {
            Some((text, at)) => (Some(text.as_str()), Some(*at)),
            None => (None, None),
        };
        let stored = read_circuit
            .query_row(params![e.endpoint_id.as_str()], circuit_of_row)
            .optional()?;
        // (None: the endpoint was deleted while its attempt was in flight.)
        let Some(stored) = stored else { continue };
        let (mut next, changed) = step_circuits(
            breaker,
            vec![EndpointCircuit {
                endpoint_id: e.endpoint_id.clone(),
                app_id: e.app_id.clone(),
                circuit: stored,
            }],
            &seen,
            now,
        );
        changes.extend(changed);
        let c = next.pop().map(|n| n.circuit).unwrap_or_default();
        let row = streak
            .query_row(
                params![
                    e.reset,
                    i64::from(e.failures),
                    e.first_failure_at,
                    e.last_success_at,
                    error,
                    error_at,
                    e.endpoint_id.as_str(),
                    i64::from(c.state.code()),
                    c.since,
                    c.until,
                    c.cooldown_ms,
                    c.probe_by,
                    c.window.started_at,
                    i64::from(c.window.attempts),
                    i64::from(c.window.failures),
                    i64::from(c.window.prev_attempts),
                    i64::from(c.window.prev_failures),
                ],
                |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, Option<i64>>(1)?,
                        r.get::<_, i64>(2)?,
                    ))
                },
            )
            .optional()?;
        if let Some((fail_streak, started, disabled)) = row {
            if e.failures > 0 {
                out.push(StreakUpdate {
                    endpoint_id: e.endpoint_id,
                    app_id: e.app_id,
                    fail_streak: u32_of(fail_streak),
                    streak_started_at: started,
                    disabled: disabled != 0,
                });
            }
        }
    }
    let mut add = conn
        .prepare_cached(
            "INSERT INTO endpoint_stats (endpoint_id, bucket, attempts, successes, failures, latency_sum, \
               h0, h1, h2, h3, h4, h5, h6, h7, h8, h9, h10, h11) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18) \
             ON CONFLICT (endpoint_id, bucket) DO UPDATE SET \
               attempts = attempts + excluded.attempts, successes = successes + excluded.successes, \
               failures = failures + excluded.failures, latency_sum = latency_sum + excluded.latency_sum, \
               h0 = h0 + excluded.h0, h1 = h1 + excluded.h1, h2 = h2 + excluded.h2, h3 = h3 + excluded.h3, \
               h4 = h4 + excluded.h4, h5 = h5 + excluded.h5, h6 = h6 + excluded.h6, h7 = h7 + excluded.h7, \
               h8 = h8 + excluded.h8, h9 = h9 + excluded.h9, h10 = h10 + excluded.h10, h11 = h11 + excluded.h11",
        )?;
    for (ep, b) in fold_stats(batch) {
        let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let mut values: Vec<Value> = vec![
            ep.as_str().to_owned().into(),
            b.bucket.into(),
            n(b.attempts).into(),
            n(b.successes).into(),
            n(b.failures).into(),
            n(b.latency_sum_ms).into(),
        ];
        values.extend(b.histogram.iter().map(|h| Value::from(n(*h))));
        add.execute(rusqlite::params_from_iter(values))?;
    }
    Ok((out, changes))
}

#[async_trait]
impl Queue for SqliteStore {
    async fn insert_messages(&self, batch: &[NewMessage]) -> StoreResult<Vec<InsertOutcome>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let (batch, keys) = (batch.to_vec(), self.keys.clone());
        self.write(move |c| Ok(insert_messages_tx(c, &keys, &batch, None)?.0))
            .await
    }

    async fn insert_messages_claiming(
        &self,
        batch: &[NewMessage],
        req: &ClaimRequest<'_>,
    ) -> StoreResult<(Vec<InsertOutcome>, Vec<ClaimedDelivery>)> {
        if batch.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        let (batch, keys) = (batch.to_vec(), self.keys.clone());
        let claim = IngestClaim::new(req);
        self.write(move |c| insert_messages_tx(c, &keys, &batch, Some(claim)))
            .await
    }

    async fn insert_example(&self, m: &NewMessage, ep: &EndpointId) -> StoreResult<bool> {
        let (m, ep) = (m.clone(), ep.as_str().to_owned());
        self.write(move |c| {
            let found = c
                .query_row(
                    "SELECT 1 FROM endpoints WHERE id = ?1 AND app_id = ?2",
                    params![ep, m.app_id.as_str()],
                    |_| Ok(()),
                )
                .optional()?;
            if found.is_none() {
                return Ok(false);
            }
            c.execute(
                "INSERT INTO messages (id, app_id, event_type, payload, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![m.id.as_str(), m.app_id.as_str(), m.event_type, m.payload, m.created_at],
            )?;
            c.execute(
                "INSERT INTO deliveries (id, msg_id, endpoint_id, app_id, state, next_attempt_at, \
                 cycle_started_at, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, 0, ?5, ?5, ?5, ?5)",
                params![
                    DeliveryId::generate().as_str(),
                    m.id.as_str(),
                    ep,
                    m.app_id.as_str(),
                    m.created_at
                ],
            )?;
            counts::counted(&ep, 0, false, 1)?;
            Ok(true)
        })
        .await
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> StoreResult<Vec<ClaimedDelivery>> {
        if req.limit == 0 {
            return Ok(Vec::new());
        }
        let (now, lease_until, limit, cap) = (
            req.now,
            req.lease_until,
            req.limit,
            (req.endpoint_cap, req.unlisted_cap),
        );
        let (in_flight, keys) = (req.in_flight.clone(), self.keys.clone());
        self.write(move |c| claim_tx(c, &keys, now, lease_until, limit, &in_flight, cap))
            .await
    }

    async fn next_due_at(&self) -> StoreResult<Option<Millis>> {
        self.read(|c| {
            // Both halves are index seeks: `state < 2` alone matches no
            // partial index and would scan the whole history on every
            // idle moment of the dispatcher. A disabled endpoint's held
            // deliveries are no claim's work (its older ones are parked,
            // so the first half skips at most a moment's worth of them).
            c.prepare_cached(
                "SELECT MIN(due) FROM ( \
                   SELECT MIN(next_attempt_at) AS due FROM deliveries INDEXED BY deliveries_due \
                    WHERE state < 2 AND parked = 0 \
                      AND endpoint_id NOT IN (SELECT id FROM endpoints WHERE disabled = 1) \
                   UNION ALL \
                   SELECT (SELECT MIN(d.next_attempt_at) FROM deliveries d INDEXED BY deliveries_parked \
                            WHERE d.parked = 1 AND d.endpoint_id = p.endpoint_id) \
                     FROM parked_endpoints p \
                    WHERE p.endpoint_id NOT IN (SELECT id FROM endpoints WHERE disabled = 1))",
            )?
            .query_row([], |r| r.get(0))
            .map_err(map_err)
        })
        .await
    }

    async fn complete_with_circuits(
        &self,
        batch: &[Completion],
        breaker: &BreakerRule,
    ) -> StoreResult<Completed> {
        if batch.is_empty() {
            return Ok(Completed::default());
        }
        // SQLite would keep a NUL, and PostgreSQL refuses it: both store it
        // alike.
        let batch = storable_batch(batch).into_owned();
        let breaker = *breaker;
        self.write(move |c| complete_tx(c, &batch, &breaker)).await
    }

    async fn release(&self, id: &DeliveryId, lease_token: &str, now: Millis) -> StoreResult<()> {
        let (id, token) = (id.as_str().to_owned(), lease_token.to_owned());
        self.write(move |c| {
            // Names no `parked`: counts itself (counts.rs).
            let released: Option<(String, i64)> = c
                .query_row(
                    "UPDATE deliveries SET state = 0, next_attempt_at = ?1, lease_token = NULL, updated_at = ?1 \
                     WHERE id = ?2 AND lease_token = ?3 RETURNING endpoint_id, parked",
                    params![now, id, token],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            if let Some((endpoint, parked)) = released {
                counts::moved(&endpoint, 1, 0, parked == 2)?;
            }
            Ok(())
        })
        .await
    }

    async fn throttle_waiting(&self) -> StoreResult<Vec<ThrottleWaiting>> {
        self.read(|c| throttle_waiting_on(c, None)).await
    }

    async fn throttle_waiting_of(&self, endpoint: &EndpointId) -> StoreResult<u64> {
        let endpoint = endpoint.as_str().to_owned();
        self.read(move |c| {
            let waiting = throttle_waiting_on(c, Some(endpoint))?;
            Ok(waiting.first().map_or(0, |w| w.waiting))
        })
        .await
    }
}

/// Every throttled, enabled endpoint's waiting deliveries, or only
/// `endpoint`'s.
fn throttle_waiting_on(
    c: &Connection,
    endpoint: Option<String>,
) -> StoreResult<Vec<ThrottleWaiting>> {
    let mut stmt = c.prepare_cached(
        "SELECT e.id, e.rate_limit, \
                    (SELECT COUNT(*) FROM deliveries d INDEXED BY deliveries_fifo \
                      WHERE d.endpoint_id = e.id AND d.queued_at IS NOT NULL AND d.state < 2 \
                        AND d.state = 0 AND d.parked < 2) AS waiting \
             FROM endpoints e INDEXED BY endpoints_throttled \
             WHERE e.rate_limit > 0 AND e.disabled = 0 AND (?1 IS NULL OR e.id = ?1) \
             ORDER BY e.id",
    )?;
    rows(&mut stmt, params![endpoint], |r| {
        Ok(ThrottleWaiting {
            endpoint_id: EndpointId::from_trusted(get(r, "id")?),
            rate: throttled_rate(get(r, "rate_limit")?).unwrap_or(0),
            waiting: u64::try_from(get::<i64>(r, "waiting")?).unwrap_or(0),
        })
    })
}

#[cfg(test)]
#[path = "queue_tests.rs"]
mod tests;

//! The hot path on PostgreSQL: ingest (fan-out, and the batch's own claim),
//! claim (`FOR UPDATE SKIP LOCKED`), complete (attempts, streaks, stats
//! buckets), release, and the LISTEN/NOTIFY wake-ups between processes.

use super::*;

/// Between attempts to listen again after the listener's connection failed.
const LISTEN_RETRY_MIN: Duration = Duration::from_millis(100);
const LISTEN_RETRY_MAX: Duration = Duration::from_secs(5);

/// A listener on `channel`, LISTENing once this returns.
async fn start_listener(pool: &PgPool, channel: &str) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(channel).await?;
    Ok(listener)
}

/// Listens on `channel` (`what` it carries, for the logs) and starts
/// [`listen_loop`] in the background.
pub(super) async fn spawn_listener(
    store: &PostgresStore,
    channel: &str,
    what: &'static str,
    wake: std::sync::Arc<Notify>,
) -> StoreResult<()> {
    let listener = start_listener(&store.pool, channel).await?;
    tokio::spawn(listen_loop(
        listener,
        store.pool.clone(),
        channel.to_owned(),
        what,
        wake,
        store.closing.clone(),
    ));
    Ok(())
}

/// Turns every notification on `channel` into a wake-up, until `closing`.
/// A lost connection is listened on again (with a growing pause while that
/// fails), followed by one wake-up for whatever was notified meanwhile.
async fn listen_loop(
    first: PgListener,
    pool: PgPool,
    channel: String,
    what: &'static str,
    wake: std::sync::Arc<Notify>,
    closing: CancellationToken,
) {
    let mut listener = Some(first);
    let mut retry = LISTEN_RETRY_MIN;
    loop {
        let current = match listener.as_mut() {
            Some(l) => l,
            None => {
                tokio::select! {
                    _ = closing.cancelled() => return,
                    _ = tokio::time::sleep(retry) => {}
                }
                retry = (retry * 2).min(LISTEN_RETRY_MAX);
                match start_listener(&pool, &channel).await {
                    Ok(l) => {
                        tracing::info!(channel = %channel, what, "listening again");
                        retry = LISTEN_RETRY_MIN;
                        wake.notify_one();
                        listener.insert(l)
                    }
                    Err(e) => {
                        if closing.is_cancelled() || pool.is_closed() {
                            return;
                        }
                        tracing::warn!(error = %e, channel = %channel, what, "cannot listen; will retry");
                        continue;
                    }
                }
            }
        };
        let received = tokio::select! {
            _ = closing.cancelled() => return,
            r = current.try_recv() => r,
        };
        match received {
            Ok(Some(_)) => wake.notify_one(),
            // The connection was lost and the listener has LISTENed again
            // on a new one; notifications in between are gone.
            Ok(None) => {
                tracing::warn!(channel = %channel, what, "lost the listening connection; reconnected");
                wake.notify_one();
            }
            Err(e) => {
                if closing.is_cancelled() || pool.is_closed() {
                    return;
                }
                tracing::warn!(error = %e, channel = %channel, what, "lost the listening connection; will reconnect");
                // Dropped, and started afresh above.
                listener = None;
            }
        }
    }
}

/// Lets an enabled endpoint's held deliveries back into the claim index,
/// in `tx`, after the endpoint's row was locked or updated there.
pub(super) async fn unhold(tx: &mut sqlx::PgConnection, ep: &EndpointId) -> StoreResult<()> {
    sqlx::query("UPDATE deliveries SET held = FALSE WHERE endpoint_id = $1 AND held")
        .bind(ep.as_str())
        .execute(tx)
        .await?;
    Ok(())
}

impl PostgresStore {
    /// Every throttled, enabled endpoint's waiting deliveries, or only
    /// `endpoint`'s.
    async fn throttle_waiting_where(
        &self,
        endpoint: Option<&EndpointId>,
    ) -> StoreResult<Vec<ThrottleWaiting>> {
        let rows = sqlx::query(
            "SELECT e.id, e.rate_limit::int8 AS rate_limit, \
                    (SELECT COUNT(*) FROM deliveries d \
                      WHERE d.endpoint_id = e.id AND d.queued_at IS NOT NULL AND d.state = 0 \
                        AND NOT d.held) AS waiting \
             FROM endpoints e WHERE e.rate_limit > 0 AND NOT e.disabled \
               AND ($1::text IS NULL OR e.id = $1) ORDER BY e.id",
        )
        .bind(endpoint.map(|e| e.as_str().to_owned()))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(ThrottleWaiting {
                    endpoint_id: EndpointId::from_trusted(get(r, "id")?),
                    rate: throttled_rate(get(r, "rate_limit")?).unwrap_or(0),
                    waiting: u64::try_from(get::<i64>(r, "waiting")?).unwrap_or(0),
                })
            })
            .collect()
    }

    /// Stores `batch` with its deliveries; claims some of them when
    /// `claim` is given (see [`Queue::insert_messages_claiming`]). A batch
    /// with inline applications (Svix's `MessageIn.application`) creates
    /// them first, in one transaction with its messages; any other batch
    /// takes no explicit transaction (see [`PostgresStore::ingest_on`]).
    async fn ingest(
        &self,
        batch: &[NewMessage],
        claim: Option<IngestClaim>,
    ) -> StoreResult<(Vec<InsertOutcome>, Vec<ClaimedDelivery>)> {
        if batch.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        if batch.iter().any(|m| m.application.is_some()) {
            let mut tx = self.pool.begin().await?;
            let resolved = super::apps::create_inline_apps(&mut tx, batch).await?;
            let stored = self.ingest_on(&mut tx, &resolved, claim).await?;
            tx.commit().await?;
            return Ok(stored);
        }
        let mut conn = self.pool.acquire().await?;
        self.ingest_on(&mut conn, batch, claim).await
    }

    async fn ingest_on(
        &self,
        conn: &mut sqlx::PgConnection,
        batch: &[NewMessage],
        mut claim: Option<IngestClaim>,
    ) -> StoreResult<(Vec<InsertOutcome>, Vec<ClaimedDelivery>)> {
        // Two round trips, no explicit transaction: under load the API
        // waits on this path, and each BEGIN/COMMIT or extra statement is
        // another wait for a database server that shares the machine.
        // First the subscribers of every app in the batch, read without
        // locks; routing is decided on them here.
        let mut apps: Vec<&str> = batch.iter().map(|m| m.app_id.as_str()).collect();
        apps.sort_unstable();
        apps.dedup();
        let rows = sqlx::query(
            "SELECT id, app_id, filter_types::text AS filter_types, channels, disabled, url, secret, \
                    old_secrets, headers, rate_limit::int8 AS rate_limit, ordering FROM endpoints \
             WHERE app_id = ANY($1) AND (NOT disabled OR disabled_by = 'auto')",
        )
        .bind(&apps)
        .fetch_all(&mut *conn)
        .await?;
        let mut endpoints_of: HashMap<String, Vec<FanoutTarget>> = HashMap::new();
        for r in &rows {
            let target = FanoutTarget::from_row(
                get(r, "id")?,
                get::<Option<String>>(r, "filter_types")?.as_deref(),
                get::<Option<String>>(r, "channels")?.as_deref(),
                may_hand_off(
                    !get::<bool>(r, "disabled")?,
                    get(r, "rate_limit")?,
                    &get::<String>(r, "ordering")?,
                ),
                claim.as_ref(),
                |now| {
                    SendTo::from_columns(
                        &self.keys,
                        &get::<String>(r, "id")?,
                        get(r, "url")?,
                        &get::<String>(r, "secret")?,
                        &get::<String>(r, "old_secrets")?,
                        &get::<String>(r, "headers")?,
                        now,
                    )
                },
            )?;
            endpoints_of
                .entry(get(r, "app_id")?)
                .or_default()
                .push(target);
        }
        let (mut d_id, mut d_msg, mut d_ep, mut d_app, mut d_at, mut d_start) = (
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
        );
        // Claimed at ingest: born `delivering` under the lease; the store
        // returns them only if their message and endpoint made it in.
        let (mut d_state, mut d_due, mut d_token) = (Vec::new(), Vec::new(), Vec::new());
        let mut claimed: HashMap<String, ClaimedDelivery> = HashMap::new();
        // A message id repeated in the batch is stored once: so are its
        // deliveries.
        let mut seen: HashSet<&str> = HashSet::new();
        for m in batch {
            if !seen.insert(m.id.as_str()) {
                continue;
            }
            for d in fan_out(&endpoints_of, m, &mut claim) {
                d_state.push(d.state as i16);
                d_due.push(d.due);
                d_token.push(d.lease_token().map(str::to_owned));
                d_ep.push(d.endpoint_id);
                d_msg.push(m.id.as_str());
                d_app.push(m.app_id.as_str());
                d_at.push(m.created_at);
                d_start.push(m.due_at());
                if let Some(c) = d.claimed {
                    claimed.insert(d.id.as_str().to_owned(), c);
                }
                d_id.push(d.id.into_string());
            }
        }
        let mut subscribers: Vec<&str> = d_ep.clone();
        subscribers.sort_unstable();
        subscribers.dedup();

        // Then everything else in one statement (one implicit transaction):
        // `ingest.sql`, its parameters and named parts explained there.
        let rows = sqlx::query(INGEST_SQL)
            .bind(batch.iter().map(|m| m.id.as_str()).collect::<Vec<_>>())
            .bind(batch.iter().map(|m| m.app_id.as_str()).collect::<Vec<_>>())
            .bind(
                batch
                    .iter()
                    .map(|m| m.event_type.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                batch
                    .iter()
                    .map(|m| m.event_id.as_deref())
                    .collect::<Vec<_>>(),
            )
            .bind(batch.iter().map(|m| m.payload.as_str()).collect::<Vec<_>>())
            .bind(batch.iter().map(|m| m.created_at).collect::<Vec<_>>())
            .bind(
                batch
                    .iter()
                    .map(|m| m.channels.as_ref().map(to_json).transpose())
                    .collect::<StoreResult<Vec<_>>>()?,
            )
            .bind(&apps)
            .bind(&subscribers)
            .bind(&d_id)
            .bind(&d_msg)
            .bind(&d_ep)
            .bind(&d_app)
            .bind(&d_at)
            .bind(&self.wake_channel)
            .bind(&d_state)
            .bind(&d_due)
            .bind(&d_token)
            .bind(
                batch
                    .iter()
                    .map(|m| m.traceparent.as_deref())
                    .collect::<Vec<_>>(),
            )
            .bind(
                batch
                    .iter()
                    .map(|m| m.tags.as_ref().map(to_json).transpose())
                    .collect::<StoreResult<Vec<_>>>()?,
            )
            .bind(batch.iter().map(|m| m.deliver_at).collect::<Vec<_>>())
            .bind(&d_start)
            .bind(
                batch
                    .iter()
                    .map(|m| m.payload_expires_at)
                    .collect::<Vec<_>>(),
            )
            .fetch_all(&mut *conn)
            .await?;
        let (mut existing, mut stored) = (HashSet::new(), HashSet::new());
        let mut taken = Vec::new();
        let mut fanned: HashMap<String, usize> = HashMap::new();
        for r in &rows {
            let kind: String = get(r, "kind")?;
            let id: Option<String> = get(r, "id")?;
            match (kind.as_str(), id) {
                ("a", Some(id)) => {
                    existing.insert(id);
                }
                ("m", Some(id)) => {
                    stored.insert(id);
                }
                ("d", Some(id)) => {
                    *fanned.entry(id).or_default() += 1;
                    if let Some(d) = get::<Option<String>>(r, "delivery")?
                        .and_then(|delivery| claimed.remove(&delivery))
                    {
                        taken.push(d);
                    }
                }
                _ => {}
            }
        }
        let outcomes = batch
            .iter()
            .map(|m| {
                if !existing.contains(m.app_id.as_str()) {
                    InsertOutcome::NoSuchApp
                } else if !stored.remove(m.id.as_str()) {
                    // `remove`: a repeated message id counts as stored once.
                    InsertOutcome::DuplicateEventId
                } else {
                    InsertOutcome::Inserted {
                        deliveries: fanned.get(m.id.as_str()).copied().unwrap_or(0),
                    }
                }
            })
            .collect();
        Ok((outcomes, taken))
    }
}

/// A full endpoint's due deliveries are parked once they have waited this
/// long: a busy but healthy endpoint's rows are claimed within
/// milliseconds and never pay for it (as on SQLite).
const PARK_AFTER_MS: Millis = 1_000;
/// Rows one claim parks at most; the next claims go on from there.
const PASSED_PER_CLAIM: i64 = 2_000;

/// The parameters of [`CLAIM_SQL`] for one claim, kept together so that
/// the statement and its cost test bind the same values.
struct ClaimArgs<'a> {
    now: Millis,
    saturated: Vec<&'a str>,
    window: i64,
    busy: Vec<&'a str>,
    in_flight: Vec<i64>,
    cap: i64,
    /// The room of an endpoint `busy` does not list.
    unlisted_cap: i64,
    limit: i64,
    lease_until: Millis,
    token: String,
    horizon_us: i64,
    now_us: i64,
    retry_share: i64,
}

impl<'a> ClaimArgs<'a> {
    fn new(req: &'a ClaimRequest<'a>) -> Self {
        // What each endpoint with requests in flight already has; the
        // others have the whole cap (a FIFO endpoint: one).
        let (busy, in_flight): (Vec<&str>, Vec<i64>) = req
            .in_flight
            .iter()
            .map(|(id, n)| (id.as_str(), i64_of(*n)))
            .unzip();
        ClaimArgs {
            now: req.now,
            saturated: saturated(req.in_flight, req.endpoint_cap),
            window: i64_of(claim_window(req.limit)),
            busy,
            in_flight,
            cap: i64_of(req.endpoint_cap),
            unlisted_cap: i64_of(req.unlisted_cap.min(req.endpoint_cap)),
            limit: i64_of(req.limit),
            lease_until: req.lease_until,
            token: ulid::Ulid::new().to_string(),
            horizon_us: req
                .now
                .saturating_add(THROTTLE_HORIZON_MS)
                .saturating_mul(1000),
            now_us: req.now.saturating_mul(1000),
            retry_share: i64_of(retry_share(req.limit)),
        }
    }

    /// `sql` (the claim statement, or one that wraps it) with these values
    /// bound as `$1` … `$16`.
    fn bind<'q>(
        &'q self,
        sql: impl sqlx::SqlSafeStr,
    ) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
        sqlx::query(sql)
            .bind(self.now)
            .bind(&self.saturated)
            .bind(self.window)
            .bind(&self.busy)
            .bind(&self.in_flight)
            .bind(self.cap)
            .bind(self.limit)
            .bind(self.lease_until)
            .bind(&self.token)
            .bind(self.horizon_us)
            .bind(self.now_us)
            .bind(self.retry_share)
            .bind(self.now.saturating_sub(PARK_AFTER_MS))
            .bind(PASSED_PER_CLAIM)
            .bind(THROTTLE_DRIFT_US)
            .bind(self.unlisted_cap)
    }
}

/// The claim statement; its parameters and named parts are explained in
/// `claim.sql` itself (and the design in docs/design/postgres.md).
const CLAIM_SQL: &str = include_str!("claim.sql");
/// Ingest's statement (`ingest.sql`, which explains it).
const INGEST_SQL: &str = include_str!("ingest.sql");
/// Completion's statement (`complete.sql`, which explains it).
const COMPLETE_SQL: &str = include_str!("complete.sql");

#[async_trait]
impl Queue for PostgresStore {
    async fn insert_messages(&self, batch: &[NewMessage]) -> StoreResult<Vec<InsertOutcome>> {
        Ok(self.ingest(batch, None).await?.0)
    }

    async fn insert_messages_claiming(
        &self,
        batch: &[NewMessage],
        req: &ClaimRequest<'_>,
    ) -> StoreResult<(Vec<InsertOutcome>, Vec<ClaimedDelivery>)> {
        self.ingest(batch, Some(IngestClaim::new(req))).await
    }

    async fn insert_example(&self, m: &NewMessage, ep: &EndpointId) -> StoreResult<bool> {
        let mut tx = self.pool.begin().await?;
        // KEY SHARE keeps the endpoint (and so its application) from being
        // deleted under the new rows; the lock order is ingest's.
        let found =
            sqlx::query("SELECT 1 FROM endpoints WHERE id = $1 AND app_id = $2 FOR KEY SHARE")
                .bind(ep.as_str())
                .bind(m.app_id.as_str())
                .fetch_optional(&mut *tx)
                .await?;
        if found.is_none() {
            tx.rollback().await?;
            return Ok(false);
        }
        sqlx::query(
            "INSERT INTO messages (id, app_id, event_type, payload, created_at) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(m.id.as_str())
        .bind(m.app_id.as_str())
        .bind(&m.event_type)
        .bind(&m.payload)
        .bind(m.created_at)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO deliveries (id, msg_id, endpoint_id, app_id, state, next_attempt_at, \
             cycle_started_at, created_at, updated_at) VALUES ($1, $2, $3, $4, 0, $5, $5, $5, $5)",
        )
        .bind(DeliveryId::generate().as_str())
        .bind(m.id.as_str())
        .bind(ep.as_str())
        .bind(m.app_id.as_str())
        .bind(m.created_at)
        .execute(&mut *tx)
        .await?;
        self.notify_in(&mut tx).await?;
        tx.commit().await?;
        Ok(true)
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> StoreResult<Vec<ClaimedDelivery>> {
        if req.limit == 0 {
            return Ok(Vec::new());
        }
        let args = ClaimArgs::new(req);
        let rows = args.bind(CLAIM_SQL).fetch_all(&self.pool).await?;
        let token = args.token.clone();
        let mut out = rows
            .iter()
            .map(|r| {
                let due_at: Millis = get(r, "due_at")?;
                let endpoint_id: String = get(r, "endpoint_id")?;
                let to = SendTo::from_columns(
                    &self.keys,
                    &endpoint_id,
                    get(r, "url")?,
                    &get::<String>(r, "secret")?,
                    &get::<String>(r, "old_secrets")?,
                    &get::<String>(r, "headers")?,
                    req.now,
                )?;
                let send_at: Option<Millis> = get(r, "send_at")?;
                let d = ClaimedDelivery {
                    id: DeliveryId::from_trusted(get(r, "id")?),
                    lease_token: token.clone(),
                    msg_id: MsgId::from_trusted(get(r, "msg_id")?),
                    app_id: AppId::from_trusted(get(r, "app_id")?),
                    endpoint_id: EndpointId::from_trusted(endpoint_id),
                    url: to.url,
                    secret: to.secret,
                    old_secrets: to.old_secrets,
                    headers: to.headers,
                    unreadable: to.unreadable,
                    event_type: get(r, "event_type")?,
                    payload: get(r, "payload")?,
                    traceparent: get(r, "traceparent")?,
                    attempts: u32_of(get(r, "attempts")?),
                    cycle_started_at: get(r, "cycle_started_at")?,
                    cycle_base: u32_of(get(r, "cycle_base")?),
                    manual: get(r, "manual")?,
                    send_at,
                    throttle_rate: send_at.and(throttled_rate(get(r, "rate_limit")?)),
                    ordered: get(r, "ordered")?,
                };
                Ok((due_at, d))
            })
            .collect::<StoreResult<Vec<_>>>()?;
        // In the order picked (due time), as the SQLite store returns them.
        out.sort_by(|(a, x), (b, y)| (a, x.id.as_str()).cmp(&(b, y.id.as_str())));
        Ok(out.into_iter().map(|(_, d)| d).collect())
    }

    async fn next_due_at(&self) -> StoreResult<Option<Millis>> {
        // A disabled endpoint's held deliveries are no claim's work: held
        // ones are out of `deliveries_due`, and the few not held yet (see
        // `claim`) are skipped. ORDER BY … LIMIT 1 (not MIN) walks
        // `deliveries_due` from its start and stops at the first row that
        // counts; MIN over the anti-join aggregates every live row first.
        // Parked rows are due work too (as on SQLite): per enabled endpoint
        // in `parked_endpoints`, its oldest, one seek of `deliveries_parked`.
        sqlx::query_scalar(
            "SELECT MIN(due) FROM ( \
               (SELECT d.next_attempt_at AS due FROM deliveries d \
                 WHERE d.state < 2 AND NOT d.held AND NOT d.parked \
                   AND NOT EXISTS (SELECT 1 FROM endpoints e WHERE e.id = d.endpoint_id AND e.disabled) \
                 ORDER BY d.next_attempt_at LIMIT 1) \
               UNION ALL \
               SELECT (SELECT MIN(d.next_attempt_at) FROM deliveries d \
                        WHERE d.parked AND d.endpoint_id = p.endpoint_id) \
                 FROM parked_endpoints p JOIN endpoints e ON e.id = p.endpoint_id \
                WHERE NOT e.disabled) x",
        )
        .fetch_one(&self.pool)
        .await
        .map_err(map_err)
    }

    async fn complete_with_circuits(
        &self,
        batch: &[Completion],
        breaker: &BreakerRule,
    ) -> StoreResult<Completed> {
        if batch.is_empty() {
            return Ok(Completed::default());
        }
        // PostgreSQL refuses NUL in text: one such excerpt would fail the
        // whole batch.
        let batch = storable_batch(batch);
        let batch = &batch[..];
        let attempts: Vec<&AttemptRecord> = batch.iter().map(|c| &c.attempt).collect();
        // Applied one after another, a second completion holding the same
        // lease would find the token already cleared by the first; one
        // UPDATE ... FROM would pick either, so keep only the first.
        let mut seen: HashSet<(&str, &str)> = HashSet::new();
        let moves: Vec<&Completion> = batch
            .iter()
            .filter(|c| seen.insert((c.attempt.delivery_id.as_str(), c.lease_token.as_str())))
            .collect();
        let next: Vec<_> = moves.iter().map(|c| c.next_state()).collect();
        let eps = fold_endpoint_batches(batch);
        let ep_ids: Vec<&str> = eps.iter().map(|e| e.endpoint_id.as_str()).collect();
        let stats = fold_stats(batch);
        let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let column = |f: &dyn Fn(&StatsBucket) -> u64| -> Vec<i64> {
            stats.iter().map(|(_, b)| n(f(b))).collect()
        };
        // Endpoint rows first, locked in id order, so that concurrent
        // completers cannot deadlock on them or on their stats rows (which
        // only holders of the endpoint's lock touch). NO KEY UPDATE does
        // not block ingest's KEY SHARE. Within one statement the order in
        // which PostgreSQL runs its parts is not ours to choose: hence a
        // statement of its own.
        let mut tx = self.pool.begin().await?;
        // The lock also reads each circuit breaker, which the batch steps
        // (`herald_policy::breaker::step`) and the statement below writes
        // with the streak: no other process can move it in between.
        let locked = sqlx::query(AssertSqlSafe(format!(
            "SELECT id, app_id, {CIRCUIT_COLUMNS} FROM endpoints WHERE id = ANY($1) \
             ORDER BY id FOR NO KEY UPDATE"
        )))
        .bind(&ep_ids)
        .fetch_all(&mut *tx)
        .await?;
        let stored = locked
            .iter()
            .map(|r| {
                Ok(EndpointCircuit {
                    endpoint_id: EndpointId::from_trusted(get(r, "id")?),
                    app_id: AppId::from_trusted(get(r, "app_id")?),
                    circuit: circuit_of_pg_row(r)?,
                })
            })
            .collect::<StoreResult<Vec<_>>>()?;
        let now = batch.iter().map(|c| c.now).max().unwrap_or_default();
        let (stepped, circuits) = step_circuits(breaker, stored, &fold_seen(batch), now);
        // In `eps`' order (a deleted endpoint keeps the default: its row is
        // gone, the UPDATE finds nothing).
        let by_ep: HashMap<&str, &Circuit> = stepped
            .iter()
            .map(|e| (e.endpoint_id.as_str(), &e.circuit))
            .collect();
        let default_circuit = Circuit::default();
        let cs: Vec<&Circuit> = eps
            .iter()
            .map(|e| {
                *by_ep
                    .get(e.endpoint_id.as_str())
                    .unwrap_or(&&default_circuit)
            })
            .collect();
        // Then the rest in one statement: `complete.sql`, its parameters
        // and named parts explained there.
        let mut query = sqlx::query(COMPLETE_SQL)
            .bind(attempts.iter().map(|a| a.id.as_str()).collect::<Vec<_>>())
            .bind(
                attempts
                    .iter()
                    .map(|a| a.delivery_id.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                attempts
                    .iter()
                    .map(|a| a.msg_id.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                attempts
                    .iter()
                    .map(|a| a.endpoint_id.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                attempts
                    .iter()
                    .map(|a| a.app_id.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(attempts.iter().map(|a| a.url.as_str()).collect::<Vec<_>>())
            .bind(
                attempts
                    .iter()
                    .map(|a| i32_of(a.attempt_number))
                    .collect::<Vec<_>>(),
            )
            .bind(attempts.iter().map(|a| a.started_at).collect::<Vec<_>>())
            .bind(attempts.iter().map(|a| a.duration_ms).collect::<Vec<_>>())
            .bind(
                attempts
                    .iter()
                    .map(|a| a.status_code.map(i32::from))
                    .collect::<Vec<_>>(),
            )
            .bind(
                attempts
                    .iter()
                    .map(|a| a.response.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                attempts
                    .iter()
                    .map(|a| a.error.as_deref())
                    .collect::<Vec<_>>(),
            )
            .bind(attempts.iter().map(|a| a.success).collect::<Vec<_>>())
            .bind(attempts.iter().map(|a| a.manual).collect::<Vec<_>>())
            .bind(
                moves
                    .iter()
                    .map(|c| c.attempt.delivery_id.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                moves
                    .iter()
                    .map(|c| c.lease_token.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(next.iter().map(|(s, _, _)| *s as i16).collect::<Vec<_>>())
            .bind(
                moves
                    .iter()
                    .map(|c| i32_of(c.attempt.attempt_number))
                    .collect::<Vec<_>>(),
            )
            .bind(next.iter().map(|(_, at, _)| *at).collect::<Vec<_>>())
            .bind(next.iter().map(|(_, _, r)| *r).collect::<Vec<_>>())
            .bind(
                moves
                    .iter()
                    .map(|c| c.attempt.status_code.map(i32::from))
                    .collect::<Vec<_>>(),
            )
            .bind(
                moves
                    .iter()
                    .map(|c| c.attempt.error.as_deref())
                    .collect::<Vec<_>>(),
            )
            .bind(moves.iter().map(|c| c.now).collect::<Vec<_>>())
            .bind(&ep_ids)
            .bind(eps.iter().map(|e| e.reset).collect::<Vec<_>>())
            .bind(eps.iter().map(|e| i32_of(e.failures)).collect::<Vec<_>>())
            .bind(eps.iter().map(|e| e.first_failure_at).collect::<Vec<_>>())
            .bind(eps.iter().map(|e| e.last_success_at).collect::<Vec<_>>())
            .bind(
                eps.iter()
                    .map(|e| e.last_error.as_ref().map(|(t, _)| t.as_str()))
                    .collect::<Vec<_>>(),
            )
            .bind(
                eps.iter()
                    .map(|e| e.last_error.as_ref().map(|(_, at)| *at))
                    .collect::<Vec<_>>(),
            )
            .bind(stats.iter().map(|(ep, _)| ep.as_str()).collect::<Vec<_>>())
            .bind(stats.iter().map(|(_, b)| b.bucket).collect::<Vec<_>>())
            .bind(column(&|b| b.attempts))
            .bind(column(&|b| b.successes))
            .bind(column(&|b| b.failures))
            .bind(column(&|b| b.latency_sum_ms));
        for i in 0..herald_policy::stats::HISTOGRAM_LEN {
            query = query.bind(column(&|b| b.histogram[i]));
        }
        let count = |v: u32| i32::try_from(v).unwrap_or(i32::MAX);
        query = query
            .bind(cs.iter().map(|c| c.state.code()).collect::<Vec<_>>())
            .bind(cs.iter().map(|c| c.since).collect::<Vec<_>>())
            .bind(cs.iter().map(|c| c.until).collect::<Vec<_>>())
            .bind(cs.iter().map(|c| c.cooldown_ms).collect::<Vec<_>>())
            .bind(cs.iter().map(|c| c.probe_by.as_deref()).collect::<Vec<_>>())
            .bind(cs.iter().map(|c| c.window.started_at).collect::<Vec<_>>())
            .bind(
                cs.iter()
                    .map(|c| count(c.window.attempts))
                    .collect::<Vec<_>>(),
            )
            .bind(
                cs.iter()
                    .map(|c| count(c.window.failures))
                    .collect::<Vec<_>>(),
            )
            .bind(
                cs.iter()
                    .map(|c| count(c.window.prev_attempts))
                    .collect::<Vec<_>>(),
            )
            .bind(
                cs.iter()
                    .map(|c| count(c.window.prev_failures))
                    .collect::<Vec<_>>(),
            );
        let rows = query.fetch_all(&mut *tx).await?;
        tx.commit().await?;
        // The moved deliveries' rows carry the token that moved them; the
        // rest are endpoints.
        let mut moved_by: HashSet<(String, String)> = HashSet::new();
        let mut streaks = Vec::new();
        for r in &rows {
            if let Some(tok) = get::<Option<String>>(r, "moved_tok")? {
                moved_by.insert((get(r, "id")?, tok));
            } else if get::<i32>(r, "batch_failures")? > 0 {
                streaks.push(StreakUpdate {
                    endpoint_id: EndpointId::from_trusted(get(r, "id")?),
                    app_id: AppId::from_trusted(get(r, "app_id")?),
                    fail_streak: u32_of(get(r, "fail_streak")?),
                    streak_started_at: get(r, "streak_started_at")?,
                    disabled: get(r, "disabled")?,
                });
            }
        }
        streaks.sort_by(|a, b| a.endpoint_id.as_str().cmp(b.endpoint_id.as_str()));
        // As in `moves`, the first completion holding a lease is the one
        // that moved it.
        let moved = batch
            .iter()
            .map(|c| {
                moved_by.remove(&(
                    c.attempt.delivery_id.as_str().to_owned(),
                    c.lease_token.clone(),
                ))
            })
            .collect();
        Ok(Completed {
            moved,
            streaks,
            circuits,
        })
    }

    async fn release(&self, id: &DeliveryId, lease_token: &str, now: Millis) -> StoreResult<()> {
        // Due now: another process may take it.
        sqlx::query(AssertSqlSafe(waking(
            "UPDATE deliveries SET state = 0, next_attempt_at = $1, lease_token = NULL, updated_at = $1 \
             WHERE id = $2 AND lease_token = $3 RETURNING TRUE AS wakes",
            4,
        )))
        .bind(now)
        .bind(id.as_str())
        .bind(lease_token)
        .bind(&self.wake_channel)
        .fetch_one(&self.pool)
        .await?;
        Ok(())
    }

    async fn throttle_waiting(&self) -> StoreResult<Vec<ThrottleWaiting>> {
        self.throttle_waiting_where(None).await
    }

    async fn throttle_waiting_of(&self, endpoint: &EndpointId) -> StoreResult<u64> {
        let waiting = self.throttle_waiting_where(Some(endpoint)).await?;
        Ok(waiting.first().map_or(0, |w| w.waiting))
    }

    async fn listen_for_work(&self, wake: std::sync::Arc<Notify>) -> StoreResult<()> {
        let channel = self.wake_channel.clone();
        spawn_listener(self, &channel, "work", wake).await
    }
}

#[cfg(test)]
#[path = "queue_tests.rs"]
mod tests;

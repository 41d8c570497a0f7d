//! The hot path on SQLite: ingest (fan-out, and the batch's own claim),
//! claim (the walk of the due head, parking and holding), complete (attempts,
//! streaks, stats buckets) and release, each a job on the writer thread.

use super::*;
use crate::crypto::Keyring;

/// A full endpoint's due deliveries are parked once they have waited this
/// long (see `walk_due_head`).
const PARK_AFTER_MS: Millis = 1_000;
/// Rows one claim sets aside at most (parks or holds); the next claims go
/// on from there, so that no claim holds the writer for a whole stuck
/// backlog. Rows of a full endpoint too young to park are passed without
/// counting: there are at most a second's worth of them, and stopping at
/// them would leave the claimable rows behind them waiting (the fairness
/// bench's healthy p99 went from 1.5× to 10–14× with them counted).
const PASSED_PER_CLAIM: usize = 2_000;

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
        )
        .map_err(map_err)?;
    let mut endpoints_q = conn
        .prepare_cached(
            "SELECT id, filter_types, channels, disabled, url, secret, old_secrets, headers, rate_limit, ordering \
             FROM endpoints WHERE app_id = ?1 AND (disabled = 0 OR disabled_by = 'auto')",
        )
        .map_err(map_err)?;
    // A delivery claimed at ingest is born `delivering` under a lease, just
    // as `claim_tx` would leave it; the others are born pending. A
    // scheduled message's cycle starts at its `deliverAt` (the age cap
    // counts from there).
    let mut insert_delivery = conn
        .prepare_cached(
            "INSERT INTO deliveries (id, msg_id, endpoint_id, app_id, state, next_attempt_at, lease_token, \
             cycle_started_at, created_at, updated_at, queued_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?9, ?8, ?8, ?10)",
        )
        .map_err(map_err)?;
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
    let mut last_place = conn
        .prepare_cached(
            "SELECT MAX(queued_at) FROM deliveries INDEXED BY deliveries_fifo \
             WHERE endpoint_id = ?1 AND queued_at IS NOT NULL AND state < 2",
        )
        .map_err(map_err)?;
    let mut fifo_last: HashMap<String, Option<Millis>> = HashMap::new();
    let mut app_exists = conn
        .prepare_cached("SELECT 1 FROM applications WHERE id = ?1")
        .map_err(map_err)?;
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
                let k = app_exists
                    .exists(params![m.app_id.as_str()])
                    .map_err(map_err)?;
                apps_known.insert(m.app_id.as_str().to_owned(), k);
                k
            }
        };
        if !known {
            outcomes.push(InsertOutcome::NoSuchApp);
            continue;
        }
        let inserted = insert_msg
            .execute(params![
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
            ])
            .map_err(map_err)?;
        if inserted == 0 {
            outcomes.push(InsertOutcome::DuplicateEventId);
            continue;
        }
        if !endpoints_of.contains_key(m.app_id.as_str()) {
            let mut eps = Vec::new();
            let mut rs = endpoints_q
                .query(params![m.app_id.as_str()])
                .map_err(map_err)?;
            while let Some(r) = rs.next().map_err(map_err)? {
                if EndpointOrdering::from_stored(&get::<String>(r, "ordering")?)
                    == EndpointOrdering::Fifo
                {
                    if let std::collections::hash_map::Entry::Vacant(slot) =
                        fifo_last.entry(get::<String>(r, "id")?)
                    {
                        let last: Option<Millis> = last_place
                            .query_row(params![slot.key()], |row| row.get(0))
                            .map_err(map_err)?;
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
            insert_delivery
                .execute(params![
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
                ])
                .map_err(map_err)?;
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
        )
        .map_err(map_err)?
        .query_row(params![key], |r| r.get(0))
        .optional()
        .map_err(map_err)?;
    if let Some(id) = existing {
        return Ok(AppId::from_trusted(id));
    }
    conn.prepare_cached(
        "INSERT INTO applications (id, uid, name, rate_limit, metadata, created_at, updated_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )
    .map_err(map_err)?
    .execute(params![
        app.id.as_str(),
        app.uid,
        app.name,
        app.rate_limit,
        to_json(&app.metadata)?,
        app.created_at,
        app.updated_at
    ])
    .map_err(map_err)?;
    Ok(app.id.clone())
}

fn claim_tx(
    conn: &Connection,
    keys: &Keyring,
    now: Millis,
    lease_until: Millis,
    limit: usize,
    in_flight: &HashMap<EndpointId, usize>,
    (endpoint_cap, unlisted_cap): (usize, usize),
) -> StoreResult<Vec<ClaimedDelivery>> {
    let saturated: HashSet<&str> = saturated(in_flight, endpoint_cap).into_iter().collect();
    unpark(conn, now, in_flight, (endpoint_cap, unlisted_cap))?;
    let mut room = Room::new(limit, in_flight, endpoint_cap, unlisted_cap);
    let mut head = walk_due_head(conn, now, claim_window(limit), &mut room, &saturated)?;
    if !head.spare.is_empty() && !room.is_full() {
        fresh_from_the_top(conn, now, &mut room, &saturated, &mut head)?;
        for (id, endpoint) in std::mem::take(&mut head.spare) {
            if room.is_full() {
                break;
            }
            if room.take(&endpoint) {
                head.picked.push((id, None));
            }
        }
    }
    set_aside(conn, &head)?;
    let picked = std::mem::take(&mut head.picked);
    if picked.is_empty() {
        return Ok(Vec::new());
    }
    let token = ulid::Ulid::new().to_string();
    let mut take = conn
        .prepare_cached(
            "UPDATE deliveries SET state = 1, next_attempt_at = ?1, lease_token = ?2, updated_at = ?3 \
             WHERE id = ?4 \
             RETURNING id, msg_id, app_id, endpoint_id, attempts, cycle_started_at, cycle_base, manual",
        )
        .map_err(map_err)?;
    let mut details = conn
        .prepare_cached(
            "SELECT m.event_type, m.payload, e.url, e.secret, e.old_secrets, e.headers, m.traceparent, \
             e.ordering = 'fifo' FROM messages m, endpoints e \
             WHERE m.id = ?1 AND e.id = ?2",
        )
        .map_err(map_err)?;
    let mut out = Vec::with_capacity(picked.len());
    for (id, send_at) in &picked {
        let claimed = take
            .query_row(params![lease_until, token, now, id], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, i64>(4)?,
                    r.get::<_, i64>(5)?,
                    r.get::<_, i64>(6)?,
                    r.get::<_, i64>(7)?,
                ))
            })
            .map_err(map_err)?;
        let (id, msg_id, app_id, endpoint_id, attempts, cycle_started_at, cycle_base, manual) =
            claimed;
        // The take names no `parked`, so it counts itself (counts.rs): a
        // pending row is now delivering; an expired lease stays so. Never
        // held: the walk reads only rows with `parked = 0`.
        if !head.expired.contains(&id) {
            counts::moved(&endpoint_id, 0, 1, false)?;
        }
        let (event_type, payload, url, secret, old_secrets, headers, traceparent, ordered) =
            details
                .query_row(params![msg_id, endpoint_id], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, String>(4)?,
                        r.get::<_, String>(5)?,
                        r.get::<_, Option<String>>(6)?,
                        r.get::<_, bool>(7)?,
                    ))
                })
                .map_err(map_err)?;
        let to = SendTo::from_columns(
            keys,
            &endpoint_id,
            url,
            &secret,
            &old_secrets,
            &headers,
            now,
        )?;
        out.push(ClaimedDelivery {
            id: DeliveryId::from_trusted(id),
            lease_token: token.clone(),
            msg_id: MsgId::from_trusted(msg_id),
            app_id: AppId::from_trusted(app_id),
            endpoint_id: EndpointId::from_trusted(endpoint_id),
            url: to.url,
            secret: to.secret,
            old_secrets: to.old_secrets,
            headers: to.headers,
            unreadable: to.unreadable,
            event_type,
            payload,
            traceparent,
            attempts: u32_of(attempts),
            cycle_started_at,
            cycle_base: u32_of(cycle_base),
            manual: manual != 0,
            send_at: send_at.map(|(at, _)| at),
            throttle_rate: send_at.map(|(_, rate)| rate),
            ordered,
        });
    }
    Ok(out)
}

/// What one walk of the claim index's due head found.
#[derive(Debug, Default)]
struct DueHead {
    /// Claimable and within the claim's room: the claim takes these, each
    /// with its throttle slot if its endpoint has one.
    picked: Vec<(String, Option<(Millis, u32)>)>,
    /// (delivery, endpoint): of endpoints without room (full, throttled
    /// out of slots, or a FIFO endpoint's rows behind its head) and due
    /// for over `PARK_AFTER_MS`, to park.
    park: Vec<(String, String)>,
    /// Pending, of disabled endpoints: to hold.
    hold: Vec<String>,
    /// (delivery, key): rows of FIFO or throttled endpoints met for the
    /// first time, given their place in the endpoint's queue
    /// (`queued_at`, see migration 0015).
    queue: Vec<(String, Millis)>,
    /// (endpoint, theoretical arrival time): throttles moved on.
    throttles: Vec<(String, i64)>,
    /// (delivery, endpoint): claimable retries met after the retries'
    /// share of the slots was taken, in due order.
    spare: Vec<(String, String)>,
    /// Claimable rows met that were delivering already (expired leases):
    /// taking them again changes no count.
    expired: HashSet<String>,
}

/// A FIFO endpoint's head as far as the walk knows it: (key, msg id,
/// delivery id), ordered by key then message id.
type Head = (Millis, String, String);

/// A FIFO endpoint's stored head, and whether it is in flight
/// (delivering under a lease that has not ended).
type StoredHead = Option<(Head, bool)>;

/// What a claim's walk holds of an endpoint it met: read with its first
/// row (one join per row, no query per endpoint but a FIFO endpoint's head).
struct EndpointRule {
    fifo: bool,
    throttle: Option<ThrottleSlots>,
    /// A FIFO endpoint's live delivery first in its queue (None: none
    /// queued yet).
    head: Option<Head>,
    /// That head is in flight. It is out already, so no row met for the
    /// first time takes a place before it, and nothing of the endpoint is
    /// claimable until its attempt is over: one request at a time.
    in_flight: bool,
}

/// The first live delivery of FIFO endpoint `endpoint` in queue order, and
/// whether it is in flight at `now`. A FIFO endpoint's delivery in flight is
/// always its head: it was the head when claimed, a row met later never
/// takes a place before it (`walk_due_head`), and switching an endpoint to
/// FIFO puts those in flight first (`queue_waiting`).
fn fifo_head(conn: &Connection, endpoint: &str, now: Millis) -> StoreResult<StoredHead> {
    conn.prepare_cached(
        "SELECT queued_at, msg_id, id, state = 1 AND next_attempt_at > ?2 \
         FROM deliveries INDEXED BY deliveries_fifo \
         WHERE endpoint_id = ?1 AND queued_at IS NOT NULL AND state < 2 \
         ORDER BY queued_at, msg_id LIMIT 1",
    )
    .map_err(map_err)?
    .query_row(params![endpoint, now], |r| {
        Ok(((r.get(0)?, r.get(1)?, r.get(2)?), r.get(3)?))
    })
    .optional()
    .map_err(map_err)
}

/// Whether a row met for the first time with queue place `me` would come
/// before a FIFO endpoint's head in flight: such a row (a scheduled
/// message fallen due, created before the head was queued) waits
/// unqueued, neither taken nor parked, until that attempt is over; then
/// it takes its place in order.
fn ahead_of_flight(stored: &StoredHead, me: &Head) -> bool {
    stored
        .as_ref()
        .is_some_and(|(head, in_flight)| *in_flight && me < head)
}

/// Walks the due head of `deliveries_due`, oldest first, once: picks the
/// claim's deliveries (at most `room` allows, from the first `window`
/// claimable rows) and notes on the way the rows every claim would
/// otherwise pass over again: a disabled endpoint's (to hold) and, once
/// they have waited `PARK_AFTER_MS`, those of an endpoint without room: a
/// full one's, a throttled one's with no send slot left within the
/// horizon, a FIFO one's behind its head (to park). It stops there, or
/// after setting aside `PASSED_PER_CLAIM` rows, so a claim reads what it
/// takes and what it sets aside, whatever lies behind: a backlog of
/// claimable rows costs it nothing.
fn walk_due_head(
    conn: &Connection,
    now: Millis,
    window: usize,
    room: &mut Room,
    saturated: &HashSet<&str>,
) -> StoreResult<DueHead> {
    // INDEXED BY: the walk is in due order, and must not become a scan of
    // an endpoint's whole history. The endpoint's columns come by its
    // primary key, per row read.
    let mut due = conn
        .prepare_cached(
            "SELECT d.id, d.endpoint_id, d.state, d.next_attempt_at, d.msg_id, d.queued_at, d.updated_at, d.attempts, \
                    e.disabled AS off, e.rate_limit, e.ordering, e.throttle_tat \
             FROM deliveries d INDEXED BY deliveries_due JOIN endpoints e ON e.id = d.endpoint_id \
             WHERE d.state < 2 AND d.parked = 0 AND d.next_attempt_at <= ?1 \
             ORDER BY d.next_attempt_at",
        )
        .map_err(map_err)?;
    // Only rows that have waited a while are parked: a busy but healthy
    // endpoint's rows are claimed within milliseconds and never pay for it.
    let overdue = now.saturating_sub(PARK_AFTER_MS);
    let mut head = DueHead::default();
    let mut rules: HashMap<String, EndpointRule> = HashMap::new();
    // The stored heads of full FIFO endpoints with rows never queued, read
    // once per walk (such a row is queued once, as it is parked).
    let mut full_heads: HashMap<String, StoredHead> = HashMap::new();
    // Where in `head.picked` each FIFO endpoint's head taken by this walk is.
    let mut fifo_picked: HashMap<String, usize> = HashMap::new();
    let (mut claimable, mut passed, mut retries) = (0, 0, 0);
    let limit = room.remaining();
    let retry_share = retry_share(limit);
    let mut rs = due.query(params![now]).map_err(map_err)?;
    while let Some(r) = rs.next().map_err(map_err)? {
        let id: String = get(r, "id")?;
        let endpoint: String = get(r, "endpoint_id")?;
        // (A delivering row here is a lease that expired: claimable, but
        // neither parked nor held.)
        let pending = get::<i64>(r, "state")? == 0;
        if !pending {
            head.expired.insert(id.clone());
        }
        let parkable = pending && get::<Millis>(r, "next_attempt_at")? <= overdue;
        if get::<i64>(r, "off")? != 0 {
            if pending {
                head.hold.push(id);
                passed += 1;
            }
        } else if saturated.contains(endpoint.as_str()) {
            if parkable {
                // A FIFO or throttled endpoint's row gets its queue place
                // as it is parked: `unpark` gives such an endpoint back its
                // queue's head, which a row never queued would never be (a
                // FIFO endpoint behind an open breaker lost its new rows).
                let ordering = get::<String>(r, "ordering")?;
                let queues = !may_hand_off(true, get(r, "rate_limit")?, &ordering);
                if queues && get::<Option<Millis>>(r, "queued_at")?.is_none() {
                    let key: Millis = get(r, "updated_at")?;
                    if EndpointOrdering::from_stored(&ordering) == EndpointOrdering::Fifo {
                        let stored = match full_heads.get(&endpoint) {
                            Some(h) => h.clone(),
                            None => {
                                let h = fifo_head(conn, &endpoint, now)?;
                                full_heads.insert(endpoint.clone(), h.clone());
                                h
                            }
                        };
                        let me = (key, get::<String>(r, "msg_id")?, id.clone());
                        if ahead_of_flight(&stored, &me) {
                            continue;
                        }
                    }
                    head.queue.push((id.clone(), key));
                }
                head.park.push((id, endpoint));
                passed += 1;
            }
        } else {
            if !rules.contains_key(&endpoint) {
                let fifo = EndpointOrdering::from_stored(&get::<String>(r, "ordering")?)
                    == EndpointOrdering::Fifo;
                let tat: i64 = get(r, "throttle_tat")?;
                let stored = if fifo {
                    fifo_head(conn, &endpoint, now)?
                } else {
                    None
                };
                let in_flight = stored.as_ref().is_some_and(|(_, busy)| *busy);
                let rule = EndpointRule {
                    fifo,
                    throttle: throttled_rate(get(r, "rate_limit")?)
                        .map(|rate| ThrottleSlots::new(rate, tat, now)),
                    head: stored.map(|(h, _)| h),
                    in_flight,
                };
                rules.insert(endpoint.clone(), rule);
            }
            let Some(rule) = rules.get_mut(&endpoint) else {
                continue;
            };
            let special = rule.fifo || rule.throttle.is_some();
            // A row kept out of the queue this time (see `ahead_of_flight`):
            // unqueued, so it must not be parked either (`unpark` gives a
            // FIFO endpoint back only its queued head).
            let mut waits_unqueued = false;
            if special && get::<Option<Millis>>(r, "queued_at")?.is_none() {
                let key: Millis = get(r, "updated_at")?;
                // Not yet in the index `fifo_head` read: it may be the
                // head itself, unless the head is in flight.
                let me = (key, get::<String>(r, "msg_id")?, id.clone());
                if rule.fifo && rule.in_flight && rule.head.as_ref().is_some_and(|h| me < *h) {
                    waits_unqueued = true;
                } else {
                    head.queue.push((id.clone(), key));
                    if rule.fifo && rule.head.as_ref().is_none_or(|h| me < *h) {
                        rule.head = Some(me);
                    }
                }
            }
            // A head in flight is not due, so every row met is behind it.
            let blocked = (rule.fifo
                && (rule.in_flight || rule.head.as_ref().is_some_and(|h| h.2 != id)))
                || rule.throttle.as_ref().is_some_and(|t| !t.available());
            if blocked {
                if parkable && !waits_unqueued {
                    head.park.push((id, endpoint));
                    passed += 1;
                }
            } else {
                claimable += 1;
                let retry = get::<i64>(r, "attempts")? > 0;
                if retry && !special && retries >= retry_share {
                    // Over the retries' share: taken only if first
                    // attempts leave slots over (see `fresh_from_the_top`).
                    if head.spare.len() < limit {
                        head.spare.push((id, endpoint));
                    }
                } else if let Some(&at) = fifo_picked.get(&endpoint) {
                    // This FIFO endpoint's head was taken earlier in this
                    // walk, and this row, never queued (a scheduled message
                    // fallen due: met later, as it is due later than it was
                    // created), comes before it: the head is this one now
                    // (same endpoint, same room and slot). The row it
                    // replaces waits behind it, with its queue place.
                    if let Some(p) = head.picked.get_mut(at) {
                        p.0 = id;
                    }
                } else {
                    let took = if rule.fifo {
                        room.take_one(&endpoint)
                    } else {
                        room.take(&endpoint)
                    };
                    if took {
                        if rule.fifo {
                            fifo_picked.insert(endpoint.clone(), head.picked.len());
                        }
                        let slot = rule
                            .throttle
                            .as_mut()
                            .and_then(|t| t.take().map(|at| (at, t.rate())));
                        head.picked.push((id, slot));
                        retries += usize::from(retry);
                    }
                }
                if room.is_full() || claimable >= window {
                    break;
                }
            }
        }
        if passed >= PASSED_PER_CLAIM {
            break;
        }
    }
    head.throttles = rules
        .into_iter()
        .filter_map(|(ep, rule)| {
            let t = rule.throttle?;
            (t.taken() > 0).then(|| (ep, t.tat_us()))
        })
        .collect();
    Ok(head)
}

/// Retries beyond their share left slots free (a retry storm at the head
/// of the due index): fills them with first attempts, newest due first
/// from the other end of `deliveries_due` (fresh deliveries are the most
/// recently due), of endpoints with room and no throttle or FIFO rule
/// (those are the walk's); at most a window of rows is read.
fn fresh_from_the_top(
    conn: &Connection,
    now: Millis,
    room: &mut Room,
    saturated: &HashSet<&str>,
    head: &mut DueHead,
) -> StoreResult<()> {
    let mut top = conn
        .prepare_cached(
            "SELECT d.id, d.endpoint_id FROM deliveries d INDEXED BY deliveries_due \
               JOIN endpoints e ON e.id = d.endpoint_id \
             WHERE d.state < 2 AND d.parked = 0 AND d.next_attempt_at <= ?1 AND d.state = 0 \
               AND d.attempts = 0 AND e.disabled = 0 AND e.ordering = 'none' \
               AND COALESCE(e.rate_limit, 0) <= 0 \
             ORDER BY d.next_attempt_at DESC LIMIT ?2",
        )
        .map_err(map_err)?;
    let window = claim_window(room.remaining());
    let picked: HashSet<String> = head.picked.iter().map(|(id, _)| id.clone()).collect();
    let mut rs = top
        .query(params![now, i64::try_from(window).unwrap_or(i64::MAX)])
        .map_err(map_err)?;
    while let Some(r) = rs.next().map_err(map_err)? {
        if room.is_full() {
            break;
        }
        let id: String = get(r, "id")?;
        let endpoint: String = get(r, "endpoint_id")?;
        if picked.contains(&id) || saturated.contains(endpoint.as_str()) {
            continue;
        }
        if room.take(&endpoint) {
            head.picked.push((id, None));
        }
    }
    Ok(())
}

/// Writes what a walk found: the rows to park or hold out of the claim
/// index, the queue places of rows met for the first time, and the
/// throttles moved on.
fn set_aside(conn: &Connection, head: &DueHead) -> StoreResult<()> {
    if !head.queue.is_empty() {
        let mut queue = conn
            .prepare_cached("UPDATE deliveries SET queued_at = ?1 WHERE id = ?2")
            .map_err(map_err)?;
        for (id, key) in &head.queue {
            queue.execute(params![key, id]).map_err(map_err)?;
        }
    }
    if !head.throttles.is_empty() {
        let mut advance = conn
            .prepare_cached("UPDATE endpoints SET throttle_tat = ?1 WHERE id = ?2")
            .map_err(map_err)?;
        for (ep, tat) in &head.throttles {
            advance.execute(params![tat, ep]).map_err(map_err)?;
        }
    }
    if head.park.is_empty() && head.hold.is_empty() {
        return Ok(());
    }
    let mut set = conn
        .prepare_cached("UPDATE deliveries SET parked = ?1 WHERE id = ?2")
        .map_err(map_err)?;
    for id in &head.hold {
        set.execute(params![2, id]).map_err(map_err)?;
    }
    let mut remember = conn
        .prepare_cached(
            "INSERT INTO parked_endpoints (endpoint_id) VALUES (?1) ON CONFLICT DO NOTHING",
        )
        .map_err(map_err)?;
    let mut noted = HashSet::new();
    for (id, endpoint) in &head.park {
        set.execute(params![1, id]).map_err(map_err)?;
        if noted.insert(endpoint.as_str()) {
            remember.execute(params![endpoint]).map_err(map_err)?;
        }
    }
    Ok(())
}

/// Gives endpoints with room (and enabled) back as many of their parked
/// deliveries as they can take, oldest first; an endpoint with none left
/// is forgotten. A throttled endpoint's room is the send slots left within
/// the horizon; a FIFO endpoint gets back only its head, if that is
/// parked (and is kept while any of its rows are). Each row is parked and
/// unparked at most once per wait.
fn unpark(
    conn: &Connection,
    now: Millis,
    in_flight: &HashMap<EndpointId, usize>,
    (endpoint_cap, unlisted_cap): (usize, usize),
) -> StoreResult<()> {
    let parked: Vec<(String, bool, Option<i64>, String, i64)> = {
        let mut stmt = conn
            .prepare_cached(
                "SELECT p.endpoint_id, e.disabled, e.rate_limit, e.ordering, e.throttle_tat \
                 FROM parked_endpoints p JOIN endpoints e ON e.id = p.endpoint_id",
            )
            .map_err(map_err)?;
        let ids = stmt
            .query_map([], |r| {
                Ok((
                    r.get(0)?,
                    r.get::<_, i64>(1)? != 0,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                ))
            })
            .map_err(map_err)?;
        ids.collect::<Result<_, _>>().map_err(map_err)?
    };
    let mut unpark = conn
        .prepare_cached(
            "UPDATE deliveries SET parked = 0 WHERE id IN \
             (SELECT id FROM deliveries WHERE endpoint_id = ?1 AND parked = 1 ORDER BY next_attempt_at LIMIT ?2)",
        )
        .map_err(map_err)?;
    let mut unpark_head = conn
        .prepare_cached(
            "UPDATE deliveries SET parked = 0 WHERE parked = 1 AND id = \
             (SELECT id FROM deliveries INDEXED BY deliveries_fifo \
               WHERE endpoint_id = ?1 AND queued_at IS NOT NULL AND state < 2 \
               ORDER BY queued_at, msg_id LIMIT 1)",
        )
        .map_err(map_err)?;
    let mut any_parked = conn
        .prepare_cached(
            "SELECT 1 FROM deliveries INDEXED BY deliveries_parked WHERE endpoint_id = ?1 AND parked = 1",
        )
        .map_err(map_err)?;
    let mut forget = conn
        .prepare_cached("DELETE FROM parked_endpoints WHERE endpoint_id = ?1")
        .map_err(map_err)?;
    for (ep, disabled, rate_limit, ordering, tat) in parked {
        // A disabled endpoint's deliveries wait for it to be enabled.
        if disabled {
            continue;
        }
        let mut room = match in_flight.get(&EndpointId::from_trusted(ep.clone())) {
            Some(busy) => endpoint_cap.saturating_sub(*busy),
            None => unlisted_cap.min(endpoint_cap),
        };
        if room == 0 {
            continue;
        }
        if EndpointOrdering::from_stored(&ordering) == EndpointOrdering::Fifo {
            unpark_head.execute(params![ep]).map_err(map_err)?;
            if !any_parked.exists(params![ep]).map_err(map_err)? {
                forget.execute(params![ep]).map_err(map_err)?;
            }
            continue;
        }
        if let Some(rate) = throttled_rate(rate_limit) {
            let mut slots = ThrottleSlots::new(rate, tat, now);
            let mut free = 0;
            while free < room && slots.take().is_some() {
                free += 1;
            }
            room = free;
            if room == 0 {
                continue;
            }
        }
        let moved = unpark
            .execute(params![ep, i64::try_from(room).unwrap_or(i64::MAX)])
            .map_err(map_err)?;
        if moved < room {
            forget.execute(params![ep]).map_err(map_err)?;
        }
    }
    Ok(())
}

/// A FIFO endpoint's waiting deliveries take their places in its queue,
/// by creation (when it is switched to FIFO at `now`; those made later get
/// theirs from the claim that first meets them). Only those due by `now`:
/// a pending one due later (a scheduled message) would be the head and
/// hold every one behind it until it fell due (up to `HERALD_MAX_AGE`); it
/// takes its place when a claim meets it due, as any row never queued.
/// Those in flight (delivering) go first, before every pending one: they
/// are out already, so they hold the queue until their attempts are over,
/// and an in-flight delivery of a FIFO endpoint is always its head (see
/// `fifo_head`).
pub(super) fn queue_waiting(conn: &Connection, endpoint_id: &str, now: Millis) -> StoreResult<()> {
    conn.prepare_cached(
        "UPDATE deliveries SET queued_at = created_at \
         WHERE endpoint_id = ?1 AND state < 2 AND queued_at IS NULL \
           AND (state = 1 OR next_attempt_at <= ?2)",
    )
    .map_err(map_err)?
    .execute(params![endpoint_id, now])
    .map_err(map_err)?;
    conn.prepare_cached(
        "UPDATE deliveries SET queued_at = ( \
             SELECT MIN(queued_at) - 1 FROM deliveries INDEXED BY deliveries_fifo \
             WHERE endpoint_id = ?1 AND queued_at IS NOT NULL AND state < 2 AND state = 0) \
         WHERE endpoint_id = ?1 AND state = 1 AND queued_at >= ( \
             SELECT MIN(queued_at) FROM deliveries INDEXED BY deliveries_fifo \
             WHERE endpoint_id = ?1 AND queued_at IS NOT NULL AND state < 2 AND state = 0)",
    )
    .map_err(map_err)?
    .execute(params![endpoint_id])
    .map_err(map_err)?;
    Ok(())
}

/// Lets an enabled endpoint's held deliveries back into the claim index.
pub(super) fn unhold(conn: &Connection, endpoint_id: &str) -> StoreResult<()> {
    conn.prepare_cached(
        "UPDATE deliveries INDEXED BY deliveries_held SET parked = 0 \
         WHERE endpoint_id = ?1 AND parked = 2",
    )
    .map_err(map_err)?
    .execute(params![endpoint_id])
    .map_err(map_err)?;
    Ok(())
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
        )
        .map_err(map_err)?;
    // The lease token guard leaves a re-claimed delivery to its new holder.
    let mut update = conn
        .prepare_cached(
            "UPDATE deliveries SET state = ?1, attempts = ?2, next_attempt_at = ?3, lease_token = NULL, manual = 0, \
             dead_reason = ?4, last_status = ?5, last_error = ?6, updated_at = ?7 \
             WHERE id = ?8 AND lease_token = ?9",
        )
        .map_err(map_err)?;
    let mut moved = Vec::with_capacity(batch.len());
    for c in batch {
        let a = &c.attempt;
        insert
            .execute(params![
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
            ])
            .map_err(map_err)?;
        let (state, next_at, reason) = match c.next {
            NextState::Delivered => (DeliveryState::Delivered, c.now, None),
            NextState::Retry { at } => (DeliveryState::Pending, at, None),
            NextState::Dead(r) => (DeliveryState::Dead, c.now, Some(r.as_str())),
        };
        let changed = update
            .execute(params![
                state as i64,
                i64::from(a.attempt_number),
                next_at,
                reason,
                a.status_code.map(i64::from),
                a.error,
                c.now,
                a.delivery_id.as_str(),
                c.lease_token,
            ])
            .map_err(map_err)?;
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
    let mut read_circuit = conn
        .prepare_cached(&format!(
            "SELECT {CIRCUIT_COLUMNS} FROM endpoints WHERE id = ?1"
        ))
        .map_err(map_err)?;
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
        )
        .map_err(map_err)?;
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
            .optional()
            .map_err(map_err)?;
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
            .optional()
            .map_err(map_err)?;
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
        )
        .map_err(map_err)?;
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
        add.execute(rusqlite::params_from_iter(values))
            .map_err(map_err)?;
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
                .optional()
                .map_err(map_err)?;
            if found.is_none() {
                return Ok(false);
            }
            c.execute(
                "INSERT INTO messages (id, app_id, event_type, payload, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![m.id.as_str(), m.app_id.as_str(), m.event_type, m.payload, m.created_at],
            )
            .map_err(map_err)?;
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
            )
            .map_err(map_err)?;
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
            )
            .map_err(map_err)?
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
                .optional()
                .map_err(map_err)?;
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
    let mut stmt = c
        .prepare_cached(
            "SELECT e.id, e.rate_limit, \
                    (SELECT COUNT(*) FROM deliveries d INDEXED BY deliveries_fifo \
                      WHERE d.endpoint_id = e.id AND d.queued_at IS NOT NULL AND d.state < 2 \
                        AND d.state = 0 AND d.parked < 2) AS waiting \
             FROM endpoints e INDEXED BY endpoints_throttled \
             WHERE e.rate_limit > 0 AND e.disabled = 0 AND (?1 IS NULL OR e.id = ?1) \
             ORDER BY e.id",
        )
        .map_err(map_err)?;
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

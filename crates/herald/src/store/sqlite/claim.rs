//! The claim on SQLite: the walk of the due head (oldest first, stepped
//! from Rust), parking and holding what it passes, the throttle's slots,
//! FIFO heads and the retry share, all inside the writer's one job. How
//! and why: docs/design/sqlite.md and docs/design/throttle-and-fifo.md.

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
/// healthy endpoints' latency rose severalfold with them counted).
const PASSED_PER_CLAIM: usize = 2_000;

pub(super) fn claim_tx(
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
        )?;
    let mut details = conn
        .prepare_cached(
            "SELECT m.event_type, m.payload, e.url, e.secret, e.old_secrets, e.headers, m.traceparent, \
             e.ordering = 'fifo' FROM messages m, endpoints e \
             WHERE m.id = ?1 AND e.id = ?2",
        )?;
    let mut out = Vec::with_capacity(picked.len());
    for (id, send_at) in &picked {
        let claimed = take.query_row(params![lease_until, token, now, id], |r| {
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
        })?;
        let (id, msg_id, app_id, endpoint_id, attempts, cycle_started_at, cycle_base, manual) =
            claimed;
        // The take names no `parked`, so it counts itself (counts.rs): a
        // pending row is now delivering; an expired lease stays so. Never
        // held: the walk reads only rows with `parked = 0`.
        if !head.expired.contains(&id) {
            counts::moved(&endpoint_id, 0, 1, false)?;
        }
        let (event_type, payload, url, secret, old_secrets, headers, traceparent, ordered) =
            details.query_row(params![msg_id, endpoint_id], |r| {
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
            })?;
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
    /// Of disabled endpoints (pending, or a lease that expired): to hold.
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
    )?
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
        )?;
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
    let mut rs = due.query(params![now])?;
    while let Some(r) = rs.next()? {
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
            // Its endpoint is disabled: held, pending or not. A lease that
            // expired there (its process died) is given up and held with
            // the rest, for enabling to bring back and the age cap to see.
            head.hold.push(id);
            passed += 1;
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
    let mut top = conn.prepare_cached(
        "SELECT d.id, d.endpoint_id FROM deliveries d INDEXED BY deliveries_due \
               JOIN endpoints e ON e.id = d.endpoint_id \
             WHERE d.state < 2 AND d.parked = 0 AND d.next_attempt_at <= ?1 AND d.state = 0 \
               AND d.attempts = 0 AND e.disabled = 0 AND e.ordering = 'none' \
               AND COALESCE(e.rate_limit, 0) <= 0 \
             ORDER BY d.next_attempt_at DESC LIMIT ?2",
    )?;
    let window = claim_window(room.remaining());
    let picked: HashSet<String> = head.picked.iter().map(|(id, _)| id.clone()).collect();
    let mut rs = top.query(params![now, i64::try_from(window).unwrap_or(i64::MAX)])?;
    while let Some(r) = rs.next()? {
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
        let mut queue =
            conn.prepare_cached("UPDATE deliveries SET queued_at = ?1 WHERE id = ?2")?;
        for (id, key) in &head.queue {
            queue.execute(params![key, id])?;
        }
    }
    if !head.throttles.is_empty() {
        let mut advance =
            conn.prepare_cached("UPDATE endpoints SET throttle_tat = ?1 WHERE id = ?2")?;
        for (ep, tat) in &head.throttles {
            advance.execute(params![tat, ep])?;
        }
    }
    if head.park.is_empty() && head.hold.is_empty() {
        return Ok(());
    }
    // Names `parked`: the count trigger counts the move (counts.rs).
    let mut hold = conn.prepare_cached(
        "UPDATE deliveries SET parked = 2, state = 0, lease_token = NULL WHERE id = ?1",
    )?;
    for id in &head.hold {
        hold.execute(params![id])?;
    }
    let mut set = conn.prepare_cached("UPDATE deliveries SET parked = ?1 WHERE id = ?2")?;
    let mut remember = conn.prepare_cached(
        "INSERT INTO parked_endpoints (endpoint_id) VALUES (?1) ON CONFLICT DO NOTHING",
    )?;
    let mut noted = HashSet::new();
    for (id, endpoint) in &head.park {
        set.execute(params![1, id])?;
        if noted.insert(endpoint.as_str()) {
            remember.execute(params![endpoint])?;
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
        let mut stmt = conn.prepare_cached(
            "SELECT p.endpoint_id, e.disabled, e.rate_limit, e.ordering, e.throttle_tat \
                 FROM parked_endpoints p JOIN endpoints e ON e.id = p.endpoint_id",
        )?;
        let ids = stmt.query_map([], |r| {
            Ok((
                r.get(0)?,
                r.get::<_, i64>(1)? != 0,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
            ))
        })?;
        ids.collect::<Result<_, _>>()?
    };
    let mut unpark = conn
        .prepare_cached(
            "UPDATE deliveries SET parked = 0 WHERE id IN \
             (SELECT id FROM deliveries WHERE endpoint_id = ?1 AND parked = 1 ORDER BY next_attempt_at LIMIT ?2)",
        )?;
    let mut unpark_head = conn.prepare_cached(
        "UPDATE deliveries SET parked = 0 WHERE parked = 1 AND id = \
             (SELECT id FROM deliveries INDEXED BY deliveries_fifo \
               WHERE endpoint_id = ?1 AND queued_at IS NOT NULL AND state < 2 \
               ORDER BY queued_at, msg_id LIMIT 1)",
    )?;
    let mut any_parked = conn
        .prepare_cached(
            "SELECT 1 FROM deliveries INDEXED BY deliveries_parked WHERE endpoint_id = ?1 AND parked = 1",
        )?;
    let mut forget = conn.prepare_cached("DELETE FROM parked_endpoints WHERE endpoint_id = ?1")?;
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
            unpark_head.execute(params![ep])?;
            if !any_parked.exists(params![ep])? {
                forget.execute(params![ep])?;
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
        let moved = unpark.execute(params![ep, i64::try_from(room).unwrap_or(i64::MAX)])?;
        if moved < room {
            forget.execute(params![ep])?;
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
    )?
    .execute(params![endpoint_id, now])?;
    conn.prepare_cached(
        "UPDATE deliveries SET queued_at = ( \
             SELECT MIN(queued_at) - 1 FROM deliveries INDEXED BY deliveries_fifo \
             WHERE endpoint_id = ?1 AND queued_at IS NOT NULL AND state < 2 AND state = 0) \
         WHERE endpoint_id = ?1 AND state = 1 AND queued_at >= ( \
             SELECT MIN(queued_at) FROM deliveries INDEXED BY deliveries_fifo \
             WHERE endpoint_id = ?1 AND queued_at IS NOT NULL AND state < 2 AND state = 0)",
    )?
    .execute(params![endpoint_id])?;
    Ok(())
}

/// Lets an enabled endpoint's held deliveries back into the claim index.
pub(super) fn unhold(conn: &Connection, endpoint_id: &str) -> StoreResult<()> {
    conn.prepare_cached(
        "UPDATE deliveries INDEXED BY deliveries_held SET parked = 0 \
         WHERE endpoint_id = ?1 AND parked = 2",
    )?
    .execute(params![endpoint_id])?;
    Ok(())
}

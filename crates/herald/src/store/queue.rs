//! The hot path: ingest → claim → complete. New messages fan out to
//! deliveries (with the handoff claim of an ingest batch), claims lease due
//! deliveries, completions record attempts and move deliveries on.

use super::*;
use crate::crypto::Keyring;

/// The hot path: ingest → claim → complete (and release, and wake-ups).
#[async_trait]
pub trait Queue: Send + Sync {
    /// The outbox write: each message and one delivery per subscribed,
    /// enabled endpoint, all in ONE transaction (group commit). Returns one
    /// outcome per message, in order.
    async fn insert_messages(&self, batch: &[NewMessage]) -> StoreResult<Vec<InsertOutcome>>;
    /// Stores `batch` as [`Queue::insert_messages`] does and, in the same
    /// transaction, claims new deliveries for the caller as [`Queue::claim`]
    /// would with `req` (at most `req.limit` in all, an endpoint's up to
    /// `req.endpoint_cap` counting its `in_flight`, none of a disabled
    /// endpoint; see [`IngestClaim`]): they are stored `delivering` under
    /// the lease. The in-process dispatcher sends these at once instead of
    /// claiming them back from the store (the handoff).
    async fn insert_messages_claiming(
        &self,
        batch: &[NewMessage],
        req: &ClaimRequest<'_>,
    ) -> StoreResult<(Vec<InsertOutcome>, Vec<ClaimedDelivery>)>;
    /// Svix's send-example: stores `m` with one delivery, to `ep` alone
    /// (whatever its filter or channels), pending and due now, in one
    /// transaction. False (nothing stored) if `ep` is not an endpoint of
    /// `m`'s application.
    async fn insert_example(&self, m: &NewMessage, ep: &EndpointId) -> StoreResult<bool>;
    /// Claims due deliveries: marks them delivering until `lease_until`.
    async fn claim(&self, req: &ClaimRequest<'_>) -> StoreResult<Vec<ClaimedDelivery>>;
    /// The earliest `next_attempt_at` of any live delivery a claim could
    /// take (not those held for a disabled endpoint), if any.
    async fn next_due_at(&self) -> StoreResult<Option<Millis>>;
    /// Records attempts and moves deliveries on, all in one transaction;
    /// also keeps each endpoint's failing streak and stats buckets. Returns
    /// which completions moved their delivery (the others' lease token no
    /// longer matched) and the streak of every endpoint with a failure in
    /// the batch. Text is stored as [`storable_batch`] makes it, so nothing
    /// a receiver can send fails the batch.
    async fn complete(&self, batch: &[Completion]) -> StoreResult<Completed> {
        self.complete_with_circuits(batch, &BreakerRule::OFF).await
    }
    /// [`Queue::complete`], stepping each endpoint's circuit breaker with
    /// the batch by `breaker` (`herald_policy::breaker::step`) in the same
    /// transaction: read where the endpoint rows are locked, written with
    /// the streak (no statement per delivery). [`Completed::circuits`]
    /// lists the transitions made.
    async fn complete_with_circuits(
        &self,
        batch: &[Completion],
        breaker: &BreakerRule,
    ) -> StoreResult<Completed>;
    /// Gives back a claimed delivery that was not sent (shutdown): due
    /// again now, as if never claimed. Only the current holder may.
    async fn release(&self, id: &DeliveryId, lease_token: &str, now: Millis) -> StoreResult<()>;
    /// Per throttled, enabled endpoint: its rate and how many of its
    /// pending deliveries a claim has found waiting for a send slot (those
    /// a claim met due and passed, or made to wait, and not yet sent). For
    /// `herald_throttle_waiting` and the health API; cost linear in what
    /// waits, through `deliveries_fifo`.
    async fn throttle_waiting(&self) -> StoreResult<Vec<ThrottleWaiting>>;
    /// [`Queue::throttle_waiting`] of one endpoint (0 when it has no rate
    /// or is disabled): what its health shows, without reading the others'.
    async fn throttle_waiting_of(&self, endpoint: &EndpointId) -> StoreResult<u64>;
    /// Signals `wake` whenever another process commits work that may be
    /// due (PostgreSQL: LISTEN/NOTIFY). Returns once listening has started;
    /// it goes on in the background. A backend used by one process only
    /// needs nothing here: ingest wakes the dispatcher in-process.
    async fn listen_for_work(&self, wake: std::sync::Arc<tokio::sync::Notify>) -> StoreResult<()> {
        let _ = wake;
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewMessage {
    pub id: MsgId,
    pub app_id: AppId,
    pub event_type: String,
    pub event_id: Option<String>,
    /// The payload's JSON text, exactly as it will be sent.
    pub payload: String,
    /// Routing: endpoints with channels receive only messages sharing one.
    pub channels: Option<Vec<String>>,
    pub created_at: Millis,
    /// W3C `traceparent` of the creating request, sent with each attempt.
    pub traceparent: Option<String>,
    /// Svix's message tags (at most 5), for filtering message lists.
    pub tags: Option<Vec<String>>,
    /// Svix's `deliverAt`, as asked: no attempt before then (see
    /// [`NewMessage::due_at`]).
    pub deliver_at: Option<Millis>,
    /// When the payload is erased (`payloadRetentionPeriod`); None: only
    /// `HERALD_PAYLOAD_RETENTION` applies. Reads leave it `None`.
    pub payload_expires_at: Option<Millis>,
    /// Ingest only (reads leave it `None`): Svix's `MessageIn.application`.
    /// The store creates this application in the message's transaction
    /// unless one with its uid exists by then, and stores the message
    /// under whichever it is (`app_id` is then this application's id).
    pub application: Option<App>,
}

impl NewMessage {
    /// A message of `app` with a fresh id and nothing optional set (no
    /// `eventId`, channels, tags, schedule or trace).
    pub fn plain(app: &AppId, event_type: &str, payload: String, created_at: Millis) -> Self {
        NewMessage {
            id: MsgId::generate(),
            app_id: app.clone(),
            event_type: event_type.to_owned(),
            event_id: None,
            payload,
            channels: None,
            created_at,
            traceparent: None,
            tags: None,
            deliver_at: None,
            payload_expires_at: None,
            application: None,
        }
    }

    /// When its deliveries are first due and their retry cycle (and so the
    /// age cap) starts: `deliver_at`, or creation when that is sooner.
    pub fn due_at(&self) -> Millis {
        self.deliver_at
            .map_or(self.created_at, |at| at.max(self.created_at))
    }
}

pub type Message = NewMessage;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InsertOutcome {
    /// Stored, with this many deliveries fanned out.
    Inserted { deliveries: usize },
    /// The app already has a message with this `eventId`.
    DuplicateEventId,
    /// The app does not exist (it was deleted after the caller looked it
    /// up): nothing stored.
    NoSuchApp,
}

/// One throttled endpoint's backlog (see [`Queue::throttle_waiting`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThrottleWaiting {
    pub endpoint_id: EndpointId,
    pub rate: u32,
    pub waiting: u64,
}

#[derive(Debug, Clone)]
pub struct ClaimRequest<'a> {
    pub now: Millis,
    /// Claimed rows stay reserved until then; past it they are due again.
    pub lease_until: Millis,
    /// Claim at most this many in total (the free sending slots).
    pub limit: usize,
    /// Requests now in flight per endpoint, and the cap per endpoint: the
    /// claim never returns more for an endpoint than it has room for, so
    /// the slots go to deliveries that can be sent now.
    pub in_flight: &'a HashMap<EndpointId, usize>,
    pub endpoint_cap: usize,
    /// The room of an endpoint `in_flight` does not list (at most
    /// `endpoint_cap`): the dispatcher gives an endpoint it has not seen
    /// lately a new lane's room, not its whole cap, so that endpoints it
    /// knows nothing of (after a restart, say) cannot take every slot in
    /// their first claims before their answers show how they fare.
    pub unlisted_cap: usize,
}

/// How many due rows a claim for `limit` free slots looks at: a little
/// more than `limit`, so that one busy endpoint at the head of the queue
/// does not leave the other slots empty.
pub fn claim_window(limit: usize) -> usize {
    limit.saturating_mul(4).max(64)
}

/// Of a claim's `limit` slots, how many retries (deliveries with an
/// attempt behind them) may take while first attempts are due too: half,
/// rounded up. So after an outage, when a busy endpoint's retries fall due
/// together, first attempts to every other endpoint still get half the
/// slots; with no first attempt waiting the retries get them all.
pub fn retry_share(limit: usize) -> usize {
    limit.div_ceil(2)
}

/// The endpoints with no room left under `cap`: a claim passes them by.
pub fn saturated(in_flight: &HashMap<EndpointId, usize>, cap: usize) -> Vec<&str> {
    in_flight
        .iter()
        .filter(|(_, n)| **n >= cap)
        .map(|(id, _)| id.as_str())
        .collect()
}

/// A claim's picks counted against its limits: `limit` in all, and per
/// endpoint `cap` minus what it already has in flight.
pub struct Room {
    limit: usize,
    cap: usize,
    /// Per endpoint: in flight before this claim, then taken by it.
    used: HashMap<String, usize>,
    /// Per endpoint: in flight before this claim.
    before: HashMap<String, usize>,
    /// The cap of an endpoint `before` does not list.
    unlisted_cap: usize,
    taken: usize,
}

impl Room {
    /// `cap` for the endpoints `in_flight` lists, `unlisted_cap` (at most
    /// `cap`) for the others (see [`ClaimRequest::unlisted_cap`]).
    pub fn new(
        limit: usize,
        in_flight: &HashMap<EndpointId, usize>,
        cap: usize,
        unlisted_cap: usize,
    ) -> Self {
        let before: HashMap<String, usize> = in_flight
            .iter()
            .map(|(ep, n)| (ep.as_str().to_owned(), *n))
            .collect();
        Room {
            limit,
            cap,
            used: before.clone(),
            before,
            unlisted_cap: unlisted_cap.min(cap),
            taken: 0,
        }
    }

    /// The most `endpoint_id` may hold, what it has in flight included.
    fn cap_of(&self, endpoint_id: &str) -> usize {
        if self.before.contains_key(endpoint_id) {
            self.cap
        } else {
            self.unlisted_cap
        }
    }

    /// How many more may be taken in all.
    pub fn remaining(&self) -> usize {
        self.limit.saturating_sub(self.taken)
    }

    /// `limit` is reached: nothing more can be taken.
    pub fn is_full(&self) -> bool {
        self.taken >= self.limit
    }

    /// Whether one more delivery to `endpoint_id` fits; counts it if so.
    pub fn take(&mut self, endpoint_id: &str) -> bool {
        self.take_under_cap(endpoint_id)
    }

    /// As [`Room::take`], for at most one delivery of `endpoint_id` in this
    /// claim (a FIFO endpoint's head). What the caller counts as in flight
    /// still bounds it (a breaker's room 0 holds the head too), but does
    /// not decide one-at-a-time: the store does, since a FIFO endpoint's
    /// only claimable delivery is its head, and a head that is delivering
    /// is not due.
    pub fn take_one(&mut self, endpoint_id: &str) -> bool {
        if self.is_full() {
            return false;
        }
        let before = self.before.get(endpoint_id).copied().unwrap_or(0);
        let cap = self.cap_of(endpoint_id);
        let n = self.used.entry(endpoint_id.to_owned()).or_default();
        if *n >= cap || *n > before {
            return false;
        }
        *n += 1;
        self.taken += 1;
        true
    }

    /// Whether one more delivery to `endpoint_id` fits; counts it if so.
    fn take_under_cap(&mut self, endpoint_id: &str) -> bool {
        if self.is_full() {
            return false;
        }
        let cap = self.cap_of(endpoint_id);
        let n = self.used.entry(endpoint_id.to_owned()).or_default();
        if *n >= cap {
            return false;
        }
        *n += 1;
        self.taken += 1;
        true
    }
}

/// Everything needed to send one attempt, read in the claim.
#[derive(Clone, PartialEq, Eq)]
pub struct ClaimedDelivery {
    pub id: DeliveryId,
    pub lease_token: String,
    pub msg_id: MsgId,
    pub app_id: AppId,
    pub endpoint_id: EndpointId,
    pub url: String,
    pub secret: String,
    /// Secrets replaced by a rotation whose grace period has not ended:
    /// attempts are signed with these too.
    pub old_secrets: Vec<String>,
    /// The endpoint's extra headers.
    pub headers: Vec<(String, String)>,
    /// Set when the endpoint's stored secrets or headers could not be
    /// decrypted (a key missing from `HERALD_ENCRYPTION_KEY`, a damaged
    /// value): nothing is sent, the attempt fails as a network error with
    /// this text (`secret`, `old_secrets` and `headers` are then empty).
    pub unreadable: Option<String>,
    pub event_type: String,
    pub payload: String,
    /// The message's `traceparent`: the attempt's span joins that trace.
    pub traceparent: Option<String>,
    /// Attempts made before this one, over the delivery's whole life.
    pub attempts: u32,
    /// Start of the current retry cycle (message creation, or last replay).
    pub cycle_started_at: Millis,
    /// `attempts` when the current cycle started.
    pub cycle_base: u32,
    /// This attempt was asked for by an operator (replay/resend).
    pub manual: bool,
    /// Not to be sent before then: the send slot a claim reserved for it
    /// on its throttled endpoint (at most [`THROTTLE_HORIZON_MS`] after
    /// the claim). `None`: at once.
    pub send_at: Option<Millis>,
    /// The endpoint's `throttleRate` when the claim gave it a send slot:
    /// a send later than its slot's drift margin goes back for a new one.
    pub throttle_rate: Option<u32>,
    /// The endpoint delivers in order (`"ordering": "fifo"`): its next
    /// delivery becomes claimable once this one's outcome is written.
    pub ordered: bool,
}

impl std::fmt::Debug for ClaimedDelivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimedDelivery")
            .field("id", &self.id)
            .field("msg_id", &self.msg_id)
            .field("endpoint_id", &self.endpoint_id)
            .field("url", &self.url)
            .field("attempts", &self.attempts)
            .field("secret", &"<redacted>")
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptRecord {
    pub id: AttemptId,
    pub delivery_id: DeliveryId,
    pub msg_id: MsgId,
    pub endpoint_id: EndpointId,
    pub app_id: AppId,
    pub url: String,
    /// 1-based over the delivery's life (the `X-Attempt` header).
    pub attempt_number: u32,
    pub started_at: Millis,
    pub duration_ms: i64,
    pub status_code: Option<u16>,
    /// Response body excerpt, or empty.
    pub response: String,
    /// Network error or timeout text, when there was no status.
    pub error: Option<String>,
    pub success: bool,
    pub manual: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextState {
    Delivered,
    Retry { at: Millis },
    Dead(DeadReason),
}

/// One finished attempt and the state the policy chose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    pub attempt: AttemptRecord,
    /// Only the holder of this claim may move the delivery on; an outcome
    /// that arrives after the lease expired and was re-claimed is logged as
    /// an attempt but leaves the state to the new holder.
    pub lease_token: String,
    pub next: NextState,
    pub now: Millis,
    /// The attempt's number within its retry cycle (1 for the first after
    /// the message was created or replayed): what the operator events
    /// `message.attempt.failing` and `…recovered` count, as Svix does.
    pub cycle_attempt: u32,
}

impl Completion {
    /// The delivery's `state`, `next_attempt_at` and `dead_reason` after
    /// this attempt, as both stores write them.
    pub fn next_state(&self) -> (DeliveryState, Millis, Option<&'static str>) {
        match self.next {
            NextState::Delivered => (DeliveryState::Delivered, self.now, None),
            NextState::Retry { at } => (DeliveryState::Pending, at, None),
            NextState::Dead(r) => (DeliveryState::Dead, self.now, Some(r.as_str())),
        }
    }
}

/// What [`Queue::complete`] wrote.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Completed {
    /// One per completion of the batch, in order: whether it moved its
    /// delivery on (its lease token was still the delivery's). A stale one
    /// (the delivery was re-claimed, resent or released meanwhile) only
    /// logged its attempt, and nothing may be reported of it as a change.
    pub moved: Vec<bool>,
    /// The streak of every endpoint with a failure in the batch.
    pub streaks: Vec<StreakUpdate>,
    /// The circuit breakers this batch opened, reopened or closed.
    pub circuits: Vec<CircuitChange>,
}

/// `text` as both stores keep it: NUL (which PostgreSQL refuses in `text`)
/// becomes U+FFFD, as invalid UTF-8 does when a body is decoded.
pub fn storable(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains('\0') {
        std::borrow::Cow::Owned(text.replace('\0', "\u{FFFD}"))
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

/// The batch with every text that came from outside (a response excerpt,
/// an error, the URL) made [`storable`]; borrowed, as it nearly always is,
/// when nothing needed it. The sender already sends storable text: this is
/// what keeps any other caller's from failing a batch on either store.
pub fn storable_batch(batch: &[Completion]) -> std::borrow::Cow<'_, [Completion]> {
    let unstorable = |a: &AttemptRecord| {
        a.response.contains('\0')
            || a.url.contains('\0')
            || a.error.as_deref().is_some_and(|e| e.contains('\0'))
    };
    if !batch.iter().any(|c| unstorable(&c.attempt)) {
        return std::borrow::Cow::Borrowed(batch);
    }
    std::borrow::Cow::Owned(
        batch
            .iter()
            .map(|c| {
                let mut c = c.clone();
                let a = &mut c.attempt;
                a.response = storable(&a.response).into_owned();
                a.url = storable(&a.url).into_owned();
                a.error = a.error.as_deref().map(|e| storable(e).into_owned());
                c
            })
            .collect(),
    )
}

/// An endpoint's failing streak after a batch of outcomes was recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreakUpdate {
    pub endpoint_id: EndpointId,
    pub app_id: AppId,
    pub fail_streak: u32,
    pub streak_started_at: Option<Millis>,
    pub disabled: bool,
}

/// What one batch of outcomes changes on one endpoint, folded in order, so
/// each endpoint row is written once per batch whatever the batch size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointBatch {
    pub endpoint_id: EndpointId,
    pub app_id: AppId,
    /// A success came in this batch: the streak restarts from `failures`.
    pub reset: bool,
    /// Failed attempts after the batch's last success (or all of them).
    pub failures: u32,
    pub first_failure_at: Option<Millis>,
    pub last_success_at: Option<Millis>,
    pub last_error: Option<(String, Millis)>,
}

/// Folds a batch into one [`EndpointBatch`] per endpoint, sorted by
/// endpoint id (PostgreSQL writers lock the rows in that order).
pub fn fold_endpoint_batches(batch: &[Completion]) -> Vec<EndpointBatch> {
    let mut by_ep: BTreeMap<&str, EndpointBatch> = BTreeMap::new();
    for c in batch {
        let a = &c.attempt;
        let e = by_ep
            .entry(a.endpoint_id.as_str())
            .or_insert_with(|| EndpointBatch {
                endpoint_id: a.endpoint_id.clone(),
                app_id: a.app_id.clone(),
                reset: false,
                failures: 0,
                first_failure_at: None,
                last_success_at: None,
                last_error: None,
            });
        if a.success {
            e.reset = true;
            e.failures = 0;
            e.first_failure_at = None;
            e.last_success_at = Some(e.last_success_at.unwrap_or(a.started_at).max(a.started_at));
        } else {
            e.failures += 1;
            e.first_failure_at.get_or_insert(a.started_at);
            let text = match (&a.error, a.status_code) {
                (Some(err), _) => err.clone(),
                (None, Some(code)) => format!("HTTP {code}"),
                (None, None) => "failed".to_owned(),
            };
            e.last_error = Some((text, a.started_at));
        }
    }
    by_ep.into_values().collect()
}

/// Folds a batch into stats bucket increments per (endpoint, bucket).
pub fn fold_stats(batch: &[Completion]) -> Vec<(EndpointId, StatsBucket)> {
    let mut map: BTreeMap<(&str, Millis), StatsBucket> = BTreeMap::new();
    for c in batch {
        let a = &c.attempt;
        let bucket = herald_policy::stats::bucket_of(a.started_at);
        let b = map
            .entry((a.endpoint_id.as_str(), bucket))
            .or_insert_with(|| StatsBucket {
                bucket,
                ..StatsBucket::default()
            });
        b.attempts += 1;
        if a.success {
            b.successes += 1;
        } else {
            b.failures += 1;
        }
        let ms = a.duration_ms.max(0);
        b.latency_sum_ms += u64::try_from(ms).unwrap_or(0);
        b.histogram[herald_policy::stats::latency_slot(ms)] += 1;
    }
    map.into_iter()
        .map(|((ep, _), b)| (EndpointId::from_trusted(ep.to_owned()), b))
        .collect()
}

/// An endpoint that receives its app's new messages (enabled, or disabled
/// by Herald and so holding them), as routing sees it. Both stores read
/// these at ingest and route with [`Subscriber::wants`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscriber {
    pub endpoint_id: String,
    pub filter_types: Option<Vec<String>>,
    pub channels: Option<Vec<String>>,
}

impl Subscriber {
    /// From an endpoint's row: `filter_types` and `channels` as stored
    /// (JSON).
    pub fn from_stored(
        endpoint_id: String,
        filter_types: Option<&str>,
        channels: Option<&str>,
    ) -> StoreResult<Self> {
        Ok(Subscriber {
            endpoint_id,
            filter_types: filter_types.map(from_json).transpose()?,
            channels: channels.map(from_json).transpose()?,
        })
    }

    /// Whether `m` goes to this endpoint: its event type passes the
    /// endpoint's filter and, when the endpoint has channels, the message
    /// shares one of them.
    pub fn wants(&self, m: &NewMessage) -> bool {
        self.filter_types
            .as_ref()
            .is_none_or(|types| types.contains(&m.event_type))
            && self.channels.as_ref().is_none_or(|wanted| {
                m.channels
                    .as_ref()
                    .is_some_and(|have| have.iter().any(|c| wanted.contains(c)))
            })
    }
}

/// An endpoint new messages may fan out to: its routing, and what sending
/// needs when the batch may claim its deliveries.
#[derive(Clone)]
pub struct FanoutTarget {
    pub sub: Subscriber,
    /// Only when the batch claims (see [`IngestClaim`]) and the endpoint
    /// may be handed off to: enabled (held, "auto"-disabled, endpoints
    /// collect deliveries but are never claimed), not throttled and not
    /// FIFO (their deliveries are only ever claimed, whose statement
    /// reserves the throttle's slots and finds the queue's head). A batch
    /// that claims nothing reads no secrets.
    pub send: Option<SendTo>,
}

impl FanoutTarget {
    /// From an endpoint's row: `filter_types` and `channels` as stored
    /// (JSON). `send_to` reads the sending columns; it runs only when the
    /// batch claims and the endpoint may be handed off to
    /// ([`may_hand_off`]).
    pub fn from_row(
        endpoint_id: String,
        filter_types: Option<&str>,
        channels: Option<&str>,
        handoff: bool,
        claim: Option<&IngestClaim>,
        send_to: impl FnOnce(Millis) -> StoreResult<SendTo>,
    ) -> StoreResult<Self> {
        let send = match claim {
            Some(c) if handoff => Some(send_to(c.now)?),
            _ => None,
        };
        Ok(FanoutTarget {
            sub: Subscriber::from_stored(endpoint_id, filter_types, channels)?,
            send,
        })
    }
}

/// Whether an ingest batch may hand off the new deliveries of an endpoint
/// with these columns: enabled, without a throttle, not FIFO.
pub fn may_hand_off(enabled: bool, rate_limit: Option<i64>, ordering: &str) -> bool {
    enabled
        && throttled_rate(rate_limit).is_none()
        && EndpointOrdering::from_stored(ordering) == EndpointOrdering::None
}

/// How far ahead a claim reserves a throttled endpoint's send slots: a
/// claimed delivery waits at most this long for its slot (holding its
/// sending slot meanwhile), and a claim reserves at most
/// `rate × horizon + 1` slots of one endpoint.
pub const THROTTLE_HORIZON_MS: Millis = 100;

/// How late a request may leave after its throttle slot (the sender's
/// timer, its turn on a busy core, the write) without the receiver
/// counting more than `rate + 1` in a one-second window.
pub const THROTTLE_DRIFT_US: i64 = 10_000;

/// The spacing of a throttled endpoint's slots, in microseconds: at least
/// `1/rate` (rounded up: never faster than the rate), and wide enough that
/// slots sent up to [`THROTTLE_DRIFT_US`] late still put at most `rate + 1`
/// into any one-second window the receiver sees, `(1 s + drift) / (rate +
/// 1)`. The second term is the wider only above ~100/s: at 1,000/s it
/// spaces slots 1,009 µs apart (≈ 991/s), where exact 1 ms slots sent a
/// few ms late put 1,004 into one second. The PostgreSQL claim computes
/// the same in SQL (its `thr` step; the conformance suite checks both
/// at 1,000/s).
pub fn throttle_step_us(rate: u32) -> i64 {
    let rate = i64::from(rate.max(1));
    let exact = (1_000_000 + rate - 1) / rate;
    let drift_proof = (1_000_000 + THROTTLE_DRIFT_US + rate) / (rate + 1);
    exact.max(drift_proof)
}

/// One throttled endpoint's send slots as a claim reserves them (GCRA,
/// without burst): the endpoint's theoretical arrival time (`tat_us`,
/// microseconds, stored) is the earliest the next request may go; each
/// claimed delivery takes the slot at `max(tat, now)` and moves it on by
/// [`throttle_step_us`]; only slots before `now + THROTTLE_HORIZON_MS` are
/// taken. So requests to the endpoint are at least `1/rate` apart,
/// whichever process claims them, and a one-second window holds at most
/// `rate + 1` slots. The PostgreSQL claim computes the same in SQL.
#[derive(Debug, Clone)]
pub struct ThrottleSlots {
    rate: u32,
    base_us: i64,
    step_us: i64,
    horizon_us: i64,
    taken: i64,
}

impl ThrottleSlots {
    pub fn new(rate: u32, tat_us: i64, now: Millis) -> Self {
        ThrottleSlots {
            rate,
            base_us: tat_us.max(now.saturating_mul(1000)),
            step_us: throttle_step_us(rate),
            horizon_us: now.saturating_add(THROTTLE_HORIZON_MS).saturating_mul(1000),
            taken: 0,
        }
    }

    /// The next slot (milliseconds, rounded up), taken, if one is left
    /// within the horizon.
    pub fn take(&mut self) -> Option<Millis> {
        let at_us = self.base_us + self.taken * self.step_us;
        if at_us >= self.horizon_us {
            return None;
        }
        self.taken += 1;
        Some((at_us + 999) / 1000)
    }

    pub fn rate(&self) -> u32 {
        self.rate
    }

    /// Whether a slot is left within the horizon.
    pub fn available(&self) -> bool {
        self.base_us + self.taken * self.step_us < self.horizon_us
    }

    pub fn taken(&self) -> i64 {
        self.taken
    }

    /// The theoretical arrival time after the slots taken.
    pub fn tat_us(&self) -> i64 {
        self.base_us + self.taken * self.step_us
    }
}

/// What sending to an endpoint needs, as a claim reads it.
#[derive(Clone)]
pub struct SendTo {
    pub url: String,
    pub secret: String,
    pub old_secrets: Vec<String>,
    pub headers: Vec<(String, String)>,
    /// See [`ClaimedDelivery::unreadable`].
    pub unreadable: Option<String>,
}

impl SendTo {
    /// From endpoint `endpoint_id`'s stored columns (`old_secrets` and
    /// `headers` are JSON), opened with `keys` (in memory: a few
    /// microseconds, no query); rotated secrets whose grace has ended by
    /// `now` are left out. A value that does not open makes an unreadable
    /// `SendTo` (never sent), not an error: the rest of the claim goes on.
    pub fn from_columns(
        keys: &Keyring,
        endpoint_id: &str,
        url: String,
        secret: &str,
        old_secrets: &str,
        headers: &str,
        now: Millis,
    ) -> StoreResult<Self> {
        // Never sent: the attempt fails saying why (its log masks the URL).
        let unreadable = |url: String, e: crate::crypto::OpenError| SendTo {
            url,
            secret: String::new(),
            old_secrets: Vec::new(),
            headers: Vec::new(),
            unreadable: Some(format!("not sent: {e}")),
        };
        // A URL without credentials is plain and kept as it is (the claim's
        // hot path); one with them is sealed.
        let url = if crate::crypto::is_sealed(&url) {
            match open_column(keys, endpoint_id, SecretColumn::Url, &url) {
                Ok(url) => url,
                Err(e) => return Ok(unreadable("(sealed)".to_owned(), e)),
            }
        } else {
            url
        };
        let opened = (|| {
            Ok::<_, crate::crypto::OpenError>((
                open_column(keys, endpoint_id, SecretColumn::Secret, secret)?,
                open_column(keys, endpoint_id, SecretColumn::OldSecrets, old_secrets)?,
                open_column(keys, endpoint_id, SecretColumn::Headers, headers)?,
            ))
        })();
        match opened {
            Ok((secret, old_secrets, headers)) => Ok(SendTo {
                url,
                secret,
                old_secrets: valid_old_secrets(&old_secrets, now)?,
                headers: headers_of(&headers)?,
                unreadable: None,
            }),
            Err(e) => Ok(unreadable(url, e)),
        }
    }
}

/// One delivery an ingest batch makes: born pending and due at its
/// message's [`NewMessage::due_at`] (now, or a scheduled `deliverAt`), or,
/// when the batch's claim takes it, `delivering` under the claim's lease,
/// and then `claimed` is what the dispatcher sends.
pub struct NewDelivery<'a> {
    pub id: DeliveryId,
    pub endpoint_id: &'a str,
    pub state: DeliveryState,
    pub due: Millis,
    pub claimed: Option<ClaimedDelivery>,
}

impl NewDelivery<'_> {
    pub fn lease_token(&self) -> Option<&str> {
        self.claimed.as_ref().map(|d| d.lease_token.as_str())
    }
}

/// The deliveries of `m`: one to each endpoint of its app (in
/// `endpoints_of`) that wants it; those `claim` takes are claimed.
pub fn fan_out<'a>(
    endpoints_of: &'a HashMap<String, Vec<FanoutTarget>>,
    m: &NewMessage,
    claim: &mut Option<IngestClaim>,
) -> Vec<NewDelivery<'a>> {
    endpoints_of
        .get(m.app_id.as_str())
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter(|ep| ep.sub.wants(m))
        .map(|ep| {
            let id = DeliveryId::generate();
            let endpoint_id = ep.sub.endpoint_id.as_str();
            match IngestClaim::taking(claim, ep, m.due_at()) {
                Some((c, to)) => NewDelivery {
                    state: DeliveryState::Delivering,
                    due: c.lease_until,
                    claimed: Some(c.delivery(id.clone(), m, endpoint_id, to)),
                    id,
                    endpoint_id,
                },
                None => NewDelivery {
                    id,
                    endpoint_id,
                    state: DeliveryState::Pending,
                    due: m.due_at(),
                    claimed: None,
                },
            }
        })
        .collect()
}

/// The claim an ingest batch makes of its own new deliveries
/// ([`Queue::insert_messages_claiming`]): the same limits as a
/// [`ClaimRequest`], counted as the batch is routed.
pub struct IngestClaim {
    pub now: Millis,
    pub lease_until: Millis,
    pub token: String,
    room: Room,
}

impl IngestClaim {
    pub fn new(req: &ClaimRequest<'_>) -> Self {
        IngestClaim {
            now: req.now,
            lease_until: req.lease_until,
            token: ulid::Ulid::new().to_string(),
            room: Room::new(req.limit, req.in_flight, req.endpoint_cap, req.unlisted_cap),
        }
    }

    /// `claim` and what sending to `ep` needs, when there is a claim and it
    /// takes the next delivery to `ep` (counting it). A delivery due after
    /// the claim's `now` (a scheduled message) is never taken.
    fn taking<'a>(
        claim: &'a mut Option<IngestClaim>,
        ep: &'a FanoutTarget,
        due: Millis,
    ) -> Option<(&'a Self, &'a SendTo)> {
        let to = ep.send.as_ref()?;
        let c = claim.as_mut()?;
        if due > c.now {
            return None;
        }
        c.room.take(&ep.sub.endpoint_id).then_some((&*c, to))
    }

    /// The claimed delivery `id` of `m` to `endpoint_id` (sent as `to`
    /// says), as a claim would return it.
    fn delivery(
        &self,
        id: DeliveryId,
        m: &NewMessage,
        endpoint_id: &str,
        to: &SendTo,
    ) -> ClaimedDelivery {
        ClaimedDelivery {
            id,
            lease_token: self.token.clone(),
            msg_id: m.id.clone(),
            app_id: m.app_id.clone(),
            endpoint_id: EndpointId::from_trusted(endpoint_id.to_owned()),
            url: to.url.clone(),
            secret: to.secret.clone(),
            old_secrets: to.old_secrets.clone(),
            headers: to.headers.clone(),
            unreadable: to.unreadable.clone(),
            event_type: m.event_type.clone(),
            payload: m.payload.clone(),
            traceparent: m.traceparent.clone(),
            attempts: 0,
            cycle_started_at: m.due_at(),
            cycle_base: 0,
            manual: false,
            send_at: None,
            throttle_rate: None,
            // Only endpoints that queue nothing are handed off.
            ordered: false,
        }
    }
}

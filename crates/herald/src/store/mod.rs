//! The store seam: everything the engine and the API need from durable
//! storage, behind one trait. Each backend keeps its SQL beside it
//! (`sqlite.rs` and `migrations/sqlite/`); the conformance suite in
//! `tests/it/store_conformance.rs` runs the same tests against each.
//!
//! Times are Unix milliseconds (`Millis`), passed in by the caller, so the
//! store never reads a clock and tests can move time freely.

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use herald_policy::DeadReason;

use crate::ids::{AppId, AttemptId, DeliveryId, EndpointId, MsgId};

pub mod postgres;
pub mod sqlite;

pub type Millis = i64;

pub fn now_millis() -> Millis {
    chrono::Utc::now().timestamp_millis()
}

#[derive(Debug, thiserror::Error, Clone)]
pub enum StoreError {
    /// A uniqueness rule was broken (a `uid` already taken, …).
    #[error("conflict: {0}")]
    Conflict(String),
    /// The row's parent (its application, its endpoint) does not exist any
    /// more: deleted while the request that writes the row was handled.
    #[error("parent gone: {0}")]
    ParentGone(String),
    /// The database cannot be reached or is busy; the caller may retry.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// Anything else: a bug or corruption. Never shown to API clients.
    #[error("store error: {0}")]
    Internal(String),
}

pub type StoreResult<T> = Result<T, StoreError>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct App {
    pub id: AppId,
    pub uid: Option<String>,
    pub name: String,
    pub rate_limit: Option<u16>,
    pub metadata: BTreeMap<String, String>,
    pub created_at: Millis,
    pub updated_at: Millis,
}

#[derive(Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub id: EndpointId,
    pub app_id: AppId,
    pub uid: Option<String>,
    pub url: String,
    pub description: String,
    /// `None`: every event type. `Some(list)`: only those.
    pub filter_types: Option<Vec<String>>,
    pub disabled: bool,
    pub rate_limit: Option<u16>,
    pub metadata: BTreeMap<String, String>,
    /// `None`: every message. `Some(list)`: only messages with one of these.
    pub channels: Option<Vec<String>>,
    /// Extra headers sent with every request to this endpoint.
    pub headers: BTreeMap<String, String>,
    /// `whsec_…`. Never logged: `Debug` redacts it.
    pub secret: String,
    pub created_at: Millis,
    pub updated_at: Millis,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("id", &self.id)
            .field("app_id", &self.app_id)
            .field("uid", &self.uid)
            .field("url", &self.url)
            .field("filter_types", &self.filter_types)
            .field("disabled", &self.disabled)
            .field("secret", &"<redacted>")
            .finish_non_exhaustive()
    }
}
/// What [`Store::update_endpoint`] writes: the fields the API's PUT and
/// PATCH change, each only when `Some` (`None` leaves the stored value).
/// Nothing else is here on purpose: the disabled flag (with its reason,
/// cause and the failing streak) is written only by
/// [`Store::disable_endpoint`] and [`Store::enable_endpoint`], the secrets
/// only by [`Store::rotate_secret`], the headers only by
/// [`Store::set_endpoint_headers`]. A save that wrote back what it had read
/// would undo whatever those did in between.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndpointChanges {
    pub uid: Option<Option<String>>,
    pub url: Option<String>,
    pub description: Option<String>,
    pub filter_types: Option<Option<Vec<String>>>,
    pub rate_limit: Option<Option<u16>>,
    pub metadata: Option<BTreeMap<String, String>>,
    pub channels: Option<Option<Vec<String>>>,
}

/// The JSON-text columns of an [`EndpointChanges`], encoded once for both
/// stores: `None` leaves the column as it is, `Some(None)` clears it.
pub struct EndpointChangesJson {
    pub filter_types: Option<Option<String>>,
    pub metadata: Option<String>,
    pub channels: Option<Option<String>>,
}

impl EndpointChanges {
    pub fn json_columns(&self) -> StoreResult<EndpointChangesJson> {
        fn json<T: serde::Serialize>(v: &T) -> StoreResult<String> {
            serde_json::to_string(v).map_err(|e| StoreError::Internal(e.to_string()))
        }
        Ok(EndpointChangesJson {
            filter_types: self
                .filter_types
                .as_ref()
                .map(|f| f.as_ref().map(json).transpose())
                .transpose()?,
            metadata: self.metadata.as_ref().map(json).transpose()?,
            channels: self
                .channels
                .as_ref()
                .map(|c| c.as_ref().map(json).transpose())
                .transpose()?,
        })
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

/// Delivery states as stored. `Pending` and `Delivering` are "live": they
/// sit in the claim index; the other two have left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryState {
    Pending = 0,
    Delivering = 1,
    Delivered = 2,
    Dead = 3,
}

impl DeliveryState {
    pub fn from_i64(v: i64) -> Option<Self> {
        Some(match v {
            0 => DeliveryState::Pending,
            1 => DeliveryState::Delivering,
            2 => DeliveryState::Delivered,
            3 => DeliveryState::Dead,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Delivering => "delivering",
            DeliveryState::Delivered => "delivered",
            DeliveryState::Dead => "dead",
        }
    }
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
}

/// How many due rows a claim for `limit` free slots looks at: a little
/// more than `limit`, so that one busy endpoint at the head of the queue
/// does not leave the other slots empty.
pub fn claim_window(limit: usize) -> usize {
    limit.saturating_mul(4).max(64)
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
    taken: usize,
}

impl Room {
    pub fn new(limit: usize, in_flight: &HashMap<EndpointId, usize>, cap: usize) -> Self {
        Room {
            limit,
            cap,
            used: in_flight
                .iter()
                .map(|(ep, n)| (ep.as_str().to_owned(), *n))
                .collect(),
            taken: 0,
        }
    }

    /// `limit` is reached: nothing more can be taken.
    pub fn is_full(&self) -> bool {
        self.taken >= self.limit
    }

    /// Whether one more delivery to `endpoint_id` fits; counts it if so.
    pub fn take(&mut self, endpoint_id: &str) -> bool {
        if self.is_full() {
            return false;
        }
        let n = self.used.entry(endpoint_id.to_owned()).or_default();
        if *n >= self.cap {
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
    pub event_type: String,
    pub payload: String,
    /// Attempts made before this one, over the delivery's whole life.
    pub attempts: u32,
    /// Start of the current retry cycle (message creation, or last replay).
    pub cycle_started_at: Millis,
    /// `attempts` when the current cycle started.
    pub cycle_base: u32,
    /// This attempt was asked for by an operator (replay/resend).
    pub manual: bool,
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
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub id: DeliveryId,
    pub msg_id: MsgId,
    pub app_id: AppId,
    pub endpoint_id: EndpointId,
    pub event_type: String,
    pub state: DeliveryState,
    pub attempts: u32,
    pub next_attempt_at: Millis,
    pub dead_reason: Option<DeadReason>,
    pub last_status: Option<u16>,
    pub last_error: Option<String>,
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// A page request over a list sorted by id (ids sort by creation time).
#[derive(Debug, Clone, Default)]
pub struct PageReq {
    pub limit: usize,
    /// Return items strictly after this id in the chosen order (or, when
    /// `backwards`, strictly before it).
    pub after: Option<String>,
    pub ascending: bool,
    /// The page that ends just before `after` (a `prevIterator`), still
    /// in the chosen order.
    pub backwards: bool,
}

impl PageReq {
    /// The direction the store walks its index in.
    pub fn walks_ascending(&self) -> bool {
        self.ascending != self.backwards
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub has_more: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResendOutcome {
    Queued,
    NoSuchMessage,
    NoSuchEndpoint,
}

/// An endpoint's health state, kept current by [`Store::complete`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndpointStatus {
    pub fail_streak: u32,
    pub streak_started_at: Option<Millis>,
    pub last_success_at: Option<Millis>,
    pub last_error: Option<String>,
    pub last_error_at: Option<Millis>,
    pub disabled: bool,
    pub disabled_reason: Option<String>,
    pub disabled_at: Option<Millis>,
    /// Herald disabled it (as opposed to a person).
    pub auto_disabled: bool,
}

/// Attempt counts of one endpoint in one 5-minute bucket.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatsBucket {
    pub bucket: Millis,
    pub attempts: u64,
    pub successes: u64,
    pub failures: u64,
    pub latency_sum_ms: u64,
    pub histogram: [u64; crate::health::HISTOGRAM_LEN],
}

/// What [`Store::complete`] wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Completed {
    /// One per completion of the batch, in order: whether it moved its
    /// delivery on (its lease token was still the delivery's). A stale one
    /// (the delivery was re-claimed, resent or released meanwhile) only
    /// logged its attempt, and nothing may be reported of it as a change.
    pub moved: Vec<bool>,
    /// The streak of every endpoint with a failure in the batch.
    pub streaks: Vec<StreakUpdate>,
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
        let bucket = crate::health::bucket_of(a.started_at);
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
        b.histogram[crate::health::latency_slot(ms)] += 1;
    }
    map.into_iter()
        .map(|((ep, _), b)| (EndpointId::from_trusted(ep.to_owned()), b))
        .collect()
}

/// An event type of the catalogue (global, as in Svix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventType {
    pub name: String,
    pub description: String,
    pub archived: bool,
    pub deprecated: bool,
    /// JSON text, as given.
    pub schemas: Option<String>,
    pub feature_flag: Option<String>,
    pub group_name: Option<String>,
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// An application-scoped API token (its secret is never stored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiToken {
    /// `tok_…`
    pub id: String,
    pub app_id: AppId,
    pub name: String,
    pub created_at: Millis,
}

/// What an Idempotency-Key says about a request about to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdemBegin {
    /// First time (or the old record expired): run it, then finish.
    Fresh,
    /// Done before with the same request: answer this again.
    Replay { status: u16, body: String },
    /// The key was used for a different request.
    Mismatch,
    /// The first request with this key is still running.
    InProgress,
}

/// Judges a stored idempotency record `(hash, status, body, created_at)`
/// against a new request (both stores use this).
pub fn idem_verdict(
    found: Option<(String, i64, String, i64)>,
    hash: &str,
    valid_after: Millis,
    stale_before: Millis,
) -> IdemBegin {
    match found {
        None => IdemBegin::Fresh,
        Some((_, _, _, created)) if created < valid_after => IdemBegin::Fresh,
        Some((_, 0, _, created)) if created < stale_before => IdemBegin::Fresh,
        Some((stored, _, _, _)) if stored != hash => IdemBegin::Mismatch,
        Some((_, 0, _, _)) => IdemBegin::InProgress,
        Some((_, status, body, _)) => IdemBegin::Replay {
            status: u16::try_from(status).unwrap_or(500),
            body,
        },
    }
}

/// Most secrets a rotation keeps signing with besides the current one.
pub const MAX_OLD_SECRETS: usize = 10;

/// One secret replaced by a rotation, signing until `expires_at`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OldSecret {
    pub key: String,
    pub expires_at: Millis,
}

/// The still-valid old secrets in their stored JSON form (`[]` is the
/// common case and costs no parsing).
pub fn valid_old_secrets(json: &str, now: Millis) -> StoreResult<Vec<String>> {
    if json == "[]" {
        return Ok(Vec::new());
    }
    let all: Vec<OldSecret> = serde_json::from_str(json)
        .map_err(|e| StoreError::Internal(format!("bad old_secrets: {e}")))?;
    Ok(all
        .into_iter()
        .filter(|s| s.expires_at > now)
        .map(|s| s.key)
        .collect())
}

/// The old-secrets JSON after `current` is replaced: `current` first,
/// valid until `grace_until`; expired ones dropped; at most
/// [`MAX_OLD_SECRETS`].
pub fn rotated_old_secrets(
    json: &str,
    current: &str,
    grace_until: Millis,
    now: Millis,
) -> StoreResult<String> {
    let mut all: Vec<OldSecret> = serde_json::from_str(json)
        .map_err(|e| StoreError::Internal(format!("bad old_secrets: {e}")))?;
    all.retain(|s| s.expires_at > now);
    if grace_until > now {
        all.insert(
            0,
            OldSecret {
                key: current.to_owned(),
                expires_at: grace_until,
            },
        );
    }
    all.truncate(MAX_OLD_SECRETS);
    serde_json::to_string(&all).map_err(|e| StoreError::Internal(e.to_string()))
}

/// An endpoint's extra headers from their stored JSON (`{}` costs no
/// parsing).
pub fn headers_of(json: &str) -> StoreResult<Vec<(String, String)>> {
    if json == "{}" {
        return Ok(Vec::new());
    }
    let map: BTreeMap<String, String> = serde_json::from_str(json)
        .map_err(|e| StoreError::Internal(format!("bad endpoint headers: {e}")))?;
    Ok(map.into_iter().collect())
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
    /// is enabled: held ("auto"-disabled) endpoints collect deliveries but
    /// are never claimed, and a batch that claims nothing reads no secrets.
    pub send: Option<SendTo>,
}

impl FanoutTarget {
    /// From an endpoint's row: `filter_types` and `channels` as stored
    /// (JSON). `send_to` reads the sending columns; it runs only when the
    /// batch claims and the endpoint is enabled.
    pub fn from_row(
        endpoint_id: String,
        filter_types: Option<&str>,
        channels: Option<&str>,
        enabled: bool,
        claim: Option<&IngestClaim>,
        send_to: impl FnOnce(Millis) -> StoreResult<SendTo>,
    ) -> StoreResult<Self> {
        let send = match claim {
            Some(c) if enabled => Some(send_to(c.now)?),
            _ => None,
        };
        Ok(FanoutTarget {
            sub: Subscriber {
                endpoint_id,
                filter_types: filter_types.map(from_json).transpose()?,
                channels: channels.map(from_json).transpose()?,
            },
            send,
        })
    }
}

/// A value the store keeps as JSON text.
pub(crate) fn from_json<T: serde::de::DeserializeOwned>(text: &str) -> StoreResult<T> {
    serde_json::from_str(text).map_err(|e| StoreError::Internal(format!("bad JSON in store: {e}")))
}

/// What sending to an endpoint needs, as a claim reads it.
#[derive(Clone)]
pub struct SendTo {
    pub url: String,
    pub secret: String,
    pub old_secrets: Vec<String>,
    pub headers: Vec<(String, String)>,
}

impl SendTo {
    /// From the stored columns (`old_secrets` and `headers` are JSON);
    /// rotated secrets whose grace has ended by `now` are left out.
    pub fn from_columns(
        url: String,
        secret: String,
        old_secrets: &str,
        headers: &str,
        now: Millis,
    ) -> StoreResult<Self> {
        Ok(SendTo {
            url,
            secret,
            old_secrets: valid_old_secrets(old_secrets, now)?,
            headers: headers_of(headers)?,
        })
    }
}

/// One delivery an ingest batch makes: born pending and due at once, or,
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
            match IngestClaim::taking(claim, ep) {
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
                    due: m.created_at,
                    claimed: None,
                },
            }
        })
        .collect()
}

/// The claim an ingest batch makes of its own new deliveries
/// ([`Store::insert_messages_claiming`]): the same limits as a
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
            room: Room::new(req.limit, req.in_flight, req.endpoint_cap),
        }
    }

    /// `claim` and what sending to `ep` needs, when there is a claim and it
    /// takes the next delivery to `ep` (counting it).
    fn taking<'a>(
        claim: &'a mut Option<IngestClaim>,
        ep: &'a FanoutTarget,
    ) -> Option<(&'a Self, &'a SendTo)> {
        let to = ep.send.as_ref()?;
        let c = claim.as_mut()?;
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
            event_type: m.event_type.clone(),
            payload: m.payload.clone(),
            attempts: 0,
            cycle_started_at: m.created_at,
            cycle_base: 0,
            manual: false,
        }
    }
}

/// Which messages of an app a listing shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MessageFilter {
    /// Any of these event types.
    pub event_types: Option<Vec<String>>,
    /// Messages carrying this channel.
    pub channel: Option<String>,
    /// Created before (ms).
    pub before: Option<Millis>,
    /// Created after (ms).
    pub after: Option<Millis>,
}

/// Which attempts of an app a listing shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AttemptFilter {
    pub msg: Option<MsgId>,
    pub endpoint: Option<EndpointId>,
    /// Succeeded (true) or failed (false).
    pub success: Option<bool>,
    /// 0: no response; 100, 200, …, 500: that class of status code.
    pub code_class: Option<u16>,
}

/// An endpoint's deliveries by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeliveryCounts {
    pub pending: u64,
    pub delivering: u64,
    pub delivered: u64,
    pub dead: u64,
}

impl DeliveryCounts {
    /// Sets the count of one stored state (as `i64`, as both stores keep
    /// it); an unknown state is ignored.
    pub fn set(&mut self, state: i64, n: i64) {
        let n = u64::try_from(n).unwrap_or(0);
        match DeliveryState::from_i64(state) {
            Some(DeliveryState::Pending) => self.pending = n,
            Some(DeliveryState::Delivering) => self.delivering = n,
            Some(DeliveryState::Delivered) => self.delivered = n,
            Some(DeliveryState::Dead) => self.dead = n,
            None => {}
        }
    }
}

/// The most one bulk replay statement moves.
pub const REPLAY_BATCH: usize = 1000;

/// Which dead deliveries a listing or a bulk replay covers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeadFilter {
    pub app: Option<AppId>,
    pub endpoint: Option<EndpointId>,
    pub event_type: Option<String>,
    pub reason: Option<DeadReason>,
    /// Dead-lettered at or after (ms).
    pub since: Option<Millis>,
    /// Dead-lettered before (ms).
    pub until: Option<Millis>,
    /// Message created at or after (ms): `recover`'s window.
    pub created_since: Option<Millis>,
    /// Message created before (ms).
    pub created_until: Option<Millis>,
}

/// Counts for metrics and the dashboard, read from indexes only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueStats {
    pub pending: u64,
    pub delivering: u64,
    pub dead: u64,
    /// Pending deliveries due now (including those held for disabled or
    /// busy endpoints).
    pub due: u64,
    pub oldest_due_at: Option<Millis>,
    pub disabled_endpoints: u64,
}

/// An endpoint with its app and health state, for overviews.
#[derive(Debug, Clone)]
pub struct EndpointOverview {
    pub endpoint: Endpoint,
    pub app_name: String,
    pub status: EndpointStatus,
}

/// What enabling an endpoint did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EnableReport {
    /// It was disabled before.
    pub was_disabled: bool,
    /// Held deliveries past the age cap, now dead as "too old".
    pub expired: u64,
}

#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Reads a named setting (e.g. the admin token's hash).
    async fn get_setting(&self, key: &str) -> StoreResult<Option<String>>;
    /// Stores `value` unless the key exists; returns whichever is stored.
    async fn init_setting(&self, key: &str, value: &str) -> StoreResult<String>;

    async fn create_app(&self, app: &App) -> StoreResult<()>;
    /// By id or by `uid`.
    async fn get_app(&self, id_or_uid: &str) -> StoreResult<Option<App>>;
    async fn list_apps(&self, page: &PageReq) -> StoreResult<Page<App>>;
    /// Replaces `uid`, `name`, `rate_limit`, `metadata`, `updated_at`;
    /// false if it does not exist.
    async fn update_app(&self, app: &App) -> StoreResult<bool>;
    /// Deletes the app with its endpoints, messages, deliveries and
    /// attempts; false if it does not exist.
    async fn delete_app(&self, id: &AppId) -> StoreResult<bool>;

    async fn create_endpoint(&self, ep: &Endpoint) -> StoreResult<()>;
    /// By id or by `uid`, within the app.
    async fn get_endpoint(&self, app: &AppId, id_or_uid: &str) -> StoreResult<Option<Endpoint>>;
    async fn list_endpoints(&self, app: &AppId, page: &PageReq) -> StoreResult<Page<Endpoint>>;
    /// Writes the fields set in `changes` and `updated_at = now`, nothing
    /// else (see [`EndpointChanges`]); false if it does not exist.
    async fn update_endpoint(
        &self,
        app: &AppId,
        ep: &EndpointId,
        changes: &EndpointChanges,
        now: Millis,
    ) -> StoreResult<bool>;
    /// Replaces the endpoint's extra headers and sets `updated_at = now`,
    /// nothing else; false if it does not exist.
    async fn set_endpoint_headers(
        &self,
        app: &AppId,
        ep: &EndpointId,
        headers: &BTreeMap<String, String>,
        now: Millis,
    ) -> StoreResult<bool>;
    /// Deletes the endpoint and its deliveries (attempt history stays).
    async fn delete_endpoint(&self, app: &AppId, id: &EndpointId) -> StoreResult<bool>;

    /// The outbox write: each message and one delivery per subscribed,
    /// enabled endpoint, all in ONE transaction (group commit). Returns one
    /// outcome per message, in order.
    async fn insert_messages(&self, batch: &[NewMessage]) -> StoreResult<Vec<InsertOutcome>>;
    /// Stores `batch` as [`Store::insert_messages`] does and, in the same
    /// transaction, claims new deliveries for the caller as [`Store::claim`]
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
    /// By id or by `eventId`.
    async fn get_message(&self, app: &AppId, id_or_event_id: &str) -> StoreResult<Option<Message>>;

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
    async fn complete(&self, batch: &[Completion]) -> StoreResult<Completed>;

    /// Gives back a claimed delivery that was not sent (shutdown): due
    /// again now, as if never claimed. Only the current holder may.
    async fn release(&self, id: &DeliveryId, lease_token: &str, now: Millis) -> StoreResult<()>;

    async fn get_delivery(&self, app: &AppId, id: &DeliveryId) -> StoreResult<Option<Delivery>>;
    async fn list_deliveries_of_message(
        &self,
        app: &AppId,
        msg: &MsgId,
    ) -> StoreResult<Vec<Delivery>>;
    /// Dead deliveries matching `filter`, by id (newest first unless the
    /// page asks ascending).
    async fn list_dead(&self, filter: &DeadFilter, page: &PageReq) -> StoreResult<Page<Delivery>>;
    /// Replays every dead delivery matching `filter` (and, when `ids` is
    /// given, only those), at most `limit`; returns how many.
    async fn replay_dead_matching(
        &self,
        filter: &DeadFilter,
        ids: Option<&[DeliveryId]>,
        limit: usize,
        now: Millis,
    ) -> StoreResult<u64>;
    /// Replays every dead delivery matching `filter`, in batches of
    /// [`REPLAY_BATCH`], only those dead when it began (one that fails
    /// again meanwhile is not replayed twice); returns how many.
    async fn replay_all_dead_matching(&self, filter: &DeadFilter, now: Millis) -> StoreResult<u64> {
        let filter = DeadFilter {
            until: Some(filter.until.map_or(now + 1, |u| u.min(now + 1))),
            ..filter.clone()
        };
        let mut total = 0;
        loop {
            let n = self
                .replay_dead_matching(&filter, None, REPLAY_BATCH, now)
                .await?;
            total += n;
            if usize::try_from(n).unwrap_or(usize::MAX) < REPLAY_BATCH {
                return Ok(total);
            }
        }
    }
    /// Makes one dead delivery due now, in a fresh retry cycle. False if it
    /// is not dead (or not found).
    async fn replay_dead(&self, app: &AppId, id: &DeliveryId, now: Millis) -> StoreResult<bool> {
        let filter = DeadFilter {
            app: Some(app.clone()),
            ..DeadFilter::default()
        };
        let ids = std::slice::from_ref(id);
        Ok(self
            .replay_dead_matching(&filter, Some(ids), 1, now)
            .await?
            == 1)
    }
    /// Replays every dead delivery of an endpoint; returns how many.
    async fn replay_dead_of_endpoint(
        &self,
        app: &AppId,
        ep: &EndpointId,
        now: Millis,
    ) -> StoreResult<u64> {
        let filter = DeadFilter {
            app: Some(app.clone()),
            endpoint: Some(ep.clone()),
            ..DeadFilter::default()
        };
        self.replay_all_dead_matching(&filter, now).await
    }
    /// Svix's resend: a manual attempt of (message, endpoint) now, reusing
    /// the delivery (and so its Idempotency-Key) if one exists.
    async fn resend(
        &self,
        app: &AppId,
        msg: &MsgId,
        ep: &EndpointId,
        now: Millis,
    ) -> StoreResult<ResendOutcome>;

    async fn list_attempts_of_message(
        &self,
        app: &AppId,
        msg: &MsgId,
        page: &PageReq,
    ) -> StoreResult<Page<AttemptRecord>> {
        let filter = AttemptFilter {
            msg: Some(msg.clone()),
            ..AttemptFilter::default()
        };
        self.list_attempts(app, &filter, page).await
    }
    async fn list_attempts_of_endpoint(
        &self,
        app: &AppId,
        ep: &EndpointId,
        page: &PageReq,
    ) -> StoreResult<Page<AttemptRecord>> {
        let filter = AttemptFilter {
            endpoint: Some(ep.clone()),
            ..AttemptFilter::default()
        };
        self.list_attempts(app, &filter, page).await
    }
    /// Attempts of the app matching `filter` (by message or by endpoint,
    /// both indexed), by id.
    async fn list_attempts(
        &self,
        app: &AppId,
        filter: &AttemptFilter,
        page: &PageReq,
    ) -> StoreResult<Page<AttemptRecord>>;
    async fn get_attempt(&self, app: &AppId, id: &AttemptId) -> StoreResult<Option<AttemptRecord>>;
    /// The app's messages matching `filter`, by id.
    async fn list_messages(
        &self,
        app: &AppId,
        filter: &MessageFilter,
        page: &PageReq,
    ) -> StoreResult<Page<Message>>;
    /// The endpoint's deliveries with their messages, by message id.
    async fn list_endpoint_messages(
        &self,
        app: &AppId,
        ep: &EndpointId,
        page: &PageReq,
    ) -> StoreResult<Page<(Delivery, Message)>>;
    async fn endpoint_delivery_counts(&self, ep: &EndpointId) -> StoreResult<DeliveryCounts>;

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

    async fn create_token(&self, token: &ApiToken, sha256_hex: &str) -> StoreResult<()>;
    async fn find_token(&self, sha256_hex: &str) -> StoreResult<Option<ApiToken>>;
    async fn list_tokens(&self, app: &AppId) -> StoreResult<Vec<ApiToken>>;
    async fn delete_token(&self, app: &AppId, id: &str) -> StoreResult<bool>;

    /// Starts a request carrying an Idempotency-Key (see [`IdemBegin`]).
    /// Records older than `valid_after` are forgotten; a still-running one
    /// older than `stale_before` is taken over (its process died).
    async fn idempotency_begin(
        &self,
        scope: &str,
        key: &str,
        request_hash: &str,
        now: Millis,
        valid_after: Millis,
        stale_before: Millis,
    ) -> StoreResult<IdemBegin>;
    /// Keeps the response of a request begun with `idempotency_begin`.
    async fn idempotency_finish(
        &self,
        scope: &str,
        key: &str,
        status: u16,
        body: &str,
    ) -> StoreResult<()>;
    /// Forgets a begun request that will not be kept (a server error).
    async fn idempotency_abort(&self, scope: &str, key: &str) -> StoreResult<()>;
    /// Drops idempotency records created before `before`.
    async fn prune_idempotency(&self, before: Millis) -> StoreResult<u64>;

    /// Drops endpoint stats buckets that started before `before`.
    async fn prune_stats(&self, before: Millis) -> StoreResult<u64>;

    /// Signals `wake` whenever another process commits work that may be
    /// due (PostgreSQL: LISTEN/NOTIFY). Returns once listening has started;
    /// it goes on in the background. A backend used by one process only
    /// needs nothing here: ingest wakes the dispatcher in-process.
    async fn listen_for_work(&self, wake: std::sync::Arc<tokio::sync::Notify>) -> StoreResult<()> {
        let _ = wake;
        Ok(())
    }

    /// Creates an event type; `Conflict` if the name exists.
    async fn create_event_type(&self, et: &EventType) -> StoreResult<()>;
    async fn get_event_type(&self, name: &str) -> StoreResult<Option<EventType>>;
    /// By name; archived ones only when asked.
    async fn list_event_types(
        &self,
        include_archived: bool,
        page: &PageReq,
    ) -> StoreResult<Page<EventType>>;
    /// Replaces the mutable fields (keeps `created_at`); false if absent.
    async fn update_event_type(&self, et: &EventType) -> StoreResult<bool>;
    /// Deletes an event type for good; false if absent.
    async fn delete_event_type(&self, name: &str) -> StoreResult<bool>;
    /// The names in `names` that are not event types.
    async fn unknown_event_types(&self, names: &[String]) -> StoreResult<Vec<String>>;

    /// Replaces the endpoint's secret with `new_secret`; the current one
    /// keeps signing until `grace_until` (see [`rotated_old_secrets`]).
    /// False if the endpoint does not exist.
    async fn rotate_secret(
        &self,
        app: &AppId,
        ep: &EndpointId,
        new_secret: &str,
        grace_until: Millis,
        now: Millis,
    ) -> StoreResult<bool>;
    /// The endpoint's health state (None if it does not exist).
    async fn endpoint_status(&self, ep: &EndpointId) -> StoreResult<Option<EndpointStatus>>;
    /// The endpoint's stats buckets starting at or after `since`.
    async fn endpoint_stats(&self, ep: &EndpointId, since: Millis)
        -> StoreResult<Vec<StatsBucket>>;
    /// Every endpoint (of `app`, or of all apps), failing ones first (by
    /// streak), then by id; `offset` paging for the dashboard.
    async fn list_endpoint_overview(
        &self,
        app: Option<&AppId>,
        offset: usize,
        limit: usize,
    ) -> StoreResult<Vec<EndpointOverview>>;
    /// Disables an endpoint with a reason. With `streak_started_at`, only
    /// if that failing streak is still the current one (a success since
    /// then wins). False if nothing changed (already disabled, gone, or the
    /// streak moved on).
    async fn disable_endpoint(
        &self,
        ep: &EndpointId,
        reason: &str,
        auto: bool,
        streak_started_at: Option<Millis>,
        now: Millis,
    ) -> StoreResult<bool>;
    /// Enables a disabled endpoint and resets its streak; its held
    /// deliveries resume, except those whose cycle started before
    /// `too_old_before`, which become dead ("too old"). An endpoint that is
    /// already enabled is left exactly as it is (its pending deliveries are
    /// not held, so no age rule applies to them here). None if it does not
    /// exist.
    async fn enable_endpoint(
        &self,
        app: &AppId,
        ep: &EndpointId,
        now: Millis,
        too_old_before: Millis,
    ) -> StoreResult<Option<EnableReport>>;
    async fn queue_stats(&self, now: Millis) -> StoreResult<QueueStats>;

    /// Cheap liveness probe.
    async fn ping(&self) -> StoreResult<()>;
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PruneReport {
    pub messages: u64,
    pub dead_deliveries: u64,
    /// A batch was full: call again.
    pub more: bool,
}

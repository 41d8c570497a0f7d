//! Replays of dead deliveries and Svix's resend.

use super::conditions::{Conditions, Dialect};
use super::*;

/// Replays of dead deliveries and resends.
#[async_trait]
pub trait Replay: Send + Sync {
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
    /// the delivery (and so its Idempotency-Key) if one exists; refused
    /// (`InFlight`, nothing changed) while that delivery is delivering.
    async fn resend(
        &self,
        app: &AppId,
        msg: &MsgId,
        ep: &EndpointId,
        now: Millis,
    ) -> StoreResult<ResendOutcome>;
    /// One batch of Svix's replay-missing: of the messages of `app`
    /// created in `window` with ids after `after` (at most `limit` of
    /// them, in id order), those `ep` has no delivery of and would receive
    /// now (its filter and channels) get one, pending and due now in a
    /// fresh cycle. None if the endpoint does not exist. Serialised with
    /// resends and other replays of the endpoint, so a repeat makes none
    /// twice.
    async fn deliver_missing(
        &self,
        app: &AppId,
        ep: &EndpointId,
        window: (Millis, Millis),
        after: &MsgId,
        limit: usize,
        now: Millis,
    ) -> StoreResult<Option<MissingBatch>>;
}

/// What one [`Replay::deliver_missing`] batch did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingBatch {
    /// Deliveries made.
    pub delivered: u64,
    /// The last message looked at: the next batch starts after it. None
    /// when the window holds no more.
    pub last: Option<MsgId>,
}

/// Of `(id, event type, channels JSON)` rows, those `sub` would receive.
pub fn wanted_by(
    sub: &Subscriber,
    rows: Vec<(String, String, Option<String>)>,
) -> StoreResult<Vec<String>> {
    let mut out = Vec::new();
    for (id, event_type, channels) in rows {
        let channels: Option<Vec<String>> = channels.as_deref().map(from_json).transpose()?;
        let probe = NewMessage {
            id: MsgId::from_trusted(id),
            app_id: AppId::from_trusted(String::new()),
            event_type,
            event_id: None,
            payload: String::new(),
            channels,
            created_at: 0,
            traceparent: None,
            application: None,
            deliver_at: None,
            payload_expires_at: None,
            tags: None,
        };
        if sub.wants(&probe) {
            out.push(probe.id.into_string());
        }
    }
    Ok(out)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResendOutcome {
    Queued,
    /// The message's payload was expunged: nothing is sent.
    Expunged,
    /// The delivery is `delivering`: an attempt is in flight (or its lease
    /// has not ended). Resending it then sent it again at once, beside that
    /// attempt, with the same Idempotency-Key and `X-Attempt` (on a FIFO
    /// endpoint two requests open); so nothing changes, and the caller may
    /// resend once the attempt's outcome is written.
    InFlight,
    NoSuchMessage,
    NoSuchEndpoint,
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

impl DeadFilter {
    /// The dead deliveries this filter keeps, over `deliveries d JOIN
    /// messages m`.
    pub(crate) fn conditions(&self, dialect: Dialect) -> Conditions {
        let mut c = Conditions::new(dialect, "d.state = 3");
        c.and_some(" AND d.app_id = #", self.app.as_ref().map(AppId::as_str));
        c.and_some(
            " AND d.endpoint_id = #",
            self.endpoint.as_ref().map(EndpointId::as_str),
        );
        c.and_some(" AND m.event_type = #", self.event_type.as_deref());
        c.and_some(
            " AND d.dead_reason = #",
            self.reason.map(DeadReason::as_str),
        );
        c.and_some(" AND d.updated_at >= #", self.since);
        c.and_some(" AND d.updated_at < #", self.until);
        c.and_some(" AND d.created_at >= #", self.created_since);
        c.and_some(" AND d.created_at < #", self.created_until);
        c
    }
}

//! Reads of stored messages, deliveries and attempts for the API, the
//! dashboard and the portal.

use super::conditions::{Conditions, Dialect};
use super::rows::{col, u16_col, u32_col, StoredRow};
use super::*;

/// Reads of messages, deliveries and attempts.
#[async_trait]
pub trait History: Send + Sync {
    /// By id or by `eventId`.
    async fn get_message(&self, app: &AppId, id_or_event_id: &str) -> StoreResult<Option<Message>>;
    async fn get_delivery(&self, app: &AppId, id: &DeliveryId) -> StoreResult<Option<Delivery>>;
    async fn list_deliveries_of_message(
        &self,
        app: &AppId,
        msg: &MsgId,
    ) -> StoreResult<Vec<Delivery>>;
    /// Dead deliveries matching `filter`, by id (newest first unless the
    /// page asks ascending).
    async fn list_dead(&self, filter: &DeadFilter, page: &PageReq) -> StoreResult<Page<Delivery>>;
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
    /// The endpoint's deliveries with their messages, by message id;
    /// only those in `state` when given, of messages `messages` keeps.
    async fn list_endpoint_messages(
        &self,
        app: &AppId,
        ep: &EndpointId,
        filter: &EndpointMessageFilter,
        page: &PageReq,
    ) -> StoreResult<Page<(Delivery, Message)>>;
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

/// Which messages of an app a listing shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MessageFilter {
    /// Any of these event types.
    pub event_types: Option<Vec<String>>,
    /// Messages carrying this channel.
    pub channel: Option<String>,
    /// Messages carrying this tag.
    pub tag: Option<String>,
    /// Created before (ms).
    pub before: Option<Millis>,
    /// Created at or after (ms), as Svix reads `after`: an item of its
    /// very millisecond is listed.
    pub after: Option<Millis>,
}

impl MessageFilter {
    /// `app`'s messages this filter keeps. Messages keep their event
    /// types, channels and tags as JSON arrays, which each backend reads
    /// with functions of its own.
    pub(crate) fn conditions(&self, app: &AppId, dialect: Dialect) -> StoreResult<Conditions> {
        let (any_type, has_channel, has_tag) = match dialect {
            Dialect::Sqlite => (
                " AND event_type IN (SELECT value FROM json_each(#))",
                " AND EXISTS (SELECT 1 FROM json_each(channels) WHERE value = #)",
                " AND EXISTS (SELECT 1 FROM json_each(tags) WHERE value = #)",
            ),
            Dialect::Postgres { .. } => (
                " AND event_type IN (SELECT jsonb_array_elements_text(#::jsonb))",
                " AND jsonb_exists(channels::jsonb, #)",
                " AND jsonb_exists(tags::jsonb, #)",
            ),
        };
        let mut c = Conditions::new(dialect, "1 = 1");
        c.and(" AND app_id = #", app.as_str());
        c.and_some(
            any_type,
            self.event_types.as_ref().map(to_json).transpose()?,
        );
        c.and_some(has_channel, self.channel.as_deref());
        c.and_some(has_tag, self.tag.as_deref());
        c.and_some(" AND created_at < #", self.before);
        c.and_some(" AND created_at >= #", self.after);
        Ok(c)
    }

    /// Whether it keeps every message (no condition at all).
    pub fn is_empty(&self) -> bool {
        *self == MessageFilter::default()
    }

    /// Narrows `c` to rows whose `msg_id` column names a message this
    /// filter keeps (nothing when it keeps all): a subquery, so that the
    /// messages' own columns need no qualifying beside the outer table's.
    pub(crate) fn narrow(&self, c: &mut Conditions, app: &AppId, msg_id: &str) -> StoreResult<()> {
        if self.is_empty() {
            return Ok(());
        }
        let inner = self.conditions(app, c.next_dialect())?;
        let prefix = format!(" AND {msg_id} IN (SELECT id FROM messages WHERE ");
        c.push_nested(&prefix, inner, ")");
        Ok(())
    }
}

/// Svix's message status of a delivery: `Sending` while it is being sent
/// or waits for a retry (Svix: whenever a next attempt is set), `Pending`
/// only before its first attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SvixStatus {
    Success = 0,
    Pending = 1,
    Fail = 2,
    Sending = 3,
}

impl SvixStatus {
    pub fn of(state: DeliveryState, attempts: u32) -> SvixStatus {
        match state {
            DeliveryState::Delivered => SvixStatus::Success,
            DeliveryState::Dead => SvixStatus::Fail,
            DeliveryState::Pending if attempts == 0 => SvixStatus::Pending,
            DeliveryState::Pending | DeliveryState::Delivering => SvixStatus::Sending,
        }
    }

    /// The deliveries of this status, over `deliveries d` (the states are
    /// constants, written in).
    fn condition(self) -> String {
        let (pending, delivering) = (
            DeliveryState::Pending as i64,
            DeliveryState::Delivering as i64,
        );
        match self {
            SvixStatus::Success => format!(" AND d.state = {}", DeliveryState::Delivered as i64),
            SvixStatus::Fail => format!(" AND d.state = {}", DeliveryState::Dead as i64),
            SvixStatus::Pending => format!(" AND d.state = {pending} AND d.attempts = 0"),
            SvixStatus::Sending => {
                format!(" AND (d.state = {delivering} OR (d.state = {pending} AND d.attempts > 0))")
            }
        }
    }
}

/// Which of an endpoint's deliveries `GET …/endpoint/{ep}/msg` shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndpointMessageFilter {
    pub status: Option<SvixStatus>,
    pub messages: MessageFilter,
}

impl EndpointMessageFilter {
    /// `app`'s deliveries to `ep` this filter keeps, over `deliveries d`.
    pub(crate) fn conditions(
        &self,
        app: &AppId,
        ep: &EndpointId,
        dialect: Dialect,
    ) -> StoreResult<Conditions> {
        let mut c = Conditions::new(dialect, "1 = 1");
        c.and(" AND d.endpoint_id = #", ep.as_str());
        c.and(" AND d.app_id = #", app.as_str());
        if let Some(status) = self.status {
            c.push(&status.condition());
        }
        self.messages.narrow(&mut c, app, "d.msg_id")?;
        Ok(c)
    }
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
    /// Started before (ms).
    pub before: Option<Millis>,
    /// Started at or after (ms).
    pub after: Option<Millis>,
    /// Attempts of messages this keeps (event types, channel).
    pub messages: MessageFilter,
}

impl AttemptFilter {
    /// `app`'s attempts this filter keeps.
    pub(crate) fn conditions(&self, app: &AppId, dialect: Dialect) -> StoreResult<Conditions> {
        let mut c = Conditions::new(dialect, "1 = 1");
        c.and(" AND app_id = #", app.as_str());
        c.and_some(" AND msg_id = #", self.msg.as_ref().map(MsgId::as_str));
        c.and_some(
            " AND endpoint_id = #",
            self.endpoint.as_ref().map(EndpointId::as_str),
        );
        c.and_some(" AND success = #", self.success);
        match self.code_class {
            None => {}
            Some(0) => c.push(" AND status_code IS NULL"),
            Some(class) => {
                c.and(" AND status_code >= #", i64::from(class));
                c.and(" AND status_code < #", i64::from(class) + 100);
            }
        }
        c.and_some(" AND started_at < #", self.before);
        c.and_some(" AND started_at >= #", self.after);
        self.messages.narrow(&mut c, app, "msg_id")?;
        Ok(c)
    }
}

/// A column holding a JSON list of strings (a message's channels, tags).
fn json_list(r: &impl StoredRow, column: &str) -> StoreResult<Option<Vec<String>>> {
    col::<Option<String>>(r, column)?
        .as_deref()
        .map(from_json)
        .transpose()
}

/// A message from its stored row (either backend).
pub(crate) fn message_from_row(r: &impl StoredRow) -> StoreResult<Message> {
    let id = MsgId::from_trusted(col(r, "id")?);
    let app_id = AppId::from_trusted(col(r, "app_id")?);
    message_with(r, id, app_id, col(r, "event_type")?, "created_at")
}

/// A message whose id, application and type are given, the rest read from
/// `r` (its creation time from the column `created_at`).
fn message_with(
    r: &impl StoredRow,
    id: MsgId,
    app_id: AppId,
    event_type: String,
    created_at: &str,
) -> StoreResult<Message> {
    Ok(Message {
        id,
        app_id,
        event_type,
        event_id: col(r, "event_id")?,
        payload: col(r, "payload")?,
        channels: json_list(r, "channels")?,
        created_at: col(r, created_at)?,
        traceparent: col(r, "traceparent")?,
        tags: json_list(r, "tags")?,
        deliver_at: col(r, "deliver_at")?,
        application: None,
        payload_expires_at: None,
    })
}

/// An endpoint's deliveries with their messages, where `cond` holds
/// (`EndpointMessageFilter::conditions`); `delivery_columns` is the
/// backend's list of `d.` columns. The message's columns follow under
/// names of their own (the delivery has an `id` and a `created_at` too).
pub(crate) fn endpoint_messages_sql(delivery_columns: &str, cond: &str) -> String {
    format!(
        "SELECT {delivery_columns}, m.payload, m.event_id, m.channels, \
         m.created_at AS msg_created_at, m.traceparent, m.tags, m.deliver_at \
         FROM deliveries d JOIN messages m ON m.id = d.msg_id WHERE {cond}"
    )
}

/// A delivery and its message from a row of [`endpoint_messages_sql`]
/// (either backend).
pub(crate) fn delivery_and_message_from_row(
    r: &impl StoredRow,
) -> StoreResult<(Delivery, Message)> {
    let d = delivery_from_row(r)?;
    let (id, app_id, event_type) = (d.msg_id.clone(), d.app_id.clone(), d.event_type.clone());
    let m = message_with(r, id, app_id, event_type, "msg_created_at")?;
    Ok((d, m))
}

/// A delivery from its stored row (either backend).
pub(crate) fn delivery_from_row(r: &impl StoredRow) -> StoreResult<Delivery> {
    let state: i64 = col(r, "state")?;
    let reason: Option<String> = col(r, "dead_reason")?;
    Ok(Delivery {
        id: DeliveryId::from_trusted(col(r, "id")?),
        msg_id: MsgId::from_trusted(col(r, "msg_id")?),
        app_id: AppId::from_trusted(col(r, "app_id")?),
        endpoint_id: EndpointId::from_trusted(col(r, "endpoint_id")?),
        event_type: col(r, "event_type")?,
        state: DeliveryState::from_i64(state)
            .ok_or_else(|| StoreError::Internal(format!("bad state {state}")))?,
        attempts: u32_col(r, "attempts")?,
        next_attempt_at: col(r, "next_attempt_at")?,
        dead_reason: reason.as_deref().and_then(DeadReason::parse),
        last_status: u16_col(r, "last_status")?,
        last_error: col(r, "last_error")?,
        created_at: col(r, "created_at")?,
        updated_at: col(r, "updated_at")?,
    })
}

/// An attempt from its stored row (either backend).
pub(crate) fn attempt_from_row(r: &impl StoredRow) -> StoreResult<AttemptRecord> {
    Ok(AttemptRecord {
        id: AttemptId::from_trusted(col(r, "id")?),
        delivery_id: DeliveryId::from_trusted(col(r, "delivery_id")?),
        msg_id: MsgId::from_trusted(col(r, "msg_id")?),
        endpoint_id: EndpointId::from_trusted(col(r, "endpoint_id")?),
        app_id: AppId::from_trusted(col(r, "app_id")?),
        url: col(r, "url")?,
        attempt_number: u32_col(r, "attempt_number")?,
        started_at: col(r, "started_at")?,
        duration_ms: col(r, "duration_ms")?,
        status_code: u16_col(r, "status_code")?,
        response: col(r, "response")?,
        error: col(r, "error")?,
        success: col(r, "success")?,
        manual: col(r, "manual")?,
    })
}

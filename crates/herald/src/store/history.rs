//! Reads of stored messages, deliveries and attempts for the API, the
//! dashboard and the portal.

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
    /// The endpoint's deliveries with their messages, by message id.
    async fn list_endpoint_messages(
        &self,
        app: &AppId,
        ep: &EndpointId,
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

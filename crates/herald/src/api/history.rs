//! What happened to messages, as Svix's API shows it: the message list,
//! one attempt, the endpoints a message was sent to, the messages an
//! endpoint was sent, an endpoint's counts, and `recover`.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::attempts::AttemptOut;
use super::auth::ResolvedApp;
use super::endpoints::PathEndpoint;
use super::error::{NotFoundResponse, ValidationResponse};
use super::messages::{find_message, MessageOut, PathMessage};
use super::{
    rfc3339, ApiError, ApiJson, ApiQuery, ApiResult, ApiState, FieldError, ListParams, ListResponse,
};
use crate::audit::Actor;
use crate::ids::{AppId, AttemptId, MsgId};
use crate::store::{
    now_millis, AttemptFilter, AttemptRecord, DeadFilter, Delivery, DeliveryState, Endpoint,
    EndpointMessageFilter, Message, MessageFilter, Millis, SvixStatus,
};

/// Svix's message status for a delivery, and its name: 0 success,
/// 1 pending (no attempt yet), 2 fail, 3 sending (being sent, or waiting
/// for a retry).
pub fn svix_status(d: &Delivery) -> (u8, &'static str) {
    let status = SvixStatus::of(d.state, d.attempts);
    let name = match status {
        SvixStatus::Success => "success",
        SvixStatus::Pending => "pending",
        SvixStatus::Fail => "fail",
        SvixStatus::Sending => "sending",
    };
    (status as u8, name)
}

#[derive(Debug, Deserialize, Default, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct MessageListParams {
    // Documented by `ListParams`' own derive: IntoParams cannot flatten.
    #[serde(flatten)]
    #[param(ignore)]
    pub list: ListParams,
    /// Comma-separated, as the SDKs send it.
    pub event_types: Option<String>,
    pub channel: Option<String>,
    /// Only messages carrying this tag (exact match).
    pub tag: Option<String>,
    /// Created before this time (RFC 3339).
    #[param(format = DateTime)]
    pub before: Option<String>,
    /// Created at or after this time (RFC 3339; its millisecond included,
    /// as Svix lists).
    #[param(format = DateTime)]
    pub after: Option<String>,
}

/// `GET /app/{app}/msg`: newest first unless `order=ascending`.
#[utoipa::path(
    get,
    path = "/app/{app_id}/msg",
    tag = "Message",
    params(ListParams, MessageListParams),
    responses(
        (status = 200, description = "A page of messages, newest first", body = ListResponse<MessageOut>),
        NotFoundResponse, ValidationResponse,
    )
)]
pub async fn list_messages(
    State(state): State<ApiState>,
    app: ResolvedApp,
    ApiQuery(params): ApiQuery<MessageListParams>,
) -> ApiResult<Json<ListResponse<MessageOut>>> {
    let filter = MessageFilter {
        before: super::query_time("before", &params.before)?,
        after: super::query_time("after", &params.after)?,
        ..messages_of(&params.event_types, &params.channel, &params.tag)
    };
    let page_req = params
        .list
        .page_since(filter.after, filter.before, MsgId::PREFIX)?;
    let page = state
        .store
        .list_messages(&app.id, &filter, &page_req)
        .await?;
    let data = page
        .items
        .into_iter()
        .map(MessageOut::try_from)
        .collect::<ApiResult<Vec<_>>>()?;
    Ok(Json(ListResponse::new(
        data,
        page.has_more,
        |m: &MessageOut| m.id.clone(),
    )))
}

/// The message conditions Svix's list routes share: `event_types`
/// (comma-separated, as the SDKs send a set), `channel` and `tag`; an
/// empty one is no condition.
fn messages_of(
    event_types: &Option<String>,
    channel: &Option<String>,
    tag: &Option<String>,
) -> MessageFilter {
    let event_types = event_types.as_deref().map(|s| {
        s.split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_owned)
            .collect::<Vec<_>>()
    });
    MessageFilter {
        event_types: event_types.filter(|t| !t.is_empty()),
        channel: channel.clone().filter(|c| !c.is_empty()),
        tag: tag.clone().filter(|t| !t.is_empty()),
        ..MessageFilter::default()
    }
}

/// The attempt-list filters Svix's SDKs send.
#[derive(Debug, Deserialize, Default, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AttemptListParams {
    // Documented by `ListParams`' own derive: IntoParams cannot flatten.
    #[serde(flatten)]
    #[param(ignore)]
    pub list: ListParams,
    /// 0 success, 1 pending, 2 fail, 3 sending.
    #[param(schema_with = status_schema)]
    pub status: Option<String>,
    /// 0 (no response), 100, 200, 300, 400 or 500.
    #[param(schema_with = status_code_class_schema)]
    pub status_code_class: Option<String>,
    /// Attempts of messages of these types (comma-separated).
    pub event_types: Option<String>,
    /// Attempts of messages sent on this channel.
    pub channel: Option<String>,
    /// Attempts of messages carrying this tag.
    pub tag: Option<String>,
    /// Made before this time (RFC 3339).
    #[param(format = DateTime)]
    pub before: Option<String>,
    /// Made at or after this time (RFC 3339; its millisecond included).
    #[param(format = DateTime)]
    pub after: Option<String>,
}

/// `GET …/attempt/msg/{msg}`'s own filter.
#[derive(Debug, Deserialize, Default, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AttemptEndpointParam {
    /// Only the attempts to this endpoint (its id or uid).
    pub endpoint_id: Option<String>,
}

/// `GET …/endpoint/{ep}/msg`'s filters.
#[derive(Debug, Deserialize, Default, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EndpointMessageListParams {
    // Documented by `ListParams`' own derive: IntoParams cannot flatten.
    #[serde(flatten)]
    #[param(ignore)]
    pub list: ListParams,
    /// The delivery's state: 0 success, 1 pending, 2 fail, 3 sending.
    #[param(schema_with = status_schema)]
    pub status: Option<String>,
    /// Messages of these types (comma-separated).
    pub event_types: Option<String>,
    pub channel: Option<String>,
    pub tag: Option<String>,
    /// Messages created before this time (RFC 3339).
    #[param(format = DateTime)]
    pub before: Option<String>,
    /// Messages created at or after this time (RFC 3339; its millisecond
    /// included).
    #[param(format = DateTime)]
    pub after: Option<String>,
}

/// Integer query values that must be one of `values` (read as text, so a
/// bad one is a 422 naming it).
fn integer_enum(values: &[u16]) -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::Type::Integer)
        .enum_values(Some(values.iter().copied()))
        .build()
}

fn status_schema() -> utoipa::openapi::Object {
    integer_enum(&[0, 1, 2, 3])
}

fn status_code_class_schema() -> utoipa::openapi::Object {
    integer_enum(&[0, 100, 200, 300, 400, 500])
}

impl AttemptListParams {
    /// The filter, or `None` when it can match nothing (an attempt in the
    /// log has finished: it is never pending nor sending).
    pub fn filter(&self) -> ApiResult<Option<AttemptFilter>> {
        let mut filter = AttemptFilter {
            before: super::query_time("before", &self.before)?,
            after: super::query_time("after", &self.after)?,
            messages: messages_of(&self.event_types, &self.channel, &self.tag),
            ..AttemptFilter::default()
        };
        match self.status.as_deref().filter(|s| !s.is_empty()) {
            None => {}
            Some("0") => filter.success = Some(true),
            Some("2") => filter.success = Some(false),
            Some("1") | Some("3") => return Ok(None),
            Some(_) => {
                return Err(ApiError::Validation(vec![FieldError::query(
                    "status",
                    "must be 0, 1, 2 or 3",
                )]))
            }
        }
        match self.status_code_class.as_deref().filter(|s| !s.is_empty()) {
            None => {}
            Some(c) => match c.parse::<u16>() {
                Ok(class @ (0 | 100 | 200 | 300 | 400 | 500)) => filter.code_class = Some(class),
                _ => {
                    return Err(ApiError::Validation(vec![FieldError::query(
                        "status_code_class",
                        "must be 0, 100, 200, 300, 400 or 500",
                    )]))
                }
            },
        }
        Ok(Some(filter))
    }
}

/// `GET /app/{app}/msg/{msg}/attempt/{attempt}`.
#[utoipa::path(
    get,
    path = "/app/{app_id}/msg/{msg_id}/attempt/{attempt_id}",
    tag = "Attempt",
    responses(
        (status = 200, description = "The attempt", body = AttemptOut),
        NotFoundResponse,
    )
)]
pub async fn get_attempt(
    State(state): State<ApiState>,
    app: ResolvedApp,
    Path((_app_id, msg_id, attempt_id)): Path<(String, String, String)>,
) -> ApiResult<Json<AttemptOut>> {
    let attempt = find_attempt(&state, &app.id, &msg_id, &attempt_id).await?;
    Ok(Json(attempt.into()))
}

/// The attempt `attempt_id` of the message `msg_id` (its id or eventId) of
/// the application; a 404 when either is not there, or the attempt is
/// another message's.
async fn find_attempt(
    state: &ApiState,
    app: &AppId,
    msg_id: &str,
    attempt_id: &str,
) -> ApiResult<AttemptRecord> {
    let msg = find_message(state, app, msg_id).await?;
    let id = AttemptId::parse(attempt_id).ok_or(ApiError::NotFound("attempt"))?;
    match state.store.get_attempt(app, &id).await? {
        Some(a) if a.msg_id == msg.id => Ok(a),
        _ => Err(ApiError::NotFound("attempt")),
    }
}

/// `DELETE /app/{app}/msg/{msg}/content` (Svix): erases the message's
/// payload. The message, its deliveries and attempts stay (the payload
/// shows as `{"expired":true}` with `payloadExpunged`); its pending deliveries die
/// (`expunged`), and nothing is sent for it again.
#[utoipa::path(
    delete,
    path = "/app/{app_id}/msg/{msg_id}/content",
    tag = "Message",
    responses(
        (status = 204, description = "The payload is erased"),
        NotFoundResponse,
    )
)]
pub async fn expunge_message_content(
    State(state): State<ApiState>,
    actor: Actor,
    PathMessage(msg): PathMessage,
) -> ApiResult<StatusCode> {
    let dead = state
        .store
        .expunge_message(&msg.app_id, &msg.id, now_millis())
        .await?
        .ok_or(ApiError::NotFound("message"))?;
    actor
        .record(
            &*state.store,
            "message.expunged",
            Some(&msg.app_id),
            msg.id.as_str(),
            serde_json::json!({ "pendingDeliveriesDead": dead }),
        )
        .await;
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /app/{app}/msg/{msg}/attempt/{attempt}/content` (Svix): erases
/// the response excerpt an attempt recorded (a receiver that answered
/// with something sensitive).
#[utoipa::path(
    delete,
    path = "/app/{app_id}/msg/{msg_id}/attempt/{attempt_id}/content",
    tag = "Attempt",
    responses(
        (status = 204, description = "The response excerpt is erased"),
        NotFoundResponse,
    )
)]
pub async fn expunge_attempt_content(
    State(state): State<ApiState>,
    actor: Actor,
    app: ResolvedApp,
    Path((_app_id, msg_id, attempt_id)): Path<(String, String, String)>,
) -> ApiResult<StatusCode> {
    let id = find_attempt(&state, &app.id, &msg_id, &attempt_id)
        .await?
        .id;
    if !state.store.expunge_attempt(&app.id, &id).await? {
        return Err(ApiError::NotFound("attempt"));
    }
    actor
        .record(
            &*state.store,
            "attempt.expunged",
            Some(&app.id),
            id.as_str(),
            serde_json::Value::Null,
        )
        .await;
    Ok(StatusCode::NO_CONTENT)
}

/// Svix's `MessageEndpointOut`: an endpoint a message went to, with the
/// delivery's state.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MessageEndpointOut {
    pub id: String,
    pub url: String,
    pub description: String,
    pub uid: Option<String>,
    pub disabled: bool,
    pub event_types: Option<Vec<String>>,
    pub channels: Option<Vec<String>>,
    pub throttle_rate: Option<u16>,
    pub status: u8,
    pub status_text: &'static str,
    pub next_attempt: Option<String>,
    pub created_at: String,
    pub updated_at: String,
}

fn next_attempt(d: &Delivery) -> Option<String> {
    matches!(d.state, DeliveryState::Pending).then(|| rfc3339(d.next_attempt_at))
}

/// `GET /app/{app}/msg/{msg}/endpoint`: every endpoint the message was
/// routed to (a message has one delivery per endpoint, so one page holds
/// them unless `limit` is smaller).
#[utoipa::path(
    get,
    path = "/app/{app_id}/msg/{msg_id}/endpoint",
    tag = "Message",
    params(ListParams),
    responses(
        (status = 200, description = "The endpoints the message was routed to", body = ListResponse<MessageEndpointOut>),
        NotFoundResponse, ValidationResponse,
    )
)]
pub async fn list_attempted_destinations(
    State(state): State<ApiState>,
    axum::Extension(principal): axum::Extension<super::auth::Principal>,
    PathMessage(msg): PathMessage,
    ApiQuery(params): ApiQuery<ListParams>,
) -> ApiResult<Json<ListResponse<MessageEndpointOut>>> {
    let page = params.page(true)?;
    let mut by_endpoint: std::collections::HashMap<String, _> = state
        .store
        .list_deliveries_of_message(&msg.app_id, &msg.id)
        .await?
        .into_iter()
        .map(|d| (d.endpoint_id.as_str().to_owned(), d))
        .collect();
    // Paged by endpoint id as every list; only the page's endpoints read.
    let ids =
        ListResponse::page_of_all(by_endpoint.keys().cloned().collect(), &page, String::clone);
    let mut data = Vec::with_capacity(ids.data.len());
    for id in &ids.data {
        let Some(d) = by_endpoint.remove(id) else {
            continue;
        };
        // An endpoint deleted since has no delivery left: skip a race.
        let Some(ep) = state.store.get_endpoint(&msg.app_id, id).await? else {
            continue;
        };
        let (status, status_text) = svix_status(&d);
        // Its credentials as `GET …/endpoint/{id}` shows them to this caller.
        let url = if super::endpoints::may_read_secrets(&principal) {
            ep.url
        } else {
            crate::net::masked_url(&ep.url)
        };
        data.push(MessageEndpointOut {
            id: ep.id.into_string(),
            url,
            description: ep.description,
            uid: ep.uid,
            disabled: ep.disabled,
            event_types: ep.filter_types,
            channels: ep.channels,
            throttle_rate: ep.rate_limit,
            status,
            status_text,
            next_attempt: next_attempt(&d),
            created_at: rfc3339(ep.created_at),
            updated_at: rfc3339(ep.updated_at),
        });
    }
    Ok(Json(ListResponse {
        data,
        iterator: ids.iterator,
        prev_iterator: ids.prev_iterator,
        done: ids.done,
    }))
}

/// Svix's `EndpointMessageOut`: a message sent to an endpoint, with the
/// delivery's state.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointMessageOut {
    pub id: String,
    pub event_type: String,
    pub event_id: Option<String>,
    #[schema(value_type = Value)]
    pub payload: Box<RawValue>,
    pub channels: Option<Vec<String>>,
    pub timestamp: String,
    /// The payload was expunged (it shows as `{"expired":true}`, as Svix's).
    pub payload_expunged: bool,
    pub tags: Option<Vec<String>>,
    #[schema(format = DateTime)]
    pub deliver_at: Option<String>,
    pub status: u8,
    pub status_text: &'static str,
    pub next_attempt: Option<String>,
}

fn endpoint_message(d: Delivery, m: Message) -> ApiResult<EndpointMessageOut> {
    let (status, status_text) = svix_status(&d);
    // Every field of the message as `GET …/msg/{id}` shows it (a field
    // added there fails to compile here until it is added here too).
    let MessageOut {
        id,
        event_type,
        event_id,
        payload,
        channels,
        timestamp,
        payload_expunged,
        tags,
        deliver_at,
    } = m.try_into()?;
    Ok(EndpointMessageOut {
        id,
        event_type,
        event_id,
        payload,
        channels,
        timestamp,
        payload_expunged,
        tags,
        deliver_at,
        status,
        status_text,
        next_attempt: next_attempt(&d),
    })
}

/// `GET /app/{app}/endpoint/{ep}/msg`: newest first.
#[utoipa::path(
    get,
    path = "/app/{app_id}/endpoint/{endpoint_id}/msg",
    tag = "Endpoint",
    params(ListParams, EndpointMessageListParams),
    responses(
        (status = 200, description = "A page of the messages sent to the endpoint, newest first",
         body = ListResponse<EndpointMessageOut>),
        NotFoundResponse, ValidationResponse,
    )
)]
pub async fn list_attempted_messages(
    State(state): State<ApiState>,
    PathEndpoint(ep): PathEndpoint,
    ApiQuery(params): ApiQuery<EndpointMessageListParams>,
) -> ApiResult<Json<ListResponse<EndpointMessageOut>>> {
    let status_filter = match params.status.as_deref().filter(|s| !s.is_empty()) {
        None => None,
        Some("0") => Some(SvixStatus::Success),
        Some("1") => Some(SvixStatus::Pending),
        Some("2") => Some(SvixStatus::Fail),
        Some("3") => Some(SvixStatus::Sending),
        Some(_) => {
            return Err(ApiError::Validation(vec![FieldError::query(
                "status",
                "must be 0, 1, 2 or 3",
            )]))
        }
    };
    let filter = EndpointMessageFilter {
        status: status_filter,
        messages: MessageFilter {
            before: super::query_time("before", &params.before)?,
            after: super::query_time("after", &params.after)?,
            ..messages_of(&params.event_types, &params.channel, &params.tag)
        },
    };
    let page_req =
        params
            .list
            .page_since(filter.messages.after, filter.messages.before, MsgId::PREFIX)?;
    let page = state
        .store
        .list_endpoint_messages(&ep.app_id, &ep.id, &filter, &page_req)
        .await?;
    let data = page
        .items
        .into_iter()
        .map(|(d, m)| endpoint_message(d, m))
        .collect::<ApiResult<Vec<_>>>()?;
    Ok(Json(ListResponse::new(
        data,
        page.has_more,
        |m: &EndpointMessageOut| m.id.clone(),
    )))
}

/// Svix's `EndpointStats`: the endpoint's deliveries by status.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct EndpointStatsOut {
    pub success: u64,
    pub pending: u64,
    pub sending: u64,
    pub fail: u64,
    pub canceled: u64,
}

/// `GET /app/{app}/endpoint/{ep}/stats` (`since`/`until` are accepted and
/// ignored: the counts cover the deliveries kept, see `HERALD_RETENTION`).
#[utoipa::path(
    get,
    path = "/app/{app_id}/endpoint/{endpoint_id}/stats",
    tag = "Endpoint",
    responses(
        (status = 200, description = "The endpoint's deliveries by status", body = EndpointStatsOut),
        NotFoundResponse,
    )
)]
pub async fn endpoint_stats(
    State(state): State<ApiState>,
    PathEndpoint(ep): PathEndpoint,
) -> ApiResult<Json<EndpointStatsOut>> {
    let c = state.store.endpoint_delivery_counts(&ep.id).await?;
    Ok(Json(EndpointStatsOut {
        success: c.delivered,
        pending: c.pending,
        sending: c.delivering,
        fail: c.dead,
        canceled: 0,
    }))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct RecoverIn {
    /// Messages created since this time (RFC 3339).
    #[schema(format = DateTime)]
    pub since: String,
    /// And before this one, when given.
    #[schema(format = DateTime)]
    pub until: Option<String>,
}

impl RecoverIn {
    /// `since` and `until` as times, `until` after `since` when given.
    fn window(&self) -> ApiResult<(Millis, Option<Millis>)> {
        let parse = |field: &str, v: &str| {
            super::millis_of_rfc3339(v)
                .ok_or_else(|| ApiError::field(field, "must be an RFC 3339 time"))
        };
        let since = parse("since", &self.since)?;
        let until = self
            .until
            .as_deref()
            .map(|u| parse("until", u))
            .transpose()?;
        if until.is_some_and(|u| u <= since) {
            return Err(ApiError::field("until", "must be after since"));
        }
        Ok((since, until))
    }
}

/// Svix's `RecoverOut`. The work is done when Herald answers, but Svix's
/// schema allows `running` only, so that is what is said.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecoverOut {
    /// `qtask_…`
    pub id: String,
    /// Always `running` (Svix's schema); the replays are already made.
    pub status: &'static str,
    /// `endpoint.recover`, or `endpoint.replay` for replay-missing.
    pub task: &'static str,
    pub updated_at: String,
}

/// `POST /app/{app}/endpoint/{ep}/recover`: replays the endpoint's failed
/// (dead) deliveries of messages created in `[since, until)`. Done before
/// answering, in batches, so the task is reported finished.
#[utoipa::path(
    post,
    path = "/app/{app_id}/endpoint/{endpoint_id}/recover",
    tag = "Endpoint",
    request_body = RecoverIn,
    responses(
        (status = 202, description = "The dead deliveries of the period replayed", body = RecoverOut),
        NotFoundResponse,
    )
)]
pub async fn recover(
    State(state): State<ApiState>,
    actor: Actor,
    PathEndpoint(ep): PathEndpoint,
    ApiJson(body): ApiJson<RecoverIn>,
) -> ApiResult<Response> {
    let (since, until) = body.window()?;
    let now = now_millis();
    let filter = DeadFilter {
        app: Some(ep.app_id.clone()),
        endpoint: Some(ep.id.clone()),
        created_since: Some(since),
        created_until: until,
        ..DeadFilter::default()
    };
    let replayed = state.store.replay_all_dead_matching(&filter, now).await?;
    Ok(EndpointTask::Recover
        .done(&state, &actor, &ep, &body, replayed)
        .await)
}

/// Svix's tasks over an endpoint's messages of a period (`RecoverIn`),
/// done before Herald answers.
#[derive(Debug, Clone, Copy)]
enum EndpointTask {
    /// `recover`: the dead deliveries are replayed.
    Recover,
    /// `replay-missing`: the deliveries never made are made.
    ReplayMissing,
}

impl EndpointTask {
    /// Svix's name of the task (`RecoverOut.task`).
    fn svix_name(self) -> &'static str {
        match self {
            EndpointTask::Recover => "endpoint.recover",
            EndpointTask::ReplayMissing => "endpoint.replay",
        }
    }

    /// The audit log's action, and the name its details give the number
    /// of deliveries queued.
    fn audited(self) -> (&'static str, &'static str) {
        match self {
            EndpointTask::Recover => ("endpoint.recovered", "replayed"),
            EndpointTask::ReplayMissing => ("endpoint.replayed_missing", "delivered"),
        }
    }

    /// The end of the task once it has queued `queued` deliveries to `ep`:
    /// the dispatcher is woken for them, the task is audited with its
    /// period, and Svix's task answer is given.
    async fn done(
        self,
        state: &ApiState,
        actor: &Actor,
        ep: &Endpoint,
        body: &RecoverIn,
        queued: u64,
    ) -> Response {
        if queued > 0 {
            state.wake.notify_one();
        }
        let (action, counted) = self.audited();
        actor
            .record(
                &*state.store,
                action,
                Some(&ep.app_id),
                ep.id.as_str(),
                serde_json::json!({ counted: queued, "since": body.since, "until": body.until }),
            )
            .await;
        task_answer(self.svix_name())
    }
}

/// Svix's answer for a background task, already done when Herald
/// answers (202): a task id as Svix shapes them, `qtask_` and 27 letters
/// and digits.
fn task_answer(task: &'static str) -> Response {
    use rand::distributions::{Alphanumeric, DistString};
    let id = format!(
        "qtask_{}",
        Alphanumeric.sample_string(&mut rand::thread_rng(), 27)
    );
    (
        StatusCode::ACCEPTED,
        Json(RecoverOut {
            id,
            status: "running",
            task,
            updated_at: rfc3339(now_millis()),
        }),
    )
        .into_response()
}

/// Messages one replay-missing batch looks at.
const MISSING_BATCH: usize = 500;

/// `POST /app/{app}/endpoint/{ep}/replay-missing` (Svix): every message of
/// the application created in `[since, until)` that the endpoint has no
/// delivery of and would receive now (created before it was, sent while it
/// was disabled by a person, or filtered otherwise then) gets one, due
/// now. Done before answering, in batches of [`MISSING_BATCH`] messages,
/// each its own transaction; a repeat makes none twice.
#[utoipa::path(
    post,
    path = "/app/{app_id}/endpoint/{endpoint_id}/replay-missing",
    tag = "Endpoint",
    request_body = RecoverIn,
    responses(
        (status = 202, description = "The missing deliveries were made", body = RecoverOut),
        NotFoundResponse,
    )
)]
pub async fn replay_missing(
    State(state): State<ApiState>,
    actor: Actor,
    PathEndpoint(ep): PathEndpoint,
    ApiJson(body): ApiJson<RecoverIn>,
) -> ApiResult<Response> {
    let (since, until) = body.window()?;
    let now = now_millis();
    // Up to now, without `until`: a `since` in the future is as wrong.
    let until = until.unwrap_or(now + 1);
    if until <= since {
        return Err(ApiError::field("until", "must be after since"));
    }
    // Message ids begin with their creation time: the walk starts at the
    // first id `since` can have (a minute early, for ids made just before
    // their time was taken), not at the application's oldest message.
    let start_ms = u64::try_from(since.saturating_sub(60_000)).unwrap_or(0);
    let mut after =
        crate::ids::MsgId::from_trusted(format!("msg_{}", ulid::Ulid::from_parts(start_ms, 0)));
    let mut made = 0u64;
    loop {
        let Some(batch) = state
            .store
            .deliver_missing(
                &ep.app_id,
                &ep.id,
                (since, until),
                &after,
                MISSING_BATCH,
                now,
            )
            .await?
        else {
            return Err(ApiError::NotFound("endpoint"));
        };
        made += batch.delivered;
        match batch.last {
            Some(last) => after = last,
            None => break,
        }
    }
    Ok(EndpointTask::ReplayMissing
        .done(&state, &actor, &ep, &body, made)
        .await)
}

//! Messages: events handed to Herald, fanned out to subscribed endpoints.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::apps::ApplicationIn;
use super::auth::{MaybeResolvedApp, ResolvedApp};
use super::endpoints::{find_endpoint, PathEndpoint};
use super::error::{ConflictResponse, FieldError, NotFoundResponse};
use super::{
    accepted_empty, rfc3339, valid_uid, ApiError, ApiJson, ApiResult, ApiState, MAX_PAYLOAD_BYTES,
    MAX_PAYLOAD_DEPTH,
};
use crate::audit::Actor;
use crate::ids::{AppId, MsgId};
use crate::store::{
    now_millis, App, Delivery, InsertOutcome, Message, Millis, NewMessage, ResendOutcome,
};

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MessageIn {
    #[schema(pattern = "^[A-Za-z0-9._-]{1,256}$")]
    pub event_type: String,
    /// Kept as the exact JSON text the client sent: it is what receivers
    /// get. Any JSON value (Svix sends an object), at most 1 MiB, nested
    /// at most 127 deep.
    #[schema(value_type = Value)]
    pub payload: Box<RawValue>,
    /// Unique per application: a repeat is a 409.
    /// 1-256 of `[A-Za-z0-9._-]`, as Svix allows.
    #[schema(min_length = 1, max_length = 256, pattern = "^[A-Za-z0-9._-]{1,256}$")]
    pub event_id: Option<String>,
    /// Routing: endpoints with channels receive only messages sharing one.
    #[schema(max_items = 10)]
    pub channels: Option<Vec<String>>,
    /// Svix's inline application: when the path's id or uid names no
    /// application, this one is created with the message, in the same
    /// commit (its `uid` must be given and equal the path's). Ignored when
    /// the application exists. Admin token only (an application token's
    /// application always exists).
    pub application: Option<ApplicationIn>,
    /// Free-form tags that `GET /app/{app_id}/msg?tag=` filters by: at most
    /// 5, each 1-128 of `[a-zA-Z0-9-_./\#]` (Svix's rule); repeats count once.
    #[schema(max_items = 5, example = json!(["my_tag", "other"]))]
    pub tags: Option<Vec<String>>,
    /// Scheduled delivery (RFC 3339): no attempt before this time. At most
    /// `HERALD_MAX_AGE` ahead; the age cap counts from it. A time in the
    /// past sends at once.
    #[schema(format = DateTime)]
    pub deliver_at: Option<String>,
    /// Days the payload is kept (Svix: 5–90); then it is erased as
    /// `DELETE …/content` does. Absent: `HERALD_PAYLOAD_RETENTION` applies.
    #[schema(minimum = 5, maximum = 90)]
    pub payload_retention_period: Option<i64>,
    /// Svix's `transformationsParams`: `rawPayload` is sent as the request
    /// body exactly (form-encoded, XML, …) instead of `payload`.
    pub transformations_params: Option<TransformationsParams>,
}

/// Svix's `MessageIn.transformationsParams`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TransformationsParams {
    /// The body each attempt sends, byte for byte (1 B to 1 MiB); the
    /// signature covers exactly these bytes. Set `Content-Type` through
    /// the endpoint's headers (Herald sends `application/json` otherwise).
    pub raw_payload: Option<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MessageOut {
    pub id: String,
    pub event_type: String,
    pub event_id: Option<String>,
    /// `{}` once the payload was expunged.
    #[schema(value_type = Value)]
    pub payload: Box<RawValue>,
    pub channels: Option<Vec<String>>,
    pub timestamp: String,
    /// The payload was erased (`DELETE …/msg/{msg}/content` or payload
    /// retention); the message, its deliveries and attempts stay.
    pub payload_expunged: bool,
    /// The message's tags, sorted.
    pub tags: Option<Vec<String>>,
    /// The `deliverAt` the message was created with.
    #[schema(format = DateTime)]
    pub deliver_at: Option<String>,
}

/// A stored payload as the API shows it: as it is, or `{"expired":true}` when it was
/// expunged (stored as the empty text, which no JSON payload can be).
pub fn shown_payload(payload: String) -> ApiResult<(Box<RawValue>, bool)> {
    if payload.is_empty() {
        // What Svix shows for a payload it no longer holds.
        return RawValue::from_string(r#"{"expired":true}"#.to_owned())
            .map(|p| (p, true))
            .map_err(|_| ApiError::Internal);
    }
    // Not JSON: a raw payload (`transformationsParams.rawPayload`), shown
    // as a JSON string of its text.
    match serde_json::from_str::<serde::de::IgnoredAny>(&payload) {
        Ok(_) => RawValue::from_string(payload),
        Err(_) => RawValue::from_string(serde_json::Value::from(payload).to_string()),
    }
    .map(|p| (p, false))
    .map_err(|e| {
        tracing::error!(error = %e, "a stored payload cannot be shown");
        ApiError::Internal
    })
}

impl TryFrom<Message> for MessageOut {
    type Error = ApiError;
    fn try_from(m: Message) -> ApiResult<Self> {
        let (payload, payload_expunged) = shown_payload(m.payload)?;
        Ok(MessageOut {
            payload_expunged,
            id: m.id.into_string(),
            event_type: m.event_type,
            event_id: m.event_id,
            payload,
            channels: m.channels,
            timestamp: rfc3339(m.created_at),
            tags: m.tags,
            deliver_at: m.deliver_at.map(rfc3339),
        })
    }
}

/// The most tags a message may carry, and the longest tag (Svix's limits).
pub const MAX_TAGS: usize = 5;
pub const MAX_TAG_CHARS: usize = 128;

/// Svix's tag rule: 1-128 of `[a-zA-Z0-9-_./\#]`.
pub fn valid_tag(tag: &str) -> bool {
    (1..=MAX_TAG_CHARS).contains(&tag.len())
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./\\#".contains(&b))
}

/// `tags` checked, sorted and without repeats (`None` for none).
fn check_tags(tags: &Option<Vec<String>>) -> ApiResult<Option<Vec<String>>> {
    let Some(list) = tags else {
        return Ok(None);
    };
    let mut list = list.clone();
    list.sort();
    list.dedup();
    if list.len() > MAX_TAGS {
        return Err(ApiError::field("tags", format!("at most {MAX_TAGS} tags")));
    }
    if let Some(bad) = list.iter().find(|t| !valid_tag(t)) {
        return Err(ApiError::field(
            "tags",
            format!(
                "`{bad}` must be 1-{MAX_TAG_CHARS} characters of letters, digits, '-', '_', '.', '/', '\\' or '#'"
            ),
        ));
    }
    Ok((!list.is_empty()).then_some(list))
}

/// `deliverAt` as ms, refused when it is not RFC 3339 or is more than
/// `max_age` after `now` (the age cap counts from it: nothing could be
/// sent after that anyway).
fn check_deliver_at(
    deliver_at: &Option<String>,
    now: Millis,
    max_age: Millis,
) -> ApiResult<Option<Millis>> {
    let Some(text) = deliver_at else {
        return Ok(None);
    };
    let at = super::millis_of_rfc3339(text).ok_or_else(|| {
        ApiError::field(
            "deliverAt",
            "must be an RFC 3339 time, e.g. 2026-11-30T08:00:00Z",
        )
    })?;
    if at > now.saturating_add(max_age) {
        return Err(ApiError::field(
            "deliverAt",
            format!(
                "must be at most HERALD_MAX_AGE ({} s) ahead",
                max_age / 1000
            ),
        ));
    }
    Ok(Some(at))
}

/// The application a message's `application` creates when the path named
/// none (Svix: its uid must be given and be the path's), checked as
/// `POST /app` checks one; errors are placed under `application`.
pub(super) fn inline_app(key: &str, body: &ApplicationIn, now: Millis) -> ApiResult<App> {
    let under = |e: ApiError| match e {
        ApiError::Validation(errors) => ApiError::Validation(
            errors
                .into_iter()
                .map(|mut f| {
                    if f.loc.first().map(String::as_str) == Some("body") {
                        f.loc.insert(1, "application".to_owned());
                    }
                    f
                })
                .collect(),
        ),
        other => other,
    };
    super::apps::check_app_fields(&body.name, &body.uid, &body.metadata).map_err(under)?;
    super::apps::check_uid_not_an_id(&body.uid, None).map_err(under)?;
    match body.uid.as_deref() {
        None => {
            return Err(ApiError::Validation(vec![FieldError::at(
                &["body", "application", "uid"],
                "must be given to create the application with the message",
            )]))
        }
        Some(uid) if uid != key => {
            return Err(ApiError::Validation(vec![FieldError::at(
                &["body", "application", "uid"],
                "must be the application uid in the path",
            )]))
        }
        Some(_) => {}
    }
    super::apps::check_not_reserved(&body.uid, None).map_err(under)?;
    Ok(App {
        id: AppId::generate(),
        uid: body.uid.clone(),
        name: body.name.clone(),
        rate_limit: body.rate_limit,
        metadata: body.metadata.clone().unwrap_or_default(),
        created_at: now,
        updated_at: now,
    })
}

#[utoipa::path(
    post,
    path = "/app/{app_id}/msg",
    tag = "Message",
    request_body = MessageIn,
    responses(
        (status = 202, description = "Stored (committed); delivery follows", body = MessageOut),
        NotFoundResponse, ConflictResponse,
    )
)]
pub async fn create_message(
    State(state): State<ApiState>,
    actor: Actor,
    Path(key): Path<String>,
    MaybeResolvedApp(resolved): MaybeResolvedApp,
    headers: axum::http::HeaderMap,
    ApiJson(body): ApiJson<MessageIn>,
) -> ApiResult<Response> {
    let created_at = now_millis();
    // The hot path (the application exists) reads nothing more; only a
    // missing one with `application` in the body goes on without it.
    let (app_id, application) = match (resolved, &body.application) {
        (Some(id), _) => (id, None),
        (None, None) => return Err(ApiError::NotFound("application")),
        (None, Some(a)) => {
            let app = inline_app(&key, a, created_at)?;
            (app.id.clone(), Some(app))
        }
    };
    let app_key = app_id.clone();
    if !valid_uid(&body.event_type) {
        return Err(ApiError::field(
            "eventType",
            "must be 1-256 characters of letters, digits, '-', '_' or '.'",
        ));
    }
    if let Some(event_id) = &body.event_id {
        // Svix's pattern (`^[a-zA-Z0-9\-_.]+$`), so Svix's clients and
        // schema accept what Herald returns.
        if !valid_uid(event_id) {
            return Err(ApiError::field(
                "eventId",
                "must be 1-256 characters of letters, digits, '-', '_' or '.'",
            ));
        }
    }
    let raw = body
        .transformations_params
        .as_ref()
        .and_then(|t| t.raw_payload.as_deref());
    if let Some(raw) = raw {
        if raw.is_empty() {
            return Err(ApiError::field(
                "transformationsParams.rawPayload",
                "must not be empty",
            ));
        }
        // PostgreSQL's text cannot hold it, and no receiver expects it.
        if raw.contains('\0') {
            return Err(ApiError::field(
                "transformationsParams.rawPayload",
                "must not contain a NUL character (U+0000)",
            ));
        }
        if raw.len() > MAX_PAYLOAD_BYTES {
            return Err(ApiError::PayloadTooLarge(format!(
                "transformationsParams.rawPayload is {} bytes; the limit is {MAX_PAYLOAD_BYTES}",
                raw.len()
            )));
        }
    }
    let payload = raw.unwrap_or(body.payload.get());
    if payload.len() > MAX_PAYLOAD_BYTES {
        return Err(ApiError::PayloadTooLarge(format!(
            "payload is {} bytes; the limit is {MAX_PAYLOAD_BYTES}",
            payload.len()
        )));
    }
    if raw.is_none() && nests_deeper_than(payload, MAX_PAYLOAD_DEPTH) {
        return Err(ApiError::field(
            "payload",
            format!("must not nest arrays and objects more than {MAX_PAYLOAD_DEPTH} deep"),
        ));
    }
    let channels = super::endpoints::check_channels("channels", &body.channels)?;
    let tags = check_tags(&body.tags)?;
    let max_age = i64::try_from(state.max_age.as_millis()).unwrap_or(i64::MAX);
    let deliver_at = check_deliver_at(&body.deliver_at, created_at, max_age)?;
    let payload_expires_at = match body.payload_retention_period {
        None => None,
        Some(days @ 5..=90) => Some(created_at.saturating_add(days * 86_400_000)),
        Some(_) => {
            return Err(ApiError::field(
                "payloadRetentionPeriod",
                "must be a number of days from 5 to 90",
            ))
        }
    };
    let creates_app = application.is_some();
    let message = NewMessage {
        id: MsgId::generate(),
        app_id,
        event_type: body.event_type.clone(),
        event_id: body.event_id.clone(),
        payload: payload.to_owned(),
        channels: channels.clone(),
        created_at,
        traceparent: traceparent_for(&headers),
        tags: tags.clone(),
        deliver_at,
        payload_expires_at,
        application,
    };
    // The answer reuses the request's own payload: no copy, no re-parse
    // (a raw payload shows as reads show it: as JSON when it is JSON
    // text, as a JSON string of its text otherwise).
    let shown = match raw {
        Some(raw) => shown_payload(raw.to_owned())?.0,
        None => body.payload,
    };
    let out = MessageOut {
        id: message.id.to_string(),
        event_type: body.event_type,
        event_id: body.event_id,
        payload: shown,
        channels,
        timestamp: rfc3339(created_at),
        payload_expunged: false,
        tags,
        deliver_at: deliver_at.map(rfc3339),
    };
    // Returns only after the transaction holding the message has committed.
    match state.ingest.submit(message).await? {
        InsertOutcome::Inserted { .. } => {
            if creates_app {
                created_inline(&state, &actor, &key, &app_key).await;
            }
            Ok((StatusCode::ACCEPTED, Json(out)).into_response())
        }
        InsertOutcome::DuplicateEventId => Err(ApiError::Conflict(format!(
            "a message with eventId `{}` already exists in this application",
            out.event_id.unwrap_or_default()
        ))),
        InsertOutcome::NoSuchApp => {
            // Deleted since it was cached (here or by another process).
            state.app_ids.forget_where(|id| *id == app_key);
            Err(ApiError::NotFound("application"))
        }
    }
}

/// After a message with an inline application was stored: caches the
/// application's id and, when it is the one this request made (not a
/// concurrent request's with the same uid), audits its creation.
async fn created_inline(state: &ApiState, actor: &Actor, key: &str, made: &AppId) {
    let miss = state.app_ids.miss();
    match state.store.get_app(key).await {
        Ok(Some(app)) => {
            state.app_ids.put(key.to_owned(), app.id.clone(), miss);
            if app.id == *made {
                record_inline_app_created(state, actor, &app.id).await;
            }
        }
        Ok(None) => {}
        Err(e) => tracing::warn!(error = %e, "cannot read back an inline application"),
    }
}

/// Audits the creation of an inline application (a message's or an
/// app-portal-access request's `application`): `app.created`, marked
/// `inline` so that it is told from `POST /app`'s.
pub(super) async fn record_inline_app_created(state: &ApiState, actor: &Actor, app: &AppId) {
    actor
        .record(
            &*state.store,
            "app.created",
            Some(app),
            app.as_str(),
            serde_json::json!({ "inline": true }),
        )
        .await;
}

/// Whether valid JSON text nests arrays and objects more than `max` deep:
/// one pass over the bytes, skipping strings (the text has been parsed
/// already, so brackets outside strings are structure).
pub fn nests_deeper_than(json: &str, max: usize) -> bool {
    // Each level takes two bytes, its opening and its closing.
    if json.len() <= 2 * max {
        return false;
    }
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &b in json.as_bytes() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

#[utoipa::path(
    get,
    path = "/app/{app_id}/msg/{msg_id}",
    tag = "Message",
    responses(
        (status = 200, description = "The message, with its payload", body = MessageOut),
        NotFoundResponse,
    )
)]
pub async fn get_message(PathMessage(message): PathMessage) -> ApiResult<Json<MessageOut>> {
    Ok(Json(message.try_into()?))
}

/// The message the path's `{msg_id}` names (its id or eventId), within the
/// application the path names and the token may reach: what the handlers
/// of one message start from. A 404 when there is none.
pub struct PathMessage(pub Message);

impl axum::extract::FromRequestParts<ApiState> for PathMessage {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &ApiState,
    ) -> ApiResult<Self> {
        let (app, id) = super::auth::ResolvedApp::with_path_param(parts, state, "msg_id").await?;
        Ok(PathMessage(find_message(state, &app.id, &id).await?))
    }
}

/// The message (by id or eventId) of the application; 404 when there is
/// none.
pub async fn find_message(
    state: &ApiState,
    app: &crate::ids::AppId,
    msg_id: &str,
) -> ApiResult<Message> {
    state
        .store
        .get_message(app, msg_id)
        .await?
        .ok_or(ApiError::NotFound("message"))
}

/// A delivery as the API shows it (a Herald extension to Svix's surface).
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryOut {
    /// Also the `Idempotency-Key` every attempt of this delivery carries.
    pub id: String,
    pub msg_id: String,
    pub endpoint_id: String,
    pub event_type: String,
    pub state: &'static str,
    pub attempts: u32,
    pub next_attempt_at: Option<String>,
    pub dead_reason: Option<&'static str>,
    pub last_status_code: Option<u16>,
    pub last_error: Option<String>,
    pub created_at: String,
    pub updated_at: String,
}

impl From<Delivery> for DeliveryOut {
    fn from(d: Delivery) -> Self {
        let live = matches!(
            d.state,
            crate::store::DeliveryState::Pending | crate::store::DeliveryState::Delivering
        );
        DeliveryOut {
            id: d.id.into_string(),
            msg_id: d.msg_id.into_string(),
            endpoint_id: d.endpoint_id.into_string(),
            event_type: d.event_type,
            state: d.state.as_str(),
            attempts: d.attempts,
            next_attempt_at: live.then(|| rfc3339(d.next_attempt_at)),
            dead_reason: d.dead_reason.map(|r| r.as_str()),
            last_status_code: d.last_status,
            last_error: d.last_error,
            created_at: rfc3339(d.created_at),
            updated_at: rfc3339(d.updated_at),
        }
    }
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DeliveryList {
    pub data: Vec<DeliveryOut>,
}

#[utoipa::path(
    get,
    path = "/app/{app_id}/msg/{msg_id}/delivery",
    tag = "Message",
    responses(
        (status = 200, description = "The message's deliveries, one per endpoint", body = DeliveryList),
        NotFoundResponse,
    )
)]
pub async fn list_message_deliveries(
    State(state): State<ApiState>,
    PathMessage(message): PathMessage,
) -> ApiResult<Json<DeliveryList>> {
    let deliveries = state
        .store
        .list_deliveries_of_message(&message.app_id, &message.id)
        .await?;
    Ok(Json(DeliveryList {
        data: deliveries.into_iter().map(DeliveryOut::from).collect(),
    }))
}

/// Svix's resend: one more attempt of this message to this endpoint now,
/// with the delivery's own Idempotency-Key. 409 while the delivery is
/// delivering (an attempt in flight), or when the payload was expunged.
#[utoipa::path(
    post,
    path = "/app/{app_id}/msg/{msg_id}/endpoint/{endpoint_id}/resend",
    tag = "Message",
    responses(
        (status = 202, description = "Queued: one more attempt now", body = super::EmptyOut),
        NotFoundResponse, ConflictResponse,
    )
)]
pub async fn resend(
    State(state): State<ApiState>,
    actor: Actor,
    app: ResolvedApp,
    Path((_app_id, msg_id, endpoint_id)): Path<(String, String, String)>,
) -> ApiResult<Response> {
    resend_to(&state, &actor, &app.id, &msg_id, &endpoint_id).await?;
    Ok(accepted_empty())
}

/// What [`resend_to`] did: the message it resent (by id), and whether the
/// attempt is held, its endpoint being disabled (it is made once the
/// endpoint is enabled).
pub struct Resent {
    pub msg_id: crate::ids::MsgId,
    pub held: bool,
}

/// The resend behind the API's route and the dashboard's (and portal's)
/// resend buttons: finds the message (id or `eventId`) and the endpoint
/// (id or uid) in `app`, queues one manual attempt now, wakes the
/// dispatcher and writes `message.resent` to the audit log.
pub async fn resend_to(
    state: &ApiState,
    actor: &Actor,
    app: &crate::ids::AppId,
    msg_id: &str,
    endpoint_id: &str,
) -> ApiResult<Resent> {
    let message = find_message(state, app, msg_id).await?;
    let endpoint = find_endpoint(state, app, endpoint_id).await?;
    match state
        .store
        .resend(app, &message.id, &endpoint.id, now_millis())
        .await?
    {
        ResendOutcome::Queued => {
            state.wake.notify_one();
            actor
                .record(
                    &*state.store,
                    "message.resent",
                    Some(app),
                    message.id.as_str(),
                    serde_json::json!({ "endpoint": endpoint.id }),
                )
                .await;
            Ok(Resent {
                msg_id: message.id,
                held: endpoint.disabled,
            })
        }
        ResendOutcome::NoSuchMessage => Err(ApiError::NotFound("message")),
        ResendOutcome::Expunged => Err(ApiError::Conflict(
            "the message's payload was expunged: there is nothing to send".into(),
        )),
        ResendOutcome::NoSuchEndpoint => Err(ApiError::NotFound("endpoint")),
        // Sent again now, it would go beside the attempt in flight.
        ResendOutcome::InFlight => Err(ApiError::Conflict(
            "the delivery is in flight: resend it once its attempt is over".into(),
        )),
    }
}

/// Svix's `EventExampleIn`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventExampleIn {
    /// `svix.ping`, or an event type whose schema version `"1"` has an
    /// example.
    #[schema(pattern = "^[A-Za-z0-9._-]{1,256}$")]
    pub event_type: String,
    /// Which of the schema's examples (default: the first).
    pub example_index: Option<u64>,
}

/// What `svix.ping` sends.
const PING_PAYLOAD: &str = r#"{"success": true}"#;

/// `POST /app/{app}/endpoint/{ep}/send-example` (Svix): a real message of
/// `eventType` with its schema's first example (`schemas["1"].examples[0]`;
/// `svix.ping`: `{"success": true}`), delivered to this endpoint alone
/// whatever its filter or channels, signed, retried and logged like any.
#[utoipa::path(
    post,
    path = "/app/{app_id}/endpoint/{endpoint_id}/send-example",
    tag = "Endpoint",
    request_body = EventExampleIn,
    responses(
        (status = 200, description = "Stored (committed); delivery to this endpoint follows", body = MessageOut),
        NotFoundResponse,
    )
)]
pub async fn send_example(
    State(state): State<ApiState>,
    axum::Extension(principal): axum::Extension<super::auth::Principal>,
    PathEndpoint(ep): PathEndpoint,
    ApiJson(body): ApiJson<EventExampleIn>,
) -> ApiResult<Response> {
    send_example_as(&state, principal.feature_flags(), ep, body).await
}

/// [`send_example`] for a caller holding `flags` (None: the admin, who
/// sees every type): a type its flags hide is a 404, as when listed or
/// read, and nothing is sent. The portal sends with its session's.
pub async fn send_example_as(
    state: &ApiState,
    flags: Option<&[String]>,
    ep: crate::store::Endpoint,
    body: EventExampleIn,
) -> ApiResult<Response> {
    if !valid_uid(&body.event_type) {
        return Err(ApiError::field(
            "eventType",
            "must be 1-256 characters of letters, digits, '-', '_' or '.'",
        ));
    }
    let payload = if body.event_type == "svix.ping" {
        PING_PAYLOAD.to_owned()
    } else {
        let et = state
            .store
            .get_event_type(&body.event_type)
            .await?
            .filter(|et| super::event_types::visible_to(et, flags))
            .ok_or(ApiError::NotFound("event type"))?;
        let example = et
            .schemas
            .as_deref()
            .and_then(|s| serde_json::from_str::<serde_json::Value>(s).ok())
            .and_then(|s| {
                let index = usize::try_from(body.example_index.unwrap_or(0)).ok()?;
                s.get("1")?.get("examples")?.get(index).cloned()
            });
        match example {
            Some(e) => e.to_string(),
            None => {
                return Err(ApiError::BadRequest(format!(
                    "event type `{}` has no example {} to send: its schema version \"1\" needs \
                     `examples` with that many",
                    body.event_type,
                    body.example_index.unwrap_or(0)
                )))
            }
        }
    };
    let message = NewMessage {
        id: MsgId::generate(),
        app_id: ep.app_id.clone(),
        event_type: body.event_type,
        event_id: None,
        payload,
        channels: None,
        created_at: now_millis(),
        traceparent: None,
        application: None,
        deliver_at: None,
        payload_expires_at: None,
        tags: None,
    };
    if !state.store.insert_example(&message, &ep.id).await? {
        return Err(ApiError::NotFound("endpoint"));
    }
    state.wake.notify_one();
    let out = MessageOut::try_from(message)?;
    Ok((StatusCode::OK, Json(out)).into_response())
}

/// The trace a message's attempts join: this request's span when Herald
/// traces (itself a child of the caller's `traceparent`), else the
/// caller's `traceparent` as it came, if well formed.
fn traceparent_for(headers: &axum::http::HeaderMap) -> Option<String> {
    crate::telemetry::traceparent_of(&tracing::Span::current()).or_else(|| {
        headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .and_then(crate::telemetry::valid_traceparent)
            .map(str::to_owned)
    })
}

#[cfg(test)]
mod tests {
    use super::nests_deeper_than;

    #[test]
    fn nesting_is_counted_outside_strings_only() {
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(!nests_deeper_than(&deep(128), 128));
        assert!(nests_deeper_than(&deep(129), 128));
        let wide = format!("[{}]", vec!["[{}]"; 1000].join(","));
        assert!(!nests_deeper_than(&wide, 3));
        assert!(nests_deeper_than(&wide, 2));
        let quoted = format!(r#"{{"a":"{}\"{}"}}"#, "[".repeat(300), "{".repeat(300));
        assert!(serde_json::from_str::<serde_json::Value>(&quoted).is_ok());
        assert!(!nests_deeper_than(&quoted, 1));
    }
}

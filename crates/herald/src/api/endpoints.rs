//! Endpoints: the URLs an application's messages are delivered to.

use std::collections::BTreeMap;

use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use herald_signing::Secret;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::auth::{Principal, ResolvedApp};
use super::error::{ConflictResponse, NotFoundResponse, ValidationResponse};
use super::{
    check_line, check_metadata, check_text, check_uid, double_option, rfc3339, valid_uid, ApiError,
    ApiJson, ApiQuery, ApiResult, ApiState, FieldError, ListParams, ListResponse,
};
use crate::audit::Actor;
use crate::ids::{AppId, EndpointId};
use crate::net::WebhookUrl;
use crate::operator::EndpointEvent;
use crate::store::{now_millis, Endpoint, EndpointChanges, EndpointOrdering};

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointIn {
    /// http or https; a public address unless private networks are allowed.
    #[schema(
        format = "uri",
        pattern = "^[Hh][Tt][Tt][Pp][Ss]?://",
        max_length = 65536
    )]
    pub url: String,
    #[schema(max_length = 4096)]
    pub description: Option<String>,
    #[schema(pattern = "^[A-Za-z0-9._-]{1,256}$")]
    pub uid: Option<String>,
    pub version: Option<i64>,
    /// On an update (PUT), absent leaves the endpoint as it is; `false`
    /// enables it (held deliveries resume, those past the age cap die),
    /// `true` disables it (nothing new is routed to it).
    pub disabled: Option<bool>,
    /// Svix's older name; SDK 2.x sends `eventTypes`. Both are accepted.
    /// Existing event types only; absent: every type.
    #[serde(default, alias = "eventTypes")]
    #[schema(min_items = 1)]
    pub filter_types: Option<Vec<String>>,
    /// Also accepted as `throttleRate`.
    #[serde(default, alias = "throttleRate")]
    #[schema(maximum = 65535)]
    pub rate_limit: Option<u16>,
    /// `"fifo"`: one request at a time, in message creation order (a
    /// replayed or resent message goes to the back of the queue); its
    /// throughput is bounded by the receiver's round trip. Default
    /// `"none"`.
    pub ordering: Option<EndpointOrdering>,
    pub metadata: Option<BTreeMap<String, String>>,
    /// 24 to 64 bytes in base64, `whsec_`-prefixed or not (shown with the
    /// prefix); generated when absent.
    #[schema(pattern = "^(whsec_)?[A-Za-z0-9+/]+={0,2}$")]
    pub secret: Option<String>,
    #[schema(max_items = 10)]
    pub channels: Option<Vec<String>>,
    /// Extra request headers (Herald accepts them at creation too): at most
    /// `HERALD_MAX_HEADERS_PER_ENDPOINT` (20), names of at most 256 and
    /// values of at most 4096 characters; hop-by-hop and framing headers
    /// (`Connection`, `TE`, `Transfer-Encoding`, `Host`, …) and Herald's own
    /// are refused.
    pub headers: Option<BTreeMap<String, String>>,
}

/// PATCH: an absent field stays; `null` clears it.
#[derive(Debug, Deserialize, Default, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointPatch {
    #[serde(default)]
    #[schema(
        format = "uri",
        pattern = "^[Hh][Tt][Tt][Pp][Ss]?://",
        max_length = 65536
    )]
    pub url: Option<String>,
    #[schema(max_length = 4096)]
    pub description: Option<String>,
    #[serde(default, deserialize_with = "double_option")]
    #[schema(pattern = "^[A-Za-z0-9._-]{1,256}$")]
    pub uid: Option<Option<String>>,
    /// As `POST …/enable` or `…/disable`; absent leaves it as it is.
    pub disabled: Option<bool>,
    #[serde(default, alias = "eventTypes", deserialize_with = "double_option")]
    #[schema(min_items = 1)]
    pub filter_types: Option<Option<Vec<String>>>,
    #[serde(default, alias = "throttleRate", deserialize_with = "double_option")]
    #[schema(maximum = 65535)]
    pub rate_limit: Option<Option<u16>>,
    /// `"fifo"` or `"none"`; absent leaves it as it is.
    pub ordering: Option<EndpointOrdering>,
    pub metadata: Option<BTreeMap<String, String>>,
    pub version: Option<i64>,
    #[serde(default, deserialize_with = "double_option")]
    #[schema(max_items = 10)]
    pub channels: Option<Option<Vec<String>>>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointOut {
    pub id: String,
    pub url: String,
    pub description: String,
    pub version: i64,
    pub disabled: bool,
    pub uid: Option<String>,
    pub filter_types: Option<Vec<String>>,
    pub event_types: Option<Vec<String>>,
    pub channels: Option<Vec<String>>,
    pub rate_limit: Option<u16>,
    pub throttle_rate: Option<u16>,
    pub ordering: EndpointOrdering,
    pub metadata: BTreeMap<String, String>,
    pub created_at: String,
    pub updated_at: String,
    /// Herald's own, present only when true: the endpoint's stored secret
    /// or headers do not open with the configured `HERALD_ENCRYPTION_KEY`,
    /// and nothing is sent to it until they do.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub unreadable: bool,
}

impl EndpointOut {
    /// As `principal` may see it: credentials in the URL (userinfo) are
    /// masked unless it may read the endpoint's secret (a portal token
    /// without `ViewEndpointSecret` or more may not).
    pub fn shown_to(ep: Endpoint, principal: &super::auth::Principal) -> Self {
        if may_read_secrets(principal) {
            EndpointOut::from(ep)
        } else {
            EndpointOut::masked(ep)
        }
    }

    /// With the URL's credentials (userinfo) masked.
    pub fn masked(ep: Endpoint) -> Self {
        let mut out = EndpointOut::from(ep);
        out.url = crate::net::masked_url(&out.url);
        out
    }
}

/// Whether `principal` may read an endpoint's secret, and so the
/// credentials in its URL: the admin token, an application token, a portal
/// token with `ViewEndpointSecret` (or a capability that implies it).
pub fn may_read_secrets(principal: &super::auth::Principal) -> bool {
    match principal {
        super::auth::Principal::Admin => true,
        super::auth::Principal::App { capabilities, .. } => {
            capabilities.as_ref().is_none_or(|c| c.view_secret())
        }
    }
}

impl From<Endpoint> for EndpointOut {
    fn from(e: Endpoint) -> Self {
        EndpointOut {
            id: e.id.into_string(),
            url: e.url,
            description: e.description,
            version: 1,
            disabled: e.disabled,
            uid: e.uid,
            event_types: e.filter_types.clone(),
            filter_types: e.filter_types,
            channels: e.channels,
            rate_limit: e.rate_limit,
            throttle_rate: e.rate_limit,
            ordering: e.ordering,
            metadata: e.metadata,
            created_at: rfc3339(e.created_at),
            updated_at: rfc3339(e.updated_at),
            unreadable: e.unreadable,
        }
    }
}

/// The longest endpoint URL (Svix's bound).
pub const MAX_URL_CHARS: usize = 65536;

async fn check_url(state: &ApiState, url: &str) -> ApiResult<String> {
    check_line(&["body", "url"], url, MAX_URL_CHARS)?;
    let parsed =
        WebhookUrl::parse(url, state.net).map_err(|e| ApiError::field("url", e.to_string()))?;
    state
        .net
        .check_resolved(&parsed)
        .await
        .map_err(|e| ApiError::field("url", e.to_string()))?;
    Ok(parsed.as_str().to_owned())
}

/// A valid filter naming existing event types (sorted, deduplicated).
/// `flags`: the caller's feature flags (None: the admin's, all); a type
/// they hide is as unknown as a type that does not exist, unless it is
/// `already` in the endpoint's filter.
async fn check_filter(
    state: &ApiState,
    types: &Option<Vec<String>>,
    flags: Option<&[String]>,
    already: &[String],
) -> ApiResult<Option<Vec<String>>> {
    match types {
        None => Ok(None),
        Some(list) if list.is_empty() => Err(ApiError::field(
            "filterTypes",
            "must name at least one event type, or be omitted to receive every type",
        )),
        Some(list) => {
            if let Some(bad) = list.iter().find(|t| !valid_uid(t)) {
                return Err(ApiError::field(
                    "filterTypes",
                    format!("`{bad}` is not a valid event type name"),
                ));
            }
            let mut list = list.clone();
            list.sort();
            list.dedup();
            let list = Some(list);
            super::event_types::check_known_types(state, &list, flags, already).await?;
            Ok(list)
        }
    }
}

/// At most 10 channels of 1-128 safe characters, kept sorted and unique.
pub fn check_channels(
    field: &str,
    channels: &Option<Vec<String>>,
) -> ApiResult<Option<Vec<String>>> {
    let Some(list) = channels else {
        return Ok(None);
    };
    if list.is_empty() {
        return Ok(None);
    }
    if list.len() > 10 {
        return Err(ApiError::field(field, "at most 10 channels"));
    }
    if let Some(bad) = list.iter().find(|c| c.len() > 128 || !valid_uid(c)) {
        return Err(ApiError::field(
            field,
            format!("`{bad}` must be 1-128 characters of letters, digits, '-', '_' or '.'"),
        ));
    }
    let mut list = list.clone();
    list.sort();
    list.dedup();
    Ok(Some(list))
}

/// Headers no endpoint may set. Herald's own (the signature and what it
/// signs) cannot be overridden; and the hop-by-hop and framing ones steer
/// the connection or how the body is read rather than reach the receiver
/// (a `Transfer-Encoding`, `TE` or `Upgrade` of the customer's choosing
/// could desynchronise a proxy on the way, `Expect` stall the request,
/// `Host` or `Forwarded` mislead whatever routes on them). Credentials
/// (`Authorization`, API keys, cookies) stay allowed: receivers rely on them.
const FORBIDDEN_HEADERS: &[&str] = &[
    // Herald's own.
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "idempotency-key",
    "x-event-id",
    "x-attempt",
    "x-event-type",
    "user-agent",
    // The body's framing and form.
    "content-length",
    "content-encoding",
    // Herald reads the answer as sent and keeps an excerpt of it: asked
    // for compression, the excerpt was the compressed bytes, unreadable.
    "accept-encoding",
    "transfer-encoding",
    "trailer",
    "te",
    "expect",
    // The connection and the hop.
    "host",
    "connection",
    "keep-alive",
    "upgrade",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
];

/// The longest custom header name and value.
pub const MAX_HEADER_NAME_CHARS: usize = 256;
pub const MAX_HEADER_VALUE_CHARS: usize = 4096;

/// Valid header names and values, at most `max`, none forbidden; a 422
/// names the header (`loc` `["body", "headers", name]`).
pub fn check_headers(headers: &BTreeMap<String, String>, max: usize) -> ApiResult<()> {
    if headers.len() > max {
        return Err(ApiError::field(
            "headers",
            format!("at most {max} headers (HERALD_MAX_HEADERS_PER_ENDPOINT)"),
        ));
    }
    let mut seen = std::collections::HashSet::with_capacity(headers.len());
    for (name, value) in headers {
        // A name too long to be one is not echoed whole.
        let shown: String = name.chars().take(64).collect();
        let refuse = |msg: String| {
            Err(ApiError::Validation(vec![FieldError::at(
                &["body", "headers", &shown],
                msg,
            )]))
        };
        if name.len() > MAX_HEADER_NAME_CHARS {
            return refuse(format!(
                "`{shown}…`: header names must be at most {MAX_HEADER_NAME_CHARS} characters"
            ));
        }
        if value.len() > MAX_HEADER_VALUE_CHARS {
            return refuse(format!(
                "`{name}`: header values must be at most {MAX_HEADER_VALUE_CHARS} characters"
            ));
        }
        let lower = name.to_ascii_lowercase();
        if !seen.insert(lower.clone()) {
            return refuse(format!(
                "`{name}` is given twice: header names are the same whatever their case"
            ));
        }
        if lower.starts_with("svix-") || FORBIDDEN_HEADERS.contains(&lower.as_str()) {
            return refuse(format!(
                "`{name}` is set by Herald or by HTTP itself and cannot be given"
            ));
        }
        if http::HeaderName::from_bytes(name.as_bytes()).is_err()
            || http::HeaderValue::from_str(value).is_err()
        {
            return refuse(format!("`{name}` is not a valid header name and value"));
        }
    }
    Ok(())
}

fn check_description(d: &Option<String>) -> ApiResult<()> {
    match d {
        Some(d) => check_text(&["body", "description"], d, 4096),
        None => Ok(()),
    }
}

#[utoipa::path(
    post,
    path = "/app/{app_id}/endpoint",
    tag = "Endpoint",
    request_body = EndpointIn,
    responses(
        (status = 201, description = "Created", body = EndpointOut),
        NotFoundResponse, ConflictResponse,
    )
)]
pub async fn create_endpoint(
    State(state): State<ApiState>,
    actor: Actor,
    Extension(principal): Extension<Principal>,
    app: ResolvedApp,
    ApiJson(body): ApiJson<EndpointIn>,
) -> ApiResult<Response> {
    insert_endpoint(&state, &actor, principal.feature_flags(), app.id, body).await
}

/// Validates `body` and stores it as a new endpoint of `app` (201).
/// [`create_endpoint`] for a caller holding `flags` (see [`check_filter`]);
/// the portal creates with its session's.
pub async fn insert_endpoint(
    state: &ApiState,
    actor: &Actor,
    flags: Option<&[String]>,
    app_id: AppId,
    body: EndpointIn,
) -> ApiResult<Response> {
    let state = state.clone();
    let url = check_url(&state, &body.url).await?;
    check_uid("uid", &body.uid)?;
    super::check_endpoint_uid_not_an_id(&body.uid, None)?;
    check_metadata(&body.metadata)?;
    check_description(&body.description)?;
    let filter_types = check_filter(&state, &body.filter_types, flags, &[]).await?;
    let channels = check_channels("channels", &body.channels)?;
    let headers = body.headers.clone().unwrap_or_default();
    check_headers(&headers, state.max_headers_per_endpoint)?;
    let secret = match &body.secret {
        Some(s) => Secret::parse_given(s).map_err(|e| ApiError::field("secret", e.to_string()))?,
        None => Secret::generate(),
    };
    let count = state.store.count_endpoints(&app_id).await?;
    if count >= state.max_endpoints_per_app as u64 {
        return Err(ApiError::Validation(vec![FieldError::body(
            "",
            format!(
                "the application already has {count} endpoints, the most one may have \
                 (HERALD_MAX_ENDPOINTS_PER_APP = {})",
                state.max_endpoints_per_app
            ),
        )]));
    }
    if let Some(uid) = &body.uid {
        check_uid_free(&state, &app_id, uid, None).await?;
    }
    let now = now_millis();
    let ep = Endpoint {
        id: EndpointId::generate(),
        app_id,
        uid: body.uid,
        url,
        description: body.description.unwrap_or_default(),
        filter_types,
        disabled: body.disabled.unwrap_or(false),
        rate_limit: body.rate_limit,
        ordering: body.ordering.unwrap_or_default(),
        metadata: body.metadata.unwrap_or_default(),
        channels,
        headers,
        secret: secret.expose(),
        created_at: now,
        updated_at: now,
        unreadable: false,
    };
    state.store.create_endpoint(&ep).await?;
    state
        .operator
        .endpoint_changed(EndpointEvent::Created, &ep)
        .await;
    actor
        .record(
            &*state.store,
            "endpoint.created",
            Some(&ep.app_id),
            ep.id.as_str(),
            serde_json::json!({ "secretGiven": body.secret.is_some() }),
        )
        .await;
    let kept = EndpointOut::masked(ep.clone());
    let answer = (StatusCode::CREATED, Json(EndpointOut::from(ep)));
    Ok(super::idempotency::kept_as(answer, &kept))
}

/// The endpoint the path's `{endpoint_id}` names (its id or uid), within
/// the application the path names and the token may reach
/// ([`ResolvedApp`]): what every handler of one endpoint starts from. A 404
/// when there is none. The path parameters it reads are described in the
/// OpenAPI document by `openapi::PATH_PARAMS`.
pub struct PathEndpoint(pub Endpoint);

impl FromRequestParts<ApiState> for PathEndpoint {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> ApiResult<Self> {
        let (app, id) = ResolvedApp::with_path_param(parts, state, "endpoint_id").await?;
        Ok(PathEndpoint(find_endpoint(state, &app.id, &id).await?))
    }
}

/// Looks an endpoint up by id or uid within an app; 404 when there is none.
pub async fn find_endpoint(state: &ApiState, app: &AppId, id_or_uid: &str) -> ApiResult<Endpoint> {
    state
        .store
        .get_endpoint(app, id_or_uid)
        .await?
        .ok_or(ApiError::NotFound("endpoint"))
}

#[utoipa::path(
    get,
    path = "/app/{app_id}/endpoint/{endpoint_id}",
    tag = "Endpoint",
    responses(
        (status = 200, description = "The endpoint", body = EndpointOut),
        NotFoundResponse,
    )
)]
pub async fn get_endpoint(
    axum::Extension(principal): axum::Extension<super::auth::Principal>,
    PathEndpoint(ep): PathEndpoint,
) -> ApiResult<Json<EndpointOut>> {
    Ok(Json(EndpointOut::shown_to(ep, &principal)))
}

#[utoipa::path(
    get,
    path = "/app/{app_id}/endpoint",
    tag = "Endpoint",
    params(ListParams),
    responses(
        (status = 200, description = "A page of endpoints, newest first", body = ListResponse<EndpointOut>),
        NotFoundResponse, ValidationResponse,
    )
)]
pub async fn list_endpoints(
    State(state): State<ApiState>,
    axum::Extension(principal): axum::Extension<super::auth::Principal>,
    app: ResolvedApp,
    ApiQuery(params): ApiQuery<ListParams>,
) -> ApiResult<Json<ListResponse<EndpointOut>>> {
    // Newest first unless asked otherwise, as Svix lists endpoints (its
    // applications, oldest first).
    let page = state
        .store
        .list_endpoints(&app.id, &params.page(false)?)
        .await?;
    let data = page
        .items
        .into_iter()
        .map(|ep| EndpointOut::shown_to(ep, &principal))
        .collect();
    Ok(Json(ListResponse::new(
        data,
        page.has_more,
        |e: &EndpointOut| e.id.clone(),
    )))
}

/// Writes `changes` (only those: see [`EndpointChanges`]) and, when the
/// caller asked for it, the disabled flag through the operator's rules
/// (held deliveries, the age cap, events), never as a column write.
async fn save(
    state: &ApiState,
    actor: &Actor,
    ep: &Endpoint,
    changes: EndpointChanges,
    disabled: Option<bool>,
) -> ApiResult<Json<EndpointOut>> {
    if let Some(Some(uid)) = &changes.uid {
        // Keeping its own uid needs no read.
        if ep.uid.as_ref() != Some(uid) {
            check_uid_free(state, &ep.app_id, uid, Some(&ep.id)).await?;
        }
    }
    if !state
        .store
        .update_endpoint(&ep.app_id, &ep.id, &changes, now_millis())
        .await?
    {
        return Err(ApiError::NotFound("endpoint"));
    }
    // Asked for, not compared with what was read at the start: the flag
    // may have changed since (a disable, an auto-disable), and the
    // operator leaves an endpoint already in the asked state as it is.
    match disabled {
        Some(true) => {
            state
                .operator
                .disable(&ep.app_id, &ep.id, "disabled through the API", false, None)
                .await?;
        }
        Some(false) => {
            state.operator.enable(&ep.app_id, &ep.id).await?;
        }
        None => {}
    }
    let mut fields = changed_fields(&changes);
    if disabled.is_some() {
        fields.push("disabled");
    }
    actor
        .record(
            &*state.store,
            "endpoint.updated",
            Some(&ep.app_id),
            ep.id.as_str(),
            serde_json::json!({ "fields": fields }),
        )
        .await;
    let saved = find_endpoint(state, &ep.app_id, ep.id.as_str()).await?;
    state
        .operator
        .endpoint_changed(EndpointEvent::Updated, &saved)
        .await;
    Ok(Json(saved.into()))
}

/// 409 if an endpoint of `app` other than `own` (the one being saved, if
/// any) has `uid`.
async fn check_uid_free(
    state: &ApiState,
    app: &AppId,
    uid: &str,
    own: Option<&EndpointId>,
) -> ApiResult<()> {
    match state.store.get_endpoint(app, uid).await? {
        Some(other) if Some(&other.id) != own => Err(ApiError::Conflict(format!(
            "an endpoint with uid `{uid}` already exists"
        ))),
        _ => Ok(()),
    }
}

/// The names of the fields `changes` writes (for the audit log: names,
/// never values).
fn changed_fields(changes: &EndpointChanges) -> Vec<&'static str> {
    super::named_fields([
        ("uid", changes.uid.is_some()),
        ("url", changes.url.is_some()),
        ("description", changes.description.is_some()),
        ("filterTypes", changes.filter_types.is_some()),
        ("rateLimit", changes.rate_limit.is_some()),
        ("ordering", changes.ordering.is_some()),
        ("metadata", changes.metadata.is_some()),
        ("channels", changes.channels.is_some()),
    ])
}

/// PUT: replaces every field (absent optional fields take their
/// defaults), except `disabled`, which changes only when given.
#[utoipa::path(
    put,
    path = "/app/{app_id}/endpoint/{endpoint_id}",
    tag = "Endpoint",
    request_body = EndpointIn,
    responses(
        (status = 200, description = "Replaced", body = EndpointOut),
        (status = 201, description = "Created under the uid of the path", body = EndpointOut),
        NotFoundResponse, ConflictResponse,
    )
)]
pub async fn update_endpoint(
    State(state): State<ApiState>,
    actor: Actor,
    Extension(principal): Extension<Principal>,
    app: ResolvedApp,
    Path((_app_id, endpoint_id)): Path<(String, String)>,
    ApiJson(mut body): ApiJson<EndpointIn>,
) -> ApiResult<Response> {
    let Some(ep) = state.store.get_endpoint(&app.id, &endpoint_id).await? else {
        // Svix's upsert: a missing endpoint named by a uid is created
        // under it (an endpoint id cannot be chosen by the caller).
        if EndpointId::parse(&endpoint_id).is_some() {
            return Err(ApiError::NotFound("endpoint"));
        }
        check_uid("uid", &Some(endpoint_id.clone()))?;
        body.uid = body.uid.or(Some(endpoint_id));
        return insert_endpoint(&state, &actor, principal.feature_flags(), app.id, body).await;
    };
    let url = check_url(&state, &body.url).await?;
    body.uid = super::put_uid(body.uid, &endpoint_id, ep.uid.as_deref());
    check_uid("uid", &body.uid)?;
    super::check_endpoint_uid_not_an_id(&body.uid, ep.uid.as_deref())?;
    check_metadata(&body.metadata)?;
    check_description(&body.description)?;
    let already = ep.filter_types.as_deref().unwrap_or_default();
    let changes = EndpointChanges {
        uid: Some(body.uid),
        url: Some(url),
        description: Some(body.description.unwrap_or_default()),
        filter_types: Some(
            check_filter(
                &state,
                &body.filter_types,
                principal.feature_flags(),
                already,
            )
            .await?,
        ),
        rate_limit: Some(body.rate_limit),
        ordering: Some(body.ordering.unwrap_or_default()),
        metadata: Some(body.metadata.unwrap_or_default()),
        channels: Some(check_channels("channels", &body.channels)?),
    };
    save(&state, &actor, &ep, changes, body.disabled)
        .await
        .map(IntoResponse::into_response)
}

#[utoipa::path(
    patch,
    path = "/app/{app_id}/endpoint/{endpoint_id}",
    tag = "Endpoint",
    request_body = EndpointPatch,
    responses(
        (status = 200, description = "Changed", body = EndpointOut),
        NotFoundResponse, ConflictResponse,
    )
)]
pub async fn patch_endpoint(
    State(state): State<ApiState>,
    actor: Actor,
    Extension(principal): Extension<Principal>,
    PathEndpoint(ep): PathEndpoint,
    ApiJson(body): ApiJson<EndpointPatch>,
) -> ApiResult<Json<EndpointOut>> {
    patch_endpoint_as(&state, &actor, principal.feature_flags(), ep, body).await
}

/// [`patch_endpoint`] for a caller holding `flags` (see [`check_filter`]);
/// the portal saves with its session's.
pub async fn patch_endpoint_as(
    state: &ApiState,
    actor: &Actor,
    flags: Option<&[String]>,
    ep: Endpoint,
    body: EndpointPatch,
) -> ApiResult<Json<EndpointOut>> {
    let state = state.clone();
    let mut changes = EndpointChanges::default();
    if let Some(url) = &body.url {
        changes.url = Some(check_url(&state, url).await?);
    }
    if let Some(d) = body.description {
        check_description(&Some(d.clone()))?;
        changes.description = Some(d);
    }
    if let Some(uid) = body.uid {
        check_uid("uid", &uid)?;
        super::check_endpoint_uid_not_an_id(&uid, ep.uid.as_deref())?;
        changes.uid = Some(uid);
    }
    if let Some(types) = body.filter_types {
        let already = ep.filter_types.as_deref().unwrap_or_default();
        changes.filter_types = Some(check_filter(&state, &types, flags, already).await?);
    }
    if let Some(rate) = body.rate_limit {
        changes.rate_limit = Some(rate);
    }
    changes.ordering = body.ordering;
    if let Some(m) = body.metadata {
        check_metadata(&Some(m.clone()))?;
        changes.metadata = Some(m);
    }
    if let Some(channels) = body.channels {
        changes.channels = Some(check_channels("channels", &channels)?);
    }
    save(&state, actor, &ep, changes, body.disabled).await
}

#[utoipa::path(
    delete,
    path = "/app/{app_id}/endpoint/{endpoint_id}",
    tag = "Endpoint",
    responses(
        (status = 204, description = "Deleted, with its deliveries and attempts"),
        NotFoundResponse,
    )
)]
pub async fn delete_endpoint(
    State(state): State<ApiState>,
    actor: Actor,
    PathEndpoint(ep): PathEndpoint,
) -> ApiResult<StatusCode> {
    if !state.store.delete_endpoint(&ep.app_id, &ep.id).await? {
        return Err(ApiError::NotFound("endpoint"));
    }
    state
        .operator
        .endpoint_changed(EndpointEvent::Deleted, &ep)
        .await;
    actor
        .record(
            &*state.store,
            "endpoint.deleted",
            Some(&ep.app_id),
            ep.id.as_str(),
            Value::Null,
        )
        .await;
    Ok(StatusCode::NO_CONTENT)
}

/// The longest disable reason kept (API and dashboard).
pub const MAX_DISABLE_REASON_BYTES: usize = 1000;

#[derive(Debug, Deserialize, Default, utoipa::ToSchema)]
pub struct DisableIn {
    #[schema(max_length = 1000)]
    pub reason: Option<String>,
}

/// `POST …/endpoint/{id}/disable` (Herald's own), optional `{"reason"}`.
#[utoipa::path(
    post,
    path = "/app/{app_id}/endpoint/{endpoint_id}/disable",
    tag = "Endpoint",
    request_body(content = ref("#/components/schemas/DisableIn"), description = "Optional; an empty body is fine"),
    responses(
        (status = 200, description = "Disabled: new deliveries are held", body = EndpointOut),
        NotFoundResponse,
    )
)]
pub async fn disable_endpoint_route(
    State(state): State<ApiState>,
    actor: Actor,
    PathEndpoint(ep): PathEndpoint,
    super::ApiJsonOrEmpty(body): super::ApiJsonOrEmpty<DisableIn>,
) -> ApiResult<Response> {
    let reason = body.reason.as_deref().unwrap_or("disabled by an operator");
    disable_audited(&state, &actor, &ep, reason).await?;
    let ep = find_endpoint(&state, &ep.app_id, ep.id.as_str()).await?;
    let kept = EndpointOut::masked(ep.clone());
    Ok(super::idempotency::kept_as(
        Json(EndpointOut::from(ep)),
        &kept,
    ))
}

/// Disables `ep` as a person asked (not the automatic rule), for `reason`
/// (checked here), and audits it: whether it was enabled. The API and the
/// dashboard both disable through here.
pub async fn disable_audited(
    state: &ApiState,
    actor: &Actor,
    ep: &Endpoint,
    reason: &str,
) -> ApiResult<bool> {
    if reason.len() > MAX_DISABLE_REASON_BYTES {
        return Err(ApiError::field(
            "reason",
            format!("must be at most {MAX_DISABLE_REASON_BYTES} bytes"),
        ));
    }
    check_text(&["body", "reason"], reason, MAX_DISABLE_REASON_BYTES)?;
    let changed = state
        .operator
        .disable(&ep.app_id, &ep.id, reason, false, None)
        .await?;
    let details = serde_json::json!({ "changed": changed });
    actor
        .record(
            &*state.store,
            "endpoint.disabled",
            Some(&ep.app_id),
            ep.id.as_str(),
            details,
        )
        .await;
    Ok(changed)
}

/// Enables `ep` through the operator's rules and audits it: what that did.
/// The API and the dashboard both enable through here.
pub async fn enable_audited(
    state: &ApiState,
    actor: &Actor,
    ep: &Endpoint,
) -> ApiResult<crate::store::EnableReport> {
    let report = state
        .operator
        .enable(&ep.app_id, &ep.id)
        .await?
        .ok_or(ApiError::NotFound("endpoint"))?;
    let details = serde_json::json!({ "changed": report.was_disabled, "expired": report.expired });
    actor
        .record(
            &*state.store,
            "endpoint.enabled",
            Some(&ep.app_id),
            ep.id.as_str(),
            details,
        )
        .await;
    Ok(report)
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnableOut {
    pub endpoint: EndpointOut,
    /// Held deliveries past the age cap, now dead as "too old".
    pub expired_deliveries: u64,
}

/// `POST …/endpoint/{id}/enable` (Herald's own).
#[utoipa::path(
    post,
    path = "/app/{app_id}/endpoint/{endpoint_id}/enable",
    tag = "Endpoint",
    responses(
        (status = 200, description = "Enabled: held deliveries resume", body = EnableOut),
        NotFoundResponse,
    )
)]
pub async fn enable_endpoint_route(
    State(state): State<ApiState>,
    actor: Actor,
    PathEndpoint(ep): PathEndpoint,
) -> ApiResult<Response> {
    let report = enable_audited(&state, &actor, &ep).await?;
    let ep = find_endpoint(&state, &ep.app_id, ep.id.as_str()).await?;
    let kept = EnableOut {
        endpoint: EndpointOut::masked(ep.clone()),
        expired_deliveries: report.expired,
    };
    let answer = Json(EnableOut {
        endpoint: EndpointOut::from(ep),
        expired_deliveries: report.expired,
    });
    Ok(super::idempotency::kept_as(answer, &kept))
}

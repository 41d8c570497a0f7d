//! The HTTP API, shaped like Svix API v1 so that the official Svix SDKs can
//! drive it: `/api/v1/...`, camelCase JSON, prefixed ids, list envelopes
//! `{data, iterator, prevIterator, done}` and errors `{code, detail}`.

use std::sync::Arc;

use axum::extract::{FromRequest, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::Notify;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::ingest::Ingest;
use crate::net::NetworkPolicy;
use crate::store::{Millis, PageReq, Store};

pub mod apps;
pub mod attempts;
pub mod audit;
pub mod auth;
pub mod dead;
pub mod endpoint_health;
pub mod endpoint_secrets;
pub mod endpoints;
pub mod error;
pub mod event_types;
pub mod history;
pub mod idempotency;
pub mod lookups;
pub mod messages;
pub mod openapi;
pub mod portal_access;

pub use error::{ApiError, ApiResult, FieldError};

/// The largest payload accepted (413 above it).
pub const MAX_PAYLOAD_BYTES: usize = 1024 * 1024;
/// The deepest nesting of arrays and objects a payload may have (422
/// deeper): serde_json's own limit, so any receiver parsing with its
/// defaults can read what Herald accepts, and no page or tool of Herald's
/// meets a payload nested thousands deep. (serde_json counts down from 128
/// and refuses the level that reaches 0: 127 levels is the most it reads.)
pub const MAX_PAYLOAD_DEPTH: usize = 127;
/// Request bodies may carry a little more than the payload (other fields).
pub const MAX_BODY_BYTES: usize = MAX_PAYLOAD_BYTES + 64 * 1024;

/// What every handler shares. Cloned for each request (and by each
/// middleware layer), hence one `Arc` rather than a struct of them.
#[derive(Clone)]
pub struct ApiState(Arc<ApiShared>);

impl ApiState {
    pub fn new(shared: ApiShared) -> Self {
        ApiState(Arc::new(shared))
    }
}

impl std::ops::Deref for ApiState {
    type Target = ApiShared;

    fn deref(&self) -> &ApiShared {
        &self.0
    }
}

pub struct ApiShared {
    pub store: Arc<dyn Store>,
    pub ingest: Ingest,
    /// Signalled when a replay or resend makes work due now.
    pub wake: Arc<Notify>,
    pub net: NetworkPolicy,
    /// SHA-256 of the admin token: the token itself is never kept.
    pub admin_token_sha256: [u8; 32],
    /// id-or-uid → app id, for the hot create-message path.
    pub app_ids: Arc<AppIdCache>,
    /// Application tokens by digest.
    pub tokens: Arc<auth::TokenCache>,
    /// Enables and disables endpoints, and reports it.
    pub operator: crate::operator::Operator,
    /// `HERALD_PUBLIC_URL` (or the listen address): where portal links
    /// point.
    pub public_url: String,
    /// The portal's embedding and theme settings.
    pub portal: crate::config::PortalConfig,
    /// Scheduled backups of the SQLite store, for the dashboard's line.
    pub backups: Arc<crate::backups::Backups>,
    /// Failed dashboard log-ins per client address (per server, in memory).
    pub login_limiter: Arc<crate::limits::LoginLimiter>,
    /// Failed portal link exchanges per client address: a limit of its own,
    /// so that unauthenticated clients trying codes never hold the
    /// operator out of the dashboard.
    pub portal_login_limiter: Arc<crate::limits::LoginLimiter>,
    /// Renders `/metrics` (with this instance's queue gauges).
    pub metrics: Arc<crate::metrics::Exporter>,
    /// Failed bearer-token checks per client address (`auth::require_token`).
    pub auth_failures: crate::limits::LoginLimiter,
    /// `HERALD_MAX_HEADERS_PER_ENDPOINT`.
    pub max_headers_per_endpoint: usize,
    /// `HERALD_MAX_ENDPOINTS_PER_APP`.
    pub max_endpoints_per_app: usize,
    /// `HERALD_ENCRYPTION_KEY`: what idempotent requests' digests are
    /// keyed with.
    pub keys: Arc<crate::crypto::Keyring>,
    /// `HERALD_API_RATE_LIMIT`, per caller.
    pub rate_limit: Arc<crate::limits::RateLimit>,
    /// `HERALD_MAX_AGE`: how far ahead a message's `deliverAt` may be.
    pub max_age: std::time::Duration,
    /// `HERALD_BREAKER_*`: the window the health API's circuit figures
    /// are estimated over.
    pub breaker: herald_policy::breaker::BreakerRule,
}

/// Which application an id or uid names, so that creating a message does
/// not cost a database read. An entry goes stale when its app is deleted
/// or its uid changes: the process that did it forgets it then and tells
/// the others sharing the store (`auth::app_names_changed`, through the
/// same announcement as token changes), which clear theirs; otherwise it
/// ends with the entry's life (a uid given to another application
/// meanwhile would send its messages to the first). The store refuses a
/// message for an app that no longer exists, after which it is forgotten
/// too.
pub type AppIdCache = lookups::Lookups<String, crate::ids::AppId>;

/// A PUT's uid: the body's, or, when the body names none and the path
/// named the object by its uid, that one. PUT is idempotent: repeated by
/// uid (an SDK's retry), it replaces the object, where taking its name
/// away would make the next repeat create a second one.
pub fn put_uid(body: Option<String>, path: &str, current: Option<&str>) -> Option<String> {
    body.or_else(|| (current == Some(path)).then(|| path.to_owned()))
}

pub fn token_sha256(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// The API's routes under `/api/v1`, each registered from its handler's
/// `#[utoipa::path]` (method and path, written there once), together with
/// the description they make (`openapi::document`).
pub fn v1_routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new()
        .routes(routes!(apps::list_apps, apps::create_app))
        .routes(routes!(
            apps::get_app,
            apps::put_app,
            apps::patch_app,
            apps::delete_app
        ))
        .routes(routes!(
            endpoints::list_endpoints,
            endpoints::create_endpoint
        ))
        .routes(routes!(
            endpoints::get_endpoint,
            endpoints::update_endpoint,
            endpoints::patch_endpoint,
            endpoints::delete_endpoint
        ))
        .routes(routes!(endpoint_secrets::get_endpoint_secret))
        .routes(routes!(endpoint_secrets::rotate_endpoint_secret))
        .routes(routes!(
            endpoint_secrets::get_endpoint_headers,
            endpoint_secrets::put_endpoint_headers,
            endpoint_secrets::patch_endpoint_headers
        ))
        .routes(routes!(endpoint_health::get_endpoint_health))
        .routes(routes!(endpoints::enable_endpoint_route))
        .routes(routes!(endpoints::disable_endpoint_route))
        .routes(routes!(history::list_attempted_messages))
        .routes(routes!(history::endpoint_stats))
        .routes(routes!(history::recover))
        .routes(routes!(history::replay_missing))
        .routes(routes!(messages::send_example))
        .routes(routes!(history::expunge_message_content))
        .routes(routes!(history::expunge_attempt_content))
        .routes(routes!(
            event_types::list_event_types,
            event_types::create_event_type
        ))
        .routes(routes!(
            event_types::get_event_type,
            event_types::put_event_type,
            event_types::patch_event_type,
            event_types::delete_event_type
        ))
        .routes(routes!(history::list_messages, messages::create_message))
        .routes(routes!(messages::get_message))
        .routes(routes!(messages::list_message_deliveries))
        .routes(routes!(history::list_attempted_destinations))
        .routes(routes!(messages::resend))
        .routes(routes!(history::get_attempt))
        .routes(routes!(attempts::list_attempts_by_msg))
        .routes(routes!(attempts::list_attempts_by_endpoint))
        .routes(routes!(dead::list_dead))
        .routes(routes!(dead::replay_dead))
        .routes(routes!(dead::replay_endpoint_dead))
        .routes(routes!(dead::list_all_dead))
        .routes(routes!(dead::replay_all_dead))
        .routes(routes!(auth::list_tokens, apps::create_app_token))
        .routes(routes!(auth::delete_token))
        .routes(routes!(portal_access::app_portal_access))
        .routes(routes!(portal_access::dashboard_access))
        .routes(routes!(portal_access::expire_all))
        .routes(routes!(portal_access::logout))
        .routes(routes!(audit::list_audit_log))
}

/// The API's routes (under `/api/v1`, with its middleware) and the
/// unauthenticated ones beside it (health, readiness, metrics, the OpenAPI
/// description). The application's router, with the dashboard and the
/// portal beside these, is assembled in `server` (they sit above the API).
pub fn router(state: ApiState) -> Router<ApiState> {
    let (api, _) = v1_routes().split_for_parts();
    let api = api
        .fallback(|| async { ApiError::NotFound("route") })
        // The SDKs read every error's body as JSON (axum's own 405 has none).
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(middleware::from_fn_with_state(
            state.clone(),
            idempotency::idempotency,
        ))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            auth::require_token,
        ))
        .layer(middleware::from_fn(path_params_are_text));
    Router::new()
        .route("/healthz", get(healthz))
        // Outside the token, so that tools can fetch the description before
        // they have one; a static route beside the `/api/v1` nest wins over it.
        .route("/api/v1/openapi.json", get(openapi::openapi_json))
        // Outside the token: a Prometheus scrape carries no bearer token.
        // It reveals endpoint ids and queue sizes, so firewall it (docs/operations.md).
        .route("/metrics", get(metrics))
        .route("/readyz", get(readyz))
        // Svix's health routes, outside the token as Svix has them.
        // (HEAD too: axum answers it wherever GET is routed.)
        .route("/api/v1/health", get(svix_health))
        .route("/api/v1/health/ping", get(health_ping))
        .nest("/api/v1", api)
}

/// The body of `/healthz` and `/readyz`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct StatusOut {
    /// `ok` (healthz), `ready` (readyz) or `unavailable`.
    pub status: &'static str,
}

fn status(code: StatusCode, status: &'static str) -> Response {
    (code, axum::Json(StatusOut { status })).into_response()
}

/// Liveness: 200 when the store answers (no token).
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "Health",
    security(()),
    responses(
        (status = 200, description = "The store answers", body = StatusOut),
        (status = 503, description = "The store does not answer", body = StatusOut),
    )
)]
pub async fn healthz(State(state): State<ApiState>) -> Response {
    match state.store.ping().await {
        Ok(()) => status(StatusCode::OK, "ok"),
        Err(_) => status(StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
    }
}

/// Ready to take traffic: the store answers. Migrations need no check of
/// their own: they are applied when the store is opened, and a process
/// whose open failed never serves, so a served ping means a migrated store.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "Health",
    security(()),
    responses(
        (status = 200, description = "Ready to take traffic", body = StatusOut),
        (status = 503, description = "The store does not answer", body = StatusOut),
    )
)]
pub async fn readyz(State(state): State<ApiState>) -> Response {
    match state.store.ping().await {
        Ok(()) => status(StatusCode::OK, "ready"),
        Err(e) => {
            tracing::warn!(error = %e, "readiness probe: store unreachable");
            status(StatusCode::SERVICE_UNAVAILABLE, "unavailable")
        }
    }
}

/// One part of [`HealthReport`]: `ok` or `error`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct HealthStatus {
    pub status: &'static str,
}

/// Svix's health report. Herald's queue is its store, and it keeps no
/// cache of its own, so all three follow the store.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct HealthReport {
    pub database: HealthStatus,
    pub queue: HealthStatus,
    pub cache: HealthStatus,
}

/// Svix's `health.get`: 200 with the report when the store answers, 500
/// (as Svix answers) when it does not (no token).
#[utoipa::path(
    get,
    path = "/api/v1/health",
    tag = "Health",
    security(()),
    responses(
        (status = 200, description = "Database, queue and cache work", body = HealthReport),
        (status = 500, description = "The store does not answer", body = HealthReport),
    )
)]
pub async fn svix_health(State(state): State<ApiState>) -> Response {
    let (code, status) = match state.store.ping().await {
        Ok(()) => (StatusCode::OK, "ok"),
        Err(e) => {
            tracing::warn!(error = %e, "health: store unreachable");
            (StatusCode::INTERNAL_SERVER_ERROR, "error")
        }
    };
    let part = || HealthStatus { status };
    (
        code,
        axum::Json(HealthReport {
            database: part(),
            queue: part(),
            cache: part(),
        }),
    )
        .into_response()
}

/// Svix's `health/ping`: 204 while the process serves (no token, no
/// store read).
#[utoipa::path(
    get,
    path = "/api/v1/health/ping",
    tag = "Health",
    security(()),
    responses((status = 204, description = "The API is up")),
)]
pub async fn health_ping() -> StatusCode {
    StatusCode::NO_CONTENT
}

/// Prometheus text format; the metrics are listed in `crate::metrics`.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "Health",
    security(()),
    responses(
        (status = 200, description = "Prometheus text exposition format",
         body = String, content_type = "text/plain; version=0.0.4"),
        (status = 503, description = "Another metrics recorder is installed in this process",
         body = error::ErrorBody),
    )
)]
pub async fn metrics(State(state): State<ApiState>) -> Response {
    match state.metrics.render().await {
        Some(text) => (
            StatusCode::OK,
            [(
                axum::http::header::CONTENT_TYPE,
                crate::metrics::CONTENT_TYPE,
            )],
            text,
        )
            .into_response(),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(error::ErrorBody {
                code: "metrics_unavailable",
                detail: "another metrics recorder is installed in this process".to_owned(),
            }),
        )
            .into_response(),
    }
}

/// A JSON body. Malformed JSON → 400; a missing or wrong-typed field → 422
/// naming it; a body over the limit → 413. The content type is not
/// insisted on: the JSON itself is what matters.
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = body_bytes(req, state).await?;
        parse_json(&bytes).map(ApiJson)
    }
}

/// Like [`ApiJson`] for calls whose body is optional (Svix's SDKs send
/// none, or `{}`): an empty body is `T::default()`.
pub struct ApiJsonOrEmpty<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Default> FromRequest<S> for ApiJsonOrEmpty<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = body_bytes(req, state).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(ApiJsonOrEmpty(T::default()));
        }
        parse_json(&bytes).map(ApiJsonOrEmpty)
    }
}

/// The request body, with the API's JSON errors for one too large (413)
/// or unreadable (400).
async fn body_bytes<S: Send + Sync>(req: Request, state: &S) -> ApiResult<Bytes> {
    Bytes::from_request(req, state).await.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge(format!("request body exceeds {MAX_BODY_BYTES} bytes"))
        } else {
            ApiError::BadRequest(format!("cannot read request body: {rejection}"))
        }
    })
}

pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> ApiResult<T> {
    // Every body is an object, but serde's derived structs also take a JSON
    // array (fields by position), so `[null, null]` would PATCH the first
    // two fields: refuse anything but an object (found by schemathesis).
    if bytes.trim_ascii_start().first() != Some(&b'{') {
        return match serde_json::from_slice::<serde::de::IgnoredAny>(bytes) {
            Ok(_) => Err(ApiError::field("", "the body must be a JSON object")),
            Err(e) => Err(ApiError::BadRequest(format!("invalid JSON body: {e}"))),
        };
    }
    // The fast path; only a body that fails is parsed again to name the
    // offending field.
    if let Ok(value) = serde_json::from_slice(bytes) {
        return Ok(value);
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        match inner.classify() {
            serde_json::error::Category::Data => {
                let field = if path == "." { String::new() } else { path };
                ApiError::Validation(vec![FieldError::body(
                    &field,
                    strip_position(&inner.to_string()),
                )])
            }
            _ => ApiError::BadRequest(format!("invalid JSON body: {inner}")),
        }
    })?;
    de.end()
        .map_err(|e| ApiError::BadRequest(format!("invalid JSON body: {e}")))?;
    Ok(value)
}

fn strip_position(msg: &str) -> String {
    match msg.find(" at line ") {
        Some(i) => msg[..i].to_owned(),
        None => msg.to_owned(),
    }
}

/// Query parameters; unknown ones (the SDKs send `with_content`,
/// `expanded_statuses`, …) are ignored, bad values are a 422.
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query().unwrap_or("");
        parse_query(query).map(ApiQuery)
    }
}

/// Query parameters that hold a list: comma-separated, as the Rust SDK
/// sends them, or repeated (`event_types=a&event_types=b`), as Svix's
/// description (`style: form`) has other clients send them.
const LIST_PARAMS: [&str; 1] = ["event_types"];

/// `query` with each list parameter given once, its repeats joined by
/// commas (percent-encoded values are joined as they are).
fn joined_lists(query: &str) -> std::borrow::Cow<'_, str> {
    let repeated = |name: &str| {
        query
            .split('&')
            .filter(|pair| pair.split('=').next() == Some(name))
            .count()
            > 1
    };
    if !LIST_PARAMS.iter().any(|name| repeated(name)) {
        return query.into();
    }
    let mut kept: Vec<String> = Vec::new();
    for name in LIST_PARAMS {
        let values: Vec<&str> = query
            .split('&')
            .filter_map(|pair| pair.split_once('=').filter(|(n, _)| *n == name))
            .map(|(_, value)| value)
            .filter(|value| !value.is_empty())
            .collect();
        if !values.is_empty() {
            kept.push(format!("{name}={}", values.join(",")));
        }
    }
    kept.extend(
        query
            .split('&')
            .filter(|pair| !LIST_PARAMS.contains(&pair.split('=').next().unwrap_or("")))
            .map(str::to_owned),
    );
    kept.join("&").into()
}

fn parse_query<T: DeserializeOwned>(query: &str) -> ApiResult<T> {
    check_query_text(query)?;
    let query = joined_lists(query);
    axum::extract::Query::<T>::try_from_uri(
        &format!("/?{query}")
            .parse()
            .map_err(|_| ApiError::BadRequest("malformed query string".into()))?,
    )
    .map(|q| q.0)
    .map_err(|e| {
        let text = e.body_text();
        let field = text.split('`').nth(1).unwrap_or("query").to_owned();
        ApiError::Validation(vec![FieldError::query(&field, text)])
    })
}

/// Every query parameter's name and value decode to UTF-8 text without
/// control characters (the usual decoder would swap bad bytes for U+FFFD,
/// and a NUL reaching PostgreSQL is an error): 400 or 422 naming it.
pub(crate) fn check_query_text(query: &str) -> ApiResult<()> {
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let decode = |raw: &str| {
            let spaced = raw.replace('+', " ");
            percent_encoding::percent_decode_str(&spaced)
                .decode_utf8()
                .map(|t| t.into_owned())
        };
        let shown = |raw: &str| raw.chars().take(64).collect::<String>();
        let name = decode(name).map_err(|_| {
            ApiError::BadRequest(format!(
                "query parameter name `{}` is not valid UTF-8",
                shown(name)
            ))
        })?;
        if name.chars().any(char::is_control) {
            return Err(ApiError::BadRequest(
                "a query parameter name contains a control character".into(),
            ));
        }
        let value = decode(value).map_err(|_| {
            ApiError::BadRequest(format!("query parameter `{name}` is not valid UTF-8"))
        })?;
        if value.chars().any(char::is_control) {
            return Err(ApiError::Validation(vec![FieldError::query(
                &name,
                "must not contain control characters",
            )]));
        }
    }
    Ok(())
}

/// Middleware: every path parameter of the route decodes to UTF-8 text
/// without control characters, or the request is a 400 naming it (axum's
/// own rejection is a text/plain 400, and a NUL reaching PostgreSQL would
/// be a 500).
pub async fn path_params_are_text(request: Request, next: axum::middleware::Next) -> Response {
    let (mut parts, body) = request.into_parts();
    if let Err(e) = check_path_params_text(&mut parts).await {
        return e.into_response();
    }
    next.run(Request::from_parts(parts, body)).await
}

/// The check of [`path_params_are_text`], for the pages' own middleware.
pub(crate) async fn check_path_params_text(parts: &mut Parts) -> ApiResult<()> {
    match axum::extract::RawPathParams::from_request_parts(parts, &()).await {
        Ok(params) => {
            if let Some((name, _)) = params
                .iter()
                .find(|(_, value)| value.chars().any(char::is_control))
            {
                return Err(ApiError::BadRequest(format!(
                    "path parameter `{name}` must not contain control characters"
                )));
            }
            Ok(())
        }
        Err(axum::extract::rejection::RawPathParamsRejection::InvalidUtf8InPathParam(e)) => {
            let text = e.body_text();
            let name = text.split('`').nth(1).unwrap_or("path");
            Err(ApiError::BadRequest(format!(
                "path parameter `{name}` is not valid UTF-8"
            )))
        }
        // A route without parameters (or the fallback).
        Err(_) => Ok(()),
    }
}

/// The paging parameters of every list. `limit` is read as text so that a
/// bad value is a 422 naming it; the description says what it must be.
#[derive(Debug, Deserialize, Default, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListParams {
    /// How many items, 1..=250 (default 50).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 250)]
    pub limit: Option<String>,
    /// The `iterator` of the previous page, to get the next one.
    pub iterator: Option<String>,
    #[param(value_type = Option<ListOrder>)]
    pub order: Option<String>,
}

/// A boolean query parameter: absent is false; anything but `true` or
/// `false` is a 422 naming it (not silently false).
pub fn query_bool(field: &str, value: &Option<String>) -> ApiResult<bool> {
    match value.as_deref() {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(_) => Err(ApiError::Validation(vec![FieldError::query(
            field,
            "must be true or false",
        )])),
    }
}

/// The order of a list (`ListParams::order`).
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ListOrder {
    Ascending,
    Descending,
}

impl ListParams {
    /// Default 50, at most 250, as Svix.
    pub fn page(&self, default_ascending: bool) -> ApiResult<PageReq> {
        let limit = match &self.limit {
            None => 50,
            Some(s) => match s.parse::<usize>() {
                Ok(n) if (1..=250).contains(&n) => n,
                _ => {
                    return Err(ApiError::Validation(vec![FieldError::query(
                        "limit",
                        "must be 1..=250",
                    )]))
                }
            },
        };
        let ascending = match self.order.as_deref() {
            None => default_ascending,
            Some("ascending") => true,
            Some("descending") => false,
            Some(_) => {
                return Err(ApiError::Validation(vec![FieldError::query(
                    "order",
                    "must be ascending or descending",
                )]))
            }
        };
        // A `prevIterator` is the first id of a page behind a '-'.
        let iterator = self.iterator.as_deref().filter(|s| !s.is_empty());
        let (after, backwards) = match iterator {
            Some(it) => match it.strip_prefix('-') {
                Some(id) => (Some(id.to_owned()), true),
                None => (Some(it.to_owned()), false),
            },
            None => (None, false),
        };
        Ok(PageReq {
            limit,
            after,
            ascending,
            backwards,
        })
    }
}

/// How far an id's time may lie before its row's own time (`created_at`,
/// `started_at`, `at`): they are taken within one request, so a minute is
/// ample. Only an index bound: the row's own time still filters exactly.
const ID_TIME_SKEW_MS: Millis = 60_000;

impl ListParams {
    /// [`Self::page`] for a list filtered by time, as Svix pages one: given
    /// `after` and neither `before` nor an iterator, the page holds the
    /// oldest items after it (shown in the chosen order), and its
    /// `prevIterator` walks on towards now. Newest first, the first page
    /// was the newest, and a client following `prevIterator` from it never
    /// saw what lay between. The walk starts at the first id of `after`'s
    /// time (ids sort by time), so it reads no older row.
    pub fn page_since(
        &self,
        after: Option<Millis>,
        before: Option<Millis>,
        id_prefix: &str,
    ) -> ApiResult<PageReq> {
        let mut page = self.page(false)?;
        if let (Some(after), None, None) = (after, before, &page.after) {
            let from = u64::try_from(after.saturating_sub(ID_TIME_SKEW_MS)).unwrap_or(0);
            page.after = Some(format!("{id_prefix}{}", ulid::Ulid::from_parts(from, 0)));
            page.backwards = !page.ascending;
        }
        Ok(page)
    }
}

/// Svix's list envelope. `iterator` is always present, even when null.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListResponse<T: Serialize> {
    pub data: Vec<T>,
    /// Pass it back as `iterator` to get the next page.
    #[schema(required = true)]
    pub iterator: Option<String>,
    #[schema(required = true)]
    pub prev_iterator: Option<String>,
    /// No page after this one.
    pub done: bool,
}

impl<T: Serialize> ListResponse<T> {
    /// One page of `all` (a list read whole, small enough to be), by id
    /// as the store pages its tables: `page`'s order, limit and iterators
    /// mean the same.
    pub fn page_of_all(mut all: Vec<T>, page: &PageReq, id_of: impl Fn(&T) -> String) -> Self {
        all.sort_by_cached_key(&id_of);
        if !page.walks_ascending() {
            all.reverse();
        }
        let after = |item: &T| match &page.after {
            None => true,
            Some(after) if page.walks_ascending() => id_of(item).as_str() > after.as_str(),
            Some(after) => id_of(item).as_str() < after.as_str(),
        };
        let mut data: Vec<T> = all.into_iter().filter(after).take(page.limit + 1).collect();
        let has_more = data.len() > page.limit;
        data.truncate(page.limit);
        if page.backwards {
            data.reverse();
        }
        ListResponse::new(data, has_more, id_of)
    }

    pub fn new(data: Vec<T>, has_more: bool, id_of: impl Fn(&T) -> String) -> Self {
        ListResponse {
            iterator: data.last().map(&id_of),
            // Pass back to get the page before this one.
            prev_iterator: data.first().map(|first| format!("-{}", id_of(first))),
            done: !has_more,
            data,
        }
    }
}

/// The Unix milliseconds of an RFC 3339 time, as every time parameter of
/// the API is given; `None` if it is not one.
pub fn millis_of_rfc3339(text: &str) -> Option<Millis> {
    chrono::DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.timestamp_millis())
}

/// The query parameter `field`, an RFC 3339 time if given (an empty one is
/// not given), as Unix milliseconds; anything else is a 422 naming it.
pub fn query_time(field: &str, value: &Option<String>) -> ApiResult<Option<Millis>> {
    query_parsed(
        field,
        value,
        millis_of_rfc3339,
        "must be an RFC 3339 time, e.g. 2026-11-30T08:00:00Z",
    )
}

/// The names of the fields a change gave, in the order listed: what the
/// audit log of a PATCH says (names, never values).
pub fn named_fields<const N: usize>(fields: [(&'static str, bool); N]) -> Vec<&'static str> {
    fields
        .into_iter()
        .filter_map(|(name, given)| given.then_some(name))
        .collect()
}

/// An optional query value as `parse` reads it (empty is absent); one it
/// refuses is a 422 naming `field`, saying `rule`.
pub fn query_parsed<T>(
    field: &str,
    value: &Option<String>,
    parse: impl FnOnce(&str) -> Option<T>,
    rule: &str,
) -> ApiResult<Option<T>> {
    match value.as_deref().filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(v) => parse(v)
            .map(Some)
            .ok_or_else(|| ApiError::Validation(vec![error::FieldError::query(field, rule)])),
    }
}

/// Svix's time format; it lives in the store, below every module using it.
pub use crate::store::rfc3339;

/// Ids and uids: Svix's pattern, so they are safe in paths and logs.
pub fn valid_uid(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 256
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

pub fn check_uid(field: &str, uid: &Option<String>) -> ApiResult<()> {
    match uid {
        Some(u) if !valid_uid(u) => Err(ApiError::field(
            field,
            "must be 1-256 characters of letters, digits, '-', '_' or '.'",
        )),
        _ => Ok(()),
    }
}

/// 422 naming `uid` for a uid newly given that starts with `prefix` (in
/// any letter case); `why` says what such uids are. `current` (a uid given
/// before the rule) may stay.
pub fn refuse_uid_prefix(
    uid: &Option<String>,
    current: Option<&str>,
    prefix: &str,
    why: &str,
) -> ApiResult<()> {
    match uid {
        Some(uid)
            if Some(uid.as_str()) != current
                && uid
                    .get(..prefix.len())
                    .is_some_and(|p| p.eq_ignore_ascii_case(prefix)) =>
        {
            Err(ApiError::field(
                "uid",
                format!("must not start with `{prefix}` (in any letter case): {why}"),
            ))
        }
        _ => Ok(()),
    }
}

/// 422 for a uid that reads like an endpoint id (`ep_…`): ids and uids
/// share one namespace in paths, so such a uid could shadow, or be
/// shadowed by, another endpoint's id.
pub fn check_endpoint_uid_not_an_id(uid: &Option<String>, current: Option<&str>) -> ApiResult<()> {
    refuse_uid_prefix(uid, current, "ep_", "that is how endpoint ids start")
}

/// The longest application or token name (Svix sets none; Herald bounds
/// every stored string).
pub const MAX_NAME_CHARS: usize = 256;
/// The longest metadata key, and value (all of it: at most 64 KiB).
pub const MAX_METADATA_KEY_CHARS: usize = 256;
pub const MAX_METADATA_VALUE_CHARS: usize = 4096;

/// A stored one-line string (a name, a key, an id chosen by the caller):
/// at most `max` characters and no control character at all (a NUL cannot
/// even be stored by PostgreSQL; the others have no business in names).
pub fn check_line(loc: &[&str], value: &str, max: usize) -> ApiResult<()> {
    check_chars(loc, value, max, |c| c.is_control())
}

/// Stored free text (a description, a reason, a metadata value): as
/// [`check_line`], but tabs and line breaks are fine.
pub fn check_text(loc: &[&str], value: &str, max: usize) -> ApiResult<()> {
    check_chars(loc, value, max, |c| {
        c.is_control() && !matches!(c, '\t' | '\n' | '\r')
    })
}

fn check_chars(loc: &[&str], value: &str, max: usize, bad: impl Fn(char) -> bool) -> ApiResult<()> {
    if let Some(c) = value.chars().find(|c| bad(*c)) {
        return Err(ApiError::Validation(vec![FieldError::at(
            loc,
            format!(
                "must not contain control characters (found U+{:04X})",
                u32::from(c)
            ),
        )]));
    }
    // Counted as characters, as JSON Schema's maxLength counts them.
    if value.len() > max && value.chars().count() > max {
        return Err(ApiError::Validation(vec![FieldError::at(
            loc,
            format!("must be at most {max} characters"),
        )]));
    }
    Ok(())
}

/// Metadata: keys of at most 256 characters, values of at most 4096, neither
/// with control characters (tabs and line breaks aside in values), and at
/// most 64 KiB in all.
pub fn check_metadata(
    metadata: &Option<std::collections::BTreeMap<String, String>>,
) -> ApiResult<()> {
    if let Some(m) = metadata {
        let size: usize = m.iter().map(|(k, v)| k.len() + v.len()).sum();
        if size > 64 * 1024 {
            return Err(ApiError::field("metadata", "must be at most 64 KiB"));
        }
        for (key, value) in m {
            check_line(&["body", "metadata", key], key, MAX_METADATA_KEY_CHARS)?;
            check_text(&["body", "metadata", key], value, MAX_METADATA_VALUE_CHARS)?;
        }
    }
    Ok(())
}

/// Deserializes a field that may be absent (outer None), null (Some(None))
/// or set (Some(Some(v))): PATCH needs all three.
pub fn double_option<'de, D, T>(de: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(de).map(Some)
}

/// An empty JSON object: the SDKs parse every body, even when there is
/// nothing to say.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct EmptyOut {}

/// 202 with an empty JSON object.
pub fn accepted_empty() -> Response {
    (StatusCode::ACCEPTED, axum::Json(EmptyOut {})).into_response()
}

//! Dead letters: deliveries that will not be retried any more, listed for
//! operators and replayed one by one or per endpoint. A replay starts a
//! fresh retry cycle with the same delivery id, hence the same
//! Idempotency-Key, and `X-Attempt` goes on counting.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::apps::find_app;
use super::auth::ResolvedApp;
use super::endpoints::{find_endpoint, PathEndpoint};
use super::error::{
    ConflictResponse, FieldError, ForbiddenResponse, NotFoundResponse, ValidationResponse,
};
use super::messages::DeliveryOut;
use super::{accepted_empty, ApiError, ApiQuery, ApiResult, ApiState, ListParams, ListResponse};
use crate::audit::Actor;
use crate::ids::{AppId, DeliveryId, EndpointId};
use crate::store::{now_millis, DeadFilter};

#[derive(Debug, Deserialize, Default, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeadParams {
    // Documented by `ListParams`' own derive: IntoParams cannot flatten.
    #[serde(flatten)]
    #[param(ignore)]
    pub list: ListParams,
    /// Only this endpoint's (id or uid).
    pub endpoint_id: Option<String>,
}

/// The answer of a replay of an endpoint's dead deliveries.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ReplayedOut {
    /// How many dead deliveries were put back in the queue.
    pub replayed: u64,
}

/// The answer of a bulk replay.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct BulkReplayOut {
    pub replayed: u64,
    /// Fewer than `limit` matched: nothing is left to replay.
    pub done: bool,
}

#[utoipa::path(
    get,
    path = "/app/{app_id}/dead-letter",
    tag = "Dead letter",
    params(ListParams, DeadParams),
    responses(
        (status = 200, description = "A page of the application's dead deliveries, newest first",
         body = ListResponse<DeliveryOut>),
        NotFoundResponse, ValidationResponse,
    )
)]
pub async fn list_dead(
    State(state): State<ApiState>,
    app: ResolvedApp,
    ApiQuery(params): ApiQuery<DeadParams>,
) -> ApiResult<Json<ListResponse<DeliveryOut>>> {
    let endpoint = match &params.endpoint_id {
        Some(id) => Some(find_endpoint(&state, &app.id, id).await?.id),
        None => None,
    };
    let filter = DeadFilter {
        app: Some(app.id),
        endpoint,
        ..DeadFilter::default()
    };
    dead_page(&state, &filter, &params.list).await
}

#[utoipa::path(
    post,
    path = "/app/{app_id}/dead-letter/{delivery_id}/replay",
    tag = "Dead letter",
    responses(
        (status = 202, description = "Replayed: a fresh retry cycle starts now", body = super::EmptyOut),
        NotFoundResponse, ConflictResponse,
    )
)]
pub async fn replay_dead(
    State(state): State<ApiState>,
    actor: Actor,
    app: ResolvedApp,
    Path((_app_id, delivery_id)): Path<(String, String)>,
) -> ApiResult<Response> {
    let id = DeliveryId::parse(&delivery_id).ok_or(ApiError::NotFound("delivery"))?;
    if replay_one(&state, &actor, &app.id, &id).await? {
        return Ok(accepted_empty());
    }
    match state.store.get_delivery(&app.id, &id).await? {
        None => Err(ApiError::NotFound("delivery")),
        Some(d) => Err(ApiError::Conflict(format!(
            "delivery is {}, not dead",
            d.state.as_str()
        ))),
    }
}

/// Replays `app`'s dead delivery `id`, wakes the dispatcher and records it
/// in the audit log; false when it is not dead (or not there).
pub(crate) async fn replay_one(
    state: &ApiState,
    actor: &Actor,
    app: &AppId,
    id: &DeliveryId,
) -> ApiResult<bool> {
    if !state.store.replay_dead(app, id, now_millis()).await? {
        return Ok(false);
    }
    state.wake.notify_one();
    actor
        .record(
            &*state.store,
            "dead.replayed",
            Some(app),
            id.as_str(),
            serde_json::json!({ "replayed": 1 }),
        )
        .await;
    Ok(true)
}

#[utoipa::path(
    post,
    path = "/app/{app_id}/endpoint/{endpoint_id}/dead-letter/replay",
    tag = "Dead letter",
    responses(
        (status = 202, description = "Every dead delivery of the endpoint replayed", body = ReplayedOut),
        NotFoundResponse,
    )
)]
pub async fn replay_endpoint_dead(
    State(state): State<ApiState>,
    actor: Actor,
    PathEndpoint(ep): PathEndpoint,
) -> ApiResult<Response> {
    let replayed = state
        .store
        .replay_dead_of_endpoint(&ep.app_id, &ep.id, now_millis())
        .await?;
    if replayed > 0 {
        state.wake.notify_one();
    }
    actor
        .record(
            &*state.store,
            "dead.replayed",
            Some(&ep.app_id),
            ep.id.as_str(),
            serde_json::json!({ "replayed": replayed }),
        )
        .await;
    Ok((StatusCode::ACCEPTED, Json(ReplayedOut { replayed })).into_response())
}

/// Filters of the cross-application dead-letter calls (Herald's own):
/// `app_id`, `endpoint_id`, `event_type`, `reason`, `since`, `until`
/// (RFC 3339).
#[derive(Debug, Deserialize, Default, utoipa::IntoParams, utoipa::ToSchema)]
#[into_params(parameter_in = Query)]
pub struct DeadFilterParams {
    // Query strings use snake_case, JSON bodies camelCase (as Svix): both
    // spellings are accepted in both places (the description names the
    // snake_case one).
    /// Only this application's (id or uid).
    #[serde(alias = "appId")]
    pub app_id: Option<String>,
    /// Only this endpoint's: an id or, with `app_id`, a uid.
    #[serde(alias = "endpointId")]
    pub endpoint_id: Option<String>,
    #[serde(alias = "eventType")]
    pub event_type: Option<String>,
    /// `exhausted`, `permanent_status`, `too_old` or `expunged`.
    #[param(pattern = "^(exhausted|permanent_status|too_old|expunged)?$")]
    #[schema(pattern = "^(exhausted|permanent_status|too_old|expunged)?$")]
    pub reason: Option<String>,
    /// Dead since this time (RFC 3339).
    #[param(format = DateTime)]
    #[schema(format = DateTime)]
    pub since: Option<String>,
    /// Dead until this time (RFC 3339).
    #[param(format = DateTime)]
    #[schema(format = DateTime)]
    pub until: Option<String>,
}

fn parse_time(part: &str, field: &str, value: &Option<String>) -> ApiResult<Option<i64>> {
    match value.as_deref().filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(v) => super::millis_of_rfc3339(v).map(Some).ok_or_else(|| {
            ApiError::Validation(vec![FieldError::at(
                &[part, field],
                "must be an RFC 3339 time, e.g. 2026-11-30T08:00:00Z",
            )])
        }),
    }
}

impl DeadFilterParams {
    /// Resolves names to ids; an unknown app or endpoint is a 404. `part`
    /// is where the filter came from (`query` or `body`), which a 422's
    /// `loc` names.
    pub async fn resolve(&self, state: &ApiState, part: &str) -> ApiResult<DeadFilter> {
        // Names only looked up, never stored, but a NUL would reach
        // PostgreSQL as an error. (In a query string, `ApiQuery` refused
        // control characters already: these are the body's.)
        for (field, value) in [
            ("app_id", &self.app_id),
            ("endpoint_id", &self.endpoint_id),
            ("event_type", &self.event_type),
        ] {
            if let Some(v) = value {
                super::check_line(&[part, field], v, usize::MAX)?;
            }
        }
        let nonempty = |v: &Option<String>| v.clone().filter(|s| !s.is_empty());
        let app = match nonempty(&self.app_id) {
            Some(id) => Some(find_app(state, &id).await?.id),
            None => None,
        };
        let endpoint = match (nonempty(&self.endpoint_id), &app) {
            (Some(id), Some(app)) => Some(find_endpoint(state, app, &id).await?.id),
            (Some(id), None) => Some(EndpointId::parse(&id).ok_or_else(|| {
                ApiError::Validation(vec![FieldError::at(
                    &[part, "endpoint_id"],
                    "must be an endpoint id (ep_…) unless app_id is given",
                )])
            })?),
            (None, _) => None,
        };
        let reason = match nonempty(&self.reason) {
            None => None,
            Some(r) => Some(herald_policy::DeadReason::parse(&r).ok_or_else(|| {
                ApiError::Validation(vec![FieldError::at(
                    &[part, "reason"],
                    "must be exhausted, permanent_status or too_old",
                )])
            })?),
        };
        Ok(DeadFilter {
            app,
            endpoint,
            event_type: nonempty(&self.event_type),
            reason,
            since: parse_time(part, "since", &self.since)?,
            until: parse_time(part, "until", &self.until)?,
            created_since: None,
            created_until: None,
        })
    }
}

#[derive(Debug, Deserialize, Default)]
pub struct AllDeadParams {
    #[serde(flatten)]
    pub list: ListParams,
    #[serde(flatten)]
    pub filter: DeadFilterParams,
}

/// `GET /api/v1/dead-letter`: dead deliveries of every application,
/// newest first, filtered.
#[utoipa::path(
    get,
    path = "/dead-letter",
    tag = "Dead letter",
    params(ListParams, DeadFilterParams),
    responses(
        (status = 200, description = "A page of dead deliveries, newest first",
         body = ListResponse<DeliveryOut>),
        ForbiddenResponse, NotFoundResponse,
        ValidationResponse,
    )
)]
pub async fn list_all_dead(
    State(state): State<ApiState>,
    ApiQuery(params): ApiQuery<AllDeadParams>,
) -> ApiResult<Json<ListResponse<DeliveryOut>>> {
    let filter = params.filter.resolve(&state, "query").await?;
    dead_page(&state, &filter, &params.list).await
}

/// The most one bulk replay call moves; callers repeat while it is full.
pub const MAX_REPLAY_BATCH: usize = crate::store::REPLAY_BATCH;

#[derive(Debug, Deserialize, Default, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplayIn {
    #[serde(flatten)]
    pub filter: DeadFilterParams,
    /// Only these deliveries (`dlv_…`; still subject to the filter).
    #[schema(max_items = 1000)]
    pub ids: Option<Vec<String>>,
    /// At most this many (default and maximum 1000).
    #[schema(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
}

/// `POST /api/v1/dead-letter/replay`: replays the dead deliveries matching
/// the filter (and `ids`, when given), at most `limit`; answers
/// `{"replayed": n, "done": bool}` (done: fewer than `limit` matched).
#[utoipa::path(
    post,
    path = "/dead-letter/replay",
    tag = "Dead letter",
    request_body = ReplayIn,
    responses(
        (status = 202, description = "Replayed; repeat while `done` is false", body = BulkReplayOut),
        ForbiddenResponse, NotFoundResponse,
    )
)]
pub async fn replay_all_dead(
    State(state): State<ApiState>,
    actor: Actor,
    super::ApiJson(body): super::ApiJson<ReplayIn>,
) -> ApiResult<Response> {
    let filter = body.filter.resolve(&state, "body").await?;
    let limit = match body.limit {
        None => MAX_REPLAY_BATCH,
        Some(n) if (1..=MAX_REPLAY_BATCH).contains(&n) => n,
        Some(_) => return Err(ApiError::field("limit", "must be 1..=1000")),
    };
    let ids = match &body.ids {
        None => None,
        Some(list) => {
            if list.len() > MAX_REPLAY_BATCH {
                return Err(ApiError::field("ids", "at most 1000 per call"));
            }
            Some(
                list.iter()
                    .map(|s| DeliveryId::parse(s))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| ApiError::field("ids", "must be delivery ids (dlv_…)"))?,
            )
        }
    };
    let replayed = state
        .store
        .replay_dead_matching(&filter, ids.as_deref(), limit, now_millis())
        .await?;
    if replayed > 0 {
        state.wake.notify_one();
    }
    let done = usize::try_from(replayed).unwrap_or(usize::MAX) < limit;
    let details = serde_json::json!({ "replayed": replayed, "selected": ids.as_ref().map(Vec::len), "done": done });
    record_replay_matching(&state, &actor, &filter, details).await;
    Ok((StatusCode::ACCEPTED, Json(BulkReplayOut { replayed, done })).into_response())
}

/// Audits a replay of the dead deliveries matching `filter` (this API's
/// and the dashboard's): `dead.replayed` in the filter's application, on
/// its endpoint (the empty target when it names none).
pub(crate) async fn record_replay_matching(
    state: &ApiState,
    actor: &Actor,
    filter: &DeadFilter,
    details: serde_json::Value,
) {
    let target = filter.endpoint.as_ref().map_or("", |e| e.as_str());
    actor
        .record(
            &*state.store,
            "dead.replayed",
            filter.app.as_ref(),
            target,
            details,
        )
        .await;
}

/// One page of the dead deliveries matching `filter`, newest first.
async fn dead_page(
    state: &ApiState,
    filter: &DeadFilter,
    list: &ListParams,
) -> ApiResult<Json<ListResponse<DeliveryOut>>> {
    let page = state.store.list_dead(filter, &list.page(false)?).await?;
    let data = page.items.into_iter().map(DeliveryOut::from).collect();
    Ok(Json(ListResponse::new(
        data,
        page.has_more,
        |d: &DeliveryOut| d.id.clone(),
    )))
}

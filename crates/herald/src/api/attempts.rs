//! The attempt log, as Svix's `MessageAttemptOut`.

use axum::extract::State;
use axum::Json;
use serde::Serialize;

use super::endpoints::PathEndpoint;
use super::error::{NotFoundResponse, ValidationResponse};
use super::messages::PathMessage;
use super::{rfc3339, ApiQuery, ApiResult, ApiState, ListParams, ListResponse};
use crate::ids::AttemptId;
use crate::store::AttemptRecord;

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttemptOut {
    pub id: String,
    pub msg_id: String,
    pub endpoint_id: String,
    /// Herald's delivery id: the attempt's `Idempotency-Key`.
    pub delivery_id: String,
    pub url: String,
    pub timestamp: String,
    /// Svix's numbering: 0 success, 1 pending, 2 fail, 3 sending.
    pub status: u8,
    pub status_text: &'static str,
    /// 0 when no response arrived (network error or timeout).
    pub response_status_code: u16,
    /// The response body excerpt, or the network error when there was none.
    pub response: String,
    pub response_duration_ms: i64,
    /// 0 scheduled, 1 manual (replay or resend).
    pub trigger_type: u8,
    /// The `X-Attempt` number.
    pub attempt_number: u32,
    pub error: Option<String>,
}

impl From<AttemptRecord> for AttemptOut {
    fn from(a: AttemptRecord) -> Self {
        AttemptOut {
            id: a.id.into_string(),
            msg_id: a.msg_id.into_string(),
            endpoint_id: a.endpoint_id.into_string(),
            delivery_id: a.delivery_id.into_string(),
            url: a.url,
            timestamp: rfc3339(a.started_at),
            status: if a.success { 0 } else { 2 },
            status_text: if a.success { "success" } else { "fail" },
            response_status_code: a.status_code.unwrap_or(0),
            response: match (&a.error, a.status_code) {
                (Some(e), None) => e.clone(),
                _ => a.response,
            },
            response_duration_ms: a.duration_ms,
            trigger_type: u8::from(a.manual),
            attempt_number: a.attempt_number,
            error: a.error,
        }
    }
}

fn respond(page: crate::store::Page<AttemptRecord>) -> Json<ListResponse<AttemptOut>> {
    let data = page.items.into_iter().map(AttemptOut::from).collect();
    Json(ListResponse::new(data, page.has_more, |a: &AttemptOut| {
        a.id.clone()
    }))
}

#[utoipa::path(
    get,
    path = "/app/{app_id}/attempt/msg/{msg_id}",
    tag = "Attempt",
    params(ListParams, super::history::AttemptListParams, super::history::AttemptEndpointParam),
    responses(
        (status = 200, description = "A page of the message's attempts", body = ListResponse<AttemptOut>),
        NotFoundResponse, ValidationResponse,
    )
)]
pub async fn list_attempts_by_msg(
    State(state): State<ApiState>,
    PathMessage(msg): PathMessage,
    ApiQuery(params): ApiQuery<super::history::AttemptListParams>,
    ApiQuery(only): ApiQuery<super::history::AttemptEndpointParam>,
) -> ApiResult<Json<ListResponse<AttemptOut>>> {
    // The other filters are judged first: a bad one is a 422 whatever
    // `endpoint_id` names.
    params.filter()?;
    let endpoint = match only.endpoint_id.as_deref().filter(|e| !e.is_empty()) {
        None => None,
        // An endpoint that is not the app's has no attempts of it.
        Some(id_or_uid) => match state.store.get_endpoint(&msg.app_id, id_or_uid).await? {
            Some(ep) => Some(ep.id),
            None => {
                return Ok(respond(crate::store::Page {
                    items: Vec::new(),
                    has_more: false,
                }))
            }
        },
    };
    list_filtered(&state, &msg.app_id, &params, |f| {
        f.msg = Some(msg.id);
        f.endpoint = endpoint;
    })
    .await
}

#[utoipa::path(
    get,
    path = "/app/{app_id}/attempt/endpoint/{endpoint_id}",
    tag = "Attempt",
    params(ListParams, super::history::AttemptListParams),
    responses(
        (status = 200, description = "A page of the attempts to the endpoint", body = ListResponse<AttemptOut>),
        NotFoundResponse, ValidationResponse,
    )
)]
pub async fn list_attempts_by_endpoint(
    State(state): State<ApiState>,
    PathEndpoint(ep): PathEndpoint,
    ApiQuery(params): ApiQuery<super::history::AttemptListParams>,
) -> ApiResult<Json<ListResponse<AttemptOut>>> {
    list_filtered(&state, &ep.app_id, &params, |f| f.endpoint = Some(ep.id)).await
}

/// One page of the app's attempts under the query's filters, narrowed by
/// `target` (a message or an endpoint); a filter that can match nothing
/// (status pending or sending) answers an empty page without a read.
async fn list_filtered(
    state: &ApiState,
    app: &crate::ids::AppId,
    params: &super::history::AttemptListParams,
    target: impl FnOnce(&mut crate::store::AttemptFilter),
) -> ApiResult<Json<ListResponse<AttemptOut>>> {
    let Some(mut filter) = params.filter()? else {
        return Ok(respond(crate::store::Page {
            items: Vec::new(),
            has_more: false,
        }));
    };
    target(&mut filter);
    let page_req = params
        .list
        .page_since(filter.after, filter.before, AttemptId::PREFIX)?;
    let page = state.store.list_attempts(app, &filter, &page_req).await?;
    Ok(respond(page))
}

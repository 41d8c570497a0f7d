//! Dead letters: deliveries that will not be retried any more, listed for
//! operators and replayed one by one or per endpoint. A replay starts a
//! fresh retry cycle with the same delivery id, hence the same
//! Idempotency-Key, and `X-Attempt` goes on counting.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::apps::find_app;
use super::endpoints::find_endpoint;
use super::messages::DeliveryOut;
use super::{accepted_empty, ApiError, ApiQuery, ApiResult, ApiState, ListParams, ListResponse};
use crate::ids::DeliveryId;
use crate::store::now_millis;

#[derive(Debug, Deserialize, Default)]
pub struct DeadParams {
    #[serde(flatten)]
    pub list: ListParams,
    pub endpoint_id: Option<String>,
}

pub async fn list_dead(
    State(state): State<ApiState>,
    Path(app_id): Path<String>,
    ApiQuery(params): ApiQuery<DeadParams>,
) -> ApiResult<Json<ListResponse<DeliveryOut>>> {
    let app = find_app(&state, &app_id).await?;
    let endpoint = match &params.endpoint_id {
        Some(id) => Some(find_endpoint(&state, &app.id, id).await?.id),
        None => None,
    };
    let page = state
        .store
        .list_dead(&app.id, endpoint.as_ref(), &params.list.page(false)?)
        .await?;
    let data = page.items.into_iter().map(DeliveryOut::from).collect();
    Ok(Json(ListResponse::new(
        data,
        page.has_more,
        |d: &DeliveryOut| d.id.clone(),
    )))
}

pub async fn replay_dead(
    State(state): State<ApiState>,
    Path((app_id, delivery_id)): Path<(String, String)>,
) -> ApiResult<Response> {
    let app = find_app(&state, &app_id).await?;
    let id = DeliveryId::parse(&delivery_id).ok_or(ApiError::NotFound("delivery"))?;
    if state.store.replay_dead(&app.id, &id, now_millis()).await? {
        state.wake.notify_one();
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

pub async fn replay_endpoint_dead(
    State(state): State<ApiState>,
    Path((app_id, endpoint_id)): Path<(String, String)>,
) -> ApiResult<Response> {
    let app = find_app(&state, &app_id).await?;
    let ep = find_endpoint(&state, &app.id, &endpoint_id).await?;
    let replayed = state
        .store
        .replay_dead_of_endpoint(&app.id, &ep.id, now_millis())
        .await?;
    if replayed > 0 {
        state.wake.notify_one();
    }
    Ok((
        StatusCode::ACCEPTED,
        Json(serde_json::json!({ "replayed": replayed })),
    )
        .into_response())
}

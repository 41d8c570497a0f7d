//! An endpoint's health: delivery figures, failing streak, breaker and
//! throttle, for the API, the dashboard and the portal.

use axum::extract::State;
use axum::Json;

use super::error::NotFoundResponse;
use super::{ApiError, ApiResult, ApiState};
use crate::ids::EndpointId;
use crate::store::{now_millis, Endpoint};

use super::endpoints::PathEndpoint;

/// `GET …/endpoint/{id}/health` (Herald's own): the figures of
/// [`crate::health::EndpointHealth`], read from stats buckets.
#[utoipa::path(
    get,
    path = "/app/{app_id}/endpoint/{endpoint_id}/health",
    tag = "Endpoint",
    responses(
        (status = 200, description = "Attempt figures of the last hour and day, and the circuit breaker's state", body = crate::health::EndpointHealth),
        NotFoundResponse,
    )
)]
pub async fn get_endpoint_health(
    State(state): State<ApiState>,
    PathEndpoint(ep): PathEndpoint,
) -> ApiResult<Json<crate::health::EndpointHealth>> {
    Ok(Json(
        endpoint_health(&state.store, &ep, &state.breaker).await?,
    ))
}

/// Reads one endpoint's health (three small reads: its row, its buckets,
/// its circuit breaker; a fourth, of its waiting deliveries, when it has a
/// `throttleRate`).
pub async fn endpoint_health(
    store: &std::sync::Arc<dyn crate::store::Store>,
    ep: &Endpoint,
    breaker: &herald_policy::breaker::BreakerRule,
) -> ApiResult<crate::health::EndpointHealth> {
    let now = now_millis();
    let status = store
        .endpoint_status(&ep.id)
        .await?
        .ok_or(ApiError::NotFound("endpoint"))?;
    let buckets = store.endpoint_stats(&ep.id, health_since(now)).await?;
    let circuit = store.circuit_of(&ep.id).await?;
    let waiting = throttle_waiting_if_throttled(store, ep).await?;
    Ok(assemble_health(
        ep,
        &status,
        &buckets,
        circuit.as_ref(),
        waiting,
        breaker,
        now,
    ))
}

/// [`endpoint_health`] of each endpoint of a listed page (the dashboard's
/// overview and application pages, the portal's home), from the status
/// and the breaker the list read: the stats buckets in one read, and a
/// throttled endpoint's backlog each (side by side). Every read is of the
/// listed endpoints only, so a portal page reads nothing of another
/// application.
pub async fn listed_health(
    store: &std::sync::Arc<dyn crate::store::Store>,
    rows: &[crate::store::EndpointOverview],
    breaker: &herald_policy::breaker::BreakerRule,
) -> ApiResult<Vec<crate::health::EndpointHealth>> {
    let now = now_millis();
    let ids: Vec<EndpointId> = rows.iter().map(|r| r.endpoint.id.clone()).collect();
    let mut buckets = store.endpoints_stats(&ids, health_since(now)).await?;
    let waiting = futures::future::try_join_all(
        rows.iter()
            .map(|r| throttle_waiting_if_throttled(store, &r.endpoint)),
    )
    .await?;
    Ok(rows
        .iter()
        .zip(waiting)
        .map(|(r, waiting)| {
            let ep = &r.endpoint;
            let mine = buckets.remove(&ep.id).unwrap_or_default();
            assemble_health(
                ep,
                &r.status,
                &mine,
                Some(&r.circuit),
                waiting,
                breaker,
                now,
            )
        })
        .collect())
}

/// Where the health figures' buckets start: the last 24 hours, and the
/// bucket the window's start falls in.
fn health_since(now: crate::store::Millis) -> crate::store::Millis {
    now - 24 * 3600 * 1000 - crate::health::BUCKET_MS
}

/// A throttled endpoint's deliveries waiting for a slot; None without a
/// `throttleRate` (nothing read).
async fn throttle_waiting_if_throttled(
    store: &std::sync::Arc<dyn crate::store::Store>,
    ep: &Endpoint,
) -> ApiResult<Option<u64>> {
    if crate::store::throttled_rate(ep.rate_limit.map(i64::from)).is_none() {
        return Ok(None);
    }
    Ok(Some(store.throttle_waiting_of(&ep.id).await?))
}

/// An endpoint's health from what was read of it: its status and stats
/// buckets, its circuit breaker (None: closed, as a new one), and its
/// waiting deliveries when it has a `throttleRate`.
fn assemble_health(
    ep: &Endpoint,
    status: &crate::store::EndpointStatus,
    buckets: &[crate::store::StatsBucket],
    circuit: Option<&herald_policy::breaker::Circuit>,
    throttle_waiting: Option<u64>,
    breaker: &herald_policy::breaker::BreakerRule,
    now: crate::store::Millis,
) -> crate::health::EndpointHealth {
    let mut health = crate::health::compute(status, buckets, now);
    if let Some(circuit) = circuit {
        health.circuit = crate::health::CircuitHealth::of(circuit, breaker, now);
    }
    if let Some(rate) = crate::store::throttled_rate(ep.rate_limit.map(i64::from)) {
        health.throttled = Some(crate::health::throttled_text(rate));
        health.throttle_waiting = throttle_waiting;
    }
    health
}

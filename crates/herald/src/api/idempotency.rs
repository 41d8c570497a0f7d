//! `Idempotency-Key` on POST: a repeat of a request within 12 h gets the
//! first response again (status and body), marked `idempotent-replayed:
//! true`, and changes nothing. Keys are per token. The same key with a
//! different request (method, path or body) is refused with 409, as is a
//! repeat while the first is still running. Server errors are not kept,
//! so a retry after one runs again.
//!
//! The Svix SDKs send `idempotency-key: auto_<uuid>` on every POST, so this
//! runs on the hot path: one write before (claim the key) and one after
//! (keep the answer), both joining the store's group commits.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use super::auth::Principal;
use super::{ApiError, ApiState, MAX_BODY_BYTES};
use crate::store::{now_millis, IdemBegin};

/// How long a key is remembered.
pub const KEY_LIFETIME_MS: i64 = 12 * 3600 * 1000;
/// A first request still "running" after this is taken to have died.
const STALE_AFTER_MS: i64 = 60 * 1000;

pub async fn idempotency(State(state): State<ApiState>, request: Request, next: Next) -> Response {
    if request.method() != Method::POST {
        return next.run(request).await;
    }
    let Some(key) = request
        .headers()
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .map(str::to_owned)
    else {
        return next.run(request).await;
    };
    if key.len() > 256 {
        return ApiError::BadRequest("Idempotency-Key must be at most 256 characters".into())
            .into_response();
    }
    let scope = request
        .extensions()
        .get::<Principal>()
        .map(|p| p.scope().to_owned())
        .unwrap_or_else(|| "admin".to_owned());
    let (parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(_) => {
            return ApiError::PayloadTooLarge(format!(
                "request body exceeds {MAX_BODY_BYTES} bytes"
            ))
            .into_response()
        }
    };
    let mut hasher = Sha256::new();
    hasher.update(parts.method.as_str().as_bytes());
    hasher.update(b" ");
    hasher.update(parts.uri.path().as_bytes());
    hasher.update(b"\n");
    hasher.update(&bytes);
    let hash = hex::encode(hasher.finalize());
    let now = now_millis();
    let begun = state
        .store
        .idempotency_begin(
            &scope,
            &key,
            &hash,
            now,
            now - KEY_LIFETIME_MS,
            now - STALE_AFTER_MS,
        )
        .await;
    match begun {
        Err(e) => return ApiError::from(e).into_response(),
        Ok(IdemBegin::Mismatch) => {
            return ApiError::Conflict(
                "this Idempotency-Key was already used for a different request".into(),
            )
            .into_response()
        }
        Ok(IdemBegin::InProgress) => {
            return ApiError::Conflict(
                "a request with this Idempotency-Key is still in progress".into(),
            )
            .into_response()
        }
        Ok(IdemBegin::Replay { status, body }) => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
            let mut response = (status, body).into_response();
            let headers = response.headers_mut();
            headers.insert(
                axum::http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
            return response;
        }
        Ok(IdemBegin::Fresh) => {}
    }
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    let status = response.status();
    if status.is_server_error() {
        if let Err(e) = state.store.idempotency_abort(&scope, &key).await {
            tracing::warn!(error = %e, "could not release an idempotency key");
        }
        return response;
    }
    let (parts, body) = response.into_parts();
    let bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!(error = %e, "could not read a response to keep it");
            let _ = state.store.idempotency_abort(&scope, &key).await;
            return ApiError::Internal.into_response();
        }
    };
    let text = String::from_utf8_lossy(&bytes);
    if let Err(e) = state
        .store
        .idempotency_finish(&scope, &key, status.as_u16(), &text)
        .await
    {
        // The answer stands; a repeat would run again once the key is
        // taken to have died.
        tracing::warn!(error = %e, "could not keep an idempotent response");
    }
    Response::from_parts(parts, Body::from(bytes))
}

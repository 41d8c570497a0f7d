//! The one error type of the HTTP API. Its JSON body is Svix's shape,
//! `{"code", "detail"}`, and a 422's `detail` lists `{loc, msg, type}` per
//! field. Store errors are logged and never shown: clients see a generic
//! message, not database text.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::store::StoreError;

/// One invalid field of a 422: where it is (`["body", "url"]`,
/// `["query", "limit"]`), what is wrong, and the kind of error.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct FieldError {
    pub loc: Vec<String>,
    pub msg: String,
    #[serde(rename = "type")]
    pub kind: String,
}

impl FieldError {
    pub fn body(field: &str, msg: impl Into<String>) -> Self {
        let mut loc = vec!["body".to_owned()];
        loc.extend(
            field
                .split('.')
                .filter(|s| !s.is_empty())
                .map(str::to_owned),
        );
        FieldError {
            loc,
            msg: msg.into(),
            kind: "value_error".into(),
        }
    }

    pub fn query(field: &str, msg: impl Into<String>) -> Self {
        FieldError {
            loc: vec!["query".into(), field.into()],
            msg: msg.into(),
            kind: "value_error".into(),
        }
    }

    /// `loc` given segment by segment, for names that may hold a '.'
    /// (header names, metadata keys).
    pub fn at(loc: &[&str], msg: impl Into<String>) -> Self {
        FieldError {
            loc: loc.iter().map(|s| (*s).to_owned()).collect(),
            msg: msg.into(),
            kind: "value_error".into(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("missing or invalid bearer token")]
    Unauthorized,
    #[error("{0}")]
    Forbidden(String),
    #[error("{0} not found")]
    NotFound(&'static str),
    /// The route exists but not with this method (its `Allow` header says
    /// which it takes).
    #[error("this route does not take this method")]
    MethodNotAllowed,
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error("validation failed")]
    Validation(Vec<FieldError>),
    /// The caller is over `HERALD_API_RATE_LIMIT`.
    #[error("too many requests; retry after {retry_after_secs} s")]
    TooManyRequests { retry_after_secs: u64 },
    #[error("service unavailable")]
    Unavailable,
    #[error("internal error")]
    Internal,
}

impl ApiError {
    pub fn field(field: &str, msg: impl Into<String>) -> Self {
        ApiError::Validation(vec![FieldError::body(field, msg)])
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Conflict(_) => {
                ApiError::Conflict("a resource with this uid already exists".into())
            }
            // The row's application (or endpoint) was deleted while the
            // request was being handled.
            StoreError::ParentGone(_) => ApiError::NotFound("application or endpoint"),
            StoreError::Unavailable(detail) => {
                tracing::warn!(error = %detail, "store unavailable");
                ApiError::Unavailable
            }
            StoreError::Internal(detail) => {
                tracing::error!(error = %detail, "store error");
                ApiError::Internal
            }
        }
    }
}

/// The body of every error but a 422: a stable `code` and a readable
/// `detail`. The OpenAPI description documents errors with this very type.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub code: &'static str,
    pub detail: String,
}

/// The body of a 422: `detail` names each invalid field.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ValidationErrorBody {
    pub code: &'static str,
    pub detail: Vec<FieldError>,
}

// The error responses as the OpenAPI description lists them, one type per
// status, so that each handler's annotation names exactly the ones it can give.

/// Malformed JSON or query string.
#[derive(utoipa::IntoResponses)]
#[response(status = 400)]
pub struct BadRequestResponse(pub ErrorBody);

/// Missing or wrong bearer token.
#[derive(utoipa::IntoResponses)]
#[response(status = 401)]
pub struct UnauthorizedResponse(pub ErrorBody);

/// An application token asked for what only the admin token may do.
#[derive(utoipa::IntoResponses)]
#[response(status = 403)]
pub struct ForbiddenResponse(pub ErrorBody);

/// No such application, endpoint, message, delivery or event type.
#[derive(utoipa::IntoResponses)]
#[response(status = 404)]
pub struct NotFoundResponse(pub ErrorBody);

/// A uid or eventId already taken, or a delivery not in a fitting state.
#[derive(utoipa::IntoResponses)]
#[response(status = 409)]
pub struct ConflictResponse(pub ErrorBody);

/// The body or the payload is over its limit.
#[derive(utoipa::IntoResponses)]
#[response(status = 413)]
pub struct PayloadTooLargeResponse(pub ErrorBody);

/// A field or query parameter is invalid; `detail` names it.
#[derive(utoipa::IntoResponses)]
#[response(status = 422)]
pub struct ValidationResponse(pub ValidationErrorBody);

/// Too many failed authentications from this address: wait `Retry-After`
/// seconds.
#[derive(utoipa::IntoResponses)]
#[response(status = 429, headers(("Retry-After" = u64, description = "Seconds to wait")))]
pub struct TooManyRequestsResponse(pub ErrorBody);

/// The store cannot be reached.
#[derive(utoipa::IntoResponses)]
#[response(status = 503)]
pub struct UnavailableResponse(pub ErrorBody);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = match &self {
            ApiError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            ApiError::Unauthorized => (StatusCode::UNAUTHORIZED, "authentication_failed"),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            ApiError::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            ApiError::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            ApiError::Validation(_) => (StatusCode::UNPROCESSABLE_ENTITY, "validation"),
            ApiError::TooManyRequests { .. } => {
                (StatusCode::TOO_MANY_REQUESTS, "too_many_requests")
            }
            ApiError::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            ApiError::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        let retry_after = match &self {
            ApiError::TooManyRequests { retry_after_secs } => Some(*retry_after_secs),
            _ => None,
        };
        let mut response = match self {
            ApiError::Validation(fields) => (
                status,
                axum::Json(ValidationErrorBody {
                    code,
                    detail: fields,
                }),
            )
                .into_response(),
            other => (
                status,
                axum::Json(ErrorBody {
                    code,
                    detail: other.to_string(),
                }),
            )
                .into_response(),
        };
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        if let Some(secs) = retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        response
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

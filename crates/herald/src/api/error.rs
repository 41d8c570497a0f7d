//! The one error type of the HTTP API. Its JSON body is Svix's shape,
//! `{"code", "detail"}`, and a 422's `detail` lists `{loc, msg, type}` per
//! field. Store errors are logged and never shown: clients see a generic
//! message, not database text.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::store::StoreError;

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
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
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("missing or invalid bearer token")]
    Unauthorized,
    #[error("{0} not found")]
    NotFound(&'static str),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error("validation failed")]
    Validation(Vec<FieldError>),
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

#[derive(Serialize)]
struct Body<'a, D: Serialize> {
    code: &'a str,
    detail: D,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = match &self {
            ApiError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            ApiError::Unauthorized => (StatusCode::UNAUTHORIZED, "authentication_failed"),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            ApiError::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            ApiError::Validation(_) => (StatusCode::UNPROCESSABLE_ENTITY, "validation"),
            ApiError::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            ApiError::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        let mut response = match self {
            ApiError::Validation(fields) => (
                status,
                axum::Json(Body {
                    code,
                    detail: fields,
                }),
            )
                .into_response(),
            other => (
                status,
                axum::Json(Body {
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
        response
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

//! Who is calling: the admin token (everything) or an application-scoped
//! token (its own application's resources only: 404 for any other
//! application, 403 for what no application token may do). Tokens are
//! kept as SHA-256 digests only.

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::{Duration, Instant};

use axum::extract::{Path, Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use rand::RngCore;
use serde::{Deserialize, Serialize};

use super::apps::find_app;
use super::error::{
    BadRequestResponse, ForbiddenResponse, NotFoundResponse, PayloadTooLargeResponse,
    UnauthorizedResponse, ValidationResponse,
};
use super::{rfc3339, token_sha256, ApiError, ApiResult, ApiState};
use crate::ids::AppId;
use crate::store::{now_millis, ApiToken};

/// The caller, as the token middleware found it (a request extension).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    Admin,
    App { app_id: AppId, token_id: String },
}

impl Principal {
    /// What Idempotency-Keys are unique within.
    pub fn scope(&self) -> &str {
        match self {
            Principal::Admin => "admin",
            Principal::App { token_id, .. } => token_id,
        }
    }
}

/// Application tokens by digest, so that a request does not cost a read.
/// Entries live 30 s: a token revoked through another process stops
/// working within that time (at once through this one).
#[derive(Default)]
pub struct TokenCache(RwLock<HashMap<[u8; 32], CachedToken>>);

/// A lookup's answer (None: no such token) and when it was made.
type CachedToken = (Option<ApiToken>, Instant);

impl TokenCache {
    const TTL: Duration = Duration::from_secs(30);
    const MAX_ENTRIES: usize = 10_000;

    fn get(&self, digest: &[u8; 32]) -> Option<Option<ApiToken>> {
        let map = self.0.read().unwrap_or_else(|p| p.into_inner());
        map.get(digest)
            .filter(|(_, at)| at.elapsed() < Self::TTL)
            .map(|(t, _)| t.clone())
    }

    fn put(&self, digest: [u8; 32], token: Option<ApiToken>) {
        let mut map = self.0.write().unwrap_or_else(|p| p.into_inner());
        if map.len() >= Self::MAX_ENTRIES {
            map.clear();
        }
        map.insert(digest, (token, Instant::now()));
    }

    pub fn clear(&self) {
        self.0.write().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

fn presented(request: &Request) -> Option<&str> {
    request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
}

/// The `/api/v1` middleware: 401 without a known token; for application
/// tokens, the route rules below.
pub async fn require_token(
    State(state): State<ApiState>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(token) = presented(&request) else {
        return ApiError::Unauthorized.into_response();
    };
    // Comparing digests: equal-length, and a timing difference reveals
    // nothing about the token itself.
    let digest = token_sha256(token);
    let principal = if digest == state.admin_token_sha256 {
        Principal::Admin
    } else {
        let found = match state.tokens.get(&digest) {
            Some(found) => found,
            None => match state.store.find_token(&hex::encode(digest)).await {
                Ok(found) => {
                    state.tokens.put(digest, found.clone());
                    found
                }
                Err(e) => return ApiError::from(e).into_response(),
            },
        };
        match found {
            Some(t) => Principal::App {
                app_id: t.app_id,
                token_id: t.id,
            },
            None => return ApiError::Unauthorized.into_response(),
        }
    };
    if let Principal::App { app_id, .. } = &principal {
        if let Err(e) = allowed(&state, app_id, request.method(), request.uri().path()).await {
            return e.into_response();
        }
    }
    request.extensions_mut().insert(principal);
    next.run(request).await
}

/// What an application token may reach (paths as seen inside `/api/v1`).
async fn allowed(state: &ApiState, own: &AppId, method: &Method, path: &str) -> ApiResult<()> {
    let mut parts = path.trim_start_matches('/').split('/');
    match (parts.next(), parts.next(), parts.next()) {
        (Some("app"), Some(app), rest) if !app.is_empty() => {
            if rest == Some("token") {
                return Err(ApiError::Forbidden(
                    "application tokens cannot manage tokens".into(),
                ));
            }
            // Another application's resources do not exist for this token.
            let named = match state.app_ids.get(app) {
                Some(id) => Some(id),
                None => state.store.get_app(app).await?.map(|a| a.id),
            };
            if named.as_ref() == Some(own) {
                Ok(())
            } else {
                Err(ApiError::NotFound("application"))
            }
        }
        (Some("app"), _, _) => Err(ApiError::Forbidden(
            "application tokens cannot list or create applications".into(),
        )),
        (Some("event-type"), _, _) if method == Method::GET => Ok(()),
        _ => Err(ApiError::Forbidden(
            "this route needs the admin token".into(),
        )),
    }
}

#[derive(Debug, Deserialize, Default, utoipa::ToSchema)]
pub struct TokenIn {
    #[serde(default)]
    #[schema(max_length = 256)]
    pub name: Option<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenOut {
    pub id: String,
    pub app_id: String,
    pub name: String,
    pub created_at: String,
    /// Only in the answer that creates it: it is not kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

impl From<ApiToken> for TokenOut {
    fn from(t: ApiToken) -> Self {
        TokenOut {
            id: t.id,
            app_id: t.app_id.into_string(),
            name: t.name,
            created_at: rfc3339(t.created_at),
            token: None,
        }
    }
}

/// `POST /app/{app}/token` (admin): a new application token, shown once.
#[utoipa::path(
    post,
    path = "/app/{app_id}/token",
    tag = "Token",
    params(("app_id" = String, Path, description = "The application's id (app_…) or uid")),
    request_body(content = ref("#/components/schemas/TokenIn"), description = "Optional; an empty body is fine"),
    responses(
        (status = 201, description = "Created; `token` is shown this once", body = TokenOut),
        BadRequestResponse, UnauthorizedResponse, ForbiddenResponse, NotFoundResponse,
        PayloadTooLargeResponse, ValidationResponse,
    )
)]
pub async fn create_token(
    State(state): State<ApiState>,
    Path(app_id): Path<String>,
    super::ApiJsonOrEmpty(body): super::ApiJsonOrEmpty<TokenIn>,
) -> ApiResult<Response> {
    let name = body.name.unwrap_or_default();
    if name.len() > 256 {
        return Err(ApiError::field("name", "must be at most 256 bytes"));
    }
    let app = find_app(&state, &app_id).await?;
    let mut raw = [0u8; 24];
    rand::thread_rng().fill_bytes(&mut raw);
    let secret = format!("hrld_app_{}", hex::encode(raw));
    let token = ApiToken {
        id: format!("tok_{}", ulid::Ulid::new()),
        app_id: app.id,
        name,
        created_at: now_millis(),
    };
    state
        .store
        .create_token(&token, &hex::encode(token_sha256(&secret)))
        .await?;
    let mut out = TokenOut::from(token);
    out.token = Some(secret);
    Ok((StatusCode::CREATED, Json(out)).into_response())
}

/// `GET /app/{app}/token` (admin): the app's tokens, without secrets.
#[utoipa::path(
    get,
    path = "/app/{app_id}/token",
    tag = "Token",
    params(("app_id" = String, Path, description = "The application's id (app_…) or uid")),
    responses(
        (status = 200, description = "The application's tokens, in one page", body = super::ListResponse<TokenOut>),
        UnauthorizedResponse, ForbiddenResponse, NotFoundResponse,
    )
)]
pub async fn list_tokens(
    State(state): State<ApiState>,
    Path(app_id): Path<String>,
) -> ApiResult<Json<super::ListResponse<TokenOut>>> {
    let app = find_app(&state, &app_id).await?;
    // An application has a handful of tokens: one page holds them all.
    let tokens = state.store.list_tokens(&app.id).await?;
    let data = tokens.into_iter().map(TokenOut::from).collect();
    Ok(Json(super::ListResponse::new(
        data,
        false,
        |t: &TokenOut| t.id.clone(),
    )))
}

/// `DELETE /app/{app}/token/{id}` (admin): revokes at once here, within
/// 30 s in other processes.
#[utoipa::path(
    delete,
    path = "/app/{app_id}/token/{token_id}",
    tag = "Token",
    params(("app_id" = String, Path, description = "The application's id (app_…) or uid"), ("token_id" = String, Path, description = "The token's id (tok_…)")),
    responses(
        (status = 204, description = "Revoked"),
        UnauthorizedResponse, ForbiddenResponse, NotFoundResponse,
    )
)]
pub async fn delete_token(
    State(state): State<ApiState>,
    Path((app_id, token_id)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let app = find_app(&state, &app_id).await?;
    if !state.store.delete_token(&app.id, &token_id).await? {
        return Err(ApiError::NotFound("token"));
    }
    state.tokens.clear();
    Ok(StatusCode::NO_CONTENT)
}

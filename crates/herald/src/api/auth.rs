//! Who is calling: the admin token (everything) or an application-scoped
//! token (its own application's resources only: 404 for any other
//! application, 403 for what no application token may do). Tokens are
//! kept as SHA-256 digests only.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::RwLock;
use std::time::{Duration, Instant};

use axum::extract::{
    ConnectInfo, FromRequestParts, MatchedPath, Path, RawPathParams, Request, State,
};
use axum::http::request::Parts;
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use rand::RngCore;
use serde::{Deserialize, Serialize};

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

/// Tokens that have authenticated from an address, by digest, a few per
/// address. While an address is throttled for its failures, a request that
/// presents one of them is still checked (and served): someone failing
/// from the same address (a shared NAT, a proxy) does not lock out a client
/// that already proved its token there, and no guess is ever checked early,
/// since only a digest that authenticated from that very address before
/// passes. Any other token waits like a guess.
#[derive(Default)]
pub struct KnownTokens(RwLock<HashMap<IpAddr, Vec<[u8; 32]>>>);

impl KnownTokens {
    const PER_ADDRESS: usize = 8;
    const MAX_ADDRESSES: usize = 10_000;

    fn contains(&self, ip: IpAddr, digest: &[u8; 32]) -> bool {
        let map = self.0.read().unwrap_or_else(|p| p.into_inner());
        map.get(&ip).is_some_and(|known| known.contains(digest))
    }

    fn remember(&self, ip: IpAddr, digest: [u8; 32]) {
        // Every authenticated request comes here: a read lock unless the
        // token is new from this address.
        if self.contains(ip, &digest) {
            return;
        }
        let mut map = self.0.write().unwrap_or_else(|p| p.into_inner());
        if map.len() >= Self::MAX_ADDRESSES && !map.contains_key(&ip) {
            map.clear();
        }
        let known = map.entry(ip).or_default();
        if !known.contains(&digest) {
            if known.len() >= Self::PER_ADDRESS {
                known.remove(0);
            }
            known.push(digest);
        }
    }
}

/// The application a `/app/{app_id}/…` path names, resolved once by
/// [`require_token`] when the request's headers arrived, for admin and
/// application tokens alike. Handlers act on this id and never look the
/// path's id or uid up again: a request whose body is held while the uid
/// moves to another application still acts on the one it was allowed for
/// (or fails, if that one is gone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedApp {
    pub id: AppId,
}

/// The `PUT /app/{app_id}` variant of [`ResolvedApp`]: `None` when the path
/// named no application (the upsert then creates one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaybeResolvedApp(pub Option<AppId>);

/// What the middleware found for the path's `{app_id}` (a request
/// extension; `None`: no such application).
#[derive(Debug, Clone)]
struct AppLookup(Option<AppId>);

fn app_lookup(parts: &Parts) -> ApiResult<&AppLookup> {
    parts.extensions.get::<AppLookup>().ok_or_else(|| {
        // A route with `{app_id}` always passes through `require_token`.
        tracing::error!(path = %parts.uri.path(), "no resolved application for this route");
        ApiError::Internal
    })
}

impl<S: Send + Sync> FromRequestParts<S> for ResolvedApp {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        match app_lookup(parts)? {
            AppLookup(Some(id)) => Ok(ResolvedApp { id: id.clone() }),
            AppLookup(None) => Err(ApiError::NotFound("application")),
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for MaybeResolvedApp {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(MaybeResolvedApp(app_lookup(parts)?.0.clone()))
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
        .filter(|t| !t.is_empty())
}

/// The address the request came from (the proxy's, behind one); all
/// requests without one (a router served without connect info) share one.
fn client_ip(request: &Request) -> IpAddr {
    request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::from([0, 0, 0, 0]), |c| c.0.ip())
}

/// The `/api/v1` middleware: 401 without a known token (429 after too many
/// failures from the caller's address); resolves the path's `{app_id}`
/// ([`ResolvedApp`]); for application tokens, the route rules below.
pub async fn require_token(
    State(state): State<ApiState>,
    request: Request,
    next: Next,
) -> Response {
    let Some(token) = presented(&request) else {
        return ApiError::Unauthorized.into_response();
    };
    // Comparing digests: equal-length, and a timing difference reveals
    // nothing about the token itself.
    let digest = token_sha256(token);
    let client = client_ip(&request);
    if let Err(wait) = state.auth_failures.check(client) {
        if !state.known_tokens.contains(client, &digest) {
            tracing::debug!(client = %client, "API authentication refused: too many failures");
            let retry_after_secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            return ApiError::TooManyRequests {
                retry_after_secs: retry_after_secs.max(1),
            }
            .into_response();
        }
    }
    let principal = match authenticate(&state, &digest).await {
        Ok(Some(principal)) => principal,
        Ok(None) => {
            state.auth_failures.failed(client);
            tracing::info!(client = %client, "API authentication failed: unknown bearer token");
            return ApiError::Unauthorized.into_response();
        }
        Err(e) => return e.into_response(),
    };
    state.known_tokens.remember(client, digest);
    if let Err(wait) = state.rate_limit.check(principal.scope()) {
        return ApiError::TooManyRequests {
            retry_after_secs: crate::limits::retry_after_secs(wait),
        }
        .into_response();
    }

    let (mut parts, body) = request.into_parts();
    let lookup = match resolve_path_app(&state, &mut parts).await {
        Ok(lookup) => lookup,
        Err(e) => return e.into_response(),
    };
    if let Principal::App { app_id, .. } = &principal {
        if let Err(e) = allowed(app_id, &parts.method, parts.uri.path(), lookup.as_ref()) {
            return e.into_response();
        }
    }
    if let Some(lookup) = lookup {
        parts.extensions.insert(lookup);
    }
    parts.extensions.insert(principal);
    next.run(Request::from_parts(parts, body)).await
}

/// The principal a token digest names, if any.
async fn authenticate(state: &ApiState, digest: &[u8; 32]) -> ApiResult<Option<Principal>> {
    if *digest == state.admin_token_sha256 {
        return Ok(Some(Principal::Admin));
    }
    let found = match state.tokens.get(digest) {
        Some(found) => found,
        None => {
            let found = state.store.find_token(&hex::encode(digest)).await?;
            state.tokens.put(*digest, found.clone());
            found
        }
    };
    Ok(found.map(|t| Principal::App {
        app_id: t.app_id,
        token_id: t.id,
    }))
}

/// The application named by the route's `{app_id}` (`None` when the route
/// has none). Creating a message, the hot path, reads the id-or-uid cache
/// (no database read); every other route reads the store.
async fn resolve_path_app(state: &ApiState, parts: &mut Parts) -> ApiResult<Option<AppLookup>> {
    // Checked by `super::path_params_are_text` before: readable text.
    let Ok(params) = RawPathParams::from_request_parts(parts, state).await else {
        return Ok(None);
    };
    let Some((_, key)) = params.iter().find(|(name, _)| *name == "app_id") else {
        return Ok(None);
    };
    let creates_message = parts.method == Method::POST
        && parts
            .extensions
            .get::<MatchedPath>()
            .is_some_and(|m| m.as_str().ends_with("/app/{app_id}/msg"));
    if creates_message {
        if let Some(id) = state.app_ids.get(key) {
            return Ok(Some(AppLookup(Some(id))));
        }
    }
    let found = state.store.get_app(key).await?.map(|a| a.id);
    if creates_message {
        if let Some(id) = &found {
            state.app_ids.put(key, id.clone());
        }
    }
    Ok(Some(AppLookup(found)))
}

/// What an application token may reach (paths as seen inside `/api/v1`);
/// `named` is what the route's `{app_id}` resolved to, if it has one.
fn allowed(own: &AppId, method: &Method, path: &str, named: Option<&AppLookup>) -> ApiResult<()> {
    let mut parts = path.strip_prefix('/').unwrap_or(path).split('/');
    match (parts.next(), parts.next(), parts.next()) {
        (Some("app"), Some(app), rest) if !app.is_empty() => {
            if rest == Some("token") {
                return Err(ApiError::Forbidden(
                    "application tokens cannot manage tokens".into(),
                ));
            }
            // Another application's resources do not exist for this token
            // (nor does a path under /app/… that no route serves).
            match named {
                Some(AppLookup(Some(id))) if id == own => Ok(()),
                _ => Err(ApiError::NotFound("application")),
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
    /// No control characters.
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
    actor: crate::audit::Actor,
    app: ResolvedApp,
    super::ApiJsonOrEmpty(body): super::ApiJsonOrEmpty<TokenIn>,
) -> ApiResult<Response> {
    let name = body.name.unwrap_or_default();
    super::check_line(&["body", "name"], &name, super::MAX_NAME_CHARS)?;
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
    // The token's id, never the token.
    actor
        .record(
            &*state.store,
            "token.created",
            Some(&token.app_id),
            &token.id,
            serde_json::Value::Null,
        )
        .await;
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
    app: ResolvedApp,
) -> ApiResult<Json<super::ListResponse<TokenOut>>> {
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
    actor: crate::audit::Actor,
    app: ResolvedApp,
    Path((_app_id, token_id)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    if !state.store.delete_token(&app.id, &token_id).await? {
        return Err(ApiError::NotFound("token"));
    }
    state.tokens.clear();
    actor
        .record(
            &*state.store,
            "token.revoked",
            Some(&app.id),
            &token_id,
            serde_json::Value::Null,
        )
        .await;
    Ok(StatusCode::NO_CONTENT)
}

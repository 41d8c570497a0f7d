//! Who is calling: the admin token (everything) or an application-scoped
//! token (its own application's resources only: 404 for any other
//! application, 403 for what no application token may do). Tokens are
//! kept as SHA-256 digests only.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

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

use super::error::{ForbiddenResponse, NotFoundResponse};
use super::{rfc3339, token_sha256, ApiError, ApiResult, ApiState};
use crate::audit::Actor;
use crate::ids::AppId;
use crate::store::{now_millis, ActorKind, ApiToken};

/// The caller, as the token middleware found it (a request extension).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    Admin,
    App {
        app_id: AppId,
        token_id: String,
        /// A portal token's capabilities; None: an ordinary application
        /// token (everything an application token may do).
        capabilities: Option<Capabilities>,
        /// The feature flags the token was minted with (a portal link's
        /// `featureFlags`): which flagged event types it sees.
        feature_flags: Vec<String>,
    },
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

/// Application tokens by digest (None: no such token). A token revoked or
/// expired early (`expire-all`, `logout`, its app deleted) clears the
/// cache of the process that did it, and through the store
/// ([`crate::store::Tokens::announce_token_change`]) of the others sharing
/// it; entries end with their life all the same, which bounds how long a
/// process that missed the news (its listening connection down) keeps one.
/// A token's own expiry is checked on every use, cached or not.
pub type TokenCache = super::lookups::Lookups<[u8; 32], Option<ApiToken>>;

/// Clears `tokens` and `app_ids` whenever `changed` is signalled (another
/// process announced a token change or an application's names changing),
/// until `shutdown`.
pub async fn clear_caches_on(
    tokens: std::sync::Arc<TokenCache>,
    app_ids: std::sync::Arc<super::AppIdCache>,
    changed: std::sync::Arc<tokio::sync::Notify>,
    shutdown: tokio_util::sync::CancellationToken,
) {
    loop {
        tokio::select! {
            _ = changed.notified() => {
                tokens.clear();
                app_ids.clear();
            }
            _ = shutdown.cancelled() => return,
        }
    }
}

/// Tokens were revoked or ended: this process forgets its cached lookups
/// at once, and tells the others sharing the store to (should that fail,
/// their entries still end within the cache's 30 s).
pub async fn tokens_changed(state: &ApiState) {
    state.tokens.clear();
    if let Err(e) = state.store.announce_token_change().await {
        tracing::warn!(error = %e, "cannot tell the other processes that tokens changed; their cached lookups end within 30 s");
    }
}

/// An application was deleted or its uid changed: this process forgets
/// what it cached of it, and tells the others sharing the store (the
/// token-change announcement, which clears both their caches), so that
/// none keeps sending messages for that uid to it.
pub async fn app_names_changed(state: &ApiState, app: &AppId) {
    state.app_ids.forget_where(|id| id == app);
    tokens_changed(state).await;
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

impl ResolvedApp {
    /// The application the path names (as [`ResolvedApp`] allows it) and
    /// the path parameter `name`, for the extractors of what lives in it
    /// (`endpoints::PathEndpoint`, `messages::PathMessage`).
    pub(crate) async fn with_path_param<S: Send + Sync>(
        parts: &mut Parts,
        state: &S,
        name: &'static str,
    ) -> ApiResult<(ResolvedApp, String)> {
        let app = ResolvedApp::from_request_parts(parts, state).await?;
        let Path(mut params) = Path::<HashMap<String, String>>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::BadRequest(e.body_text()))?;
        let value = params.remove(name).ok_or_else(|| {
            // Only routes whose template has `name` use these extractors.
            tracing::error!(path = %parts.uri.path(), name, "a path parameter the route lacks");
            ApiError::Internal
        })?;
        Ok((app, value))
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

/// The longest a wrong token's 401 is held back once its address is past
/// `HERALD_AUTH_FAILURE_LIMIT`: enough to make guessing slow, short enough
/// that a client with a stale token is not stuck behind its own retries.
const FAILURE_DELAY_MAX: Duration = Duration::from_secs(1);

/// The `/api/v1` middleware: 401 without a known token; resolves the path's
/// `{app_id}` ([`ResolvedApp`]); for application tokens, the route rules
/// below.
///
/// A token is always checked, whatever its address did before: a valid one
/// is never refused for other clients' failures (behind a NAT or a reverse
/// proxy every client shares one address), and a wrong one is always told
/// 401. Failures are counted per address; past `HERALD_AUTH_FAILURE_LIMIT`
/// in a burst each further wrong token's 401 is slowed (up to
/// [`FAILURE_DELAY_MAX`]), which is what makes guessing expensive.
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
    let principal = match authenticate(&state, &digest).await {
        Ok(Some(principal)) => principal,
        Ok(None) => {
            let over_the_limit = state.auth_failures.check(client).err();
            state.auth_failures.failed(client);
            tracing::info!(client = %client, "API authentication failed: unknown bearer token");
            if let Some(wait) = over_the_limit {
                tokio::time::sleep(wait.min(FAILURE_DELAY_MAX)).await;
            }
            return ApiError::Unauthorized.into_response();
        }
        Err(e) => return e.into_response(),
    };
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
    if let Principal::App {
        app_id,
        capabilities,
        ..
    } = &principal
    {
        let path = parts.uri.path();
        let checked =
            allowed(app_id, &parts.method, path, lookup.as_ref()).and_then(
                |()| match capabilities {
                    Some(caps) => caps.allow_api(&parts.method, path),
                    None => Ok(()),
                },
            );
        if let Err(e) = checked {
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
        Ok(found) => found,
        Err(miss) => {
            let found = state.store.find_token(&hex::encode(digest)).await?;
            state.tokens.put(*digest, found.clone(), miss);
            found
        }
    };
    // Expiry is checked on every use: a cached token is no exception.
    Ok(found
        .filter(|t| t.live_at(now_millis()))
        .map(|t| Principal::App {
            capabilities: t.capabilities.as_deref().map(Capabilities::parse_stored),
            feature_flags: stored_flags(&t.feature_flags),
            app_id: t.app_id,
            token_id: t.id,
        }))
}

/// A token's feature flags as stored (comma-separated, no flag holds a
/// comma: `app_portal_access` refuses one).
pub fn stored_flags(text: &str) -> Vec<String> {
    text.split(',')
        .filter(|f| !f.is_empty())
        .map(str::to_owned)
        .collect()
}

impl Principal {
    /// The feature flags whose event types this caller sees; None: all
    /// of them (the admin token).
    pub fn feature_flags(&self) -> Option<&[String]> {
        match self {
            Principal::Admin => None,
            Principal::App { feature_flags, .. } => Some(feature_flags),
        }
    }
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
        if let Ok(id) = state.app_ids.get(key) {
            return Ok(Some(AppLookup(Some(id))));
        }
    }
    let miss = state.app_ids.miss();
    let found = state.store.get_app(key).await?.map(|a| a.id);
    if creates_message {
        if let Some(id) = &found {
            state.app_ids.put(key.to_owned(), id.clone(), miss);
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
                Some(AppLookup(Some(id))) if id == own => {}
                _ => return Err(ApiError::NotFound("application")),
            }
            // The application itself (its uid, by which the operator finds
            // it and sends it messages, and its existence) is the
            // operator's: a token may read it, never change or delete it.
            let reads = method == Method::GET || method == Method::HEAD;
            if rest.is_none() && !reads {
                return Err(ApiError::Forbidden(
                    "application tokens cannot change or delete their application".into(),
                ));
            }
            Ok(())
        }
        (Some("app"), _, _) => Err(ApiError::Forbidden(
            "application tokens cannot list or create applications".into(),
        )),
        (Some("event-type"), _, _) if method == Method::GET => Ok(()),
        // Svix: an application token may log itself out.
        (Some("auth"), Some("logout"), None) if method == Method::POST => Ok(()),
        _ => Err(ApiError::Forbidden(
            "this route needs the admin token".into(),
        )),
    }
}

#[derive(Debug, Deserialize, Default, utoipa::ToSchema)]
pub struct TokenIn {
    /// No control characters.
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

/// `POST /app/{app}/token` (admin): a new application token, shown once
/// (routed through [`super::apps::create_app_token`], which documents it).
pub async fn create_token(
    State(state): State<ApiState>,
    actor: crate::audit::Actor,
    app: ResolvedApp,
    super::ApiJsonOrEmpty(body): super::ApiJsonOrEmpty<TokenIn>,
) -> ApiResult<Response> {
    let name = body.name.unwrap_or_default();
    super::check_line(&["body", "name"], &name, super::MAX_NAME_CHARS)?;
    let secret = format!("hrld_app_{}", random_hex(24));
    let token = ApiToken::plain(
        format!("tok_{}", ulid::Ulid::new()),
        app.id,
        name,
        now_millis(),
    );
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
    Ok(super::idempotency::shown_once((
        StatusCode::CREATED,
        Json(out),
    )))
}

/// `GET /app/{app}/token` (admin): the app's tokens, without secrets.
#[utoipa::path(
    get,
    path = "/app/{app_id}/token",
    tag = "Token",
    params(super::ListParams),
    responses(
        (status = 200, description = "A page of the application's tokens", body = super::ListResponse<TokenOut>),
        ForbiddenResponse, NotFoundResponse,
    )
)]
pub async fn list_tokens(
    State(state): State<ApiState>,
    app: ResolvedApp,
    super::ApiQuery(params): super::ApiQuery<super::ListParams>,
) -> ApiResult<Json<super::ListResponse<TokenOut>>> {
    let page = params.page(true)?;
    // Read whole (an application's tokens are few, a portal link's expire)
    // and paged here, as every other list pages.
    let tokens = state.store.list_tokens(&app.id).await?;
    let data = tokens.into_iter().map(TokenOut::from).collect();
    Ok(Json(super::ListResponse::page_of_all(
        data,
        &page,
        |t: &TokenOut| t.id.clone(),
    )))
}

/// `DELETE /app/{app}/token/{id}` (admin): revokes at once, here and (told
/// through the store) in the other processes.
#[utoipa::path(
    delete,
    path = "/app/{app_id}/token/{token_id}",
    tag = "Token",
    responses(
        (status = 204, description = "Revoked"),
        ForbiddenResponse, NotFoundResponse,
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
    tokens_changed(&state).await;
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

/// Svix's app-portal capabilities. `ManageTransformations` is accepted, as
/// Svix accepts it, and grants nothing here (Herald has no transformations).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Deserialize,
    Serialize,
    utoipa::ToSchema,
)]
pub enum Capability {
    ViewBase,
    ViewEndpointSecret,
    ManageEndpointSecret,
    ManageTransformations,
    CreateAttempts,
    ManageEndpoint,
}

impl Capability {
    pub const ALL: [Capability; 6] = [
        Capability::ViewBase,
        Capability::ViewEndpointSecret,
        Capability::ManageEndpointSecret,
        Capability::ManageTransformations,
        Capability::CreateAttempts,
        Capability::ManageEndpoint,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Capability::ViewBase => "ViewBase",
            Capability::ViewEndpointSecret => "ViewEndpointSecret",
            Capability::ManageEndpointSecret => "ManageEndpointSecret",
            Capability::ManageTransformations => "ManageTransformations",
            Capability::CreateAttempts => "CreateAttempts",
            Capability::ManageEndpoint => "ManageEndpoint",
        }
    }
}

/// What a portal token or session may do. `ViewBase` is always in it;
/// `ManageEndpoint` implies viewing and rotating the secret (Svix: "read
/// and modify any field of an endpoint, including secrets").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities(BTreeSet<Capability>);

impl Capabilities {
    pub fn all() -> Self {
        Capabilities(Capability::ALL.into_iter().collect())
    }

    pub fn read_only() -> Self {
        Capabilities([Capability::ViewBase].into_iter().collect())
    }

    /// Svix's rules: `readOnly: true` is `ViewBase` alone; else the
    /// capabilities given (with `ViewBase`); neither: all of them.
    pub fn requested(read_only: Option<bool>, capabilities: Option<&[Capability]>) -> Self {
        match (read_only, capabilities) {
            (Some(true), _) => Self::read_only(),
            (_, Some(given)) => {
                let mut set: BTreeSet<Capability> = given.iter().copied().collect();
                set.insert(Capability::ViewBase);
                Capabilities(set)
            }
            (_, None) => Self::all(),
        }
    }

    /// As stored (`to_stored`); unknown names are dropped.
    pub fn parse_stored(text: &str) -> Self {
        let mut set: BTreeSet<Capability> = text
            .split(',')
            .filter_map(|name| Capability::ALL.into_iter().find(|c| c.name() == name))
            .collect();
        set.insert(Capability::ViewBase);
        Capabilities(set)
    }

    pub fn to_stored(&self) -> String {
        self.names().join(",")
    }

    pub fn names(&self) -> Vec<&'static str> {
        self.0.iter().map(|c| c.name()).collect()
    }

    pub fn has(&self, c: Capability) -> bool {
        self.0.contains(&c)
    }

    pub fn view_secret(&self) -> bool {
        self.has(Capability::ViewEndpointSecret) || self.rotate_secret()
    }

    pub fn rotate_secret(&self) -> bool {
        self.has(Capability::ManageEndpointSecret) || self.manage_endpoint()
    }

    pub fn manage_endpoint(&self) -> bool {
        self.has(Capability::ManageEndpoint)
    }

    pub fn create_attempts(&self) -> bool {
        self.has(Capability::CreateAttempts)
    }

    /// 403 naming the capability `allowed` lacks.
    pub fn need(allowed: bool, capability: Capability) -> ApiResult<()> {
        if allowed {
            Ok(())
        } else {
            Err(ApiError::Forbidden(format!(
                "this token lacks the {} capability",
                capability.name()
            )))
        }
    }

    /// What a portal token may call in the API (a path inside `/api/v1`
    /// already allowed to an application token): reads need `ViewBase`
    /// (the secret, a secret capability); endpoint changes
    /// `ManageEndpoint`; rotation `ManageEndpointSecret`; sending,
    /// recovering, resending and replaying `CreateAttempts`. Anything else
    /// that changes something (a message, the application, expunging) is
    /// refused to portal tokens.
    pub fn allow_api(&self, method: &Method, path: &str) -> ApiResult<()> {
        use Capability::*;
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let read = method == Method::GET || method == Method::HEAD;
        match (read, segments.as_slice()) {
            (false, ["auth", "logout"]) => Ok(()),
            (true, ["app", _, "endpoint", _, "secret"]) => {
                Self::need(self.view_secret(), ViewEndpointSecret)
            }
            (true, _) => Ok(()),
            (false, ["app", _, "endpoint", _, "secret", "rotate"]) => {
                Self::need(self.rotate_secret(), ManageEndpointSecret)
            }
            (false, ["app", _, "endpoint"])
            | (false, ["app", _, "endpoint", _])
            | (false, ["app", _, "endpoint", _, "headers" | "enable" | "disable"]) => {
                Self::need(self.manage_endpoint(), ManageEndpoint)
            }
            (false, ["app", _, "endpoint", _, "recover" | "replay-missing" | "send-example"])
            | (false, ["app", _, "endpoint", _, "dead-letter", "replay"])
            | (false, ["app", _, "msg", _, "endpoint", _, "resend"])
            | (false, ["app", _, "dead-letter", _, "replay"]) => {
                Self::need(self.create_attempts(), CreateAttempts)
            }
            _ => Err(ApiError::Forbidden(
                "a portal token cannot make this change".into(),
            )),
        }
    }
}

/// `bytes` random bytes as hex: every secret Herald makes (tokens, portal
/// codes, session ids, CSRF tokens).
pub fn random_hex(bytes: usize) -> String {
    let mut raw = vec![0u8; bytes];
    rand::thread_rng().fill_bytes(&mut raw);
    hex::encode(raw)
}

/// 403, audited as `token.refused`, when `app` is Herald's operator
/// application: a token or portal link of its own would read the operator
/// endpoint's secret (so forge signed operator events) and send examples
/// through the one unguarded destination. `route` names what was asked.
pub(super) async fn refuse_for_operator_app(
    state: &ApiState,
    actor: &crate::audit::Actor,
    app: &AppId,
    route: &str,
) -> ApiResult<()> {
    if !state.operator.owns(app).await? {
        return Ok(());
    }
    actor
        .record(
            &*state.store,
            "token.refused",
            Some(app),
            app.as_str(),
            serde_json::json!({ "route": route, "reason": "operator application" }),
        )
        .await;
    Err(ApiError::Forbidden(
        "the operator application is Herald's: no application token or portal access can be made for it"
            .into(),
    ))
}

/// The audit log's view of an API caller.
impl Actor {
    pub fn of_principal(principal: &Principal, source: IpAddr) -> Self {
        match principal {
            Principal::Admin => Actor {
                kind: ActorKind::Admin,
                id: "admin".to_owned(),
                source,
            },
            Principal::App { token_id, .. } => Actor {
                kind: ActorKind::AppToken,
                id: token_id.clone(),
                source,
            },
        }
    }
}

/// The caller of an `/api/v1` route, as the token middleware found it.
impl<S: Send + Sync> FromRequestParts<S> for Actor {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let principal = parts.extensions.get::<Principal>().ok_or_else(|| {
            tracing::error!(path = %parts.uri.path(), "no principal for an audited route");
            ApiError::Internal
        })?;
        Ok(Actor::of_principal(
            principal,
            crate::audit::client_ip(parts),
        ))
    }
}

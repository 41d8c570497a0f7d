//! The auth routes (Svix's): a customer portal link (`app-portal-access`,
//! `dashboard-access`), ending an application's portal sessions
//! (`expire-all`) and a token's (`logout`).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::error::{ForbiddenResponse, NotFoundResponse};
use super::{rfc3339, token_sha256, ApiError, ApiResult, ApiState};
use crate::ids::AppId;
use crate::store::{now_millis, ApiToken};

use super::auth::{
    random_hex, refuse_for_operator_app, tokens_changed, Capabilities, Capability,
    MaybeResolvedApp, Principal, ResolvedApp,
};

/// Shortest and longest life of a portal link (Svix's bounds), and its
/// default.
const MIN_EXPIRY_SECS: u64 = 3600;
const MAX_EXPIRY_SECS: u64 = 7 * 24 * 3600;
/// Where a portal link lands (the code in its query is exchanged there).
pub const PORTAL_LOGIN_PATH: &str = "/portal/login";

/// Svix's `AppPortalAccessIn`.
#[derive(Debug, Deserialize, Default, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppPortalAccessIn {
    /// Creates the application when the path's id or uid names none (its
    /// `uid` must be the path's); ignored when it exists.
    pub application: Option<super::apps::ApplicationIn>,
    /// Deprecated (Svix): `true` is `capabilities: ["ViewBase"]`.
    pub read_only: Option<bool>,
    /// What the token and the portal may do; absent (and no `readOnly`):
    /// all of them. `ViewBase` is always added.
    pub capabilities: Option<Vec<Capability>>,
    /// The flagged event types the token and the portal see (Svix): a
    /// type with feature flags is hidden unless all of them are here.
    pub feature_flags: Option<Vec<String>>,
    /// Seconds until the token, the link and its sessions expire:
    /// 3600..=604800 (default 604800, 7 days).
    #[schema(minimum = 3600, maximum = 604800)]
    pub expiry: Option<u64>,
    /// Tags the token, so that `expire-all` can end it by this id.
    #[schema(max_length = 256)]
    pub session_id: Option<String>,
}

/// Svix's `AppPortalAccessOut`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AppPortalAccessOut {
    /// Opens the portal once: its one-time code is exchanged for a browser
    /// session at the first visit.
    pub url: String,
    /// An application token of the app, with the link's capabilities and
    /// expiry.
    pub token: String,
}

/// Svix's `ApplicationTokenExpireIn`.
#[derive(Debug, Deserialize, Default, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationTokenExpireIn {
    /// Seconds from now: 0..=604800 (default 0, at once).
    #[schema(minimum = 0, maximum = 604800)]
    pub expiry: Option<i64>,
    /// Only tokens minted with one of these `sessionId`s (absent or
    /// empty: all of the application's tokens).
    pub session_ids: Option<Vec<String>>,
}

/// `POST /auth/app-portal-access/{app_id}` (admin): a portal link and its
/// token.
#[utoipa::path(
    post,
    path = "/auth/app-portal-access/{app_id}",
    tag = "Authentication",
    request_body(content = ref("#/components/schemas/AppPortalAccessIn"), description = "Optional; an empty body is all capabilities for 7 days"),
    responses(
        (status = 200, description = "The link (single use) and the token", body = AppPortalAccessOut),
        ForbiddenResponse, NotFoundResponse,
    )
)]
pub async fn app_portal_access(
    State(state): State<ApiState>,
    actor: crate::audit::Actor,
    Path(app_key): Path<String>,
    app: MaybeResolvedApp,
    super::ApiJsonOrEmpty(body): super::ApiJsonOrEmpty<AppPortalAccessIn>,
) -> ApiResult<Response> {
    let expiry = body.expiry.unwrap_or(MAX_EXPIRY_SECS);
    if !(MIN_EXPIRY_SECS..=MAX_EXPIRY_SECS).contains(&expiry) {
        return Err(ApiError::field(
            "expiry",
            format!("must be {MIN_EXPIRY_SECS}..={MAX_EXPIRY_SECS} seconds"),
        ));
    }
    if let Some(id) = &body.session_id {
        super::check_line(&["body", "sessionId"], id, super::MAX_NAME_CHARS)?;
    }
    let flags = body.feature_flags.unwrap_or_default();
    for (i, flag) in flags.iter().enumerate() {
        let at = i.to_string();
        super::check_line(&["body", "featureFlags", &at], flag, super::MAX_NAME_CHARS)?;
        if flag.contains(',') {
            return Err(ApiError::Validation(vec![super::FieldError::at(
                &["body", "featureFlags", &at],
                "must not contain ','",
            )]));
        }
    }
    let app_id = match (app.0, &body.application) {
        (Some(id), _) => id,
        (None, None) => return Err(ApiError::NotFound("application")),
        (None, Some(inline)) => create_inline_app(&state, &actor, &app_key, inline).await?,
    };
    let capabilities = Capabilities::requested(body.read_only, body.capabilities.as_deref());
    let out = mint_portal_access(
        &state,
        &actor,
        app_id,
        &capabilities,
        expiry,
        body.session_id,
        flags.join(","),
    )
    .await?;
    Ok(super::idempotency::shown_once(Json(out)))
}

/// `POST /auth/dashboard-access/{app_id}` (admin): Svix's deprecated
/// alias of app-portal-access with its defaults.
#[utoipa::path(
    post,
    path = "/auth/dashboard-access/{app_id}",
    tag = "Authentication",
    responses(
        (status = 200, description = "The link (single use) and the token", body = AppPortalAccessOut),
        ForbiddenResponse, NotFoundResponse,
    )
)]
pub async fn dashboard_access(
    State(state): State<ApiState>,
    actor: crate::audit::Actor,
    app: ResolvedApp,
) -> ApiResult<Response> {
    let out = mint_portal_access(
        &state,
        &actor,
        app.id,
        &Capabilities::all(),
        MAX_EXPIRY_SECS,
        None,
        String::new(),
    )
    .await?;
    Ok(super::idempotency::shown_once(Json(out)))
}

/// Creates the application of an app-portal-access request's
/// `application` (the rules of a message's inline application).
async fn create_inline_app(
    state: &ApiState,
    actor: &crate::audit::Actor,
    key: &str,
    inline: &super::apps::ApplicationIn,
) -> ApiResult<AppId> {
    let app = super::messages::inline_app(key, inline, now_millis())?;
    match state.store.create_app(&app).await {
        Ok(()) => {
            super::messages::record_inline_app_created(state, actor, &app.id).await;
            Ok(app.id)
        }
        // A concurrent request made it first: that one is the app.
        Err(crate::store::StoreError::Conflict(_)) => state
            .store
            .get_app(key)
            .await?
            .map(|a| a.id)
            .ok_or(ApiError::NotFound("application")),
        Err(e) => Err(e.into()),
    }
}

/// A portal token and its link's one-time code, stored together.
async fn mint_portal_access(
    state: &ApiState,
    actor: &crate::audit::Actor,
    app_id: AppId,
    capabilities: &Capabilities,
    expiry_secs: u64,
    session_id: Option<String>,
    feature_flags: String,
) -> ApiResult<AppPortalAccessOut> {
    refuse_for_operator_app(state, actor, &app_id, "portal-access").await?;
    let now = now_millis();
    let expires_at = now.saturating_add(i64::try_from(expiry_secs * 1000).unwrap_or(i64::MAX));
    let secret = format!("hrld_app_{}", random_hex(24));
    let code = random_hex(32);
    let token = ApiToken {
        expires_at: Some(expires_at),
        capabilities: Some(capabilities.to_stored()),
        session_id,
        feature_flags,
        ..ApiToken::plain(
            format!("tok_{}", ulid::Ulid::new()),
            app_id,
            "app-portal-access".to_owned(),
            now,
        )
    };
    state
        .store
        .create_portal_token(
            &token,
            &hex::encode(token_sha256(&secret)),
            &hex::encode(token_sha256(&code)),
        )
        .await?;
    // The token's id, never the token or the code.
    actor
        .record(
            &*state.store,
            "token.portal_access",
            Some(&token.app_id),
            &token.id,
            serde_json::json!({
                "capabilities": capabilities.names(),
                "expiresAt": rfc3339(expires_at),
                "sessionId": token.session_id,
            }),
        )
        .await;
    Ok(AppPortalAccessOut {
        url: format!(
            "{}{PORTAL_LOGIN_PATH}?code={code}",
            state.public_url.trim_end_matches('/')
        ),
        token: secret,
    })
}

/// `POST /auth/app/{app_id}/expire-all` (admin): ends the application's
/// tokens (or those of the given `sessionIds`) and the portal sessions
/// made from them, `expiry` seconds from now.
#[utoipa::path(
    post,
    path = "/auth/app/{app_id}/expire-all",
    tag = "Authentication",
    request_body(content = ref("#/components/schemas/ApplicationTokenExpireIn"), description = "Optional; an empty body ends them all at once"),
    responses(
        (status = 204, description = "They expire then"),
        ForbiddenResponse, NotFoundResponse,
    )
)]
pub async fn expire_all(
    State(state): State<ApiState>,
    actor: crate::audit::Actor,
    app: ResolvedApp,
    super::ApiJsonOrEmpty(body): super::ApiJsonOrEmpty<ApplicationTokenExpireIn>,
) -> ApiResult<StatusCode> {
    let expiry = body.expiry.unwrap_or(0);
    let max = i64::try_from(MAX_EXPIRY_SECS).unwrap_or(i64::MAX);
    if !(0..=max).contains(&expiry) {
        return Err(ApiError::field(
            "expiry",
            format!("must be 0..={max} seconds"),
        ));
    }
    let session_ids = body.session_ids.filter(|ids| !ids.is_empty());
    if let Some(ids) = &session_ids {
        for (i, id) in ids.iter().enumerate() {
            super::check_line(
                &["body", "sessionIds", &i.to_string()],
                id,
                super::MAX_NAME_CHARS,
            )?;
        }
    }
    let at = now_millis() + expiry * 1000;
    let n = state
        .store
        .expire_tokens(&app.id, at, session_ids.as_deref())
        .await?;
    tokens_changed(&state).await;
    actor
        .record(
            &*state.store,
            "token.expire_all",
            Some(&app.id),
            app.id.as_str(),
            serde_json::json!({ "tokens": n, "expiresAt": rfc3339(at), "sessionIds": session_ids }),
        )
        .await;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /auth/logout`: ends the calling application token (and the portal
/// sessions made from it) at once. The admin token cannot be logged out.
#[utoipa::path(
    post,
    path = "/auth/logout",
    tag = "Authentication",
    responses(
        (status = 204, description = "The token no longer works"),
        ForbiddenResponse,
    )
)]
pub async fn logout(
    State(state): State<ApiState>,
    actor: crate::audit::Actor,
    axum::Extension(principal): axum::Extension<Principal>,
) -> ApiResult<StatusCode> {
    let Principal::App {
        app_id, token_id, ..
    } = principal
    else {
        return Err(ApiError::Forbidden(
            "only application tokens can log out; the admin token is configured".into(),
        ));
    };
    state.store.end_token(&token_id, now_millis()).await?;
    tokens_changed(&state).await;
    actor
        .record(
            &*state.store,
            "token.logout",
            Some(&app_id),
            &token_id,
            serde_json::Value::Null,
        )
        .await;
    Ok(StatusCode::NO_CONTENT)
}

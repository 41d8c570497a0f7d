//! An endpoint's credentials: its signing secret (read, rotate) and its
//! custom headers (sensitive values redacted in answers).

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use herald_signing::Secret;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::NotFoundResponse;
use super::{ApiError, ApiJson, ApiResult, ApiState};
use crate::audit::Actor;
use crate::operator::EndpointEvent;
use crate::store::{now_millis, Endpoint};

use super::endpoints::{check_headers, PathEndpoint};

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SecretOut {
    pub key: String,
}

#[utoipa::path(
    get,
    path = "/app/{app_id}/endpoint/{endpoint_id}/secret",
    tag = "Endpoint",
    responses(
        (status = 200, description = "The current signing secret", body = SecretOut),
        NotFoundResponse,
    )
)]
pub async fn get_endpoint_secret(
    State(state): State<ApiState>,
    actor: Actor,
    PathEndpoint(ep): PathEndpoint,
) -> ApiResult<Json<SecretOut>> {
    let key = reveal_secret(&state, &actor, ep).await?;
    Ok(Json(SecretOut { key }))
}

/// The endpoint's secret, for one who asked to see it: refused while its
/// credentials cannot be opened; recorded in the audit log (which names
/// the endpoint, never the secret).
pub(crate) async fn reveal_secret(
    state: &ApiState,
    actor: &Actor,
    ep: Endpoint,
) -> ApiResult<String> {
    credentials_readable(&ep)?;
    actor
        .record(
            &*state.store,
            "endpoint.secret_revealed",
            Some(&ep.app_id),
            ep.id.as_str(),
            Value::Null,
        )
        .await;
    Ok(ep.secret)
}

/// How long a rotated-out secret keeps signing unless the caller says
/// otherwise (Svix keeps the old key for 24 hours).
pub const DEFAULT_GRACE_SECONDS: u64 = 24 * 3600;
const MAX_GRACE_SECONDS: u64 = 30 * 24 * 3600;

#[derive(Debug, Deserialize, Default, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RotateIn {
    /// The new secret: 24 to 64 bytes in base64, `whsec_`-prefixed or not;
    /// generated when absent.
    #[schema(pattern = "^(whsec_)?[A-Za-z0-9+/]+={0,2}$")]
    pub key: Option<String>,
    /// How long the current secret keeps signing (default 24 h).
    #[schema(maximum = 2592000)]
    pub grace_period_seconds: Option<u64>,
}

/// `POST …/endpoint/{id}/secret/rotate`: 200 `{"key"}`. Until the grace period ends,
/// every attempt carries a signature by the new and by each still-valid
/// old secret (at most 10), space-separated, as Standard Webhooks says.
#[utoipa::path(
    post,
    path = "/app/{app_id}/endpoint/{endpoint_id}/secret/rotate",
    tag = "Endpoint",
    request_body(content = ref("#/components/schemas/RotateIn"), description = "Optional; an empty body generates the new secret"),
    responses(
        (status = 200, description = "Rotated: the new secret", body = SecretOut),
        NotFoundResponse,
    )
)]
pub async fn rotate_endpoint_secret(
    State(state): State<ApiState>,
    actor: Actor,
    PathEndpoint(ep): PathEndpoint,
    super::ApiJsonOrEmpty(body): super::ApiJsonOrEmpty<RotateIn>,
) -> ApiResult<axum::response::Response> {
    let secret = match &body.key {
        Some(k) => Secret::parse_given(k).map_err(|e| ApiError::field("key", e.to_string()))?,
        None => Secret::generate(),
    };
    let grace = body.grace_period_seconds.unwrap_or(DEFAULT_GRACE_SECONDS);
    if grace > MAX_GRACE_SECONDS {
        return Err(ApiError::field(
            "gracePeriodSeconds",
            "must be at most 2592000 (30 days)",
        ));
    }
    rotate_secret(&state, &actor, &ep, &secret, grace, body.key.is_some()).await?;
    // The official SDKs (2.x) read the new key from the answer; older
    // ones ignore the body: 200 with `{"key"}` suits both.
    // Not kept for an Idempotency-Key repeat (`idempotency`'s module).
    Ok(super::idempotency::shown_once(Json(SecretOut {
        key: secret.expose(),
    })))
}

/// 409 for an endpoint whose stored credentials did not open (see
/// [`Endpoint::unreadable`]): its secret and headers cannot be shown, and a
/// rotation or header patch would have to rewrite what cannot be read.
pub fn credentials_readable(ep: &Endpoint) -> ApiResult<()> {
    if ep.unreadable {
        return Err(ApiError::Conflict(format!(
            "the stored secret or headers of endpoint {} do not open with the configured \
             HERALD_ENCRYPTION_KEY (see the log); configure the key they were sealed with",
            ep.id
        )));
    }
    Ok(())
}

/// Makes `secret` the endpoint's; the current one keeps signing for
/// `grace_seconds`. Said as an `endpoint.updated` operator event and
/// audited (`key_given`: the caller chose the secret). The API and the
/// dashboard both rotate through here.
pub async fn rotate_secret(
    state: &ApiState,
    actor: &Actor,
    ep: &Endpoint,
    secret: &Secret,
    grace_seconds: u64,
    key_given: bool,
) -> ApiResult<()> {
    credentials_readable(ep)?;
    let now = now_millis();
    let grace_ms = i64::try_from(grace_seconds.saturating_mul(1000)).unwrap_or(i64::MAX);
    let until = now.saturating_add(grace_ms);
    let rotated = state
        .store
        .rotate_secret(&ep.app_id, &ep.id, &secret.expose(), until, now)
        .await?;
    if !rotated {
        return Err(ApiError::NotFound("endpoint"));
    }
    // Svix reports a rotation as an update of the endpoint.
    state
        .operator
        .endpoint_changed(EndpointEvent::Updated, ep)
        .await;
    let details = serde_json::json!({ "keyGiven": key_given, "gracePeriodSeconds": grace_seconds });
    actor
        .record(
            &*state.store,
            "endpoint.secret_rotated",
            Some(&ep.app_id),
            ep.id.as_str(),
            details,
        )
        .await;
    Ok(())
}

/// `GET …/headers`: the endpoint's extra headers, as Svix answers them:
/// the values of sensitive headers (credentials: see
/// [`is_sensitive_header`]) are redacted, that is left out of `headers` and
/// their names listed in `sensitive`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct HeadersOut {
    pub headers: BTreeMap<String, String>,
    pub sensitive: Vec<String>,
}

impl HeadersOut {
    /// `names_only`: every value is withheld (a caller that may read the
    /// endpoint but not its credentials, such as a read-only portal
    /// session), so every name is in `sensitive`.
    pub fn redacted(all: BTreeMap<String, String>, names_only: bool) -> Self {
        let (sensitive, headers): (BTreeMap<_, _>, BTreeMap<_, _>) = all
            .into_iter()
            .partition(|(name, _)| names_only || is_sensitive_header(name));
        HeadersOut {
            headers,
            sensitive: sensitive.into_keys().collect(),
        }
    }
}

/// Whether a header's value is a credential, never shown once written:
/// `Authorization`, `Proxy-Authorization`, cookies, and any name that
/// speaks of a key, token, secret, password, signature or session (API-key
/// and token headers: `X-Api-Key`, `X-Auth-Token`, …).
pub fn is_sensitive_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    [
        "auth",
        "token",
        "secret",
        "key",
        "cookie",
        "password",
        "signature",
        "session",
        "credential",
    ]
    .iter()
    .any(|word| name.contains(word))
}

/// The rules of `EndpointIn.headers` apply.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct HeadersIn {
    pub headers: BTreeMap<String, String>,
}

/// PATCH: sets the headers given; removes those given as `null` and
/// those named in `deleteHeaders` (the SDKs' way).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HeadersPatch {
    #[serde(default)]
    pub headers: BTreeMap<String, Option<String>>,
    pub delete_headers: Option<Vec<String>>,
}

#[utoipa::path(
    get,
    path = "/app/{app_id}/endpoint/{endpoint_id}/headers",
    tag = "Endpoint",
    responses(
        (status = 200, description = "The extra headers sent with every attempt", body = HeadersOut),
        NotFoundResponse,
    )
)]
pub async fn get_endpoint_headers(
    axum::Extension(principal): axum::Extension<super::auth::Principal>,
    PathEndpoint(ep): PathEndpoint,
) -> ApiResult<Json<HeadersOut>> {
    credentials_readable(&ep)?;
    // A portal token that may not change the endpoint gets names only: the
    // values are what it would need to impersonate the sender.
    let names_only = matches!(
        &principal,
        super::auth::Principal::App { capabilities: Some(caps), .. } if !caps.manage_endpoint()
    );
    Ok(Json(HeadersOut::redacted(ep.headers, names_only)))
}

/// Writes the headers and nothing else of the endpoint.
async fn save_headers(
    state: &ApiState,
    actor: &Actor,
    ep: &Endpoint,
    headers: BTreeMap<String, String>,
) -> ApiResult<StatusCode> {
    check_headers(&headers, state.max_headers_per_endpoint)?;
    if !state
        .store
        .set_endpoint_headers(&ep.app_id, &ep.id, &headers, now_millis())
        .await?
    {
        return Err(ApiError::NotFound("endpoint"));
    }
    state
        .operator
        .endpoint_changed(EndpointEvent::Updated, ep)
        .await;
    // The names of the headers now set, never their values.
    let names: Vec<&String> = headers.keys().collect();
    actor
        .record(
            &*state.store,
            "endpoint.headers_updated",
            Some(&ep.app_id),
            ep.id.as_str(),
            serde_json::json!({ "headers": names }),
        )
        .await;
    Ok(StatusCode::NO_CONTENT)
}

/// `PUT …/headers`: replaces them all (204).
#[utoipa::path(
    put,
    path = "/app/{app_id}/endpoint/{endpoint_id}/headers",
    tag = "Endpoint",
    request_body = HeadersIn,
    responses(
        (status = 204, description = "Replaced"),
        NotFoundResponse,
    )
)]
pub async fn put_endpoint_headers(
    State(state): State<ApiState>,
    actor: Actor,
    PathEndpoint(ep): PathEndpoint,
    ApiJson(body): ApiJson<HeadersIn>,
) -> ApiResult<StatusCode> {
    save_headers(&state, &actor, &ep, body.headers).await
}

/// `PATCH …/headers`: sets the named ones, removes those given as null.
#[utoipa::path(
    patch,
    path = "/app/{app_id}/endpoint/{endpoint_id}/headers",
    tag = "Endpoint",
    request_body = HeadersPatch,
    responses(
        (status = 204, description = "Changed"),
        NotFoundResponse,
    )
)]
pub async fn patch_endpoint_headers(
    State(state): State<ApiState>,
    actor: Actor,
    PathEndpoint(ep): PathEndpoint,
    ApiJson(body): ApiJson<HeadersPatch>,
) -> ApiResult<StatusCode> {
    // The headers it keeps could not be read: patching would drop them.
    credentials_readable(&ep)?;
    // Header names are case-insensitive: `authorization` replaces or
    // removes a kept `Authorization`, where both were sent before.
    let mut headers = ep.headers.clone();
    for (name, value) in body.headers {
        headers.retain(|kept, _| !kept.eq_ignore_ascii_case(&name));
        if let Some(v) = value {
            headers.insert(name, v);
        }
    }
    for name in body.delete_headers.unwrap_or_default() {
        headers.retain(|kept, _| !kept.eq_ignore_ascii_case(&name));
    }
    save_headers(&state, &actor, &ep, headers).await
}

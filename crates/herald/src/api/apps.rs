//! Applications: one per customer of the service's user.

use std::collections::BTreeMap;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::auth::{MaybeResolvedApp, ResolvedApp};
use super::error::{ConflictResponse, ForbiddenResponse, NotFoundResponse, ValidationResponse};
use super::{
    check_line, check_metadata, check_uid, rfc3339, ApiError, ApiJson, ApiQuery, ApiResult,
    ApiState, ListParams, ListResponse, MAX_NAME_CHARS,
};
use crate::audit::Actor;
use crate::ids::AppId;
use crate::store::{now_millis, App};

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationIn {
    /// Not blank; no control characters.
    #[schema(pattern = "\\S", max_length = 256)]
    pub name: String,
    #[schema(pattern = "^[A-Za-z0-9._-]{1,256}$")]
    pub uid: Option<String>,
    /// Also accepted as `throttleRate`.
    #[serde(default, alias = "throttleRate")]
    #[schema(maximum = 65535)]
    pub rate_limit: Option<u16>,
    pub metadata: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationOut {
    pub id: String,
    pub name: String,
    pub uid: Option<String>,
    pub rate_limit: Option<u16>,
    pub throttle_rate: Option<u16>,
    pub metadata: BTreeMap<String, String>,
    pub created_at: String,
    pub updated_at: String,
}

impl From<App> for ApplicationOut {
    fn from(a: App) -> Self {
        ApplicationOut {
            id: a.id.into_string(),
            name: a.name,
            uid: a.uid,
            rate_limit: a.rate_limit,
            throttle_rate: a.rate_limit,
            metadata: a.metadata,
            created_at: rfc3339(a.created_at),
            updated_at: rfc3339(a.updated_at),
        }
    }
}

#[derive(Debug, Deserialize, Default, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct CreateAppParams {
    /// `true`: answer 200 with the application that has this uid, if any.
    #[param(value_type = Option<bool>)]
    pub get_if_exists: Option<String>,
}

#[utoipa::path(
    post,
    path = "/app",
    tag = "Application",
    params(CreateAppParams),
    request_body = ApplicationIn,
    responses(
        (status = 200, description = "The existing application (`get_if_exists=true`)", body = ApplicationOut),
        (status = 201, description = "Created", body = ApplicationOut),
        ForbiddenResponse, ConflictResponse,
    )
)]
pub async fn create_app(
    State(state): State<ApiState>,
    actor: Actor,
    ApiQuery(params): ApiQuery<CreateAppParams>,
    ApiJson(body): ApiJson<ApplicationIn>,
) -> ApiResult<Response> {
    let get_if_exists = super::query_bool("get_if_exists", &params.get_if_exists)?;
    check_app_fields(&body.name, &body.uid, &body.metadata)?;
    check_not_reserved(&body.uid, None)?;
    check_uid_not_an_id(&body.uid, None)?;
    if let Some(uid) = &body.uid {
        if let Some(existing) = state.store.get_app(uid).await? {
            if get_if_exists {
                return Ok((StatusCode::OK, Json(ApplicationOut::from(existing))).into_response());
            }
            return Err(ApiError::Conflict(format!(
                "an application with uid `{uid}` already exists"
            )));
        }
    }
    insert_app(&state, &actor, body).await
}

/// Creates the application `body` describes (its uid checked by the
/// caller), audited; answers 201 with it.
async fn insert_app(state: &ApiState, actor: &Actor, body: ApplicationIn) -> ApiResult<Response> {
    let now = now_millis();
    let app = App {
        id: AppId::generate(),
        uid: body.uid,
        name: body.name,
        rate_limit: body.rate_limit,
        metadata: body.metadata.unwrap_or_default(),
        created_at: now,
        updated_at: now,
    };
    state.store.create_app(&app).await?;
    actor
        .record(
            &*state.store,
            "app.created",
            Some(&app.id),
            app.id.as_str(),
            serde_json::Value::Null,
        )
        .await;
    Ok((StatusCode::CREATED, Json(ApplicationOut::from(app))).into_response())
}

#[utoipa::path(
    get,
    path = "/app/{app_id}",
    tag = "Application",
    responses(
        (status = 200, description = "The application", body = ApplicationOut),
        NotFoundResponse,
    )
)]
pub async fn get_app(
    State(state): State<ApiState>,
    ResolvedApp { id: app_id }: ResolvedApp,
) -> ApiResult<Json<ApplicationOut>> {
    Ok(Json(app_by_id(&state, &app_id).await?.into()))
}

#[utoipa::path(
    get,
    path = "/app",
    tag = "Application",
    params(ListParams),
    responses(
        (status = 200, description = "A page of applications", body = ListResponse<ApplicationOut>),
        ForbiddenResponse, ValidationResponse,
    )
)]
pub async fn list_apps(
    State(state): State<ApiState>,
    ApiQuery(params): ApiQuery<ListParams>,
) -> ApiResult<Json<ListResponse<ApplicationOut>>> {
    let page = state.store.list_apps(&params.page(true)?).await?;
    let data = page.items.into_iter().map(ApplicationOut::from).collect();
    Ok(Json(ListResponse::new(
        data,
        page.has_more,
        |a: &ApplicationOut| a.id.clone(),
    )))
}

/// The application with this id (never a uid: a uid may read like
/// another application's id); 404 when it is gone.
pub async fn app_by_id(state: &ApiState, id: &AppId) -> ApiResult<App> {
    match state.store.get_app(id.as_str()).await? {
        Some(app) if app.id == *id => Ok(app),
        _ => Err(ApiError::NotFound("application")),
    }
}

/// Looks an application up by id or uid; 404 when there is none.
pub async fn find_app(state: &ApiState, id_or_uid: &str) -> ApiResult<App> {
    state
        .store
        .get_app(id_or_uid)
        .await?
        .ok_or(ApiError::NotFound("application"))
}

pub(super) fn check_app_fields(
    name: &str,
    uid: &Option<String>,
    metadata: &Option<BTreeMap<String, String>>,
) -> ApiResult<()> {
    if name.trim().is_empty() {
        return Err(ApiError::field("name", "must not be empty"));
    }
    check_line(&["body", "name"], name, MAX_NAME_CHARS)?;
    check_uid("uid", uid)?;
    check_metadata(metadata)
}

/// 422 for a uid Herald keeps for its own applications (`herald-…`, such
/// as the operator application's), unless it is the application's
/// `current` one (given before the prefix was reserved).
pub(super) fn check_not_reserved(uid: &Option<String>, current: Option<&str>) -> ApiResult<()> {
    let prefix = crate::operator::RESERVED_UID_PREFIX;
    super::refuse_uid_prefix(
        uid,
        current,
        prefix,
        "such uids are Herald's own applications'",
    )
}

/// 422 for a uid that reads like an application id (`app_…`): ids and uids
/// share one namespace in paths, so such a uid could shadow, or be
/// shadowed by, another application's id.
pub(super) fn check_uid_not_an_id(uid: &Option<String>, current: Option<&str>) -> ApiResult<()> {
    super::refuse_uid_prefix(uid, current, "app_", "that is how application ids start")
}

/// The audit details of an application update: the changed fields' names
/// and, when the uid changed, the old and the new one (a uid is a name,
/// not a secret, and who moved it matters when messages follow it).
fn update_details(
    mut details: serde_json::Value,
    old_uid: &Option<String>,
    new_uid: &Option<String>,
) -> serde_json::Value {
    if old_uid != new_uid {
        details["uid"] = serde_json::json!({ "old": old_uid, "new": new_uid });
    }
    details
}

/// Stores `app` as a PUT or PATCH changed it from what had `old_uid`: its
/// uid is checked as every new uid is (not reserved, not an id, no other
/// application's), the tokens' names are refreshed when it changed, and
/// `app.updated` is audited with `details` (see [`update_details`]).
async fn save_app(
    state: &ApiState,
    actor: &Actor,
    mut app: App,
    old_uid: &Option<String>,
    details: serde_json::Value,
) -> ApiResult<App> {
    check_not_reserved(&app.uid, old_uid.as_deref())?;
    check_uid_not_an_id(&app.uid, old_uid.as_deref())?;
    check_uid_free(state, &app.uid, &app.id).await?;
    app.updated_at = now_millis();
    if !state.store.update_app(&app).await? {
        return Err(ApiError::NotFound("application"));
    }
    if app.uid != *old_uid {
        super::auth::app_names_changed(state, &app.id).await;
    }
    actor
        .record(
            &*state.store,
            "app.updated",
            Some(&app.id),
            app.id.as_str(),
            update_details(details, old_uid, &app.uid),
        )
        .await;
    Ok(app)
}

/// 409 if another application has `uid`.
async fn check_uid_free(state: &ApiState, uid: &Option<String>, own: &AppId) -> ApiResult<()> {
    if let Some(uid) = uid {
        if let Some(other) = state.store.get_app(uid).await? {
            if other.id != *own {
                return Err(ApiError::Conflict(format!(
                    "an application with uid `{uid}` already exists"
                )));
            }
        }
    }
    Ok(())
}

/// PUT: replaces the application named by the path, or creates it (201).
#[utoipa::path(
    put,
    path = "/app/{app_id}",
    tag = "Application",
    params(("app_id" = String, Path, description = "The application's id (app_…) or uid; \
             a uid that names no application creates one with it")),
    request_body = ApplicationIn,
    responses(
        (status = 200, description = "Replaced", body = ApplicationOut),
        (status = 201, description = "Created", body = ApplicationOut),
        NotFoundResponse, ConflictResponse,
    )
)]
pub async fn put_app(
    State(state): State<ApiState>,
    actor: Actor,
    Path(app_id): Path<String>,
    MaybeResolvedApp(resolved): MaybeResolvedApp,
    ApiJson(body): ApiJson<ApplicationIn>,
) -> ApiResult<Response> {
    check_app_fields(&body.name, &body.uid, &body.metadata)?;
    match resolved {
        Some(id) => {
            let mut app = app_by_id(&state, &id).await?;
            let old_uid = app.uid.clone();
            app.uid = super::put_uid(body.uid, &app_id, app.uid.as_deref());
            app.name = body.name;
            app.rate_limit = body.rate_limit;
            app.metadata = body.metadata.unwrap_or_default();
            let details = serde_json::json!({ "replaced": true });
            let app = save_app(&state, &actor, app, &old_uid, details).await?;
            Ok((StatusCode::OK, Json(ApplicationOut::from(app))).into_response())
        }
        None => {
            // Created under the path's name when that is a uid (an app id
            // cannot be chosen by the caller).
            let uid = match (&body.uid, AppId::parse(&app_id)) {
                (Some(uid), _) => Some(uid.clone()),
                (None, Some(_)) => return Err(ApiError::NotFound("application")),
                (None, None) => Some(app_id.clone()),
            };
            check_uid("uid", &uid)?;
            check_not_reserved(&uid, None)?;
            check_uid_not_an_id(&uid, None)?;
            check_uid_free(&state, &uid, &AppId::generate()).await?;
            insert_app(&state, &actor, ApplicationIn { uid, ..body }).await
        }
    }
}

/// PATCH: an absent field stays; `null` clears `uid` and `rateLimit`.
#[derive(Debug, Deserialize, Default, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationPatch {
    #[schema(pattern = "\\S", max_length = 256)]
    pub name: Option<String>,
    #[serde(default, deserialize_with = "super::double_option")]
    #[schema(pattern = "^[A-Za-z0-9._-]{1,256}$")]
    pub uid: Option<Option<String>>,
    #[serde(
        default,
        alias = "throttleRate",
        deserialize_with = "super::double_option"
    )]
    #[schema(maximum = 65535)]
    pub rate_limit: Option<Option<u16>>,
    pub metadata: Option<BTreeMap<String, String>>,
}

#[utoipa::path(
    patch,
    path = "/app/{app_id}",
    tag = "Application",
    request_body = ApplicationPatch,
    responses(
        (status = 200, description = "Changed", body = ApplicationOut),
        NotFoundResponse, ConflictResponse,
    )
)]
pub async fn patch_app(
    State(state): State<ApiState>,
    actor: Actor,
    ResolvedApp { id: app_id }: ResolvedApp,
    ApiJson(body): ApiJson<ApplicationPatch>,
) -> ApiResult<Json<ApplicationOut>> {
    let mut app = app_by_id(&state, &app_id).await?;
    let current_uid = app.uid.clone();
    let fields = super::named_fields([
        ("name", body.name.is_some()),
        ("uid", body.uid.is_some()),
        ("rateLimit", body.rate_limit.is_some()),
        ("metadata", body.metadata.is_some()),
    ]);
    if let Some(name) = body.name {
        app.name = name;
    }
    if let Some(uid) = body.uid {
        app.uid = uid;
    }
    if let Some(rate) = body.rate_limit {
        app.rate_limit = rate;
    }
    if let Some(m) = body.metadata {
        app.metadata = m;
    }
    check_app_fields(&app.name, &app.uid, &Some(app.metadata.clone()))?;
    let details = serde_json::json!({ "fields": fields });
    let app = save_app(&state, &actor, app, &current_uid, details).await?;
    Ok(Json(app.into()))
}

/// DELETE: the application with its endpoints, messages and history.
#[utoipa::path(
    delete,
    path = "/app/{app_id}",
    tag = "Application",
    responses(
        (status = 204, description = "Deleted"),
        NotFoundResponse,
    )
)]
pub async fn delete_app(
    State(state): State<ApiState>,
    actor: Actor,
    ResolvedApp { id: app_id }: ResolvedApp,
) -> ApiResult<StatusCode> {
    state.app_ids.forget_where(|id| *id == app_id);
    if !state.store.delete_app(&app_id).await? {
        return Err(ApiError::NotFound("application"));
    }
    // Its tokens went with it, and its names.
    super::auth::app_names_changed(&state, &app_id).await;
    actor
        .record(
            &*state.store,
            "app.deleted",
            Some(&app_id),
            app_id.as_str(),
            serde_json::Value::Null,
        )
        .await;
    Ok(StatusCode::NO_CONTENT)
}

// `super::auth::create_token`, refused (403, audited) for the operator
// application (`super::auth::refuse_for_operator_app`). Its doc comment is
// the operation's summary in the OpenAPI description.
/// `POST /app/{app}/token` (admin): a new application token, shown once.
#[utoipa::path(
    post,
    path = "/app/{app_id}/token",
    tag = "Token",
    operation_id = "create_token",
    request_body(content = ref("#/components/schemas/TokenIn"), description = "Optional; an empty body is fine"),
    responses(
        (status = 201, description = "Created; `token` is shown this once", body = super::auth::TokenOut),
        ForbiddenResponse, NotFoundResponse,
    )
)]
pub async fn create_app_token(
    State(state): State<ApiState>,
    actor: Actor,
    app: super::auth::ResolvedApp,
    body: super::ApiJsonOrEmpty<super::auth::TokenIn>,
) -> ApiResult<Response> {
    super::auth::refuse_for_operator_app(&state, &actor, &app.id, "token").await?;
    super::auth::create_token(State(state), actor, app, body).await
}

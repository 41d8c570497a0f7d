//! Event types: the catalogue of `eventType` names (Svix's
//! `/api/v1/event-type`). Endpoints' `filterTypes` must name existing ones.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::auth::Principal;
use super::error::{ConflictResponse, ForbiddenResponse, NotFoundResponse, ValidationResponse};
use super::{
    double_option, rfc3339, valid_uid, ApiError, ApiJson, ApiQuery, ApiResult, ApiState,
    ListParams, ListResponse,
};
use crate::audit::Actor;
use crate::store::{now_millis, EventType, Millis};

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventTypeIn {
    #[schema(pattern = "^[A-Za-z0-9._-]{1,256}$")]
    pub name: String,
    #[schema(max_length = 8192)]
    pub description: Option<String>,
    pub archived: Option<bool>,
    pub deprecated: Option<bool>,
    /// JSON Schemas by version, e.g. `{"1": {...}}`; at most 256 KiB.
    #[schema(value_type = Option<Object>)]
    pub schemas: Option<serde_json::Value>,
    /// Svix's older single flag; `featureFlags` is the current name.
    pub feature_flag: Option<String>,
    pub feature_flags: Option<Vec<String>>,
    #[schema(pattern = "^[A-Za-z0-9._-]{1,256}$")]
    pub group_name: Option<String>,
}

/// PUT's body: the name comes from the path.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventTypeUpdate {
    #[schema(max_length = 8192)]
    pub description: Option<String>,
    pub archived: Option<bool>,
    pub deprecated: Option<bool>,
    /// JSON Schemas by version, e.g. `{"1": {...}}`; at most 256 KiB.
    #[schema(value_type = Option<Object>)]
    pub schemas: Option<serde_json::Value>,
    /// Svix's older single flag; `featureFlags` is the current name.
    pub feature_flag: Option<String>,
    pub feature_flags: Option<Vec<String>>,
    #[schema(pattern = "^[A-Za-z0-9._-]{1,256}$")]
    pub group_name: Option<String>,
}

/// PATCH: an absent field stays; `null` clears it.
#[derive(Debug, Deserialize, Default, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventTypePatch {
    #[schema(max_length = 8192)]
    pub description: Option<String>,
    pub archived: Option<bool>,
    pub deprecated: Option<bool>,
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<Object>)]
    pub schemas: Option<Option<serde_json::Value>>,
    #[serde(default, deserialize_with = "double_option")]
    pub feature_flag: Option<Option<String>>,
    #[serde(default, deserialize_with = "double_option")]
    pub feature_flags: Option<Option<Vec<String>>>,
    #[serde(default, deserialize_with = "double_option")]
    #[schema(pattern = "^[A-Za-z0-9._-]{1,256}$")]
    pub group_name: Option<Option<String>>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventTypeOut {
    pub name: String,
    pub description: String,
    pub archived: bool,
    pub deprecated: bool,
    #[schema(value_type = Option<Object>)]
    pub schemas: Option<serde_json::Value>,
    pub feature_flag: Option<String>,
    pub feature_flags: Option<Vec<String>>,
    pub group_name: Option<String>,
    pub created_at: String,
    pub updated_at: String,
}

/// Feature flags are stored as one JSON array in `feature_flag`.
fn flags_text(one: Option<String>, many: Option<Vec<String>>) -> Option<String> {
    let mut all: Vec<String> = many.unwrap_or_default();
    all.extend(one);
    all.sort();
    all.dedup();
    if all.is_empty() {
        None
    } else {
        serde_json::to_string(&all).ok()
    }
}

fn flags_of(text: &Option<String>) -> Option<Vec<String>> {
    text.as_deref().and_then(|t| serde_json::from_str(t).ok())
}

/// Whether a caller holding `held` flags (None: the admin, all) sees `et`:
/// as Svix, a type with feature flags is hidden from application tokens
/// and portal sessions unless they carry its flags (all of them, when it
/// has several). A flag text that does not parse hides the type.
pub fn visible_to(et: &EventType, held: Option<&[String]>) -> bool {
    let Some(held) = held else { return true };
    match &et.feature_flag {
        None => true,
        Some(_) => {
            flags_of(&et.feature_flag).is_some_and(|needed| needed.iter().all(|f| held.contains(f)))
        }
    }
}

impl From<EventType> for EventTypeOut {
    fn from(e: EventType) -> Self {
        let flags = flags_of(&e.feature_flag);
        EventTypeOut {
            feature_flag: flags.as_ref().and_then(|f| f.first().cloned()),
            feature_flags: flags,
            schemas: e
                .schemas
                .as_deref()
                .and_then(|s| serde_json::from_str(s).ok()),
            name: e.name,
            description: e.description,
            archived: e.archived,
            deprecated: e.deprecated,
            group_name: e.group_name,
            created_at: rfc3339(e.created_at),
            updated_at: rfc3339(e.updated_at),
        }
    }
}

fn check_name(name: &str) -> ApiResult<()> {
    if valid_uid(name) {
        Ok(())
    } else {
        Err(ApiError::field(
            "name",
            "must be 1-256 characters of letters, digits, '-', '_' or '.'",
        ))
    }
}

fn check_fields(
    description: &Option<String>,
    schemas: &Option<serde_json::Value>,
    feature_flags: &Option<String>,
    group_name: &Option<String>,
) -> ApiResult<()> {
    if let Some(d) = description {
        super::check_text(&["body", "description"], d, 8192)?;
    }
    if let Some(s) = schemas {
        let Some(versions) = s.as_object() else {
            return Err(ApiError::field("schemas", "must be a JSON object"));
        };
        // Svix's schema: each version ("1", …) is a JSON Schema, an object.
        if let Some((version, _)) = versions.iter().find(|(_, v)| !v.is_object()) {
            return Err(ApiError::field(
                &format!("schemas.{version}"),
                "must be a JSON object (a JSON Schema)",
            ));
        }
        if s.to_string().len() > 256 * 1024 {
            return Err(ApiError::field("schemas", "must be at most 256 KiB"));
        }
    }
    for flag in flags_of(feature_flags).unwrap_or_default() {
        if !valid_uid(&flag) {
            return Err(ApiError::field(
                "featureFlags",
                "each must be 1-256 characters of letters, digits, '-', '_' or '.'",
            ));
        }
    }
    for (field, v) in [("groupName", group_name)] {
        if let Some(v) = v {
            if !valid_uid(v) {
                return Err(ApiError::field(
                    field,
                    "must be 1-256 characters of letters, digits, '-', '_' or '.'",
                ));
            }
        }
    }
    Ok(())
}

#[derive(Debug, Deserialize, Default, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventTypeListParams {
    // Documented by `ListParams`' own derive: IntoParams cannot flatten.
    #[serde(flatten)]
    #[param(ignore)]
    pub list: ListParams,
    /// `true`: archived event types too.
    #[param(value_type = Option<bool>)]
    pub include_archived: Option<String>,
}

#[utoipa::path(
    get,
    path = "/event-type",
    tag = "Event type",
    params(ListParams, EventTypeListParams),
    responses(
        (status = 200, description = "A page of event types", body = ListResponse<EventTypeOut>),
        ValidationResponse,
    )
)]
pub async fn list_event_types(
    State(state): State<ApiState>,
    axum::Extension(principal): axum::Extension<Principal>,
    ApiQuery(params): ApiQuery<EventTypeListParams>,
) -> ApiResult<Json<ListResponse<EventTypeOut>>> {
    let include_archived = super::query_bool("include_archived", &params.include_archived)?;
    let mut req = params.list.page(true)?;
    let limit = req.limit;
    let held = principal.feature_flags();
    // Types the caller's flags hide are left out; the store is read on
    // until the page is full of those it sees (or there are no more), so
    // that the iterators name only types it sees: one named from the page
    // as read would give a hidden type's name away.
    let mut shown: std::collections::VecDeque<EventType> = std::collections::VecDeque::new();
    let mut has_more;
    loop {
        let page = state.store.list_event_types(include_archived, &req).await?;
        has_more = page.has_more;
        // Read on from the end the page reached: its last item, or its
        // first when reading backwards (a `prevIterator`).
        let reached = if req.backwards {
            page.items.first()
        } else {
            page.items.last()
        }
        .map(|e| e.name.clone());
        let seen = page.items.into_iter().filter(|e| visible_to(e, held));
        if req.backwards {
            for e in seen.rev() {
                shown.push_front(e);
            }
        } else {
            shown.extend(seen);
        }
        if shown.len() >= limit || !has_more || reached.is_none() {
            break;
        }
        req.after = reached;
    }
    if shown.len() > limit {
        has_more = true;
        if req.backwards {
            shown.drain(..shown.len() - limit);
        } else {
            shown.truncate(limit);
        }
    }
    let iterator = shown.back().map(|e| e.name.clone());
    let prev_iterator = shown.front().map(|e| format!("-{}", e.name));
    Ok(Json(ListResponse {
        data: shown.into_iter().map(EventTypeOut::from).collect(),
        iterator,
        prev_iterator,
        done: !has_more,
    }))
}

#[utoipa::path(
    post,
    path = "/event-type",
    tag = "Event type",
    request_body = EventTypeIn,
    responses(
        (status = 201, description = "Created", body = EventTypeOut),
        ForbiddenResponse, ConflictResponse,
    )
)]
pub async fn create_event_type(
    State(state): State<ApiState>,
    actor: Actor,
    ApiJson(body): ApiJson<EventTypeIn>,
) -> ApiResult<(StatusCode, Json<EventTypeOut>)> {
    check_name(&body.name)?;
    let (name, fields) = body.split();
    let et = fields.into_event_type(name, now_millis())?;
    match state.store.get_event_type(&et.name).await? {
        None => insert_event_type(&state, &actor, et).await,
        // Created again after it was archived: back with the fields given,
        // as Svix's create does (201), where a 409 left it archived.
        Some(existing) if existing.archived => {
            let details = serde_json::json!({ "replaced": true, "unarchived": !et.archived });
            let replaced = replace_event_type(&state, &actor, &existing, et, details).await?;
            Ok((StatusCode::CREATED, Json(replaced)))
        }
        Some(_) => Err(ApiError::Conflict(format!(
            "the event type {} already exists: PUT /event-type/{{name}} replaces it",
            et.name
        ))),
    }
}

impl EventTypeIn {
    /// The name apart from the fields PUT takes too.
    fn split(self) -> (String, EventTypeUpdate) {
        let fields = EventTypeUpdate {
            description: self.description,
            archived: self.archived,
            deprecated: self.deprecated,
            schemas: self.schemas,
            feature_flag: self.feature_flag,
            feature_flags: self.feature_flags,
            group_name: self.group_name,
        };
        (self.name, fields)
    }
}

impl EventTypeUpdate {
    /// The event type `name` with these fields, checked, made at `now`.
    fn into_event_type(self, name: String, now: Millis) -> ApiResult<EventType> {
        let flags = flags_text(self.feature_flag, self.feature_flags);
        check_fields(&self.description, &self.schemas, &flags, &self.group_name)?;
        Ok(EventType {
            name,
            description: self.description.unwrap_or_default(),
            archived: self.archived.unwrap_or(false),
            deprecated: self.deprecated.unwrap_or(false),
            schemas: self.schemas.map(|s| s.to_string()),
            feature_flag: flags,
            group_name: self.group_name,
            created_at: now,
            updated_at: now,
        })
    }
}

/// Stores a new event type and audits it: 201 with it.
async fn insert_event_type(
    state: &ApiState,
    actor: &Actor,
    et: EventType,
) -> ApiResult<(StatusCode, Json<EventTypeOut>)> {
    state.store.create_event_type(&et).await?;
    // The entry's details: none beyond the name it targets.
    let details = serde_json::Value::Null;
    actor
        .record(&*state.store, "event_type.created", None, &et.name, details)
        .await;
    Ok((StatusCode::CREATED, Json(et.into())))
}

/// Replaces `existing` with `et`, keeping its creation time, and audits
/// it as updated with `details`.
async fn replace_event_type(
    state: &ApiState,
    actor: &Actor,
    existing: &EventType,
    mut et: EventType,
    details: serde_json::Value,
) -> ApiResult<EventTypeOut> {
    et.created_at = existing.created_at;
    state.store.update_event_type(&et).await?;
    actor
        .record(&*state.store, "event_type.updated", None, &et.name, details)
        .await;
    Ok(et.into())
}

async fn find(state: &ApiState, name: &str) -> ApiResult<EventType> {
    state
        .store
        .get_event_type(name)
        .await?
        .ok_or(ApiError::NotFound("event type"))
}

#[utoipa::path(
    get,
    path = "/event-type/{event_type_name}",
    tag = "Event type",
    responses(
        (status = 200, description = "The event type", body = EventTypeOut),
        NotFoundResponse,
    )
)]
pub async fn get_event_type(
    State(state): State<ApiState>,
    axum::Extension(principal): axum::Extension<Principal>,
    Path(name): Path<String>,
) -> ApiResult<Json<EventTypeOut>> {
    let et = find(&state, &name).await?;
    // A hidden type does not exist for this caller (Svix: 404).
    if !visible_to(&et, principal.feature_flags()) {
        return Err(ApiError::NotFound("event type"));
    }
    Ok(Json(et.into()))
}

/// PUT: replaces the event type, creating it (201) if absent.
#[utoipa::path(
    put,
    path = "/event-type/{event_type_name}",
    tag = "Event type",
    request_body = EventTypeUpdate,
    responses(
        (status = 200, description = "Replaced", body = EventTypeOut),
        (status = 201, description = "Created", body = EventTypeOut),
        ForbiddenResponse, ConflictResponse,
    )
)]
pub async fn put_event_type(
    State(state): State<ApiState>,
    actor: Actor,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<EventTypeUpdate>,
) -> ApiResult<(StatusCode, Json<EventTypeOut>)> {
    let et = body.into_event_type(name.clone(), now_millis())?;
    match state.store.get_event_type(&name).await? {
        Some(existing) => {
            let details = serde_json::json!({ "replaced": true });
            let replaced = replace_event_type(&state, &actor, &existing, et, details).await?;
            Ok((StatusCode::OK, Json(replaced)))
        }
        None => {
            check_name(&name)?;
            insert_event_type(&state, &actor, et).await
        }
    }
}

#[utoipa::path(
    patch,
    path = "/event-type/{event_type_name}",
    tag = "Event type",
    request_body = EventTypePatch,
    responses(
        (status = 200, description = "Changed", body = EventTypeOut),
        ForbiddenResponse, NotFoundResponse,
    )
)]
pub async fn patch_event_type(
    State(state): State<ApiState>,
    actor: Actor,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<EventTypePatch>,
) -> ApiResult<Json<EventTypeOut>> {
    let mut et = find(&state, &name).await?;
    let fields = super::named_fields([
        ("description", body.description.is_some()),
        ("archived", body.archived.is_some()),
        ("deprecated", body.deprecated.is_some()),
        ("schemas", body.schemas.is_some()),
        (
            "featureFlags",
            body.feature_flag.is_some() || body.feature_flags.is_some(),
        ),
        ("groupName", body.group_name.is_some()),
    ]);
    let flags = match (&body.feature_flag, &body.feature_flags) {
        (None, None) => None,
        (one, many) => Some(flags_text(one.clone().flatten(), many.clone().flatten())),
    };
    check_fields(
        &body.description,
        &body.schemas.clone().flatten(),
        &flags.clone().flatten(),
        &body.group_name.clone().flatten(),
    )?;
    if let Some(d) = body.description {
        et.description = d;
    }
    if let Some(a) = body.archived {
        et.archived = a;
    }
    if let Some(d) = body.deprecated {
        et.deprecated = d;
    }
    if let Some(s) = body.schemas {
        et.schemas = s.map(|s| s.to_string());
    }
    if let Some(f) = flags {
        et.feature_flag = f;
    }
    if let Some(g) = body.group_name {
        et.group_name = g;
    }
    et.updated_at = now_millis();
    if !state.store.update_event_type(&et).await? {
        return Err(ApiError::NotFound("event type"));
    }
    actor
        .record(
            &*state.store,
            "event_type.updated",
            None,
            &et.name,
            serde_json::json!({ "fields": fields }),
        )
        .await;
    Ok(Json(et.into()))
}

#[derive(Debug, Deserialize, Default, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeleteParams {
    /// `true`: delete for good instead of archiving.
    #[param(value_type = Option<bool>)]
    pub expunge: Option<String>,
}

/// DELETE archives (Svix's default); `?expunge=true` deletes for good.
#[utoipa::path(
    delete,
    path = "/event-type/{event_type_name}",
    tag = "Event type",
    params(DeleteParams),
    responses(
        (status = 204, description = "Archived (or deleted with `expunge=true`)"),
        ForbiddenResponse, NotFoundResponse,
        ValidationResponse,
    )
)]
pub async fn delete_event_type(
    State(state): State<ApiState>,
    actor: Actor,
    Path(name): Path<String>,
    ApiQuery(params): ApiQuery<DeleteParams>,
) -> ApiResult<StatusCode> {
    let expunge = super::query_bool("expunge", &params.expunge)?;
    let mut et = find(&state, &name).await?;
    let gone = if expunge {
        state.store.delete_event_type(&name).await?
    } else {
        et.archived = true;
        et.updated_at = now_millis();
        state.store.update_event_type(&et).await?
    };
    if !gone {
        return Err(ApiError::NotFound("event type"));
    }
    actor
        .record(
            &*state.store,
            "event_type.deleted",
            None,
            &name,
            serde_json::json!({ "expunged": expunge }),
        )
        .await;
    Ok(StatusCode::NO_CONTENT)
}

/// 422 naming `filterTypes` unless every name is an existing event type.
pub async fn check_known_types(
    state: &ApiState,
    types: &Option<Vec<String>>,
    flags: Option<&[String]>,
    already: &[String],
) -> ApiResult<()> {
    let Some(types) = types else { return Ok(()) };
    let mut unknown = state.store.unknown_event_types(types).await?;
    // A type the caller's flags hide is unknown to it: naming it otherwise
    // would tell that it exists. (Flags only narrow application tokens.)
    // One `already` in the endpoint's filter may stay: the caller reads it
    // there, and a save must not drop it.
    if flags.is_some() {
        let known: Vec<&String> = types
            .iter()
            .filter(|t| !unknown.contains(t) && !already.contains(t))
            .collect();
        for name in known {
            let hidden = state
                .store
                .get_event_type(name)
                .await?
                .is_none_or(|et| !visible_to(&et, flags));
            if hidden {
                unknown.push(name.clone());
            }
        }
        unknown.sort();
    }
    if unknown.is_empty() {
        return Ok(());
    }
    Err(ApiError::field(
        "filterTypes",
        format!(
            "unknown event types: {} (create them under /api/v1/event-type first)",
            unknown.join(", ")
        ),
    ))
}

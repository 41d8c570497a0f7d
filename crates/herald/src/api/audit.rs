//! `GET /api/v1/audit-log` (Herald's own, admin token only): who changed
//! what, when and from where (see `crate::audit` for what is recorded).

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::error::{ForbiddenResponse, ValidationResponse};
use super::{rfc3339, ApiQuery, ApiResult, ApiState, ListParams, ListResponse};
use crate::ids::{AppId, AuditId};
use crate::store::{ActorKind, AuditEntry, AuditFilter};

/// One change, as the audit log keeps it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditEntryOut {
    /// `audit_…`
    pub id: String,
    pub at: String,
    /// `admin`, `app_token`, `dashboard` or `portal`.
    pub actor_kind: &'static str,
    /// `admin`, the token's id (`tok_…`) or the dashboard session's label.
    pub actor: String,
    /// Dotted: `endpoint.created`, `dead.replayed`, `dashboard.login`, …
    pub action: String,
    pub app_id: Option<String>,
    /// The id (or name) of what was acted on; empty when nothing in particular.
    pub target: String,
    /// The client's address.
    pub source: String,
    /// Counts and the names of changed fields; never a secret or a value.
    #[schema(value_type = Object)]
    pub details: serde_json::Value,
}

impl From<AuditEntry> for AuditEntryOut {
    fn from(e: AuditEntry) -> Self {
        AuditEntryOut {
            id: e.id.into_string(),
            at: rfc3339(e.at),
            actor_kind: e.actor_kind.as_str(),
            actor: e.actor_id,
            action: e.action,
            app_id: e.app_id.map(AppId::into_string),
            target: e.target,
            source: e.source,
            details: e.details,
        }
    }
}

#[derive(Debug, Deserialize, Default, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(rename_all = "camelCase")]
pub struct AuditListParams {
    // Documented by `ListParams`' own derive: IntoParams cannot flatten.
    #[serde(flatten)]
    #[param(ignore)]
    pub list: ListParams,
    /// Only this action (e.g. `endpoint.updated`).
    pub action: Option<String>,
    /// Only entries of this application (its id, `app_…`).
    pub app_id: Option<String>,
    /// `admin`, `app_token`, `dashboard` or `portal`.
    pub actor_kind: Option<String>,
    /// Only this actor (`admin`, a `tok_…` id, a session label).
    pub actor: Option<String>,
    /// Only entries acting on this id.
    pub target: Option<String>,
    /// Made before this time (RFC 3339).
    #[param(format = DateTime)]
    pub before: Option<String>,
    /// Made at or after this time (RFC 3339; its millisecond included).
    #[param(format = DateTime)]
    pub after: Option<String>,
}

impl AuditListParams {
    pub fn filter(&self) -> ApiResult<AuditFilter> {
        let text = |v: &Option<String>| v.clone().filter(|s| !s.is_empty());
        let app = super::query_parsed(
            "appId",
            &self.app_id,
            AppId::parse,
            "must be an application id (app_…)",
        )?;
        let actor_kind = super::query_parsed(
            "actorKind",
            &self.actor_kind,
            ActorKind::parse,
            "must be admin, app_token, dashboard or portal",
        )?;
        Ok(AuditFilter {
            action: text(&self.action),
            app,
            actor_kind,
            actor_id: text(&self.actor),
            target: text(&self.target),
            before: super::query_time("before", &self.before)?,
            after: super::query_time("after", &self.after)?,
        })
    }
}

/// `GET /audit-log` (admin): newest first unless `order=ascending`.
#[utoipa::path(
    get,
    path = "/audit-log",
    tag = "Audit log",
    params(ListParams, AuditListParams),
    responses(
        (status = 200, description = "A page of audit log entries, newest first", body = ListResponse<AuditEntryOut>),
        ForbiddenResponse, ValidationResponse,
    )
)]
pub async fn list_audit_log(
    State(state): State<ApiState>,
    ApiQuery(params): ApiQuery<AuditListParams>,
) -> ApiResult<Json<ListResponse<AuditEntryOut>>> {
    let filter = params.filter()?;
    let page_req = params
        .list
        .page_since(filter.after, filter.before, AuditId::PREFIX)?;
    let page = state.store.list_audit(&filter, &page_req).await?;
    let data = page.items.into_iter().map(AuditEntryOut::from).collect();
    Ok(Json(ListResponse::new(
        data,
        page.has_more,
        |e: &AuditEntryOut| e.id.clone(),
    )))
}

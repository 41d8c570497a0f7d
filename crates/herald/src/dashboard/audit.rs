//! `/dashboard/audit`: the audit log, newest first, 50 to a page,
//! filtered by action and application.

use axum::extract::{Query, State};
use maud::{html, Markup};
use serde::Deserialize;

use super::layout::{self, truncate, when, Nav};
use super::session::Authed;
use super::{query_string, Cursor, DashResult, PAGE_SIZE};
use crate::api::apps::find_app;
use crate::api::ApiState;
use crate::store::{AuditEntry, AuditFilter};

#[derive(Debug, Deserialize, Default)]
pub struct AuditQuery {
    pub action: Option<String>,
    /// An application's id or uid.
    pub app: Option<String>,
    pub after: Option<String>,
    pub before: Option<String>,
}

pub async fn page(
    session: Authed,
    State(state): State<ApiState>,
    Query(query): Query<AuditQuery>,
) -> DashResult {
    let text = |v: &Option<String>| v.as_deref().map(str::trim).unwrap_or("").to_owned();
    let (action, app_text) = (text(&query.action), text(&query.app));
    let app = match app_text.as_str() {
        "" => None,
        a => Some(find_app(&state, a).await?),
    };
    let filter = AuditFilter {
        action: (!action.is_empty()).then(|| action.clone()),
        app: app.as_ref().map(|a| a.id.clone()),
        ..AuditFilter::default()
    };
    let cursor = Cursor::new(&query.after, &query.before);
    let page = state
        .store
        .list_audit(&filter, &cursor.request(PAGE_SIZE))
        .await?;
    let listed = cursor.finish(page, |e: &AuditEntry| e.id.as_str().to_owned());
    let link = |key: &str, id: &str| {
        format!(
            "/dashboard/audit{}",
            query_string([
                ("action", action.as_str()),
                ("app", app_text.as_str()),
                (key, id)
            ])
        )
    };
    let pager = listed.pager(link, (!cursor.is_first_page()).then(|| link("", "")));
    let body = html! {
        h1 { "Audit log" small { "every change by a person or a token, newest first" } }
        form.filters method="get" action="/dashboard/audit" {
            label {
                "Action"
                input name="action" value=(action) placeholder="endpoint.updated" size="24";
            }
            label {
                "Application"
                input name="app" value=(app_text) placeholder="id or uid" size="24";
            }
            button type="submit" { "Filter" }
            @if !action.is_empty() || !app_text.is_empty() {
                a href="/dashboard/audit" { "Clear" }
            }
        }
        @if listed.items.is_empty() {
            p.muted { "No entries." }
        } @else {
            (audit_table(&listed.items))
        }
        (pager)
    };
    Ok(layout::page(&session, "Audit log", Nav::Audit, body))
}

fn audit_table(items: &[AuditEntry]) -> Markup {
    html! {
        div.scroll {
            table {
                thead {
                    tr {
                        th { "When (UTC)" }
                        th { "Actor" }
                        th { "Action" }
                        th { "Application" }
                        th { "Target" }
                        th { "Source" }
                        th { "Details" }
                    }
                }
                tbody {
                    @for e in items {
                        @let details = e.details.to_string();
                        tr {
                            td { (when(e.at)) }
                            td {
                                (e.actor_kind.as_str())
                                @if !e.actor_id.is_empty() {
                                    " " span.mono.small { (e.actor_id) }
                                }
                            }
                            td { code { (e.action) } }
                            td.mono.small {
                                @if let Some(app) = &e.app_id {
                                    a href=(format!("/dashboard?app={app}")) { (app) }
                                } @else {
                                    span.muted { "–" }
                                }
                            }
                            td.mono.small { (e.target) }
                            td.mono.small { (e.source) }
                            td.mono.small {
                                @if details != "{}" {
                                    span.clip title=(details) { (truncate(&details, 80)) }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

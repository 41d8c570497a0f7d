//! Applications → endpoints browsing: `/dashboard/apps` (every application,
//! searchable by name, uid or id) and `/dashboard/app/{app}` (its
//! endpoints with their health at a glance, each linking to the endpoint's
//! page). Components over a [`View`], as in [`super::finder`].

use axum::extract::{Path, Query, State};
use maud::{html, Markup};
use serde::Deserialize;

use super::finder::{operator_view, Scope, View};
use super::layout::{self, when, Nav};
use super::overview::{app_label, endpoint_page, endpoint_table};
use super::session::Authed;
use super::{query_string, Cursor, DashResult, PAGE_SIZE};
use crate::api::ApiState;
use crate::store::{now_millis, App};

#[derive(Debug, Deserialize, Default)]
pub struct AppsQuery {
    /// A part of the name, or the uid or id.
    pub q: Option<String>,
    pub after: Option<String>,
    pub before: Option<String>,
}

/// The applications, one a row, each linking to its page.
pub fn apps_table(view: &View, apps: &[App]) -> Markup {
    html! {
        table.apps {
            thead { tr { th { "Application" } th { "uid" } th { "id" } th { "Created" } th {} } }
            tbody {
                @for app in apps {
                    tr {
                        td { a href=(view.app_href(&app.id)) { (app_label(app)) } }
                        td.mono { @match &app.uid { Some(uid) => (uid), None => span.muted { "–" } } }
                        td.mono.small { (app.id) }
                        td { (when(app.created_at)) }
                        td { a href=(format!("{}{}", view.messages_href(), query_string([("app", app.id.as_str())]))) { "messages" } }
                    }
                }
            }
        }
    }
}

/// The search form and one page of applications (operator scope; a
/// portal session has one application and no such page).
pub async fn apps_section(
    view: &View,
    state: &ApiState,
    search: &str,
    cursor: &Cursor,
) -> DashResult {
    let apps = match &view.scope {
        Scope::App(app) => super::Listed {
            items: vec![app.clone()],
            newer: None,
            older: None,
        },
        Scope::All => {
            let page = state
                .store
                .find_apps(
                    (!search.is_empty()).then_some(search),
                    &cursor.request(PAGE_SIZE),
                )
                .await?;
            cursor.finish(page, |a| a.id.as_str().to_owned())
        }
    };
    let here = format!("{}/apps", view.base);
    let link = |key: &str, id: &str| format!("{here}{}", query_string([("q", search), (key, id)]));
    let prev = apps
        .newer
        .as_deref()
        .map(|id| (link("before", id), "Newer"));
    let next = apps.older.as_deref().map(|id| (link("after", id), "Older"));
    let first =
        (!cursor.is_first_page()).then(|| format!("{here}{}", query_string([("q", search)])));
    Ok(html! {
        form.filters method="get" action=(here) {
            label { "Name, uid or id" input name="q" value=(search) placeholder="Acme"; }
            button.primary type="submit" { "Search" }
            a href=(here) { "Clear" }
        }
        @if apps.items.is_empty() {
            p.muted { "No application matches." }
        } @else {
            (apps_table(view, &apps.items))
        }
        (layout::pager(prev, next, first))
    })
}

/// How far the endpoint list of one application may be paged by offset.
const MAX_OFFSET: usize = 100_000;

/// One application's facts and endpoints (failing first), with health.
pub async fn app_body(view: &View, state: &ApiState, app: &App, offset: usize) -> DashResult {
    let now = now_millis();
    let offset = offset.min(MAX_OFFSET);
    let here = view.app_href(&app.id);
    let link = |offset: usize| {
        let offset = offset.to_string();
        format!("{here}{}", query_string([("offset", offset.as_str())]))
    };
    let listed = endpoint_page(state, Some(&app.id), offset, PAGE_SIZE, link).await?;
    Ok(html! {
        h1 { (app_label(app)) small.mono { (app.id) } }
        (app_facts(view, app))
        h2 { "Endpoints" small { "failing first · figures from the last hour and the last 24 hours" } }
        @if listed.rows.is_empty() {
            p.muted { (listed.empty_text) }
        } @else {
            (endpoint_table(&view.base, &listed.rows, &listed.healths, now))
        }
        (layout::pager(listed.prev, listed.next, None))
    })
}

fn app_facts(view: &View, app: &App) -> Markup {
    let messages = format!(
        "{}{}",
        view.messages_href(),
        query_string([("app", app.id.as_str())])
    );
    html! {
        dl.facts {
            dt { "uid" }
            dd.mono { @match &app.uid { Some(uid) => (uid), None => span.muted { "–" } } }
            dt { "Created" }
            dd { (when(app.created_at)) }
            @if let Some(limit) = app.rate_limit {
                dt { "Rate limit" }
                dd { (limit) " / s" }
            }
            dt { "Messages" }
            dd { a href=(messages) { "search this application's messages" } }
        }
    }
}

/// `GET /dashboard/apps`.
pub async fn apps_page(
    session: Authed,
    State(state): State<ApiState>,
    Query(query): Query<AppsQuery>,
) -> DashResult {
    let view = operator_view(&session);
    let search = query.q.as_deref().unwrap_or("").trim().to_owned();
    let cursor = Cursor::new(&query.after, &query.before);
    let section = apps_section(&view, &state, &search, &cursor).await?;
    let body = html! {
        h1 { "Applications" }
        (section)
    };
    Ok(layout::page(&session, "Applications", Nav::Apps, body))
}

#[derive(Debug, Deserialize, Default)]
pub struct AppQuery {
    pub offset: Option<String>,
}

/// `GET /dashboard/app/{app}` (by id or uid).
pub async fn app_page(
    session: Authed,
    State(state): State<ApiState>,
    Path(app_id): Path<String>,
    Query(query): Query<AppQuery>,
) -> DashResult {
    let view = operator_view(&session);
    let app = view.resolve_app(&state, &app_id).await?;
    let offset = query
        .offset
        .as_deref()
        .and_then(|o| o.parse::<usize>().ok())
        .unwrap_or(0);
    let body = app_body(&view, &state, &app, offset).await?;
    let title = app_label(&app).to_owned();
    Ok(layout::page(&session, &title, Nav::Apps, body))
}

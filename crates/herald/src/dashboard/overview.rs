//! `/dashboard`: the queue's figures, then every endpoint with its health,
//! failing ones first, 50 to a page.

use axum::extract::{Query, State};
use maud::{html, Markup};
use serde::Deserialize;

use super::layout::{self, ago, badge, hourly_chart, latency, percent, truncate, Nav, Tone};
use super::session::Authed;
use super::{query_string, DashResult, PAGE_SIZE};
use crate::api::apps::find_app;
use crate::api::endpoint_health::listed_health;
use crate::api::{ApiResult, ApiState};
use crate::health::{EndpointHealth, WindowFigures};
use crate::ids::AppId;
use crate::store::{now_millis, App, EndpointOverview, Millis, QueueStats};

#[derive(Debug, Deserialize, Default)]
pub struct OverviewQuery {
    /// Only this application's endpoints (id or uid).
    pub app: Option<String>,
    pub offset: Option<String>,
}

/// How far offset paging may go: past it, the listing would scan a long
/// way for nothing useful.
const MAX_OFFSET: usize = 100_000;

pub async fn page(
    session: Authed,
    State(state): State<ApiState>,
    Query(query): Query<OverviewQuery>,
) -> DashResult {
    let now = now_millis();
    let app = match query
        .app
        .as_deref()
        .map(str::trim)
        .filter(|a| !a.is_empty())
    {
        Some(a) => Some(find_app(&state, a).await?),
        None => None,
    };
    let offset = query
        .offset
        .as_deref()
        .and_then(|o| o.parse::<usize>().ok())
        .unwrap_or(0)
        .min(MAX_OFFSET);
    let stats = state.store.queue_stats(now).await?;
    let app_param = app.as_ref().map(|a| a.id.as_str()).unwrap_or("");
    let link = |offset: usize| {
        let offset = offset.to_string();
        format!(
            "/dashboard{}",
            query_string([("app", app_param), ("offset", offset.as_str())])
        )
    };
    let listed =
        endpoint_page(&state, app.as_ref().map(|a| &a.id), offset, PAGE_SIZE, link).await?;

    let body = html! {
        h1 { "Overview" }
        (queue_cards(&stats, now))
        (backup_line(&state.backups, now))
        h2 {
            @if let Some(app) = &app {
                "Endpoints of " (app.name)
                small { a href="/dashboard" { "all applications" } }
            } @else {
                "Endpoints"
                small { "failing first · figures from the last hour and the last 24 hours" }
            }
        }
        @if listed.rows.is_empty() {
            p.muted { (listed.empty_text) }
        } @else {
            (endpoint_table("/dashboard", &listed.rows, &listed.healths, now))
        }
        (layout::pager(listed.prev, listed.next, None))
    };
    Ok(layout::page(&session, "Overview", Nav::Overview, body))
}

/// The scheduled backups' line (`HERALD_BACKUP_*`); nothing when off.
fn backup_line(backups: &crate::backups::Backups, now: Millis) -> Markup {
    let Some(schedule) = &backups.schedule else {
        return html! {};
    };
    let state = backups.state();
    html! {
        p.backups.alert[state.failures > 0] {
            "Scheduled backups every " (layout::duration_text(i64::try_from(schedule.every.as_millis()).unwrap_or(i64::MAX)))
            " into " code { (schedule.dir.display()) } " (" (schedule.keep) " kept): "
            @match &state.last_success {
                Some((at, file)) => {
                    "last backup " (layout::duration_text(now - at)) " ago, "
                    code { (file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()) }
                }
                None => "none taken yet",
            }
            @if state.failures > 0 {
                "; " (state.failures) " failed, the last: " (state.last_error.clone().unwrap_or_default())
            }
        }
    }
}

fn queue_cards(stats: &QueueStats, now: Millis) -> Markup {
    let oldest = stats
        .oldest_due_at
        .map(|at| layout::duration_text(now - at))
        .unwrap_or_else(|| "–".to_owned());
    html! {
        div.cards {
            div.card { div.label { "Pending" } div.value { (stats.pending) } }
            div.card { div.label { "Delivering" } div.value { (stats.delivering) } }
            div.card title="Pending deliveries of enabled endpoints whose time has come" {
                div.label { "Due now" }
                div.value {
                    // Counted up to the cap (a bounded walk): past it, "at least".
                    @if stats.due >= crate::store::DUE_COUNT_CAP { "≥ " } (stats.due)
                }
            }
            div.card { div.label { "Oldest due" } div.value { (oldest) } }
            div.card title="Pending deliveries held for disabled endpoints: they wait for the endpoint to be enabled" {
                div.label { "Held" } div.value { (stats.held) }
            }
            div.card.alert[stats.dead > 0] {
                div.label { a href="/dashboard/dead" { "Dead letters" } }
                div.value { (stats.dead) }
            }
            div.card.alert[stats.disabled_endpoints > 0] {
                div.label { "Disabled endpoints" }
                div.value { (stats.disabled_endpoints) }
            }
        }
    }
}

/// The state column of a list (and the portal's endpoint page, which has
/// no rows of its own for them): [`state_badge`], then a circuit breaker
/// that is not closed, and a throttle.
pub fn state_cell(health: &EndpointHealth, now: Millis) -> Markup {
    html! {
        (state_badge(health, now))
        @match health.circuit.state.as_str() {
            "open" => div { (badge(Tone::Bad, "circuit open")) },
            "halfOpen" => div { (badge(Tone::Warn, "circuit probing")) },
            _ => {},
        }
        @if let Some(throttled) = &health.throttled {
            div.small.muted {
                (throttled)
                @if let Some(n) = health.throttle_waiting.filter(|n| *n > 0) {
                    " (" (n) " waiting)"
                }
            }
        }
    }
}

/// Disabled (and why), failing (for how long), or ok.
pub fn state_badge(health: &EndpointHealth, now: Millis) -> Markup {
    if health.disabled {
        html! {
            (badge(Tone::Off, "disabled"))
            @if let Some(reason) = &health.disabled_reason {
                div.small.muted.clip.narrow title=(reason) { (reason) }
            }
        }
    } else if health.failure_streak > 0 {
        let text = format!("failing ×{}", health.failure_streak);
        html! {
            (badge(Tone::Bad, &text))
            @if let Some(since) = health.streak_started_at {
                div.small.muted { "since " (ago(Some(since), now)) }
            }
        }
    } else if health.last_success_at.is_some() {
        badge(Tone::Ok, "healthy")
    } else {
        badge(Tone::Off, "no traffic")
    }
}

fn window_cells(w: &WindowFigures) -> Markup {
    html! {
        td.num { (w.attempts) }
        td.num { (percent(w.failure_rate, w.attempts)) }
        td.num { (latency(w.p50_ms)) br; span.muted { (latency(w.p95_ms)) } }
    }
}

/// One page of endpoints, failing first, with their health, and the
/// pager's links.
pub struct EndpointPage {
    pub rows: Vec<EndpointOverview>,
    pub healths: Vec<EndpointHealth>,
    pub prev: Option<(String, &'static str)>,
    pub next: Option<(String, &'static str)>,
    /// What an empty page says: no endpoint at all, or none this far.
    pub empty_text: &'static str,
}

/// The page of `page_size` endpoints (of `app`, or of every application)
/// from `offset`; `link` is the address of the page at an offset.
pub async fn endpoint_page(
    state: &ApiState,
    app: Option<&AppId>,
    offset: usize,
    page_size: usize,
    link: impl Fn(usize) -> String,
) -> ApiResult<EndpointPage> {
    // One more than a page, to know whether there is a next one.
    let mut rows = state
        .store
        .list_endpoint_overview(app, offset, page_size + 1)
        .await?;
    let has_more = rows.len() > page_size;
    rows.truncate(page_size);
    let healths = listed_health(&state.store, &rows, &state.breaker).await?;
    // An offset past the end (an old link, a hand-made one) leads back to
    // the first page, not to another empty one before it.
    let past_the_end = rows.is_empty() && offset > 0;
    let prev = match (offset > 0, past_the_end) {
        (true, true) => Some((link(0), "First page")),
        (true, false) => Some((link(offset.saturating_sub(page_size)), "Previous")),
        (false, _) => None,
    };
    let next = has_more.then(|| (link(offset + page_size), "Next"));
    let empty_text = if past_the_end {
        "No endpoints this far: the list ends before this page."
    } else {
        "No endpoints yet."
    };
    Ok(EndpointPage {
        rows,
        healths,
        prev,
        next,
        empty_text,
    })
}

/// Endpoints with their health, one a row; links start at `base`
/// (`/dashboard`, or the portal's prefix).
pub fn endpoint_table(
    base: &str,
    rows: &[EndpointOverview],
    healths: &[EndpointHealth],
    now: Millis,
) -> Markup {
    html! {
        div.scroll {
            table {
                thead {
                    tr.group {
                        th colspan="2" {}
                        th colspan="3" { "Last hour" }
                        th colspan="3" { "Last 24 hours" }
                        th colspan="3" {}
                    }
                    tr {
                        th { "Endpoint" }
                        th { "State" }
                        th.num { "Attempts" } th.num { "Failed" } th.num title="p50 and p95 latency" { "p50 / p95" }
                        th.num { "Attempts" } th.num { "Failed" } th.num title="p50 and p95 latency" { "p50 / p95" }
                        th { "Last success" }
                        th { "Last error" }
                        th title="Attempts per hour over the last 24 hours; failed ones in red" { "24 h" }
                    }
                }
                tbody {
                    @for (row, health) in rows.iter().zip(healths) {
                        @let ep = &row.endpoint;
                        @let href = format!("{base}/app/{}/endpoint/{}", ep.app_id, ep.id);
                        tr.failing[!health.disabled && health.failure_streak > 0]
                            .disabled[health.disabled] {
                            td {
                                a.clip href=(href) title=(ep.url) { (truncate(&ep.url, 56)) }
                                div.small.muted.nowrap {
                                    a.muted href=(format!("{base}/app/{}", ep.app_id)) { (row.app_name) }
                                    " · " span.mono { (ep.id) }
                                }
                            }
                            td {
                                (state_cell(health, now))
                                @if ep.unreadable {
                                    div.small.alert title="Its stored secret or headers do not open with the configured HERALD_ENCRYPTION_KEY: nothing is sent to it" { "unreadable" }
                                }
                            }
                            (window_cells(&health.last_hour))
                            (window_cells(&health.last_day))
                            td { (ago(health.last_success_at, now)) }
                            td {
                                @if let Some(error) = &health.last_error {
                                    div.clip.narrow.small title=(error) { (truncate(error, 48)) }
                                    div.small.muted { (ago(health.last_error_at, now)) }
                                } @else {
                                    span.muted { "–" }
                                }
                            }
                            td { (hourly_chart(&health.hourly, 120, 30, false)) }
                        }
                    }
                }
            }
        }
    }
}

/// Names an application for a page title (its name, else its id).
pub fn app_label(app: &App) -> &str {
    if app.name.is_empty() {
        app.id.as_str()
    } else {
        &app.name
    }
}

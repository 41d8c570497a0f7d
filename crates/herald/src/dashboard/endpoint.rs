//! `/dashboard/app/{app}/endpoint/{ep}`: one endpoint's settings, health
//! and chart, enable/disable, its recent attempts (50 to a page, newest
//! first) and a link to its dead letters.

use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use maud::html;
use serde::Deserialize;

use super::delivery::{attempts_table, shown_header_value};
use super::layout::{self, ago, hourly_chart, latency, percent, when, Nav};
use super::overview::{app_label, state_badge};
use super::session::{Authed, Posted};
use super::{query_string, see_other, Cursor, DashResult, PAGE_SIZE};
use crate::api::apps::find_app;
use crate::api::endpoint_health::endpoint_health;
use crate::api::endpoints::{
    disable_audited, enable_audited, find_endpoint, MAX_DISABLE_REASON_BYTES,
};
use crate::api::ApiState;
use crate::health::WindowFigures;
use crate::store::{now_millis, AttemptRecord, Endpoint};

#[derive(Debug, Deserialize, Default)]
pub struct EndpointQuery {
    pub after: Option<String>,
    pub before: Option<String>,
}

fn endpoint_path(ep: &Endpoint) -> String {
    format!("/dashboard/app/{}/endpoint/{}", ep.app_id, ep.id)
}

/// `whsec_` and the last four characters: enough to tell secrets apart.
fn masked(secret: &str) -> String {
    let tail: String = {
        let chars: Vec<char> = secret.chars().collect();
        chars[chars.len().saturating_sub(4)..].iter().collect()
    };
    format!("whsec_••••••••••••••••{tail}")
}

pub async fn page(
    session: Authed,
    State(state): State<ApiState>,
    Path((app_id, endpoint_id)): Path<(String, String)>,
    Query(query): Query<EndpointQuery>,
) -> DashResult {
    let now = now_millis();
    let app = find_app(&state, &app_id).await?;
    let ep = find_endpoint(&state, &app.id, &endpoint_id).await?;
    let health = endpoint_health(&state.store, &ep, &state.breaker).await?;
    let cursor = Cursor::new(&query.after, &query.before);
    let page = state
        .store
        .list_attempts_of_endpoint(&app.id, &ep.id, &cursor.request(PAGE_SIZE))
        .await?;
    let listed = cursor.finish(page, |a: &AttemptRecord| a.id.as_str().to_owned());

    let here = endpoint_path(&ep);
    let link = |name: &str, id: &str| format!("{here}{}", query_string([(name, id)]));
    let pager = listed.pager(link, (!cursor.is_first_page()).then(|| here.clone()));
    let dead_href = format!(
        "/dashboard/dead{}",
        query_string([("app", app.id.as_str()), ("endpoint", ep.id.as_str())])
    );

    let body = html! {
        h1 {
            "Endpoint "
            small.mono { (ep.id) }
        }
        div.columns {
            section {
                dl.facts {
                    dt { "URL" }
                    dd.mono { (ep.url) }
                    dt { "Application" }
                    dd { a href=(format!("/dashboard?app={}", app.id)) { (app_label(&app)) } }
                    @if let Some(uid) = &ep.uid {
                        dt { "uid" }
                        dd.mono { (uid) }
                    }
                    @if !ep.description.is_empty() {
                        dt { "Description" }
                        dd { (ep.description) }
                    }
                    dt { "Event types" }
                    dd {
                        @match &ep.filter_types {
                            None => span.muted { "all" },
                            Some(types) => {
                                @for (i, t) in types.iter().enumerate() {
                                    @if i > 0 { ", " }
                                    code { (t) }
                                }
                            }
                        }
                    }
                    @if let Some(throttled) = &health.throttled {
                        dt { "Throttle" }
                        dd {
                            (throttled)
                            @if let Some(n) = health.throttle_waiting.filter(|n| *n > 0) {
                                span.muted { " (" (n) " waiting)" }
                            }
                        }
                    }
                    @if ep.ordering == crate::store::EndpointOrdering::Fifo {
                        dt { "Ordering" }
                        dd { "FIFO: one request at a time, in creation order" }
                    }
                    @if let Some(channels) = &ep.channels {
                        dt { "Channels" }
                        dd {
                            @for (i, c) in channels.iter().enumerate() {
                                @if i > 0 { ", " }
                                code { (c) }
                            }
                        }
                    }
                    @if !ep.headers.is_empty() {
                        dt { "Extra headers" }
                        dd {
                            @for (name, value) in &ep.headers {
                                div.mono.small { (name) ": " (shown_header_value(name, value)) }
                            }
                        }
                    }
                    dt { "Signing secret" }
                    dd {
                        @if ep.unreadable {
                            span.alert { "unreadable: its secret or headers do not open with the configured HERALD_ENCRYPTION_KEY; nothing is sent to it" }
                        } @else {
                            span.mono #secret { (masked(&ep.secret)) }
                            " "
                            a href=(format!("{here}/secret")) data-reveal="secret" { "reveal" }
                        }
                    }
                    dt { "Created" }
                    dd { (when(ep.created_at)) }
                    dt { "State" }
                    dd {
                        (state_badge(&health, now))
                        @if let Some(at) = health.disabled_at {
                            div.small.muted { "disabled " (ago(Some(at), now)) }
                        }
                    }
                    dt { "Circuit" }
                    dd #circuit { (circuit_badge(&health.circuit)) }
                    dt { "Dead letters" }
                    dd { a href=(dead_href) { "this endpoint's dead letters" } }
                }
                form.toolbar method="post" action=(format!("{here}/rotate")) {
                    (layout::csrf_field(&session))
                    button type="submit" { "Rotate secret" }
                    span.muted.small { "The old secret keeps signing beside the new one for 24 hours." }
                }
                @if health.disabled {
                    form.toolbar method="post" action=(format!("{here}/enable")) {
                        (layout::csrf_field(&session))
                        button.primary type="submit" { "Enable" }
                        span.muted.small { "Held deliveries resume; those past the age cap become dead." }
                    }
                } @else {
                    form.toolbar method="post" action=(format!("{here}/disable")) {
                        (layout::csrf_field(&session))
                        input name="reason" placeholder="reason (optional)" size="32"
                            aria-label="Why it is disabled (optional)"
                            maxlength=(MAX_DISABLE_REASON_BYTES);
                        button.danger type="submit" { "Disable" }
                    }
                }
            }
            section {
                table {
                    thead {
                        tr {
                            th {}
                            th.num { "Attempts" } th.num { "Failed" } th.num { "Failure rate" }
                            th.num { "p50" } th.num { "p95" } th.num { "p99" }
                        }
                    }
                    tbody {
                        (window_row("Last hour", &health.last_hour))
                        (window_row("Last 24 hours", &health.last_day))
                    }
                }
                dl.facts {
                    dt { "Failing streak" }
                    dd {
                        (health.failure_streak)
                        @if let Some(since) = health.streak_started_at {
                            span.muted { " since " (ago(Some(since), now)) }
                        }
                    }
                    dt { "Last success" }
                    dd { (ago(health.last_success_at, now)) }
                    dt { "Last error" }
                    dd {
                        @match &health.last_error {
                            Some(error) => { (error) span.muted { " · " (ago(health.last_error_at, now)) } },
                            None => span.muted { "none" },
                        }
                    }
                }
                h2 { "Attempts per hour" small { "last 24 hours, UTC" } }
                (hourly_chart(&health.hourly, 620, 140, true))
                div.legend { i.a {} "attempts" i.f {} "failed" }
            }
        }
        h2 { "Recent attempts" small { "newest first" } }
        @if listed.items.is_empty() {
            p.muted { "No attempts." }
        } @else {
            (attempts_table(&listed.items, now, true))
        }
        (pager)
    };
    Ok(layout::page(
        &session,
        &format!("Endpoint {}", ep.id),
        Nav::Other,
        body,
    ))
}

fn window_row(label: &str, w: &WindowFigures) -> maud::Markup {
    html! {
        tr {
            th { (label) }
            td.num { (w.attempts) }
            td.num { (w.failures) }
            td.num { (percent(w.failure_rate, w.attempts)) }
            td.num { (latency(w.p50_ms)) }
            td.num { (latency(w.p95_ms)) }
            td.num { (latency(w.p99_ms)) }
        }
    }
}

/// `GET …/endpoint/{ep}/secret`: the secret as plain text, for the reveal
/// link (the dashboard has no bearer token for the API's route).
pub async fn secret(
    session: Authed,
    State(state): State<ApiState>,
    Path((app_id, endpoint_id)): Path<(String, String)>,
) -> DashResult<Response> {
    let ep = endpoint_in(&state, &app_id, &endpoint_id).await?;
    let secret = crate::api::endpoint_secrets::reveal_secret(&state, &session.actor(), ep).await?;
    Ok((
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        secret,
    )
        .into_response())
}

/// The endpoint named in the path, within the application named there (an
/// id or uid each); a 404 for either.
async fn endpoint_in(state: &ApiState, app_id: &str, endpoint_id: &str) -> DashResult<Endpoint> {
    let app = find_app(state, app_id).await?;
    Ok(find_endpoint(state, &app.id, endpoint_id).await?)
}

/// `POST …/endpoint/{ep}/enable`, through the operator's rules.
pub async fn enable(
    State(state): State<ApiState>,
    Path((app_id, endpoint_id)): Path<(String, String)>,
    posted: Posted,
) -> DashResult<Response> {
    let ep = endpoint_in(&state, &app_id, &endpoint_id).await?;
    let report = enable_audited(&state, &posted.session.actor(), &ep).await?;
    posted
        .session
        .flash(match (report.was_disabled, report.expired) {
            (false, _) => "It was already enabled.".to_owned(),
            (true, 0) => "Enabled.".to_owned(),
            (true, n) => {
                format!("Enabled; {n} held deliveries were past the age cap and are now dead.")
            }
        })
        .await;
    Ok(see_other(&endpoint_path(&ep)))
}

/// `POST …/endpoint/{ep}/disable` with an optional `reason`.
pub async fn disable(
    State(state): State<ApiState>,
    Path((app_id, endpoint_id)): Path<(String, String)>,
    posted: Posted,
) -> DashResult<Response> {
    let ep = endpoint_in(&state, &app_id, &endpoint_id).await?;
    let reason = match posted.form.text("reason") {
        "" => "disabled by an operator in the dashboard",
        r => r,
    };
    // A reason the API refuses (too long, a control character) is said on
    // the endpoint's page, as any other outcome.
    let said = match disable_audited(&state, &posted.session.actor(), &ep, reason).await {
        Ok(true) => "Disabled: nothing is sent to it until it is enabled.".to_owned(),
        Ok(false) => "It was already disabled.".to_owned(),
        Err(e) => match super::form_problem(&e) {
            Some(problem) => format!("Not disabled: {problem}"),
            None => return Err(e.into()),
        },
    };
    posted.session.flash(said).await;
    Ok(see_other(&endpoint_path(&ep)))
}

/// `POST …/endpoint/{ep}/rotate`: a new generated secret; the current one
/// keeps signing for the API's default grace period.
pub async fn rotate(
    State(state): State<ApiState>,
    Path((app_id, endpoint_id)): Path<(String, String)>,
    posted: Posted,
) -> DashResult<Response> {
    let ep = endpoint_in(&state, &app_id, &endpoint_id).await?;
    let secret = herald_signing::Secret::generate();
    let grace = crate::api::endpoint_secrets::DEFAULT_GRACE_SECONDS;
    let actor = posted.session.actor();
    crate::api::endpoint_secrets::rotate_secret(&state, &actor, &ep, &secret, grace, false).await?;
    posted
        .session
        .flash("Secret rotated: the previous one signs too for 24 hours.")
        .await;
    Ok(see_other(&endpoint_path(&ep)))
}

/// The circuit breaker: "circuit open until …" while open, "probing" while
/// half-open, "closed" otherwise; with the recent failure rate.
fn circuit_badge(c: &crate::health::CircuitHealth) -> maud::Markup {
    use crate::dashboard::layout::{badge, Tone};
    let rate = format!(
        "{:.0} % of {} recent attempts failed",
        c.recent_failure_rate * 100.0,
        c.recent_attempts
    );
    maud::html! {
        @match (c.state.as_str(), c.until) {
            ("open", Some(until)) => (badge(Tone::Bad, &format!("circuit open until {}", crate::store::rfc3339(until)))),
            ("open", None) => (badge(Tone::Bad, "circuit open")),
            ("halfOpen", _) => (badge(Tone::Warn, "circuit half-open: probing")),
            _ => (badge(Tone::Ok, "closed")),
        }
        div.small.muted { (rate) }
    }
}

//! `/dashboard/dead`: dead letters, filtered, 50 to a page (newest first),
//! replayed by ticking rows or all that match the filters.

use std::collections::{BTreeSet, HashMap};

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use maud::{html, Markup};
use serde::Deserialize;

use super::layout::{self, ago, badge, truncate, Nav, Tone};
use super::session::{Authed, FormFields, Posted};
use super::{named_fields, query_string, see_other, Cursor, DashError, DashResult, PAGE_SIZE};
use crate::api::dead::{DeadFilterParams, MAX_REPLAY_BATCH};
use crate::api::ApiState;
use crate::ids::{AppId, DeliveryId};
use crate::store::{now_millis, DeadFilter, Delivery, DeliveryState, Endpoint, Millis, PageReq};

/// "Replay all matching" moves at most this many batches in one request;
/// the flash says when more remain (they are replayed by pressing again).
const MAX_REPLAY_BATCHES: usize = 50;

#[derive(Debug, Deserialize, Default)]
pub struct DeadQuery {
    pub app: Option<String>,
    pub endpoint: Option<String>,
    pub event_type: Option<String>,
    pub reason: Option<String>,
    pub since: Option<String>,
    pub until: Option<String>,
    pub after: Option<String>,
    pub before: Option<String>,
}

/// The filters as typed (trimmed), which the page echoes back into its
/// forms and links.
#[derive(Debug, Default, Clone)]
struct FilterText {
    app: String,
    endpoint: String,
    event_type: String,
    reason: String,
    since: String,
    until: String,
}

const FILTER_FIELDS: [&str; 6] = ["app", "endpoint", "event_type", "reason", "since", "until"];

impl FilterText {
    fn from_query(q: &DeadQuery) -> Self {
        let t = |v: &Option<String>| v.as_deref().unwrap_or("").trim().to_owned();
        FilterText {
            app: t(&q.app),
            endpoint: t(&q.endpoint),
            event_type: t(&q.event_type),
            reason: t(&q.reason),
            since: t(&q.since),
            until: t(&q.until),
        }
    }

    fn from_form(form: &FormFields) -> Self {
        let t = |name: &str| form.text(name).to_owned();
        FilterText {
            app: t("app"),
            endpoint: t("endpoint"),
            event_type: t("event_type"),
            reason: t("reason"),
            since: t("since"),
            until: t("until"),
        }
    }

    fn pairs(&self) -> [(&'static str, &str); 6] {
        let values = [
            self.app.as_str(),
            &self.endpoint,
            &self.event_type,
            &self.reason,
            &self.since,
            &self.until,
        ];
        named_fields(&FILTER_FIELDS, values)
    }

    fn is_empty(&self) -> bool {
        self.pairs().iter().all(|(_, v)| v.is_empty())
    }

    /// The store's filter, by the API's rules (an application by id or uid,
    /// an endpoint by id, or by uid within the application); a message for
    /// the operator when a filter is wrong.
    async fn resolve(&self, state: &ApiState) -> Result<DeadFilter, String> {
        let since = parse_time("since", &self.since)?;
        let until = parse_time("until", &self.until)?;
        let params = DeadFilterParams {
            app_id: Some(self.app.clone()),
            endpoint_id: Some(self.endpoint.clone()),
            event_type: Some(self.event_type.clone()),
            reason: Some(self.reason.clone()),
            since: None,
            until: None,
        };
        let mut filter =
            params
                .resolve(state, "query")
                .await
                .map_err(|e| match DashError::from(e) {
                    DashError::NotFound(what) => format!("No such {what}."),
                    DashError::BadRequest(why) => why,
                    _ => "The filters could not be applied; the server log has the details.".into(),
                })?;
        filter.since = since;
        filter.until = until;
        Ok(filter)
    }
}

/// A time as typed in the filter form: RFC 3339, or `2026-11-30 08:00`
/// (seconds and the time optional), read as UTC.
pub(super) fn parse_time(field: &str, text: &str) -> Result<Option<Millis>, String> {
    if text.is_empty() {
        return Ok(None);
    }
    if let Some(ms) = crate::api::millis_of_rfc3339(text) {
        return Ok(Some(ms));
    }
    for format in [
        "%Y-%m-%d %H:%M:%S",
        "%Y-%m-%d %H:%M",
        "%Y-%m-%dT%H:%M:%S",
        "%Y-%m-%dT%H:%M",
    ] {
        if let Ok(t) = chrono::NaiveDateTime::parse_from_str(text, format) {
            return Ok(Some(t.and_utc().timestamp_millis()));
        }
    }
    if let Some(t) = chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d")
        .ok()
        .and_then(|d| d.and_hms_opt(0, 0, 0))
    {
        return Ok(Some(t.and_utc().timestamp_millis()));
    }
    Err(format!(
        "{field}: write a time as 2026-11-30 08:00 (UTC) or in RFC 3339"
    ))
}

pub async fn page(
    session: Authed,
    State(state): State<ApiState>,
    Query(query): Query<DeadQuery>,
) -> DashResult<Response> {
    let now = now_millis();
    let text = FilterText::from_query(&query);
    let cursor = Cursor::new(&query.after, &query.before);
    let stats = state.store.queue_stats(now).await?;
    // Offered in the application field; only the first page of them.
    let apps = state
        .store
        .list_apps(&PageReq {
            limit: 100,
            after: None,
            ascending: true,
            backwards: false,
        })
        .await?
        .items;
    let (listed, problem) = match text.resolve(&state).await {
        Ok(filter) => {
            let page = state
                .store
                .list_dead(&filter, &cursor.request(PAGE_SIZE))
                .await?;
            (
                cursor.finish(page, |d: &Delivery| d.id.as_str().to_owned()),
                None,
            )
        }
        Err(problem) => (
            super::Listed {
                items: Vec::new(),
                newer: None,
                older: None,
            },
            Some(problem),
        ),
    };
    let app_names = app_names(&state, &listed.items).await?;

    let link = |cursor_name: &'static str, id: &str| {
        let mut pairs = text.pairs().to_vec();
        pairs.push((cursor_name, id));
        format!("/dashboard/dead{}", query_string(pairs))
    };
    let pager = listed.pager(link, (!cursor.is_first_page()).then(|| link("after", "")));

    let body = html! {
        h1 {
            "Dead letters"
            small { (stats.dead) " in all, across every application" }
        }
        (filter_form(&text, &apps))
        @if let Some(problem) = &problem {
            div.error role="alert" { (problem) }
        }
        form data-bulk method="post" action="/dashboard/dead/replay" {
            (layout::csrf_field(&session))
            @for (name, value) in text.pairs() {
                input type="hidden" name=(name) value=(value);
            }
            div.toolbar {
                button.primary type="submit" name="scope" value="selected" { "Replay selected" }
                span.muted data-selected-count { "" }
                span.spacer {}
                span.muted {
                    (listed.items.len()) " shown"
                    @if listed.older.is_some() { ", more on the next pages" }
                }
                button type="submit" name="scope" value="matching"
                    data-confirm="Replay every dead letter that matches these filters?" {
                    @if text.is_empty() { "Replay all" } @else { "Replay all matching" }
                }
            }
            @if listed.items.is_empty() {
                p.muted { "No dead letters match." }
            } @else {
                (dead_table(&listed.items, &app_names, now))
            }
        }
        (pager)
    };
    let status = if problem.is_some() {
        axum::http::StatusCode::UNPROCESSABLE_ENTITY
    } else {
        axum::http::StatusCode::OK
    };
    Ok((
        status,
        layout::page(&session, "Dead letters", Nav::Dead, body),
    )
        .into_response())
}

/// The names of the applications the rows belong to (one read each).
async fn app_names(state: &ApiState, items: &[Delivery]) -> DashResult<HashMap<AppId, String>> {
    let ids: BTreeSet<&AppId> = items.iter().map(|d| &d.app_id).collect();
    let apps = futures::future::try_join_all(ids.iter().map(|id| state.store.get_app(id.as_str())))
        .await?;
    Ok(apps.into_iter().flatten().map(|a| (a.id, a.name)).collect())
}

fn filter_form(text: &FilterText, apps: &[crate::store::App]) -> Markup {
    html! {
        form.filters method="get" action="/dashboard/dead" {
            label {
                "Application"
                input name="app" value=(text.app) list="apps" placeholder="id or uid" size="24";
            }
            datalist #apps {
                @for app in apps {
                    option value=(app.id) { (app.name) }
                }
            }
            label {
                "Endpoint"
                input name="endpoint" value=(text.endpoint) placeholder="ep_… (or uid with an app)" size="24";
            }
            label {
                "Event type"
                input name="event_type" value=(text.event_type) size="16";
            }
            label {
                "Reason"
                select name="reason" {
                    option value="" selected[text.reason.is_empty()] { "any" }
                    @for reason in ["exhausted", "permanent_status", "too_old"] {
                        option value=(reason) selected[text.reason == reason] { (reason) }
                    }
                }
            }
            label {
                "Dead since (UTC)"
                input name="since" value=(text.since) placeholder="2026-11-30 08:00" size="16";
            }
            label {
                "Dead before (UTC)"
                input name="until" value=(text.until) placeholder="2026-11-30 18:00" size="16";
            }
            button type="submit" { "Filter" }
            @if !text.is_empty() {
                a href="/dashboard/dead" { "Clear" }
            }
        }
    }
}

pub fn reason_badge(d: &Delivery) -> Markup {
    match d.dead_reason {
        Some(reason) => badge(Tone::Bad, reason.as_str()),
        None => badge(Tone::Off, d.state.as_str()),
    }
}

/// The last answer or error of a delivery, short.
pub fn last_result(d: &Delivery) -> Markup {
    html! {
        @if let Some(code) = d.last_status {
            span.mono { "HTTP " (code) }
        }
        @if let Some(error) = &d.last_error {
            div.small.clip title=(error) { (truncate(error, 50)) }
        }
        @if d.last_status.is_none() && d.last_error.is_none() {
            span.muted { "–" }
        }
    }
}

/// When a delivery is tried next: its time, or that it is held while its
/// endpoint is disabled (then its time is long past and means nothing);
/// none for one that is over.
pub fn next_attempt(d: &Delivery, endpoint: Option<&Endpoint>, now: Millis) -> Markup {
    html! {
        @if !matches!(d.state, DeliveryState::Pending | DeliveryState::Delivering) {
            span.muted { "–" }
        } @else if endpoint.is_some_and(|ep| ep.disabled) {
            (badge(Tone::Warn, "held")) " " span.small.muted { "until the endpoint is enabled" }
        } @else {
            (ago(Some(d.next_attempt_at), now))
        }
    }
}

fn dead_table(items: &[Delivery], app_names: &HashMap<AppId, String>, now: Millis) -> Markup {
    html! {
        table {
            thead {
                tr {
                    th { input type="checkbox" data-select-all aria-label="Select every row"; }
                    th { "Dead since" }
                    th { "Application" }
                    th { "Endpoint" }
                    th { "Event type" }
                    th { "Reason" }
                    th.num { "Attempts" }
                    th { "Last result" }
                    th { "Delivery" }
                }
            }
            tbody {
                @for d in items {
                    tr {
                        td {
                            input type="checkbox" name="id" value=(d.id)
                                aria-label=(format!("Select {}", d.id));
                        }
                        td { (ago(Some(d.updated_at), now)) }
                        td {
                            a href=(format!("/dashboard?app={}", d.app_id)) {
                                (app_names.get(&d.app_id).map(String::as_str).unwrap_or(d.app_id.as_str()))
                            }
                        }
                        td.mono.small {
                            a href=(format!("/dashboard/app/{}/endpoint/{}", d.app_id, d.endpoint_id)) {
                                (d.endpoint_id)
                            }
                        }
                        td { code { (d.event_type) } }
                        td { (reason_badge(d)) }
                        td.num { (d.attempts) }
                        td { (last_result(d)) }
                        td.mono.small {
                            a href=(format!("/dashboard/app/{}/delivery/{}", d.app_id, d.id)) { (d.id) }
                        }
                    }
                }
            }
        }
    }
}

/// `POST /dashboard/dead/replay`: `scope=selected` replays the ticked rows
/// (`id`, repeated), `scope=matching` every dead letter the filters match;
/// then back to the list with "Replayed N".
pub async fn replay(State(state): State<ApiState>, posted: Posted) -> DashResult<Response> {
    let Posted { session, form } = posted;
    let text = FilterText::from_form(&form);
    let back = format!("/dashboard/dead{}", query_string(text.pairs()));
    let filter = match text.resolve(&state).await {
        Ok(filter) => filter,
        Err(problem) => {
            session.flash(format!("Nothing replayed: {problem}")).await;
            return Ok(see_other(&back));
        }
    };
    let now = now_millis();
    let mut replayed = 0u64;
    let message = match form.text("scope") {
        "selected" => {
            let ids = form
                .all("id")
                .map(DeliveryId::parse)
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| DashError::BadRequest("a selected row is not a delivery".into()))?;
            if ids.is_empty() {
                "Nothing selected: tick the rows to replay first.".to_owned()
            } else if ids.len() > MAX_REPLAY_BATCH {
                return Err(DashError::BadRequest(format!(
                    "at most {MAX_REPLAY_BATCH} rows at once"
                )));
            } else {
                replayed = state
                    .store
                    .replay_dead_matching(&filter, Some(&ids), ids.len(), now)
                    .await?;
                format!("Replayed {replayed}")
            }
        }
        "matching" => {
            let mut finished = false;
            for _ in 0..MAX_REPLAY_BATCHES {
                let n = state
                    .store
                    .replay_dead_matching(&filter, None, MAX_REPLAY_BATCH, now)
                    .await?;
                replayed += n;
                if n < MAX_REPLAY_BATCH as u64 {
                    finished = true;
                    break;
                }
            }
            if finished {
                format!("Replayed {replayed}")
            } else {
                format!("Replayed {replayed}; more match: press the button again for the rest")
            }
        }
        _ => return Err(DashError::BadRequest("unknown replay scope".into())),
    };
    if replayed > 0 {
        state.wake.notify_one();
        tracing::info!(replayed, "dead letters replayed from the dashboard");
        let details = serde_json::json!({ "replayed": replayed, "scope": form.text("scope") });
        crate::api::dead::record_replay_matching(&state, &session.actor(), &filter, details).await;
    }
    session.flash(message).await;
    Ok(see_other(&back))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_read_as_typed() {
        let at = |s: &str| parse_time("since", s);
        let expected = Some(1_796_112_000_000); // 2026-12-01T08:00:00Z
        assert_eq!(at("2026-12-01T08:00:00Z"), Ok(expected));
        assert_eq!(at("2026-12-01 08:00"), Ok(expected));
        assert_eq!(at("2026-12-01T08:00"), Ok(expected));
        assert_eq!(at("2026-12-01 08:00:00"), Ok(expected));
        assert_eq!(at("2026-12-01"), Ok(Some(1_796_083_200_000)));
        assert_eq!(at(""), Ok(None));
        assert!(at("yesterday").is_err());
    }
}

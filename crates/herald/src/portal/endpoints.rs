//! The portal's pages: the application's endpoints (list, create, edit,
//! delete, one endpoint's health, attempts, secret, test event, recovery)
//! and the event-type catalogue. Changes go through the API's own handlers
//! (the same validation, audit and store calls), as the session's
//! application and with the session as the actor.

use std::collections::BTreeMap;

use axum::extract::{Path, State};
use axum::response::IntoResponse;
use maud::{html, Markup};

use super::{form_problem, Nav, PortalPosted, PortalResult, PortalSession};
use crate::api::auth::{Capabilities, ResolvedApp};
use crate::api::endpoint_health::endpoint_health;
use crate::api::endpoint_secrets::{is_sensitive_header, put_endpoint_headers, HeadersIn};
use crate::api::endpoints::{check_headers, find_endpoint, PathEndpoint};
use crate::api::{parse_json, ApiError, ApiJson, ApiJsonOrEmpty, ApiState};
use crate::audit::Actor;
use crate::dashboard::layout::{ago, badge, hourly_chart, latency, percent, when, Tone};
use crate::dashboard::overview::{endpoint_page, state_cell};
use crate::dashboard::see_other;
use crate::dashboard::session::FormFields;
use crate::store::{now_millis, Endpoint, EventType, PageReq};

fn path_of(ep: &Endpoint) -> String {
    format!("/portal/endpoint/{}", ep.id)
}

/// The endpoint named in the path, within the session's application only.
async fn endpoint_of(
    state: &ApiState,
    session: &PortalSession,
    endpoint_id: &str,
) -> PortalResult<Endpoint> {
    Ok(find_endpoint(state, &session.app_id, endpoint_id).await?)
}

/// [`endpoint_of`] for a change or a page that takes a capability: 403
/// unless the session's capabilities `may`, before the endpoint is looked
/// for.
async fn endpoint_if(
    state: &ApiState,
    session: &PortalSession,
    may: fn(&Capabilities) -> bool,
    endpoint_id: &str,
) -> PortalResult<Endpoint> {
    session.need(may(&session.capabilities))?;
    endpoint_of(state, session, endpoint_id).await
}

/// Shows `text` once, on the endpoint's page, where the browser is sent.
async fn back_to_endpoint(session: &PortalSession, ep: &Endpoint, text: &str) -> PortalResult {
    session.flash(text).await;
    Ok(see_other(&path_of(ep)))
}

fn app_of(session: &PortalSession) -> ResolvedApp {
    ResolvedApp {
        id: session.app_id.clone(),
    }
}

/// The arguments the API's handlers for one endpoint begin with: the
/// state, the session as the actor, and the endpoint.
fn api_args(
    state: &ApiState,
    session: &PortalSession,
    ep: &Endpoint,
) -> (State<ApiState>, Actor, PathEndpoint) {
    (
        State(state.clone()),
        session.actor(),
        PathEndpoint(ep.clone()),
    )
}

/// Back to the endpoint's page, saying `done` when the API's answer is a
/// success, or `failed: …` with what was wrong with the form; any other
/// error is the page's.
async fn flash_outcome<T>(
    session: &PortalSession,
    ep: &Endpoint,
    answer: Result<T, ApiError>,
    done: &str,
    failed: &str,
) -> PortalResult {
    match answer {
        Ok(_) => back_to_endpoint(session, ep, done).await,
        Err(e) => match form_problem(&e) {
            Some(problem) => back_to_endpoint(session, ep, &format!("{failed}: {problem}")).await,
            None => Err(e.into()),
        },
    }
}

/// The catalogue the session sees, unarchived: flagged types only with
/// their flags on the session's token (read from the application's few
/// tokens; a token gone shows none of them).
async fn catalogue(state: &ApiState, session: &PortalSession) -> PortalResult<Vec<EventType>> {
    let flags = session_flags(state, session).await?;
    catalogue_for(state, &flags).await
}

/// [`catalogue`] for a session whose `flags` were read already.
async fn catalogue_for(state: &ApiState, flags: &[String]) -> PortalResult<Vec<EventType>> {
    Ok(all_types(state)
        .await?
        .into_iter()
        .filter(|et| crate::api::event_types::visible_to(et, Some(flags)))
        .collect())
}

/// The feature flags of the session's token (read from the application's
/// few tokens; a token gone holds none).
async fn session_flags(state: &ApiState, session: &PortalSession) -> PortalResult<Vec<String>> {
    Ok(match &session.token_id {
        Some(id) => state
            .store
            .list_tokens(&session.app_id)
            .await?
            .into_iter()
            .find(|t| t.id == *id)
            .map(|t| crate::api::auth::stored_flags(&t.feature_flags))
            .unwrap_or_default(),
        None => Vec::new(),
    })
}

/// Every unarchived event type, page by page.
async fn all_types(state: &ApiState) -> PortalResult<Vec<EventType>> {
    let mut all: Vec<EventType> = Vec::new();
    loop {
        let page = state
            .store
            .list_event_types(
                false,
                &PageReq {
                    limit: 250,
                    after: all.last().map(|et| et.name.clone()),
                    ascending: true,
                    backwards: false,
                },
            )
            .await?;
        all.extend(page.items);
        if !page.has_more {
            return Ok(all);
        }
    }
}

/// Endpoints on one page of the portal's home.
const HOME_PAGE_SIZE: usize = 100;

/// `GET /portal`'s page, `?offset=`.
#[derive(Debug, serde::Deserialize, Default)]
pub struct HomeQuery {
    pub offset: Option<String>,
}

/// `GET /portal`: the application's endpoints with their health, a page
/// at a time (failing first).
pub async fn home(
    session: PortalSession,
    State(state): State<ApiState>,
    axum::extract::Query(query): axum::extract::Query<HomeQuery>,
) -> PortalResult {
    let now = now_millis();
    // An application has at most HERALD_MAX_ENDPOINTS_PER_APP endpoints.
    let offset = query
        .offset
        .as_deref()
        .and_then(|o| o.parse::<usize>().ok())
        .unwrap_or(0)
        .min(state.max_endpoints_per_app);
    let total = state.store.count_endpoints(&session.app_id).await?;
    let link = |offset: usize| format!("/portal?offset={offset}");
    let listed = endpoint_page(&state, Some(&session.app_id), offset, HOME_PAGE_SIZE, link).await?;
    let empty_text = listed.empty_text;
    let rows: Vec<_> = listed
        .rows
        .into_iter()
        .map(|o| o.endpoint)
        .zip(listed.healths)
        .collect();
    let body = html! {
        h1 { "Endpoints" small { (total) " of this application" } }
        @if session.capabilities.manage_endpoint() {
            div.toolbar { a.button href="/portal/endpoint/new" { "Add endpoint" } }
        }
        @if rows.is_empty() {
            p.muted { (empty_text) }
        } @else {
            div.scroll { table {
                thead { tr {
                    th { "URL" } th { "State" } th.num { "Failure rate (24 h)" } th.num { "p95" }
                    th { "Last error" } th { "Chart (24 h)" }
                } }
                tbody {
                    @for (ep, h) in &rows {
                        tr.disabled[h.disabled] .failing[!h.disabled && h.failure_streak > 0] {
                            td {
                                a.clip href=(path_of(ep)) { (shown_url(&session, &ep.url)) }
                                @if !ep.description.is_empty() { div.small.muted { (ep.description) } }
                            }
                            td { (state_cell(h, now)) }
                            td.num { (percent(h.last_day.failure_rate, h.last_day.attempts)) }
                            td.num { (latency(h.last_day.p95_ms)) }
                            td {
                                @match &h.last_error {
                                    Some(e) => { span.clip.narrow title=(e) { (e) } div.small.muted { (ago(h.last_error_at, now)) } },
                                    None => span.muted { "none" },
                                }
                            }
                            td { (hourly_chart(&h.hourly, 120, 24, false)) }
                        }
                    }
                }
            } }
        }
        (crate::dashboard::layout::pager(listed.prev, listed.next, None))
    };
    Ok(session.page("Endpoints", Nav::Endpoints, body))
}

/// `GET /portal/event-types`: the catalogue with descriptions and the
/// schema examples.
pub async fn event_types(session: PortalSession, State(state): State<ApiState>) -> PortalResult {
    let types = catalogue(&state, &session).await?;
    let body = html! {
        h1 { "Event types" }
        @if types.is_empty() { p.muted { "No event types are defined." } }
        @for et in &types {
            section {
                h2 { code { (et.name) } @if et.deprecated { " " (badge(Tone::Warn, "deprecated")) } }
                @if !et.description.is_empty() { p { (et.description) } }
                @if let Some(example) = example_of(et) {
                    pre { (example) }
                }
            }
        }
    };
    Ok(session.page("Event types", Nav::EventTypes, body))
}

/// The first example of the type's schema `"1"`, pretty-printed.
fn example_of(et: &EventType) -> Option<String> {
    let schemas: serde_json::Value = serde_json::from_str(et.schemas.as_deref()?).ok()?;
    let example = schemas.get("1")?.get("examples")?.get(0)?;
    serde_json::to_string_pretty(example).ok()
}

/// The endpoint form's fields as the API's `EndpointIn` JSON (a new
/// endpoint: no header value to keep).
fn endpoint_json(form: &FormFields) -> Result<serde_json::Value, ApiError> {
    let mut body = endpoint_fields(form)?;
    let headers = with_kept_values(form_headers(form), &BTreeMap::new())?;
    body.insert("headers".into(), headers.into());
    Ok(body.into())
}

/// The form's fields but its headers, as the API names them; a field
/// left empty is absent.
fn endpoint_fields(
    form: &FormFields,
) -> Result<serde_json::Map<String, serde_json::Value>, ApiError> {
    let mut body = serde_json::Map::new();
    body.insert("url".into(), form.text("url").into());
    body.insert("description".into(), form.text("description").into());
    let types: Vec<&str> = form.all("filterTypes").filter(|t| !t.is_empty()).collect();
    if !types.is_empty() {
        body.insert("filterTypes".into(), types.into());
    }
    let channels: Vec<&str> = form
        .text("channels")
        .split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    if !channels.is_empty() {
        body.insert("channels".into(), channels.into());
    }
    match form.text("throttleRate").trim() {
        "" => {}
        // Said in the form's words, not the JSON parser's ("invalid type:
        // string, expected u16").
        text => {
            let rate = text.parse::<u16>().map_err(|_| {
                ApiError::field(
                    "throttleRate",
                    "a whole number of messages a second, up to 65535 (empty: no throttle)",
                )
            })?;
            body.insert("throttleRate".into(), rate.into());
        }
    }
    body.insert(
        "disabled".into(),
        (form.get("disabled") == Some("on")).into(),
    );
    Ok(body)
}

/// The edit form's fields as the API's `EndpointPatch` JSON: what the form
/// shows, a field emptied there as `null` (cleared), and nothing of what
/// it does not show (uid, metadata, ordering, version), which so stays as
/// it is. The headers are not in it: the endpoint's PUT and PATCH do not
/// take them (`update` writes them through `PUT …/headers`).
fn endpoint_patch_json(form: &FormFields) -> Result<serde_json::Value, ApiError> {
    let mut body = endpoint_fields(form)?;
    for cleared in ["filterTypes", "channels", "throttleRate"] {
        body.entry(cleared).or_insert(serde_json::Value::Null);
    }
    Ok(body.into())
}

/// The form's custom headers, one `Name: value` a line (a line without a
/// colon is a name with an empty value, for the API to judge).
fn form_headers(form: &FormFields) -> serde_json::Map<String, serde_json::Value> {
    let mut headers = serde_json::Map::new();
    for line in form.text("headers").lines() {
        if let Some((name, value)) = line.split_once(':') {
            headers.insert(name.trim().into(), value.trim().into());
        } else if !line.trim().is_empty() {
            headers.insert(line.trim().into(), "".into());
        }
    }
    headers
}

/// What the edit form shows for a credential header's value (never the
/// value: `Authorization: ••••••`); saved as it is, the stored value stays.
const KEPT_VALUE: &str = "••••••";

/// The form's headers with each kept placeholder given back its stored
/// value, found by name whatever its case as every header name is (a
/// header the form names anew, or whose line was removed, is the form's).
/// A placeholder with no stored value to keep (a new endpoint's form, a
/// line copied from another endpoint) is refused naming the header: saved
/// as written, the receiver would have been sent the placeholder.
fn with_kept_values(
    mut posted: serde_json::Map<String, serde_json::Value>,
    stored: &BTreeMap<String, String>,
) -> Result<serde_json::Map<String, serde_json::Value>, ApiError> {
    for (name, value) in posted.iter_mut() {
        if value.as_str() != Some(KEPT_VALUE) {
            continue;
        }
        let kept = stored
            .iter()
            .find(|(stored_name, _)| stored_name.eq_ignore_ascii_case(name));
        match kept {
            Some((_, kept)) => *value = kept.clone().into(),
            None => {
                return Err(ApiError::field(
                    "headers",
                    format!(
                        "`{name}: {KEPT_VALUE}` keeps a stored value, and this endpoint has no \
                         `{name}` header to keep: write its value"
                    ),
                ))
            }
        }
    }
    Ok(posted)
}

/// The event types of the endpoint's filter the edit form does not offer
/// (hidden from the session by feature flags, archived) and that still
/// exist (one deleted since cannot be kept: the API refuses it).
async fn unoffered_types(
    state: &ApiState,
    ep: &Endpoint,
    offered: &[EventType],
) -> Result<Vec<String>, ApiError> {
    let unoffered: Vec<String> = ep
        .filter_types
        .iter()
        .flatten()
        .filter(|t| !offered.iter().any(|et| et.name == **t))
        .cloned()
        .collect();
    if unoffered.is_empty() {
        return Ok(unoffered);
    }
    let gone = state.store.unknown_event_types(&unoffered).await?;
    Ok(unoffered
        .into_iter()
        .filter(|t| !gone.contains(t))
        .collect())
}

/// The edit form's PATCH with `unoffered` ([`unoffered_types`]) added
/// back: saving does not drop them, nor turn a filter of only such types
/// into "every type".
fn with_unoffered_types(mut patch: serde_json::Value, unoffered: &[String]) -> serde_json::Value {
    if unoffered.is_empty() {
        return patch;
    }
    let mut types: Vec<serde_json::Value> = match patch.get("filterTypes") {
        Some(serde_json::Value::Array(ticked)) => ticked.clone(),
        _ => Vec::new(),
    };
    types.extend(unoffered.iter().map(|t| t.as_str().into()));
    patch["filterTypes"] = types.into();
    patch
}

struct FormValues {
    url: String,
    description: String,
    types: Vec<String>,
    channels: String,
    throttle: String,
    headers: String,
    disabled: bool,
}

impl FormValues {
    fn of(ep: &Endpoint) -> Self {
        FormValues {
            url: ep.url.clone(),
            description: ep.description.clone(),
            types: ep.filter_types.clone().unwrap_or_default(),
            channels: ep.channels.clone().unwrap_or_default().join(", "),
            throttle: ep.rate_limit.map(|r| r.to_string()).unwrap_or_default(),
            // Credentials never shown again (docs/security.md).
            headers: ep
                .headers
                .iter()
                .map(|(k, v)| match is_sensitive_header(k) {
                    true => format!("{k}: {KEPT_VALUE}"),
                    false => format!("{k}: {v}"),
                })
                .collect::<Vec<_>>()
                .join("\n"),
            disabled: ep.disabled,
        }
    }

    fn posted(form: &FormFields) -> Self {
        FormValues {
            url: form.text("url").to_owned(),
            description: form.text("description").to_owned(),
            types: form.all("filterTypes").map(str::to_owned).collect(),
            channels: form.text("channels").to_owned(),
            throttle: form.text("throttleRate").to_owned(),
            headers: form.text("headers").to_owned(),
            disabled: form.get("disabled") == Some("on"),
        }
    }
}

fn endpoint_form(
    session: &PortalSession,
    action: &str,
    values: &FormValues,
    catalogue: &[EventType],
    kept_types: usize,
    problem: Option<&str>,
) -> Markup {
    // With types the form does not offer kept in the filter, nothing
    // ticked is not "every type": the endpoint gets those alone.
    let legend = match kept_types {
        0 => "Event types (none ticked: all)".to_owned(),
        1 => "Event types (the endpoint also gets 1 type not listed here, which stays; \
              none ticked: that one alone)"
            .to_owned(),
        n => format!(
            "Event types (the endpoint also gets {n} types not listed here, which stay; \
             none ticked: those alone)"
        ),
    };
    html! {
        @if let Some(problem) = problem { div.error role="alert" { (problem) } }
        form.filters method="post" action=(action) {
            (session.csrf_field())
            label { "URL" input name="url" type="url" required size="60" value=(values.url); }
            label { "Description" input name="description" size="40" value=(values.description); }
            label { "Channels (comma-separated)" input name="channels" size="30" value=(values.channels); }
            label { "throttleRate (messages / s)" input name="throttleRate" size="8" value=(values.throttle); }
            fieldset {
                legend { (legend) }
                @for et in catalogue {
                    label.nowrap {
                        input type="checkbox" name="filterTypes" value=(et.name)
                            checked[values.types.contains(&et.name)];
                        " " (et.name)
                    }
                }
            }
            label { "Custom headers (one `Name: value` a line; "
                code { (KEPT_VALUE) } " keeps a credential's stored value)"
                textarea name="headers" rows="3" cols="50" { (values.headers) } }
            label.nowrap { input type="checkbox" name="disabled" checked[values.disabled]; " Disabled" }
            button.primary type="submit" { "Save" }
        }
    }
}

/// Which endpoint form a page shows: a new endpoint, or `ep` edited.
fn form_target(ep: Option<&Endpoint>) -> (&'static str, Markup, String) {
    match ep {
        None => (
            "Add endpoint",
            html! { h1 { "Add endpoint" } },
            "/portal/endpoint/new".to_owned(),
        ),
        Some(ep) => (
            "Edit endpoint",
            html! { h1 { "Edit endpoint " small.mono { (ep.id) } } },
            format!("{}/edit", path_of(ep)),
        ),
    }
}

/// The endpoint form's page, filled with `values`; with the API's
/// `problem`, shown above it and answered 422.
async fn form_page(
    state: &ApiState,
    session: &PortalSession,
    ep: Option<&Endpoint>,
    values: &FormValues,
    problem: Option<&str>,
) -> PortalResult {
    let (title, heading, action) = form_target(ep);
    let types = catalogue(state, session).await?;
    let kept = match ep {
        Some(ep) => unoffered_types(state, ep, &types).await?.len(),
        None => 0,
    };
    let body = html! {
        (heading)
        (endpoint_form(session, &action, values, &types, kept, problem))
    };
    let mut response = session.page(title, Nav::Endpoints, body);
    if problem.is_some() {
        *response.status_mut() = axum::http::StatusCode::UNPROCESSABLE_ENTITY;
    }
    Ok(response)
}

/// `GET /portal/endpoint/new`.
pub async fn new_form(session: PortalSession, State(state): State<ApiState>) -> PortalResult {
    session.need(session.capabilities.manage_endpoint())?;
    let empty = FormValues::posted(&FormFields::default());
    form_page(&state, &session, None, &empty, None).await
}

/// `POST /portal/endpoint/new`: the API's create, its errors on the form.
pub async fn create(State(state): State<ApiState>, posted: PortalPosted) -> PortalResult {
    let session = &posted.session;
    session.need(session.capabilities.manage_endpoint())?;
    let flags = session_flags(&state, session).await?;
    let body = endpoint_json(&posted.form).and_then(|b| parse_json(b.to_string().as_bytes()));
    let result = match body {
        Ok(body) => {
            let app = app_of(session).id;
            let actor = session.actor();
            crate::api::endpoints::insert_endpoint(&state, &actor, Some(&flags), app, body).await
        }
        Err(e) => Err(e),
    };
    match result {
        Ok(_) => {
            session.flash("Endpoint added.").await;
            Ok(see_other("/portal"))
        }
        Err(e) => match form_problem(&e) {
            Some(problem) => {
                let values = FormValues::posted(&posted.form);
                form_page(&state, session, None, &values, Some(&problem)).await
            }
            None => Err(e.into()),
        },
    }
}

/// `GET /portal/endpoint/{ep}`: settings, health, chart, attempts and the
/// An endpoint's URL as the session may see it: credentials in it
/// (userinfo) masked unless it may read the endpoint's secret.
fn shown_url(session: &PortalSession, url: &str) -> String {
    if session.capabilities.view_secret() {
        url.to_owned()
    } else {
        crate::net::masked_url(url)
    }
}

/// actions the session's capabilities allow.
pub async fn page(
    session: PortalSession,
    State(state): State<ApiState>,
    Path(endpoint_id): Path<String>,
) -> PortalResult {
    let now = now_millis();
    let ep = endpoint_of(&state, &session, &endpoint_id).await?;
    let health = endpoint_health(&state.store, &ep, &state.breaker).await?;
    let attempts = state
        .store
        .list_attempts_of_endpoint(
            &session.app_id,
            &ep.id,
            &PageReq {
                limit: 50,
                after: None,
                ascending: false,
                backwards: false,
            },
        )
        .await?
        .items;
    let types = catalogue(&state, &session).await?;
    let here = path_of(&ep);
    let caps = &session.capabilities;
    let body = html! {
        h1 { "Endpoint " small.mono { (ep.id) } }
        div.columns {
            section {
                dl.facts {
                    dt { "URL" } dd.mono { (shown_url(&session, &ep.url)) }
                    @if !ep.description.is_empty() { dt { "Description" } dd { (ep.description) } }
                    dt { "Event types" }
                    dd { @match &ep.filter_types {
                        None => span.muted { "all" },
                        Some(t) => { (t.join(", ")) },
                    } }
                    @if let Some(c) = &ep.channels { dt { "Channels" } dd { (c.join(", ")) } }
                    @if let Some(rate) = ep.rate_limit { dt { "throttleRate" } dd { (rate) " / s" } }
                    @if !ep.headers.is_empty() {
                        dt { "Custom headers" }
                        dd { @for name in ep.headers.keys() { div.mono.small { (name) } } }
                    }
                    dt { "Signing secret" }
                    dd {
                        @if caps.view_secret() {
                            span.mono #secret { "whsec_…" } " "
                            a href=(format!("{here}/secret")) data-reveal="secret" { "reveal" }
                        } @else {
                            span.muted { "hidden" }
                        }
                    }
                    dt { "Created" } dd { (when(ep.created_at)) }
                    dt { "State" } dd { (state_cell(&health, now)) }
                    dt { "Last error" }
                    dd { @match &health.last_error {
                        Some(e) => { (e) span.muted { " · " (ago(health.last_error_at, now)) } },
                        None => span.muted { "none" },
                    } }
                }
                @if caps.manage_endpoint() {
                    div.toolbar {
                        a.button href=(format!("{here}/edit")) { "Edit" }
                        a.button href=(format!("{here}/delete")) { "Delete" }
                        @if health.disabled {
                            form method="post" action=(format!("{here}/enable")) {
                                (session.csrf_field()) button.primary type="submit" { "Enable" }
                            }
                        } @else {
                            form method="post" action=(format!("{here}/disable")) {
                                (session.csrf_field()) button.danger type="submit" { "Disable" }
                            }
                        }
                    }
                }
                @if caps.rotate_secret() {
                    form.toolbar method="post" action=(format!("{here}/rotate")) {
                        (session.csrf_field())
                        button type="submit" { "Rotate secret" }
                        span.muted.small { "The old secret keeps signing beside the new one for 24 hours." }
                    }
                }
                @if caps.create_attempts() {
                    form.toolbar method="post" action=(format!("{here}/send-example")) {
                        (session.csrf_field())
                        select name="eventType" aria-label="Event type of the test event" {
                            option value="svix.ping" { "svix.ping" }
                            // Only types with an example to send (the API refuses the rest).
                            @for et in types.iter().filter(|et| example_of(et).is_some()) {
                                option value=(et.name) { (et.name) }
                            }
                        }
                        button type="submit" { "Send a test event" }
                    }
                    form.toolbar method="post" action=(format!("{here}/recover")) {
                        (session.csrf_field())
                        label { "Recover failed messages since (UTC) "
                            input name="since" type="datetime-local" required; }
                        button type="submit" { "Recover" }
                    }
                }
            }
            section {
                table {
                    thead { tr { th {} th.num { "Attempts" } th.num { "Failed" } th.num { "Failure rate" } th.num { "p95" } } }
                    tbody {
                        tr { th { "Last hour" } td.num { (health.last_hour.attempts) } td.num { (health.last_hour.failures) }
                             td.num { (percent(health.last_hour.failure_rate, health.last_hour.attempts)) } td.num { (latency(health.last_hour.p95_ms)) } }
                        tr { th { "Last 24 hours" } td.num { (health.last_day.attempts) } td.num { (health.last_day.failures) }
                             td.num { (percent(health.last_day.failure_rate, health.last_day.attempts)) } td.num { (latency(health.last_day.p95_ms)) } }
                    }
                }
                h2 { "Attempts per hour" small { "last 24 hours, UTC" } }
                (hourly_chart(&health.hourly, 620, 140, true))
                div.legend { i.a {} "attempts" i.f {} "failed" }
            }
        }
        h2 { "Recent attempts" small { "newest first" } }
        @if attempts.is_empty() {
            p.muted { "No attempts." }
        } @else {
            table.attempts {
                thead { tr { th { "When" } th { "Message" } th { "Result" } th.num { "Status" } th.num { "Duration" } th { "Response" } } }
                tbody {
                    @for a in &attempts {
                        tr {
                            td { (ago(Some(a.started_at), now)) }
                            td.mono.small { (a.msg_id) }
                            td { @if a.success { (badge(Tone::Ok, "succeeded")) } @else { (badge(Tone::Bad, "failed")) } }
                            td.num { @match a.status_code { Some(c) => { (c) }, None => span.muted { "–" } } }
                            td.num { (a.duration_ms) " ms" }
                            td { span.clip.small { (a.error.as_deref().unwrap_or(&a.response)) } }
                        }
                    }
                }
            }
        }
    };
    Ok(session.page(&format!("Endpoint {}", ep.id), Nav::Endpoints, body))
}

/// `GET …/edit`.
pub async fn edit_form(
    session: PortalSession,
    State(state): State<ApiState>,
    Path(endpoint_id): Path<String>,
) -> PortalResult {
    let ep = endpoint_if(
        &state,
        &session,
        Capabilities::manage_endpoint,
        &endpoint_id,
    )
    .await?;
    form_page(&state, &session, Some(&ep), &FormValues::of(&ep), None).await
}

/// `POST …/edit`: the API's PATCH with what the form shows (a PUT would
/// reset what it does not: the uid, metadata, ordering), then the API's
/// `PUT …/headers` if they changed; their errors on the form.
pub async fn update(
    State(state): State<ApiState>,
    Path(endpoint_id): Path<String>,
    posted: PortalPosted,
) -> PortalResult {
    let session = &posted.session;
    let ep = endpoint_if(&state, session, Capabilities::manage_endpoint, &endpoint_id).await?;
    let flags = session_flags(&state, session).await?;
    let offered = catalogue_for(&state, &flags).await?;
    let result = async {
        let unoffered = unoffered_types(&state, &ep, &offered).await?;
        let patch = with_unoffered_types(endpoint_patch_json(&posted.form)?, &unoffered);
        let patch = parse_json(patch.to_string().as_bytes())?;
        let headers = with_kept_values(form_headers(&posted.form), &ep.headers)?;
        let headers: HeadersIn = parse_json(
            serde_json::json!({ "headers": headers })
                .to_string()
                .as_bytes(),
        )?;
        // Before anything is written: a refused header leaves the endpoint
        // as it was rather than half saved.
        check_headers(&headers.headers, state.max_headers_per_endpoint)?;
        let actor = session.actor();
        let flags = Some(flags.as_slice());
        let _saved =
            crate::api::endpoints::patch_endpoint_as(&state, &actor, flags, ep.clone(), patch)
                .await?;
        if headers.headers != ep.headers {
            let (st, actor, endpoint) = api_args(&state, session, &ep);
            put_endpoint_headers(st, actor, endpoint, ApiJson(headers)).await?;
        }
        Ok::<_, ApiError>(())
    }
    .await;
    match result {
        Ok(_) => back_to_endpoint(session, &ep, "Saved.").await,
        Err(e) => match form_problem(&e) {
            Some(problem) => {
                let values = FormValues::posted(&posted.form);
                form_page(&state, session, Some(&ep), &values, Some(&problem)).await
            }
            None => Err(e.into()),
        },
    }
}

/// `GET …/delete`: the confirmation step.
pub async fn delete_form(
    session: PortalSession,
    State(state): State<ApiState>,
    Path(endpoint_id): Path<String>,
) -> PortalResult {
    let ep = endpoint_if(
        &state,
        &session,
        Capabilities::manage_endpoint,
        &endpoint_id,
    )
    .await?;
    let body = html! {
        h1 { "Delete endpoint?" }
        p { "Nothing more will be sent to " code { (ep.url) } ", and its history goes with it." }
        form.toolbar method="post" action=(format!("{}/delete", path_of(&ep))) {
            (session.csrf_field())
            button.danger type="submit" { "Delete" }
            a href=(path_of(&ep)) { "Cancel" }
        }
    };
    Ok(session.page("Delete endpoint", Nav::Endpoints, body))
}

/// `POST …/delete`.
pub async fn delete(
    State(state): State<ApiState>,
    Path(endpoint_id): Path<String>,
    posted: PortalPosted,
) -> PortalResult {
    let session = &posted.session;
    let ep = endpoint_if(&state, session, Capabilities::manage_endpoint, &endpoint_id).await?;
    let (st, actor, endpoint) = api_args(&state, session, &ep);
    crate::api::endpoints::delete_endpoint(st, actor, endpoint).await?;
    session.flash("Endpoint deleted.").await;
    Ok(see_other("/portal"))
}

/// `GET …/secret`: the secret as text (the reveal link), with
/// `ViewEndpointSecret`.
pub async fn secret(
    session: PortalSession,
    State(state): State<ApiState>,
    Path(endpoint_id): Path<String>,
) -> PortalResult {
    let ep = endpoint_if(&state, &session, Capabilities::view_secret, &endpoint_id).await?;
    let (st, actor, endpoint) = api_args(&state, &session, &ep);
    let out = crate::api::endpoint_secrets::get_endpoint_secret(st, actor, endpoint).await?;
    Ok(out.0.key.into_response())
}

/// `POST …/rotate`, with `ManageEndpointSecret`.
pub async fn rotate(
    State(state): State<ApiState>,
    Path(endpoint_id): Path<String>,
    posted: PortalPosted,
) -> PortalResult {
    let session = &posted.session;
    let ep = endpoint_if(&state, session, Capabilities::rotate_secret, &endpoint_id).await?;
    let (st, actor, endpoint) = api_args(&state, session, &ep);
    let _ = crate::api::endpoint_secrets::rotate_endpoint_secret(
        st,
        actor,
        endpoint,
        ApiJsonOrEmpty(Default::default()),
    )
    .await?;
    back_to_endpoint(
        session,
        &ep,
        "Secret rotated: the previous one signs too for 24 hours.",
    )
    .await
}

/// `POST …/enable`.
pub async fn enable(
    State(state): State<ApiState>,
    Path(endpoint_id): Path<String>,
    posted: PortalPosted,
) -> PortalResult {
    let session = &posted.session;
    let ep = endpoint_if(&state, session, Capabilities::manage_endpoint, &endpoint_id).await?;
    let (st, actor, endpoint) = api_args(&state, session, &ep);
    let _ = crate::api::endpoints::enable_endpoint_route(st, actor, endpoint).await?;
    back_to_endpoint(session, &ep, "Enabled.").await
}

/// `POST …/disable`.
pub async fn disable(
    State(state): State<ApiState>,
    Path(endpoint_id): Path<String>,
    posted: PortalPosted,
) -> PortalResult {
    let session = &posted.session;
    let ep = endpoint_if(&state, session, Capabilities::manage_endpoint, &endpoint_id).await?;
    let body = parse_json(br#"{"reason":"disabled in the portal"}"#)?;
    let (st, actor, endpoint) = api_args(&state, session, &ep);
    let _ =
        crate::api::endpoints::disable_endpoint_route(st, actor, endpoint, ApiJsonOrEmpty(body))
            .await?;
    back_to_endpoint(
        session,
        &ep,
        "Disabled: nothing is sent to it until it is enabled.",
    )
    .await
}

/// `POST …/send-example`: the API's send-example (the type's schema
/// example, or `svix.ping`), with `CreateAttempts`.
pub async fn send_example(
    State(state): State<ApiState>,
    Path(endpoint_id): Path<String>,
    posted: PortalPosted,
) -> PortalResult {
    let session = &posted.session;
    let ep = endpoint_if(&state, session, Capabilities::create_attempts, &endpoint_id).await?;
    let event_type = posted.form.text("eventType");
    let body = parse_json(
        serde_json::json!({ "eventType": event_type })
            .to_string()
            .as_bytes(),
    )?;
    let flags = session_flags(&state, session).await?;
    let sent = crate::api::messages::send_example_as(&state, Some(&flags), ep.clone(), body).await;
    flash_outcome(
        session,
        &ep,
        sent,
        &format!("Sent a test {event_type} event."),
        "Not sent",
    )
    .await
}

/// `POST …/recover`: failed messages since a time are sent again, with
/// `CreateAttempts`.
pub async fn recover(
    State(state): State<ApiState>,
    Path(endpoint_id): Path<String>,
    posted: PortalPosted,
) -> PortalResult {
    let session = &posted.session;
    let ep = endpoint_if(&state, session, Capabilities::create_attempts, &endpoint_id).await?;
    // `datetime-local` sends `2026-12-01T10:00`, or with seconds (and
    // their fraction) when the browser shows them: read as UTC. An RFC
    // 3339 time is taken as it is.
    let since = posted.form.text("since");
    let since = ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S%.f"]
        .iter()
        .find_map(|format| chrono::NaiveDateTime::parse_from_str(since, format).ok())
        .map_or_else(
            || since.to_owned(),
            |local| format!("{}Z", local.format("%Y-%m-%dT%H:%M:%S%.3f")),
        );
    let body = parse_json(serde_json::json!({ "since": since }).to_string().as_bytes())?;
    let (st, actor, endpoint) = api_args(&state, session, &ep);
    let done = crate::api::history::recover(st, actor, endpoint, ApiJson(body)).await;
    flash_outcome(
        session,
        &ep,
        done,
        "Failed messages since then are being sent again.",
        "Not recovered",
    )
    .await
}

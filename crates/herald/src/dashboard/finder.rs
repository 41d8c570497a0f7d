//! The finding tools: the messages page (search by application, event
//! type, message id or `eventId`, delivery status and creation time) and a
//! message's page (payload, each endpoint's delivery, every attempt, a
//! resend per endpoint).
//!
//! The markup is in functions over a [`View`] (whose applications may be
//! seen, where links point, whether resend forms are shown), so the
//! customer portal renders the same components for its one application:
//! with [`Scope::App`] every query is filtered by that application whatever
//! the request asks. The handlers at the end are the operator dashboard's.

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{html, Markup};
use serde::Deserialize;

use super::dead::{last_result, next_attempt, parse_time, reason_badge};
use super::delivery::{pretty_json, SHOWN_PAYLOAD_BYTES};
use super::layout::{self, ago, badge, truncate, when, Nav, Tone};
use super::overview::app_label;
use super::session::{Authed, Posted};
use super::{named_fields, query_string, see_other, Cursor, DashError, DashResult, PAGE_SIZE};
use crate::api::apps::find_app;
use crate::api::{ApiError, ApiState};
use crate::ids::{AppId, EndpointId};
use crate::net::masked_url;
use crate::store::{
    now_millis, App, AttemptRecord, Delivery, DeliveryCounts, DeliveryState, Endpoint, FindFilter,
    FoundMessage, Message, Millis, PageReq,
};

/// Which applications a page may show.
#[derive(Debug, Clone)]
pub enum Scope {
    /// The operator: every application.
    All,
    /// One application (a portal session): every query is filtered by it.
    App(App),
}

impl Scope {
    fn app_id(&self) -> Option<&AppId> {
        match self {
            Scope::All => None,
            Scope::App(app) => Some(&app.id),
        }
    }
}

/// Who is looking, as the components need it.
pub struct View {
    pub scope: Scope,
    /// Where this UI's routes start: `/dashboard`, or the portal's prefix.
    pub base: String,
    /// Whether resend forms may be shown (the server checks again).
    pub can_resend: bool,
    /// The hidden CSRF field every form of this session carries.
    pub csrf: Markup,
}

impl View {
    pub fn messages_href(&self) -> String {
        format!("{}/messages", self.base)
    }

    pub fn message_href(&self, app: &AppId, msg: &str) -> String {
        format!("{}/msg/{msg}", self.app_href(app))
    }

    pub fn endpoint_href(&self, app: &AppId, ep: &EndpointId) -> String {
        format!("{}/endpoint/{ep}", self.app_href(app))
    }

    /// Where an application's pages start: `/dashboard/app/{app}` for the
    /// operator; a portal, scoped to its one application, has no
    /// application in its paths (its session says which).
    pub fn app_href(&self, app: &AppId) -> String {
        match self.scope {
            Scope::App(_) => self.base.clone(),
            Scope::All => format!("{}/app/{app}", self.base),
        }
    }

    /// The application a path names, if this view may see it: another
    /// application than the scope's is "not found", as if it did not exist.
    pub async fn resolve_app(&self, state: &ApiState, id_or_uid: &str) -> DashResult<App> {
        let app = find_app(state, id_or_uid).await?;
        match &self.scope {
            Scope::App(own) if own.id != app.id => Err(DashError::NotFound("application")),
            _ => Ok(app),
        }
    }
}

/// The messages page's query: the filters as typed, and the page.
#[derive(Debug, Deserialize, Default, Clone)]
pub struct MessagesQuery {
    /// Application id or uid (operator scope only).
    pub app: Option<String>,
    pub event_type: Option<String>,
    /// Message id or `eventId`.
    pub id: Option<String>,
    /// `pending`, `delivering`, `delivered` or `dead` (`failed` too).
    pub status: Option<String>,
    /// Created at or after this time (UTC).
    pub created_after: Option<String>,
    /// Created before this time (UTC).
    pub created_before: Option<String>,
    /// Sent on this channel.
    pub channel: Option<String>,
    pub after: Option<String>,
    pub before: Option<String>,
}

const SEARCH_FIELDS: [&str; 7] = [
    "app",
    "event_type",
    "id",
    "status",
    "created_after",
    "created_before",
    "channel",
];

/// The search as typed (trimmed), echoed back into the form and links.
#[derive(Debug, Default, Clone)]
pub struct SearchText {
    pub app: String,
    pub event_type: String,
    pub id: String,
    pub status: String,
    pub created_after: String,
    pub created_before: String,
    pub channel: String,
}

impl SearchText {
    pub fn from_query(q: &MessagesQuery) -> Self {
        let t = |v: &Option<String>| v.as_deref().unwrap_or("").trim().to_owned();
        SearchText {
            app: t(&q.app),
            event_type: t(&q.event_type),
            id: t(&q.id),
            status: t(&q.status),
            created_after: t(&q.created_after),
            created_before: t(&q.created_before),
            channel: t(&q.channel),
        }
    }

    fn pairs(&self) -> [(&'static str, &str); 7] {
        let values = [
            self.app.as_str(),
            &self.event_type,
            &self.id,
            &self.status,
            &self.created_after,
            &self.created_before,
            &self.channel,
        ];
        named_fields(&SEARCH_FIELDS, values)
    }
}

/// A delivery status as typed in the search.
pub fn parse_status(text: &str) -> Result<Option<DeliveryState>, String> {
    Ok(Some(match text.to_ascii_lowercase().as_str() {
        "" => return Ok(None),
        "pending" => DeliveryState::Pending,
        "delivering" => DeliveryState::Delivering,
        "delivered" => DeliveryState::Delivered,
        "dead" | "failed" => DeliveryState::Dead,
        _ => return Err("status: one of pending, delivering, delivered, dead".to_owned()),
    }))
}

/// The store's filter for a search in `view`'s scope, or a message naming
/// the field that is wrong.
pub async fn resolve_search(
    view: &View,
    state: &ApiState,
    text: &SearchText,
) -> Result<FindFilter, DashError> {
    let bad = DashError::BadRequest;
    let app = match (&view.scope, text.app.as_str()) {
        (Scope::App(own), _) => Some(own.id.clone()),
        (Scope::All, "") => None,
        (Scope::All, a) => Some(
            find_app(state, a)
                .await
                .map_err(|e| match e {
                    ApiError::NotFound(_) => {
                        bad(format!("app: no application has the id or uid {a:?}"))
                    }
                    other => other.into(),
                })?
                .id,
        ),
    };
    let nonempty = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    let created_after = parse_time("created_after", &text.created_after).map_err(bad)?;
    let created_before = parse_time("created_before", &text.created_before).map_err(bad)?;
    if let (Some(a), Some(b)) = (created_after, created_before) {
        if b <= a {
            return Err(bad(
                "created_before: must be later than created_after".into()
            ));
        }
    }
    Ok(FindFilter {
        app,
        event_type: nonempty(&text.event_type),
        id_or_event_id: nonempty(&text.id),
        status: parse_status(&text.status).map_err(bad)?,
        created_after,
        created_before,
        channel: nonempty(&text.channel),
    })
}

/// The search form.
pub fn search_form(view: &View, text: &SearchText) -> Markup {
    let statuses = [
        ("", "any"),
        ("pending", "pending"),
        ("delivering", "delivering"),
        ("delivered", "delivered"),
        ("dead", "failed (dead)"),
    ];
    html! {
        form.filters method="get" action=(view.messages_href()) {
            @if matches!(view.scope, Scope::All) {
                label { "Application" input name="app" value=(text.app) placeholder="app_… or uid"; }
            }
            label { "Message id or eventId" input name="id" value=(text.id) placeholder="msg_… or inv-42"; }
            label { "Event type" input name="event_type" value=(text.event_type) placeholder="invoice.paid"; }
            label { "Channel" input name="channel" value=(text.channel) placeholder="project-1"; }
            label { "Delivery status"
                select name="status" {
                    @for (value, shown) in statuses {
                        option value=(value) selected[text.status.eq_ignore_ascii_case(value)] { (shown) }
                    }
                }
            }
            label { "Created after (UTC)" input name="created_after" value=(text.created_after) placeholder="2026-11-30 08:00"; }
            label { "Created before (UTC)" input name="created_before" value=(text.created_before) placeholder="2026-11-30 18:00"; }
            button.primary type="submit" { "Search" }
            a href=(view.messages_href()) { "Clear" }
        }
    }
}

/// A message's deliveries by state, as badges.
pub fn delivery_summary(c: &DeliveryCounts) -> Markup {
    html! {
        @if c.delivered > 0 { (badge(Tone::Ok, &format!("{} delivered", c.delivered))) " " }
        @if c.pending > 0 { (badge(Tone::Warn, &format!("{} pending", c.pending))) " " }
        @if c.delivering > 0 { (badge(Tone::Warn, &format!("{} delivering", c.delivering))) " " }
        @if c.dead > 0 { (badge(Tone::Bad, &format!("{} dead", c.dead))) " " }
        @if c.delivered + c.pending + c.delivering + c.dead == 0 {
            span.muted { "no endpoint" }
        }
    }
}

/// The messages found, newest first, each linking to its page.
pub fn messages_table(view: &View, items: &[FoundMessage], now: Millis) -> Markup {
    let all_apps = matches!(view.scope, Scope::All);
    html! {
        div.scroll {
            table.messages {
                thead {
                    tr {
                        th { "Message" }
                        @if all_apps { th { "Application" } }
                        th { "Event type" }
                        th { "eventId" }
                        th { "Created" }
                        th { "Deliveries" }
                    }
                }
                tbody {
                    @for m in items {
                        tr {
                            td.mono.small { a href=(view.message_href(&m.app_id, m.id.as_str())) { (m.id) } }
                            @if all_apps {
                                td { a href=(view.app_href(&m.app_id)) { (if m.app_name.is_empty() { m.app_id.as_str() } else { m.app_name.as_str() }) } }
                            }
                            td { code { (m.event_type) } }
                            td.mono.small { @match &m.event_id { Some(e) => (truncate(e, 40)), None => span.muted { "–" } } }
                            td { (when(m.created_at)) div.small.muted { (ago(Some(m.created_at), now)) } }
                            td { (delivery_summary(&m.deliveries)) }
                        }
                    }
                }
            }
        }
    }
}

/// The messages page's body: the search `query` asks for, or, when its
/// filter is wrong, why above the form (which keeps what was typed) and a
/// 400.
pub async fn messages_search(
    view: &View,
    state: &ApiState,
    query: &MessagesQuery,
) -> DashResult<(StatusCode, Markup)> {
    let text = SearchText::from_query(query);
    let cursor = Cursor::new(&query.after, &query.before);
    let (status, found) = match search_page(view, state, &text, &cursor).await {
        Ok(markup) => (StatusCode::OK, markup),
        Err(DashError::BadRequest(why)) => (
            StatusCode::BAD_REQUEST,
            html! { div.error role="alert" { (why) } (search_form(view, &text)) },
        ),
        Err(other) => return Err(other),
    };
    let body = html! {
        h1 { "Messages" small { "newest first" } }
        (found)
    };
    Ok((status, body))
}

/// One page of a search, with its pager links.
pub async fn search_page(
    view: &View,
    state: &ApiState,
    text: &SearchText,
    cursor: &Cursor,
) -> Result<Markup, DashError> {
    let filter = resolve_search(view, state, text).await?;
    let page = state
        .store
        .find_messages(&filter, &cursor.request(PAGE_SIZE))
        .await?;
    let listed = cursor.finish(page, |m| m.id.as_str().to_owned());
    let link = |key: &'static str, id: &str| {
        let mut pairs: Vec<(&str, &str)> = text.pairs().to_vec();
        pairs.push((key, id));
        format!("{}{}", view.messages_href(), query_string(pairs))
    };
    let prev = listed
        .newer
        .as_deref()
        .map(|id| (link("before", id), "Newer"));
    let next = listed
        .older
        .as_deref()
        .map(|id| (link("after", id), "Older"));
    let first = (!cursor.is_first_page())
        .then(|| format!("{}{}", view.messages_href(), query_string(text.pairs())));
    Ok(html! {
        (search_form(view, text))
        @if listed.items.is_empty() {
            p.muted { "No message matches." }
        } @else {
            (messages_table(view, &listed.items, now_millis()))
        }
        (layout::pager(prev, next, first))
    })
}

fn state_badge(d: &Delivery) -> Markup {
    match d.state {
        DeliveryState::Delivered => badge(Tone::Ok, "delivered"),
        DeliveryState::Dead => html! { (badge(Tone::Bad, "dead")) " " (reason_badge(d)) },
        other => badge(Tone::Warn, other.as_str()),
    }
}

/// Each endpoint's delivery of the message, with a resend form per
/// endpoint when the view allows it.
pub fn deliveries_table(
    view: &View,
    message: &Message,
    deliveries: &[Delivery],
    endpoints: &HashMap<EndpointId, Endpoint>,
    now: Millis,
) -> Markup {
    let expunged = message.payload.is_empty();
    html! {
        table.deliveries {
            thead {
                tr {
                    th { "Endpoint" }
                    th { "State" }
                    th.num { "Attempts" }
                    th { "Last result" }
                    th { "Next attempt" }
                    @if view.can_resend { th {} }
                }
            }
            tbody {
                @for d in deliveries {
                    tr {
                        td {
                            a.clip href=(view.endpoint_href(&d.app_id, &d.endpoint_id)) {
                                @match endpoints.get(&d.endpoint_id) {
                                    Some(ep) => (truncate(&masked_url(&ep.url), 60)),
                                    None => { (d.endpoint_id) " (deleted)" },
                                }
                            }
                            div.small.muted.mono { (d.id) }
                        }
                        td { (state_badge(d)) }
                        td.num { (d.attempts) }
                        td { (last_result(d)) }
                        td { (next_attempt(d, endpoints.get(&d.endpoint_id), now)) }
                        @if view.can_resend {
                            td {
                                @if !expunged && endpoints.contains_key(&d.endpoint_id) {
                                    form method="post" action=(format!("{}/endpoint/{}/resend", view.message_href(&d.app_id, message.id.as_str()), d.endpoint_id)) {
                                        (view.csrf)
                                        button type="submit" title="One more attempt now, with the same Idempotency-Key" { "Resend" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Attempts of a message (every endpoint's), oldest first.
pub fn message_attempts_table(
    view: &View,
    attempts: &[AttemptRecord],
    endpoints: &HashMap<EndpointId, Endpoint>,
    now: Millis,
) -> Markup {
    html! {
        table.attempts {
            thead {
                tr {
                    th { "Time" }
                    th { "Endpoint" }
                    th.num { "#" }
                    th { "Result" }
                    th.num { "Status" }
                    th.num { "Duration" }
                    th { "Response" }
                }
            }
            tbody {
                @for a in attempts {
                    tr {
                        td {
                            (when(a.started_at))
                            div.small.muted { (ago(Some(a.started_at), now)) @if a.manual { " · manual" } }
                        }
                        td {
                            // An endpoint deleted since has no page to link to.
                            @match endpoints.get(&a.endpoint_id) {
                                Some(ep) => a.clip.narrow href=(view.endpoint_href(&a.app_id, &a.endpoint_id)) title=(a.url) {
                                    (truncate(&masked_url(&ep.url), 40))
                                },
                                None => span.clip.narrow title=(a.url) {
                                    (truncate(&a.url, 40)) " (deleted)"
                                },
                            }
                        }
                        td.num { (a.attempt_number) }
                        td {
                            @if a.success { (badge(Tone::Ok, "success")) } @else { (badge(Tone::Bad, "failed")) }
                            @if let Some(error) = &a.error { div.small.clip.narrow title=(error) { (truncate(error, 48)) } }
                        }
                        (layout::code_and_duration(a.status_code, a.duration_ms))
                        td { (layout::response_cell(&a.response)) }
                    }
                }
            }
        }
    }
}

/// The payload, re-indented and bounded (as on the delivery page).
pub fn payload_section(message: &Message) -> Markup {
    let shown = pretty_json(&message.payload, SHOWN_PAYLOAD_BYTES);
    html! {
        @if message.payload.is_empty() {
            // Stored as the empty text once erased (no JSON is empty).
            p.muted { "The payload was expunged (erased on request or by payload retention); nothing is sent for this message any more." }
        } @else {
            pre.payload { (shown.text) }
            @if shown.cut {
                p.muted.small {
                    "Only the first " (SHOWN_PAYLOAD_BYTES / 1024) " KiB are shown; the payload is "
                    (message.payload.len()) " bytes as sent."
                }
            }
        }
    }
}

/// The message's page body: facts, deliveries, payload, attempts (a page
/// of them after `after`, oldest first).
pub async fn message_body(
    view: &View,
    state: &ApiState,
    app: &App,
    msg_id: &str,
    after: Option<String>,
) -> DashResult {
    let now = now_millis();
    if view.scope.app_id().is_some_and(|own| *own != app.id) {
        return Err(DashError::NotFound("message"));
    }
    let message = state
        .store
        .get_message(&app.id, msg_id)
        .await?
        .ok_or(DashError::NotFound("message"))?;
    let deliveries = state
        .store
        .list_deliveries_of_message(&app.id, &message.id)
        .await?;
    // One read per endpoint the message went to, side by side; an
    // endpoint deleted since is simply absent.
    let found = futures::future::try_join_all(
        deliveries
            .iter()
            .map(|d| state.store.get_endpoint(&app.id, d.endpoint_id.as_str())),
    )
    .await?;
    let endpoints: HashMap<EndpointId, Endpoint> = found
        .into_iter()
        .flatten()
        .map(|ep| (ep.id.clone(), ep))
        .collect();
    let attempts = state
        .store
        .list_attempts_of_message(
            &app.id,
            &message.id,
            &PageReq {
                limit: PAGE_SIZE,
                after: after.clone(),
                ascending: true,
                backwards: false,
            },
        )
        .await?;
    let here = view.message_href(&app.id, message.id.as_str());
    let next = attempts
        .has_more
        .then(|| attempts.items.last().map(|a| a.id.as_str().to_owned()))
        .flatten();
    Ok(html! {
        h1 { "Message " small.mono { (message.id) } }
        dl.facts {
            dt { "Application" }
            dd { a href=(view.app_href(&app.id)) { (app_label(app)) } " " span.muted.mono.small { (app.id) } }
            dt { "Event type" }
            dd { code { (message.event_type) } }
            dt { "eventId" }
            dd.mono { @match &message.event_id { Some(e) => (e), None => span.muted { "–" } } }
            dt { "Created" }
            dd { (when(message.created_at)) " " span.muted.small { (ago(Some(message.created_at), now)) } }
            @if let Some(channels) = &message.channels {
                dt { "Channels" }
                dd { (channels.join(", ")) }
            }
            @if let Some(tags) = &message.tags {
                dt { "Tags" }
                dd { (tags.join(", ")) }
            }
        }
        h2 { "Deliveries" small { "one per endpoint" } }
        @if deliveries.is_empty() {
            p.muted { "No endpoint was subscribed to this message." }
        } @else {
            (deliveries_table(view, &message, &deliveries, &endpoints, now))
        }
        h2 { "Payload" small { "as sent, re-indented" } }
        (payload_section(&message))
        h2 { "Attempts" small { "oldest first" } }
        @if attempts.items.is_empty() {
            p.muted { "No attempts yet." }
        } @else {
            (message_attempts_table(view, &attempts.items, &endpoints, now))
        }
        (layout::pager(
            None,
            next.map(|id| (format!("{here}{}", query_string([("after", id.as_str())])), "Later attempts")),
            after.map(|_| here.clone()),
        ))
    })
}

/// The operator's view: every application, links under `/dashboard`,
/// resend allowed.
pub fn operator_view(session: &Authed) -> View {
    View {
        scope: Scope::All,
        base: "/dashboard".to_owned(),
        can_resend: true,
        csrf: layout::csrf_field(session),
    }
}

/// `GET /dashboard/messages`.
pub async fn messages_page(
    session: Authed,
    State(state): State<ApiState>,
    Query(query): Query<MessagesQuery>,
) -> DashResult<Response> {
    let view = operator_view(&session);
    let (status, body) = messages_search(&view, &state, &query).await?;
    Ok((
        status,
        layout::page(&session, "Messages", Nav::Messages, body),
    )
        .into_response())
}

#[derive(Debug, Deserialize, Default)]
pub struct MessagePageQuery {
    /// Attempts after this attempt id.
    pub after: Option<String>,
}

/// `GET /dashboard/app/{app}/msg/{msg}` (the message by id or `eventId`).
pub async fn message_page(
    session: Authed,
    State(state): State<ApiState>,
    Path((app_id, msg_id)): Path<(String, String)>,
    Query(query): Query<MessagePageQuery>,
) -> DashResult {
    let view = operator_view(&session);
    let app = view.resolve_app(&state, &app_id).await?;
    let after = query.after.filter(|a| !a.is_empty());
    let body = message_body(&view, &state, &app, &msg_id, after).await?;
    Ok(layout::page(
        &session,
        &format!("Message {msg_id}"),
        Nav::Messages,
        body,
    ))
}

/// What a resend says it did: a delivery to a disabled endpoint is
/// queued but held until the endpoint is enabled, not tried now.
pub fn resent_note(resent: &crate::api::messages::Resent) -> &'static str {
    if resent.held {
        "Resent, but held: the endpoint is disabled, and the attempt is made once it is enabled."
    } else {
        "Resent: one more attempt is queued now."
    }
}

/// `POST /dashboard/app/{app}/msg/{msg}/endpoint/{ep}/resend`: the API's
/// resend (one manual attempt now), audited as the dashboard session.
pub async fn resend(
    State(state): State<ApiState>,
    Path((app_id, msg_id, endpoint_id)): Path<(String, String, String)>,
    posted: Posted,
) -> DashResult<Response> {
    let view = operator_view(&posted.session);
    let app = view.resolve_app(&state, &app_id).await?;
    let actor = posted.session.actor();
    let back = view.message_href(&app.id, &msg_id);
    match crate::api::messages::resend_to(&state, &actor, &app.id, &msg_id, &endpoint_id).await {
        Ok(resent) => {
            let id = &resent.msg_id;
            tracing::info!(message = %id, endpoint = %endpoint_id, "message resent from the dashboard");
            posted.session.flash(resent_note(&resent)).await;
            Ok(see_other(&view.message_href(&app.id, id.as_str())))
        }
        Err(ApiError::Conflict(why)) => {
            posted.session.flash(format!("Not resent: {why}.")).await;
            Ok(see_other(&back))
        }
        Err(other) => Err(other.into()),
    }
}

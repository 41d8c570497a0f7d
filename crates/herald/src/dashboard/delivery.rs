//! `/dashboard/app/{app}/delivery/{dlv}`: one delivery (one message to one
//! endpoint): its payload, the headers Herald sends with it, every attempt,
//! and a replay button while it is dead.

use std::collections::BTreeMap;

use axum::extract::{Path, Query, State};
use axum::response::Response;
use maud::{html, Markup};
use serde::Deserialize;

use super::dead::{last_result, reason_badge};
use super::layout::{self, ago, badge, when, Nav, Tone};
use super::overview::app_label;
use super::session::{Authed, Posted};
use super::{query_string, see_other, DashError, DashResult, PAGE_SIZE};
use crate::api::apps::find_app;
use crate::api::ApiState;
use crate::ids::{AppId, DeliveryId};
use crate::store::{now_millis, AttemptRecord, Delivery, DeliveryState, Millis, PageReq};

#[derive(Debug, Deserialize, Default)]
pub struct DeliveryQuery {
    /// Attempts after this attempt id.
    pub after: Option<String>,
}

/// The most of a payload shown, re-indented (the whole one is in the API):
/// the page stays small whatever a tenant sends.
pub(super) const SHOWN_PAYLOAD_BYTES: usize = 256 * 1024;
/// Indentation stops growing past this depth, so a line never costs more
/// than this however deep the payload nests.
const MAX_INDENT_DEPTH: usize = 32;

/// Raw pages of the message's attempts read at most per view, looking for
/// this delivery's (a message fanned out to many endpoints has many).
const MAX_SCANNED_PAGES: usize = 20;
const SCAN_PAGE: usize = 250;

fn delivery_path(app: &AppId, id: &DeliveryId) -> String {
    format!("/dashboard/app/{app}/delivery/{id}")
}

pub async fn page(
    session: Authed,
    State(state): State<ApiState>,
    Path((app_id, delivery_id)): Path<(String, String)>,
    Query(query): Query<DeliveryQuery>,
) -> DashResult {
    let now = now_millis();
    let app = find_app(&state, &app_id).await?;
    let id = DeliveryId::parse(&delivery_id).ok_or(DashError::NotFound("delivery"))?;
    let d = state
        .store
        .get_delivery(&app.id, &id)
        .await?
        .ok_or(DashError::NotFound("delivery"))?;
    // Either may be gone (retention, a deleted endpoint); the page says so.
    let message = state.store.get_message(&app.id, d.msg_id.as_str()).await?;
    let endpoint = state
        .store
        .get_endpoint(&app.id, d.endpoint_id.as_str())
        .await?;
    let after = query.after.filter(|a| !a.is_empty());
    let (attempts, next) = attempts_of(&state, &d, after.clone()).await?;

    let payload = message.as_ref().map(|m| {
        (
            pretty_json(&m.payload, SHOWN_PAYLOAD_BYTES),
            m.payload.len(),
        )
    });

    let here = delivery_path(&app.id, &d.id);
    let endpoint_href = format!("/dashboard/app/{}/endpoint/{}", app.id, d.endpoint_id);
    let body = html! {
        h1 { "Delivery " small.mono { (d.id) } }
        div.columns {
            section {
                dl.facts {
                    dt { "State" }
                    dd {
                        @match d.state {
                            DeliveryState::Delivered => (badge(Tone::Ok, "delivered")),
                            DeliveryState::Dead => { (badge(Tone::Bad, "dead")) " " (reason_badge(&d)) },
                            other => (badge(Tone::Warn, other.as_str())),
                        }
                    }
                    dt { "Application" }
                    dd { a href=(format!("/dashboard?app={}", app.id)) { (app_label(&app)) } }
                    dt { "Endpoint" }
                    dd {
                        a href=(endpoint_href) {
                            @match &endpoint {
                                Some(ep) => (ep.url),
                                None => { (d.endpoint_id) " (deleted)" },
                            }
                        }
                    }
                    dt { "Message" }
                    dd.mono { (d.msg_id) }
                    dt { "Event type" }
                    dd { code { (d.event_type) } }
                    @if let Some(event_id) = message.as_ref().and_then(|m| m.event_id.as_ref()) {
                        dt { "Event id" }
                        dd.mono { (event_id) }
                    }
                    dt { "Attempts" }
                    dd { (d.attempts) }
                    dt { "Last result" }
                    dd { (last_result(&d)) }
                    @if matches!(d.state, DeliveryState::Pending | DeliveryState::Delivering) {
                        dt { "Next attempt" }
                        dd { (super::dead::next_attempt(&d, endpoint.as_ref(), now)) }
                    }
                    dt { "Created" }
                    dd { (when(d.created_at)) }
                    dt { "Last change" }
                    dd { (when(d.updated_at)) }
                }
                @if d.state == DeliveryState::Dead {
                    form.toolbar method="post" action=(format!("{here}/replay")) {
                        (layout::csrf_field(&session))
                        button.primary type="submit" { "Replay" }
                        span.muted.small { "A fresh retry cycle, with the same Idempotency-Key." }
                    }
                }
            }
            section {
                (headers_table(&d, endpoint.as_ref().map(|ep| &ep.headers)))
            }
        }
        h2 {
            "Payload"
            small { "as sent, re-indented" }
        }
        @match &payload {
            // Stored as the empty text once erased (no JSON is empty).
            Some((_, 0)) => p.muted { "The payload was expunged (erased on request or by payload retention); nothing is sent for this message any more." },
            Some((shown, sent_len)) => {
                pre { (shown.text) }
                @if shown.cut {
                    p.muted.small {
                        "Only the first " (SHOWN_PAYLOAD_BYTES / 1024) " KiB are shown; the payload is "
                        (sent_len) " bytes as sent. All of it: "
                        code { "GET /api/v1/app/" (app.id) "/msg/" (d.msg_id) }
                    }
                }
            },
            None => p.muted { "The message is no longer stored (retention)." },
        }
        h2 { "Attempts" small { "oldest first" } }
        @if attempts.is_empty() {
            p.muted { "No attempts yet." }
        } @else {
            (attempts_table(&attempts, now, false))
        }
        (layout::pager(
            None,
            next.map(|id| (format!("{here}{}", query_string([("after", id.as_str())])), "Later attempts")),
            after.map(|_| here.clone()),
        ))
    };
    Ok(layout::page(
        &session,
        &format!("Delivery {}", d.id),
        Nav::Other,
        body,
    ))
}

/// The delivery's attempts after `after`, oldest first, at most a page,
/// and the cursor of the next page. The store lists a message's attempts
/// (every endpoint's); this keeps the delivery's own, reading a bounded
/// number of pages.
async fn attempts_of(
    state: &ApiState,
    d: &Delivery,
    mut after: Option<String>,
) -> DashResult<(Vec<AttemptRecord>, Option<String>)> {
    let mut found = Vec::new();
    for _ in 0..MAX_SCANNED_PAGES {
        let page = state
            .store
            .list_attempts_of_message(
                &d.app_id,
                &d.msg_id,
                &PageReq {
                    limit: SCAN_PAGE,
                    after: after.clone(),
                    ascending: true,
                    backwards: false,
                },
            )
            .await?;
        let has_more = page.has_more;
        for a in page.items {
            after = Some(a.id.as_str().to_owned());
            if a.delivery_id == d.id {
                found.push(a);
                if found.len() == PAGE_SIZE {
                    return Ok((found, after));
                }
            }
        }
        if !has_more {
            return Ok((found, None));
        }
    }
    Ok((found, after))
}

/// A custom header's value as shown: credentials-looking ones are masked,
/// since a dashboard is often looked at over someone's shoulder.
pub fn shown_header_value(name: &str, value: &str) -> String {
    if crate::api::endpoint_secrets::is_sensitive_header(name) {
        "•••••• (hidden)".to_owned()
    } else {
        value.to_owned()
    }
}

fn headers_table(d: &Delivery, custom: Option<&BTreeMap<String, String>>) -> Markup {
    let next_attempt = d.attempts + 1;
    html! {
        table {
            thead { tr { th { "Header Herald sends" } th { "Value" } } }
            tbody {
                // The endpoint's own headers go first; Herald's below
                // replace any of the same name.
                @for (name, value) in custom.into_iter().flatten() {
                    tr {
                        td.mono { (name) }
                        td { span.mono { (shown_header_value(name, value)) } " " span.muted.small { "(the endpoint's)" } }
                    }
                }
                tr { td.mono { "content-type" } td.mono { "application/json" } }
                tr { td.mono { "user-agent" } td.mono { (crate::dispatch::sender::USER_AGENT) } }
                tr { td.mono { "webhook-id" } td.mono { (d.msg_id) } }
                tr {
                    td.mono { "webhook-timestamp" }
                    td { span.muted { "the attempt's time, Unix seconds" } }
                }
                tr {
                    td.mono { "webhook-signature" }
                    td { span.mono { "v1,…" } " " span.muted { "computed per attempt (HMAC-SHA256 of id.timestamp.payload)" } }
                }
                tr { td.mono { "idempotency-key" } td.mono { (d.id) } }
                tr { td.mono { "x-event-id" } td.mono { (d.id) } }
                tr { td.mono { "x-event-type" } td.mono { (d.event_type) } }
                tr {
                    td.mono { "x-attempt" }
                    td { span.mono { "1…" } " " span.muted { "the attempt's number; the next is " (next_attempt) } }
                }
            }
        }
    }
}

/// Attempts, one a row; `with_delivery` adds a column linking each one's
/// delivery (on pages listing several deliveries' attempts).
pub fn attempts_table(attempts: &[AttemptRecord], now: Millis, with_delivery: bool) -> Markup {
    html! {
        table {
            thead {
                tr {
                    th.num { "#" }
                    th { "Time" }
                    th { "Result" }
                    th.num { "Status" }
                    th.num { "Duration" }
                    th { "Error" }
                    th { "Response" }
                    @if with_delivery { th { "Delivery" } }
                }
            }
            tbody {
                @for a in attempts {
                    tr {
                        td.num { (a.attempt_number) }
                        td {
                            (when(a.started_at))
                            div.small.muted { (ago(Some(a.started_at), now)) @if a.manual { " · manual" } }
                        }
                        td {
                            @if a.success { (badge(Tone::Ok, "success")) } @else { (badge(Tone::Bad, "failed")) }
                        }
                        (layout::code_and_duration(a.status_code, a.duration_ms))
                        td {
                            @match &a.error {
                                Some(error) => div.small.clip title=(error) { (error) },
                                None => span.muted { "–" },
                            }
                        }
                        td { (layout::response_cell(&a.response)) }
                        @if with_delivery {
                            td.mono.small {
                                a href=(delivery_path(&a.app_id, &a.delivery_id)) { (a.delivery_id) }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A payload as the page shows it.
pub(super) struct ShownPayload {
    pub text: String,
    /// Cut at the limit.
    pub cut: bool,
}

/// JSON text re-indented for reading, keeping every token exactly as it
/// was sent (key order, number spelling), which a parse and re-print
/// would not. Text that is not JSON comes back as it was. Either is cut
/// at about `limit` bytes, and indentation stops growing at
/// [`MAX_INDENT_DEPTH`]: the work and the text are linear in the payload
/// and bounded, however deep it nests (re-indenting 100,000 nested arrays
/// in full would take 10 GB).
pub(super) fn pretty_json(raw: &str, limit: usize) -> ShownPayload {
    if serde_json::from_str::<serde::de::IgnoredAny>(raw).is_err() {
        let mut end = raw.len().min(limit);
        while !raw.is_char_boundary(end) {
            end -= 1;
        }
        return ShownPayload {
            text: raw[..end].to_owned(),
            cut: end < raw.len(),
        };
    }
    let mut out = String::with_capacity((raw.len() + raw.len() / 4).min(limit.saturating_add(256)));
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    let mut chars = raw.chars().peekable();
    let newline = |out: &mut String, depth: usize| {
        out.push('\n');
        for _ in 0..depth.min(MAX_INDENT_DEPTH) {
            out.push_str("  ");
        }
    };
    while let Some(c) = chars.next() {
        if out.len() >= limit {
            return ShownPayload {
                text: out,
                cut: true,
            };
        }
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push(c);
            }
            '{' | '[' => {
                out.push(c);
                // An empty container stays on one line.
                while chars.peek().is_some_and(|n| n.is_whitespace()) {
                    chars.next();
                }
                if matches!(chars.peek(), Some('}' | ']')) {
                    if let Some(close) = chars.next() {
                        out.push(close);
                    }
                } else {
                    depth += 1;
                    newline(&mut out, depth);
                }
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(c);
            }
            ',' => {
                out.push(c);
                newline(&mut out, depth);
            }
            ':' => out.push_str(": "),
            c if c.is_whitespace() => {}
            c => out.push(c),
        }
    }
    ShownPayload {
        text: out,
        cut: false,
    }
}

/// `POST …/delivery/{dlv}/replay`: replays it if it is dead.
pub async fn replay(
    State(state): State<ApiState>,
    Path((app_id, delivery_id)): Path<(String, String)>,
    posted: Posted,
) -> DashResult<Response> {
    let app = find_app(&state, &app_id).await?;
    let id = DeliveryId::parse(&delivery_id).ok_or(DashError::NotFound("delivery"))?;
    if crate::api::dead::replay_one(&state, &posted.session.actor(), &app.id, &id).await? {
        tracing::info!(delivery = %id, "delivery replayed from the dashboard");
        posted.session.flash("Replayed 1").await;
    } else {
        let d = state
            .store
            .get_delivery(&app.id, &id)
            .await?
            .ok_or(DashError::NotFound("delivery"))?;
        posted
            .session
            .flash(format!(
                "Not replayed: the delivery is {}, not dead.",
                d.state.as_str()
            ))
            .await;
    }
    Ok(see_other(&delivery_path(&app.id, &id)))
}

#[cfg(test)]
mod tests {
    use super::{pretty_json, shown_header_value, MAX_INDENT_DEPTH};

    #[test]
    fn credential_headers_are_masked() {
        assert_eq!(shown_header_value("X-Tenant", "acme"), "acme");
        for name in ["Authorization", "x-api-key", "X-Auth-Token", "Cookie"] {
            assert!(
                !shown_header_value(name, "s3cr3t").contains("s3cr3t"),
                "{name}"
            );
        }
    }

    #[test]
    fn json_is_reindented_without_touching_tokens() {
        let shown = |raw: &str| pretty_json(raw, usize::MAX).text;
        assert_eq!(
            shown(r#"{"b": 2,  "a":[1, 2.50],"s":"x, {y}: \"z\"","e":{},"l":[ ]}"#),
            "{\n  \"b\": 2,\n  \"a\": [\n    1,\n    2.50\n  ],\n  \"s\": \"x, {y}: \\\"z\\\"\",\n  \"e\": {},\n  \"l\": []\n}"
        );
        assert_eq!(shown("not json {"), "not json {");
        assert_eq!(shown("42"), "42");
    }

    #[test]
    fn deep_or_long_payloads_are_cut_and_indented_no_deeper_than_the_cap() {
        let deep = format!("{}{}", "[1,".repeat(1000), "]".repeat(1000)).replace(",]", "]");
        let all = pretty_json(&deep, usize::MAX);
        assert!(!all.cut);
        let widest = all.text.lines().map(str::len).max().unwrap_or(0);
        assert_eq!(
            widest,
            2 * MAX_INDENT_DEPTH + 2,
            "no line indented past the cap"
        );
        let cut = pretty_json(&deep, 1000);
        assert!(cut.cut);
        assert!(cut.text.len() < 1000 + 2 * MAX_INDENT_DEPTH + 2);
        assert!(all.text.starts_with(&cut.text));
        let not_json = "é".repeat(1000);
        let cut = pretty_json(&not_json, 1001);
        assert!(cut.cut);
        assert_eq!(cut.text, "é".repeat(500));
    }
}

//! The shared page frame (header, navigation, flash message), its style and
//! script, and small renderers used by several pages: times, durations,
//! badges, the hourly chart, pagers.

use std::sync::LazyLock;

use base64::Engine;
use maud::{html, Markup, PreEscaped, DOCTYPE};
use sha2::{Digest, Sha256};

use super::session::{Authed, CSRF_FIELD};
use crate::health::HourPoint;
use crate::store::Millis;

const STYLE: &str = r#"
:root { --fg:#1f2328; --muted:#656d76; --line:#d8dee4; --soft:#f6f8fa; --accent:#0969da;
        --ok:#1a7f37; --bad:#cf222e; --warn:#9a6700; }
* { box-sizing: border-box; }
body { margin: 0; color: var(--fg); background: #fff;
       font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
a { color: var(--accent); text-decoration: none; }
a:hover { text-decoration: underline; }
header { display: flex; align-items: center; gap: 22px; padding: 10px 28px; background: #24292f; }
header .brand { color: #fff; font-weight: 650; font-size: 16px; letter-spacing: .01em; }
header nav { display: flex; gap: 18px; }
header nav a { color: #c9d1d9; }
header nav a.active { color: #fff; font-weight: 600; }
header form { margin: 0 0 0 auto; }
header button { background: transparent; color: #c9d1d9; border-color: #57606a; }
main { max-width: 1380px; margin: 0 auto; padding: 20px 28px 56px; }
h1 { font-size: 20px; margin: 4px 0 16px; }
h2 { font-size: 15px; margin: 28px 0 10px; }
h1 small, h2 small { font-weight: 400; color: var(--muted); font-size: 13px; margin-left: 8px; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 6px 6px; border-bottom: 1px solid var(--line); vertical-align: top; }
thead th { font-size: 11.5px; text-transform: uppercase; letter-spacing: .04em; color: var(--muted);
           font-weight: 600; background: var(--soft); white-space: nowrap; }
thead tr.group th { text-align: center; border-bottom: 0; padding-bottom: 0; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tbody tr:hover { background: #fbfcfd; }
a.muted { color: var(--muted); }
tr.failing td:first-child { box-shadow: inset 3px 0 var(--bad); }
tr.disabled td:first-child { box-shadow: inset 3px 0 #8c959f; }
.muted { color: var(--muted); }
.small { font-size: 12px; }
.nowrap { white-space: nowrap; }
.scroll { overflow-x: auto; }
.clip { display: block; max-width: 340px; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.clip.narrow { max-width: 170px; }
code, pre, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12.5px; }
pre { background: var(--soft); border: 1px solid var(--line); border-radius: 6px; padding: 12px;
      overflow: auto; max-height: 520px; margin: 0; }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(120px, 1fr)); gap: 12px; }
.card { border: 1px solid var(--line); border-radius: 8px; padding: 10px 14px; }
.card .label { font-size: 12px; color: var(--muted); }
.card .value { font-size: 22px; font-weight: 600; font-variant-numeric: tabular-nums; }
.card.alert { border-color: #ffcecb; background: #fff8f7; }
.badge { display: inline-block; padding: 0 8px; border-radius: 10px; font-size: 12px; font-weight: 600;
         white-space: nowrap; line-height: 20px; }
.badge.ok { background: #dafbe1; color: var(--ok); }
.badge.bad { background: #ffebe9; color: var(--bad); }
.badge.warn { background: #fff8c5; color: var(--warn); }
.badge.off { background: #eaeef2; color: #424a53; }
.flash, .error { padding: 9px 14px; border-radius: 6px; margin: 0 0 16px; }
.flash { background: #dafbe1; border: 1px solid #aceebb; }
.error { background: #ffebe9; border: 1px solid #ffcecb; }
button, .button { font: inherit; font-size: 13px; padding: 5px 12px; border-radius: 6px; cursor: pointer;
                  border: 1px solid var(--line); background: var(--soft); color: var(--fg); }
button:hover { border-color: #afb8c1; }
button.primary { background: var(--accent); border-color: var(--accent); color: #fff; }
button.danger { background: #fff; border-color: #ffcecb; color: var(--bad); }
input, select { font: inherit; font-size: 13px; padding: 4px 8px; border: 1px solid var(--line);
                border-radius: 6px; background: #fff; }
form.filters { display: flex; flex-wrap: wrap; gap: 10px; align-items: flex-end; margin-bottom: 8px; }
form.filters label { display: flex; flex-direction: column; gap: 2px; font-size: 12px; color: var(--muted); }
.toolbar { display: flex; flex-wrap: wrap; gap: 10px; align-items: center; margin: 12px 0; }
.toolbar .spacer { flex: 1; }
.pager { display: flex; gap: 18px; margin-top: 12px; }
.columns { display: grid; grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); gap: 28px; }
dl.facts { display: grid; grid-template-columns: max-content minmax(0, 1fr); gap: 5px 18px; margin: 0; }
dl.facts dt { color: var(--muted); }
table + dl.facts { margin-top: 14px; }
dl.facts dd { margin: 0; overflow-wrap: anywhere; }
.login { max-width: 380px; margin: 14vh auto; padding: 28px; border: 1px solid var(--line); border-radius: 10px; }
.login form { display: flex; flex-direction: column; gap: 10px; margin-top: 16px; }
.login h1 { margin: 0 0 4px; }
svg.chart { display: block; }
svg .attempts { fill: #9fb3c8; }
svg .failures { fill: var(--bad); }
svg .latency { fill: none; stroke: #6b4fbb; stroke-width: 1.5; }
svg .axis { stroke: #afb8c1; }
svg .track { fill: var(--soft); }
svg text { font-size: 10px; fill: var(--muted); }
.legend { font-size: 12px; color: var(--muted); margin-top: 4px; }
.legend i { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin: 0 4px 0 10px; }
.legend i.a { background: #9fb3c8; }
.legend i.f { background: var(--bad); }
/* A long name, URL or type without a break point wraps rather than widens the page. */
td, h1, h2, label, legend, .flash, .error, .card .value { overflow-wrap: anywhere; }
@media (max-width: 760px) {
  header { flex-wrap: wrap; gap: 6px 16px; padding: 10px 14px; }
  header nav { flex-wrap: wrap; gap: 4px 14px; }
  main { padding: 14px 14px 40px; }
  .columns { grid-template-columns: minmax(0, 1fr); }
  /* A table wider than the screen scrolls within itself, not the page. */
  table { display: block; overflow-x: auto; }
  svg.chart { max-width: 100%; height: auto; }
}
"#;

/// "Select all" and the selected count on bulk forms, a confirmation on
/// buttons that ask for one, and the secret's reveal. Without script the
/// pages still work (the reveal link opens the secret as text).
const SCRIPT: &str = r#"
(function () {
  function boxes(form) { return Array.prototype.slice.call(form.querySelectorAll('input[name="id"]')); }
  function recount(form) {
    var n = boxes(form).filter(function (b) { return b.checked; }).length;
    form.querySelectorAll('[data-selected-count]').forEach(function (el) { el.textContent = n + ' selected'; });
  }
  document.querySelectorAll('form[data-bulk]').forEach(function (form) {
    form.addEventListener('change', function (e) {
      if (e.target.hasAttribute('data-select-all')) {
        boxes(form).forEach(function (b) { b.checked = e.target.checked; });
      }
      recount(form);
    });
    recount(form);
  });
  document.querySelectorAll('[data-confirm]').forEach(function (el) {
    el.addEventListener('click', function (e) {
      if (!window.confirm(el.getAttribute('data-confirm'))) { e.preventDefault(); }
    });
  });
  document.querySelectorAll('a[data-reveal]').forEach(function (a) {
    a.addEventListener('click', function (e) {
      e.preventDefault();
      fetch(a.href, { credentials: 'same-origin', redirect: 'manual' }).then(function (r) {
        // A session that has ended is sent to the sign-in page, whose HTML is no secret.
        if (r.type === 'opaqueredirect') { throw new Error('signed out: reload the page to sign in'); }
        if (!r.ok) { throw new Error('HTTP ' + r.status); }
        return r.text();
      }).then(function (text) {
        document.getElementById(a.getAttribute('data-reveal')).textContent = text;
        a.hidden = true;
      }).catch(function (err) { a.textContent = 'could not load it (' + err.message + ')'; });
    });
  });
})();
"#;

fn sha256_source(text: &str) -> String {
    format!(
        "'sha256-{}'",
        base64::engine::general_purpose::STANDARD.encode(Sha256::digest(text.as_bytes()))
    )
}

/// Only this module's own style and script may run (allowed by their
/// hashes); a value that escaped escaping still could not run script.
pub static CONTENT_SECURITY_POLICY: LazyLock<String> =
    LazyLock::new(|| content_security_policy(None, "'none'"));

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Nav {
    Overview,
    Messages,
    Apps,
    Dead,
    Audit,
    Other,
}

/// Who a page is for: the operator, or an application's customers in the
/// portal (with its theme). Both share this frame, style and components.
pub(crate) enum Audience<'a> {
    Operator,
    Portal(&'a crate::config::Theme),
}

impl Audience<'_> {
    fn name(&self) -> &str {
        match self {
            Audience::Operator => "Herald",
            Audience::Portal(theme) => &theme.product_name,
        }
    }

    /// The style added to the shared one (allowed by its hash, as
    /// [`content_security_policy`] lists it).
    pub(crate) fn theme_style(&self) -> Option<String> {
        match self {
            Audience::Operator => None,
            Audience::Portal(theme) => Some(portal_style(theme)),
        }
    }
}

/// The portal's theme as CSS; the colour is checked (`#rgb`/`#rrggbb`)
/// before it gets here.
fn portal_style(theme: &crate::config::Theme) -> String {
    let accent = if crate::config::Theme::valid_color(&theme.primary_color) {
        theme.primary_color.as_str()
    } else {
        "#0969da"
    };
    let mut css = format!(
        ":root {{ --accent:{accent}; }} header {{ background: {accent}; }} \
         header nav a, header button {{ color: #fff; }} header nav a.active {{ text-decoration: underline; }}"
    );
    if theme.dark_mode {
        css.push_str(
            " :root { --fg:#e6edf3; --muted:#9198a1; --line:#30363d; --soft:#161b22; } \
             body { background:#0d1117; } input, select, textarea { background:#0d1117; color:#e6edf3; } \
             tbody tr:hover { background:#161b22; } button.danger { background:#0d1117; } \
             .card.alert { background:#2d1214; }",
        );
    }
    css
}

/// The CSP of a page: only the shared style and script (and a portal's
/// theme style) may run, by their hashes; `frame_ancestors` says who may
/// frame it.
pub(crate) fn content_security_policy(extra_style: Option<&str>, frame_ancestors: &str) -> String {
    let styles = match extra_style {
        Some(extra) => format!("{} {}", sha256_source(STYLE), sha256_source(extra)),
        None => sha256_source(STYLE),
    };
    format!(
        "default-src 'none'; style-src {styles}; script-src {}; connect-src 'self'; img-src 'self' data:; \
         form-action 'self'; frame-ancestors {frame_ancestors}; base-uri 'none'",
        sha256_source(SCRIPT)
    )
}

fn head(title: &str, audience: &Audience) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            title { (title) " · " (audience.name()) }
            style { (PreEscaped(STYLE)) }
            @if let Some(theme) = audience.theme_style() {
                style { (PreEscaped(theme)) }
            }
        }
    }
}

/// The logged-in frame both audiences share: header with the brand, the
/// navigation and log-out, the flash message if one is waiting, `body`.
pub(crate) struct Frame<'a> {
    pub audience: Audience<'a>,
    pub home: &'a str,
    pub nav: Markup,
    pub logout_action: &'a str,
    pub csrf: &'a str,
    pub flash: Option<String>,
}

pub(crate) fn framed(frame: Frame<'_>, title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title, &frame.audience))
            body {
                header {
                    a.brand href=(frame.home) { (frame.audience.name()) }
                    nav { (frame.nav) }
                    form method="post" action=(frame.logout_action) {
                        input type="hidden" name=(CSRF_FIELD) value=(frame.csrf);
                        button type="submit" { "Log out" }
                    }
                }
                main {
                    @if let Some(text) = frame.flash {
                        div.flash role="status" { (text) }
                    }
                    (body)
                }
                script { (PreEscaped(SCRIPT)) }
            }
        }
    }
}

/// A page of a logged-in operator: header with navigation and log-out, the
/// flash message if one is waiting, then `body`.
pub fn page(session: &Authed, title: &str, nav: Nav, body: Markup) -> Markup {
    let links = html! {
        a.active[nav == Nav::Overview] href="/dashboard" { "Overview" }
        a.active[nav == Nav::Messages] href="/dashboard/messages" { "Messages" }
        a.active[nav == Nav::Apps] href="/dashboard/apps" { "Applications" }
        a.active[nav == Nav::Dead] href="/dashboard/dead" { "Dead letters" }
        a.active[nav == Nav::Audit] href="/dashboard/audit" { "Audit log" }
    };
    framed(
        Frame {
            audience: Audience::Operator,
            home: "/dashboard",
            nav: links,
            logout_action: "/dashboard/logout",
            csrf: &session.csrf,
            flash: session.take_flash(),
        },
        title,
        body,
    )
}

/// A page without the logged-in frame (log-in, errors).
pub fn bare_page(title: &str, body: Markup) -> Markup {
    bare_page_for(&Audience::Operator, title, body)
}

pub(crate) fn bare_page_for(audience: &Audience, title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title, audience))
            body { main { (body) } }
        }
    }
}

pub fn error_page(title: &str, text: &str) -> Markup {
    bare_page(
        title,
        html! {
            h1 { (title) }
            div.error { (text) }
            p { a href="/dashboard" { "Back to the overview" } }
        },
    )
}

/// The hidden field every POST form carries.
pub fn csrf_field(session: &Authed) -> Markup {
    html! { input type="hidden" name=(CSRF_FIELD) value=(session.csrf); }
}

/// `2026-11-30 08:15:02` (UTC), the exact time on hover.
pub fn when(ms: Millis) -> Markup {
    let exact = crate::api::rfc3339(ms);
    let shown = chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_else(|| exact.clone());
    html! { time.nowrap datetime=(exact) title=(exact) { (shown) } }
}

/// `5 min ago`, the exact time on hover; "never" for none.
pub fn ago(ms: Option<Millis>, now: Millis) -> Markup {
    match ms {
        None => html! { span.muted { "never" } },
        Some(ms) => {
            let exact = crate::api::rfc3339(ms);
            let text = if ms > now {
                format!("in {}", duration_text(ms - now))
            } else {
                format!("{} ago", duration_text(now - ms))
            };
            html! { time.nowrap datetime=(exact) title=(exact) { (text) } }
        }
    }
}

/// A duration for people: `850 ms`, `4.2 s`, `12 min`, `3 h 5 min`, `2 d 4 h`.
pub fn duration_text(ms: i64) -> String {
    let ms = ms.max(0);
    let (s, m, h, d) = (ms / 1000, ms / 60_000, ms / 3_600_000, ms / 86_400_000);
    if ms < 1000 {
        format!("{ms} ms")
    } else if s < 60 {
        format!("{:.1} s", ms as f64 / 1000.0)
    } else if m < 60 {
        format!("{m} min")
    } else if h < 24 {
        match m % 60 {
            0 => format!("{h} h"),
            rest => format!("{h} h {rest} min"),
        }
    } else {
        match h % 24 {
            0 => format!("{d} d"),
            rest => format!("{d} d {rest} h"),
        }
    }
}

/// A latency quantile: the histogram gives an upper bound.
pub fn latency(ms: Option<i64>) -> String {
    match ms {
        None => "–".to_owned(),
        Some(ms) => format!("≤ {}", duration_text(ms)),
    }
}

pub fn percent(rate: f64, attempts: u64) -> String {
    if attempts == 0 {
        "–".to_owned()
    } else if rate > 0.0 && rate < 0.001 {
        "< 0.1%".to_owned()
    } else {
        format!("{:.1}%", rate * 100.0)
    }
}

#[derive(Clone, Copy)]
pub enum Tone {
    Ok,
    Bad,
    Warn,
    Off,
}

pub fn badge(tone: Tone, text: &str) -> Markup {
    let class = match tone {
        Tone::Ok => "badge ok",
        Tone::Bad => "badge bad",
        Tone::Warn => "badge warn",
        Tone::Off => "badge off",
    };
    html! { span class=(class) { (text) } }
}

/// At most `max` characters of `text`, with `…` when cut.
pub fn truncate(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_owned(),
        Some((at, _)) => format!("{}…", &text[..at]),
    }
}

/// The 24 hourly points as bars: attempts, with the failed part in red,
/// and the hour's mean latency as a line on its own scale; each bar's
/// figures on hover. `labels` adds the scale and hour marks.
pub fn hourly_chart(points: &[HourPoint], width: u32, height: u32, labels: bool) -> Markup {
    let (left, bottom) = if labels { (34.0, 16.0) } else { (0.0, 1.0) };
    let plot_w = f64::from(width) - left;
    let plot_h = f64::from(height) - bottom - if labels { 6.0 } else { 1.0 };
    let max = points.iter().map(|p| p.attempts).max().unwrap_or(0).max(1);
    let slot = plot_w / points.len().max(1) as f64;
    let bar_w = (slot * 0.78).max(1.0);
    let top = f64::from(height) - bottom;
    let scale = |n: u64| (n as f64 / max as f64) * plot_h;
    let max_latency = points
        .iter()
        .filter_map(|p| p.mean_latency_ms)
        .max()
        .unwrap_or(0)
        .max(1);
    // Only hours with attempts have a latency: the line joins those.
    let latency_line = points
        .iter()
        .enumerate()
        .filter_map(|(i, p)| {
            p.mean_latency_ms.map(|ms| {
                let x = left + i as f64 * slot + slot / 2.0;
                let y = top - (ms as f64 / max_latency as f64) * plot_h;
                format!("{},{}", fmt(x), fmt(y))
            })
        })
        .collect::<Vec<_>>()
        .join(" ");
    let summary = format!(
        "{} attempts, {} failed, in the last 24 hours",
        points.iter().map(|p| p.attempts).sum::<u64>(),
        points.iter().map(|p| p.failures).sum::<u64>()
    );
    html! {
        // The labelled chart fills its column (the viewBox keeps its shape);
        // the sparkline keeps its size inside a table cell.
        svg.chart width=(if labels { "100%".to_owned() } else { width.to_string() })
            height=[(!labels).then_some(height)]
            viewBox=(format!("0 0 {width} {height}"))
            role="img" aria-label=(summary) {
            title { (summary) }
            rect.track x=(fmt(left)) y=(fmt(top - plot_h)) width=(fmt(plot_w)) height=(fmt(plot_h)) {}
            line.axis x1=(left) y1=(top + 0.5) x2=(width) y2=(top + 0.5) {}
            @for (i, p) in points.iter().enumerate() {
                @let x = left + i as f64 * slot + (slot - bar_w) / 2.0;
                @let hour = chrono::DateTime::<chrono::Utc>::from_timestamp_millis(p.hour_start)
                    .map(|t| t.format("%H:00").to_string())
                    .unwrap_or_default();
                @let tip = format!(
                    "{hour} UTC: {} attempts, {} failed{}",
                    p.attempts,
                    p.failures,
                    p.mean_latency_ms.map(|ms| format!(", mean {}", duration_text(ms))).unwrap_or_default()
                );
                g {
                    title { (tip) }
                    // An invisible full-height bar, so hovering an empty hour
                    // still shows its figures.
                    rect x=(fmt(x)) y=(fmt(top - plot_h)) width=(fmt(bar_w)) height=(fmt(plot_h))
                        fill="transparent" {}
                    @if p.attempts > 0 {
                        rect.attempts x=(fmt(x)) y=(fmt(top - scale(p.attempts)))
                            width=(fmt(bar_w)) height=(fmt(scale(p.attempts))) rx="1" {}
                    }
                    @if p.failures > 0 {
                        rect.failures x=(fmt(x)) y=(fmt(top - scale(p.failures)))
                            width=(fmt(bar_w)) height=(fmt(scale(p.failures))) rx="1" {}
                    }
                }
                @if labels && i % 6 == 0 {
                    text x=(fmt(x)) y=(height - 3) { (hour) }
                }
            }
            @if !latency_line.is_empty() {
                polyline.latency points=(latency_line) {
                    title { "mean latency per hour (its own scale, up to " (duration_text(max_latency)) ")" }
                }
            }
            @if labels {
                text x="0" y=(fmt(top - plot_h + 8.0)) { (max) }
                text x="0" y=(fmt(top)) { "0" }
            }
        }
    }
}

fn fmt(v: f64) -> String {
    format!("{v:.1}")
}

/// An attempt's status code and duration, two cells of a table.
pub fn code_and_duration(status_code: Option<u16>, duration_ms: i64) -> Markup {
    html! {
        td.num.mono { @match status_code { Some(code) => (code), None => span.muted { "–" } } }
        td.num { (duration_text(duration_ms)) }
    }
}

/// An attempt's response body: its start, opened for the whole.
pub fn response_cell(response: &str) -> Markup {
    html! {
        @if response.is_empty() {
            span.muted { "–" }
        } @else {
            details {
                summary.mono.small { (truncate(response, 60)) }
                pre { (response) }
            }
        }
    }
}

/// "← Newer · Older →" style links; either may be absent.
pub fn pager(
    prev: Option<(String, &str)>,
    next: Option<(String, &str)>,
    first: Option<String>,
) -> Markup {
    html! {
        @if prev.is_some() || next.is_some() || first.is_some() {
            nav.pager aria-label="pages" {
                @if let Some(href) = first {
                    a href=(href) { "« First" }
                }
                @if let Some((href, text)) = prev {
                    a href=(href) rel="prev" { "← " (text) }
                }
                @if let Some((href, text)) = next {
                    a href=(href) rel="next" { (text) " →" }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_naturally() {
        assert_eq!(duration_text(850), "850 ms");
        assert_eq!(duration_text(4_200), "4.2 s");
        assert_eq!(duration_text(12 * 60_000 + 5), "12 min");
        assert_eq!(duration_text(3 * 3_600_000 + 5 * 60_000), "3 h 5 min");
        assert_eq!(duration_text(2 * 86_400_000), "2 d");
        assert_eq!(duration_text(-5), "0 ms");
    }

    #[test]
    fn truncation_counts_characters_not_bytes() {
        assert_eq!(truncate("héllo", 3), "hél…");
        assert_eq!(truncate("héllo", 5), "héllo");
    }

    #[test]
    fn values_are_escaped() {
        let html = badge(Tone::Bad, "<script>alert(1)</script>").into_string();
        assert!(html.contains("&lt;script&gt;"), "{html}");
        assert!(!html.contains("<script>"), "{html}");
    }
}

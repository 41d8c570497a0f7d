//! The customer portal at `/portal`: an application's own view, opened by
//! a link from `POST /api/v1/auth/app-portal-access/{app_id}`.
//!
//! The link carries a one-time code; its first GET ([`login`]) takes the
//! code from the store, starts a session (kept in the store, like the
//! dashboard's) and answers 303 to the portal's home, so the code leaves
//! the address bar and history at once; `Referrer-Policy: no-referrer`
//! keeps it out of any `Referer`, and the request log names routes, never
//! URLs. Every page is scoped by the session's application: handlers read
//! the app from [`PortalSession`], never from the URL, and look every id up
//! within it (another application's id is a 404). Pages share the
//! dashboard's frame, style and components ([`layout::Audience::Portal`]);
//! state changes are POSTs checked by the dashboard's [`Posted`] (CSRF
//! token) and Origin rule, and each capability is checked on the server.

use std::net::IpAddr;
use std::sync::Mutex;

use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::Router;
use maud::{html, Markup};

use crate::api::auth::Capabilities;
use crate::api::{token_sha256, ApiError, ApiState};
use crate::audit::Actor;
use crate::config::Theme;
use crate::dashboard::layout::{self, Audience, Frame};
use crate::dashboard::session::{self as dsession, ClientIp, FormSession, Posted};
use crate::dashboard::{see_other, DashError};
use crate::ids::AppId;
use crate::store::{now_millis, ActorKind, Session, SessionKind, StoreError};

mod endpoints;
mod messages;

/// The portal session cookie's name.
pub const COOKIE: &str = "herald_portal";
const HOME: &str = "/portal";

/// Every portal route, its path (inside `/portal`) and handlers. The
/// router is built from this list, and `tests/it/portal.rs` checks every
/// entry against another application's ids: a route added here without a
/// row in that test's table fails it.
fn routes() -> Vec<(&'static str, MethodRouter<ApiState>)> {
    use endpoints::*;
    vec![
        ("/", get(home)),
        ("/login", get(login)),
        ("/logout", post(logout)),
        ("/event-types", get(event_types)),
        ("/endpoint/new", get(new_form).post(create)),
        ("/endpoint/{endpoint_id}", get(page)),
        ("/endpoint/{endpoint_id}/edit", get(edit_form).post(update)),
        (
            "/endpoint/{endpoint_id}/delete",
            get(delete_form).post(delete),
        ),
        ("/endpoint/{endpoint_id}/secret", get(secret)),
        ("/endpoint/{endpoint_id}/rotate", post(rotate)),
        ("/endpoint/{endpoint_id}/enable", post(enable)),
        ("/endpoint/{endpoint_id}/disable", post(disable)),
        ("/endpoint/{endpoint_id}/send-example", post(send_example)),
        ("/endpoint/{endpoint_id}/recover", post(recover)),
        ("/messages", get(messages::messages)),
        ("/msg/{msg_id}", get(messages::message)),
        (
            "/msg/{msg_id}/endpoint/{endpoint_id}/resend",
            post(messages::resend),
        ),
    ]
}

/// The portal's route paths (inside `/portal`), as the router has them.
pub fn route_paths() -> Vec<&'static str> {
    routes().into_iter().map(|(path, _)| path).collect()
}

/// The portal's routes, to be nested at `/portal`.
pub fn router(state: &ApiState) -> Router<ApiState> {
    let mut router = Router::new();
    for (path, handlers) in routes() {
        router = router.route(path, handlers);
    }
    let csp_frame_ancestors = state.portal.frame_ancestors.clone();
    router
        .fallback(not_found)
        .layer(middleware::from_fn(crate::dashboard::params_are_text))
        .layer(middleware::from_fn(dsession::same_origin_posts))
        .layer(middleware::from_fn_with_state(
            ThemedPages {
                theme: state.portal.theme.clone(),
                frame_ancestors: csp_frame_ancestors.clone(),
            },
            themed_bare_pages,
        ))
        .layer(middleware::from_fn_with_state(
            csp_frame_ancestors,
            security_headers,
        ))
}

/// Any other path: 404, in the session's theme when there is one.
async fn not_found(State(state): State<ApiState>, request: Request) -> Response {
    let (mut parts, _) = request.into_parts();
    // Read only for its theme (which it leaves for `themed_bare_pages`):
    // without a live session the page is still a 404, not "link expired".
    let _ = PortalSession::from_request_parts(&mut parts, &state).await;
    Refused(DashError::NotFound("page")).into_response()
}

/// Headers on every portal response: the CSP (set by the page when it
/// carries a theme style; the shared one otherwise) with the configured
/// `frame-ancestors`; `Referer` to this origin only (the log-in answer,
/// whose request URL held the code, says `no-referrer` instead: set by
/// [`login`]; not on every page, since browsers then send `Origin: null`
/// with forms, which the Origin check refuses); nothing cached.
async fn security_headers(
    State(frame_ancestors): State<String>,
    request: Request,
    next: Next,
) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    if !headers.contains_key(header::CONTENT_SECURITY_POLICY) {
        let csp = layout::content_security_policy(None, &frame_ancestors);
        if let Ok(value) = HeaderValue::from_str(&csp) {
            headers.insert(header::CONTENT_SECURITY_POLICY, value);
        }
    }
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if !headers.contains_key(header::REFERRER_POLICY) {
        headers.insert(
            header::REFERRER_POLICY,
            HeaderValue::from_static("same-origin"),
        );
    }
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// What [`themed_bare_pages`] needs: the configured theme and the CSP's
/// `frame-ancestors`.
#[derive(Clone)]
struct ThemedPages {
    theme: Theme,
    frame_ancestors: String,
}

/// The theme of the request's session, once [`PortalSession`] has read it
/// (a request without a live session leaves it empty).
#[derive(Clone, Default)]
struct SessionTheme(std::sync::Arc<Mutex<Option<Theme>>>);

/// A page without the portal's frame (an error, "link expired"), made
/// where neither the configured theme nor the session's is at hand:
/// [`themed_bare_pages`] renders it with them.
#[derive(Clone)]
struct BarePage {
    title: String,
    body: Markup,
}

fn bare_page(status: StatusCode, title: &str, body: Markup) -> Response {
    let mut response = status.into_response();
    response.extensions_mut().insert(BarePage {
        title: title.to_owned(),
        body,
    });
    response
}

/// Renders a [`BarePage`] in the session's theme, or the configured one
/// without a session, with the CSP that lets that theme's style apply.
async fn themed_bare_pages(
    State(themed): State<ThemedPages>,
    mut request: Request,
    next: Next,
) -> Response {
    let session_theme = SessionTheme::default();
    request.extensions_mut().insert(session_theme.clone());
    let mut response = next.run(request).await;
    let Some(page) = response.extensions_mut().remove::<BarePage>() else {
        return response;
    };
    let theme = session_theme
        .0
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
        .unwrap_or(themed.theme);
    let audience = Audience::Portal(&theme);
    let csp =
        layout::content_security_policy(audience.theme_style().as_deref(), &themed.frame_ancestors);
    let (mut parts, _) = response.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    let markup = layout::bare_page_for(&audience, &page.title, page.body);
    let mut themed_response = markup.into_response();
    *themed_response.status_mut() = parts.status;
    for (name, value) in &parts.headers {
        themed_response.headers_mut().insert(name, value.clone());
    }
    if let Ok(value) = HeaderValue::from_str(&csp) {
        themed_response
            .headers_mut()
            .insert(header::CONTENT_SECURITY_POLICY, value);
    }
    themed_response
}

/// A portal page's error: the dashboard's, shown in the portal's frame
/// (never a store detail).
pub struct Refused(pub DashError);

impl From<DashError> for Refused {
    fn from(e: DashError) -> Self {
        Refused(e)
    }
}

impl From<ApiError> for Refused {
    fn from(e: ApiError) -> Self {
        match e {
            ApiError::Forbidden(_) => Refused(DashError::Forbidden(
                "Your access to this portal does not allow that.",
            )),
            other => Refused(other.into()),
        }
    }
}

impl From<StoreError> for Refused {
    fn from(e: StoreError) -> Self {
        Refused(e.into())
    }
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        let (status, text) = match self.0 {
            DashError::NotFound(what) => (StatusCode::NOT_FOUND, format!("No such {what}.")),
            DashError::Forbidden(why) => (StatusCode::FORBIDDEN, why.to_owned()),
            DashError::BadRequest(why) => (StatusCode::BAD_REQUEST, why),
            DashError::Unavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "The service is unavailable; try again shortly.".to_owned(),
            ),
            DashError::Internal => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "Something went wrong; try again later.".to_owned(),
            ),
        };
        let reason = status.canonical_reason().unwrap_or("Error");
        let body = html! {
            h1 { (reason) }
            div.error { (text) }
            p { a href=(HOME) { "Back to the endpoints" } }
        };
        bare_page(status, reason, body)
    }
}

pub type PortalResult<T = Response> = Result<T, Refused>;

/// A request of a live portal session. Without one: the "link expired"
/// page (401).
pub struct PortalSession {
    state: ApiState,
    key: String,
    pub app_id: AppId,
    /// The portal token the session was made from (its feature flags are
    /// read from it when a page lists event types).
    pub token_id: Option<String>,
    pub capabilities: Capabilities,
    pub csrf: String,
    pub theme: Theme,
    pub client: IpAddr,
    flash: Mutex<Option<String>>,
}

impl PortalSession {
    /// This session in the audit log: its label, never its cookie.
    pub fn actor(&self) -> Actor {
        Actor {
            kind: ActorKind::Portal,
            id: dsession::label_of(&self.key),
            source: self.client,
        }
    }

    pub async fn flash(&self, text: impl Into<String>) {
        dsession::keep_flash(&self.state, &self.key, &text.into(), "portal").await;
    }

    fn take_flash(&self) -> Option<String> {
        self.flash.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// 403 unless `allowed` (a capability of this session).
    pub fn need(&self, allowed: bool) -> PortalResult<()> {
        if allowed {
            Ok(())
        } else {
            Err(Refused(DashError::Forbidden(
                "Your access to this portal does not allow that.",
            )))
        }
    }

    /// A page in the portal's frame, with its CSP (the theme's style
    /// hash, the configured frame-ancestors).
    pub fn page(&self, title: &str, nav: Nav, body: Markup) -> Response {
        let links = html! {
            a.active[nav == Nav::Endpoints] href=(HOME) { "Endpoints" }
            a.active[nav == Nav::EventTypes] href="/portal/event-types" { "Event types" }
            a.active[nav == Nav::Messages] href="/portal/messages" { "Messages" }
        };
        let audience = Audience::Portal(&self.theme);
        let csp = layout::content_security_policy(
            audience.theme_style().as_deref(),
            &self.state.portal.frame_ancestors,
        );
        let markup = layout::framed(
            Frame {
                audience,
                home: HOME,
                nav: links,
                logout_action: "/portal/logout",
                csrf: &self.csrf,
                flash: self.take_flash(),
            },
            title,
            body,
        );
        let mut response = markup.into_response();
        if let Ok(value) = HeaderValue::from_str(&csp) {
            response
                .headers_mut()
                .insert(header::CONTENT_SECURITY_POLICY, value);
        }
        response
    }

    pub fn csrf_field(&self) -> Markup {
        html! { input type="hidden" name=(dsession::CSRF_FIELD) value=(self.csrf); }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Nav {
    Endpoints,
    EventTypes,
    Messages,
}

impl FromRequestParts<ApiState> for PortalSession {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, Response> {
        let found = dsession::live_session(state, &parts.headers, COOKIE, SessionKind::Portal)
            .await
            .map_err(|e| Refused(e).into_response())?;
        let Some((key, session)) = found else {
            return Err(expired_page(StatusCode::UNAUTHORIZED));
        };
        let Some(app_id) = session.app_id.clone() else {
            return Err(expired_page(StatusCode::UNAUTHORIZED));
        };
        let theme = theme_of(&state.portal.theme, &session.theme);
        if let Some(slot) = parts.extensions.get::<SessionTheme>() {
            *slot.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(theme.clone());
        }
        if let Some(refused) = dsession::rate_limited(state, SessionKind::Portal, &key) {
            return Err(refused);
        }
        Ok(PortalSession {
            state: state.clone(),
            capabilities: Capabilities::parse_stored(session.capabilities.as_deref().unwrap_or("")),
            token_id: session.token_id,
            theme,
            csrf: session.csrf,
            client: crate::audit::client_ip(parts),
            flash: Mutex::new(session.flash),
            key,
            app_id,
        })
    }
}

impl FormSession for PortalSession {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

/// A state-changing portal form whose CSRF token matched.
pub type PortalPosted = Posted<PortalSession>;

/// The link's theme parameters that are valid, as stored with the session
/// (`primaryColor`, `darkMode`, `productName`; others and bad values are
/// dropped: the configured theme applies for them).
fn theme_params(pairs: &[(String, String)]) -> String {
    let mut kept = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        let ok = match k.as_str() {
            "primaryColor" => Theme::valid_color(v),
            "darkMode" => v == "true" || v == "false",
            "productName" => Theme::valid_product_name(v),
            _ => false,
        };
        if ok {
            kept.append_pair(k, v);
        }
    }
    kept.finish()
}

/// The configured theme with a session's stored parameters over it.
fn theme_of(base: &Theme, stored: &str) -> Theme {
    let mut theme = base.clone();
    for (k, v) in url::form_urlencoded::parse(stored.as_bytes()) {
        match k.as_ref() {
            "primaryColor" if Theme::valid_color(&v) => theme.primary_color = v.into_owned(),
            "darkMode" => theme.dark_mode = v == "true",
            "productName" if Theme::valid_product_name(&v) => theme.product_name = v.into_owned(),
            _ => {}
        }
    }
    theme
}

/// "This link has expired": a used, unknown or expired link, or a session
/// that ended.
fn expired_page(status: StatusCode) -> Response {
    let mut response = expired_markup(status);
    // It may answer a URL holding a code.
    response.headers_mut().insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

fn expired_markup(status: StatusCode) -> Response {
    let body = html! {
        div.login {
            h1 { "This link has expired" }
            p { "Portal links work once and for a limited time. Ask for a new link where you got this one." }
        }
    };
    bare_page(status, "Link expired", body)
}

fn session_cookie(state: &ApiState, value: &str, max_age_secs: i64) -> Option<HeaderValue> {
    // Framed by another site, the cookie must cross sites: then it is
    // `SameSite=None; Secure; Partitioned` (CHIPS), and CSRF rests on the
    // form token and the Origin check alone.
    let same_site = if state.portal.embeddable_cross_site() {
        "SameSite=None; Secure; Partitioned"
    } else {
        "SameSite=Lax"
    };
    HeaderValue::from_str(&format!(
        "{COOKIE}={value}; HttpOnly; {same_site}; Path=/portal; Max-Age={max_age_secs}"
    ))
    .ok()
}

/// `GET /portal/login?code=…`: the link's one-time code for a session
/// cookie, then 303 to the home page (the code leaves the address bar).
/// Failed exchanges are limited per address (a limit of the portal's own,
/// apart from the dashboard's log-ins).
pub async fn login(
    State(state): State<ApiState>,
    ClientIp(client): ClientIp,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Response {
    let pairs: Vec<(String, String)> =
        url::form_urlencoded::parse(query.unwrap_or_default().as_bytes())
            .into_owned()
            .collect();
    let code = pairs
        .iter()
        .find(|(k, _)| k == "code")
        .map(|(_, v)| v.as_str())
        .unwrap_or("");
    let now = now_millis();
    let token = if code.is_empty() {
        None
    } else {
        match state
            .store
            .take_portal_code(&hex::encode(token_sha256(code)), now)
            .await
        {
            Ok(token) => token,
            Err(e) => return Refused(e.into()).into_response(),
        }
    };
    let Some(token) = token else {
        // A right code is never refused for others' failures; wrong ones
        // are told 410 until the address is past its limit.
        let over_the_limit = state.portal_login_limiter.check(client).is_err();
        state.portal_login_limiter.failed(client);
        tracing::info!(%client, "portal link refused: used, unknown or expired");
        if over_the_limit {
            return expired_page(StatusCode::TOO_MANY_REQUESTS);
        }
        return expired_page(StatusCode::GONE);
    };
    let expires_at = token.expires_at.unwrap_or(now + 7 * 24 * 3_600_000);
    let id = dsession::random_token();
    let key = dsession::key_of(&id);
    let session = Session {
        kind: SessionKind::Portal,
        app_id: Some(token.app_id.clone()),
        token_id: Some(token.id.clone()),
        capabilities: token.capabilities.clone(),
        session_id: token.session_id.clone(),
        theme: theme_params(&pairs),
        csrf: dsession::random_token(),
        flash: None,
        created_at: now,
        expires_at,
    };
    if let Err(e) = state.store.create_session(&key, &session).await {
        return Refused(e.into()).into_response();
    }
    Actor {
        kind: ActorKind::Portal,
        id: dsession::label_of(&key),
        source: client,
    }
    .record(
        &*state.store,
        "portal.login",
        Some(&token.app_id),
        &token.id,
        serde_json::Value::Null,
    )
    .await;
    let mut response = see_other(HOME);
    // The request's URL held the code: no `Referer` of it, ever.
    response.headers_mut().insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    if let Some(cookie) = session_cookie(&state, &id, (expires_at - now) / 1000) {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    response
}

/// `POST /portal/logout`: ends the session (not the token).
pub async fn logout(State(state): State<ApiState>, posted: PortalPosted) -> Response {
    if let Err(e) = state.store.delete_session(&posted.session.key).await {
        return Refused(e.into()).into_response();
    }
    posted
        .session
        .actor()
        .record(
            &*state.store,
            "portal.logout",
            Some(&posted.session.app_id),
            "",
            serde_json::Value::Null,
        )
        .await;
    let mut response = expired_page(StatusCode::OK);
    if let Some(cookie) = session_cookie(&state, "", 0) {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    response
}

pub(crate) use crate::dashboard::form_problem;

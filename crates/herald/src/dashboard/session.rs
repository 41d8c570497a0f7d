//! Log-in sessions, the CSRF token, and the same-origin rule for POSTs.
//!
//! Sessions live in the store ([`crate::store::Sessions`]), keyed by the
//! SHA-256 of the session id (the cookie), so that they survive a restart
//! and every API process on one database knows them; the cookie itself is
//! kept nowhere. The portal's sessions are kept the same way and share
//! this module's CSRF check ([`Posted`]) and Origin rule.

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Mutex;
use std::time::Duration;

use axum::extract::{ConnectInfo, FromRequest, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use maud::{html, Markup};
use sha2::{Digest, Sha256};

use super::{layout, see_other, DashError};
use crate::api::{token_sha256, ApiState};
use crate::audit::Actor;
use crate::store::{now_millis, Session, SessionKind};

/// The session cookie's name.
pub const COOKIE: &str = "herald_session";
/// A session ends this long after log-in, whatever happens in between.
const LIFETIME: Duration = Duration::from_secs(12 * 3600);
const LOGIN_PATH: &str = "/dashboard/login";

/// A new session id or CSRF token: 256 random bits, as hex.
pub(crate) fn random_token() -> String {
    crate::api::auth::random_hex(32)
}

/// The store's key of a session: the hex SHA-256 of its id.
pub(crate) fn key_of(session_id: &str) -> String {
    hex::encode(Sha256::digest(session_id.as_bytes()))
}

/// Keeps `text` for the session `key`'s next page (a dashboard or a
/// portal session: `what` says which in the log if it cannot be kept; the
/// change it reports was made all the same).
pub(crate) async fn keep_flash(state: &ApiState, key: &str, text: &str, what: &str) {
    if let Err(e) = state.store.set_session_flash(key, text).await {
        tracing::warn!(error = %e, session = what, "cannot keep a message for the next page");
    }
}

/// A session's name in the audit log: the first 8 hex digits of its
/// digest, which tell sessions apart without being (or revealing) the
/// cookie.
pub(crate) fn label_of(key: &str) -> String {
    key.chars().take(8).collect()
}

/// Compares two secrets through their digests: equal length, and how long
/// it takes reveals nothing about where they differ.
fn same_secret(a: &str, b: &str) -> bool {
    Sha256::digest(a.as_bytes()) == Sha256::digest(b.as_bytes())
}

/// The live session of `kind` whose id is the cookie `name` of the
/// request, with its store key.
pub(crate) async fn live_session(
    state: &ApiState,
    headers: &HeaderMap,
    name: &str,
    kind: SessionKind,
) -> Result<Option<(String, Session)>, DashError> {
    let Some(id) = cookie(headers, name) else {
        return Ok(None);
    };
    let key = key_of(id);
    let found = state.store.find_session(&key, now_millis()).await?;
    Ok(found.filter(|s| s.kind == kind).map(|s| (key, s)))
}

/// The per-caller API rate limit (`HERALD_API_RATE_LIMIT`) for a browser
/// session, keyed by a digest prefix that names it without being the
/// cookie: the 429 to answer, if over it.
pub(crate) fn rate_limited(state: &ApiState, kind: SessionKind, key: &str) -> Option<Response> {
    let caller = format!("{}:{}", kind.as_str(), key.get(..16).unwrap_or(key));
    let wait = state.rate_limit.check(&caller).err()?;
    let secs = crate::limits::retry_after_secs(wait);
    Some(
        (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, secs.to_string())],
            format!("Too many requests from this session: try again in {secs} s."),
        )
            .into_response(),
    )
}

/// The value of cookie `name` among the request's `Cookie` headers.
pub(crate) fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim())
}

fn to_login() -> Response {
    see_other(LOGIN_PATH)
}

/// A request from a logged-in operator. Extracting it from a request
/// without a live session answers 303 to the log-in page instead.
pub struct Authed {
    state: ApiState,
    key: String,
    /// The token every form of this session must send back.
    pub csrf: String,
    /// Where the request came from.
    pub client: IpAddr,
    /// The one-time message taken with the session, for this page.
    flash: Mutex<Option<String>>,
}

impl Authed {
    /// Shows `text` once, on the next page this session opens.
    pub async fn flash(&self, text: impl Into<String>) {
        keep_flash(&self.state, &self.key, &text.into(), "dashboard").await;
    }

    pub fn take_flash(&self) -> Option<String> {
        self.flash.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// This session as the actor of an audit log entry.
    pub fn actor(&self) -> Actor {
        Actor::dashboard(label_of(&self.key), self.client)
    }
}

/// A session whose forms carry a CSRF token ([`Posted`] checks it).
pub(crate) trait FormSession:
    FromRequestParts<ApiState, Rejection = Response> + Send
{
    fn csrf(&self) -> &str;
}

impl FormSession for Authed {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

impl FromRequestParts<ApiState> for Authed {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, Response> {
        let found = live_session(state, &parts.headers, COOKIE, SessionKind::Dashboard)
            .await
            .map_err(IntoResponse::into_response)?;
        let Some((key, session)) = found else {
            return Err(to_login());
        };
        if let Some(refused) = rate_limited(state, SessionKind::Dashboard, &key) {
            return Err(refused);
        }
        Ok(Authed {
            state: state.clone(),
            key,
            csrf: session.csrf,
            client: crate::audit::client_ip(parts),
            flash: Mutex::new(session.flash),
        })
    }
}

/// An `application/x-www-form-urlencoded` body, keeping repeated fields
/// (one `id` per ticked checkbox).
#[derive(Default)]
pub struct FormFields(Vec<(String, String)>);

impl FormFields {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The field, trimmed, or "" when absent.
    pub fn text(&self, name: &str) -> &str {
        self.get(name).map(str::trim).unwrap_or("")
    }

    pub fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0
            .iter()
            .filter(move |(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

impl<S: Send + Sync> FromRequest<S> for FormFields {
    type Rejection = DashError;

    async fn from_request(req: Request, state: &S) -> Result<Self, DashError> {
        let body = Bytes::from_request(req, state)
            .await
            .map_err(|e| DashError::BadRequest(format!("cannot read the form: {e}")))?;
        Ok(FormFields(
            url::form_urlencoded::parse(&body).into_owned().collect(),
        ))
    }
}

/// The name of the hidden field that carries the CSRF token.
pub const CSRF_FIELD: &str = "csrf";

/// A state-changing form from a logged-in session (the operator's, or a
/// portal's) whose CSRF token matched. Handlers that change anything take
/// this, so none can forget the check: a missing or wrong token is a 403
/// before the handler runs.
pub struct Posted<S = Authed> {
    pub session: S,
    pub form: FormFields,
}

impl<S: FormSession> FromRequest<ApiState> for Posted<S> {
    type Rejection = Response;

    async fn from_request(req: Request, state: &ApiState) -> Result<Self, Response> {
        let (mut parts, body) = req.into_parts();
        let session = S::from_request_parts(&mut parts, state).await?;
        let form = FormFields::from_request(Request::from_parts(parts, body), state)
            .await
            .map_err(IntoResponse::into_response)?;
        match form.get(CSRF_FIELD) {
            Some(token) if same_secret(token, session.csrf()) => Ok(Posted { session, form }),
            _ => Err(DashError::Forbidden(
                "This form's CSRF token is missing or wrong. Reload the page and try again.",
            )
            .into_response()),
        }
    }
}

/// Refuses a POST whose `Origin` names another site than the one asked
/// (a second line behind the CSRF token and the SameSite cookie). A POST
/// without `Origin` (curl, old browsers) passes on to the token check.
pub async fn same_origin_posts(request: Request, next: Next) -> Response {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        if let Some(origin) = request.headers().get(header::ORIGIN) {
            let host = request
                .headers()
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .or_else(|| request.uri().authority().map(|a| a.as_str()));
            let same = match (origin.to_str(), host) {
                (Ok(origin), Some(host)) => origin_matches_host(origin, host),
                _ => false,
            };
            if !same {
                return DashError::Forbidden("This form was sent from another site.")
                    .into_response();
            }
        }
    }
    next.run(request).await
}

/// `Origin: http://h:p` against `Host: h:p` (a default port may be left
/// out of either).
fn origin_matches_host(origin: &str, host: &str) -> bool {
    let Ok(url) = url::Url::parse(origin) else {
        return false; // "null" included: a sandboxed or file: page.
    };
    let Some(origin_host) = url.host_str() else {
        return false;
    };
    let with_port = |port: u16| format!("{origin_host}:{port}");
    let candidates = match (url.port(), url.port_or_known_default()) {
        (Some(port), _) => vec![with_port(port)],
        (None, Some(default)) => vec![origin_host.to_owned(), with_port(default)],
        (None, None) => vec![origin_host.to_owned()],
    };
    candidates.iter().any(|c| c.eq_ignore_ascii_case(host))
}

fn session_cookie(value: &str, max_age_secs: u64) -> Option<HeaderValue> {
    HeaderValue::from_str(&format!(
        "{COOKIE}={value}; HttpOnly; SameSite=Strict; Path=/dashboard; Max-Age={max_age_secs}"
    ))
    .ok()
}

fn login_form(problem: Option<&str>) -> Markup {
    html! {
        div.login {
            h1 { "Herald" }
            p.muted { "Log in with the admin token (" code { "HERALD_ADMIN_TOKEN" } ")." }
            @if let Some(problem) = problem {
                div.error role="alert" { (problem) }
            }
            form method="post" action="/dashboard/login" {
                label for="token" { "Admin token" }
                input #token type="password" name="token" autocomplete="current-password"
                    required autofocus;
                button.primary type="submit" { "Log in" }
            }
        }
    }
}

/// `GET /dashboard/login`: the form (or the overview, when logged in).
pub async fn login_page(State(state): State<ApiState>, headers: HeaderMap) -> Response {
    match live_session(&state, &headers, COOKIE, SessionKind::Dashboard).await {
        Ok(Some(_)) => return see_other("/dashboard"),
        Ok(None) => {}
        Err(e) => return e.into_response(),
    }
    layout::bare_page("Log in", login_form(None)).into_response()
}

/// The client's address as the listener saw it (a proxy's, behind one);
/// unspecified when the router is served without the listener's
/// connection info.
pub struct ClientIp(pub IpAddr);

impl<S: Send + Sync> FromRequestParts<S> for ClientIp {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Infallible> {
        Ok(ClientIp(
            parts
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|ConnectInfo(addr)| addr.ip())
                .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        ))
    }
}

/// `POST /dashboard/login`: the admin token for a session cookie. The right
/// token always logs in, whatever its address failed before (a proxy or a
/// NAT puts many clients behind one address); a wrong one is told 401, or
/// 429 once its address is past `HERALD_LOGIN_FAILURE_LIMIT`. The admin
/// token's length, not the limit, is what defeats guessing.
pub async fn login(
    State(state): State<ApiState>,
    ClientIp(client): ClientIp,
    form: FormFields,
) -> Response {
    if token_sha256(form.text("token")) != state.admin_token_sha256 {
        let over_the_limit = state.login_limiter.check(client).err();
        state.login_limiter.failed(client);
        tracing::info!(%client, "dashboard log-in failed: not the admin token");
        // No session, and never the attempted token.
        Actor::dashboard(String::new(), client)
            .record(
                &*state.store,
                "dashboard.login_failed",
                None,
                "",
                serde_json::Value::Null,
            )
            .await;
        if let Some(wait) = over_the_limit {
            return too_many_failures(wait);
        }
        // Slows guessing down a little; the limiter and the token's length
        // do the rest.
        tokio::time::sleep(Duration::from_millis(250)).await;
        return (
            StatusCode::UNAUTHORIZED,
            layout::bare_page("Log in", login_form(Some("That is not the admin token."))),
        )
            .into_response();
    }
    let id = random_token();
    let now = now_millis();
    let session = Session {
        kind: SessionKind::Dashboard,
        app_id: None,
        token_id: None,
        capabilities: None,
        session_id: None,
        theme: String::new(),
        csrf: random_token(),
        flash: None,
        created_at: now,
        expires_at: now + i64::try_from(LIFETIME.as_millis()).unwrap_or(i64::MAX),
    };
    if let Err(e) = state.store.create_session(&key_of(&id), &session).await {
        return DashError::from(e).into_response();
    }
    let mut response = see_other("/dashboard");
    if let Some(cookie) = session_cookie(&id, LIFETIME.as_secs()) {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    tracing::info!(%client, "dashboard log-in");
    Actor::dashboard(label_of(&key_of(&id)), client)
        .record(
            &*state.store,
            "dashboard.login",
            None,
            "",
            serde_json::Value::Null,
        )
        .await;
    response
}

/// 429 with `Retry-After` (whole seconds, rounded up) and the form again.
fn too_many_failures(wait: Duration) -> Response {
    let seconds = (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1);
    let problem = format!(
        "Too many failed log-ins from your address. Try again in {seconds} second{}.",
        if seconds == 1 { "" } else { "s" }
    );
    let mut response = (
        StatusCode::TOO_MANY_REQUESTS,
        layout::bare_page("Log in", login_form(Some(&problem))),
    )
        .into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    response
}

/// `POST /dashboard/logout`: ends the session and clears the cookie.
pub async fn logout(State(state): State<ApiState>, posted: Posted) -> Response {
    if let Err(e) = state.store.delete_session(&posted.session.key).await {
        return DashError::from(e).into_response();
    }
    posted
        .session
        .actor()
        .record(
            &*state.store,
            "dashboard.logout",
            None,
            "",
            serde_json::Value::Null,
        )
        .await;
    let mut response = to_login();
    if let Some(cookie) = session_cookie("", 0) {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_match_their_host_only() {
        assert!(origin_matches_host(
            "http://127.0.0.1:8080",
            "127.0.0.1:8080"
        ));
        assert!(origin_matches_host(
            "https://herald.example",
            "herald.example"
        ));
        assert!(origin_matches_host(
            "https://herald.example",
            "herald.example:443"
        ));
        assert!(origin_matches_host(
            "http://HERALD.example",
            "herald.example"
        ));
        assert!(!origin_matches_host(
            "http://127.0.0.1:8081",
            "127.0.0.1:8080"
        ));
        assert!(!origin_matches_host(
            "https://evil.example",
            "herald.example"
        ));
        assert!(!origin_matches_host("null", "herald.example"));
        assert!(!origin_matches_host(
            "http://herald.example.evil",
            "herald.example"
        ));
    }

    #[test]
    fn cookies_are_found_among_others() {
        let mut headers = HeaderMap::new();
        headers.append(
            header::COOKIE,
            HeaderValue::from_static("a=1; herald_session=abc ; b=2"),
        );
        assert_eq!(cookie(&headers, COOKIE), Some("abc"));
        assert_eq!(cookie(&headers, "c"), None);
    }
}

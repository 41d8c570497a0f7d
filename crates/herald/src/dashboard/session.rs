//! Log-in sessions, the CSRF token, and the same-origin rule for POSTs.
//!
//! Sessions live in memory (a restart logs everyone out, which is fine for
//! an operator tool), one map per server: [`Sessions`] sits in `ApiState`,
//! so test servers in one process never share it. The map is keyed by the
//! SHA-256 of the session id, so the lookup's timing says nothing about the
//! ids it holds.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, FromRequest, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use maud::{html, Markup};
use rand::RngCore;
use sha2::{Digest, Sha256};

use super::{layout, see_other, DashError};
use crate::api::{token_sha256, ApiState};
use crate::audit::Actor;

/// The session cookie's name.
pub const COOKIE: &str = "herald_session";
/// A session ends this long after log-in, whatever happens in between.
const LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// Bounds the map; only holders of the admin token can add to it.
const MAX_SESSIONS: usize = 1000;
const LOGIN_PATH: &str = "/dashboard/login";

struct Session {
    csrf: String,
    expires_at: Instant,
    /// A one-time message for the next page shown ("Replayed 3").
    flash: Option<String>,
}

/// The dashboard's logged-in sessions (shared by clones).
#[derive(Clone, Default)]
pub struct Sessions(Arc<Mutex<HashMap<[u8; 32], Session>>>);

fn random_token() -> String {
    let mut raw = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut raw);
    hex::encode(raw)
}

fn key_of(session_id: &str) -> [u8; 32] {
    Sha256::digest(session_id.as_bytes()).into()
}

/// A session's name in the audit log: the first 8 hex digits of its
/// digest, which tell sessions apart without being (or revealing) the
/// cookie.
fn label_of(key: &[u8; 32]) -> String {
    hex::encode(&key[..4])
}

/// Compares two secrets through their digests: equal length, and how long
/// it takes reveals nothing about where they differ.
fn same_secret(a: &str, b: &str) -> bool {
    Sha256::digest(a.as_bytes()) == Sha256::digest(b.as_bytes())
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Session>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts a session; returns its id (the cookie's value).
    fn create(&self) -> String {
        let id = random_token();
        let now = Instant::now();
        let mut map = self.lock();
        map.retain(|_, s| s.expires_at > now);
        if map.len() >= MAX_SESSIONS {
            // The one that would end soonest makes room.
            if let Some(oldest) = map
                .iter()
                .min_by_key(|(_, s)| s.expires_at)
                .map(|(k, _)| *k)
            {
                map.remove(&oldest);
            }
        }
        map.insert(
            key_of(&id),
            Session {
                csrf: random_token(),
                expires_at: now + LIFETIME,
                flash: None,
            },
        );
        id
    }

    /// The session's key and CSRF token, if it exists and has not expired.
    fn find(&self, session_id: &str) -> Option<([u8; 32], String)> {
        let key = key_of(session_id);
        let mut map = self.lock();
        match map.get(&key) {
            Some(s) if s.expires_at > Instant::now() => Some((key, s.csrf.clone())),
            Some(_) => {
                map.remove(&key);
                None
            }
            None => None,
        }
    }

    fn remove(&self, key: &[u8; 32]) {
        self.lock().remove(key);
    }

    fn set_flash(&self, key: &[u8; 32], text: String) {
        if let Some(s) = self.lock().get_mut(key) {
            s.flash = Some(text);
        }
    }

    fn take_flash(&self, key: &[u8; 32]) -> Option<String> {
        self.lock().get_mut(key).and_then(|s| s.flash.take())
    }

    /// How many sessions are held (expired ones included until swept).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The value of cookie `name` among the request's `Cookie` headers.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
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
    sessions: Sessions,
    key: [u8; 32],
    /// The token every form of this session must send back.
    pub csrf: String,
    /// Where the request came from.
    pub client: IpAddr,
}

impl Authed {
    /// Shows `text` once, on the next page this session opens.
    pub fn flash(&self, text: impl Into<String>) {
        self.sessions.set_flash(&self.key, text.into());
    }

    pub fn take_flash(&self) -> Option<String> {
        self.sessions.take_flash(&self.key)
    }

    /// This session as the actor of an audit log entry.
    pub fn actor(&self) -> Actor {
        Actor::dashboard(label_of(&self.key), self.client)
    }
}

impl FromRequestParts<ApiState> for Authed {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, Response> {
        let found = cookie(&parts.headers, COOKIE).and_then(|id| state.dashboard.find(id));
        if let Some((key, _)) = &found {
            // The session's own rate, keyed by a digest prefix that names
            // it without being the cookie.
            let caller = format!("dashboard:{}", hex::encode(&key[..8]));
            if let Err(wait) = state.rate_limit.check(&caller) {
                let secs = crate::limits::retry_after_secs(wait);
                return Err((
                    StatusCode::TOO_MANY_REQUESTS,
                    [(header::RETRY_AFTER, secs.to_string())],
                    format!("Too many requests from this session: try again in {secs} s."),
                )
                    .into_response());
            }
        }
        match found {
            Some((key, csrf)) => Ok(Authed {
                sessions: state.dashboard.clone(),
                key,
                csrf,
                client: crate::audit::client_ip(parts),
            }),
            None => Err(to_login()),
        }
    }
}

/// An `application/x-www-form-urlencoded` body, keeping repeated fields
/// (one `id` per ticked checkbox).
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

/// A state-changing form from a logged-in operator whose CSRF token
/// matched. Handlers that change anything take this, so none can forget
/// the check: a missing or wrong token is a 403 before the handler runs.
pub struct Posted {
    pub session: Authed,
    pub form: FormFields,
}

impl FromRequest<ApiState> for Posted {
    type Rejection = Response;

    async fn from_request(req: Request, state: &ApiState) -> Result<Self, Response> {
        let (mut parts, body) = req.into_parts();
        let session = Authed::from_request_parts(&mut parts, state).await?;
        let form = FormFields::from_request(Request::from_parts(parts, body), state)
            .await
            .map_err(IntoResponse::into_response)?;
        match form.get(CSRF_FIELD) {
            Some(token) if same_secret(token, &session.csrf) => Ok(Posted { session, form }),
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
    if cookie(&headers, COOKIE).is_some_and(|id| state.dashboard.find(id).is_some()) {
        return see_other("/dashboard");
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

/// `POST /dashboard/login`: the admin token for a session cookie. An
/// address that failed too often is refused (429) before its token is
/// looked at, so a right guess then gains nothing either.
pub async fn login(
    State(state): State<ApiState>,
    ClientIp(client): ClientIp,
    form: FormFields,
) -> Response {
    if let Err(wait) = state.login_limiter.check(client) {
        tracing::debug!(%client, "dashboard log-in refused: too many failures");
        return too_many_failures(wait);
    }
    if token_sha256(form.text("token")) != state.admin_token_sha256 {
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
        // Slows guessing down a little; the limiter and the token's length
        // do the rest.
        tokio::time::sleep(Duration::from_millis(250)).await;
        return (
            StatusCode::UNAUTHORIZED,
            layout::bare_page("Log in", login_form(Some("That is not the admin token."))),
        )
            .into_response();
    }
    let id = state.dashboard.create();
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
    posted.session.sessions.remove(&posted.session.key);
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

    #[test]
    fn sessions_expire_and_are_bounded() {
        let sessions = Sessions::default();
        let id = sessions.create();
        let (key, csrf) = sessions.find(&id).expect("live session");
        assert_eq!(csrf.len(), 64);
        assert!(sessions.find("not-a-session").is_none());
        if let (Some(s), Some(past)) = (
            sessions.lock().get_mut(&key),
            Instant::now().checked_sub(Duration::from_secs(1)),
        ) {
            s.expires_at = past;
        }
        assert!(sessions.find(&id).is_none(), "expired");
        assert!(sessions.is_empty(), "and swept");
        for _ in 0..MAX_SESSIONS + 5 {
            sessions.create();
        }
        assert_eq!(sessions.len(), MAX_SESSIONS);
    }
}

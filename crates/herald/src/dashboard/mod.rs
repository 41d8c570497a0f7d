//! The operator dashboard at `/dashboard`: server-rendered HTML pages over
//! the same store and rules as the API (no front-end build, one small inline
//! script for "select all" and the secret's reveal).
//!
//! It has its own log-in (the admin token, once, for a session cookie), so a
//! browser never holds the bearer token. Every state change is a POST that
//! carries the session's CSRF token ([`session::Posted`] checks it before a
//! handler runs) and, when the browser says where it came from, an `Origin`
//! matching the host. Every dynamic value goes through maud, which escapes
//! it.

use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use maud::Markup;

use crate::api::{ApiError, ApiState};
use crate::store::StoreError;

pub mod apps;
mod audit;
mod dead;
mod delivery;
mod endpoint;
pub mod finder;
pub(crate) mod layout;
pub(crate) mod overview;
pub(crate) mod session;

/// Rows per page on every list.
const PAGE_SIZE: usize = 50;

/// The dashboard's routes, to be nested at `/dashboard` (links and the
/// session cookie's path assume that prefix).
pub fn router() -> Router<ApiState> {
    Router::new()
        .route("/", get(overview::page))
        .route("/login", get(session::login_page).post(session::login))
        .route("/logout", post(session::logout))
        .route("/dead", get(dead::page))
        .route("/audit", get(audit::page))
        .route("/messages", get(finder::messages_page))
        .route("/apps", get(apps::apps_page))
        .route("/app/{app_id}", get(apps::app_page))
        .route("/app/{app_id}/msg/{msg_id}", get(finder::message_page))
        .route(
            "/app/{app_id}/msg/{msg_id}/endpoint/{endpoint_id}/resend",
            post(finder::resend),
        )
        .route("/dead/replay", post(dead::replay))
        .route("/app/{app_id}/delivery/{delivery_id}", get(delivery::page))
        .route(
            "/app/{app_id}/delivery/{delivery_id}/replay",
            post(delivery::replay),
        )
        .route("/app/{app_id}/endpoint/{endpoint_id}", get(endpoint::page))
        .route(
            "/app/{app_id}/endpoint/{endpoint_id}/secret",
            get(endpoint::secret),
        )
        .route(
            "/app/{app_id}/endpoint/{endpoint_id}/enable",
            post(endpoint::enable),
        )
        .route(
            "/app/{app_id}/endpoint/{endpoint_id}/rotate",
            post(endpoint::rotate),
        )
        .route(
            "/app/{app_id}/endpoint/{endpoint_id}/disable",
            post(endpoint::disable),
        )
        .fallback(|| async { DashError::NotFound("page") })
        .layer(middleware::from_fn(params_are_text))
        .layer(middleware::from_fn(session::same_origin_posts))
        .layer(middleware::from_fn(security_headers))
}

/// Middleware of the dashboard and the portal: their path and query
/// parameters are text without control characters, as the API requires of
/// its own (a NUL reaching PostgreSQL is an error, a 500): else a 400 page
/// naming the parameter.
pub(crate) async fn params_are_text(request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    let checked = match crate::api::check_path_params_text(&mut parts).await {
        Ok(()) => crate::api::check_query_text(parts.uri.query().unwrap_or_default()),
        Err(e) => Err(e),
    };
    if let Err(e) = checked {
        return DashError::from(e).into_response();
    }
    next.run(Request::from_parts(parts, body)).await
}

/// Headers on every dashboard response: the pages run only their own
/// script and style (by hash), cannot be framed (clickjacking), and nothing
/// (secrets included) is cached.
async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    if let Ok(csp) = HeaderValue::from_str(&layout::CONTENT_SECURITY_POLICY) {
        headers.insert(header::CONTENT_SECURITY_POLICY, csp);
    }
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// What can go wrong on a page, shown as a small HTML page. Store details
/// are logged (by the conversion through [`ApiError`]) and never shown.
#[derive(Debug)]
pub enum DashError {
    NotFound(&'static str),
    Forbidden(&'static str),
    BadRequest(String),
    Unavailable,
    Internal,
}

impl From<ApiError> for DashError {
    fn from(e: ApiError) -> Self {
        match e {
            ApiError::NotFound(what) => DashError::NotFound(what),
            ApiError::Unavailable => DashError::Unavailable,
            ApiError::Internal => DashError::Internal,
            ApiError::Unauthorized => DashError::Forbidden("not allowed"),
            other => DashError::BadRequest(describe(&other)),
        }
    }
}

impl From<StoreError> for DashError {
    fn from(e: StoreError) -> Self {
        ApiError::from(e).into()
    }
}

/// An API error as one line for a person (a 422's fields spelled out).
pub(crate) fn describe(e: &ApiError) -> String {
    match e {
        ApiError::Validation(fields) => fields
            .iter()
            .map(|f| {
                let field = f.loc.last().map(String::as_str).unwrap_or("value");
                format!("{field}: {}", f.msg)
            })
            .collect::<Vec<_>>()
            .join("; "),
        other => other.to_string(),
    }
}

/// An API error for a form: one line naming the fields, or None for an
/// error that is not the form's (the page's own).
pub(crate) fn form_problem(e: &ApiError) -> Option<String> {
    match e {
        ApiError::Validation(_) | ApiError::BadRequest(_) | ApiError::Conflict(_) => {
            Some(describe(e))
        }
        _ => None,
    }
}

impl IntoResponse for DashError {
    fn into_response(self) -> Response {
        let (status, text) = match self {
            DashError::NotFound(what) => (StatusCode::NOT_FOUND, format!("No such {what}.")),
            DashError::Forbidden(why) => (StatusCode::FORBIDDEN, why.to_owned()),
            DashError::BadRequest(why) => (StatusCode::BAD_REQUEST, why),
            DashError::Unavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "The database is unavailable; try again shortly.".to_owned(),
            ),
            DashError::Internal => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "Something went wrong; the server log has the details.".to_owned(),
            ),
        };
        let reason = status.canonical_reason().unwrap_or("Error");
        (status, layout::error_page(reason, &text)).into_response()
    }
}

pub type DashResult<T = Markup> = Result<T, DashError>;

/// A 303 to `location`: after a POST, the browser GETs the page again, so
/// a reload does not repeat the action.
pub(crate) fn see_other(location: &str) -> Response {
    match HeaderValue::from_str(location) {
        Ok(value) => (StatusCode::SEE_OTHER, [(header::LOCATION, value)]).into_response(),
        // Locations are built from ids and encoded queries; this is a bug.
        Err(_) => DashError::Internal.into_response(),
    }
}

/// A form's fields as pairs for [`query_string`]: each of `names` beside
/// the value in the same place of `values`.
fn named_fields<'a, const N: usize>(
    names: &[&'static str; N],
    values: [&'a str; N],
) -> [(&'static str, &'a str); N] {
    std::array::from_fn(|i| (names[i], values[i]))
}

/// A query string (with its `?`) from pairs, leaving out empty values.
fn query_string<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut serializer = url::form_urlencoded::Serializer::new(String::new());
    let mut any = false;
    for (k, v) in pairs {
        if !v.is_empty() {
            serializer.append_pair(k, v);
            any = true;
        }
    }
    if any {
        format!("?{}", serializer.finish())
    } else {
        String::new()
    }
}

/// Keyset paging over a list shown newest first: the page `after` an id
/// (older rows) or `before` one (newer rows). The store pages forwards
/// only, so a `before` page is read ascending and turned around.
#[derive(Debug, Default, Clone)]
pub struct Cursor {
    after: Option<String>,
    before: Option<String>,
}

/// One page of a keyset listing, with the cursors of its neighbours.
struct Listed<T> {
    items: Vec<T>,
    /// `before` for the newer page, if there is one.
    newer: Option<String>,
    /// `after` for the older page, if there is one.
    older: Option<String>,
}

impl<T> Listed<T> {
    /// The links to its neighbours ("Newer", "Older"; `link(key, id)`
    /// makes one) and to `first`.
    fn pager(&self, link: impl Fn(&'static str, &str) -> String, first: Option<String>) -> Markup {
        let newer = self
            .newer
            .as_deref()
            .map(|id| (link("before", id), "Newer"));
        let older = self.older.as_deref().map(|id| (link("after", id), "Older"));
        layout::pager(newer, older, first)
    }
}

impl Cursor {
    pub fn new(after: &Option<String>, before: &Option<String>) -> Self {
        let nonempty = |v: &Option<String>| v.clone().filter(|s| !s.is_empty());
        Cursor {
            after: nonempty(after),
            before: nonempty(before),
        }
    }

    fn is_first_page(&self) -> bool {
        self.after.is_none() && self.before.is_none()
    }

    fn request(&self, limit: usize) -> crate::store::PageReq {
        match &self.before {
            Some(before) => crate::store::PageReq {
                limit,
                after: Some(before.clone()),
                ascending: true,
                backwards: false,
            },
            None => crate::store::PageReq {
                limit,
                after: self.after.clone(),
                ascending: false,
                backwards: false,
            },
        }
    }

    fn finish<T>(&self, page: crate::store::Page<T>, id_of: impl Fn(&T) -> String) -> Listed<T> {
        let mut items = page.items;
        let (newer, older) = if self.before.is_some() {
            items.reverse();
            (
                page.has_more.then(|| items.first().map(&id_of)).flatten(),
                items.last().map(&id_of),
            )
        } else {
            (
                self.after.as_ref().and_then(|_| items.first().map(&id_of)),
                page.has_more.then(|| items.last().map(&id_of)).flatten(),
            )
        };
        Listed {
            items,
            newer,
            older,
        }
    }
}

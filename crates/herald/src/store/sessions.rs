//! Browser sessions of the dashboard and the customer portal, kept in the
//! store (by the SHA-256 of the cookie, never the cookie) so that they
//! survive a restart and work behind several API processes.

use super::rows::{col, StoredRow};
use super::*;

/// Browser sessions.
#[async_trait]
pub trait Sessions: Send + Sync {
    /// Starts a session whose cookie has digest `sha256_hex`.
    async fn create_session(&self, sha256_hex: &str, session: &Session) -> StoreResult<()>;
    /// The session, if it exists and has not expired by `now`. Its flash
    /// message (if any) is taken: the next call finds none.
    async fn find_session(&self, sha256_hex: &str, now: Millis) -> StoreResult<Option<Session>>;
    /// Sets the one-time message the session's next page shows.
    async fn set_session_flash(&self, sha256_hex: &str, text: &str) -> StoreResult<()>;
    /// Ends a session (log-out).
    async fn delete_session(&self, sha256_hex: &str) -> StoreResult<()>;
    /// Deletes sessions and portal link codes that expired before `now`;
    /// returns how many sessions.
    async fn prune_sessions(&self, now: Millis) -> StoreResult<u64>;
}

/// Whose session it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionKind {
    /// The operator dashboard (logged in with the admin token).
    Dashboard,
    /// The customer portal of one application (opened by a link).
    Portal,
}

impl SessionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SessionKind::Dashboard => "dashboard",
            SessionKind::Portal => "portal",
        }
    }

    pub fn parse(text: &str) -> StoreResult<Self> {
        match text {
            "dashboard" => Ok(SessionKind::Dashboard),
            "portal" => Ok(SessionKind::Portal),
            other => Err(StoreError::Internal(format!("bad session kind {other}"))),
        }
    }
}

/// A browser session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub kind: SessionKind,
    /// The portal's application (None for the dashboard).
    pub app_id: Option<AppId>,
    /// The portal token the session was made from: ending or expiring it
    /// ends the session.
    pub token_id: Option<String>,
    /// The portal's capabilities, as the token records them.
    pub capabilities: Option<String>,
    /// Svix's `sessionId` of the link.
    pub session_id: Option<String>,
    /// The portal's theme from the link (`key=value` pairs, `&`-joined).
    pub theme: String,
    /// The token every form of the session sends back.
    pub csrf: String,
    /// A one-time message for the next page.
    pub flash: Option<String>,
    pub created_at: Millis,
    pub expires_at: Millis,
}

/// A session from its stored row (either backend).
pub(crate) fn session_from_row(r: &impl StoredRow) -> StoreResult<Session> {
    Ok(Session {
        kind: SessionKind::parse(&col::<String>(r, "kind")?)?,
        app_id: col::<Option<String>>(r, "app_id")?.map(AppId::from_trusted),
        token_id: col(r, "token_id")?,
        capabilities: col(r, "capabilities")?,
        session_id: col(r, "session_id")?,
        theme: col(r, "theme")?,
        csrf: col(r, "csrf")?,
        flash: col(r, "flash")?,
        created_at: col(r, "created_at")?,
        expires_at: col(r, "expires_at")?,
    })
}

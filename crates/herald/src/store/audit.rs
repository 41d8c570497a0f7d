//! The audit log: every change made by a person or a token to Herald's
//! configuration (endpoints, secrets, applications, event types, tokens),
//! every replay, recovery and resend, and every dashboard log-in, failed
//! or not. Entries are written by the API and dashboard handlers once the
//! change succeeded (`crate::audit`), read back by `GET /api/v1/audit-log`
//! and `/dashboard/audit`, and pruned by retention (`Retention::prune_audit`). An entry never holds a
//! secret: it names what was acted on, never a secret, token or header
//! value (see ARCHITECTURE.md).

use super::conditions::{Conditions, Dialect};
use super::rows::{col, StoredRow};
use super::*;
use crate::ids::AuditId;

/// The audit log.
#[async_trait]
pub trait Audit: Send + Sync {
    /// Adds one entry (one insert).
    async fn insert_audit(&self, entry: &AuditEntry) -> StoreResult<()>;
    /// Entries matching `filter`, by id (newest first unless the page asks
    /// ascending; ids sort by the time they were made).
    async fn list_audit(
        &self,
        filter: &AuditFilter,
        page: &PageReq,
    ) -> StoreResult<Page<AuditEntry>>;
}

/// Who made a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActorKind {
    /// The admin token (`actor_id` is `admin`).
    Admin,
    /// An application token (`actor_id` is its `tok_…` id).
    AppToken,
    /// A dashboard session (`actor_id` is a label of it that is not the
    /// cookie: the first 8 hex digits of its digest), or its log-in.
    Dashboard,
    /// A customer-portal session (reserved for the portal).
    Portal,
}

impl ActorKind {
    pub const ALL: [ActorKind; 4] = [
        ActorKind::Admin,
        ActorKind::AppToken,
        ActorKind::Dashboard,
        ActorKind::Portal,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ActorKind::Admin => "admin",
            ActorKind::AppToken => "app_token",
            ActorKind::Dashboard => "dashboard",
            ActorKind::Portal => "portal",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        ActorKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// One entry of the audit log.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditEntry {
    pub id: AuditId,
    pub at: Millis,
    pub actor_kind: ActorKind,
    pub actor_id: String,
    /// Dotted: `endpoint.created`, `dead.replayed`, `dashboard.login`, …
    pub action: String,
    /// The application acted in, if any.
    pub app_id: Option<AppId>,
    /// The id of what was acted on (`ep_…`, `dlv_…`, `tok_…`, an event
    /// type's name, …); empty when nothing in particular.
    pub target: String,
    /// The client's address.
    pub source: String,
    /// A small JSON object: counts, the names of changed fields. Never a
    /// secret, token or header value.
    pub details: serde_json::Value,
}

/// Which entries a listing shows (all given conditions hold).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditFilter {
    pub action: Option<String>,
    pub app: Option<AppId>,
    pub actor_kind: Option<ActorKind>,
    pub actor_id: Option<String>,
    pub target: Option<String>,
    /// Made before (ms).
    pub before: Option<Millis>,
    /// Made at or after (ms).
    pub after: Option<Millis>,
}

impl AuditFilter {
    /// The entries this filter keeps.
    pub(crate) fn conditions(&self, dialect: Dialect) -> Conditions {
        let mut c = Conditions::new(dialect, "1 = 1");
        c.and_some(" AND action = #", self.action.as_deref());
        c.and_some(" AND app_id = #", self.app.as_ref().map(AppId::as_str));
        c.and_some(
            " AND actor_kind = #",
            self.actor_kind.map(ActorKind::as_str),
        );
        c.and_some(" AND actor_id = #", self.actor_id.as_deref());
        c.and_some(" AND target = #", self.target.as_deref());
        c.and_some(" AND at < #", self.before);
        c.and_some(" AND at >= #", self.after);
        c
    }
}

/// An audit entry from its stored row (either backend).
pub(crate) fn entry_from_row(r: &impl StoredRow) -> StoreResult<AuditEntry> {
    let kind: String = col(r, "actor_kind")?;
    let details: String = col(r, "details")?;
    Ok(AuditEntry {
        id: AuditId::from_trusted(col(r, "id")?),
        at: col(r, "at")?,
        actor_kind: ActorKind::parse(&kind)
            .ok_or_else(|| StoreError::Internal(format!("bad actor kind {kind}")))?,
        actor_id: col(r, "actor_id")?,
        action: col(r, "action")?,
        app_id: col::<Option<String>>(r, "app_id")?.map(AppId::from_trusted),
        target: col(r, "target")?,
        source: col(r, "source")?,
        details: from_json(&details)?,
    })
}

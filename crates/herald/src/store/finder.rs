//! The finding tools of the dashboard and the portal: messages searched by
//! application, event type, id or `eventId`, delivery status and time, and
//! applications searched by name or uid. Every query is scoped: to one
//! application (the portal's session, an operator who picked one) or to
//! all of them (the operator).

use super::conditions::{Conditions, Dialect};
use super::rows::{col, StoredRow};
use super::*;

/// Searches over messages and applications.
#[async_trait]
pub trait Finder: Send + Sync {
    /// Messages matching `filter`, by id (newest first unless the page asks
    /// ascending), each with its deliveries counted by state. Payloads are
    /// not read.
    async fn find_messages(
        &self,
        filter: &FindFilter,
        page: &PageReq,
    ) -> StoreResult<Page<FoundMessage>>;
    /// Applications whose name contains `search` or whose uid or id is
    /// `search` (case-insensitive for names), by id.
    async fn find_apps(&self, search: Option<&str>, page: &PageReq) -> StoreResult<Page<App>>;
}

/// Which messages a search shows. Every field narrows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FindFilter {
    /// Only this application's messages: always set for a portal session.
    pub app: Option<AppId>,
    pub event_type: Option<String>,
    /// The message's id (`msg_…`) or its `eventId`.
    pub id_or_event_id: Option<String>,
    /// Messages with at least one delivery in this state.
    pub status: Option<DeliveryState>,
    /// Created at or after (ms).
    pub created_after: Option<Millis>,
    /// Created before (ms).
    pub created_before: Option<Millis>,
    /// Messages sent on this channel.
    pub channel: Option<String>,
}

impl FindFilter {
    /// The messages this filter keeps, over `messages m`. Which index
    /// serves it: the primary key or `UNIQUE (app_id, event_id)` /
    /// `messages_by_event_id` for an id; `messages_by_app_type` for an
    /// event type in an application (`messages_by_type` on PostgreSQL;
    /// across all applications on SQLite, no index: the walk in id order
    /// tests each); else `messages_by_app` or the primary key, walked in id
    /// order. The status is checked per message through
    /// `deliveries_by_msg` (on SQLite a rare one drives the search instead:
    /// `sqlite::finder::find_messages_on`).
    pub(crate) fn conditions(&self, dialect: Dialect) -> Conditions {
        let sqlite = dialect == Dialect::Sqlite;
        let mut c = Conditions::new(dialect, "1 = 1");
        // With an id to look up, the id's indexes answer in one step: on
        // SQLite the `+` keeps the planner from walking the whole
        // application instead.
        let app = if sqlite && self.id_or_event_id.is_some() {
            " AND +m.app_id = #"
        } else {
            " AND m.app_id = #"
        };
        c.and_some(app, self.app.as_ref().map(AppId::as_str));
        c.and_some(
            " AND (m.id = # OR m.event_id = #)",
            self.id_or_event_id.as_deref(),
        );
        c.and_some(" AND m.event_type = #", self.event_type.as_deref());
        let in_state = if sqlite {
            " AND EXISTS (SELECT 1 FROM deliveries d INDEXED BY deliveries_by_msg \
             WHERE d.msg_id = m.id AND d.state = #)"
        } else {
            " AND EXISTS (SELECT 1 FROM deliveries d WHERE d.msg_id = m.id AND d.state = #)"
        };
        c.and_some(in_state, self.status.map(|s| s as i64));
        c.and_some(" AND m.created_at >= #", self.created_after);
        c.and_some(" AND m.created_at < #", self.created_before);
        let on_channel = if sqlite {
            " AND EXISTS (SELECT 1 FROM json_each(m.channels) WHERE value = #)"
        } else {
            " AND jsonb_exists(m.channels::jsonb, #)"
        };
        c.and_some(on_channel, self.channel.as_deref());
        c
    }
}

/// One message of a search's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundMessage {
    pub id: MsgId,
    pub app_id: AppId,
    pub app_name: String,
    pub event_type: String,
    pub event_id: Option<String>,
    pub created_at: Millis,
    /// Its deliveries (one per endpoint) by state.
    pub deliveries: DeliveryCounts,
}

/// Adds the counts read as `(msg_id, state, count)` rows to the page's
/// messages.
pub(crate) fn add_counts(items: &mut [FoundMessage], counts: Vec<(String, i64, i64)>) {
    let mut by_id: HashMap<String, DeliveryCounts> = HashMap::new();
    for (msg, state, n) in counts {
        by_id.entry(msg).or_default().set(state, n);
    }
    for m in items {
        if let Some(c) = by_id.remove(m.id.as_str()) {
            m.deliveries = c;
        }
    }
}

/// `%…%` for a LIKE pattern with `\` as escape: the search's own `%`, `_`
/// and `\` match themselves.
pub(crate) fn like_pattern(search: &str) -> String {
    let mut p = String::with_capacity(search.len() + 2);
    p.push('%');
    for c in search.chars() {
        if matches!(c, '%' | '_' | '\\') {
            p.push('\\');
        }
        p.push(c);
    }
    p.push('%');
    p
}

/// A found message from its stored row (either backend); its deliveries
/// are counted apart.
pub(crate) fn found_from_row(r: &impl StoredRow) -> StoreResult<FoundMessage> {
    Ok(FoundMessage {
        id: MsgId::from_trusted(col(r, "id")?),
        app_id: AppId::from_trusted(col(r, "app_id")?),
        app_name: col(r, "app_name")?,
        event_type: col(r, "event_type")?,
        event_id: col(r, "event_id")?,
        created_at: col(r, "created_at")?,
        deliveries: DeliveryCounts::default(),
    })
}

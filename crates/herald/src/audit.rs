//! Writing the audit log (`store::Audit`) from the API and dashboard
//! handlers: who ([`Actor`]: the admin token, an application token, a
//! dashboard session), from where, did what to which target.
//!
//! A handler records its entry after its change succeeded, in one insert
//! of its own, after the change's own transaction. When that insert fails
//! (the store went away between the two) the change stands, the error is
//! logged at `error` level with the entry's action and target, and the
//! caller still gets its answer: refusing an answer for a change already
//! made would only make the client retry it.
//!
//! What goes in: ids and names of what was acted on, counts, the NAMES of
//! changed fields. What never goes in: a secret, a token, a header value,
//! a payload, an attempted log-in token.
//!
//! Below the API: an API caller becomes an [`Actor`] in `api::auth`
//! (`Actor::of_principal`, and the extractor), so this module takes plain
//! values and imports nothing above the store.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use axum::extract::ConnectInfo;
use axum::http::request::Parts;
use serde_json::Value;

use crate::ids::{AppId, AuditId};
use crate::store::{now_millis, ActorKind, AuditEntry, Store};

/// Who makes a change, and from which address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    pub kind: ActorKind,
    /// `admin`, a token's `tok_…` id, or a dashboard session's label.
    pub id: String,
    pub source: IpAddr,
}

/// The client's address as the listener saw it (a proxy's, behind one);
/// unspecified when the router is served without connection info.
pub fn client_ip(parts: &Parts) -> IpAddr {
    parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| c.0.ip())
}

impl Actor {
    /// A dashboard session, by its label (never the cookie).
    pub fn dashboard(label: String, source: IpAddr) -> Self {
        Actor {
            kind: ActorKind::Dashboard,
            id: label,
            source,
        }
    }

    /// Records `action` on `target` (in `app`, if any) with `details`, a
    /// small JSON object (or `null` for none). Never fails: see the module.
    pub async fn record(
        &self,
        store: &dyn Store,
        action: &str,
        app: Option<&AppId>,
        target: &str,
        details: Value,
    ) {
        let entry = AuditEntry {
            id: AuditId::generate(),
            at: now_millis(),
            actor_kind: self.kind,
            actor_id: self.id.clone(),
            action: action.to_owned(),
            app_id: app.cloned(),
            target: target.to_owned(),
            source: self.source.to_string(),
            details: if details.is_null() {
                Value::Object(serde_json::Map::new())
            } else {
                details
            },
        };
        if let Err(e) = store.insert_audit(&entry).await {
            tracing::error!(
                error = %e,
                action,
                target,
                actor = %self.id,
                "could not write the audit log entry of a change that was made"
            );
        }
    }
}

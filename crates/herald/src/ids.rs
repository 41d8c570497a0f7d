//! Typed, prefixed identifiers (`app_…`, `ep_…`, `msg_…`, `dlv_…`, `atmpt_…`,
//! `audit_…`).
//!
//! The part after the prefix is a ULID, so ids sort by creation time: the
//! store pages through lists by id alone, with no separate cursor column.

use serde::{Deserialize, Serialize};

macro_rules! prefixed_id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            pub const PREFIX: &'static str = concat!($prefix, "_");

            /// A new id, later in sort order than every id made before it
            /// in this process.
            pub fn generate() -> Self {
                $name(format!("{}{}", Self::PREFIX, crate::ids::next_ulid()))
            }

            /// Accepts only strings of this id's exact shape.
            pub fn parse(s: &str) -> Option<Self> {
                let rest = s.strip_prefix(Self::PREFIX)?;
                ulid::Ulid::from_string(rest).ok()?;
                Some($name(s.to_owned()))
            }

            /// Wraps a value read back from the store, which only ever holds
            /// ids this type generated.
            pub fn from_trusted(s: String) -> Self {
                $name(s)
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }

            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

prefixed_id!(
    /// An application: one customer of the service's user.
    AppId, "app");
prefixed_id!(
    /// An endpoint: one URL an application's messages are delivered to.
    EndpointId, "ep");
prefixed_id!(
    /// A message: one event, fanned out to every subscribed endpoint.
    MsgId, "msg");
prefixed_id!(
    /// A delivery: one message to one endpoint. Its id is the
    /// `Idempotency-Key` every attempt of it carries.
    DeliveryId, "dlv");
prefixed_id!(
    /// One HTTP attempt of a delivery.
    AttemptId, "atmpt");
prefixed_id!(
    /// One entry of the audit log.
    AuditId, "audit");

/// Monotonic within the process, so that ids made in the same millisecond
/// still sort in creation order (pagination relies on it).
fn next_ulid() -> ulid::Ulid {
    use std::sync::Mutex;
    static GEN: Mutex<Option<ulid::Generator>> = Mutex::new(None);
    let mut guard = GEN.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let generator = guard.get_or_insert_with(ulid::Generator::new);
    // Overflow needs 2^80 ids in one millisecond; fall back to a fresh one.
    generator.generate().unwrap_or_else(|_| ulid::Ulid::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_carry_their_prefix_and_parse_back() {
        let id = MsgId::generate();
        assert!(id.as_str().starts_with("msg_"));
        assert_eq!(MsgId::parse(id.as_str()), Some(id.clone()));
        assert_eq!(EndpointId::parse(id.as_str()), None);
        assert_eq!(MsgId::parse("msg_notaulid"), None);
        assert_eq!(MsgId::parse(""), None);
    }

    #[test]
    fn ids_sort_in_creation_order() {
        let ids: Vec<DeliveryId> = (0..1000).map(|_| DeliveryId::generate()).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, sorted);
    }
}

//! The event-type catalogue (global, as in Svix).

use super::rows::{col, StoredRow};
use super::*;

/// The event-type catalogue.
#[async_trait]
pub trait EventTypes: Send + Sync {
    /// Creates an event type; `Conflict` if the name exists.
    async fn create_event_type(&self, et: &EventType) -> StoreResult<()>;
    async fn get_event_type(&self, name: &str) -> StoreResult<Option<EventType>>;
    /// By name; archived ones only when asked.
    async fn list_event_types(
        &self,
        include_archived: bool,
        page: &PageReq,
    ) -> StoreResult<Page<EventType>>;
    /// Replaces the mutable fields (keeps `created_at`); false if absent.
    async fn update_event_type(&self, et: &EventType) -> StoreResult<bool>;
    /// Deletes an event type for good; false if absent.
    async fn delete_event_type(&self, name: &str) -> StoreResult<bool>;
    /// The names in `names` that are not event types.
    async fn unknown_event_types(&self, names: &[String]) -> StoreResult<Vec<String>>;
}

/// An event type of the catalogue (global, as in Svix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventType {
    pub name: String,
    pub description: String,
    pub archived: bool,
    pub deprecated: bool,
    /// JSON text, as given.
    pub schemas: Option<String>,
    pub feature_flag: Option<String>,
    pub group_name: Option<String>,
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// An event type from its stored row (either backend).
pub(crate) fn event_type_from_row(r: &impl StoredRow) -> StoreResult<EventType> {
    Ok(EventType {
        name: col(r, "name")?,
        description: col(r, "description")?,
        archived: col(r, "archived")?,
        deprecated: col(r, "deprecated")?,
        schemas: col(r, "schemas")?,
        feature_flag: col(r, "feature_flag")?,
        group_name: col(r, "group_name")?,
        created_at: col(r, "created_at")?,
        updated_at: col(r, "updated_at")?,
    })
}

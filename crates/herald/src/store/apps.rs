//! Applications: the tenants that own endpoints, messages and tokens.

use super::rows::{col, u16_col, StoredRow};
use super::*;

/// Applications.
#[async_trait]
pub trait Apps: Send + Sync {
    async fn create_app(&self, app: &App) -> StoreResult<()>;
    /// By id or by `uid`.
    async fn get_app(&self, id_or_uid: &str) -> StoreResult<Option<App>>;
    async fn list_apps(&self, page: &PageReq) -> StoreResult<Page<App>>;
    /// Replaces `uid`, `name`, `rate_limit`, `metadata`, `updated_at`;
    /// false if it does not exist.
    async fn update_app(&self, app: &App) -> StoreResult<bool>;
    /// Deletes the app with its endpoints, messages, deliveries and
    /// attempts; false if it does not exist.
    async fn delete_app(&self, id: &AppId) -> StoreResult<bool>;
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct App {
    pub id: AppId,
    pub uid: Option<String>,
    pub name: String,
    pub rate_limit: Option<u16>,
    pub metadata: BTreeMap<String, String>,
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// An application from its stored row (either backend).
pub(crate) fn app_from_row(r: &impl StoredRow) -> StoreResult<App> {
    Ok(App {
        id: AppId::from_trusted(col(r, "id")?),
        uid: col(r, "uid")?,
        name: col(r, "name")?,
        rate_limit: u16_col(r, "rate_limit")?,
        metadata: from_json::<BTreeMap<String, String>>(&col::<String>(r, "metadata")?)?,
        created_at: col(r, "created_at")?,
        updated_at: col(r, "updated_at")?,
    })
}

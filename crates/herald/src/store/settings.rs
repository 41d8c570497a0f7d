//! Named settings (the admin token's hash, …) and the liveness probe.

use super::*;

/// Named settings and the liveness probe.
#[async_trait]
pub trait Settings: Send + Sync {
    /// Reads a named setting (e.g. the admin token's hash).
    async fn get_setting(&self, key: &str) -> StoreResult<Option<String>>;
    /// Stores `value` unless the key exists; returns whichever is stored.
    async fn init_setting(&self, key: &str, value: &str) -> StoreResult<String>;
    /// Stores `value` under `key`, replacing what was there (the mapping
    /// `import-svix` keeps from a source's ids to Herald's).
    async fn put_setting(&self, key: &str, value: &str) -> StoreResult<()>;
    /// Cheap liveness probe.
    async fn ping(&self) -> StoreResult<()>;
}

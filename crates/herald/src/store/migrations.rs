//! What a store's schema holds against what this binary knows: applied and
//! pending migrations, and versions a newer Herald applied. Read without
//! applying anything (`herald migrate --status` / `--dry-run`,
//! `HERALD_AUTO_MIGRATE=false`), by each backend's `migrations` module.

/// The refusal of a store whose schema version `found` is newer than the
/// newest this binary knows, `known` (every backend, every command).
pub fn newer_schema(found: i64, known: i64) -> String {
    format!("database schema version {found} is newer than this Herald ({known}); upgrade Herald")
}

/// One migration of a store's schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migration {
    pub version: i64,
    pub name: String,
}

impl std::fmt::Display for Migration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:04} {}", self.version, self.name)
    }
}

/// A store's migrations as this binary sees them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigrationStatus {
    pub applied: Vec<Migration>,
    pub pending: Vec<Migration>,
    /// Versions the store has applied that this binary does not know: a
    /// newer Herald wrote the store.
    pub unknown: Vec<i64>,
    /// The newest version this binary knows.
    pub newest_known: i64,
}

impl MigrationStatus {
    /// The refusal to open a store a newer Herald migrated, if it is one.
    pub fn newer_than_this_binary(&self) -> Option<String> {
        let newest = self.unknown.iter().max()?;
        Some(newer_schema(*newest, self.newest_known))
    }

    /// The names of the pending migrations, comma-separated.
    pub fn pending_names(&self) -> String {
        self.pending
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

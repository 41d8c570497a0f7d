//! The SQLite store's migration status, read without applying anything.

use std::path::Path;

use rusqlite::{Connection, OpenFlags};

use super::MIGRATIONS;
use crate::store::{Migration, MigrationStatus, StoreError, StoreResult};

/// The migrations of this binary, numbered from 1 as `user_version` counts.
fn known() -> impl Iterator<Item = Migration> {
    MIGRATIONS
        .iter()
        .enumerate()
        .map(|(i, (name, _))| Migration {
            version: i64::try_from(i + 1).unwrap_or(i64::MAX),
            name: name.split_once('_').map_or(*name, |(_, n)| n).to_owned(),
        })
}

/// The newest schema version this binary knows.
pub fn newest_version() -> i64 {
    i64::try_from(MIGRATIONS.len()).unwrap_or(i64::MAX)
}

/// What the file at `path` has applied (`PRAGMA user_version`); a file
/// that does not exist yet has nothing applied.
pub fn status(path: &Path) -> StoreResult<MigrationStatus> {
    let applied_count = if path.exists() {
        let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
            .map_err(|e| StoreError::Unavailable(format!("cannot open {}: {e}", path.display())))?;
        conn.pragma_query_value(None, "user_version", |r| r.get::<_, i64>(0))
            .map_err(|e| {
                StoreError::Internal(format!(
                    "{} is not a SQLite database Herald can read: {e}",
                    path.display()
                ))
            })?
    } else {
        0
    };
    let newest = newest_version();
    let (applied, pending) = known().partition(|m| m.version <= applied_count);
    Ok(MigrationStatus {
        applied,
        pending,
        unknown: ((newest + 1)..=applied_count).collect(),
        newest_known: newest,
    })
}

//! The PostgreSQL store's migration status, read without applying
//! anything: sqlx's bookkeeping table `_sqlx_migrations` in the schema
//! against the migrations embedded in this binary.

use sqlx::{Connection, PgConnection};

use super::{quote_ident, MIGRATOR};
use crate::store::{Migration, MigrationStatus, StoreResult};

/// The newest schema version this binary knows.
pub fn newest_version() -> i64 {
    MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0)
}

/// What `schema` on the server at `url` has applied (nothing when the
/// schema or its bookkeeping table does not exist yet).
pub async fn status(url: &str, schema: &str) -> StoreResult<MigrationStatus> {
    let table = format!("{}._sqlx_migrations", quote_ident(schema)?);
    let mut conn = PgConnection::connect(url).await?;
    let exists: Option<String> = sqlx::query_scalar("SELECT to_regclass($1)::text")
        .bind(&table)
        .fetch_one(&mut conn)
        .await?;
    let done: Vec<i64> = if exists.is_some() {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT version FROM {table} WHERE success ORDER BY version"
        )))
        .fetch_all(&mut conn)
        .await?
    } else {
        Vec::new()
    };
    let _ = conn.close().await;
    let known: Vec<Migration> = MIGRATOR
        .iter()
        .map(|m| Migration {
            version: m.version,
            name: m.description.replace(' ', "_"),
        })
        .collect();
    let unknown = done
        .iter()
        .copied()
        .filter(|v| !known.iter().any(|m| m.version == *v))
        .collect();
    let (applied, pending) = known.into_iter().partition(|m| done.contains(&m.version));
    Ok(MigrationStatus {
        applied,
        pending,
        unknown,
        newest_known: newest_version(),
    })
}

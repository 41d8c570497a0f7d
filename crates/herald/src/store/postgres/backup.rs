//! Backups of the PostgreSQL store are PostgreSQL's own: `herald backup`
//! and `herald restore` say so and name the tools.

/// What `herald backup` / `herald restore` answer on PostgreSQL.
pub fn advice(schema: &str) -> String {
    format!(
        "herald backup and restore are for the SQLite store; on PostgreSQL use the database's \
         own tools: `pg_dump --schema={schema} --format=custom` and `pg_restore` for a copy, or \
         continuous archiving (WAL archiving with base backups, point-in-time recovery) for \
         production"
    )
}

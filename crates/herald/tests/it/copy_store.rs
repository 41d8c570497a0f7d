//! `herald copy-store`: the table list it copies by, against the schemas
//! the binary migrates.

use herald::store::copy::{Present, TABLES};
use sqlx::Connection;

use crate::helpers::PgSchema;

/// The table list names exactly the tables, columns and keys of a freshly
/// migrated PostgreSQL schema, so a new migration cannot be left out of
/// the copy unnoticed (the SQLite side: `store::copy`'s unit test).
#[tokio::test]
async fn table_list_covers_every_postgres_table_and_column() {
    let Some(pg) = PgSchema::new("table_list_covers_every_postgres_table_and_column") else {
        return;
    };
    let here = pg.named_again();
    pg.run(|_| async move {
        let pg = here;
        drop(pg.open().await);
        let mut conn = sqlx::PgConnection::connect(&pg.url).await.expect("connect");
        let columns: Vec<(String, String)> = sqlx::query_as(
            "SELECT table_name::text, column_name::text FROM information_schema.columns \
             WHERE table_schema = $1 AND table_name <> '_sqlx_migrations' \
             ORDER BY table_name, column_name",
        )
        .bind(&pg.schema)
        .fetch_all(&mut conn)
        .await
        .expect("columns");
        let mut want: Vec<(String, String)> = TABLES
            .iter()
            .filter(|t| t.on(true))
            .flat_map(|t| {
                t.columns_on(true)
                    .map(move |c| (t.name.to_owned(), c.name.to_owned()))
            })
            .collect();
        want.sort();
        assert_eq!(columns, want);
        for t in TABLES.iter().filter(|t| t.present != Present::SqliteOnly) {
            let key: Vec<String> = sqlx::query_scalar(
                "SELECT a.attname::text FROM pg_index i \
                 JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) \
                 WHERE i.indrelid = to_regclass($1) AND i.indisprimary \
                 ORDER BY array_position(i.indkey::int2[], a.attnum)",
            )
            .bind(format!("\"{}\".{}", pg.schema, t.name))
            .fetch_all(&mut conn)
            .await
            .expect("key");
            assert_eq!(key, t.key, "key of {}", t.name);
        }
        let _ = conn.close().await;
    })
    .await;
}

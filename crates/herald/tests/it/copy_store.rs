//! `herald copy-store`: the table list it copies by, against the schemas
//! the binary migrates.

use herald::store::copy::{to_target, ColumnKind, CopyValue, Present, TABLES};
use herald::store::postgres::copy::{insert_page, read_page as pg_read_page};
use herald::store::sqlite::copy::{insert_page as sqlite_insert_page, read_page};
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
    let here = pg.clone();
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

/// A page read from SQLite, converted and inserted on PostgreSQL, arrives
/// with its types (JSON, booleans, NULLs); sent again, as a resumed copy
/// may, it inserts nothing and changes nothing.
#[tokio::test]
async fn a_sqlite_page_lands_on_postgres_once() {
    let Some(pg) = PgSchema::new("a_sqlite_page_lands_on_postgres_once") else {
        return;
    };
    let here = pg.clone();
    pg.run(|_| async move {
        let pg = here;
        drop(pg.open().await);
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("source.db");
        drop(
            herald::store::sqlite::SqliteStore::open(&format!("sqlite://{}", path.display()))
                .await
                .expect("open sqlite"),
        );
        let source = rusqlite::Connection::open(&path).expect("source");
        source
            .execute_batch(
                "INSERT INTO applications (id, uid, name, rate_limit, metadata, created_at, updated_at) \
                 VALUES ('app_1', NULL, 'One', 5, '{\"k\":\"v\"}', 1, 2), \
                        ('app_2', 'u2', 'Two', NULL, '{}', 3, 4);
                 INSERT INTO event_types (name, description, archived, deprecated, schemas, created_at, updated_at) \
                 VALUES ('a.b', 'AB', 1, 0, '{}', 1, 1);",
            )
            .expect("source rows");
        let mut conn = sqlx::PgConnection::connect(&pg.url).await.expect("connect");
        for name in ["applications", "event_types"] {
            let table = TABLES.iter().find(|t| t.name == name).expect("listed");
            let page = read_page(&source, table, None, 100).expect("page");
            let rows: Vec<_> = page
                .iter()
                .map(|r| to_target(table, r, false, true))
                .collect();
            let first = insert_page(&mut conn, &pg.schema, table, &rows)
                .await
                .expect("insert");
            assert_eq!(first, page.len() as u64, "{name}");
            let again = insert_page(&mut conn, &pg.schema, table, &rows)
                .await
                .expect("insert again");
            assert_eq!(again, 0, "{name} sent again");
        }
        let apps: Vec<(String, Option<String>, Option<i32>, serde_json::Value)> =
            sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "SELECT id, uid, rate_limit, metadata FROM \"{}\".applications ORDER BY id",
                pg.schema
            )))
            .fetch_all(&mut conn)
            .await
            .expect("apps");
        assert_eq!(
            apps,
            [
                ("app_1".into(), None, Some(5), serde_json::json!({"k": "v"})),
                ("app_2".into(), Some("u2".into()), None, serde_json::json!({})),
            ]
        );
        let archived: bool = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT archived FROM \"{}\".event_types WHERE name = 'a.b'",
            pg.schema
        )))
        .fetch_one(&mut conn)
        .await
        .expect("event type");
        assert!(archived);

        // And back, a row per page, into a second SQLite store: the same rows.
        let back_path = dir.path().join("back.db");
        drop(
            herald::store::sqlite::SqliteStore::open(&format!("sqlite://{}", back_path.display()))
                .await
                .expect("open sqlite"),
        );
        let mut back = rusqlite::Connection::open(&back_path).expect("back");
        for name in ["applications", "event_types"] {
            let table = TABLES.iter().find(|t| t.name == name).expect("listed");
            let mut after = None;
            loop {
                let page = pg_read_page(&mut conn, &pg.schema, table, after.as_deref(), 1)
                    .await
                    .expect("pg page");
                let Some(last) = page.last() else { break };
                after = Some(table.key_of(last, true));
                let rows: Vec<_> = page
                    .iter()
                    .map(|r| to_target(table, r, true, false))
                    .collect();
                assert_eq!(sqlite_insert_page(&mut back, table, &rows).expect("insert"), 1);
            }
            // jsonb keeps the JSON, not its spacing: compared as JSON.
            let as_json = |rows: Vec<Vec<CopyValue>>| -> Vec<Vec<CopyValue>> {
                rows.into_iter()
                    .map(|row| {
                        row.into_iter()
                            .zip(table.columns_on(false))
                            .map(|(v, c)| match (v, c.kind) {
                                (CopyValue::Text(t), ColumnKind::Json) => CopyValue::Text(
                                    serde_json::from_str::<serde_json::Value>(&t)
                                        .expect("json")
                                        .to_string(),
                                ),
                                (v, _) => v,
                            })
                            .collect()
                    })
                    .collect()
            };
            assert_eq!(
                as_json(read_page(&back, table, None, 100).expect("back page")),
                as_json(read_page(&source, table, None, 100).expect("source page")),
                "{name} round trip"
            );
        }
        let _ = conn.close().await;
    })
    .await;
}

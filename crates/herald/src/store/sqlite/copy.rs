//! `herald copy-store` on SQLite: a table's rows read in key order, a page
//! at a time, as [`CopyValue`]s, and pages inserted with the copy's
//! progress beside them (the table list and the walk: `store::copy`).

use std::collections::BTreeMap;

use rusqlite::types::ValueRef;
use rusqlite::{params, Connection, OptionalExtension};

use super::counts::CountFold;
use crate::store::copy::{
    key_page_sql, own_rows_filter, progress_setting, ColumnKind, CopyRow, CopyTable, CopyValue,
    KeptCounts, PROGRESS_PREFIX,
};
use crate::store::{StoreError, StoreResult};

/// One end of a copy: a connection of its own on the store's file (no
/// Herald process serves it meanwhile: the caller holds its lock), with
/// `herald_count` registered so the schema's triggers keep the target's
/// counts as its deliveries arrive.
pub struct SqliteEnd {
    conn: Connection,
    counts: CountFold,
}

impl SqliteEnd {
    pub fn open(path: &std::path::Path) -> StoreResult<SqliteEnd> {
        let conn = super::open_connection(path, false)?;
        let counts = CountFold::register(&conn).map_err(internal)?;
        Ok(SqliteEnd { conn, counts })
    }

    pub fn read_page(
        &self,
        table: &CopyTable,
        after: Option<&[CopyValue]>,
        limit: usize,
    ) -> StoreResult<Vec<CopyRow>> {
        read_page(&self.conn, table, after, limit)
    }

    /// Inserts `rows` and records `last` (the source key of the page's
    /// last row) as the table's progress, in one transaction, with the
    /// kept counts the rows change.
    pub fn insert_page(
        &mut self,
        table: &CopyTable,
        rows: &[CopyRow],
        last: &[CopyValue],
    ) -> StoreResult<u64> {
        self.counts.begin();
        let done = insert_rows(&mut self.conn, table, rows, Some((&self.counts, last)));
        if done.is_err() {
            self.counts.discard();
        }
        done
    }

    /// The rows of `table`; the settings without the copy's progress.
    pub fn count(&self, table: &CopyTable) -> StoreResult<u64> {
        let filter = own_rows_filter(table);
        self.conn
            .query_row(
                &format!("SELECT count(*) FROM {}{filter}", table.name),
                [],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| u64::try_from(n).unwrap_or(0))
            .map_err(internal)
    }

    /// The stored progress of `table`, as JSON (`store::copy`).
    pub fn progress(&self, table: &CopyTable) -> StoreResult<Option<String>> {
        self.conn
            .query_row(
                "SELECT value FROM settings WHERE key = ?1",
                params![progress_setting(table)],
                |r| r.get(0),
            )
            .optional()
            .map_err(internal)
    }

    /// Forgets the copy's progress: the copy is complete.
    pub fn clear_progress(&self) -> StoreResult<()> {
        self.conn
            .execute(
                &format!("DELETE FROM settings WHERE key LIKE '{PROGRESS_PREFIX}%'"),
                [],
            )
            .map(drop)
            .map_err(internal)
    }

    /// Each throttled endpoint's next send slot (µs), in pages after `after`.
    pub fn throttle_slots(&self, after: &str, limit: usize) -> StoreResult<Vec<(String, i64)>> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT id, throttle_tat FROM endpoints WHERE id > ?1 AND throttle_tat > 0 \
                 ORDER BY id LIMIT ?2",
            )
            .map_err(internal)?;
        let rows = stmt
            .query_map(
                params![after, i64::try_from(limit).unwrap_or(i64::MAX)],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .map_err(internal)?;
        rows.collect::<rusqlite::Result<_>>().map_err(internal)
    }

    pub fn set_throttle_slots(&mut self, slots: &[(String, i64)]) -> StoreResult<()> {
        let tx = self.conn.transaction().map_err(internal)?;
        {
            let mut stmt = tx
                .prepare_cached("UPDATE endpoints SET throttle_tat = ?2 WHERE id = ?1")
                .map_err(internal)?;
            for (id, tat) in slots {
                stmt.execute(params![id, tat]).map_err(internal)?;
            }
        }
        tx.commit().map_err(internal)
    }

    /// The kept delivery counts that are not zero.
    pub fn kept_counts(&self) -> StoreResult<KeptCounts> {
        let mut stmt = self
            .conn
            .prepare("SELECT endpoint_id, state, held, n FROM delivery_counts WHERE n <> 0")
            .map_err(internal)?;
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    (
                        r.get::<_, String>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, bool>(2)?,
                    ),
                    r.get::<_, i64>(3)?,
                ))
            })
            .map_err(internal)?;
        rows.collect::<rusqlite::Result<BTreeMap<_, _>>>()
            .map_err(internal)
    }
}

fn internal(e: rusqlite::Error) -> StoreError {
    StoreError::Internal(e.to_string())
}

/// Up to `limit` rows of `table` after the key `after` (from the first
/// row when `None`), in key order.
pub fn read_page(
    conn: &Connection,
    table: &CopyTable,
    after: Option<&[CopyValue]>,
    limit: usize,
) -> StoreResult<Vec<CopyRow>> {
    let columns: Vec<&crate::store::copy::CopyColumn> = table.columns_on(false).collect();
    let names: Vec<&str> = columns.iter().map(|c| c.name).collect();
    let key_len = after.map_or(0, <[CopyValue]>::len);
    let sql = format!(
        "SELECT {} FROM {}{} LIMIT ?{}",
        names.join(", "),
        table.name,
        key_page_sql(table, after.is_some(), 1, '?'),
        key_len + 1
    );
    let mut stmt = conn.prepare(&sql).map_err(internal)?;
    let mut params: Vec<rusqlite::types::Value> =
        after.unwrap_or_default().iter().map(to_sql).collect();
    params.push(rusqlite::types::Value::Integer(
        i64::try_from(limit).unwrap_or(i64::MAX),
    ));
    let rows = stmt
        .query_map(rusqlite::params_from_iter(params), |r| {
            columns
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let value = r.get_ref(i)?;
                    Ok(match (value, c.kind) {
                        (ValueRef::Null, _) => CopyValue::Null,
                        (ValueRef::Integer(n), ColumnKind::Bool) => CopyValue::Bool(n != 0),
                        (ValueRef::Integer(n), _) => CopyValue::Int(n),
                        (ValueRef::Text(t), _) => {
                            CopyValue::Text(String::from_utf8_lossy(t).into_owned())
                        }
                        (ValueRef::Real(_) | ValueRef::Blob(_), _) => {
                            return Err(rusqlite::Error::InvalidColumnType(
                                i,
                                c.name.to_owned(),
                                value.data_type(),
                            ))
                        }
                    })
                })
                .collect::<rusqlite::Result<CopyRow>>()
        })
        .map_err(internal)?;
    rows.collect::<rusqlite::Result<Vec<CopyRow>>>()
        .map_err(internal)
}

fn to_sql(v: &CopyValue) -> rusqlite::types::Value {
    match v {
        CopyValue::Null => rusqlite::types::Value::Null,
        CopyValue::Int(i) => rusqlite::types::Value::Integer(*i),
        CopyValue::Bool(b) => rusqlite::types::Value::Integer(i64::from(*b)),
        CopyValue::Text(t) => rusqlite::types::Value::Text(t.clone()),
    }
}

/// Inserts `rows` (in SQLite's columns: `store::copy::to_target`) into
/// `table` in one transaction; a row whose key is there already is left
/// as it is, so a resumed copy may send a page again. The rows inserted.
/// On a connection without `herald_count` only tables without count
/// triggers can be written (the copy's own end: [`SqliteEnd`]).
pub fn insert_page(conn: &mut Connection, table: &CopyTable, rows: &[CopyRow]) -> StoreResult<u64> {
    insert_rows(conn, table, rows, None)
}

fn insert_rows(
    conn: &mut Connection,
    table: &CopyTable,
    rows: &[CopyRow],
    progress: Option<(&CountFold, &[CopyValue])>,
) -> StoreResult<u64> {
    let names: Vec<&str> = table.columns_on(false).map(|c| c.name).collect();
    let sql = format!(
        "INSERT OR IGNORE INTO {} ({}) VALUES ({})",
        table.name,
        names.join(", "),
        (1..=names.len())
            .map(|i| format!("?{i}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let tx = conn.transaction().map_err(internal)?;
    let mut done = 0u64;
    {
        let mut stmt = tx.prepare_cached(&sql).map_err(internal)?;
        for row in rows {
            if row.len() != names.len() {
                return Err(StoreError::Internal(format!(
                    "a {} row has {} values for {} columns",
                    table.name,
                    row.len(),
                    names.len()
                )));
            }
            let n = stmt
                .execute(rusqlite::params_from_iter(row.iter().map(to_sql)))
                .map_err(internal)?;
            done += u64::try_from(n).unwrap_or(0);
        }
    }
    if let Some((counts, last)) = progress {
        tx.execute(
            "INSERT INTO settings (key, value) VALUES (?1, ?2) \
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            params![
                progress_setting(table),
                crate::store::copy::encode_key(last)
            ],
        )
        .map_err(internal)?;
        counts.flush(&tx).map_err(internal)?;
    }
    tx.commit().map_err(internal)?;
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::copy::TABLES;

    fn migrated() -> Connection {
        let conn = Connection::open_in_memory().expect("in-memory SQLite");
        for (name, sql) in super::super::MIGRATIONS {
            conn.execute_batch(sql)
                .unwrap_or_else(|e| panic!("migration {name}: {e}"));
        }
        conn
    }

    fn table(name: &str) -> &'static CopyTable {
        TABLES
            .iter()
            .find(|t| t.name == name)
            .expect("listed table")
    }

    /// Pages walk a composite key in order, each after the last key of
    /// the one before, until none is left; booleans and NULLs convert.
    #[test]
    fn pages_walk_the_key_in_order() {
        let conn = migrated();
        conn.execute_batch(
            "INSERT INTO event_types (name, description, archived, deprecated, schemas, \
             created_at, updated_at) VALUES \
             ('b', 'B', 1, 0, '{}', 2, 2), ('a', 'A', 0, 0, '{}', 1, 1), ('c', 'C', 0, 1, '{}', 3, 3);
             INSERT INTO idempotency (scope, key, request_hash, status, body, created_at) VALUES \
             ('s1', 'k2', 'h', 202, 'x', 1), ('s1', 'k1', 'h', 202, 'x', 1), ('s0', 'k9', 'h', 202, 'x', 1);",
        )
        .expect("rows");
        let types = table("event_types");
        let first = read_page(&conn, types, None, 2).expect("page");
        assert_eq!(first.len(), 2);
        assert_eq!(first[0][0], CopyValue::Text("a".into()));
        assert_eq!(first[1][0], CopyValue::Text("b".into()));
        assert_eq!(first[1][2], CopyValue::Bool(true), "archived converts");
        assert_eq!(first[0][5], CopyValue::Null, "feature_flag is NULL");
        let rest = read_page(&conn, types, Some(&types.key_of(&first[1], false)), 2).expect("page");
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0][0], CopyValue::Text("c".into()));
        assert!(
            read_page(&conn, types, Some(&types.key_of(&rest[0], false)), 2)
                .expect("page")
                .is_empty()
        );

        let idem = table("idempotency");
        let first = read_page(&conn, idem, None, 2).expect("page");
        let keys: Vec<&CopyValue> = first.iter().map(|r| &r[1]).collect();
        assert_eq!(
            keys,
            [&CopyValue::Text("k9".into()), &CopyValue::Text("k1".into())]
        );
        let rest = read_page(&conn, idem, Some(&idem.key_of(&first[1], false)), 10).expect("page");
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0][1], CopyValue::Text("k2".into()));
    }
}

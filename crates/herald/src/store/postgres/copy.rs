//! `herald copy-store` on PostgreSQL: a page of rows, already in this
//! backend's columns (`store::copy::to_target`), inserted in one
//! statement; a row whose key the schema already holds is left as it is,
//! so a resumed copy may send a page again.

use sqlx::PgConnection;

use super::{map_err, quote_ident};
use crate::store::copy::{ColumnKind, CopyRow, CopyTable, CopyValue};
use crate::store::{StoreError, StoreResult};

/// The parameter's cast: each value is bound typed, NULLs included, and
/// PostgreSQL assigns it to the column's own type.
fn cast(kind: ColumnKind, value: &CopyValue) -> &'static str {
    match (kind, value) {
        (ColumnKind::Json, _) => "jsonb",
        (ColumnKind::Bool | ColumnKind::Parking, _) | (_, CopyValue::Bool(_)) => "boolean",
        (ColumnKind::Int, _) | (_, CopyValue::Int(_)) => "bigint",
        _ => "text",
    }
}

/// Inserts `rows` into `table` of `schema`; the rows inserted (fewer than
/// given when some were there already).
pub async fn insert_page(
    conn: &mut PgConnection,
    schema: &str,
    table: &CopyTable,
    rows: &[CopyRow],
) -> StoreResult<u64> {
    if rows.is_empty() {
        return Ok(0);
    }
    let columns: Vec<&crate::store::copy::CopyColumn> = table.columns_on(true).collect();
    let mut values = Vec::with_capacity(rows.len());
    let mut n = 0usize;
    for row in rows {
        if row.len() != columns.len() {
            return Err(StoreError::Internal(format!(
                "a {} row has {} values for {} columns",
                table.name,
                row.len(),
                columns.len()
            )));
        }
        let params: Vec<String> = columns
            .iter()
            .zip(row)
            .map(|(c, v)| {
                n += 1;
                format!("${n}::{}", cast(c.kind, v))
            })
            .collect();
        values.push(format!("({})", params.join(", ")));
    }
    let sql = format!(
        "INSERT INTO {}.{} ({}) VALUES {} ON CONFLICT DO NOTHING",
        quote_ident(schema)?,
        table.name,
        columns
            .iter()
            .map(|c| c.name)
            .collect::<Vec<_>>()
            .join(", "),
        values.join(", ")
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for row in rows {
        for (c, v) in columns.iter().zip(row) {
            query = match (cast(c.kind, v), v) {
                ("boolean", CopyValue::Bool(b)) => query.bind(Some(*b)),
                ("boolean", CopyValue::Int(i)) => query.bind(Some(*i != 0)),
                ("boolean", _) => query.bind(None::<bool>),
                ("bigint", CopyValue::Int(i)) => query.bind(Some(*i)),
                ("bigint", _) => query.bind(None::<i64>),
                (_, CopyValue::Text(t)) => query.bind(Some(t.clone())),
                (_, CopyValue::Int(i)) => query.bind(Some(i.to_string())),
                (_, _) => query.bind(None::<String>),
            };
        }
    }
    let done = query.execute(&mut *conn).await.map_err(map_err)?;
    Ok(done.rows_affected())
}

/// Up to `limit` rows of `table` of `schema` after the key `after` (from
/// the first row when `None`), in key order, each column read as its
/// [`ColumnKind`] carries it (JSON as text, every integer as `i64`).
pub async fn read_page(
    conn: &mut PgConnection,
    schema: &str,
    table: &CopyTable,
    after: Option<&[CopyValue]>,
    limit: usize,
) -> StoreResult<Vec<CopyRow>> {
    use sqlx::Row;
    let columns: Vec<&crate::store::copy::CopyColumn> = table.columns_on(true).collect();
    let select: Vec<String> = columns
        .iter()
        .map(|c| match c.kind {
            ColumnKind::Json => format!("{}::text", c.name),
            ColumnKind::Int => format!("{}::bigint", c.name),
            _ => c.name.to_owned(),
        })
        .collect();
    let key_len = after.map_or(0, <[CopyValue]>::len);
    let key_kinds: Vec<ColumnKind> = table
        .key
        .iter()
        .filter_map(|k| columns.iter().find(|c| c.name == *k).map(|c| c.kind))
        .collect();
    let mut filter = crate::store::copy::key_page_sql(table, after.is_some(), 1, '$');
    // Typed key parameters, as in `insert_page`.
    for (i, kind) in key_kinds.iter().enumerate().take(key_len) {
        let v = after.and_then(|a| a.get(i)).unwrap_or(&CopyValue::Null);
        filter = filter.replacen(
            &format!("${}", i + 1),
            &format!("${}::{}", i + 1, cast(*kind, v)),
            1,
        );
    }
    let sql = format!(
        "SELECT {} FROM {}.{}{} LIMIT ${}",
        select.join(", "),
        quote_ident(schema)?,
        table.name,
        filter,
        key_len + 1
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for v in after.unwrap_or_default() {
        query = match v {
            CopyValue::Null => query.bind(None::<String>),
            CopyValue::Int(i) => query.bind(*i),
            CopyValue::Bool(b) => query.bind(*b),
            CopyValue::Text(t) => query.bind(t.clone()),
        };
    }
    query = query.bind(i64::try_from(limit).unwrap_or(i64::MAX));
    let rows = query.fetch_all(&mut *conn).await.map_err(map_err)?;
    rows.iter()
        .map(|r| {
            columns
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    Ok(match c.kind {
                        ColumnKind::Int => r
                            .try_get::<Option<i64>, _>(i)
                            .map_err(map_err)?
                            .map_or(CopyValue::Null, CopyValue::Int),
                        ColumnKind::Bool | ColumnKind::Parking => r
                            .try_get::<Option<bool>, _>(i)
                            .map_err(map_err)?
                            .map_or(CopyValue::Null, CopyValue::Bool),
                        _ => r
                            .try_get::<Option<String>, _>(i)
                            .map_err(map_err)?
                            .map_or(CopyValue::Null, CopyValue::Text),
                    })
                })
                .collect::<StoreResult<CopyRow>>()
        })
        .collect()
}

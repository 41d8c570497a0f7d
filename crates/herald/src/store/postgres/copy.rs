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

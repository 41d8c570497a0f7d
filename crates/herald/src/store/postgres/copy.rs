//! `herald copy-store` on PostgreSQL: a page of rows, already in this
//! backend's columns (`store::copy::to_target`), inserted in one
//! statement; a row whose key the schema already holds is left as it is,
//! so a resumed copy may send a page again.

use sqlx::{Connection, PgConnection};

use super::{map_err, quote_ident};
use crate::store::copy::{
    encode_key, own_rows_filter, progress_setting, ColumnKind, CopyRow, CopyTable, CopyValue,
    KeptCounts, PROGRESS_PREFIX,
};
use crate::store::{StoreError, StoreResult};

/// PostgreSQL's limit on a statement's parameters: a page is inserted in
/// as many statements as it needs to stay under it.
const MAX_PARAMS: usize = 65_535;

/// One end of a copy: a connection of its own and the schema it copies.
pub struct PgEnd {
    conn: PgConnection,
    schema: String,
    ident: String,
}

impl PgEnd {
    pub async fn connect(url: &str, schema: &str) -> StoreResult<PgEnd> {
        let ident = quote_ident(schema)?;
        let conn = PgConnection::connect(url).await?;
        Ok(PgEnd {
            conn,
            schema: schema.to_owned(),
            ident,
        })
    }

    pub async fn close(self) {
        let _ = self.conn.close().await;
    }

    /// Sessions other than this one that LISTEN on the schema's channels:
    /// Herald processes serving it (API and workers both listen).
    pub async fn serving_sessions(&mut self) -> StoreResult<i64> {
        let wake: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT {}.herald_wake_channel()",
            self.ident
        )))
        .fetch_one(&mut self.conn)
        .await?;
        let tokens = wake.replacen("herald_wake_", "herald_tok_", 1);
        sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE pid <> pg_backend_pid() AND datname = current_database() \
               AND query ILIKE 'LISTEN%' \
               AND (strpos(query, $1) > 0 OR strpos(query, $2) > 0)",
        )
        .bind(format!("\"{wake}\""))
        .bind(format!("\"{tokens}\""))
        .fetch_one(&mut self.conn)
        .await
        .map_err(map_err)
    }

    pub async fn read_page(
        &mut self,
        table: &CopyTable,
        after: Option<&[CopyValue]>,
        limit: usize,
    ) -> StoreResult<Vec<CopyRow>> {
        read_page(&mut self.conn, &self.schema, table, after, limit).await
    }

    /// Inserts `rows` and records `last` (the source key of the page's
    /// last row) as the table's progress, in one transaction.
    pub async fn insert_page(
        &mut self,
        table: &CopyTable,
        rows: &[CopyRow],
        last: &[CopyValue],
    ) -> StoreResult<u64> {
        let mut tx = self.conn.begin().await?;
        let done = insert_page(&mut tx, &self.schema, table, rows).await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {}.settings (key, value) VALUES ($1, $2) \
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            self.ident
        )))
        .bind(progress_setting(table))
        .bind(encode_key(last))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done)
    }

    /// The rows of `table`; the settings without the copy's progress.
    pub async fn count(&mut self, table: &CopyTable) -> StoreResult<u64> {
        let filter = own_rows_filter(table);
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {}.{}{filter}",
            self.ident, table.name
        )))
        .fetch_one(&mut self.conn)
        .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    pub async fn progress(&mut self, table: &CopyTable) -> StoreResult<Option<String>> {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT value FROM {}.settings WHERE key = $1",
            self.ident
        )))
        .bind(progress_setting(table))
        .fetch_optional(&mut self.conn)
        .await
        .map_err(map_err)
    }

    pub async fn clear_progress(&mut self) -> StoreResult<()> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DELETE FROM {}.settings WHERE key LIKE '{PROGRESS_PREFIX}%'",
            self.ident
        )))
        .execute(&mut self.conn)
        .await
        .map(drop)
        .map_err(map_err)
    }

    /// Each throttled endpoint's next send slot (µs), in pages after `after`.
    pub async fn throttle_slots(
        &mut self,
        after: &str,
        limit: usize,
    ) -> StoreResult<Vec<(String, i64)>> {
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT endpoint_id, tat_us FROM {}.endpoint_throttle \
             WHERE endpoint_id > $1 AND tat_us > 0 ORDER BY endpoint_id LIMIT $2",
            self.ident
        )))
        .bind(after)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&mut self.conn)
        .await
        .map_err(map_err)
    }

    /// Sets the slots of endpoints that have a throttle row (made by the
    /// schema's trigger for every endpoint with a rate).
    pub async fn set_throttle_slots(&mut self, slots: &[(String, i64)]) -> StoreResult<()> {
        let (ids, tats): (Vec<String>, Vec<i64>) = slots.iter().cloned().unzip();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {}.endpoint_throttle t SET tat_us = s.tat \
             FROM unnest($1::text[], $2::bigint[]) AS s(id, tat) WHERE t.endpoint_id = s.id",
            self.ident
        )))
        .bind(ids)
        .bind(tats)
        .execute(&mut self.conn)
        .await
        .map(drop)
        .map_err(map_err)
    }

    /// The kept delivery counts that are not zero: the folded rows with
    /// the deltas not folded yet.
    pub async fn kept_counts(&mut self) -> StoreResult<KeptCounts> {
        let rows: Vec<(String, i16, bool, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT endpoint_id, state::int2, held, sum(n)::int8 FROM ( \
               SELECT endpoint_id, state, held, n FROM {s}.delivery_counts \
               UNION ALL SELECT endpoint_id, state, held, n FROM {s}.delivery_count_deltas \
             ) c GROUP BY 1, 2, 3 HAVING sum(n) <> 0",
            s = self.ident
        )))
        .fetch_all(&mut self.conn)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(e, state, held, n)| ((e, i64::from(state), held), n))
            .collect())
    }
}

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
    let columns = table.columns_on(true).count().max(1);
    let mut done = 0;
    for chunk in rows.chunks((MAX_PARAMS / columns).max(1)) {
        done += insert_statement(conn, schema, table, chunk).await?;
    }
    Ok(done)
}

async fn insert_statement(
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
    let done = query.execute(&mut *conn).await?;
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
    let rows = query.fetch_all(&mut *conn).await?;
    rows.iter()
        .map(|r| {
            columns
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    Ok(match c.kind {
                        ColumnKind::Int => r
                            .try_get::<Option<i64>, _>(i)?
                            .map_or(CopyValue::Null, CopyValue::Int),
                        ColumnKind::Bool | ColumnKind::Parking => r
                            .try_get::<Option<bool>, _>(i)?
                            .map_or(CopyValue::Null, CopyValue::Bool),
                        _ => r
                            .try_get::<Option<String>, _>(i)?
                            .map_or(CopyValue::Null, CopyValue::Text),
                    })
                })
                .collect::<StoreResult<CopyRow>>()
        })
        .collect()
}

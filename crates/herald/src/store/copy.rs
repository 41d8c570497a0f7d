//! What `herald copy-store` moves from one store to another, written once
//! for both backends: every table in the order its rows can be inserted
//! (parents first), its key (the copy runs in key order, so `--resume`
//! continues after the greatest key the target holds), and how each
//! column converts between SQLite (integers for booleans, text for JSON)
//! and PostgreSQL (real types).
//!
//! The backends' schemas differ in a few places; each is named here so the
//! copy converts it rather than dropping it:
//! - a delivery's parking: SQLite `deliveries.parked` is 0 (claimable),
//!   1 (parked behind a full endpoint) or 2 (held: its endpoint is
//!   disabled); PostgreSQL has two booleans, `parked` and `held`.
//! - the throttle's next send slot: SQLite `endpoints.throttle_tat`,
//!   PostgreSQL `endpoint_throttle.tat_us` (a row its trigger makes per
//!   endpoint), both in microseconds.
//! - PostgreSQL-only bookkeeping (`endpoints.fifo_turns`, `fifo_last`,
//!   `parked_endpoints.parks`) starts from its default on the target.
//!
//! The kept counts (`delivery_counts`, PostgreSQL `delivery_count_deltas`)
//! are not copied: each backend derives them from the deliveries it
//! stores, so the target's counts are computed from the copied rows.

/// How a column's value converts between the backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnKind {
    Text,
    /// SQLite INTEGER; PostgreSQL SMALLINT, INTEGER or BIGINT.
    Int,
    /// SQLite INTEGER 0/1; PostgreSQL BOOLEAN.
    Bool,
    /// SQLite TEXT; PostgreSQL JSONB.
    Json,
    /// A delivery's parking: SQLite 0, 1 or [`SQLITE_PARKED_HELD`];
    /// PostgreSQL the boolean `parked` with the boolean `held` beside it
    /// ([`parking_to_postgres`], [`parking_to_sqlite`]).
    Parking,
    /// A credential that may be sealed at rest (`store::secrets`): opened
    /// with the source's key and sealed again with the target's.
    Sealed,
}

/// Which backends have a column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Present {
    Both,
    SqliteOnly,
    PostgresOnly,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyColumn {
    pub name: &'static str,
    pub kind: ColumnKind,
    pub present: Present,
}

/// Rows that are derived, not copied: the target computes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Derived {
    /// Copied row for row.
    No,
    /// Kept counts the target derives from its deliveries.
    KeptCounts,
    /// PostgreSQL's per-endpoint throttle row, made by a trigger when an
    /// endpoint is inserted; its slot comes from SQLite's `throttle_tat`.
    ThrottleRow,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyTable {
    pub name: &'static str,
    pub key: &'static [&'static str],
    pub columns: &'static [CopyColumn],
    pub present: Present,
    pub derived: Derived,
}

impl CopyTable {
    /// The columns this table has on one backend.
    pub fn columns_on(&self, postgres: bool) -> impl Iterator<Item = &CopyColumn> {
        self.columns.iter().filter(move |c| match c.present {
            Present::Both => true,
            Present::SqliteOnly => !postgres,
            Present::PostgresOnly => postgres,
        })
    }

    /// The key values of `row` (read from this table on one backend), to
    /// page on after it.
    pub fn key_of(&self, row: &[CopyValue], postgres: bool) -> Vec<CopyValue> {
        let names: Vec<&str> = self.columns_on(postgres).map(|c| c.name).collect();
        self.key
            .iter()
            .filter_map(|k| names.iter().position(|n| n == k))
            .filter_map(|i| row.get(i).cloned())
            .collect()
    }

    /// Whether the table exists on one backend.
    pub fn on(&self, postgres: bool) -> bool {
        match self.present {
            Present::Both => true,
            Present::SqliteOnly => !postgres,
            Present::PostgresOnly => postgres,
        }
    }
}

const fn col(name: &'static str, kind: ColumnKind) -> CopyColumn {
    CopyColumn {
        name,
        kind,
        present: Present::Both,
    }
}

const fn only(name: &'static str, kind: ColumnKind, present: Present) -> CopyColumn {
    CopyColumn {
        name,
        kind,
        present,
    }
}

const fn table(
    name: &'static str,
    key: &'static [&'static str],
    columns: &'static [CopyColumn],
) -> CopyTable {
    CopyTable {
        name,
        key,
        columns,
        present: Present::Both,
        derived: Derived::No,
    }
}

use ColumnKind::{Bool, Int, Json, Parking, Sealed, Text};

/// The value SQLite's `deliveries.parked` holds for a held delivery.
pub const SQLITE_PARKED_HELD: i64 = 2;

/// Every table of a Herald store, in insertion order.
pub const TABLES: &[CopyTable] = &[
    table(
        "settings",
        &["key"],
        &[col("key", Text), col("value", Text)],
    ),
    table(
        "applications",
        &["id"],
        &[
            col("id", Text),
            col("uid", Text),
            col("name", Text),
            col("rate_limit", Int),
            col("metadata", Json),
            col("created_at", Int),
            col("updated_at", Int),
        ],
    ),
    table(
        "endpoints",
        &["id"],
        &[
            col("id", Text),
            col("app_id", Text),
            col("uid", Text),
            col("url", Sealed),
            col("description", Text),
            col("filter_types", Json),
            col("disabled", Bool),
            col("rate_limit", Int),
            col("metadata", Json),
            col("secret", Sealed),
            col("created_at", Int),
            col("updated_at", Int),
            col("fail_streak", Int),
            col("streak_started_at", Int),
            col("last_success_at", Int),
            col("last_error", Text),
            col("last_error_at", Int),
            col("disabled_reason", Text),
            col("disabled_at", Int),
            col("disabled_by", Text),
            col("old_secrets", Sealed),
            col("channels", Text),
            col("headers", Sealed),
            col("ordering", Text),
            only("throttle_tat", Int, Present::SqliteOnly),
            col("circuit_state", Int),
            col("circuit_since", Int),
            col("circuit_until", Int),
            col("circuit_cooldown_ms", Int),
            col("circuit_probe_by", Text),
            col("circuit_window_at", Int),
            col("circuit_attempts", Int),
            col("circuit_failures", Int),
            col("circuit_prev_attempts", Int),
            col("circuit_prev_failures", Int),
            only("fifo_turns", Int, Present::PostgresOnly),
            only("fifo_last", Int, Present::PostgresOnly),
        ],
    ),
    CopyTable {
        name: "endpoint_throttle",
        key: &["endpoint_id"],
        columns: &[col("endpoint_id", Text), col("tat_us", Int)],
        present: Present::PostgresOnly,
        derived: Derived::ThrottleRow,
    },
    table(
        "event_types",
        &["name"],
        &[
            col("name", Text),
            col("description", Text),
            col("archived", Bool),
            col("deprecated", Bool),
            col("schemas", Text),
            col("feature_flag", Text),
            col("group_name", Text),
            col("created_at", Int),
            col("updated_at", Int),
        ],
    ),
    table(
        "messages",
        &["id"],
        &[
            col("id", Text),
            col("app_id", Text),
            col("event_type", Text),
            col("event_id", Text),
            col("payload", Text),
            col("created_at", Int),
            col("channels", Text),
            col("traceparent", Text),
            col("tags", Text),
            col("deliver_at", Int),
            col("expunged_at", Int),
            col("payload_expires_at", Int),
        ],
    ),
    table(
        "deliveries",
        &["id"],
        &[
            col("id", Text),
            col("msg_id", Text),
            col("endpoint_id", Text),
            col("app_id", Text),
            col("state", Int),
            col("attempts", Int),
            col("next_attempt_at", Int),
            col("lease_token", Text),
            col("cycle_started_at", Int),
            col("cycle_base", Int),
            col("manual", Bool),
            col("dead_reason", Text),
            col("last_status", Int),
            col("last_error", Text),
            col("created_at", Int),
            col("updated_at", Int),
            col("parked", Parking),
            only("held", Bool, Present::PostgresOnly),
            col("queued_at", Int),
        ],
    ),
    table(
        "attempts",
        &["id"],
        &[
            col("id", Text),
            col("delivery_id", Text),
            col("msg_id", Text),
            col("endpoint_id", Text),
            col("app_id", Text),
            col("url", Text),
            col("attempt_number", Int),
            col("started_at", Int),
            col("duration_ms", Int),
            col("status_code", Int),
            col("response", Text),
            col("error", Text),
            col("success", Bool),
            col("manual", Bool),
        ],
    ),
    table(
        "parked_endpoints",
        &["endpoint_id"],
        &[
            col("endpoint_id", Text),
            only("parks", Int, Present::PostgresOnly),
        ],
    ),
    table(
        "endpoint_stats",
        &["endpoint_id", "bucket"],
        &[
            col("endpoint_id", Text),
            col("bucket", Int),
            col("attempts", Int),
            col("successes", Int),
            col("failures", Int),
            col("latency_sum", Int),
            col("h0", Int),
            col("h1", Int),
            col("h2", Int),
            col("h3", Int),
            col("h4", Int),
            col("h5", Int),
            col("h6", Int),
            col("h7", Int),
            col("h8", Int),
            col("h9", Int),
            col("h10", Int),
            col("h11", Int),
        ],
    ),
    table(
        "api_tokens",
        &["id"],
        &[
            col("id", Text),
            col("app_id", Text),
            col("sha256", Text),
            col("name", Text),
            col("created_at", Int),
            col("expires_at", Int),
            col("capabilities", Text),
            col("session_id", Text),
            col("feature_flags", Text),
        ],
    ),
    table(
        "sessions",
        &["sha256"],
        &[
            col("sha256", Text),
            col("kind", Text),
            col("app_id", Text),
            col("token_id", Text),
            col("capabilities", Text),
            col("session_id", Text),
            col("theme", Text),
            col("csrf", Text),
            col("flash", Text),
            col("created_at", Int),
            col("expires_at", Int),
        ],
    ),
    table(
        "portal_codes",
        &["sha256"],
        &[
            col("sha256", Text),
            col("token_id", Text),
            col("expires_at", Int),
        ],
    ),
    table(
        "idempotency",
        &["scope", "key"],
        &[
            col("scope", Text),
            col("key", Text),
            col("request_hash", Text),
            col("status", Int),
            col("body", Text),
            col("created_at", Int),
        ],
    ),
    table(
        "audit_log",
        &["id"],
        &[
            col("id", Text),
            col("at", Int),
            col("actor_kind", Text),
            col("actor_id", Text),
            col("action", Text),
            col("app_id", Text),
            col("target", Text),
            col("source", Text),
            col("details", Text),
        ],
    ),
    CopyTable {
        name: "delivery_counts",
        key: &["endpoint_id", "state", "held"],
        columns: &[
            col("endpoint_id", Text),
            col("state", Int),
            col("held", Bool),
            col("n", Int),
        ],
        present: Present::Both,
        derived: Derived::KeptCounts,
    },
    CopyTable {
        name: "delivery_count_deltas",
        // No key: an append-only log of changes the counts fold in.
        key: &[],
        columns: &[
            col("endpoint_id", Text),
            col("state", Int),
            col("held", Bool),
            col("n", Int),
        ],
        present: Present::PostgresOnly,
        derived: Derived::KeptCounts,
    },
];

/// A delivery's parking on PostgreSQL, `(parked, held)`, from SQLite's
/// `parked` value.
pub fn parking_to_postgres(sqlite_parked: i64) -> (bool, bool) {
    match sqlite_parked {
        0 => (false, false),
        SQLITE_PARKED_HELD => (false, true),
        _ => (true, false),
    }
}

/// SQLite's `parked` value from a delivery's parking on PostgreSQL; held
/// wins, as a held delivery is out of the claim index either way.
pub fn parking_to_sqlite(parked: bool, held: bool) -> i64 {
    if held {
        SQLITE_PARKED_HELD
    } else {
        i64::from(parked)
    }
}

/// One column's value as the copy carries it, which both backends'
/// drivers read and write; a column's [`ColumnKind`] says how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyValue {
    Null,
    Int(i64),
    Bool(bool),
    Text(String),
}

/// One row, its values in the order of [`CopyTable::columns_on`].
pub type CopyRow = Vec<CopyValue>;

/// The `WHERE` and `ORDER BY` of a page in key order after `key_len` key
/// values bound from `first_param` on (`$n` for PostgreSQL, `?n` for
/// SQLite; both take row-value comparisons).
pub fn key_page_sql(table: &CopyTable, after: bool, first_param: usize, sigil: char) -> String {
    let key = table.key.join(", ");
    let filter = if after && !table.key.is_empty() {
        let params: Vec<String> = (0..table.key.len())
            .map(|i| format!("{sigil}{}", first_param + i))
            .collect();
        format!(" WHERE ({key}) > ({})", params.join(", "))
    } else {
        String::new()
    };
    if table.key.is_empty() {
        filter
    } else {
        format!("{filter} ORDER BY {key}")
    }
}

/// `row`, read from `table` on the source backend, in the target's
/// columns: values carried by name, a delivery's parking split or joined
/// ([`parking_to_postgres`], [`parking_to_sqlite`]), and columns only the
/// target has given their default, 0 (PostgreSQL's fifo and parks
/// bookkeeping; SQLite's `throttle_tat`, which the copy then sets from
/// PostgreSQL's `endpoint_throttle`).
pub fn to_target(table: &CopyTable, row: &[CopyValue], from_pg: bool, to_pg: bool) -> CopyRow {
    let source: Vec<&str> = table.columns_on(from_pg).map(|c| c.name).collect();
    let get = |name: &str| {
        source
            .iter()
            .position(|n| *n == name)
            .and_then(|i| row.get(i))
    };
    let as_bool = |v: Option<&CopyValue>| match v {
        Some(CopyValue::Bool(b)) => *b,
        Some(CopyValue::Int(n)) => *n != 0,
        _ => false,
    };
    table
        .columns_on(to_pg)
        .map(|c| match (c.kind, c.name, from_pg, to_pg) {
            (ColumnKind::Parking, _, false, true) => {
                let parked = match get(c.name) {
                    Some(CopyValue::Int(n)) => *n,
                    _ => 0,
                };
                CopyValue::Bool(parking_to_postgres(parked).0)
            }
            (ColumnKind::Parking, _, true, false) => CopyValue::Int(parking_to_sqlite(
                as_bool(get(c.name)),
                as_bool(get("held")),
            )),
            (_, "held", false, true) if table.name == "deliveries" => {
                let parked = match get("parked") {
                    Some(CopyValue::Int(n)) => *n,
                    _ => 0,
                };
                CopyValue::Bool(parking_to_postgres(parked).1)
            }
            _ => get(c.name).cloned().unwrap_or(CopyValue::Int(0)),
        })
        .collect()
}

/// The settings a copy records its progress under in the target, one per
/// table (`copy-store:<table>`, the source key of the last row committed,
/// in the same transaction as the rows): `--resume` continues after it,
/// whatever order the target's collation would give the keys. Deleted
/// when the copy completes.
pub const PROGRESS_PREFIX: &str = "copy-store:";

pub fn progress_setting(table: &CopyTable) -> String {
    format!("{PROGRESS_PREFIX}{}", table.name)
}

/// The `WHERE` that counts `table`'s own rows: the settings without the
/// copy's progress.
pub fn own_rows_filter(table: &CopyTable) -> String {
    if table.name == "settings" {
        format!(" WHERE key NOT LIKE '{PROGRESS_PREFIX}%'")
    } else {
        String::new()
    }
}

/// A key as its progress setting holds it: a JSON array.
pub fn encode_key(key: &[CopyValue]) -> String {
    serde_json::Value::Array(
        key.iter()
            .map(|v| match v {
                CopyValue::Null => serde_json::Value::Null,
                CopyValue::Int(i) => (*i).into(),
                CopyValue::Bool(b) => (*b).into(),
                CopyValue::Text(t) => t.as_str().into(),
            })
            .collect(),
    )
    .to_string()
}

/// The key a progress setting holds; `None` when it is not one.
pub fn decode_key(text: &str) -> Option<Vec<CopyValue>> {
    let serde_json::Value::Array(values) = serde_json::from_str(text).ok()? else {
        return None;
    };
    values
        .into_iter()
        .map(|v| match v {
            serde_json::Value::Null => Some(CopyValue::Null),
            serde_json::Value::Bool(b) => Some(CopyValue::Bool(b)),
            serde_json::Value::Number(n) => n.as_i64().map(CopyValue::Int),
            serde_json::Value::String(s) => Some(CopyValue::Text(s)),
            _ => None,
        })
        .collect()
}

/// The kept delivery counts that are not zero, by (endpoint, state, held).
pub type KeptCounts = std::collections::BTreeMap<(String, i64, bool), i64>;

/// Opens the credentials of an endpoint row (in the target's columns)
/// with the source's keys and seals them with the target's: the copy
/// never writes a value the target's `HERALD_ENCRYPTION_KEY` cannot open.
/// The error names the endpoint and column, never the value.
pub fn reseal_endpoint(
    table: &CopyTable,
    row: &mut CopyRow,
    on_postgres: bool,
    from: &crate::crypto::Keyring,
    to: &crate::crypto::Keyring,
) -> super::StoreResult<()> {
    use super::secrets::{open_or_fail, seal_column, SecretColumn};
    let names: Vec<&str> = table.columns_on(on_postgres).map(|c| c.name).collect();
    let Some(CopyValue::Text(id)) = names
        .iter()
        .position(|n| *n == "id")
        .and_then(|i| row.get(i))
        .cloned()
    else {
        return Ok(());
    };
    for column in SecretColumn::ALL {
        let Some(i) = names.iter().position(|n| *n == column.name()) else {
            continue;
        };
        if let Some(CopyValue::Text(stored)) = row.get(i) {
            let plain = open_or_fail(from, &id, column, stored)?;
            row[i] = CopyValue::Text(seal_column(to, &id, column, &plain));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parking_converts_both_ways() {
        for v in [0, 1, SQLITE_PARKED_HELD] {
            let (parked, held) = parking_to_postgres(v);
            assert_eq!(parking_to_sqlite(parked, held), v);
        }
        assert_eq!(parking_to_postgres(1), (true, false));
        assert_eq!(parking_to_postgres(SQLITE_PARKED_HELD), (false, true));
    }

    fn listed(name: &str) -> &'static CopyTable {
        TABLES
            .iter()
            .find(|t| t.name == name)
            .expect("listed table")
    }

    /// A held SQLite delivery becomes `held` and not `parked` on
    /// PostgreSQL and back; every other value is carried by name.
    #[test]
    fn deliveries_convert_between_backends() {
        let deliveries = listed("deliveries");
        let sqlite_row: CopyRow = deliveries
            .columns_on(false)
            .map(|c| match c.name {
                "parked" => CopyValue::Int(SQLITE_PARKED_HELD),
                "manual" => CopyValue::Bool(true),
                "lease_token" => CopyValue::Null,
                name => CopyValue::Text(name.to_owned()),
            })
            .collect();
        let pg_row = to_target(deliveries, &sqlite_row, false, true);
        let pg_names: Vec<&str> = deliveries.columns_on(true).map(|c| c.name).collect();
        let at = |name: &str| &pg_row[pg_names.iter().position(|n| *n == name).expect("column")];
        assert_eq!(at("parked"), &CopyValue::Bool(false));
        assert_eq!(at("held"), &CopyValue::Bool(true));
        assert_eq!(at("manual"), &CopyValue::Bool(true));
        assert_eq!(at("lease_token"), &CopyValue::Null);
        assert_eq!(at("msg_id"), &CopyValue::Text("msg_id".into()));
        assert_eq!(to_target(deliveries, &pg_row, true, false), sqlite_row);
        assert_eq!(to_target(deliveries, &sqlite_row, false, false), sqlite_row);
    }

    /// PostgreSQL-only bookkeeping starts at 0; SQLite→SQLite is as is.
    #[test]
    fn columns_only_the_target_has_start_at_zero() {
        let endpoints = listed("endpoints");
        let sqlite_row: CopyRow = endpoints
            .columns_on(false)
            .map(|c| CopyValue::Text(c.name.to_owned()))
            .collect();
        let pg_row = to_target(endpoints, &sqlite_row, false, true);
        let pg_names: Vec<&str> = endpoints.columns_on(true).map(|c| c.name).collect();
        assert_eq!(pg_row.len(), pg_names.len());
        for (name, value) in pg_names.iter().zip(&pg_row) {
            let want = if name.starts_with("fifo_") {
                CopyValue::Int(0)
            } else {
                CopyValue::Text((*name).to_owned())
            };
            assert_eq!(value, &want, "{name}");
        }
    }

    /// The table list names exactly the tables and columns of a freshly
    /// migrated SQLite store, so a new migration cannot be left out of
    /// the copy unnoticed.
    #[test]
    fn covers_every_sqlite_table_and_column() {
        let conn = rusqlite::Connection::open_in_memory().expect("in-memory SQLite");
        for (name, sql) in crate::store::sqlite::MIGRATIONS {
            conn.execute_batch(sql)
                .unwrap_or_else(|e| panic!("migration {name}: {e}"));
        }
        let mut tables: Vec<String> = conn
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
            .and_then(|mut s| {
                s.query_map([], |r| r.get(0))?
                    .collect::<Result<Vec<String>, _>>()
            })
            .expect("table names");
        tables.retain(|t| !t.starts_with("sqlite_"));
        let mut listed: Vec<&str> = TABLES
            .iter()
            .filter(|t| t.on(false))
            .map(|t| t.name)
            .collect();
        listed.sort_unstable();
        assert_eq!(tables, listed);
        for t in TABLES.iter().filter(|t| t.on(false)) {
            let cols: Vec<String> = conn
                .prepare(&format!("SELECT name FROM pragma_table_info('{}')", t.name))
                .and_then(|mut s| {
                    s.query_map([], |r| r.get(0))?
                        .collect::<Result<Vec<String>, _>>()
                })
                .expect("column names");
            let mut cols = cols;
            cols.sort_unstable();
            let mut want: Vec<&str> = t.columns_on(false).map(|c| c.name).collect();
            want.sort_unstable();
            assert_eq!(cols, want, "columns of {}", t.name);
            let key: Vec<String> = conn
                .prepare(&format!(
                    "SELECT name FROM pragma_table_info('{}') WHERE pk > 0 ORDER BY pk",
                    t.name
                ))
                .and_then(|mut s| {
                    s.query_map([], |r| r.get(0))?
                        .collect::<Result<Vec<String>, _>>()
                })
                .expect("key columns");
            assert_eq!(key, t.key, "key of {}", t.name);
        }
    }
}

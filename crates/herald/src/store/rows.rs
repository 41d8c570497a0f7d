//! Reading a stored row of either backend by column name, so that each
//! model's row mapper is written once, beside its model, not once per
//! backend. A backend implements [`StoredRow`] for its row type (SQLite
//! keeps flags as integers, PostgreSQL as booleans, and integer columns in
//! several widths: the impls hide that).

use super::{StoreError, StoreResult};

/// A row: each column read as text, a whole number or a flag, `None` for
/// SQL `NULL`.
pub trait StoredRow {
    fn text(&self, column: &str) -> StoreResult<Option<String>>;
    fn int(&self, column: &str) -> StoreResult<Option<i64>>;
    fn flag(&self, column: &str) -> StoreResult<Option<bool>>;
}

/// A value one column holds.
pub trait Column: Sized {
    fn read(row: &impl StoredRow, column: &str) -> StoreResult<Self>;
}

fn not_null<T>(value: Option<T>, column: &str) -> StoreResult<T> {
    value.ok_or_else(|| StoreError::Internal(format!("column {column} is NULL")))
}

impl Column for String {
    fn read(row: &impl StoredRow, column: &str) -> StoreResult<Self> {
        not_null(row.text(column)?, column)
    }
}

impl Column for Option<String> {
    fn read(row: &impl StoredRow, column: &str) -> StoreResult<Self> {
        row.text(column)
    }
}

impl Column for i64 {
    fn read(row: &impl StoredRow, column: &str) -> StoreResult<Self> {
        not_null(row.int(column)?, column)
    }
}

impl Column for Option<i64> {
    fn read(row: &impl StoredRow, column: &str) -> StoreResult<Self> {
        row.int(column)
    }
}

impl Column for bool {
    fn read(row: &impl StoredRow, column: &str) -> StoreResult<Self> {
        not_null(row.flag(column)?, column)
    }
}

/// Column `column` of `row`, as the type asked for.
pub fn col<T: Column>(row: &impl StoredRow, column: &str) -> StoreResult<T> {
    T::read(row, column)
}

/// A whole number that fits `u16` (a rate), else none.
pub fn u16_col(row: &impl StoredRow, column: &str) -> StoreResult<Option<u16>> {
    Ok(row.int(column)?.and_then(|v| u16::try_from(v).ok()))
}

/// A count that fits `u32` (else 0).
pub fn u32_col(row: &impl StoredRow, column: &str) -> StoreResult<u32> {
    let v: i64 = col(row, column)?;
    Ok(u32::try_from(v).unwrap_or(0))
}

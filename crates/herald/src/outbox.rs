//! The transactional outbox for applications on PostgreSQL.
//!
//! An application whose own data lives in the PostgreSQL database Herald
//! uses can queue a webhook in the same transaction as the change it
//! announces: the message and its deliveries exist if, and only if, that
//! transaction commits. There is no window in which the change is saved
//! but the event lost (or the event sent for a change rolled back), and no
//! HTTP call to Herald inside the transaction.
//!
//! The work is done by the SQL function `send_message`, which Herald's
//! migrations create in its schema; SQL callers can use it directly:
//!
//! ```sql
//! BEGIN;
//! INSERT INTO orders (id, total_cents) VALUES ('ord_42', 1999);
//! SELECT herald.send_message('acme', 'order.created',
//!                            '{"orderId": "ord_42"}'::jsonb, 'order-ord_42');
//! COMMIT;
//! ```
//!
//! It fans the message out exactly as Herald's API does and wakes the
//! Herald processes on commit (NOTIFY). The caller needs write access to
//! Herald's tables. [`send_message`] is the same call from Rust.

use sqlx::PgConnection;

use crate::ids::MsgId;

/// Why [`send_message`] refused or failed. Any error leaves the caller's
/// transaction aborted, as every failed statement in PostgreSQL does; to
/// carry on in it (say, after a duplicate event id), call inside a
/// savepoint (`tx.begin()` on the transaction).
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    /// No application has this id or uid.
    #[error("no Herald application with id or uid `{0}`")]
    UnknownApp(String),
    /// The application already has a message with this `eventId`.
    #[error("a message with eventId `{0}` already exists in this application")]
    DuplicateEventId(String),
    /// Something Herald's API would refuse too: an event type that is not
    /// 1-256 letters, digits, `-`, `_` or `.`; an empty or over-long event
    /// id; a payload over 1 MiB.
    #[error("invalid message: {0}")]
    Invalid(String),
    /// The schema name cannot be quoted (empty, or containing NUL).
    #[error("invalid Herald schema name {0:?}")]
    InvalidSchema(String),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

/// Queues a message on `conn` (normally a transaction: pass `&mut *tx`),
/// to be delivered once that transaction commits. `schema` is Herald's
/// schema (`HERALD_DATABASE_SCHEMA`, `herald` by default); `app` an
/// application's id or uid; `event_id`, if given, is the idempotency key
/// within the app. Returns the new message's id.
///
/// ```no_run
/// use herald::outbox::{send_message, OutboxError};
///
/// #[tokio::main]
/// async fn main() -> Result<(), Box<dyn std::error::Error>> {
///     let pool = sqlx::PgPool::connect("postgres://app@db.internal/shop").await?;
///
///     let mut tx = pool.begin().await?;
///     sqlx::query("INSERT INTO orders (id, total_cents) VALUES ($1, $2)")
///         .bind("ord_42")
///         .bind(1999_i64)
///         .execute(&mut *tx)
///         .await?;
///     let sent = send_message(
///         &mut *tx,
///         "herald",
///         "acme",
///         "order.created",
///         &serde_json::json!({ "orderId": "ord_42", "totalCents": 1999 }),
///         Some("order-ord_42"),
///     )
///     .await;
///     match sent {
///         Ok(msg_id) => {
///             // The order and the message are saved together, or not at all.
///             tx.commit().await?;
///             println!("order saved; webhook {msg_id} queued");
///         }
///         Err(OutboxError::DuplicateEventId(_)) => {
///             // Already announced: the transaction is aborted; roll back.
///             tx.rollback().await?;
///         }
///         Err(e) => return Err(e.into()),
///     }
///     Ok(())
/// }
/// ```
pub async fn send_message(
    conn: &mut PgConnection,
    schema: &str,
    app: &str,
    event_type: &str,
    payload: &serde_json::Value,
    event_id: Option<&str>,
) -> Result<MsgId, OutboxError> {
    let schema_ident = crate::store::postgres::quote_ident(schema)
        .map_err(|_| OutboxError::InvalidSchema(schema.to_owned()))?;
    // Bound as text and cast: the JSON goes in as the caller serialised it.
    let payload_text = serde_json::to_string(payload)
        .map_err(|e| OutboxError::Invalid(format!("payload: {e}")))?;
    let id: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT {schema_ident}.send_message($1, $2, $3::jsonb, $4)"
    )))
    .bind(app)
    .bind(event_type)
    .bind(payload_text)
    .bind(event_id)
    .fetch_one(conn)
    .await
    .map_err(|e| classify(e, app, event_id))?;
    MsgId::parse(&id).ok_or_else(|| {
        OutboxError::Database(sqlx::Error::Protocol(format!(
            "send_message returned `{id}`, not a message id"
        )))
    })
}

/// Maps the errors `send_message` raises on purpose (see migration 0002).
fn classify(e: sqlx::Error, app: &str, event_id: Option<&str>) -> OutboxError {
    if let sqlx::Error::Database(db) = &e {
        match db.code().as_deref() {
            // no_data_found: raised for an unknown app.
            Some("P0002") => return OutboxError::UnknownApp(app.to_owned()),
            // unique_violation on (app_id, event_id).
            Some("23505") if db.constraint() == Some("messages_app_id_event_id_key") => {
                return OutboxError::DuplicateEventId(event_id.unwrap_or_default().to_owned())
            }
            // invalid_parameter_value, null_value_not_allowed.
            Some("22023" | "22004") => return OutboxError::Invalid(db.message().to_owned()),
            _ => {}
        }
    }
    OutboxError::Database(e)
}

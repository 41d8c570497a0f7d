//! Reads of messages, deliveries and attempts on PostgreSQL.

use super::*;

const MESSAGE_COLUMNS: &str =
    "id, app_id, event_type, event_id, payload, created_at, channels, traceparent, tags, deliver_at";

const DELIVERY_COLUMNS: &str =
    "d.id, d.msg_id, d.app_id, d.endpoint_id, m.event_type, d.state, d.attempts, \
     d.next_attempt_at, d.dead_reason, d.last_status, d.last_error, d.created_at, d.updated_at";

const ATTEMPT_COLUMNS: &str =
    "id, delivery_id, msg_id, endpoint_id, app_id, url, attempt_number, started_at, duration_ms, \
     status_code, response, error, success, manual";

#[async_trait]
impl History for PostgresStore {
    async fn get_message(&self, app: &AppId, id_or_event_id: &str) -> StoreResult<Option<Message>> {
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages WHERE app_id = $1 AND (id = $2 OR event_id = $2) \
             ORDER BY id = $2 DESC LIMIT 1"
        )))
        .bind(app.as_str())
        .bind(id_or_event_id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(message_from_row).transpose()
    }

    async fn get_delivery(&self, app: &AppId, id: &DeliveryId) -> StoreResult<Option<Delivery>> {
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT {DELIVERY_COLUMNS} FROM deliveries d JOIN messages m ON m.id = d.msg_id \
             WHERE d.id = $1 AND d.app_id = $2"
        )))
        .bind(id.as_str())
        .bind(app.as_str())
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(delivery_from_row).transpose()
    }

    async fn list_deliveries_of_message(
        &self,
        app: &AppId,
        msg: &MsgId,
    ) -> StoreResult<Vec<Delivery>> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT {DELIVERY_COLUMNS} FROM deliveries d JOIN messages m ON m.id = d.msg_id \
             WHERE d.msg_id = $1 AND d.app_id = $2 ORDER BY d.id"
        )))
        .bind(msg.as_str())
        .bind(app.as_str())
        .fetch_all(&self.pool)
        .await?;
        map_rows(&rows, delivery_from_row)
    }

    async fn list_dead(&self, filter: &DeadFilter, page: &PageReq) -> StoreResult<Page<Delivery>> {
        let (cond, args) = postgres_where(filter.conditions(Dialect::Postgres { first: 1 }));
        let sql = format!(
            "SELECT {DELIVERY_COLUMNS} FROM deliveries d JOIN messages m ON m.id = d.msg_id WHERE {cond}"
        );
        self.page_of(&sql, "d.id", args, page, delivery_from_row)
            .await
    }

    async fn list_attempts(
        &self,
        app: &AppId,
        filter: &AttemptFilter,
        page: &PageReq,
    ) -> StoreResult<Page<AttemptRecord>> {
        let (cond, args) = postgres_where(filter.conditions(app, Dialect::Postgres { first: 1 })?);
        let sql = format!("SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE {cond}");
        self.page_of(&sql, "id", args, page, attempt_from_row).await
    }

    async fn get_attempt(&self, app: &AppId, id: &AttemptId) -> StoreResult<Option<AttemptRecord>> {
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE id = $1 AND app_id = $2"
        )))
        .bind(id.as_str())
        .bind(app.as_str())
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(attempt_from_row).transpose()
    }

    async fn list_messages(
        &self,
        app: &AppId,
        filter: &MessageFilter,
        page: &PageReq,
    ) -> StoreResult<Page<Message>> {
        let (cond, args) = postgres_where(filter.conditions(app, Dialect::Postgres { first: 1 })?);
        let sql = format!("SELECT {MESSAGE_COLUMNS} FROM messages WHERE {cond}");
        self.page_of(&sql, "id", args, page, message_from_row).await
    }

    async fn list_endpoint_messages(
        &self,
        app: &AppId,
        ep: &EndpointId,
        filter: &EndpointMessageFilter,
        page: &PageReq,
    ) -> StoreResult<Page<(Delivery, Message)>> {
        let (cond, args) =
            postgres_where(filter.conditions(app, ep, Dialect::Postgres { first: 1 })?);
        let sql = endpoint_messages_sql(DELIVERY_COLUMNS, &cond);
        self.page_of(&sql, "d.msg_id", args, page, delivery_and_message_from_row)
            .await
    }
}

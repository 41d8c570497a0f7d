//! Reads of messages, deliveries and attempts on SQLite.

use super::*;

const DELIVERY_COLUMNS: &str =
    "d.id, d.msg_id, d.app_id, d.endpoint_id, m.event_type, d.state, d.attempts, \
     d.next_attempt_at, d.dead_reason, d.last_status, d.last_error, d.created_at, d.updated_at";

#[async_trait]
impl History for SqliteStore {
    async fn get_message(&self, app: &AppId, id_or_event_id: &str) -> StoreResult<Option<Message>> {
        let (app, key) = (app.as_str().to_owned(), id_or_event_id.to_owned());
        self.read(move |c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT * FROM messages WHERE app_id = ?1 AND (id = ?2 OR event_id = ?2) ORDER BY id = ?2 DESC LIMIT 1",
                )?;
            Ok(rows(&mut stmt, params![app, key], |r| message_from_row(r))?.pop())
        })
        .await
    }

    async fn get_delivery(&self, app: &AppId, id: &DeliveryId) -> StoreResult<Option<Delivery>> {
        let (app, id) = (app.as_str().to_owned(), id.as_str().to_owned());
        self.read(move |c| {
            let mut stmt = c.prepare_cached(&format!(
                "SELECT {DELIVERY_COLUMNS} FROM deliveries d JOIN messages m ON m.id = d.msg_id \
                     WHERE d.id = ?1 AND d.app_id = ?2"
            ))?;
            Ok(rows(&mut stmt, params![id, app], |r| delivery_from_row(r))?.pop())
        })
        .await
    }

    async fn list_deliveries_of_message(
        &self,
        app: &AppId,
        msg: &MsgId,
    ) -> StoreResult<Vec<Delivery>> {
        let (app, msg) = (app.as_str().to_owned(), msg.as_str().to_owned());
        self.read(move |c| {
            let mut stmt = c.prepare_cached(&format!(
                "SELECT {DELIVERY_COLUMNS} FROM deliveries d JOIN messages m ON m.id = d.msg_id \
                     WHERE d.msg_id = ?1 AND d.app_id = ?2 ORDER BY d.id"
            ))?;
            rows(&mut stmt, params![msg, app], |r| delivery_from_row(r))
        })
        .await
    }

    async fn list_dead(&self, filter: &DeadFilter, page: &PageReq) -> StoreResult<Page<Delivery>> {
        let (cond, args) = sqlite_where(filter.conditions(Dialect::Sqlite));
        let sql = format!(
            "SELECT {DELIVERY_COLUMNS} FROM deliveries d JOIN messages m ON m.id = d.msg_id WHERE {cond}"
        );
        let page = page.clone();
        self.read(move |c| page_of(c, &sql, "d.id", args, &page, |r| delivery_from_row(r)))
            .await
    }

    async fn list_attempts(
        &self,
        app: &AppId,
        filter: &AttemptFilter,
        page: &PageReq,
    ) -> StoreResult<Page<AttemptRecord>> {
        let (cond, args) = sqlite_where(filter.conditions(app, Dialect::Sqlite)?);
        let sql = format!("SELECT * FROM attempts WHERE {cond}");
        let page = page.clone();
        self.read(move |c| page_of(c, &sql, "id", args, &page, |r| attempt_from_row(r)))
            .await
    }

    async fn get_attempt(&self, app: &AppId, id: &AttemptId) -> StoreResult<Option<AttemptRecord>> {
        let (app, id) = (app.as_str().to_owned(), id.as_str().to_owned());
        self.read(move |c| {
            let mut stmt =
                c.prepare_cached("SELECT * FROM attempts WHERE id = ?1 AND app_id = ?2")?;
            Ok(rows(&mut stmt, params![id, app], |r| attempt_from_row(r))?.pop())
        })
        .await
    }

    async fn list_messages(
        &self,
        app: &AppId,
        filter: &MessageFilter,
        page: &PageReq,
    ) -> StoreResult<Page<Message>> {
        let (cond, args) = sqlite_where(filter.conditions(app, Dialect::Sqlite)?);
        let sql = format!("SELECT * FROM messages WHERE {cond}");
        let page = page.clone();
        self.read(move |c| page_of(c, &sql, "id", args, &page, |r| message_from_row(r)))
            .await
    }

    async fn list_endpoint_messages(
        &self,
        app: &AppId,
        ep: &EndpointId,
        filter: &EndpointMessageFilter,
        page: &PageReq,
    ) -> StoreResult<Page<(Delivery, Message)>> {
        let (cond, args) = sqlite_where(filter.conditions(app, ep, Dialect::Sqlite)?);
        let sql = endpoint_messages_sql(DELIVERY_COLUMNS, &cond);
        let page = page.clone();
        self.read(move |c| {
            page_of(c, &sql, "d.msg_id", args, &page, |r| {
                delivery_and_message_from_row(r)
            })
        })
        .await
    }
}

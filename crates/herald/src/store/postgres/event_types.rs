//! The event-type catalogue on PostgreSQL.

use super::*;

#[async_trait]
impl EventTypes for PostgresStore {
    async fn create_event_type(&self, et: &EventType) -> StoreResult<()> {
        let done = sqlx::query(
            "INSERT INTO event_types (name, description, archived, deprecated, schemas, feature_flag, \
             group_name, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
             ON CONFLICT DO NOTHING",
        )
        .bind(&et.name)
        .bind(&et.description)
        .bind(et.archived)
        .bind(et.deprecated)
        .bind(et.schemas.as_deref())
        .bind(et.feature_flag.as_deref())
        .bind(et.group_name.as_deref())
        .bind(et.created_at)
        .bind(et.updated_at)
        .execute(&self.pool)
        .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::Conflict(format!(
                "an event type named `{}` already exists",
                et.name
            )));
        }
        Ok(())
    }

    async fn get_event_type(&self, name: &str) -> StoreResult<Option<EventType>> {
        let row = sqlx::query("SELECT * FROM event_types WHERE name = $1")
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(event_type_from_row).transpose()
    }

    async fn list_event_types(
        &self,
        include_archived: bool,
        page: &PageReq,
    ) -> StoreResult<Page<EventType>> {
        let sql = if include_archived {
            "SELECT * FROM event_types WHERE TRUE"
        } else {
            "SELECT * FROM event_types WHERE NOT archived"
        };
        self.page_of(sql, "name", Vec::new(), page, event_type_from_row)
            .await
    }

    async fn update_event_type(&self, et: &EventType) -> StoreResult<bool> {
        let done = sqlx::query(
            "UPDATE event_types SET description = $1, archived = $2, deprecated = $3, schemas = $4, \
             feature_flag = $5, group_name = $6, updated_at = $7 WHERE name = $8",
        )
        .bind(&et.description)
        .bind(et.archived)
        .bind(et.deprecated)
        .bind(et.schemas.as_deref())
        .bind(et.feature_flag.as_deref())
        .bind(et.group_name.as_deref())
        .bind(et.updated_at)
        .bind(&et.name)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn delete_event_type(&self, name: &str) -> StoreResult<bool> {
        let done = sqlx::query("DELETE FROM event_types WHERE name = $1")
            .bind(name)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn unknown_event_types(&self, names: &[String]) -> StoreResult<Vec<String>> {
        sqlx::query_scalar(
            "SELECT n FROM UNNEST($1::text[]) AS u(n) \
             WHERE NOT EXISTS (SELECT 1 FROM event_types WHERE name = u.n)",
        )
        .bind(names)
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)
    }
}

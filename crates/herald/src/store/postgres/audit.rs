//! The audit log on PostgreSQL.

use super::*;

#[async_trait]
impl Audit for PostgresStore {
    async fn insert_audit(&self, entry: &AuditEntry) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO audit_log (id, at, actor_kind, actor_id, action, app_id, target, source, details) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(entry.id.as_str())
        .bind(entry.at)
        .bind(entry.actor_kind.as_str())
        .bind(&entry.actor_id)
        .bind(&entry.action)
        .bind(entry.app_id.as_ref().map(|a| a.as_str()))
        .bind(&entry.target)
        .bind(&entry.source)
        .bind(to_json(&entry.details)?)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn list_audit(
        &self,
        filter: &AuditFilter,
        page: &PageReq,
    ) -> StoreResult<Page<AuditEntry>> {
        let (cond, args) = postgres_where(filter.conditions(Dialect::Postgres { first: 1 }));
        let sql = format!("SELECT * FROM audit_log WHERE {cond}");
        self.page_of(&sql, "id", args, page, entry_from_row).await
    }
}

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
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn list_audit(
        &self,
        filter: &AuditFilter,
        page: &PageReq,
    ) -> StoreResult<Page<AuditEntry>> {
        let mut sql = String::from("SELECT * FROM audit_log WHERE TRUE");
        let mut args: Vec<String> = Vec::new();
        let mut add = |sql: &mut String, fragment: &str, value: String| {
            args.push(value);
            sql.push_str(&fragment.replace('#', &format!("${}", args.len())));
        };
        if let Some(v) = &filter.action {
            add(&mut sql, " AND action = #", v.clone());
        }
        if let Some(v) = &filter.app {
            add(&mut sql, " AND app_id = #", v.as_str().to_owned());
        }
        if let Some(v) = filter.actor_kind {
            add(&mut sql, " AND actor_kind = #", v.as_str().to_owned());
        }
        if let Some(v) = &filter.actor_id {
            add(&mut sql, " AND actor_id = #", v.clone());
        }
        if let Some(v) = &filter.target {
            add(&mut sql, " AND target = #", v.clone());
        }
        if let Some(before) = filter.before {
            add(&mut sql, " AND at < #::int8", before.to_string());
        }
        if let Some(after) = filter.after {
            add(&mut sql, " AND at > #::int8", after.to_string());
        }
        self.page_of(&sql, "id", args, page, entry_from_row).await
    }
}

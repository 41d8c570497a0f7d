//! The audit log on SQLite.

use super::*;

#[async_trait]
impl Audit for SqliteStore {
    async fn insert_audit(&self, entry: &AuditEntry) -> StoreResult<()> {
        let e = entry.clone();
        let details = to_json(&e.details)?;
        self.write(move |c| {
            c.prepare_cached(
                "INSERT INTO audit_log (id, at, actor_kind, actor_id, action, app_id, target, source, details) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            )?
            .execute(params![
                e.id.as_str(),
                e.at,
                e.actor_kind.as_str(),
                e.actor_id,
                e.action,
                e.app_id.as_ref().map(|a| a.as_str().to_owned()),
                e.target,
                e.source,
                details
            ])?;
            Ok(())
        })
        .await
    }

    async fn list_audit(
        &self,
        filter: &AuditFilter,
        page: &PageReq,
    ) -> StoreResult<Page<AuditEntry>> {
        let (cond, args) = sqlite_where(filter.conditions(Dialect::Sqlite));
        let sql = format!("SELECT * FROM audit_log WHERE {cond}");
        let page = page.clone();
        self.read(move |c| page_of(c, &sql, "id", args, &page, |r| entry_from_row(r)))
            .await
    }
}

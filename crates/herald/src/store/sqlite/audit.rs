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
            )
            .map_err(map_err)?
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
            ])
            .map_err(map_err)?;
            Ok(())
        })
        .await
    }

    async fn list_audit(
        &self,
        filter: &AuditFilter,
        page: &PageReq,
    ) -> StoreResult<Page<AuditEntry>> {
        let mut sql = String::from("SELECT * FROM audit_log WHERE 1 = 1");
        let mut args: Vec<Value> = Vec::new();
        let mut text = |sql: &mut String, column: &str, value: &Option<String>| {
            if let Some(v) = value {
                sql.push_str(&format!(" AND {column} = ?"));
                args.push(v.clone().into());
            }
        };
        text(&mut sql, "action", &filter.action);
        text(
            &mut sql,
            "app_id",
            &filter.app.as_ref().map(|a| a.as_str().to_owned()),
        );
        text(
            &mut sql,
            "actor_kind",
            &filter.actor_kind.map(|k| k.as_str().to_owned()),
        );
        text(&mut sql, "actor_id", &filter.actor_id);
        text(&mut sql, "target", &filter.target);
        if let Some(before) = filter.before {
            sql.push_str(" AND at < ?");
            args.push(before.into());
        }
        if let Some(after) = filter.after {
            sql.push_str(" AND at > ?");
            args.push(after.into());
        }
        let page = page.clone();
        self.read(move |c| page_of(c, &sql, "id", args, &page, |r| entry_from_row(r)))
            .await
    }
}

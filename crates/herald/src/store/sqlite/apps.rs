//! Applications on SQLite.

use super::*;

#[async_trait]
impl Apps for SqliteStore {
    async fn create_app(&self, app: &App) -> StoreResult<()> {
        let app = app.clone();
        let metadata = to_json(&app.metadata)?;
        self.write(move |c| {
            c.execute(
                "INSERT INTO applications (id, uid, name, rate_limit, metadata, created_at, updated_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![app.id.as_str(), app.uid, app.name, app.rate_limit, metadata, app.created_at, app.updated_at],
            )?;
            Ok(())
        })
        .await
    }

    async fn update_app(&self, app: &App) -> StoreResult<bool> {
        let app = app.clone();
        let metadata = to_json(&app.metadata)?;
        self.write(move |c| {
            let n = c
                .execute(
                    "UPDATE applications SET uid = ?1, name = ?2, rate_limit = ?3, metadata = ?4, updated_at = ?5 \
                     WHERE id = ?6",
                    params![app.uid, app.name, app.rate_limit, metadata, app.updated_at, app.id.as_str()],
                )?;
            Ok(n == 1)
        })
        .await
    }

    async fn delete_app(&self, id: &AppId) -> StoreResult<bool> {
        let id = id.as_str().to_owned();
        self.write(move |c| {
            // Attempts are history without a foreign key: they go first,
            // found through the messages (indexed); the rest cascades.
            c.execute(
                "DELETE FROM attempts WHERE msg_id IN (SELECT id FROM messages WHERE app_id = ?1)",
                params![id],
            )?;
            c.execute(
                "DELETE FROM endpoint_stats WHERE endpoint_id IN (SELECT id FROM endpoints WHERE app_id = ?1)",
                params![id],
            )?;
            let n = c
                .execute("DELETE FROM applications WHERE id = ?1", params![id])?;
            Ok(n == 1)
        })
        .await
    }

    async fn get_app(&self, id_or_uid: &str) -> StoreResult<Option<App>> {
        let key = id_or_uid.to_owned();
        self.read(move |c| {
            let mut stmt = c
                .prepare_cached("SELECT * FROM applications WHERE id = ?1 OR uid = ?1 ORDER BY id = ?1 DESC LIMIT 1")?;
            Ok(rows(&mut stmt, params![key], |r| app_from_row(r))?.pop())
        })
        .await
    }

    async fn list_apps(&self, page: &PageReq) -> StoreResult<Page<App>> {
        let page = page.clone();
        self.read(move |c| {
            page_of(
                c,
                "SELECT * FROM applications WHERE 1 = 1",
                "id",
                vec![],
                &page,
                |r| app_from_row(r),
            )
        })
        .await
    }
}

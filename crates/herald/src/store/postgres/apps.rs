//! Applications on PostgreSQL.

use super::*;

pub(super) const APP_COLUMNS: &str =
    "id, uid, name, rate_limit, metadata::text AS metadata, created_at, updated_at";

#[async_trait]
impl Apps for PostgresStore {
    async fn create_app(&self, app: &App) -> StoreResult<()> {
        let metadata = to_json(&app.metadata)?;
        sqlx::query(
            "INSERT INTO applications (id, uid, name, rate_limit, metadata, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7)",
        )
        .bind(app.id.as_str())
        .bind(app.uid.as_deref())
        .bind(&app.name)
        .bind(app.rate_limit.map(i32::from))
        .bind(metadata)
        .bind(app.created_at)
        .bind(app.updated_at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn update_app(&self, app: &App) -> StoreResult<bool> {
        let metadata = to_json(&app.metadata)?;
        let done = sqlx::query(
            "UPDATE applications SET uid = $1, name = $2, rate_limit = $3, metadata = $4::jsonb, updated_at = $5 \
             WHERE id = $6",
        )
        .bind(app.uid.as_deref())
        .bind(&app.name)
        .bind(app.rate_limit.map(i32::from))
        .bind(metadata)
        .bind(app.updated_at)
        .bind(app.id.as_str())
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn delete_app(&self, id: &AppId) -> StoreResult<bool> {
        // Locks in the order every other transaction takes them (see
        // docs/design/postgres.md, "Lock order"): the application, its endpoints
        // in id order, its messages, then (by cascade) the deliveries, and
        // last the attempts and stats buckets. Deleting the stats before the
        // endpoints, as this once did, closed a cycle with a completer that
        // held an endpoint and was adding to its bucket.
        let mut tx = self.pool.begin().await?;
        // The application's row lock makes a concurrent ingest (which takes
        // KEY SHARE on it) wait and then find it gone, and lets one that
        // committed before show its messages to the statements below.
        let found = sqlx::query("SELECT 1 FROM applications WHERE id = $1 FOR UPDATE")
            .bind(id.as_str())
            .fetch_optional(&mut *tx)
            .await?;
        if found.is_none() {
            tx.rollback().await?;
            return Ok(false);
        }
        // Waits for the completers holding them: their stats and attempts
        // are then written, and no new one can start on these endpoints.
        let endpoints: Vec<String> =
            sqlx::query_scalar("SELECT id FROM endpoints WHERE app_id = $1 ORDER BY id FOR UPDATE")
                .bind(id.as_str())
                .fetch_all(&mut *tx)
                .await?;
        // Before the deliveries go: retention locks a message, then its
        // deliveries.
        sqlx::query(
            "SELECT count(*) FROM (SELECT 1 FROM messages WHERE app_id = $1 FOR UPDATE) AS locked",
        )
        .bind(id.as_str())
        .execute(&mut *tx)
        .await?;
        // Endpoints, their deliveries and tokens cascade.
        sqlx::query("DELETE FROM applications WHERE id = $1")
            .bind(id.as_str())
            .execute(&mut *tx)
            .await?;
        // Attempts are history without a foreign key, found through the
        // messages (indexed), which carry none either (migration 0008).
        sqlx::query(
            "DELETE FROM attempts WHERE msg_id IN (SELECT id FROM messages WHERE app_id = $1)",
        )
        .bind(id.as_str())
        .execute(&mut *tx)
        .await?;
        sqlx::query("DELETE FROM endpoint_stats WHERE endpoint_id = ANY($1)")
            .bind(&endpoints)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM messages WHERE app_id = $1")
            .bind(id.as_str())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(true)
    }

    async fn get_app(&self, id_or_uid: &str) -> StoreResult<Option<App>> {
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT {APP_COLUMNS} FROM applications WHERE id = $1 OR uid = $1 \
             ORDER BY id = $1 DESC LIMIT 1"
        )))
        .bind(id_or_uid)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(app_from_row).transpose()
    }

    async fn list_apps(&self, page: &PageReq) -> StoreResult<Page<App>> {
        self.page_of(
            &format!("SELECT {APP_COLUMNS} FROM applications WHERE TRUE"),
            "id",
            vec![],
            page,
            app_from_row,
        )
        .await
    }
}

/// Svix's inline applications of `batch`, in `tx`: each uid's application
/// is created unless one has it by now (a concurrent creation of the same
/// uid waits for the other's commit, then finds its application), and
/// every message carrying one is returned pointing at whichever it is.
pub(super) async fn create_inline_apps(
    tx: &mut sqlx::PgConnection,
    batch: &[NewMessage],
) -> StoreResult<Vec<NewMessage>> {
    let mut seen: HashSet<&str> = HashSet::new();
    let apps: Vec<&App> = batch
        .iter()
        .filter_map(|m| m.application.as_ref())
        .filter(|a| a.uid.as_deref().is_some_and(|uid| seen.insert(uid)))
        .collect();
    let uids: Vec<&str> = apps.iter().filter_map(|a| a.uid.as_deref()).collect();
    sqlx::query(
        "INSERT INTO applications (id, uid, name, rate_limit, metadata, created_at, updated_at) \
         SELECT id, uid, name, rate_limit, metadata::jsonb, created_at, updated_at \
         FROM UNNEST($1::text[], $2::text[], $3::text[], $4::int4[], $5::text[], $6::int8[], $7::int8[]) \
              AS u(id, uid, name, rate_limit, metadata, created_at, updated_at) \
         ORDER BY uid \
         ON CONFLICT DO NOTHING",
    )
    .bind(apps.iter().map(|a| a.id.as_str()).collect::<Vec<_>>())
    .bind(&uids)
    .bind(apps.iter().map(|a| a.name.as_str()).collect::<Vec<_>>())
    .bind(
        apps.iter()
            .map(|a| a.rate_limit.map(i32::from))
            .collect::<Vec<_>>(),
    )
    .bind(
        apps.iter()
            .map(|a| to_json(&a.metadata))
            .collect::<StoreResult<Vec<_>>>()?,
    )
    .bind(apps.iter().map(|a| a.created_at).collect::<Vec<_>>())
    .bind(apps.iter().map(|a| a.updated_at).collect::<Vec<_>>())
    .execute(&mut *tx)
    .await?;
    let rows = sqlx::query("SELECT id, uid FROM applications WHERE uid = ANY($1)")
        .bind(&uids)
        .fetch_all(&mut *tx)
        .await?;
    let mut id_of: HashMap<String, String> = HashMap::new();
    for r in &rows {
        id_of.insert(get(r, "uid")?, get(r, "id")?);
    }
    Ok(batch
        .iter()
        .map(|m| {
            let mut m = m.clone();
            if let Some(app) = m.application.take() {
                if let Some(id) = app.uid.as_deref().and_then(|uid| id_of.get(uid)) {
                    m.app_id = AppId::from_trusted(id.clone());
                }
            }
            m
        })
        .collect())
}

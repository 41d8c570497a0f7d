//! Named settings and the liveness probe, on PostgreSQL.

use super::*;

#[async_trait]
impl Settings for PostgresStore {
    async fn get_setting(&self, key: &str) -> StoreResult<Option<String>> {
        sqlx::query_scalar("SELECT value FROM settings WHERE key = $1")
            .bind(key)
            .fetch_optional(&self.pool)
            .await
            .map_err(map_err)
    }

    async fn init_setting(&self, key: &str, value: &str) -> StoreResult<String> {
        let inserted: Option<String> = sqlx::query_scalar(
            "INSERT INTO settings (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING RETURNING value",
        )
        .bind(key)
        .bind(value)
        .fetch_optional(&self.pool)
        .await?;
        if let Some(v) = inserted {
            return Ok(v);
        }
        // The conflicting row is committed (ON CONFLICT waits for it), and
        // this statement's fresh snapshot sees it.
        sqlx::query_scalar("SELECT value FROM settings WHERE key = $1")
            .bind(key)
            .fetch_one(&self.pool)
            .await
            .map_err(map_err)
    }

    async fn put_setting(&self, key: &str, value: &str) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO settings (key, value) VALUES ($1, $2) \
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        )
        .bind(key)
        .bind(value)
        .execute(&self.pool)
        .await
        .map(drop)
        .map_err(map_err)
    }

    async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }
}

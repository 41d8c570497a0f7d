//! Browser sessions on PostgreSQL.

use super::*;

#[async_trait]
impl Sessions for PostgresStore {
    async fn create_session(&self, sha256_hex: &str, s: &Session) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO sessions (sha256, kind, app_id, token_id, capabilities, session_id, \
             theme, csrf, flash, created_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        )
        .bind(sha256_hex)
        .bind(s.kind.as_str())
        .bind(s.app_id.as_ref().map(|a| a.as_str()))
        .bind(&s.token_id)
        .bind(&s.capabilities)
        .bind(&s.session_id)
        .bind(&s.theme)
        .bind(&s.csrf)
        .bind(&s.flash)
        .bind(s.created_at)
        .bind(s.expires_at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn find_session(&self, sha256_hex: &str, now: Millis) -> StoreResult<Option<Session>> {
        let row = sqlx::query(
            "SELECT sha256, kind, app_id, token_id, capabilities, session_id, theme, csrf, flash, \
             created_at, expires_at FROM sessions WHERE sha256 = $1 AND expires_at > $2",
        )
        .bind(sha256_hex)
        .bind(now)
        .fetch_optional(&self.pool)
        .await?;
        let found = row.as_ref().map(session_from_row).transpose()?;
        // A write only when there is a flash to take (rarely).
        if found.as_ref().is_some_and(|s| s.flash.is_some()) {
            sqlx::query("UPDATE sessions SET flash = NULL WHERE sha256 = $1")
                .bind(sha256_hex)
                .execute(&self.pool)
                .await?;
        }
        Ok(found)
    }

    async fn set_session_flash(&self, sha256_hex: &str, text: &str) -> StoreResult<()> {
        sqlx::query("UPDATE sessions SET flash = $2 WHERE sha256 = $1")
            .bind(sha256_hex)
            .bind(text)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn delete_session(&self, sha256_hex: &str) -> StoreResult<()> {
        sqlx::query("DELETE FROM sessions WHERE sha256 = $1")
            .bind(sha256_hex)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn prune_sessions(&self, now: Millis) -> StoreResult<u64> {
        let n = sqlx::query("DELETE FROM sessions WHERE expires_at <= $1")
            .bind(now)
            .execute(&self.pool)
            .await?
            .rows_affected();
        sqlx::query("DELETE FROM portal_codes WHERE expires_at <= $1")
            .bind(now)
            .execute(&self.pool)
            .await?;
        Ok(n)
    }
}

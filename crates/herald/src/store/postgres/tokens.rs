//! API tokens and Idempotency-Key records on PostgreSQL.

use super::*;

const TOKEN_COLUMNS: &str =
    "id, app_id, name, created_at, expires_at, capabilities, session_id, feature_flags";

async fn insert_token<'e, E: sqlx::PgExecutor<'e>>(
    executor: E,
    t: &ApiToken,
    sha: &str,
) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO api_tokens (id, app_id, sha256, name, created_at, expires_at, capabilities, \
         session_id, feature_flags) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(&t.id)
    .bind(t.app_id.as_str())
    .bind(sha)
    .bind(&t.name)
    .bind(t.created_at)
    .bind(t.expires_at)
    .bind(&t.capabilities)
    .bind(&t.session_id)
    .bind(&t.feature_flags)
    .execute(executor)
    .await?;
    Ok(())
}

#[async_trait]
impl Tokens for PostgresStore {
    async fn announce_token_change(&self) -> StoreResult<()> {
        sqlx::query("SELECT pg_notify($1, '')")
            .bind(&self.tokens_channel)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn listen_for_token_changes(
        &self,
        changed: std::sync::Arc<tokio::sync::Notify>,
    ) -> StoreResult<()> {
        let channel = self.tokens_channel.clone();
        super::queue::spawn_listener(self, &channel, "token changes", changed).await
    }

    async fn create_token(&self, token: &ApiToken, sha256_hex: &str) -> StoreResult<()> {
        insert_token(&self.pool, token, sha256_hex).await
    }

    async fn create_portal_token(
        &self,
        token: &ApiToken,
        sha256_hex: &str,
        code_sha256_hex: &str,
    ) -> StoreResult<()> {
        let mut tx = self.pool.begin().await?;
        insert_token(&mut *tx, token, sha256_hex).await?;
        sqlx::query("INSERT INTO portal_codes (sha256, token_id, expires_at) VALUES ($1, $2, $3)")
            .bind(code_sha256_hex)
            .bind(&token.id)
            .bind(token.expires_at.unwrap_or(i64::MAX))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn take_portal_code(
        &self,
        code_sha256_hex: &str,
        now: Millis,
    ) -> StoreResult<Option<ApiToken>> {
        // One statement: of two concurrent exchanges, one deletes the row.
        let row = sqlx::query(
            "WITH taken AS (DELETE FROM portal_codes WHERE sha256 = $1 RETURNING token_id, expires_at) \
             SELECT t.* FROM api_tokens t JOIN taken ON taken.token_id = t.id \
             WHERE taken.expires_at > $2",
        )
        .bind(code_sha256_hex)
        .bind(now)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row
            .as_ref()
            .map(token_from_row)
            .transpose()?
            .filter(|t| t.live_at(now)))
    }

    async fn expire_tokens(
        &self,
        app: &AppId,
        at: Millis,
        session_ids: Option<&[String]>,
    ) -> StoreResult<u64> {
        let mut tx = self.pool.begin().await?;
        let chosen = "SELECT id FROM api_tokens WHERE app_id = $1 \
             AND ($2::text[] IS NULL OR session_id = ANY($2))";
        let n = sqlx::query(AssertSqlSafe(format!(
            "UPDATE api_tokens SET expires_at = $3 WHERE id IN ({chosen}) \
             AND (expires_at IS NULL OR expires_at > $3)"
        )))
        .bind(app.as_str())
        .bind(session_ids)
        .bind(at)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        for table in ["sessions", "portal_codes"] {
            sqlx::query(AssertSqlSafe(format!(
                "UPDATE {table} SET expires_at = $3 WHERE token_id IN ({chosen}) \
                 AND expires_at > $3"
            )))
            .bind(app.as_str())
            .bind(session_ids)
            .bind(at)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(n)
    }

    async fn end_token(&self, token_id: &str, now: Millis) -> StoreResult<()> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "UPDATE api_tokens SET expires_at = $2 WHERE id = $1 \
             AND (expires_at IS NULL OR expires_at > $2)",
        )
        .bind(token_id)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        for table in ["sessions", "portal_codes"] {
            sqlx::query(AssertSqlSafe(format!(
                "DELETE FROM {table} WHERE token_id = $1"
            )))
            .bind(token_id)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn find_token(&self, sha256_hex: &str) -> StoreResult<Option<ApiToken>> {
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT {TOKEN_COLUMNS} FROM api_tokens WHERE sha256 = $1"
        )))
        .bind(sha256_hex)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(token_from_row).transpose()
    }

    async fn list_tokens(&self, app: &AppId) -> StoreResult<Vec<ApiToken>> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT {TOKEN_COLUMNS} FROM api_tokens WHERE app_id = $1 ORDER BY id"
        )))
        .bind(app.as_str())
        .fetch_all(&self.pool)
        .await?;
        map_rows(&rows, token_from_row)
    }

    async fn delete_token(&self, app: &AppId, id: &str) -> StoreResult<bool> {
        let done = sqlx::query("DELETE FROM api_tokens WHERE id = $1 AND app_id = $2")
            .bind(id)
            .bind(app.as_str())
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn idempotency_begin(
        &self,
        scope: &str,
        idem: &IdemKey<'_>,
        request_hashes: &[String],
        now: Millis,
        valid_after: Millis,
        stale_before: Millis,
    ) -> StoreResult<IdemBegin> {
        let key = idem.key;
        let request_hash = request_hashes
            .first()
            .map(String::as_str)
            .unwrap_or_default();
        let mut tx = self.pool.begin().await?;
        // Concurrent first requests: one inserts, the other waits on its
        // row and then sees it (in progress, or done). The record kept
        // under the key alone (an earlier release's) is read in the same
        // statement, so a fresh key costs no extra round trip.
        let first = sqlx::query(
            "WITH ins AS (INSERT INTO idempotency (scope, key, request_hash, status, body, created_at) \
             VALUES ($1, $2, $3, 0, '', $4) ON CONFLICT DO NOTHING RETURNING 1) \
             SELECT (SELECT count(*) FROM ins) AS inserted, l.request_hash, l.status, l.body, l.created_at \
             FROM (SELECT 1) AS one LEFT JOIN idempotency l ON l.scope = $1 AND l.key = $5",
        )
        .bind(scope)
        .bind(key)
        .bind(request_hash)
        .bind(now)
        .bind(idem.unscoped)
        .fetch_one(&mut *tx)
        .await?;
        if get::<i64>(&first, "inserted")? == 1 {
            let earlier = match get::<Option<String>>(&first, "request_hash")? {
                Some(hash) => Some((
                    hash,
                    i64::from(get::<i32>(&first, "status")?),
                    get::<String>(&first, "body")?,
                    get::<i64>(&first, "created_at")?,
                )),
                None => None,
            };
            if let Some(earlier) =
                unscoped_verdict(earlier, request_hashes, valid_after, stale_before)
            {
                // Answered from the earlier record: nothing runs, so the
                // record just begun is not kept.
                tx.rollback().await?;
                return Ok(earlier);
            }
            tx.commit().await?;
            return Ok(IdemBegin::Fresh);
        }
        let row = sqlx::query(
            "SELECT request_hash, status, body, created_at FROM idempotency \
             WHERE scope = $1 AND key = $2 FOR UPDATE",
        )
        .bind(scope)
        .bind(key)
        .fetch_optional(&mut *tx)
        .await?;
        let found = match &row {
            Some(r) => Some((
                get::<String>(r, "request_hash")?,
                i64::from(get::<i32>(r, "status")?),
                get::<String>(r, "body")?,
                get::<i64>(r, "created_at")?,
            )),
            None => None,
        };
        let verdict = idem_verdict(found, request_hashes, valid_after, stale_before);
        if verdict == IdemBegin::Fresh {
            sqlx::query(
                "INSERT INTO idempotency (scope, key, request_hash, status, body, created_at) \
                 VALUES ($1, $2, $3, 0, '', $4) \
                 ON CONFLICT (scope, key) DO UPDATE SET request_hash = excluded.request_hash, \
                 status = 0, body = '', created_at = excluded.created_at",
            )
            .bind(scope)
            .bind(key)
            .bind(request_hash)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(verdict)
    }

    async fn idempotency_finish(
        &self,
        scope: &str,
        key: &str,
        status: u16,
        body: &str,
    ) -> StoreResult<()> {
        sqlx::query("UPDATE idempotency SET status = $1, body = $2 WHERE scope = $3 AND key = $4")
            .bind(i32::from(status))
            .bind(body)
            .bind(scope)
            .bind(key)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn idempotency_abort(&self, scope: &str, key: &str) -> StoreResult<()> {
        sqlx::query("DELETE FROM idempotency WHERE scope = $1 AND key = $2 AND status = 0")
            .bind(scope)
            .bind(key)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

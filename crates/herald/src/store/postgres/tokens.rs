//! API tokens and Idempotency-Key records on PostgreSQL.

use super::*;

fn token_from_row(r: &PgRow) -> StoreResult<ApiToken> {
    Ok(ApiToken {
        id: get(r, "id")?,
        app_id: AppId::from_trusted(get(r, "app_id")?),
        name: get(r, "name")?,
        created_at: get(r, "created_at")?,
    })
}

#[async_trait]
impl Tokens for PostgresStore {
    async fn create_token(&self, token: &ApiToken, sha256_hex: &str) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO api_tokens (id, app_id, sha256, name, created_at) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(&token.id)
        .bind(token.app_id.as_str())
        .bind(sha256_hex)
        .bind(&token.name)
        .bind(token.created_at)
        .execute(&self.pool)
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn find_token(&self, sha256_hex: &str) -> StoreResult<Option<ApiToken>> {
        let row =
            sqlx::query("SELECT id, app_id, name, created_at FROM api_tokens WHERE sha256 = $1")
                .bind(sha256_hex)
                .fetch_optional(&self.pool)
                .await
                .map_err(map_err)?;
        row.as_ref().map(token_from_row).transpose()
    }

    async fn list_tokens(&self, app: &AppId) -> StoreResult<Vec<ApiToken>> {
        let rows = sqlx::query(
            "SELECT id, app_id, name, created_at FROM api_tokens WHERE app_id = $1 ORDER BY id",
        )
        .bind(app.as_str())
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        map_rows(&rows, token_from_row)
    }

    async fn delete_token(&self, app: &AppId, id: &str) -> StoreResult<bool> {
        let done = sqlx::query("DELETE FROM api_tokens WHERE id = $1 AND app_id = $2")
            .bind(id)
            .bind(app.as_str())
            .execute(&self.pool)
            .await
            .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn idempotency_begin(
        &self,
        scope: &str,
        key: &str,
        request_hash: &str,
        now: Millis,
        valid_after: Millis,
        stale_before: Millis,
    ) -> StoreResult<IdemBegin> {
        let mut tx = self.pool.begin().await.map_err(map_err)?;
        // Concurrent first requests: one inserts, the other waits on its
        // row and then sees it (in progress, or done).
        let inserted = sqlx::query(
            "INSERT INTO idempotency (scope, key, request_hash, status, body, created_at) \
             VALUES ($1, $2, $3, 0, '', $4) ON CONFLICT DO NOTHING",
        )
        .bind(scope)
        .bind(key)
        .bind(request_hash)
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?
        .rows_affected();
        if inserted == 1 {
            tx.commit().await.map_err(map_err)?;
            return Ok(IdemBegin::Fresh);
        }
        let row = sqlx::query(
            "SELECT request_hash, status, body, created_at FROM idempotency \
             WHERE scope = $1 AND key = $2 FOR UPDATE",
        )
        .bind(scope)
        .bind(key)
        .fetch_optional(&mut *tx)
        .await
        .map_err(map_err)?;
        let found = match &row {
            Some(r) => Some((
                get::<String>(r, "request_hash")?,
                i64::from(get::<i32>(r, "status")?),
                get::<String>(r, "body")?,
                get::<i64>(r, "created_at")?,
            )),
            None => None,
        };
        let verdict = idem_verdict(found, request_hash, valid_after, stale_before);
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
            .await
            .map_err(map_err)?;
        }
        tx.commit().await.map_err(map_err)?;
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
            .await
            .map_err(map_err)?;
        Ok(())
    }

    async fn idempotency_abort(&self, scope: &str, key: &str) -> StoreResult<()> {
        sqlx::query("DELETE FROM idempotency WHERE scope = $1 AND key = $2 AND status = 0")
            .bind(scope)
            .bind(key)
            .execute(&self.pool)
            .await
            .map_err(map_err)?;
        Ok(())
    }
}

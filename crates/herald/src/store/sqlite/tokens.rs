//! API tokens and Idempotency-Key records on SQLite.

use super::*;

fn token_from_row(r: &Row<'_>) -> StoreResult<ApiToken> {
    Ok(ApiToken {
        id: get(r, "id")?,
        app_id: AppId::from_trusted(get(r, "app_id")?),
        name: get(r, "name")?,
        created_at: get(r, "created_at")?,
    })
}

#[async_trait]
impl Tokens for SqliteStore {
    async fn create_token(&self, token: &ApiToken, sha256_hex: &str) -> StoreResult<()> {
        let (t, sha) = (token.clone(), sha256_hex.to_owned());
        self.write(move |c| {
            c.execute(
                "INSERT INTO api_tokens (id, app_id, sha256, name, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![t.id, t.app_id.as_str(), sha, t.name, t.created_at],
            )
            .map_err(map_err)?;
            Ok(())
        })
        .await
    }

    async fn find_token(&self, sha256_hex: &str) -> StoreResult<Option<ApiToken>> {
        let sha = sha256_hex.to_owned();
        self.read(move |c| {
            let mut stmt = c
                .prepare_cached("SELECT * FROM api_tokens WHERE sha256 = ?1")
                .map_err(map_err)?;
            Ok(rows(&mut stmt, params![sha], token_from_row)?.pop())
        })
        .await
    }

    async fn list_tokens(&self, app: &AppId) -> StoreResult<Vec<ApiToken>> {
        let app = app.as_str().to_owned();
        self.read(move |c| {
            let mut stmt = c
                .prepare_cached("SELECT * FROM api_tokens WHERE app_id = ?1 ORDER BY id")
                .map_err(map_err)?;
            rows(&mut stmt, params![app], token_from_row)
        })
        .await
    }

    async fn delete_token(&self, app: &AppId, id: &str) -> StoreResult<bool> {
        let (app, id) = (app.as_str().to_owned(), id.to_owned());
        self.write(move |c| {
            let n = c
                .execute(
                    "DELETE FROM api_tokens WHERE id = ?1 AND app_id = ?2",
                    params![id, app],
                )
                .map_err(map_err)?;
            Ok(n == 1)
        })
        .await
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
        let (scope, key, hash) = (scope.to_owned(), key.to_owned(), request_hash.to_owned());
        self.write(move |c| {
            let found: Option<(String, i64, String, i64)> = c
                .query_row(
                    "SELECT request_hash, status, body, created_at FROM idempotency WHERE scope = ?1 AND key = ?2",
                    params![scope, key],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
                )
                .optional()
                .map_err(map_err)?;
            let verdict = idem_verdict(found, &hash, valid_after, stale_before);
            if verdict == IdemBegin::Fresh {
                c.execute(
                    "INSERT INTO idempotency (scope, key, request_hash, status, body, created_at) \
                     VALUES (?1, ?2, ?3, 0, '', ?4) \
                     ON CONFLICT (scope, key) DO UPDATE SET request_hash = excluded.request_hash, \
                     status = 0, body = '', created_at = excluded.created_at",
                    params![scope, key, hash, now],
                )
                .map_err(map_err)?;
            }
            Ok(verdict)
        })
        .await
    }

    async fn idempotency_finish(
        &self,
        scope: &str,
        key: &str,
        status: u16,
        body: &str,
    ) -> StoreResult<()> {
        let (scope, key, body) = (scope.to_owned(), key.to_owned(), body.to_owned());
        self.write(move |c| {
            c.execute(
                "UPDATE idempotency SET status = ?1, body = ?2 WHERE scope = ?3 AND key = ?4",
                params![i64::from(status), body, scope, key],
            )
            .map_err(map_err)?;
            Ok(())
        })
        .await
    }

    async fn idempotency_abort(&self, scope: &str, key: &str) -> StoreResult<()> {
        let (scope, key) = (scope.to_owned(), key.to_owned());
        self.write(move |c| {
            c.execute(
                "DELETE FROM idempotency WHERE scope = ?1 AND key = ?2 AND status = 0",
                params![scope, key],
            )
            .map_err(map_err)?;
            Ok(())
        })
        .await
    }
}

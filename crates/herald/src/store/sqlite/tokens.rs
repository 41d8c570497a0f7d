//! API tokens and Idempotency-Key records on SQLite.

use super::*;

fn insert_token(c: &Connection, t: &ApiToken, sha: &str) -> StoreResult<()> {
    c.execute(
        "INSERT INTO api_tokens (id, app_id, sha256, name, created_at, expires_at, capabilities, \
         session_id, feature_flags) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        params![
            t.id,
            t.app_id.as_str(),
            sha,
            t.name,
            t.created_at,
            t.expires_at,
            t.capabilities,
            t.session_id,
            t.feature_flags
        ],
    )?;
    Ok(())
}

#[async_trait]
impl Tokens for SqliteStore {
    async fn create_token(&self, token: &ApiToken, sha256_hex: &str) -> StoreResult<()> {
        let (t, sha) = (token.clone(), sha256_hex.to_owned());
        self.write(move |c| insert_token(c, &t, &sha)).await
    }

    async fn create_portal_token(
        &self,
        token: &ApiToken,
        sha256_hex: &str,
        code_sha256_hex: &str,
    ) -> StoreResult<()> {
        let (t, sha, code) = (
            token.clone(),
            sha256_hex.to_owned(),
            code_sha256_hex.to_owned(),
        );
        self.write(move |c| {
            insert_token(c, &t, &sha)?;
            c.execute(
                "INSERT INTO portal_codes (sha256, token_id, expires_at) VALUES (?1, ?2, ?3)",
                params![code, t.id, t.expires_at.unwrap_or(i64::MAX)],
            )?;
            Ok(())
        })
        .await
    }

    async fn take_portal_code(
        &self,
        code_sha256_hex: &str,
        now: Millis,
    ) -> StoreResult<Option<ApiToken>> {
        let code = code_sha256_hex.to_owned();
        self.write(move |c| {
            let taken: Option<(String, i64)> = c
                .query_row(
                    "DELETE FROM portal_codes WHERE sha256 = ?1 RETURNING token_id, expires_at",
                    params![code],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            let Some((token_id, expires_at)) = taken else {
                return Ok(None);
            };
            if expires_at <= now {
                return Ok(None);
            }
            let mut stmt = c.prepare_cached("SELECT * FROM api_tokens WHERE id = ?1")?;
            Ok(rows(&mut stmt, params![token_id], |r| token_from_row(r))?
                .pop()
                .filter(|t| t.live_at(now)))
        })
        .await
    }

    async fn expire_tokens(
        &self,
        app: &AppId,
        at: Millis,
        session_ids: Option<&[String]>,
    ) -> StoreResult<u64> {
        let app = app.as_str().to_owned();
        let session_ids = session_ids.map(|s| serde_json::to_string(s).unwrap_or_default());
        self.write(move |c| {
            // The chosen tokens, then what was made from them.
            let chosen = "SELECT id FROM api_tokens WHERE app_id = ?1 \
                 AND (?2 IS NULL OR session_id IN (SELECT value FROM json_each(?2)))";
            let n = c.execute(
                &format!(
                    "UPDATE api_tokens SET expires_at = ?3 WHERE id IN ({chosen}) \
                         AND (expires_at IS NULL OR expires_at > ?3)"
                ),
                params![app, session_ids, at],
            )?;
            for table in ["sessions", "portal_codes"] {
                c.execute(
                    &format!(
                        "UPDATE {table} SET expires_at = ?3 WHERE token_id IN ({chosen}) \
                         AND expires_at > ?3"
                    ),
                    params![app, session_ids, at],
                )?;
            }
            Ok(n as u64)
        })
        .await
    }

    async fn end_token(&self, token_id: &str, now: Millis) -> StoreResult<()> {
        let id = token_id.to_owned();
        self.write(move |c| {
            c.execute(
                "UPDATE api_tokens SET expires_at = ?2 WHERE id = ?1 \
                 AND (expires_at IS NULL OR expires_at > ?2)",
                params![id, now],
            )?;
            c.execute("DELETE FROM sessions WHERE token_id = ?1", params![id])?;
            c.execute("DELETE FROM portal_codes WHERE token_id = ?1", params![id])?;
            Ok(())
        })
        .await
    }

    async fn find_token(&self, sha256_hex: &str) -> StoreResult<Option<ApiToken>> {
        let sha = sha256_hex.to_owned();
        self.read(move |c| {
            let mut stmt = c.prepare_cached("SELECT * FROM api_tokens WHERE sha256 = ?1")?;
            Ok(rows(&mut stmt, params![sha], |r| token_from_row(r))?.pop())
        })
        .await
    }

    async fn list_tokens(&self, app: &AppId) -> StoreResult<Vec<ApiToken>> {
        let app = app.as_str().to_owned();
        self.read(move |c| {
            let mut stmt =
                c.prepare_cached("SELECT * FROM api_tokens WHERE app_id = ?1 ORDER BY id")?;
            rows(&mut stmt, params![app], |r| token_from_row(r))
        })
        .await
    }

    async fn delete_token(&self, app: &AppId, id: &str) -> StoreResult<bool> {
        let (app, id) = (app.as_str().to_owned(), id.to_owned());
        self.write(move |c| {
            let n = c.execute(
                "DELETE FROM api_tokens WHERE id = ?1 AND app_id = ?2",
                params![id, app],
            )?;
            Ok(n == 1)
        })
        .await
    }

    async fn idempotency_begin(
        &self,
        scope: &str,
        key: &IdemKey<'_>,
        request_hashes: &[String],
        now: Millis,
        valid_after: Millis,
        stale_before: Millis,
    ) -> StoreResult<IdemBegin> {
        let (scope, hashes) = (scope.to_owned(), request_hashes.to_vec());
        let (key, unscoped) = (key.key.to_owned(), key.unscoped.map(str::to_owned));
        let hash = hashes.first().cloned().unwrap_or_default();
        self.write(move |c| {
            let kept = |key: &str| -> StoreResult<Option<(String, i64, String, i64)>> {
                Ok(c.query_row(
                    "SELECT request_hash, status, body, created_at FROM idempotency WHERE scope = ?1 AND key = ?2",
                    params![scope, key],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
                )
                .optional()?)
            };
            let verdict = idem_verdict(kept(&key)?, &hashes, valid_after, stale_before);
            if verdict == IdemBegin::Fresh {
                if let Some(unscoped) = &unscoped {
                    let earlier = unscoped_verdict(kept(unscoped)?, &hashes, valid_after, stale_before);
                    if let Some(earlier) = earlier {
                        return Ok(earlier);
                    }
                }
                c.execute(
                    "INSERT INTO idempotency (scope, key, request_hash, status, body, created_at) \
                     VALUES (?1, ?2, ?3, 0, '', ?4) \
                     ON CONFLICT (scope, key) DO UPDATE SET request_hash = excluded.request_hash, \
                     status = 0, body = '', created_at = excluded.created_at",
                    params![scope, key, hash, now],
                )?;
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
            )?;
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
            )?;
            Ok(())
        })
        .await
    }
}

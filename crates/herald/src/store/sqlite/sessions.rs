//! Browser sessions on SQLite.

use super::*;

#[async_trait]
impl Sessions for SqliteStore {
    async fn create_session(&self, sha256_hex: &str, session: &Session) -> StoreResult<()> {
        let (sha, s) = (sha256_hex.to_owned(), session.clone());
        self.write(move |c| {
            c.execute(
                "INSERT INTO sessions (sha256, kind, app_id, token_id, capabilities, session_id, \
                 theme, csrf, flash, created_at, expires_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                params![
                    sha,
                    s.kind.as_str(),
                    s.app_id.as_ref().map(|a| a.as_str().to_owned()),
                    s.token_id,
                    s.capabilities,
                    s.session_id,
                    s.theme,
                    s.csrf,
                    s.flash,
                    s.created_at,
                    s.expires_at
                ],
            )?;
            Ok(())
        })
        .await
    }

    async fn find_session(&self, sha256_hex: &str, now: Millis) -> StoreResult<Option<Session>> {
        let sha = sha256_hex.to_owned();
        let found = self
            .read({
                let sha = sha.clone();
                move |c| {
                    let mut stmt = c.prepare_cached(
                        "SELECT * FROM sessions WHERE sha256 = ?1 AND expires_at > ?2",
                    )?;
                    Ok(rows(&mut stmt, params![sha, now], |r| session_from_row(r))?.pop())
                }
            })
            .await?;
        // A write only when there is a flash to take (rarely).
        if found.as_ref().is_some_and(|s| s.flash.is_some()) {
            self.write(move |c| {
                c.execute(
                    "UPDATE sessions SET flash = NULL WHERE sha256 = ?1",
                    params![sha],
                )?;
                Ok(())
            })
            .await?;
        }
        Ok(found)
    }

    async fn set_session_flash(&self, sha256_hex: &str, text: &str) -> StoreResult<()> {
        let (sha, text) = (sha256_hex.to_owned(), text.to_owned());
        self.write(move |c| {
            c.execute(
                "UPDATE sessions SET flash = ?2 WHERE sha256 = ?1",
                params![sha, text],
            )?;
            Ok(())
        })
        .await
    }

    async fn delete_session(&self, sha256_hex: &str) -> StoreResult<()> {
        let sha = sha256_hex.to_owned();
        self.write(move |c| {
            c.execute("DELETE FROM sessions WHERE sha256 = ?1", params![sha])?;
            Ok(())
        })
        .await
    }

    async fn prune_sessions(&self, now: Millis) -> StoreResult<u64> {
        self.write(move |c| {
            let n = c.execute("DELETE FROM sessions WHERE expires_at <= ?1", params![now])?;
            c.execute(
                "DELETE FROM portal_codes WHERE expires_at <= ?1",
                params![now],
            )?;
            Ok(n as u64)
        })
        .await
    }
}

//! Secrets at rest on SQLite: the start-up sample of sealed values and
//! re-sealing in batches (see `store::secrets`).

use super::*;
use crate::store::secrets::{reseal_in_batches, secret_row_from_row};

#[async_trait]
impl Secrets for SqliteStore {
    async fn sealed_samples(&self) -> StoreResult<Vec<SealedSample>> {
        self.read(|c| {
            let mut out = Vec::new();
            for col in SecretColumn::ALL {
                let name = col.name();
                // One row per key prefix (`enc:v1:<id>:`); SQLite takes the
                // bare columns from the row of MIN(id).
                let mut stmt = c.prepare_cached(&format!(
                    "SELECT MIN(id) AS id, {name} AS v FROM endpoints \
                         WHERE substr({name}, 1, 4) = 'enc:' GROUP BY substr({name}, 1, {})",
                    crate::crypto::KEY_PREFIX_LEN
                ))?;
                out.extend(rows(&mut stmt, [], |r| {
                    Ok(SealedSample {
                        endpoint_id: get(r, "id")?,
                        column: col,
                        stored: get(r, "v")?,
                    })
                })?);
            }
            Ok(out)
        })
        .await
    }

    async fn reseal_secrets(&self, scope: ResealScope) -> StoreResult<u64> {
        let Some(keep) = scope.keep_prefix(&self.keys) else {
            return Ok(0);
        };
        let batch_after = |after: String| async {
            let k = keep.clone();
            self.read(move |c| {
                let mut stmt = c.prepare_cached(
                    "SELECT id, secret, old_secrets, headers, url FROM endpoints \
                     WHERE id > ?1 AND (substr(secret, 1, length(?2)) <> ?2 \
                       OR (old_secrets <> '[]' AND substr(old_secrets, 1, length(?2)) <> ?2) \
                       OR (headers <> '{}' AND substr(headers, 1, length(?2)) <> ?2) \
                       OR (substr(url, 1, 4) = 'enc:' AND substr(url, 1, length(?2)) <> ?2) \
                       OR (substr(url, 1, 4) <> 'enc:' AND instr(url, '@') > 0)) \
                     ORDER BY id LIMIT ?3",
                )?;
                rows(&mut stmt, params![after, k, RESEAL_BATCH as i64], |r| {
                    secret_row_from_row(r)
                })
            })
            .await
        };
        let write_unchanged = |writes: Vec<(SecretRow, SecretRow)>| async {
            // Securely: the values replaced (plain, or sealed with a key
            // being retired) are zeroed in the file, not left in its pages'
            // free space.
            self.write(move |c| {
                securely(c, || {
                    let mut stmt = c.prepare_cached(
                    "UPDATE endpoints SET secret = ?1, old_secrets = ?2, headers = ?3, url = ?8 \
                     WHERE id = ?4 AND secret = ?5 AND old_secrets = ?6 AND headers = ?7 \
                       AND url = ?9",
                )?;
                    let mut n = 0u64;
                    for (old, new) in &writes {
                        n += stmt.execute(params![
                            new.secret,
                            new.old_secrets,
                            new.headers,
                            old.id,
                            old.secret,
                            old.old_secrets,
                            old.headers,
                            new.url,
                            old.url
                        ])? as u64;
                    }
                    Ok(n)
                })
            })
            .await
        };
        let resealed = reseal_in_batches(&self.keys, &keep, batch_after, write_unchanged).await?;
        if resealed > 0 {
            // The write-ahead log's older frames may hold the replaced
            // values too: checkpointed into the file and emptied, on a
            // connection of its own (the writer's jobs run in transactions,
            // where a checkpoint cannot).
            let path = self.path.clone();
            let blocked = tokio::task::spawn_blocking(move || {
                let c = Connection::open(&path)?;
                c.busy_timeout(Duration::from_secs(1))?;
                // Its row: (blocked, frames in the log, frames moved).
                c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                    r.get::<_, i64>(0)
                })
            })
            .await
            .map_err(|e| StoreError::Internal(format!("the checkpoint task failed: {e}")))??;
            if blocked != 0 {
                // A reader's snapshot (a backup, a sqlite3 shell) holds the
                // log: later checkpoints overwrite it as the store writes.
                tracing::warn!(
                    "the SQLite write-ahead log could not be emptied now (a reader holds it): \
                     values just encrypted stay readable there until it is overwritten"
                );
            }
        }
        Ok(resealed)
    }
}

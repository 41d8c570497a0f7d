//! Secrets at rest on PostgreSQL: the start-up sample of sealed values and
//! re-sealing in batches (see `store::secrets`).

use super::*;
use crate::store::secrets::{reseal_in_batches, secret_row_from_row};

#[async_trait]
impl Secrets for PostgresStore {
    async fn sealed_samples(&self) -> StoreResult<Vec<SealedSample>> {
        let mut out = Vec::new();
        for col in SecretColumn::ALL {
            let name = col.name();
            // One row per key prefix (`enc:v1:<id>:`): the lowest id.
            let found = sqlx::query(AssertSqlSafe(format!(
                "SELECT DISTINCT ON (substr({name}, 1, {n})) id, {name} AS v FROM endpoints \
                 WHERE substr({name}, 1, 4) = 'enc:' ORDER BY substr({name}, 1, {n}), id",
                n = crate::crypto::KEY_PREFIX_LEN
            )))
            .fetch_all(&self.pool)
            .await?;
            for r in &found {
                out.push(SealedSample {
                    endpoint_id: get(r, "id")?,
                    column: col,
                    stored: get(r, "v")?,
                });
            }
        }
        Ok(out)
    }

    async fn reseal_secrets(&self, scope: ResealScope) -> StoreResult<u64> {
        let Some(keep) = scope.keep_prefix(&self.keys) else {
            return Ok(0);
        };
        let (keep, pool) = (keep.as_str(), &self.pool);
        let batch_after = move |after: String| async move {
            let found = sqlx::query(
                "SELECT id, secret, old_secrets, headers, url FROM endpoints \
                 WHERE id > $1 AND (substr(secret, 1, length($2)) <> $2 \
                   OR (old_secrets <> '[]' AND substr(old_secrets, 1, length($2)) <> $2) \
                   OR (headers <> '{}' AND substr(headers, 1, length($2)) <> $2) \
                   OR (substr(url, 1, 4) = 'enc:' AND substr(url, 1, length($2)) <> $2) \
                   OR (substr(url, 1, 4) <> 'enc:' AND strpos(url, '@') > 0)) \
                 ORDER BY id LIMIT $3",
            )
            .bind(&after)
            .bind(keep)
            .bind(i64_of(RESEAL_BATCH))
            .fetch_all(pool)
            .await?;
            map_rows(&found, secret_row_from_row)
        };
        let write_unchanged = move |writes: Vec<(SecretRow, SecretRow)>| async move {
            // One statement per batch, compare-and-set on what was read:
            // a rotate-secret or headers write in between wins.
            let mut cols: [Vec<&str>; 9] = Default::default();
            for (old, new) in &writes {
                for (i, v) in [
                    &new.secret,
                    &new.old_secrets,
                    &new.headers,
                    &old.id,
                    &old.secret,
                    &old.old_secrets,
                    &old.headers,
                    &new.url,
                    &old.url,
                ]
                .into_iter()
                .enumerate()
                {
                    cols[i].push(v.as_str());
                }
            }
            let done = sqlx::query(
                "UPDATE endpoints e SET secret = w.ns, old_secrets = w.no, headers = w.nh, url = w.nu \
                 FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], \
                             $8::text[], $9::text[]) \
                      AS w(ns, no, nh, id, os, oo, oh, nu, ou) \
                 WHERE e.id = w.id AND e.secret = w.os AND e.old_secrets = w.oo AND e.headers = w.oh \
                   AND e.url = w.ou",
            )
            .bind(&cols[0])
            .bind(&cols[1])
            .bind(&cols[2])
            .bind(&cols[3])
            .bind(&cols[4])
            .bind(&cols[5])
            .bind(&cols[6])
            .bind(&cols[7])
            .bind(&cols[8])
            .execute(pool)
            .await?
            .rows_affected();
            Ok(done)
        };
        reseal_in_batches(&self.keys, keep, batch_after, write_unchanged).await
    }
}

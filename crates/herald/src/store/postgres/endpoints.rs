//! Endpoints on PostgreSQL: their rows, secrets, headers and the enabled /
//! disabled lifecycle (enabling lets held deliveries back in).

use super::queue::unhold;
use super::*;

pub(super) const ENDPOINT_COLUMNS: &str =
    "id, app_id, uid, url, description, filter_types::text AS filter_types, disabled, rate_limit, \
     metadata::text AS metadata, secret, created_at, updated_at, channels, headers, ordering";

pub(super) const STATUS_COLUMNS: &str =
    "fail_streak, streak_started_at, last_success_at, last_error, last_error_at, disabled, \
     disabled_reason, disabled_at, disabled_by";

/// `columns` (a list as above) read through the table alias `alias`,
/// leaving out those named in `except` (`id` → `e.id`,
/// `metadata::text AS metadata` → `e.metadata::text AS metadata`).
pub(super) fn qualified(alias: &str, columns: &str, except: &[&str]) -> String {
    columns
        .split(',')
        .map(str::trim)
        .filter(|c| !except.contains(c))
        .map(|c| format!("{alias}.{c}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[async_trait]
impl Endpoints for PostgresStore {
    async fn create_endpoint(&self, ep: &Endpoint) -> StoreResult<()> {
        let filter = ep.filter_types.as_ref().map(to_json).transpose()?;
        let metadata = to_json(&ep.metadata)?;
        sqlx::query(
            "INSERT INTO endpoints (id, app_id, uid, url, description, filter_types, disabled, rate_limit, \
             metadata, secret, created_at, updated_at, channels, headers, ordering) \
             VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $8, $9::jsonb, $10, $11, $12, $13, $14, $15)",
        )
        .bind(ep.id.as_str())
        .bind(ep.app_id.as_str())
        .bind(ep.uid.as_deref())
        .bind(seal_column(&self.keys, ep.id.as_str(), SecretColumn::Url, &ep.url))
        .bind(&ep.description)
        .bind(filter)
        .bind(ep.disabled)
        .bind(ep.rate_limit.map(i32::from))
        .bind(metadata)
        .bind(seal_column(&self.keys, ep.id.as_str(), SecretColumn::Secret, &ep.secret))
        .bind(ep.created_at)
        .bind(ep.updated_at)
        .bind(ep.channels.as_ref().map(to_json).transpose()?)
        .bind(seal_column(
            &self.keys,
            ep.id.as_str(),
            SecretColumn::Headers,
            &to_json(&ep.headers)?,
        ))
        .bind(ep.ordering.as_str())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn get_endpoint(&self, app: &AppId, id_or_uid: &str) -> StoreResult<Option<Endpoint>> {
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT {ENDPOINT_COLUMNS} FROM endpoints WHERE app_id = $1 AND (id = $2 OR uid = $2) \
             ORDER BY id = $2 DESC LIMIT 1"
        )))
        .bind(app.as_str())
        .bind(id_or_uid)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref()
            .map(|r| endpoint_from_row(r, &self.keys))
            .transpose()
    }

    async fn list_endpoints(&self, app: &AppId, page: &PageReq) -> StoreResult<Page<Endpoint>> {
        self.page_of(
            &format!("SELECT {ENDPOINT_COLUMNS} FROM endpoints WHERE app_id = $1"),
            "id",
            vec![app.as_str().to_owned()],
            page,
            |r| endpoint_from_row(r, &self.keys),
        )
        .await
    }

    async fn update_endpoint(
        &self,
        app: &AppId,
        ep: &EndpointId,
        changes: &EndpointChanges,
        now: Millis,
    ) -> StoreResult<bool> {
        let EndpointChangesJson {
            filter_types: filter,
            metadata,
            channels,
        } = changes.json_columns()?;
        // Only the columns the caller set: a column it did not name may
        // have been changed since it read the endpoint. Nothing here makes
        // held work claimable (the flag is not among them): no wake-up.
        // Switched to FIFO: its waiting deliveries take their places in
        // the queue (by creation) in the same statement, after the
        // endpoint's row (the lock order). Only those due by now: one due
        // later (a scheduled message) would be the head and hold the rest
        // until it fell due; it takes its place when a claim meets it due.
        // Those in flight go first, before every pending one: they are out
        // already and hold the queue until their attempts are over (an
        // in-flight delivery of a FIFO endpoint is always its head). The
        // places new deliveries get at ingest follow those (`fifo_last`,
        // migration 0021).
        let updated: i64 = sqlx::query_scalar(
            "WITH e AS ( \
                 UPDATE endpoints SET uid = CASE WHEN $1 THEN $2 ELSE uid END, \
                 url = COALESCE($3, url), description = COALESCE($4, description), \
                 filter_types = CASE WHEN $5 THEN $6::jsonb ELSE filter_types END, \
                 rate_limit = CASE WHEN $7 THEN $8 ELSE rate_limit END, \
                 metadata = COALESCE($9::jsonb, metadata), \
                 channels = CASE WHEN $10 THEN $11 ELSE channels END, updated_at = $12, \
                 ordering = COALESCE($15, ordering), \
                 fifo_last = CASE WHEN $15 = 'fifo' THEN GREATEST(fifo_last, $12) ELSE fifo_last END \
                 WHERE id = $13 AND app_id = $14 RETURNING id), \
             q AS ( \
                 UPDATE deliveries d SET queued_at = CASE WHEN d.state = 1 \
                     THEN LEAST(COALESCE(d.queued_at, d.created_at), w.first - 1) \
                     ELSE d.created_at END \
                 FROM (SELECT MIN(COALESCE(x.queued_at, x.created_at)) AS first FROM deliveries x \
                       WHERE x.endpoint_id IN (SELECT id FROM e) AND x.state = 0 \
                         AND (x.queued_at IS NOT NULL OR x.next_attempt_at <= $12)) w \
                 WHERE $15 = 'fifo' AND d.endpoint_id IN (SELECT id FROM e) \
                   AND (d.state = 1 OR (d.state = 0 AND d.queued_at IS NULL \
                                        AND d.next_attempt_at <= $12))) \
             SELECT COUNT(*) FROM e",
        )
        .bind(changes.uid.is_some())
        .bind(changes.uid.as_ref().and_then(|u| u.as_deref()))
        .bind(
            changes
                .url
                .as_deref()
                .map(|u| seal_column(&self.keys, ep.as_str(), SecretColumn::Url, u)),
        )
        .bind(changes.description.as_deref())
        .bind(filter.is_some())
        .bind(filter.flatten())
        .bind(changes.rate_limit.is_some())
        .bind(changes.rate_limit.flatten().map(i32::from))
        .bind(metadata)
        .bind(channels.is_some())
        .bind(channels.flatten())
        .bind(now)
        .bind(ep.as_str())
        .bind(app.as_str())
        .bind(changes.ordering.map(EndpointOrdering::as_str))
        .fetch_one(&self.pool)
        .await?;
        Ok(updated == 1)
    }

    async fn set_endpoint_headers(
        &self,
        app: &AppId,
        ep: &EndpointId,
        headers: &BTreeMap<String, String>,
        now: Millis,
    ) -> StoreResult<bool> {
        let done = sqlx::query(
            "UPDATE endpoints SET headers = $1, updated_at = $2 WHERE id = $3 AND app_id = $4",
        )
        .bind(seal_column(
            &self.keys,
            ep.as_str(),
            SecretColumn::Headers,
            &to_json(headers)?,
        ))
        .bind(now)
        .bind(ep.as_str())
        .bind(app.as_str())
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn delete_endpoint(&self, app: &AppId, id: &EndpointId) -> StoreResult<bool> {
        // Deliveries go with it (ON DELETE CASCADE); attempts are history.
        let done = sqlx::query("DELETE FROM endpoints WHERE id = $1 AND app_id = $2")
            .bind(id.as_str())
            .bind(app.as_str())
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn count_endpoints(&self, app: &AppId) -> StoreResult<u64> {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM endpoints WHERE app_id = $1")
            .bind(app.as_str())
            .fetch_one(&self.pool)
            .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn rotate_secret(
        &self,
        app: &AppId,
        ep: &EndpointId,
        new_secret: &str,
        grace_until: Millis,
        now: Millis,
    ) -> StoreResult<bool> {
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(
            "SELECT secret, old_secrets FROM endpoints WHERE id = $1 AND app_id = $2 FOR NO KEY UPDATE",
        )
        .bind(ep.as_str())
        .bind(app.as_str())
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else { return Ok(false) };
        let (secret, old) = rotated_secret_columns(
            &self.keys,
            ep.as_str(),
            &get::<String>(&row, "secret")?,
            &get::<String>(&row, "old_secrets")?,
            new_secret,
            grace_until,
            now,
        )?;
        sqlx::query(
            "UPDATE endpoints SET secret = $1, old_secrets = $2, updated_at = $3 WHERE id = $4",
        )
        .bind(secret)
        .bind(old)
        .bind(now)
        .bind(ep.as_str())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    async fn endpoint_status(&self, ep: &EndpointId) -> StoreResult<Option<EndpointStatus>> {
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT {STATUS_COLUMNS} FROM endpoints WHERE id = $1"
        )))
        .bind(ep.as_str())
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(status_from_row).transpose()
    }

    async fn disable_endpoint(
        &self,
        ep: &EndpointId,
        reason: &str,
        auto: bool,
        streak_started_at: Option<Millis>,
        now: Millis,
    ) -> StoreResult<bool> {
        // Its pending deliveries are held from the same statement on, parked
        // or not: out of the claim index, and found by retention's age cap.
        // (Its `parked_endpoints` entry, if any, is left to the claims: one
        // with room forgets it, see `CLAIM_SQL`; deleting it here could
        // lose rows a concurrent claim is parking.) (Claims
        // hold those made pending later; one a claim is taking right now
        // is waited for, then seen delivering and left alone.)
        let n: i64 = sqlx::query_scalar(
            "WITH off AS ( \
                 UPDATE endpoints SET disabled = TRUE, disabled_reason = $1, disabled_by = $2, \
                 disabled_at = $3, updated_at = $3 \
                 WHERE id = $4 AND NOT disabled AND ($5::int8 IS NULL OR streak_started_at = $5) \
                 RETURNING id), \
             held AS ( \
                 UPDATE deliveries SET held = TRUE, parked = FALSE \
                 WHERE endpoint_id IN (SELECT id FROM off) AND state = 0 AND NOT held) \
             SELECT count(*) FROM off",
        )
        .bind(reason)
        .bind(disabled_by(auto))
        .bind(now)
        .bind(ep.as_str())
        .bind(streak_started_at)
        .fetch_one(&self.pool)
        .await?;
        Ok(n == 1)
    }

    async fn enable_endpoint(
        &self,
        app: &AppId,
        ep: &EndpointId,
        now: Millis,
        too_old_before: Millis,
    ) -> StoreResult<Option<EnableReport>> {
        let mut tx = self.pool.begin().await?;
        let was: Option<bool> = sqlx::query_scalar(
            "SELECT disabled FROM endpoints WHERE id = $1 AND app_id = $2 FOR NO KEY UPDATE",
        )
        .bind(ep.as_str())
        .bind(app.as_str())
        .fetch_optional(&mut *tx)
        .await?;
        let Some(was) = was else { return Ok(None) };
        if !was {
            // Nothing is held for an enabled endpoint: the age cap at
            // enable is for deliveries that waited while it was off.
            tx.rollback().await?;
            return Ok(Some(EnableReport::default()));
        }
        sqlx::query(
            "UPDATE endpoints SET disabled = FALSE, disabled_reason = NULL, disabled_by = NULL, \
             disabled_at = NULL, fail_streak = 0, streak_started_at = NULL, updated_at = $1 WHERE id = $2",
        )
        .bind(now)
        .bind(ep.as_str())
        .execute(&mut *tx)
        .await?;
        // Held past the age cap: dead now, and replayable like any other.
        let expired = sqlx::query(
            "UPDATE deliveries SET state = 3, dead_reason = 'too_old', held = FALSE, parked = FALSE, \
             next_attempt_at = $1, updated_at = $1 \
             WHERE endpoint_id = $2 AND state = 0 AND cycle_started_at < $3",
        )
        .bind(now)
        .bind(ep.as_str())
        .bind(too_old_before)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        // Its held deliveries are claimable again. (The row lock above
        // waited for any claim holding more of them: these statements
        // see what it held.)
        unhold(&mut tx, ep).await?;
        self.notify_in(&mut tx).await?;
        tx.commit().await?;
        Ok(Some(EnableReport {
            was_disabled: true,
            expired,
        }))
    }
}

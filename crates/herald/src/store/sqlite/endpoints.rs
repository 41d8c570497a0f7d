//! Endpoints on SQLite: their rows, secrets, headers and the enabled /
//! disabled lifecycle (enabling lets held deliveries back in).

use super::claim::{queue_waiting, unhold};
use super::*;

#[async_trait]
impl Endpoints for SqliteStore {
    async fn create_endpoint(&self, ep: &Endpoint) -> StoreResult<()> {
        let ep = ep.clone();
        let filter = ep.filter_types.as_ref().map(to_json).transpose()?;
        let metadata = to_json(&ep.metadata)?;
        let channels = ep.channels.as_ref().map(to_json).transpose()?;
        let headers = seal_column(
            &self.keys,
            ep.id.as_str(),
            SecretColumn::Headers,
            &to_json(&ep.headers)?,
        );
        let secret = seal_column(&self.keys, ep.id.as_str(), SecretColumn::Secret, &ep.secret);
        let url = seal_column(&self.keys, ep.id.as_str(), SecretColumn::Url, &ep.url);
        self.write(move |c| {
            c.execute(
                "INSERT INTO endpoints (id, app_id, uid, url, description, filter_types, disabled, rate_limit, \
                 metadata, secret, created_at, updated_at, channels, headers, ordering) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
                params![
                    ep.id.as_str(),
                    ep.app_id.as_str(),
                    ep.uid,
                    url,
                    ep.description,
                    filter,
                    i64::from(ep.disabled),
                    ep.rate_limit,
                    metadata,
                    secret,
                    ep.created_at,
                    ep.updated_at,
                    channels,
                    headers,
                    ep.ordering.as_str()
                ],
            )?;
            Ok(())
        })
        .await
    }

    async fn get_endpoint(&self, app: &AppId, id_or_uid: &str) -> StoreResult<Option<Endpoint>> {
        let (app, key) = (app.as_str().to_owned(), id_or_uid.to_owned());
        let keys = self.keys.clone();
        self.read(move |c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT * FROM endpoints WHERE app_id = ?1 AND (id = ?2 OR uid = ?2) ORDER BY id = ?2 DESC LIMIT 1",
                )?;
            Ok(rows(&mut stmt, params![app, key], |r| endpoint_from_row(r, &keys))?.pop())
        })
        .await
    }

    async fn list_endpoints(&self, app: &AppId, page: &PageReq) -> StoreResult<Page<Endpoint>> {
        let (app, page) = (app.as_str().to_owned(), page.clone());
        let keys = self.keys.clone();
        self.read(move |c| {
            page_of(
                c,
                "SELECT * FROM endpoints WHERE app_id = ?",
                "id",
                vec![app.into()],
                &page,
                |r| endpoint_from_row(r, &keys),
            )
        })
        .await
    }

    async fn update_endpoint(
        &self,
        app: &AppId,
        ep: &EndpointId,
        changes: &EndpointChanges,
        now: Millis,
    ) -> StoreResult<bool> {
        let (app, ep) = (app.as_str().to_owned(), ep.as_str().to_owned());
        let mut ch = changes.clone();
        ch.url = ch
            .url
            .map(|u| seal_column(&self.keys, &ep, SecretColumn::Url, &u));
        let EndpointChangesJson {
            filter_types: filter,
            metadata,
            channels,
        } = changes.json_columns()?;
        self.write(move |c| {
            // Only the columns the caller set: a column it did not name may
            // have been changed since it read the endpoint. A new rate moves
            // the throttle's next slot (`throttle_tat`, µs) as if the last
            // slot taken had been spaced at it: a raise applies from the
            // next claim; a lowered rate waits a second after the last
            // slot, so no second the receiver counts holds more than the
            // new rate + 1 (1,010,000: a second and THROTTLE_DRIFT_US, as
            // in `throttle_step_us`). The PostgreSQL twin is migration
            // 0024's trigger.
            let n = c
                .prepare_cached(
                    "UPDATE endpoints SET uid = CASE WHEN ?1 THEN ?2 ELSE uid END, \
                     url = COALESCE(?3, url), description = COALESCE(?4, description), \
                     filter_types = CASE WHEN ?5 THEN ?6 ELSE filter_types END, \
                     throttle_tat = CASE WHEN ?7 AND rate_limit > 0 AND COALESCE(?8, 0) > 0 \
                         AND ?8 <> rate_limit THEN throttle_tat \
                         - MAX((1000000 + rate_limit - 1) / rate_limit, (1010000 + rate_limit) / (rate_limit + 1)) \
                         + CASE WHEN ?8 > rate_limit \
                           THEN MAX((1000000 + ?8 - 1) / ?8, (1010000 + ?8) / (?8 + 1)) \
                           ELSE 1000000 END \
                         ELSE throttle_tat END, \
                     rate_limit = CASE WHEN ?7 THEN ?8 ELSE rate_limit END, \
                     metadata = COALESCE(?9, metadata), \
                     channels = CASE WHEN ?10 THEN ?11 ELSE channels END, updated_at = ?12, \
                     ordering = COALESCE(?15, ordering) \
                     WHERE id = ?13 AND app_id = ?14",
                )?
                .execute(params![
                    ch.uid.is_some(),
                    ch.uid.flatten(),
                    ch.url,
                    ch.description,
                    filter.is_some(),
                    filter.flatten(),
                    ch.rate_limit.is_some(),
                    ch.rate_limit.flatten(),
                    metadata,
                    channels.is_some(),
                    channels.flatten(),
                    now,
                    ep,
                    app,
                    ch.ordering.map(EndpointOrdering::as_str)
                ])?;
            if n == 1 && ch.ordering == Some(EndpointOrdering::Fifo) {
                queue_waiting(c, &ep, now)?;
            }
            Ok(n == 1)
        })
        .await
    }

    async fn set_endpoint_headers(
        &self,
        app: &AppId,
        ep: &EndpointId,
        headers: &BTreeMap<String, String>,
        now: Millis,
    ) -> StoreResult<bool> {
        let (app, ep) = (app.as_str().to_owned(), ep.as_str().to_owned());
        let headers = seal_column(&self.keys, &ep, SecretColumn::Headers, &to_json(headers)?);
        self.write(move |c| {
            let n = c.execute(
                "UPDATE endpoints SET headers = ?1, updated_at = ?2 WHERE id = ?3 AND app_id = ?4",
                params![headers, now, ep, app],
            )?;
            Ok(n == 1)
        })
        .await
    }

    async fn delete_endpoint(&self, app: &AppId, id: &EndpointId) -> StoreResult<bool> {
        let (app, id) = (app.as_str().to_owned(), id.as_str().to_owned());
        // Deliveries go with it (ON DELETE CASCADE); attempts are history.
        self.write(move |c| {
            let n = c.execute(
                "DELETE FROM endpoints WHERE id = ?1 AND app_id = ?2",
                params![id, app],
            )?;
            Ok(n == 1)
        })
        .await
    }

    async fn count_endpoints(&self, app: &AppId) -> StoreResult<u64> {
        let app = app.as_str().to_owned();
        self.read(move |c| {
            let n: i64 = c.query_row(
                "SELECT COUNT(*) FROM endpoints WHERE app_id = ?1",
                params![app],
                |r| r.get(0),
            )?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
        .await
    }

    async fn rotate_secret(
        &self,
        app: &AppId,
        ep: &EndpointId,
        new_secret: &str,
        grace_until: Millis,
        now: Millis,
    ) -> StoreResult<bool> {
        let (app, ep, new_secret) = (
            app.as_str().to_owned(),
            ep.as_str().to_owned(),
            new_secret.to_owned(),
        );
        let keys = self.keys.clone();
        self.write(move |c| {
            let current: Option<(String, String)> = c
                .query_row(
                    "SELECT secret, old_secrets FROM endpoints WHERE id = ?1 AND app_id = ?2",
                    params![ep, app],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            let Some((secret, old)) = current else {
                return Ok(false);
            };
            let (secret, old) =
                rotated_secret_columns(&keys, &ep, &secret, &old, &new_secret, grace_until, now)?;
            c.execute(
                "UPDATE endpoints SET secret = ?1, old_secrets = ?2, updated_at = ?3 WHERE id = ?4",
                params![secret, old, now, ep],
            )?;
            Ok(true)
        })
        .await
    }

    async fn endpoint_status(&self, ep: &EndpointId) -> StoreResult<Option<EndpointStatus>> {
        let ep = ep.as_str().to_owned();
        self.read(move |c| {
            let mut stmt = c.prepare_cached("SELECT * FROM endpoints WHERE id = ?1")?;
            Ok(rows(&mut stmt, params![ep], |r| status_from_row(r))?.pop())
        })
        .await
    }

    async fn disable_endpoint(
        &self,
        ep: &EndpointId,
        reason: &str,
        auto: bool,
        streak_started_at: Option<Millis>,
        now: Millis,
    ) -> StoreResult<bool> {
        let (ep, reason) = (ep.as_str().to_owned(), reason.to_owned());
        let by = disabled_by(auto);
        self.write(move |c| {
            let n = c.execute(
                "UPDATE endpoints SET disabled = 1, disabled_reason = ?1, disabled_by = ?2, \
                     disabled_at = ?3, updated_at = ?3 \
                     WHERE id = ?4 AND disabled = 0 AND (?5 IS NULL OR streak_started_at = ?5)",
                params![reason, by, now, ep, streak_started_at],
            )?;
            if n == 1 {
                // Its pending deliveries are held from now on, parked or
                // not: out of the claim index, and found by retention's age
                // cap. (Claims hold those made pending later.)
                c.execute(
                    "UPDATE deliveries SET parked = 2 WHERE endpoint_id = ?1 AND state = 0",
                    params![ep],
                )?;
                c.execute(
                    "DELETE FROM parked_endpoints WHERE endpoint_id = ?1",
                    params![ep],
                )?;
            }
            Ok(n == 1)
        })
        .await
    }

    async fn enable_endpoint(
        &self,
        app: &AppId,
        ep: &EndpointId,
        now: Millis,
        too_old_before: Millis,
    ) -> StoreResult<Option<EnableReport>> {
        let (app, ep) = (app.as_str().to_owned(), ep.as_str().to_owned());
        self.write(move |c| {
            let was: Option<i64> = c
                .query_row(
                    "SELECT disabled FROM endpoints WHERE id = ?1 AND app_id = ?2",
                    params![ep, app],
                    |r| r.get(0),
                )
                .optional()?;
            let Some(was) = was else { return Ok(None) };
            if was == 0 {
                // Nothing is held for an enabled endpoint: the age cap at
                // enable is for deliveries that waited while it was off.
                return Ok(Some(EnableReport::default()));
            }
            c.execute(
                "UPDATE endpoints SET disabled = 0, disabled_reason = NULL, disabled_by = NULL, \
                 disabled_at = NULL, fail_streak = 0, streak_started_at = NULL, updated_at = ?1 WHERE id = ?2",
                params![now, ep],
            )?;
            // Held past the age cap: dead now, and replayable like any other.
            let expired = c
                .execute(
                    "UPDATE deliveries SET state = 3, dead_reason = 'too_old', parked = 0, \
                     next_attempt_at = ?1, updated_at = ?1 \
                     WHERE endpoint_id = ?2 AND state = 0 AND cycle_started_at < ?3",
                    params![now, ep, too_old_before],
                )?;
            c.execute(
                "UPDATE deliveries SET parked = 0 WHERE endpoint_id = ?1 AND parked = 1",
                params![ep],
            )?;
            unhold(c, &ep)?;
            c.execute("DELETE FROM parked_endpoints WHERE endpoint_id = ?1", params![ep])?;
            Ok(Some(EnableReport {
                was_disabled: true,
                expired: u64::try_from(expired).unwrap_or(0),
            }))
        })
        .await
    }
}

//! Endpoint health figures and queue counts on SQLite.

use super::*;
use crate::store::DUE_COUNT_CAP;

#[async_trait]
impl Health for SqliteStore {
    async fn endpoint_delivery_counts(&self, ep: &EndpointId) -> StoreResult<DeliveryCounts> {
        let ep = ep.as_str().to_owned();
        self.read(move |c| {
            // The trigger-kept counts (migration 0016): ≤ 8 rows, however
            // many deliveries the endpoint has.
            let mut stmt = c.prepare_cached(
                "SELECT state, SUM(n) FROM delivery_counts WHERE endpoint_id = ?1 GROUP BY state",
            )?;
            let mut counts = DeliveryCounts::default();
            let mut rs = stmt.query(params![ep])?;
            while let Some(r) = rs.next()? {
                counts.set(r.get(0)?, r.get(1)?);
            }
            Ok(counts)
        })
        .await
    }

    async fn endpoint_stats(
        &self,
        ep: &EndpointId,
        since: Millis,
    ) -> StoreResult<Vec<StatsBucket>> {
        let ep = ep.as_str().to_owned();
        self.read(move |c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT * FROM endpoint_stats WHERE endpoint_id = ?1 AND bucket >= ?2 ORDER BY bucket",
                )?;
            rows(&mut stmt, params![ep, since], |r| stats_from_row(r))
        })
        .await
    }

    async fn endpoints_stats(
        &self,
        eps: &[EndpointId],
        since: Millis,
    ) -> StoreResult<HashMap<EndpointId, Vec<StatsBucket>>> {
        if eps.is_empty() {
            return Ok(HashMap::new());
        }
        let ids = to_json(&eps.iter().map(EndpointId::as_str).collect::<Vec<_>>())?;
        self.read(move |c| {
            // One seek of the (endpoint_id, bucket) key per endpoint.
            let mut stmt = c.prepare_cached(
                "SELECT * FROM endpoint_stats \
                     WHERE endpoint_id IN (SELECT value FROM json_each(?1)) AND bucket >= ?2 \
                     ORDER BY endpoint_id, bucket",
            )?;
            let found = rows(&mut stmt, params![ids, since], |r| {
                Ok((get::<String>(r, "endpoint_id")?, stats_from_row(r)?))
            })?;
            Ok(crate::store::buckets_by_endpoint(found))
        })
        .await
    }

    async fn list_endpoint_overview(
        &self,
        app: Option<&AppId>,
        offset: usize,
        limit: usize,
    ) -> StoreResult<Vec<EndpointOverview>> {
        let app = app.map(|a| a.as_str().to_owned());
        let (offset, limit) = (
            i64::try_from(offset).unwrap_or(i64::MAX),
            i64::try_from(limit).unwrap_or(i64::MAX),
        );
        let keys = self.keys.clone();
        self.read(move |c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT e.*, a.name AS app_name FROM endpoints e JOIN applications a ON a.id = e.app_id \
                     WHERE (?1 IS NULL OR e.app_id = ?1) \
                     ORDER BY e.fail_streak DESC, e.id LIMIT ?2 OFFSET ?3",
                )?;
            rows(&mut stmt, params![app, limit, offset], |r| {
                Ok(EndpointOverview {
                    endpoint: endpoint_from_row(r, &keys)?,
                    app_name: get(r, "app_name")?,
                    status: status_from_row(r)?,
                    circuit: super::circuits::circuit_of_named_row(r)?,
                })
            })
        })
        .await
    }

    async fn queue_stats(&self, now: Millis) -> StoreResult<QueueStats> {
        self.read(move |c| {
            let one = |sql: &str, args: &[&dyn rusqlite::ToSql]| -> StoreResult<Option<i64>> {
                c.prepare_cached(sql)?
                    .query_row(args, |r| r.get(0))
                    .map_err(map_err)
            };
            let u = |n: i64| u64::try_from(n).unwrap_or(0);
            let mut stats = QueueStats::default();
            // Totals from the trigger-kept counts: one row per (endpoint,
            // state, held), whatever the number of deliveries. A deleted
            // endpoint's rows go with it.
            let mut stmt = c
                .prepare_cached(
                    "SELECT state, held, SUM(n) FROM delivery_counts GROUP BY state, held",
                )?;
            let mut rs = stmt.query([])?;
            while let Some(r) = rs.next()? {
                let (state, held, n): (i64, i64, i64) = (
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                );
                match DeliveryState::from_i64(state) {
                    Some(DeliveryState::Pending) => {
                        stats.pending += u(n);
                        if held != 0 {
                            stats.held += u(n);
                        }
                    }
                    Some(DeliveryState::Delivering) => stats.delivering += u(n),
                    Some(DeliveryState::Dead) => stats.dead += u(n),
                    _ => {}
                }
            }
            // Due ones (time decides, so no counter can keep them) are
            // counted up to the cap: a bounded walk of the claim index and
            // of the parked rows. Those of an endpoint whose breaker is
            // open or half-open are held by it, as a disabled one's are by
            // its disabling: neither due nor the oldest due.
            let cap = i64::try_from(DUE_COUNT_CAP).unwrap_or(i64::MAX);
            let due_live = one(
                "SELECT COUNT(*) FROM (SELECT 1 FROM deliveries d INDEXED BY deliveries_due \
                 WHERE d.state < 2 AND d.parked = 0 AND d.state = 0 AND d.next_attempt_at <= ?1 \
                 AND NOT EXISTS (SELECT 1 FROM endpoints e WHERE e.id = d.endpoint_id \
                                 AND e.circuit_state <> 0) LIMIT ?2)",
                &[&now, &cap],
            )?
            .unwrap_or(0);
            let parked = one(
                "SELECT COUNT(*) FROM (SELECT 1 FROM deliveries d INDEXED BY deliveries_parked \
                 WHERE d.parked = 1 AND NOT EXISTS (SELECT 1 FROM endpoints e \
                   WHERE e.id = d.endpoint_id AND e.circuit_state <> 0) LIMIT ?1)",
                &[&cap],
            )?
            .unwrap_or(0);
            stats.due = u(due_live + parked).min(DUE_COUNT_CAP);
            // The oldest: the first entry of the claim index past the
            // (few) delivering rows, and per parked endpoint its first.
            let oldest_live = one(
                "SELECT MIN(d.next_attempt_at) FROM deliveries d INDEXED BY deliveries_due \
                 WHERE d.state < 2 AND d.parked = 0 AND d.state = 0 AND d.next_attempt_at <= ?1 \
                 AND NOT EXISTS (SELECT 1 FROM endpoints e WHERE e.id = d.endpoint_id \
                                 AND e.circuit_state <> 0)",
                &[&now],
            )?;
            let oldest_parked = one(
                "SELECT MIN((SELECT MIN(next_attempt_at) FROM deliveries INDEXED BY deliveries_parked \
                  WHERE parked = 1 AND endpoint_id = p.endpoint_id)) FROM parked_endpoints p \
                 WHERE NOT EXISTS (SELECT 1 FROM endpoints e WHERE e.id = p.endpoint_id \
                                   AND e.circuit_state <> 0)",
                &[],
            )?;
            stats.oldest_due_at = [oldest_live, oldest_parked].into_iter().flatten().min();
            stats.disabled_endpoints = u(one(
                "SELECT COUNT(*) FROM endpoints WHERE disabled = 1",
                &[],
            )?
            .unwrap_or(0));
            Ok(stats)
        })
        .await
    }
}

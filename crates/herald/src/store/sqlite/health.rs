//! Endpoint health figures and queue counts on SQLite.

use super::endpoints::{endpoint_from_row, status_from_row};
use super::*;

fn stats_from_row(r: &Row<'_>) -> StoreResult<StatsBucket> {
    let n = |col: &str| -> StoreResult<u64> { Ok(u64::try_from(get::<i64>(r, col)?).unwrap_or(0)) };
    let mut histogram = [0u64; crate::health::HISTOGRAM_LEN];
    for (i, h) in histogram.iter_mut().enumerate() {
        *h = n(&format!("h{i}"))?;
    }
    Ok(StatsBucket {
        bucket: get(r, "bucket")?,
        attempts: n("attempts")?,
        successes: n("successes")?,
        failures: n("failures")?,
        latency_sum_ms: n("latency_sum")?,
        histogram,
    })
}

#[async_trait]
impl Health for SqliteStore {
    async fn endpoint_delivery_counts(&self, ep: &EndpointId) -> StoreResult<DeliveryCounts> {
        let ep = ep.as_str().to_owned();
        self.read(move |c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT state, COUNT(*) FROM deliveries WHERE endpoint_id = ?1 GROUP BY state",
                )
                .map_err(map_err)?;
            let mut counts = DeliveryCounts::default();
            let mut rs = stmt.query(params![ep]).map_err(map_err)?;
            while let Some(r) = rs.next().map_err(map_err)? {
                counts.set(r.get(0).map_err(map_err)?, r.get(1).map_err(map_err)?);
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
                )
                .map_err(map_err)?;
            rows(&mut stmt, params![ep, since], stats_from_row)
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
                )
                .map_err(map_err)?;
            rows(&mut stmt, params![app, limit, offset], |r| {
                Ok(EndpointOverview {
                    endpoint: endpoint_from_row(r, &keys)?,
                    app_name: get(r, "app_name")?,
                    status: status_from_row(r)?,
                })
            })
        })
        .await
    }

    async fn queue_stats(&self, now: Millis) -> StoreResult<QueueStats> {
        self.read(move |c| {
            let count = |sql: &str, args: &[&dyn rusqlite::ToSql]| -> StoreResult<(i64, Option<i64>)> {
                c.prepare_cached(sql)
                    .map_err(map_err)?
                    .query_row(args, |r| Ok((r.get(0)?, r.get(1)?)))
                    .map_err(map_err)
            };
            let u = |n: i64| u64::try_from(n).unwrap_or(0);
            // Each count walks a partial index, never the history.
            let (pending_live, _) = count(
                "SELECT COUNT(*), NULL FROM deliveries INDEXED BY deliveries_due \
                 WHERE state < 2 AND parked = 0 AND state = 0",
                &[],
            )?;
            let (delivering, _) = count(
                "SELECT COUNT(*), NULL FROM deliveries INDEXED BY deliveries_due \
                 WHERE state < 2 AND parked = 0 AND state = 1",
                &[],
            )?;
            let (due_live, oldest_live) = count(
                "SELECT COUNT(*), MIN(next_attempt_at) FROM deliveries INDEXED BY deliveries_due \
                 WHERE state < 2 AND parked = 0 AND state = 0 AND next_attempt_at <= ?1",
                &[&now],
            )?;
            let (parked, oldest_parked) = count(
                "SELECT COUNT(*), MIN(next_attempt_at) FROM deliveries INDEXED BY deliveries_parked \
                 WHERE parked = 1",
                &[],
            )?;
            let (held, _) = count(
                "SELECT COUNT(*), NULL FROM deliveries INDEXED BY deliveries_held WHERE parked = 2",
                &[],
            )?;
            let (dead, _) = count(
                "SELECT COUNT(*), NULL FROM deliveries INDEXED BY deliveries_dead_all WHERE state = 3",
                &[],
            )?;
            let (disabled, _) = count(
                "SELECT COUNT(*), NULL FROM endpoints WHERE disabled = 1",
                &[],
            )?;
            let oldest_due_at = [oldest_live, oldest_parked]
                .into_iter()
                .flatten()
                .min();
            Ok(QueueStats {
                pending: u(pending_live + parked + held),
                delivering: u(delivering),
                dead: u(dead),
                due: u(due_live + parked),
                oldest_due_at,
                held: u(held),
                disabled_endpoints: u(disabled),
            })
        })
        .await
    }
}

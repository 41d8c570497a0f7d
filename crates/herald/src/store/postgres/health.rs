//! Endpoint health figures and queue counts on PostgreSQL.

use super::*;
use crate::store::DUE_COUNT_CAP;

/// The endpoint's and its health state's columns through the alias `e`
/// (`disabled` once: both lists hold it), written once in endpoints.rs.
static OVERVIEW_COLUMNS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    use super::endpoints::{qualified, ENDPOINT_COLUMNS, STATUS_COLUMNS};
    format!(
        "{}, {}",
        qualified("e", ENDPOINT_COLUMNS, &[]),
        qualified("e", STATUS_COLUMNS, &["disabled"])
    )
});

#[async_trait]
impl Health for PostgresStore {
    async fn fold_delivery_counts(&self) -> StoreResult<u64> {
        super::counts::fold(&self.pool).await
    }

    async fn endpoint_delivery_counts(&self, ep: &EndpointId) -> StoreResult<DeliveryCounts> {
        let rows = sqlx::query(
            // The trigger-kept counts (migrations 0017, 0022): ≤ 8 folded
            // rows and the deltas not yet folded.
            "SELECT state, sum(n)::int8 AS n FROM ( \
                 SELECT state, n FROM delivery_counts WHERE endpoint_id = $1 \
                 UNION ALL \
                 SELECT state, n FROM delivery_count_deltas WHERE endpoint_id = $1 \
             ) k GROUP BY state",
        )
        .bind(ep.as_str())
        .fetch_all(&self.pool)
        .await?;
        let mut counts = DeliveryCounts::default();
        for r in &rows {
            counts.set(i64::from(get::<i16>(r, "state")?), get::<i64>(r, "n")?);
        }
        Ok(counts)
    }

    async fn endpoint_stats(
        &self,
        ep: &EndpointId,
        since: Millis,
    ) -> StoreResult<Vec<StatsBucket>> {
        let rows = sqlx::query(
            "SELECT * FROM endpoint_stats WHERE endpoint_id = $1 AND bucket >= $2 ORDER BY bucket",
        )
        .bind(ep.as_str())
        .bind(since)
        .fetch_all(&self.pool)
        .await?;
        map_rows(&rows, stats_from_row)
    }

    async fn endpoints_stats(
        &self,
        eps: &[EndpointId],
        since: Millis,
    ) -> StoreResult<HashMap<EndpointId, Vec<StatsBucket>>> {
        if eps.is_empty() {
            return Ok(HashMap::new());
        }
        let ids: Vec<&str> = eps.iter().map(EndpointId::as_str).collect();
        // One seek of the (endpoint_id, bucket) key per endpoint.
        let rows = sqlx::query(
            "SELECT * FROM endpoint_stats WHERE endpoint_id = ANY($1) AND bucket >= $2 \
             ORDER BY endpoint_id, bucket",
        )
        .bind(&ids)
        .bind(since)
        .fetch_all(&self.pool)
        .await?;
        let found = rows
            .iter()
            .map(|r| Ok((get::<String>(r, "endpoint_id")?, stats_from_row(r)?)))
            .collect::<StoreResult<Vec<_>>>()?;
        Ok(crate::store::buckets_by_endpoint(found))
    }

    async fn list_endpoint_overview(
        &self,
        app: Option<&AppId>,
        offset: usize,
        limit: usize,
    ) -> StoreResult<Vec<EndpointOverview>> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT {}, {CIRCUIT_COLUMNS}, a.name AS app_name \
             FROM endpoints e JOIN applications a ON a.id = e.app_id \
             WHERE ($1::text IS NULL OR e.app_id = $1) \
             ORDER BY e.fail_streak DESC, e.id LIMIT $2 OFFSET $3",
            *OVERVIEW_COLUMNS
        )))
        .bind(app.map(|a| a.as_str()))
        .bind(i64_of(limit))
        .bind(i64_of(offset))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(EndpointOverview {
                    endpoint: endpoint_from_row(r, &self.keys)?,
                    app_name: get(r, "app_name")?,
                    status: status_from_row(r)?,
                    circuit: circuit_of_pg_row(r)?,
                })
            })
            .collect()
    }

    async fn queue_stats(&self, now: Millis) -> StoreResult<QueueStats> {
        // Totals from the trigger-kept counts (folded rows per endpoint,
        // state and held, plus the deltas not yet folded; a row whose
        // endpoint was deleted meanwhile is joined away); due ones counted up to the cap by a bounded walk of the
        // claim index and of the parked rows (as on SQLite); the oldest due
        // is the claim index's first entry past the few delivering rows, or
        // a parked endpoint's oldest. (Held deliveries are pending, counted apart
        // from due ones: they wait for their endpoint's enabling; those of an
        // endpoint whose breaker is open or half-open are held by it, and
        // neither due nor the oldest due.)
        let cap = i64::try_from(DUE_COUNT_CAP).unwrap_or(i64::MAX);
        let totals = sqlx::query(
            "SELECT c.state, c.held, sum(c.n)::int8 AS n FROM ( \
                 SELECT endpoint_id, state, held, n FROM delivery_counts \
                 UNION ALL \
                 SELECT endpoint_id, state, held, n FROM delivery_count_deltas \
             ) c JOIN endpoints e ON e.id = c.endpoint_id GROUP BY c.state, c.held",
        )
        .fetch_all(&self.pool)
        .await?;
        let u = |n: i64| u64::try_from(n).unwrap_or(0);
        let mut stats = QueueStats::default();
        for r in &totals {
            let state: i16 = get(r, "state")?;
            let held: bool = get(r, "held")?;
            let n = u(get::<Option<i64>>(r, "n")?.unwrap_or(0));
            match DeliveryState::from_i64(i64::from(state)) {
                Some(DeliveryState::Pending) => {
                    stats.pending += n;
                    if held {
                        stats.held += n;
                    }
                }
                Some(DeliveryState::Delivering) => stats.delivering += n,
                Some(DeliveryState::Dead) => stats.dead += n,
                _ => {}
            }
        }
        let row = sqlx::query(
            "SELECT \
               (SELECT count(*) FROM (SELECT 1 FROM deliveries d \
                 WHERE d.state < 2 AND NOT d.held AND NOT d.parked AND d.state = 0 \
                 AND d.next_attempt_at <= $1 AND NOT EXISTS (SELECT 1 FROM endpoints e \
                   WHERE e.id = d.endpoint_id AND e.circuit_state <> 0) \
                 LIMIT $2) due) AS due, \
               (SELECT count(*) FROM (SELECT 1 FROM deliveries d WHERE d.parked \
                 AND NOT EXISTS (SELECT 1 FROM endpoints e \
                   WHERE e.id = d.endpoint_id AND e.circuit_state <> 0) LIMIT $2) p) AS parked, \
               (SELECT min(d.next_attempt_at) FROM deliveries d \
                 WHERE d.state < 2 AND NOT d.held AND NOT d.parked AND d.state = 0 \
                 AND d.next_attempt_at <= $1 AND NOT EXISTS (SELECT 1 FROM endpoints e \
                   WHERE e.id = d.endpoint_id AND e.circuit_state <> 0)) AS oldest, \
               (SELECT min((SELECT min(d.next_attempt_at) FROM deliveries d \
                            WHERE d.parked AND d.endpoint_id = p.endpoint_id)) \
                  FROM parked_endpoints p WHERE NOT EXISTS (SELECT 1 FROM endpoints e \
                   WHERE e.id = p.endpoint_id AND e.circuit_state <> 0)) AS oldest_parked, \
               (SELECT count(*) FROM endpoints WHERE disabled) AS disabled",
        )
        .bind(now)
        .bind(cap)
        .fetch_one(&self.pool)
        .await?;
        // Parked rows (out of the claim index, see `claim`) are due too.
        stats.due = u(get::<i64>(&row, "due")? + get::<i64>(&row, "parked")?).min(DUE_COUNT_CAP);
        stats.oldest_due_at = [
            get::<Option<Millis>>(&row, "oldest")?,
            get::<Option<Millis>>(&row, "oldest_parked")?,
        ]
        .into_iter()
        .flatten()
        .min();
        stats.disabled_endpoints = u(get::<i64>(&row, "disabled")?);
        Ok(stats)
    }
}

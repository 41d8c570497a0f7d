//! The circuit breaker on PostgreSQL: the dispatchers' view, the probe's
//! compare-and-set and the age cap on what a breaker holds back. (The
//! completer's read and write of the breaker are in `queue.rs`, under the
//! endpoint row locks of the batch's transaction.)

use super::*;

/// The breaker from a row holding [`CIRCUIT_COLUMNS`] by name.
pub(super) fn circuit_of_pg_row(r: &PgRow) -> StoreResult<Circuit> {
    Ok(circuit_from_columns(
        i64::from(get::<i16>(r, "circuit_state")?),
        get(r, "circuit_since")?,
        get(r, "circuit_until")?,
        get(r, "circuit_cooldown_ms")?,
        get(r, "circuit_probe_by")?,
        [
            get(r, "circuit_window_at")?,
            i64::from(get::<i32>(r, "circuit_attempts")?),
            i64::from(get::<i32>(r, "circuit_failures")?),
            i64::from(get::<i32>(r, "circuit_prev_attempts")?),
            i64::from(get::<i32>(r, "circuit_prev_failures")?),
        ],
    ))
}

#[async_trait]
impl Circuits for PostgresStore {
    async fn broken_circuits(&self) -> StoreResult<Vec<EndpointCircuit>> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT id, app_id, {CIRCUIT_COLUMNS} FROM endpoints WHERE circuit_state <> 0"
        )))
        .fetch_all(&self.pool)
        .await?;
        map_rows(&rows, |r| {
            Ok(EndpointCircuit {
                endpoint_id: EndpointId::from_trusted(get(r, "id")?),
                app_id: AppId::from_trusted(get(r, "app_id")?),
                circuit: circuit_of_pg_row(r)?,
            })
        })
    }

    async fn circuit_of(&self, ep: &EndpointId) -> StoreResult<Option<Circuit>> {
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT {CIRCUIT_COLUMNS} FROM endpoints WHERE id = $1"
        )))
        .bind(ep.as_str())
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(circuit_of_pg_row).transpose()
    }

    async fn swap_circuit(
        &self,
        ep: &EndpointId,
        seen: &Circuit,
        next: &Circuit,
    ) -> StoreResult<bool> {
        // One statement: under READ COMMITTED a concurrent winner's commit
        // makes the row fail the re-checked condition, so one caller wins.
        let n = sqlx::query(
            "UPDATE endpoints SET circuit_state = $1, circuit_since = $2, circuit_until = $3, \
               circuit_cooldown_ms = $4, circuit_probe_by = $5 \
             WHERE id = $6 AND circuit_state = $7 AND circuit_since IS NOT DISTINCT FROM $8 \
               AND circuit_probe_by IS NOT DISTINCT FROM $9",
        )
        .bind(next.state.code())
        .bind(next.since)
        .bind(next.until)
        .bind(next.cooldown_ms)
        .bind(next.probe_by.as_deref())
        .bind(ep.as_str())
        .bind(seen.state.code())
        .bind(seen.since)
        .bind(seen.probe_by.as_deref())
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(n == 1)
    }

    async fn expire_circuit_held(
        &self,
        too_old_before: Millis,
        now: Millis,
        batch: usize,
    ) -> StoreResult<u64> {
        // Per broken endpoint (few: `endpoints_circuit_broken`), its
        // deliveries through `deliveries_by_endpoint`, parked or not (an
        // open breaker's rows are parked by the claims); SKIP LOCKED leaves
        // one being claimed or resent right now to that. (Not held ones:
        // the age cap's `held = FALSE` leaves these as they were.)
        self.expire_too_old(
            "SELECT h.id FROM endpoints e \
             CROSS JOIN LATERAL ( \
                 SELECT d.id FROM deliveries d \
                 WHERE d.endpoint_id = e.id AND d.state = 0 AND NOT d.held \
                   AND d.cycle_started_at < $1 \
                 LIMIT $2 FOR UPDATE OF d SKIP LOCKED) h \
             WHERE e.circuit_state <> 0 LIMIT $2",
            too_old_before,
            now,
            batch,
        )
        .await
    }
}

//! The circuit breaker on SQLite: the dispatchers' view, the probe's
//! compare-and-set and the age cap on what a breaker holds back. (The
//! completer's read and write of the breaker are in `queue.rs`, in the
//! transaction that records the batch.)

use super::*;

/// The breaker from a row of [`CIRCUIT_COLUMNS`] (from its first column).
pub(super) fn circuit_of_row(r: &Row<'_>) -> rusqlite::Result<Circuit> {
    Ok(circuit_from_columns(
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        [r.get(5)?, r.get(6)?, r.get(7)?, r.get(8)?, r.get(9)?],
    ))
}

/// The breaker from a row holding [`CIRCUIT_COLUMNS`] by name.
pub(super) fn circuit_of_named_row(r: &Row<'_>) -> StoreResult<Circuit> {
    Ok(circuit_from_columns(
        get(r, "circuit_state")?,
        get(r, "circuit_since")?,
        get(r, "circuit_until")?,
        get(r, "circuit_cooldown_ms")?,
        get(r, "circuit_probe_by")?,
        [
            get(r, "circuit_window_at")?,
            get(r, "circuit_attempts")?,
            get(r, "circuit_failures")?,
            get(r, "circuit_prev_attempts")?,
            get(r, "circuit_prev_failures")?,
        ],
    ))
}

#[async_trait]
impl Circuits for SqliteStore {
    async fn broken_circuits(&self) -> StoreResult<Vec<EndpointCircuit>> {
        self.read(|c| {
            let mut stmt = c
                .prepare_cached(&format!(
                    "SELECT {CIRCUIT_COLUMNS}, id, app_id FROM endpoints INDEXED BY endpoints_circuit_broken \
                     WHERE circuit_state <> 0"
                ))?;
            let rows = stmt
                .query_map([], |r| {
                    Ok(EndpointCircuit {
                        circuit: circuit_of_row(r)?,
                        endpoint_id: EndpointId::from_trusted(r.get(10)?),
                        app_id: AppId::from_trusted(r.get(11)?),
                    })
                })?;
            rows.collect::<Result<Vec<_>, _>>().map_err(map_err)
        })
        .await
    }

    async fn circuit_of(&self, ep: &EndpointId) -> StoreResult<Option<Circuit>> {
        let ep = ep.as_str().to_owned();
        self.read(move |c| {
            c.prepare_cached(&format!(
                "SELECT {CIRCUIT_COLUMNS} FROM endpoints WHERE id = ?1"
            ))?
            .query_row(params![ep], circuit_of_row)
            .optional()
            .map_err(map_err)
        })
        .await
    }

    async fn swap_circuit(
        &self,
        ep: &EndpointId,
        seen: &Circuit,
        next: &Circuit,
    ) -> StoreResult<bool> {
        let (ep, seen, next) = (ep.as_str().to_owned(), seen.clone(), next.clone());
        self.write(move |c| {
            let n = c
                .prepare_cached(
                    "UPDATE endpoints SET circuit_state = ?1, circuit_since = ?2, circuit_until = ?3, \
                       circuit_cooldown_ms = ?4, circuit_probe_by = ?5 \
                     WHERE id = ?6 AND circuit_state = ?7 AND circuit_since IS ?8 \
                       AND circuit_probe_by IS ?9",
                )?
                .execute(params![
                    i64::from(next.state.code()),
                    next.since,
                    next.until,
                    next.cooldown_ms,
                    next.probe_by,
                    ep,
                    i64::from(seen.state.code()),
                    seen.since,
                    seen.probe_by,
                ])?;
            Ok(n == 1)
        })
        .await
    }

    async fn expire_circuit_held(
        &self,
        too_old_before: Millis,
        now: Millis,
        batch: usize,
    ) -> StoreResult<u64> {
        // Per broken endpoint (few, by their index), its deliveries by
        // `deliveries_by_endpoint`; pending ones, parked or not (a held one,
        // parked = 2, is `expire_held`'s).
        self.expire_too_old(
            "SELECT d.id FROM endpoints e INDEXED BY endpoints_circuit_broken \
             JOIN deliveries d INDEXED BY deliveries_by_endpoint ON d.endpoint_id = e.id \
             WHERE e.circuit_state <> 0 AND d.state = 0 AND d.parked < 2 \
               AND d.cycle_started_at < ?2 \
             LIMIT ?3",
            too_old_before,
            now,
            batch,
        )
        .await
    }
}

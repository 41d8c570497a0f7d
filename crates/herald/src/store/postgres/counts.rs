//! The kept delivery counts on PostgreSQL: folding their deltas.
//!
//! Migration 0022's statement triggers append each statement's net change
//! per (endpoint, state, held) to `delivery_count_deltas` instead of
//! upserting `delivery_counts` in the writer's transaction, so that no
//! writer (least of all a caller's open outbox transaction) holds a row a
//! claim or another writer needs. Readers add the deltas not yet folded
//! to the folded rows; [`fold`] moves committed deltas into the folded
//! rows in one statement, so a reader sees the same sums before and after.

use super::*;

/// Deltas one fold statement takes at most; [`fold`] repeats while a
/// batch came back full, up to [`MAX_BATCHES`].
const FOLD_BATCH: i64 = 10_000;
const MAX_BATCHES: usize = 20;

/// Takes up to [`FOLD_BATCH`] committed deltas (those another folder is
/// taking are skipped, not waited for; uncommitted ones are invisible),
/// adds their sums into `delivery_counts` in key order, and drops the
/// deltas of endpoints deleted meanwhile. Returns how many it took.
const FOLD_SQL: &str = "\
WITH taken AS ( \
    DELETE FROM delivery_count_deltas d \
     WHERE d.ctid = ANY (ARRAY( \
         SELECT ctid FROM delivery_count_deltas LIMIT $1 FOR UPDATE SKIP LOCKED)) \
    RETURNING d.endpoint_id, d.state, d.held, d.n \
), net AS ( \
    SELECT endpoint_id, state, held, sum(n)::int8 AS n FROM taken GROUP BY 1, 2, 3 \
), folded AS ( \
    INSERT INTO delivery_counts AS c (endpoint_id, state, held, n) \
    SELECT net.endpoint_id, net.state, net.held, net.n FROM net \
     WHERE net.n <> 0 AND EXISTS (SELECT 1 FROM endpoints e WHERE e.id = net.endpoint_id) \
     ORDER BY 1, 2, 3 \
    ON CONFLICT (endpoint_id, state, held) DO UPDATE SET n = c.n + EXCLUDED.n \
    RETURNING 1 \
) \
SELECT (SELECT count(*) FROM taken)::int8 AS taken, (SELECT count(*) FROM folded)::int8 AS folded";

/// Folds committed deltas until none is left or [`MAX_BATCHES`] ran.
pub(super) async fn fold(pool: &sqlx::PgPool) -> StoreResult<u64> {
    let mut total = 0u64;
    for _ in 0..MAX_BATCHES {
        let row = sqlx::query(FOLD_SQL)
            .bind(FOLD_BATCH)
            .fetch_one(pool)
            .await?;
        let taken: i64 = get(&row, "taken")?;
        total = total.saturating_add(u64::try_from(taken).unwrap_or(0));
        if taken < FOLD_BATCH {
            break;
        }
    }
    Ok(total)
}

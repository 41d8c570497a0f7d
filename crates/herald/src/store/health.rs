//! Endpoint health figures and queue counts for metrics and the dashboard.

use super::rows::{col, StoredRow};
use super::*;

/// Endpoint health figures and queue counts.
#[async_trait]
pub trait Health: Send + Sync {
    async fn endpoint_delivery_counts(&self, ep: &EndpointId) -> StoreResult<DeliveryCounts>;
    /// The endpoint's stats buckets starting at or after `since`.
    async fn endpoint_stats(&self, ep: &EndpointId, since: Millis)
        -> StoreResult<Vec<StatsBucket>>;
    /// [`Health::endpoint_stats`] of each of `eps`, in one read (a page of
    /// endpoints with their charts): an endpoint without buckets is absent.
    async fn endpoints_stats(
        &self,
        eps: &[EndpointId],
        since: Millis,
    ) -> StoreResult<HashMap<EndpointId, Vec<StatsBucket>>>;
    /// Every endpoint (of `app`, or of all apps), failing ones first (by
    /// streak), then by id; `offset` paging for the dashboard.
    async fn list_endpoint_overview(
        &self,
        app: Option<&AppId>,
        offset: usize,
        limit: usize,
    ) -> StoreResult<Vec<EndpointOverview>>;
    async fn queue_stats(&self, now: Millis) -> StoreResult<QueueStats>;
    /// Folds the kept counts' changes not yet added into their totals,
    /// where a store keeps them apart (PostgreSQL: `delivery_count_deltas`,
    /// see its `counts` module); how many changes it folded. Readers see
    /// the same counts before and after. SQLite folds in each writing
    /// transaction and has nothing to do here.
    async fn fold_delivery_counts(&self) -> StoreResult<u64> {
        Ok(0)
    }
}

/// Stats buckets read for several endpoints (each row with its
/// endpoint's id, in bucket order), grouped by endpoint.
pub fn buckets_by_endpoint(
    rows: impl IntoIterator<Item = (String, StatsBucket)>,
) -> HashMap<EndpointId, Vec<StatsBucket>> {
    let mut by_endpoint = HashMap::<EndpointId, Vec<StatsBucket>>::new();
    for (ep, bucket) in rows {
        by_endpoint
            .entry(EndpointId::from_trusted(ep))
            .or_default()
            .push(bucket);
    }
    by_endpoint
}

/// Attempt counts of one endpoint in one 5-minute bucket.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatsBucket {
    pub bucket: Millis,
    pub attempts: u64,
    pub successes: u64,
    pub failures: u64,
    pub latency_sum_ms: u64,
    pub histogram: [u64; herald_policy::stats::HISTOGRAM_LEN],
}

/// An endpoint's deliveries by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeliveryCounts {
    pub pending: u64,
    pub delivering: u64,
    pub delivered: u64,
    pub dead: u64,
}

impl DeliveryCounts {
    /// Sets the count of one stored state (as `i64`, as both stores keep
    /// it); an unknown state is ignored.
    pub fn set(&mut self, state: i64, n: i64) {
        let n = u64::try_from(n).unwrap_or(0);
        match DeliveryState::from_i64(state) {
            Some(DeliveryState::Pending) => self.pending = n,
            Some(DeliveryState::Delivering) => self.delivering = n,
            Some(DeliveryState::Delivered) => self.delivered = n,
            Some(DeliveryState::Dead) => self.dead = n,
            None => {}
        }
    }
}

/// Due deliveries are counted up to this many (a bounded walk of the claim
/// index: whether a delivery is due depends on the time, so no counter
/// keeps it); `QueueStats::due` equal to it means "at least this many".
pub const DUE_COUNT_CAP: u64 = 10_000;

/// Counts for metrics and the dashboard: totals from the counters the
/// stores keep as deliveries change state (`delivery_counts`), due ones by
/// a bounded walk of the claim index; none costs more with a longer
/// history or a deeper backlog.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueStats {
    pub pending: u64,
    pub delivering: u64,
    pub dead: u64,
    /// Pending deliveries due now that a claim may take: those of enabled
    /// endpoints (busy ones included). Held deliveries are not counted.
    /// Counted up to [`DUE_COUNT_CAP`] (which then means "at least").
    pub due: u64,
    /// The earliest `next_attempt_at` among the `due` ones.
    pub oldest_due_at: Option<Millis>,
    /// Pending deliveries held for disabled endpoints (due or not): they
    /// wait for the endpoint's enabling, not for a sending slot.
    pub held: u64,
    pub disabled_endpoints: u64,
}

/// An endpoint with its app and health state, for overviews.
#[derive(Debug, Clone)]
pub struct EndpointOverview {
    pub endpoint: Endpoint,
    pub app_name: String,
    pub status: EndpointStatus,
    /// Its circuit breaker, read in the same statement: a listed page's
    /// health needs no other read of the breakers (none store-wide, none
    /// outside the page's application).
    pub circuit: Circuit,
}

/// A stats bucket from its stored row (either backend).
pub(crate) fn stats_from_row(r: &impl StoredRow) -> StoreResult<StatsBucket> {
    let n = |column: &str| -> StoreResult<u64> {
        Ok(u64::try_from(col::<i64>(r, column)?).unwrap_or(0))
    };
    let mut histogram = [0u64; herald_policy::stats::HISTOGRAM_LEN];
    for (i, h) in histogram.iter_mut().enumerate() {
        *h = n(&format!("h{i}"))?;
    }
    Ok(StatsBucket {
        bucket: col(r, "bucket")?,
        attempts: n("attempts")?,
        successes: n("successes")?,
        failures: n("failures")?,
        latency_sum_ms: n("latency_sum")?,
        histogram,
    })
}

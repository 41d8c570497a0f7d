//! Endpoint health figures, computed from per-endpoint 5-minute buckets of
//! attempt counts and a latency histogram (kept by the store as outcomes are
//! recorded), never from the attempts themselves: a page view reads at most
//! 288 small rows per endpoint. Pure functions; the store reads, this adds.

use serde::Serialize;

use crate::store::{EndpointStatus, Millis, StatsBucket};

// The buckets' shape lives below the store, which keeps them.
pub use herald_policy::stats::{
    bucket_of, latency_slot, BUCKET_MS, HISTOGRAM_LEN, LATENCY_BOUNDS_MS,
};

const HOUR_MS: Millis = 3600 * 1000;

/// The `q` quantile (0..=1) of a histogram, as the upper bound of the slot
/// it falls in (an over-estimate by at most one slot's width). `None` when
/// empty; the slowest slot reports as its lower bound, "over 30 s".
pub fn quantile_ms(histogram: &[u64; HISTOGRAM_LEN], q: f64) -> Option<i64> {
    let total: u64 = histogram.iter().sum();
    if total == 0 {
        return None;
    }
    // The rank of the quantile, 1-based: p50 of 4 is the 2nd.
    let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for (slot, count) in histogram.iter().enumerate() {
        seen += count;
        if seen >= rank {
            return Some(
                LATENCY_BOUNDS_MS
                    .get(slot)
                    .copied()
                    .unwrap_or(LATENCY_BOUNDS_MS[LATENCY_BOUNDS_MS.len() - 1]),
            );
        }
    }
    None
}

/// Figures over one window (last hour, last day).
#[derive(Debug, Clone, Default, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WindowFigures {
    pub attempts: u64,
    pub successes: u64,
    pub failures: u64,
    /// failures / attempts, 0 when there were none.
    pub failure_rate: f64,
    pub p50_ms: Option<i64>,
    pub p95_ms: Option<i64>,
    pub p99_ms: Option<i64>,
}

/// One point of the dashboard's chart: an hour's attempts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HourPoint {
    /// RFC 3339 in the API (Unix ms inside Herald, as every time here).
    #[schema(value_type = String, format = DateTime)]
    #[serde(serialize_with = "as_rfc3339")]
    pub hour_start: Millis,
    pub attempts: u64,
    pub failures: u64,
    pub mean_latency_ms: Option<i64>,
}

// `Millis` is an alias of i64 that the OpenAPI derive cannot see through,
// hence the `value_type`s.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointHealth {
    pub last_hour: WindowFigures,
    pub last_day: WindowFigures,
    /// Consecutive failed attempts now, 0 after any success.
    pub failure_streak: u32,
    #[schema(value_type = Option<String>, format = DateTime)]
    #[serde(serialize_with = "opt_rfc3339")]
    pub streak_started_at: Option<Millis>,
    #[schema(value_type = Option<String>, format = DateTime)]
    #[serde(serialize_with = "opt_rfc3339")]
    pub last_success_at: Option<Millis>,
    pub last_error: Option<String>,
    #[schema(value_type = Option<String>, format = DateTime)]
    #[serde(serialize_with = "opt_rfc3339")]
    pub last_error_at: Option<Millis>,
    pub disabled: bool,
    pub disabled_reason: Option<String>,
    #[schema(value_type = Option<String>, format = DateTime)]
    #[serde(serialize_with = "opt_rfc3339")]
    pub disabled_at: Option<Millis>,
    /// The last 24 hours, oldest first, one point per hour.
    pub hourly: Vec<HourPoint>,
    /// `"throttled at N/s"` when the endpoint has a `throttleRate`.
    pub throttled: Option<String>,
    /// Deliveries waiting for a throttle slot now (with a `throttleRate`).
    pub throttle_waiting: Option<u64>,
    /// The endpoint's circuit breaker.
    pub circuit: CircuitHealth,
}

/// How the health API and the dashboard say an endpoint is throttled.
pub fn throttled_text(rate: u32) -> String {
    format!("throttled at {rate}/s")
}

/// An endpoint's circuit breaker as the health API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CircuitHealth {
    /// `closed` (deliveries flow), `open` (held, unclaimed, spending no
    /// attempt, until `until`) or `halfOpen` (one probe under way).
    #[schema(example = "closed")]
    pub state: String,
    /// When it entered this state (none for a breaker never opened).
    #[schema(value_type = Option<String>, format = DateTime)]
    #[serde(serialize_with = "opt_rfc3339")]
    pub since: Option<Millis>,
    /// Open: when the probe may go.
    #[schema(value_type = Option<String>, format = DateTime)]
    #[serde(serialize_with = "opt_rfc3339")]
    pub until: Option<Millis>,
    /// The failed share (0.0–1.0) of the attempts in the breaker's window
    /// (`HERALD_BREAKER_WINDOW`, sliding-window estimate).
    pub recent_failure_rate: f64,
    /// Attempts in that window (estimated, rounded).
    pub recent_attempts: u64,
}

impl CircuitHealth {
    pub fn of(
        c: &herald_policy::breaker::Circuit,
        rule: &herald_policy::breaker::BreakerRule,
        now: Millis,
    ) -> Self {
        let (attempts, _) = c.window.estimate(rule.window, now);
        CircuitHealth {
            state: c.state.as_str().to_owned(),
            since: c.since,
            until: c
                .until
                .filter(|_| c.state == herald_policy::breaker::CircuitState::Open),
            recent_failure_rate: c.window.failure_rate(rule.window, now),
            recent_attempts: attempts.round().max(0.0) as u64,
        }
    }
}

impl Default for CircuitHealth {
    fn default() -> Self {
        CircuitHealth {
            state: "closed".to_owned(),
            since: None,
            until: None,
            recent_failure_rate: 0.0,
            recent_attempts: 0,
        }
    }
}

// Times are Unix ms inside Herald and RFC 3339 in the API, as everywhere.
fn as_rfc3339<S: serde::Serializer>(ms: &Millis, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&crate::store::rfc3339(*ms))
}

fn opt_rfc3339<S: serde::Serializer>(ms: &Option<Millis>, s: S) -> Result<S::Ok, S::Error> {
    match ms {
        Some(ms) => s.serialize_str(&crate::store::rfc3339(*ms)),
        None => s.serialize_none(),
    }
}

fn window(buckets: &[StatsBucket], since: Millis) -> WindowFigures {
    let mut histogram = [0u64; HISTOGRAM_LEN];
    let mut w = WindowFigures::default();
    for b in buckets.iter().filter(|b| b.bucket >= since) {
        w.attempts += b.attempts;
        w.successes += b.successes;
        w.failures += b.failures;
        for (sum, n) in histogram.iter_mut().zip(b.histogram.iter()) {
            *sum += n;
        }
    }
    if w.attempts > 0 {
        w.failure_rate = w.failures as f64 / w.attempts as f64;
    }
    w.p50_ms = quantile_ms(&histogram, 0.50);
    w.p95_ms = quantile_ms(&histogram, 0.95);
    w.p99_ms = quantile_ms(&histogram, 0.99);
    w
}

/// Adds up an endpoint's buckets (those of the last 24 h; older ones are
/// ignored) into its health at `now`.
pub fn compute(status: &EndpointStatus, buckets: &[StatsBucket], now: Millis) -> EndpointHealth {
    // A bucket counts in a window when it started inside it: the figures
    // cover the last hour to within one bucket's width.
    let last_hour = window(buckets, bucket_of(now - HOUR_MS) + BUCKET_MS);
    let day_start = bucket_of(now - 24 * HOUR_MS) + BUCKET_MS;
    let last_day = window(buckets, day_start);
    let first_hour = now - now.rem_euclid(HOUR_MS) - 23 * HOUR_MS;
    let mut hourly: Vec<HourPoint> = (0..24)
        .map(|i| HourPoint {
            hour_start: first_hour + i * HOUR_MS,
            ..HourPoint::default()
        })
        .collect();
    let mut latency_sums = [0u64; 24];
    for b in buckets {
        let Ok(i) = usize::try_from((b.bucket - first_hour).div_euclid(HOUR_MS)) else {
            continue;
        };
        if let Some(point) = hourly.get_mut(i) {
            point.attempts += b.attempts;
            point.failures += b.failures;
            latency_sums[i] += b.latency_sum_ms;
        }
    }
    for (point, sum) in hourly.iter_mut().zip(latency_sums) {
        point.mean_latency_ms = sum
            .checked_div(point.attempts)
            .and_then(|m| i64::try_from(m).ok());
    }
    EndpointHealth {
        last_hour,
        last_day,
        failure_streak: status.fail_streak,
        streak_started_at: status.streak_started_at,
        last_success_at: status.last_success_at,
        last_error: status.last_error.clone(),
        last_error_at: status.last_error_at,
        disabled: status.disabled,
        disabled_reason: status.disabled_reason.clone(),
        throttled: None,
        throttle_waiting: None,
        disabled_at: status.disabled_at,
        hourly,
        circuit: CircuitHealth::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(at: Millis, ok: u64, failed: u64, latency_ms: i64) -> StatsBucket {
        let mut histogram = [0; HISTOGRAM_LEN];
        histogram[latency_slot(latency_ms)] = ok + failed;
        StatsBucket {
            bucket: bucket_of(at),
            attempts: ok + failed,
            successes: ok,
            failures: failed,
            latency_sum_ms: (ok + failed) * u64::try_from(latency_ms).unwrap_or(0),
            histogram,
        }
    }

    #[test]
    fn slots_follow_the_inclusive_bounds() {
        assert_eq!(latency_slot(0), 0);
        assert_eq!(latency_slot(10), 0);
        assert_eq!(latency_slot(11), 1);
        assert_eq!(latency_slot(30_000), 10);
        assert_eq!(latency_slot(30_001), 11);
        assert_eq!(latency_slot(-5), 0);
    }

    #[test]
    fn quantiles_pick_the_slot_of_the_rank() {
        let mut h = [0u64; HISTOGRAM_LEN];
        assert_eq!(quantile_ms(&h, 0.5), None);
        h[0] = 90; // ≤ 10 ms
        h[5] = 9; // ≤ 500 ms
        h[11] = 1; // > 30 s
        assert_eq!(quantile_ms(&h, 0.50), Some(10));
        assert_eq!(quantile_ms(&h, 0.90), Some(10));
        assert_eq!(quantile_ms(&h, 0.95), Some(500));
        assert_eq!(quantile_ms(&h, 0.99), Some(500));
        assert_eq!(quantile_ms(&h, 1.0), Some(30_000));
        assert_eq!(quantile_ms(&h, 0.0), Some(10));
    }

    #[test]
    fn windows_split_the_last_hour_from_the_day() {
        let now: Millis = 1_800_000_000_000;
        let status = EndpointStatus {
            fail_streak: 3,
            ..EndpointStatus::default()
        };
        let buckets = vec![
            bucket(now - 25 * HOUR_MS, 100, 100, 10), // outside both
            bucket(now - 5 * HOUR_MS, 8, 2, 40),      // the day only
            bucket(now - 10 * 60 * 1000, 3, 1, 200),  // both
            bucket(now, 1, 0, 5),                     // both (current bucket)
        ];
        let h = compute(&status, &buckets, now);
        assert_eq!(
            (
                h.last_hour.attempts,
                h.last_hour.successes,
                h.last_hour.failures
            ),
            (5, 4, 1)
        );
        assert!((h.last_hour.failure_rate - 0.2).abs() < 1e-9);
        assert_eq!(h.last_hour.p50_ms, Some(250));
        assert_eq!(
            (h.last_day.attempts, h.last_day.failures),
            (15, 3),
            "the 25 h old bucket is left out"
        );
        assert_eq!(h.last_day.p50_ms, Some(50));
        assert_eq!(h.failure_streak, 3);
        assert_eq!(h.hourly.len(), 24);
        assert_eq!(h.hourly.iter().map(|p| p.attempts).sum::<u64>(), 15);
        let last = &h.hourly[23];
        assert!(last.hour_start <= now && now < last.hour_start + HOUR_MS);
        assert_eq!(h.hourly[18].attempts, 10, "five hours ago");
        assert_eq!(h.hourly[18].mean_latency_ms, Some(40));
    }

    #[test]
    fn no_attempts_means_no_rate_and_no_latency() {
        let h = compute(&EndpointStatus::default(), &[], 1_800_000_000_000);
        assert_eq!(h.last_day, WindowFigures::default());
        assert!(h.hourly.iter().all(|p| p.mean_latency_ms.is_none()));
    }
}

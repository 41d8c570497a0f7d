//! The shape of the per-endpoint attempt statistics: 5-minute buckets and a
//! latency histogram. The store keeps them as outcomes are written, and the
//! health figures are computed from them; both sides take the shape from
//! here, below both.

/// Width of one stats bucket, in milliseconds.
pub const BUCKET_MS: i64 = 5 * 60 * 1000;

/// Upper bounds (ms, inclusive) of the latency histogram's slots; a last
/// slot holds everything slower.
pub const LATENCY_BOUNDS_MS: [i64; 11] =
    [10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000];

/// Slots in the latency histogram.
pub const HISTOGRAM_LEN: usize = LATENCY_BOUNDS_MS.len() + 1;

/// The start of the bucket holding `at` (ms since the epoch).
pub fn bucket_of(at: i64) -> i64 {
    at - at.rem_euclid(BUCKET_MS)
}

/// The histogram slot of an attempt that took `ms`.
pub fn latency_slot(ms: i64) -> usize {
    LATENCY_BOUNDS_MS
        .iter()
        .position(|bound| ms <= *bound)
        .unwrap_or(LATENCY_BOUNDS_MS.len())
}

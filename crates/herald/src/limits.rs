//! Limits on guessing credentials: a token bucket of failed log-ins per
//! client address, in memory (per process).
//!
//! Each address starts with `burst` tries; every failure takes one, and one
//! comes back per `refill` (default: 10 failures, then one a second). While
//! an address has none left, [`LoginLimiter::check`] says how long to wait.
//! IPv6 addresses are counted per /64, the block one host usually holds, so
//! that walking through a prefix does not buy fresh buckets; IPv4-mapped IPv6
//! addresses count as their IPv4 address.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::RwLock;
use std::time::{Duration, Instant};

/// Failed log-ins per address, as a token bucket.
pub struct LoginLimiter {
    burst: f64,
    refill: Duration,
    /// Read on every API request (a read lock), written only on failures.
    buckets: RwLock<HashMap<IpAddr, Bucket>>,
}

#[derive(Clone, Copy)]
struct Bucket {
    /// Tries left at `at` (fractional: refills are continuous).
    tries: f64,
    at: Instant,
}

impl LoginLimiter {
    /// Addresses tracked at most; past it, those whose bucket is full again
    /// are forgotten, and if that is not enough, every one is (a flood of
    /// addresses then resets the count rather than growing memory).
    const MAX_ADDRESSES: usize = 100_000;

    /// `burst` failures at once (at least 1), then one per `refill`.
    pub fn new(burst: u32, refill: Duration) -> Self {
        LoginLimiter {
            burst: f64::from(burst.max(1)),
            refill: refill.max(Duration::from_millis(1)),
            buckets: RwLock::new(HashMap::new()),
        }
    }

    /// Ok while `ip` may try again; otherwise how long until it may.
    pub fn check(&self, ip: IpAddr) -> Result<(), Duration> {
        self.check_at(ip, Instant::now())
    }

    /// Counts one failed log-in from `ip`.
    pub fn failed(&self, ip: IpAddr) {
        self.failed_at(ip, Instant::now())
    }

    fn check_at(&self, ip: IpAddr, now: Instant) -> Result<(), Duration> {
        let buckets = self.buckets.read().unwrap_or_else(|p| p.into_inner());
        let Some(bucket) = buckets.get(&key(ip)) else {
            return Ok(());
        };
        let tries = self.tries_at(*bucket, now);
        if tries >= 1.0 {
            Ok(())
        } else {
            Err(self.refill.mul_f64(1.0 - tries))
        }
    }

    fn failed_at(&self, ip: IpAddr, now: Instant) {
        let mut buckets = self.buckets.write().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= Self::MAX_ADDRESSES && !buckets.contains_key(&key(ip)) {
            buckets.retain(|_, b| self.tries_at(*b, now) < self.burst);
            if buckets.len() >= Self::MAX_ADDRESSES {
                tracing::warn!(
                    addresses = buckets.len(),
                    "too many addresses with failed log-ins: forgetting them all"
                );
                buckets.clear();
            }
        }
        let bucket = buckets.entry(key(ip)).or_insert(Bucket {
            tries: self.burst,
            at: now,
        });
        // Two requests may pass `check` together and both fail: the bucket
        // does not go below empty (no debt), it just stays empty.
        bucket.tries = (self.tries_at(*bucket, now) - 1.0).max(0.0);
        bucket.at = now;
    }

    fn tries_at(&self, bucket: Bucket, now: Instant) -> f64 {
        let refilled =
            now.saturating_duration_since(bucket.at).as_secs_f64() / self.refill.as_secs_f64();
        (bucket.tries + refilled).min(self.burst)
    }
}

/// What an address is counted under: IPv4 as it is, IPv6 by its /64.
fn key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("test address parses")
    }

    #[test]
    fn a_burst_of_failures_then_one_per_refill() {
        let limiter = LoginLimiter::new(3, Duration::from_secs(1));
        let t0 = Instant::now();
        let a = ip("192.0.2.1");
        for _ in 0..3 {
            assert_eq!(limiter.check_at(a, t0), Ok(()));
            limiter.failed_at(a, t0);
        }
        assert_eq!(limiter.check_at(a, t0), Err(Duration::from_secs(1)));
        assert_eq!(
            limiter.check_at(a, t0 + Duration::from_millis(250)),
            Err(Duration::from_millis(750))
        );
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(limiter.check_at(a, t1), Ok(()));
        limiter.failed_at(a, t1);
        assert!(
            limiter.check_at(a, t1).is_err(),
            "one try came back, one used"
        );
        // A long quiet spell refills to the burst, no further.
        let later = t1 + Duration::from_secs(3600);
        for _ in 0..3 {
            assert_eq!(limiter.check_at(a, later), Ok(()));
            limiter.failed_at(a, later);
        }
        assert!(limiter.check_at(a, later).is_err());
    }

    #[test]
    fn addresses_are_counted_apart_and_ipv6_per_64() {
        let limiter = LoginLimiter::new(1, Duration::from_secs(60));
        let t0 = Instant::now();
        limiter.failed_at(ip("192.0.2.1"), t0);
        assert!(limiter.check_at(ip("192.0.2.1"), t0).is_err());
        assert!(limiter.check_at(ip("::ffff:192.0.2.1"), t0).is_err());
        assert_eq!(limiter.check_at(ip("192.0.2.2"), t0), Ok(()));

        limiter.failed_at(ip("2001:db8:1:2::1"), t0);
        assert!(limiter.check_at(ip("2001:db8:1:2:ffff::9"), t0).is_err());
        assert_eq!(limiter.check_at(ip("2001:db8:1:3::1"), t0), Ok(()));
    }

    #[test]
    fn failures_past_empty_leave_no_debt() {
        let limiter = LoginLimiter::new(1, Duration::from_secs(1));
        let t0 = Instant::now();
        let a = ip("198.51.100.7");
        for _ in 0..5 {
            limiter.failed_at(a, t0);
        }
        assert_eq!(limiter.check_at(a, t0 + Duration::from_secs(1)), Ok(()));
    }
}

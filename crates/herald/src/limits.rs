//! Limits on guessing: failed log-ins per client address, as a token
//! bucket kept in memory (per process, like the dashboard's sessions).
//!
//! An address may fail `burst` times at once, then once per `refill`; a
//! success costs nothing. Callers ask [`LoginLimiter::check`] before they
//! look at the secret (so a right guess made while limited is refused too)
//! and report a wrong one with [`LoginLimiter::failed`].

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Addresses tracked at most; past it, new ones share one bucket, so a
/// crowd of addresses is limited together rather than growing the map.
const MAX_TRACKED: usize = 65_536;

/// Whom a bucket belongs to. IPv6 clients are counted per /64, the block a
/// single host or customer usually gets, so hopping addresses inside it
/// buys nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Client {
    V4([u8; 4]),
    V6Prefix([u16; 4]),
    /// Everyone who arrived while the map was full.
    Overflow,
}

impl Client {
    fn of(ip: IpAddr) -> Self {
        match ip.to_canonical() {
            IpAddr::V4(v4) => Client::V4(v4.octets()),
            IpAddr::V6(v6) => {
                let s = v6.segments();
                Client::V6Prefix([s[0], s[1], s[2], s[3]])
            }
        }
    }
}

pub struct LoginLimiter {
    burst: u32,
    refill: Duration,
    state: Mutex<Buckets>,
}

#[derive(Default)]
struct Buckets {
    /// Per client, when its failures will all have been forgiven (the
    /// bucket is full again).
    debt_until: HashMap<Client, Instant>,
    /// A full map is swept of forgiven clients at most this often, so a
    /// crowd of newcomers does not cost a sweep each.
    next_sweep: Option<Instant>,
}

impl LoginLimiter {
    /// `burst` failures at once (at least 1), then one per `refill`.
    pub fn new(burst: u32, refill: Duration) -> Self {
        LoginLimiter {
            burst: burst.max(1),
            refill,
            state: Mutex::new(Buckets::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Buckets> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ok if `ip` may try (once more); otherwise how long until it may.
    pub fn check(&self, ip: IpAddr) -> Result<(), Duration> {
        let now = Instant::now();
        let allowance = self.refill * self.burst;
        let state = self.lock();
        let map = &state.debt_until;
        let Some(until) = map.get(&Client::of(ip)).or_else(|| {
            // An address not tracked while the map is full is in the
            // overflow bucket (see `failed`).
            (map.len() >= MAX_TRACKED)
                .then(|| map.get(&Client::Overflow))
                .flatten()
        }) else {
            return Ok(());
        };
        let debt = until.saturating_duration_since(now);
        // One more failure must still fit in the allowance.
        match (debt + self.refill).checked_sub(allowance) {
            Some(wait) if !wait.is_zero() => Err(wait),
            _ => Ok(()),
        }
    }

    /// Records a failed attempt from `ip`.
    pub fn failed(&self, ip: IpAddr) {
        let now = Instant::now();
        let mut state = self.lock();
        let mut client = Client::of(ip);
        if !state.debt_until.contains_key(&client) && state.debt_until.len() >= MAX_TRACKED {
            if state.next_sweep.is_none_or(|at| at <= now) {
                // Forgiven clients are as good as absent: make room with them.
                state.debt_until.retain(|_, until| *until > now);
                state.next_sweep = Some(now + Duration::from_secs(1));
            }
            if state.debt_until.len() >= MAX_TRACKED {
                client = Client::Overflow;
            }
        }
        let until = state.debt_until.entry(client).or_insert(now);
        *until = (*until).max(now) + self.refill;
    }
}

/// `HERALD_API_RATE_LIMIT`: requests per second per caller (the admin
/// token, each application token, each dashboard or portal session), with
/// bursts of as many. Per process, like the sessions: with N API processes
/// a caller may make N times as many.
pub struct RateLimit {
    limiter: Option<governor::DefaultKeyedRateLimiter<String>>,
}

/// Callers tracked before the forgotten ones are swept out.
const RATE_KEYS_SWEPT_PAST: usize = 100_000;

impl RateLimit {
    /// `per_second` 0: no limit.
    pub fn new(per_second: u32) -> Self {
        RateLimit {
            limiter: std::num::NonZeroU32::new(per_second)
                .map(|n| governor::RateLimiter::keyed(governor::Quota::per_second(n))),
        }
    }

    /// Counts one request of `caller`; `Err(wait)` when it is over its
    /// rate, `wait` being how long until one more would be let through.
    pub fn check(&self, caller: &str) -> Result<(), Duration> {
        let Some(limiter) = &self.limiter else {
            return Ok(());
        };
        if limiter.len() > RATE_KEYS_SWEPT_PAST {
            limiter.retain_recent();
        }
        let key = caller.to_owned();
        limiter.check_key(&key).map_err(|not_until| {
            use governor::clock::Clock;
            not_until.wait_time_from(governor::clock::DefaultClock::default().now())
        })
    }
}

/// Whole seconds for a `Retry-After` header: rounded up, at least 1.
pub fn retry_after_secs(wait: Duration) -> u64 {
    (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_limit_is_per_caller_and_off_at_zero() {
        let limit = RateLimit::new(3);
        for _ in 0..3 {
            assert!(limit.check("a").is_ok());
        }
        let wait = limit.check("a").expect_err("a is over its rate");
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_secs(1),
            "{wait:?}"
        );
        assert!(limit.check("b").is_ok(), "b has its own bucket");
        let off = RateLimit::new(0);
        assert!((0..10_000).all(|_| off.check("a").is_ok()));
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1500)), 2);
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("address")
    }

    #[test]
    fn a_burst_then_one_per_refill_per_address() {
        let limiter = LoginLimiter::new(3, Duration::from_secs(3600));
        for _ in 0..3 {
            assert_eq!(limiter.check(ip("192.0.2.1")), Ok(()));
            limiter.failed(ip("192.0.2.1"));
        }
        let wait = limiter.check(ip("192.0.2.1")).expect_err("limited");
        assert!(wait > Duration::from_secs(3590) && wait <= Duration::from_secs(3600));
        // Another address is not affected; the same host over IPv4-mapped
        // IPv6 is the same client.
        assert_eq!(limiter.check(ip("192.0.2.2")), Ok(()));
        assert!(limiter.check(ip("::ffff:192.0.2.1")).is_err());
    }

    #[test]
    fn the_bucket_refills() {
        let limiter = LoginLimiter::new(2, Duration::from_millis(1));
        limiter.failed(ip("192.0.2.1"));
        limiter.failed(ip("192.0.2.1"));
        let deadline = Instant::now() + Duration::from_secs(30);
        while limiter.check(ip("192.0.2.1")).is_err() {
            assert!(Instant::now() < deadline, "never refilled");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn ipv6_addresses_share_their_64() {
        let limiter = LoginLimiter::new(1, Duration::from_secs(3600));
        limiter.failed(ip("2001:db8:1:2::1"));
        assert!(limiter.check(ip("2001:db8:1:2:ffff::9")).is_err());
        assert_eq!(limiter.check(ip("2001:db8:1:3::1")), Ok(()));
    }

    #[test]
    fn a_full_map_limits_newcomers_together() {
        let limiter = LoginLimiter::new(1, Duration::from_secs(3600));
        for i in 0..MAX_TRACKED as u32 {
            limiter.failed(IpAddr::from(i.to_be_bytes()));
        }
        assert_eq!(limiter.lock().debt_until.len(), MAX_TRACKED);
        limiter.failed(ip("2001:db8::1"));
        assert!(limiter.check(ip("2001:db8:ffff::1")).is_err(), "overflow");
        assert_eq!(
            limiter.lock().debt_until.len(),
            MAX_TRACKED + 1,
            "one overflow bucket"
        );
    }
}

//! Herald's retry policy: the pure heart of delivery.
//!
//! Every state change of a delivery after an attempt is decided here, by
//! [`decide`], from the attempt's [`Outcome`], the attempt number, the
//! message's age, the configured [`RetryPolicy`] and a jitter sample. Nothing
//! in this crate does I/O or reads a clock: callers pass `now` in, so every
//! boundary can be unit-tested exhaustively.

use std::time::{Duration, SystemTime};

pub mod breaker;
pub mod stats;

/// How the observed outcome of one HTTP attempt is classified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusClass {
    /// 2xx: the receiver has the message.
    Success,
    /// 5xx, 408, 429, and 407 (the egress proxy's refusal, not the
    /// receiver's: a proxy's password put right lets it through).
    Retryable,
    /// Anything else (1xx, 3xx, other 4xx): retrying yields the same answer.
    Permanent,
}

/// Classifies an HTTP status code. Redirects are never followed, so 3xx is
/// permanent: a receiver that moved must be re-registered.
pub fn classify_status(status: u16) -> StatusClass {
    match status {
        200..=299 => StatusClass::Success,
        407 | 408 | 429 | 500..=599 => StatusClass::Retryable,
        _ => StatusClass::Permanent,
    }
}

/// What one attempt observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The receiver answered with a status. `retry_after` is the already
    /// parsed `Retry-After` hint, if the response carried a valid one.
    Response {
        status: u16,
        retry_after: Option<Duration>,
    },
    /// No answer: refused connection, reset, DNS failure, blocked address.
    NetworkError,
    /// No complete answer within the request timeout.
    Timeout,
}

/// How the scheduled delay is randomised so that retries from many
/// deliveries do not arrive in lock-step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Jitter {
    /// Uniform in `[0, delay]` (the default: simplest and best at spreading).
    #[default]
    Full,
    /// Uniform in `[delay/2, delay]`.
    Equal,
    /// Exactly the scheduled delay.
    None,
}

impl std::str::FromStr for Jitter {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "full" => Ok(Jitter::Full),
            "equal" => Ok(Jitter::Equal),
            "none" => Ok(Jitter::None),
            other => Err(format!(
                "unknown jitter `{other}`: expected full, equal or none"
            )),
        }
    }
}

impl Jitter {
    /// Applies the jitter to `delay` with `unit`, a sample uniform in `[0, 1)`.
    /// Out-of-range samples are clamped so a bad random source cannot make a
    /// delay longer than scheduled.
    pub fn apply(self, delay: Duration, unit: f64) -> Duration {
        let unit = if unit.is_finite() {
            unit.clamp(0.0, 1.0)
        } else {
            0.0
        };
        // `mul_f64` goes through an f64 of seconds, which can round up
        // for delays of months and more: the `min` keeps the promise.
        match self {
            Jitter::Full => delay.mul_f64(unit).min(delay),
            Jitter::Equal => {
                let half = delay / 2;
                (half + (delay - half).mul_f64(unit)).min(delay)
            }
            Jitter::None => delay,
        }
    }
}

/// The configured retry behaviour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Delays between attempts; a delivery gets `schedule.len() + 1` attempts.
    pub schedule: Vec<Duration>,
    pub jitter: Jitter,
    /// No attempt is scheduled for a message older than this.
    pub max_age: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            schedule: [60, 5 * 60, 30 * 60, 2 * 3600, 6 * 3600, 12 * 3600]
                .into_iter()
                .map(Duration::from_secs)
                .collect(),
            jitter: Jitter::Full,
            max_age: Duration::from_secs(24 * 3600),
        }
    }
}

impl RetryPolicy {
    /// Total attempts a delivery gets in one cycle.
    pub fn max_attempts(&self) -> u32 {
        u32::try_from(self.schedule.len())
            .unwrap_or(u32::MAX - 1)
            .saturating_add(1)
    }
}

/// Why a delivery was dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeadReason {
    /// Every attempt of the schedule failed.
    Exhausted,
    /// The receiver answered a status that retrying cannot change.
    PermanentStatus,
    /// The message outlived the age cap while still failing.
    TooOld,
    /// The message's payload was erased before the delivery was sent
    /// (nothing is ever sent in its place).
    Expunged,
}

impl DeadReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DeadReason::Exhausted => "exhausted",
            DeadReason::PermanentStatus => "permanent_status",
            DeadReason::TooOld => "too_old",
            DeadReason::Expunged => "expunged",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "exhausted" => Some(DeadReason::Exhausted),
            "permanent_status" => Some(DeadReason::PermanentStatus),
            "too_old" => Some(DeadReason::TooOld),
            "expunged" => Some(DeadReason::Expunged),
            _ => None,
        }
    }
}

/// The next state of a delivery after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Delivered,
    /// Try again after `delay` (the jittered step, or a longer Retry-After hint).
    Retry {
        delay: Duration,
    },
    Dead(DeadReason),
}

/// Decides what happens to a delivery after an attempt.
///
/// - `attempt`: the 1-based number of the attempt just made within the
///   current cycle (a replay starts a new cycle).
/// - `age`: time since the cycle started (the message's creation, or the
///   replay), measured at the end of the attempt.
/// - `jitter_unit`: a sample uniform in `[0, 1)`.
pub fn decide(
    policy: &RetryPolicy,
    outcome: &Outcome,
    attempt: u32,
    age: Duration,
    jitter_unit: f64,
) -> Decision {
    let retry_after = match outcome {
        Outcome::Response {
            status,
            retry_after,
        } => match classify_status(*status) {
            StatusClass::Success => return Decision::Delivered,
            StatusClass::Permanent => return Decision::Dead(DeadReason::PermanentStatus),
            // Only 429 and 503 carry a hint worth obeying (RFC 9110 §10.2.3).
            StatusClass::Retryable if matches!(status, 429 | 503) => *retry_after,
            StatusClass::Retryable => None,
        },
        Outcome::NetworkError | Outcome::Timeout => None,
    };
    if age > policy.max_age {
        return Decision::Dead(DeadReason::TooOld);
    }
    let Some(scheduled) = usize::try_from(attempt)
        .ok()
        .and_then(|n| n.checked_sub(1))
        .and_then(|i| policy.schedule.get(i))
    else {
        return Decision::Dead(DeadReason::Exhausted);
    };
    let remaining = policy.max_age - age;
    if remaining.is_zero() {
        return Decision::Dead(DeadReason::TooOld);
    }
    // A hint may lengthen the wait, never shorten it: `Retry-After: 0` (or a
    // date in the past) from a struggling receiver would otherwise spend
    // the whole schedule in seconds.
    let stepped = policy.jitter.apply(*scheduled, jitter_unit);
    let delay = retry_after.map_or(stepped, |hint| hint.max(stepped));
    // Nothing is scheduled past the age cap: the last try happens at the cap.
    Decision::Retry {
        delay: delay.min(remaining),
    }
}

/// When an endpoint is disabled automatically (Standard Webhooks and the
/// brief): after `after` consecutive failed attempts spanning at least
/// `min_window`, or at once on 410 Gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DisableRule {
    pub after: u32,
    pub min_window: Duration,
}

/// Why an endpoint is to be disabled now, if it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DisableCause {
    /// The receiver answered 410 Gone: it asks not to be called again.
    Gone,
    /// The failing streak reached the rule's count and window.
    FailingStreak { failures: u32, lasted: Duration },
}

impl DisableCause {
    /// The reason recorded on the endpoint and shown to operators.
    pub fn describe(&self) -> String {
        match self {
            DisableCause::Gone => "the endpoint answered 410 Gone".to_owned(),
            DisableCause::FailingStreak { failures, lasted } => format!(
                "{failures} consecutive failed attempts over {}s",
                lasted.as_secs()
            ),
        }
    }
}

/// Decides whether an endpoint must be disabled after a batch of its
/// attempts: `gone` if one of them was answered 410; `streak` the failed
/// attempts in a row now recorded, the first of them `streak_age` ago.
/// A streak of 0 (a success came last) never disables.
pub fn should_disable(
    rule: &DisableRule,
    gone: bool,
    streak: u32,
    streak_age: Duration,
) -> Option<DisableCause> {
    if gone {
        return Some(DisableCause::Gone);
    }
    if streak > 0 && streak >= rule.after && streak_age >= rule.min_window {
        return Some(DisableCause::FailingStreak {
            failures: streak,
            lasted: streak_age,
        });
    }
    None
}

/// How the dispatcher sizes each endpoint's lane: how many of its requests
/// may be under way (and as many more claimed, waiting) at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneRule {
    /// The most, whatever the endpoint does (`HERALD_ENDPOINT_CONCURRENCY`).
    pub cap: usize,
    /// A lane's size before the endpoint has answered anything.
    pub start: usize,
    /// An answer that took longer than this (a timeout too) is slow.
    pub prompt_within: Duration,
}

impl LaneRule {
    /// The rule for `cap`: lanes start at 4 (or `cap`, if smaller), and an
    /// answer within a second is prompt.
    pub fn for_cap(cap: usize) -> Self {
        let cap = cap.max(1);
        LaneRule {
            cap,
            start: cap.min(4),
            prompt_within: Duration::from_secs(1),
        }
    }
}

/// An endpoint's lane after one of its requests took `took`. A prompt
/// answer widens the lane by one (so it doubles per round trip, up to the
/// cap). A slow one narrows it by half when `contended` (other endpoints'
/// deliveries wanted slots lately): a stuck endpoint then holds a few
/// slots instead of its cap, and the rest go where requests finish. When
/// nothing else wants them, a slow endpoint widens like a prompt one: its
/// requests are the only work there is.
pub fn next_lane(rule: &LaneRule, lane: usize, took: Duration, contended: bool) -> usize {
    let lane = lane.clamp(1, rule.cap);
    if took <= rule.prompt_within || !contended {
        (lane + 1).min(rule.cap)
    } else {
        (lane / 2).max(1)
    }
}

/// 410 Gone: the receiver asks to be disabled at once.
pub fn is_gone(status: Option<u16>) -> bool {
    status == Some(410)
}

/// Parses a `Retry-After` header value: delta-seconds or an HTTP-date.
/// A date in the past means "now" (zero). Returns `None` for garbage, so the
/// schedule applies instead.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if value.is_empty() {
        return None;
    }
    if value.bytes().all(|b| b.is_ascii_digit()) {
        // Absurdly long digit strings saturate instead of failing.
        let secs = value.parse::<u64>().unwrap_or(u64::MAX);
        return Some(Duration::from_secs(secs));
    }
    let when = httpdate::parse_http_date(value).ok()?;
    Some(when.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The longest duration a setting takes. Longer ones are typos: a time
/// that far ahead cannot be written as a date (pages showed it as 1970),
/// and added to now it nears the end of a millisecond timestamp's range.
pub const LONGEST_DURATION: Duration = Duration::from_secs(100 * 365 * 86_400);

/// Parses a human duration: `500ms`, `10s`, `5m`, `2h`, `1d`; at most
/// [`LONGEST_DURATION`] (`36500d`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("`{s}` has no unit: use ms, s, m, h or d (e.g. 30s)"))?;
    let (digits, unit) = s.split_at(split);
    if digits.is_empty() {
        return Err(format!("`{s}` does not start with a number"));
    }
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("`{s}`: number too large"))?;
    let millis_per = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => {
            return Err(format!(
                "`{s}`: unknown unit `{unit}`: use ms, s, m, h or d"
            ))
        }
    };
    match n.checked_mul(millis_per).map(Duration::from_millis) {
        Some(d) if d <= LONGEST_DURATION => Ok(d),
        _ => Err(format!("`{s}`: longer than 100 years (36500d)")),
    }
}

/// Parses a comma-separated schedule such as `1m,5m,30m,2h,6h,12h`.
/// An empty string means "no retries" (one attempt).
pub fn parse_schedule(s: &str) -> Result<Vec<Duration>, String> {
    if s.trim().is_empty() {
        return Ok(Vec::new());
    }
    s.split(',').map(parse_duration).collect()
}

#[cfg(test)]
mod breaker_tests;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

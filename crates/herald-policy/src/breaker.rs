//! The per-endpoint circuit breaker's state machine, as pure functions.
//!
//! ```text
//! closed ──(≥ min_attempts in the window, failure rate ≥ rate)──▶ open(cooldown)
//! open ──(cooldown over; one process wins the probe: [`probe`])──▶ half-open
//! half-open ──(the probe succeeds)──▶ closed (cooldown reset)
//! half-open ──(the probe fails)──▶ open(cooldown × 2, at most max_cooldown)
//! half-open ──(no answer within probe_timeout: its process died)──▶ half-open (another probe)
//! ```
//!
//! Times are Unix milliseconds passed in by the caller (no clock here). The
//! window is a sliding-window counter: the current fixed window's counts
//! plus the previous window's, weighted by how much of it still overlaps
//! the last `window` (the usual approximation; two counters per endpoint
//! instead of a log of every attempt).

use std::time::Duration;

/// Unix time in milliseconds.
pub type Millis = i64;

/// The configured breaker (`HERALD_BREAKER_*`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BreakerRule {
    /// Attempts in the window needed before the rate counts; 0 turns the
    /// breaker off.
    pub min_attempts: u32,
    pub window: Duration,
    /// Failed share of the window's attempts (0.0–1.0) that opens it.
    pub failure_rate: f64,
    /// The first opening's cooldown; each reopening doubles it.
    pub cooldown: Duration,
    pub max_cooldown: Duration,
}

impl BreakerRule {
    /// The breaker turned off: nothing ever opens.
    pub const OFF: BreakerRule = BreakerRule {
        min_attempts: 0,
        window: Duration::from_secs(60),
        failure_rate: 0.5,
        cooldown: Duration::from_secs(30),
        max_cooldown: Duration::from_secs(600),
    };

    pub fn is_off(&self) -> bool {
        self.min_attempts == 0
    }
}

impl Default for BreakerRule {
    fn default() -> Self {
        BreakerRule {
            min_attempts: 20,
            ..BreakerRule::OFF
        }
    }
}

/// The breaker's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CircuitState {
    #[default]
    Closed,
    /// Nothing is sent until `until`.
    Open,
    /// One probe may go, sent by the process that won it.
    HalfOpen,
}

impl CircuitState {
    /// As stored (an integer column in both stores).
    pub fn code(self) -> i16 {
        match self {
            CircuitState::Closed => 0,
            CircuitState::Open => 1,
            CircuitState::HalfOpen => 2,
        }
    }

    pub fn from_code(code: i64) -> Self {
        match code {
            1 => CircuitState::Open,
            2 => CircuitState::HalfOpen,
            _ => CircuitState::Closed,
        }
    }

    /// As the API names it.
    pub fn as_str(self) -> &'static str {
        match self {
            CircuitState::Closed => "closed",
            CircuitState::Open => "open",
            CircuitState::HalfOpen => "halfOpen",
        }
    }
}

/// Attempts counted in the sliding window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WindowCounts {
    /// Start of the current fixed window (0: none yet).
    pub started_at: Millis,
    pub attempts: u32,
    pub failures: u32,
    /// The fixed window just before the current one.
    pub prev_attempts: u32,
    pub prev_failures: u32,
}

impl WindowCounts {
    /// Rolled forward to `now`: the current window becomes the previous one
    /// when `now` is past it, and both are dropped when `now` is past both.
    pub fn rolled(self, window: Duration, now: Millis) -> WindowCounts {
        let w = millis(window).max(1);
        if self.started_at == 0 || now < self.started_at {
            return WindowCounts {
                started_at: if self.started_at == 0 {
                    now
                } else {
                    self.started_at
                },
                ..self
            };
        }
        let windows_past = (now - self.started_at) / w;
        match windows_past {
            0 => self,
            1 => WindowCounts {
                started_at: self.started_at + w,
                attempts: 0,
                failures: 0,
                prev_attempts: self.attempts,
                prev_failures: self.failures,
            },
            n => WindowCounts {
                started_at: self.started_at.saturating_add(n.saturating_mul(w)),
                ..WindowCounts::default()
            },
        }
    }

    /// The attempts and failures of the last `window` before `now`
    /// (estimated: see the module comment).
    pub fn estimate(self, window: Duration, now: Millis) -> (f64, f64) {
        let w = millis(window).max(1);
        let r = self.rolled(window, now);
        let into = (now - r.started_at).clamp(0, w) as f64;
        let weight = 1.0 - into / w as f64;
        (
            f64::from(r.attempts) + f64::from(r.prev_attempts) * weight,
            f64::from(r.failures) + f64::from(r.prev_failures) * weight,
        )
    }

    /// The failed share of the last `window`, 0 with no attempts.
    pub fn failure_rate(self, window: Duration, now: Millis) -> f64 {
        let (attempts, failures) = self.estimate(window, now);
        if attempts > 0.0 {
            (failures / attempts).clamp(0.0, 1.0)
        } else {
            0.0
        }
    }
}

/// One endpoint's breaker, as stored on its row.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Circuit {
    pub state: CircuitState,
    /// When the state was entered (for half-open: when the probe was won).
    pub since: Option<Millis>,
    /// Open: when the probe may go.
    pub until: Option<Millis>,
    /// The cooldown of the latest opening; 0 once closed again.
    pub cooldown_ms: i64,
    /// Half-open: the process that won the probe.
    pub probe_by: Option<String>,
    pub window: WindowCounts,
}

/// What one batch of completed attempts says about an endpoint, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Seen {
    pub attempts: u32,
    pub failures: u32,
    /// The batch's last attempt (by start time) succeeded.
    pub last_succeeded: bool,
}

/// A change of state worth telling (operator events, metrics).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Transition {
    /// Closed → open, with the window's figures that opened it.
    Opened {
        attempts: u32,
        failures: u32,
        failure_rate: f64,
    },
    /// Half-open → open: the probe failed.
    Reopened,
    /// Half-open → closed: the probe succeeded.
    Closed,
}

/// Parses a failure rate: a percentage (`50%`, `12.5%`) or a fraction
/// (`0.5`), above 0 and at most 1: at 0 every window would open it, on
/// attempts that all succeeded.
pub fn parse_rate(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let (number, scale) = match t.strip_suffix('%') {
        Some(n) => (n.trim(), 100.0),
        None => (t, 1.0),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{t}` is not a rate: use a percentage (50%) or a fraction (0.5)"))?;
    let rate = value / scale;
    if !rate.is_finite() || !(0.0..=1.0).contains(&rate) {
        return Err(format!("`{t}` is not between 0% and 100%"));
    }
    if rate == 0.0 {
        return Err(format!(
            "`{t}` would open the breaker on endpoints that never fail: use a rate above 0% \
             (HERALD_BREAKER_MIN_ATTEMPTS=0 turns the breaker off)"
        ));
    }
    Ok(rate)
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The breaker after a batch of `seen` attempts completed at `now`.
///
/// - Closed: the attempts join the window; it opens once the window holds
///   at least `min_attempts` with a failed share of at least
///   `failure_rate`.
/// - Open: attempts sent before it opened may still come in; they change
///   nothing (the cooldown runs on).
/// - Half-open: the answer is the probe's: the last attempt's success
///   closes it, a failure reopens it with the cooldown doubled.
/// - Off (`min_attempts` 0): always closed.
pub fn step(
    rule: &BreakerRule,
    circuit: &Circuit,
    seen: &Seen,
    now: Millis,
) -> (Circuit, Option<Transition>) {
    if rule.is_off() {
        return (Circuit::default(), None);
    }
    if seen.attempts == 0 {
        return (circuit.clone(), None);
    }
    match circuit.state {
        CircuitState::Closed => {
            let mut window = circuit.window.rolled(rule.window, now);
            window.attempts = window.attempts.saturating_add(seen.attempts);
            window.failures = window.failures.saturating_add(seen.failures);
            let (attempts, failures) = window.estimate(rule.window, now);
            let rate = if attempts > 0.0 {
                failures / attempts
            } else {
                0.0
            };
            if attempts >= f64::from(rule.min_attempts) && rate >= rule.failure_rate {
                let cooldown = millis(rule.cooldown.min(rule.max_cooldown));
                let opened = Circuit {
                    state: CircuitState::Open,
                    since: Some(now),
                    until: Some(now.saturating_add(cooldown)),
                    cooldown_ms: cooldown,
                    probe_by: None,
                    window,
                };
                let t = Transition::Opened {
                    attempts: attempts.round() as u32,
                    failures: failures.round() as u32,
                    failure_rate: rate.clamp(0.0, 1.0),
                };
                return (opened, Some(t));
            }
            (
                Circuit {
                    window,
                    ..circuit.clone()
                },
                None,
            )
        }
        CircuitState::Open => (circuit.clone(), None),
        CircuitState::HalfOpen if seen.last_succeeded => (
            Circuit {
                state: CircuitState::Closed,
                since: Some(now),
                until: None,
                cooldown_ms: 0,
                probe_by: None,
                window: WindowCounts {
                    started_at: now,
                    ..WindowCounts::default()
                },
            },
            Some(Transition::Closed),
        ),
        CircuitState::HalfOpen => {
            let doubled = circuit
                .cooldown_ms
                .max(millis(rule.cooldown))
                .saturating_mul(2)
                .min(millis(rule.max_cooldown));
            (
                Circuit {
                    state: CircuitState::Open,
                    since: Some(now),
                    until: Some(now.saturating_add(doubled)),
                    cooldown_ms: doubled,
                    probe_by: None,
                    window: circuit.window,
                },
                Some(Transition::Reopened),
            )
        }
    }
}

/// The breaker once `by` has won its probe at `now`, if a probe may be
/// won: it is open and its cooldown is over, or it is half-open and the
/// probe's winner gave no answer within `probe_timeout` (it died, or its
/// probe was never sent). The store writes this only if the row still
/// holds `circuit` (compare and set), so of several processes one wins.
pub fn probe(circuit: &Circuit, now: Millis, probe_timeout: Duration, by: &str) -> Option<Circuit> {
    let may = match circuit.state {
        CircuitState::Closed => false,
        CircuitState::Open => circuit.until.is_none_or(|until| now >= until),
        CircuitState::HalfOpen => circuit
            .since
            .is_none_or(|since| now >= since.saturating_add(millis(probe_timeout))),
    };
    may.then(|| Circuit {
        state: CircuitState::HalfOpen,
        since: Some(now),
        probe_by: Some(by.to_owned()),
        ..circuit.clone()
    })
}

/// How many deliveries a process may claim for an endpoint whose breaker
/// is `circuit`, given what it can take otherwise (`room`): all of it when
/// closed, none when open, one (the probe) when half-open and won by
/// `me`, and none then either once `probe_taken`.
pub fn room(circuit: &Circuit, me: &str, probe_taken: bool, room: usize) -> usize {
    match circuit.state {
        CircuitState::Closed => room,
        CircuitState::Open => 0,
        CircuitState::HalfOpen if !probe_taken && circuit.probe_by.as_deref() == Some(me) => {
            room.min(1)
        }
        CircuitState::HalfOpen => 0,
    }
}

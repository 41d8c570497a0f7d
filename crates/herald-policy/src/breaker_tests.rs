//! The circuit breaker's transitions: every arrow, its boundaries, and
//! properties over arbitrary batches.

use std::time::Duration;

use proptest::prelude::*;

use crate::breaker::*;

const T0: Millis = 1_700_000_000_000;
const MIN: i64 = 60_000;

fn rule() -> BreakerRule {
    BreakerRule {
        min_attempts: 20,
        window: Duration::from_secs(60),
        failure_rate: 0.5,
        cooldown: Duration::from_secs(30),
        max_cooldown: Duration::from_secs(600),
    }
}

fn seen(attempts: u32, failures: u32, last_succeeded: bool) -> Seen {
    Seen {
        attempts,
        failures,
        last_succeeded,
    }
}

fn open_at(now: Millis, cooldown_ms: i64) -> Circuit {
    Circuit {
        state: CircuitState::Open,
        since: Some(now),
        until: Some(now + cooldown_ms),
        cooldown_ms,
        ..Circuit::default()
    }
}

#[test]
fn opens_at_the_minimum_and_the_rate_not_before() {
    let c = Circuit::default();
    // 19 attempts, all failed: too few.
    let (c19, t) = step(&rule(), &c, &seen(19, 19, false), T0);
    assert_eq!((c19.state, t), (CircuitState::Closed, None));
    // The 20th: open, for the first cooldown.
    let (c20, t) = step(&rule(), &c19, &seen(1, 1, false), T0 + 10);
    assert_eq!(c20.state, CircuitState::Open);
    assert_eq!(c20.until, Some(T0 + 10 + 30_000));
    assert_eq!(c20.cooldown_ms, 30_000);
    assert_eq!(
        t,
        Some(Transition::Opened {
            attempts: 20,
            failures: 20,
            failure_rate: 1.0
        })
    );
    // 20 attempts, 9 failed: 45 % stays closed; 10 failed (50 %) opens.
    let (c, t) = step(&rule(), &Circuit::default(), &seen(20, 9, true), T0);
    assert_eq!((c.state, t.is_some()), (CircuitState::Closed, false));
    let (c, _) = step(&rule(), &Circuit::default(), &seen(20, 10, true), T0);
    assert_eq!(c.state, CircuitState::Open);
}

#[test]
fn old_attempts_leave_the_window() {
    let (c, _) = step(&rule(), &Circuit::default(), &seen(15, 15, false), T0);
    // Two windows later nothing of them is left: 15 more do not open it.
    let (c, t) = step(&rule(), &c, &seen(15, 15, false), T0 + 2 * MIN + 1);
    assert_eq!((c.state, t), (CircuitState::Closed, None));
    // Half a window after their window ended, about half of them count:
    // 15 + 7.5 ≥ 20.
    let (c, _) = step(&rule(), &Circuit::default(), &seen(15, 15, false), T0);
    let (c, t) = step(&rule(), &c, &seen(15, 15, false), T0 + MIN + MIN / 2);
    assert_eq!(c.state, CircuitState::Open, "{c:?}");
    assert!(t.is_some());
}

#[test]
fn open_ignores_late_answers_and_probes_only_after_the_cooldown() {
    let c = open_at(T0, 30_000);
    let (same, t) = step(&rule(), &c, &seen(5, 0, true), T0 + 1_000);
    assert_eq!((same, t), (c.clone(), None));
    let lease = Duration::from_secs(120);
    assert_eq!(probe(&c, T0 + 29_999, lease, "p1"), None);
    let won = probe(&c, T0 + 30_000, lease, "p1").expect("cooldown over");
    assert_eq!(won.state, CircuitState::HalfOpen);
    assert_eq!(won.since, Some(T0 + 30_000));
    assert_eq!(won.probe_by.as_deref(), Some("p1"));
    // Nobody else may probe until the winner's probe has had a lease.
    assert_eq!(probe(&won, T0 + 30_000 + 119_999, lease, "p2"), None);
    let again = probe(&won, T0 + 150_000, lease, "p2").expect("the winner went silent");
    assert_eq!(again.probe_by.as_deref(), Some("p2"));
    assert_eq!(probe(&Circuit::default(), T0, lease, "p1"), None);
}

#[test]
fn a_probe_success_closes_a_failure_reopens_doubled_up_to_the_cap() {
    let half = probe(&open_at(T0, 30_000), T0 + 30_000, Duration::ZERO, "p").expect("probe");
    let (closed, t) = step(&rule(), &half, &seen(1, 0, true), T0 + 30_100);
    assert_eq!(closed.state, CircuitState::Closed);
    assert_eq!(closed.cooldown_ms, 0, "cooldown reset");
    assert_eq!(closed.window.attempts, 0, "a fresh window");
    assert_eq!(t, Some(Transition::Closed));
    let (reopened, t) = step(&rule(), &half, &seen(1, 1, false), T0 + 30_100);
    assert_eq!(t, Some(Transition::Reopened));
    assert_eq!(reopened.state, CircuitState::Open);
    assert_eq!(reopened.cooldown_ms, 60_000);
    assert_eq!(reopened.until, Some(T0 + 30_100 + 60_000));
    // Doubling stops at max_cooldown.
    let mut c = reopened;
    for _ in 0..10 {
        let now = c.until.expect("open");
        let half = probe(&c, now, Duration::ZERO, "p").expect("probe");
        c = step(&rule(), &half, &seen(1, 1, false), now).0;
    }
    assert_eq!(c.cooldown_ms, 600_000);
    // After a close, the next opening starts from the first cooldown again.
    let (c, _) = step(&rule(), &closed, &seen(20, 20, false), T0 + 40_000);
    assert_eq!(c.cooldown_ms, 30_000);
}

#[test]
fn the_last_answer_of_a_half_open_batch_decides() {
    let half = probe(&open_at(T0, 1), T0 + 1, Duration::ZERO, "p").expect("probe");
    assert_eq!(
        step(&rule(), &half, &seen(2, 1, true), T0 + 2).0.state,
        CircuitState::Closed
    );
    assert_eq!(
        step(&rule(), &half, &seen(2, 1, false), T0 + 2).0.state,
        CircuitState::Open
    );
    // An empty batch changes nothing.
    assert_eq!(step(&rule(), &half, &Seen::default(), T0 + 2).0, half);
}

#[test]
fn off_never_opens_and_forgets_a_stored_state() {
    let off = BreakerRule::OFF;
    assert!(off.is_off());
    let (c, t) = step(&off, &Circuit::default(), &seen(1000, 1000, false), T0);
    assert_eq!((c.state, t), (CircuitState::Closed, None));
    let (c, _) = step(&off, &open_at(T0, 30_000), &seen(1, 1, false), T0);
    assert_eq!(c, Circuit::default());
}

#[test]
fn room_follows_the_state() {
    let half = probe(&open_at(T0, 1), T0 + 1, Duration::ZERO, "me").expect("probe");
    assert_eq!(room(&Circuit::default(), "me", false, 128), 128);
    assert_eq!(room(&open_at(T0, 1), "me", false, 128), 0);
    assert_eq!(room(&half, "me", false, 128), 1);
    assert_eq!(room(&half, "me", true, 128), 0, "the probe is taken");
    assert_eq!(
        room(&half, "other", false, 128),
        0,
        "another process's probe"
    );
    assert_eq!(room(&half, "me", false, 0), 0);
}

#[test]
fn rates_parse_as_percentages_or_fractions() {
    assert_eq!(parse_rate("50%"), Ok(0.5));
    assert_eq!(parse_rate(" 0.5 "), Ok(0.5));
    assert_eq!(parse_rate("12.5 %"), Ok(0.125));
    assert_eq!(parse_rate("100%"), Ok(1.0));
    assert!(parse_rate("0").is_err(), "0 opens it with no failure");
    assert!(parse_rate("0%").is_err());
    assert_eq!(parse_rate("0.1%"), Ok(0.001));
    for bad in ["", "%", "half", "150%", "1.5", "-0.1", "NaN", "inf"] {
        assert!(parse_rate(bad).is_err(), "{bad}");
    }
}

fn circuit() -> impl Strategy<Value = Circuit> {
    (
        0i16..3,
        proptest::option::of(0i64..1_000_000),
        proptest::option::of(0i64..2_000_000),
        0i64..1_000_000,
        (0u32..50, 0u32..50, 0u32..50, 0u32..50, 0i64..200_000),
    )
        .prop_map(
            |(s, since, until, cooldown_ms, (a, f, pa, pf, w))| Circuit {
                state: CircuitState::from_code(i64::from(s)),
                since: since.map(|x| T0 + x),
                until: until.map(|x| T0 + x),
                cooldown_ms,
                probe_by: (s == 2).then(|| "p".to_owned()),
                window: WindowCounts {
                    started_at: if w == 0 { 0 } else { T0 + w },
                    attempts: a,
                    failures: f.min(a),
                    prev_attempts: pa,
                    prev_failures: pf.min(pa),
                },
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Whatever the state and batch: the cooldown stays within the rule's
    /// bounds, an open breaker has an end, a closed one never opens on
    /// fewer than `min_attempts` attempts, and only half-open closes.
    #[test]
    fn transitions_keep_the_rules(
        c in circuit(),
        attempts in 0u32..60,
        failed in 0u32..60,
        last in any::<bool>(),
        dt in 0i64..400_000,
    ) {
        let failures = failed.min(attempts);
        let now = T0 + dt;
        let (next, t) = step(&rule(), &c, &seen(attempts, failures, last), now);
        if next.state == CircuitState::Open && c.state != CircuitState::Open {
            let until = next.until.expect("a breaker that opens has an end");
            prop_assert!(until > now);
        }
        if t.is_some() {
            prop_assert!(next.cooldown_ms <= 600_000);
            prop_assert!(next.state == CircuitState::Closed || next.cooldown_ms >= 30_000);
        }
        match t {
            Some(Transition::Opened { attempts: n, failure_rate, .. }) => {
                prop_assert_eq!(c.state, CircuitState::Closed);
                prop_assert!(n >= 20);
                prop_assert!(failure_rate >= 0.5);
            }
            Some(Transition::Closed | Transition::Reopened) => {
                prop_assert_eq!(c.state, CircuitState::HalfOpen);
            }
            None => prop_assert!(next.state == c.state),
        }
        if c.state == CircuitState::Closed && attempts < 20 && c.window == WindowCounts::default() {
            prop_assert_eq!(next.state, CircuitState::Closed);
        }
    }

    /// The estimated rate is a share, and the window never counts more
    /// than it was given.
    #[test]
    fn the_window_estimate_is_bounded(c in circuit(), dt in 0i64..400_000) {
        let now = T0 + dt;
        let rate = c.window.failure_rate(rule().window, now);
        prop_assert!((0.0..=1.0).contains(&rate));
        let (a, f) = c.window.estimate(rule().window, now);
        prop_assert!(f <= a + 1e-9);
        prop_assert!(a <= f64::from(c.window.attempts + c.window.prev_attempts) + 1e-9);
    }

    /// Exactly one of any number of would-be probers wins from a state,
    /// in a compare-and-set: each one's winning state differs from what
    /// it read, so the next one's compare fails.
    #[test]
    fn a_won_probe_is_not_the_state_it_was_won_from(c in circuit(), dt in 0i64..400_000) {
        let now = T0 + dt;
        if let Some(won) = probe(&c, now, Duration::from_secs(120), "p9") {
            prop_assert_ne!(&won, &c);
            prop_assert_eq!(won.state, CircuitState::HalfOpen);
            prop_assert_eq!(room(&won, "p9", false, 64), 1);
            prop_assert_eq!(room(&won, "p8", false, 64), 0);
        }
    }

    #[test]
    fn parse_rate_never_panics(s in ".{0,12}") {
        if let Ok(r) = parse_rate(&s) {
            prop_assert!((0.0..=1.0).contains(&r));
        }
    }
}

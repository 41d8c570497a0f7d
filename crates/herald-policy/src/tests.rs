use super::*;

const MIN: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);

fn policy(jitter: Jitter) -> RetryPolicy {
    RetryPolicy {
        jitter,
        ..RetryPolicy::default()
    }
}

fn status(code: u16) -> Outcome {
    Outcome::Response {
        status: code,
        retry_after: None,
    }
}

fn status_hint(code: u16, secs: u64) -> Outcome {
    Outcome::Response {
        status: code,
        retry_after: Some(Duration::from_secs(secs)),
    }
}

#[test]
fn classify_every_status_class_and_its_boundaries() {
    for code in [100, 101, 199] {
        assert_eq!(classify_status(code), StatusClass::Permanent, "{code}");
    }
    for code in [200, 201, 202, 204, 299] {
        assert_eq!(classify_status(code), StatusClass::Success, "{code}");
    }
    for code in [300, 301, 302, 304, 307, 308, 399] {
        assert_eq!(classify_status(code), StatusClass::Permanent, "{code}");
    }
    for code in [400, 401, 403, 404, 409, 410, 413, 422, 428, 430, 499] {
        assert_eq!(classify_status(code), StatusClass::Permanent, "{code}");
    }
    // 407 comes from the egress proxy (`HERALD_PROXY_URL`), never from
    // the receiver: a proxy refusing its credentials says nothing of it.
    for code in [407, 408, 429] {
        assert_eq!(classify_status(code), StatusClass::Retryable, "{code}");
    }
    for code in [500, 502, 503, 504, 599] {
        assert_eq!(classify_status(code), StatusClass::Retryable, "{code}");
    }
    for code in [0, 600, 999] {
        assert_eq!(classify_status(code), StatusClass::Permanent, "{code}");
    }
}

#[test]
fn success_is_delivered_whatever_the_attempt_or_age() {
    let p = policy(Jitter::None);
    for attempt in [1, 7, 100] {
        for age in [Duration::ZERO, p.max_age, p.max_age * 10] {
            assert_eq!(
                decide(&p, &status(200), attempt, age, 0.5),
                Decision::Delivered
            );
        }
    }
}

#[test]
fn permanent_statuses_die_after_one_attempt() {
    let p = policy(Jitter::None);
    for code in [301, 302, 400, 401, 404, 410, 422] {
        assert_eq!(
            decide(&p, &status(code), 1, Duration::ZERO, 0.5),
            Decision::Dead(DeadReason::PermanentStatus),
            "{code}"
        );
    }
}

#[test]
fn retryable_outcomes_follow_the_schedule_exactly_without_jitter() {
    let p = policy(Jitter::None);
    let outcomes = [
        status(500),
        status(502),
        status(408),
        status(429),
        Outcome::NetworkError,
        Outcome::Timeout,
    ];
    for outcome in &outcomes {
        for (i, expected) in p.schedule.iter().enumerate() {
            let attempt = u32::try_from(i + 1).expect("small");
            assert_eq!(
                decide(&p, outcome, attempt, Duration::ZERO, 0.5),
                Decision::Retry { delay: *expected },
                "{outcome:?} attempt {attempt}"
            );
        }
    }
}

#[test]
fn default_schedule_is_the_brief_and_gives_seven_attempts() {
    let p = RetryPolicy::default();
    assert_eq!(
        p.schedule,
        vec![MIN, 5 * MIN, 30 * MIN, 2 * HOUR, 6 * HOUR, 12 * HOUR]
    );
    assert_eq!(p.max_attempts(), 7);
    assert_eq!(p.max_age, 24 * HOUR);
    assert_eq!(p.jitter, Jitter::Full);
}

#[test]
fn failure_of_the_last_scheduled_attempt_is_exhausted() {
    let p = policy(Jitter::None);
    // Attempt 6 still has a delay (12h) before attempt 7...
    assert_eq!(
        decide(&p, &status(500), 6, Duration::ZERO, 0.0),
        Decision::Retry { delay: 12 * HOUR }
    );
    // ...and attempt 7 is the last.
    assert_eq!(
        decide(&p, &status(500), 7, Duration::ZERO, 0.0),
        Decision::Dead(DeadReason::Exhausted)
    );
    assert_eq!(
        decide(&p, &Outcome::NetworkError, 8, Duration::ZERO, 0.0),
        Decision::Dead(DeadReason::Exhausted)
    );
}

#[test]
fn attempt_zero_is_treated_as_exhausted_rather_than_panicking() {
    let p = policy(Jitter::None);
    assert_eq!(
        decide(&p, &status(500), 0, Duration::ZERO, 0.0),
        Decision::Dead(DeadReason::Exhausted)
    );
}

#[test]
fn empty_schedule_means_one_attempt() {
    let p = RetryPolicy {
        schedule: vec![],
        ..policy(Jitter::None)
    };
    assert_eq!(p.max_attempts(), 1);
    assert_eq!(
        decide(&p, &status(503), 1, Duration::ZERO, 0.0),
        Decision::Dead(DeadReason::Exhausted)
    );
}

#[test]
fn age_one_second_under_the_cap_retries_and_over_it_dies() {
    let p = policy(Jitter::None);
    let under = p.max_age - Duration::from_secs(1);
    assert_eq!(
        decide(&p, &status(500), 1, under, 0.0),
        // The 1 minute delay is capped to the one second left.
        Decision::Retry {
            delay: Duration::from_secs(1)
        }
    );
    let over = p.max_age + Duration::from_secs(1);
    assert_eq!(
        decide(&p, &status(500), 1, over, 0.0),
        Decision::Dead(DeadReason::TooOld)
    );
    // Exactly at the cap there is no time left to retry in.
    assert_eq!(
        decide(&p, &status(500), 1, p.max_age, 0.0),
        Decision::Dead(DeadReason::TooOld)
    );
}

#[test]
fn too_old_wins_over_exhausted_but_not_over_permanent() {
    let p = policy(Jitter::None);
    let old = p.max_age * 2;
    assert_eq!(
        decide(&p, &status(500), 99, old, 0.0),
        Decision::Dead(DeadReason::TooOld)
    );
    assert_eq!(
        decide(&p, &status(404), 1, old, 0.0),
        Decision::Dead(DeadReason::PermanentStatus)
    );
}

#[test]
fn retry_after_replaces_the_schedule_on_429_and_503_only() {
    let p = policy(Jitter::Full);
    for code in [429, 503] {
        assert_eq!(
            decide(&p, &status_hint(code, 7), 1, Duration::ZERO, 0.0),
            Decision::Retry {
                delay: Duration::from_secs(7)
            },
            "{code}"
        );
        // A hint longer than the scheduled step is honoured too.
        assert_eq!(
            decide(&p, &status_hint(code, 3 * 3600), 1, Duration::ZERO, 0.0),
            Decision::Retry { delay: 3 * HOUR },
            "{code}"
        );
    }
    for code in [500, 502, 504, 408] {
        assert_eq!(
            decide(&p, &status_hint(code, 7), 1, Duration::ZERO, 1.0),
            Decision::Retry { delay: MIN },
            "{code} ignores the hint"
        );
    }
}

#[test]
fn retry_after_never_shortens_the_scheduled_step() {
    let p = policy(Jitter::None);
    // `Retry-After: 0` (or an HTTP date in the past, parsed as zero) waits the
    // step, at every attempt of the schedule: the schedule is not spent at once.
    for (attempt, step) in (1u32..).zip(p.schedule.clone()) {
        assert_eq!(
            decide(&p, &status_hint(429, 0), attempt, Duration::ZERO, 0.0),
            Decision::Retry { delay: step },
            "attempt {attempt}"
        );
    }
    // A hint shorter than the step waits the step; a longer one is obeyed.
    assert_eq!(
        decide(&p, &status_hint(503, 30), 2, Duration::ZERO, 0.0),
        Decision::Retry { delay: 5 * MIN }
    );
    assert_eq!(
        decide(&p, &status_hint(503, 600), 2, Duration::ZERO, 0.0),
        Decision::Retry { delay: 10 * MIN }
    );
    // With full jitter the floor is the jittered step.
    let full = policy(Jitter::Full);
    assert_eq!(
        decide(&full, &status_hint(429, 0), 2, Duration::ZERO, 0.5),
        Decision::Retry {
            delay: Duration::from_secs(150)
        }
    );
    let past = parse_retry_after("Wed, 21 Oct 2015 07:00:00 GMT", SystemTime::now());
    assert_eq!(past, Some(Duration::ZERO));
    assert_eq!(
        decide(
            &p,
            &Outcome::Response {
                status: 429,
                retry_after: past
            },
            3,
            Duration::ZERO,
            0.0
        ),
        Decision::Retry { delay: 30 * MIN }
    );
}

#[test]
fn retry_after_is_capped_by_the_age_limit() {
    let p = policy(Jitter::None);
    let age = p.max_age - 10 * MIN;
    assert_eq!(
        decide(&p, &status_hint(429, 48 * 3600), 1, age, 0.0),
        Decision::Retry { delay: 10 * MIN }
    );
}

#[test]
fn retry_after_does_not_extend_the_number_of_attempts() {
    let p = policy(Jitter::None);
    assert_eq!(
        decide(&p, &status_hint(429, 1), 7, Duration::ZERO, 0.0),
        Decision::Dead(DeadReason::Exhausted)
    );
}

#[test]
fn full_jitter_spans_zero_to_the_scheduled_delay() {
    let p = policy(Jitter::Full);
    assert_eq!(
        decide(&p, &status(500), 2, Duration::ZERO, 0.0),
        Decision::Retry {
            delay: Duration::ZERO
        }
    );
    assert_eq!(
        decide(&p, &status(500), 2, Duration::ZERO, 0.5),
        Decision::Retry {
            delay: Duration::from_secs(150)
        }
    );
    let Decision::Retry { delay } = decide(&p, &status(500), 2, Duration::ZERO, 0.999_999) else {
        panic!("expected a retry");
    };
    assert!(delay <= 5 * MIN && delay > Duration::from_secs(299));
}

#[test]
fn equal_jitter_spans_half_to_the_full_delay() {
    let d = Duration::from_secs(100);
    assert_eq!(Jitter::Equal.apply(d, 0.0), Duration::from_secs(50));
    assert_eq!(Jitter::Equal.apply(d, 0.5), Duration::from_secs(75));
    assert_eq!(Jitter::Equal.apply(d, 1.0), d);
}

#[test]
fn jitter_clamps_bad_samples() {
    let d = Duration::from_secs(100);
    assert_eq!(Jitter::Full.apply(d, -1.0), Duration::ZERO);
    assert_eq!(Jitter::Full.apply(d, 2.0), d);
    assert_eq!(Jitter::Full.apply(d, f64::NAN), Duration::ZERO);
    assert_eq!(Jitter::None.apply(d, 0.3), d);
}

#[test]
fn jitter_parses_its_three_names() {
    assert_eq!("full".parse::<Jitter>(), Ok(Jitter::Full));
    assert_eq!("EQUAL".parse::<Jitter>(), Ok(Jitter::Equal));
    assert_eq!(" none ".parse::<Jitter>(), Ok(Jitter::None));
    assert!("random".parse::<Jitter>().is_err());
}

#[test]
fn retry_after_parses_delta_seconds() {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    assert_eq!(parse_retry_after("0", now), Some(Duration::ZERO));
    assert_eq!(
        parse_retry_after("120", now),
        Some(Duration::from_secs(120))
    );
    assert_eq!(parse_retry_after(" 5 ", now), Some(Duration::from_secs(5)));
    assert_eq!(
        parse_retry_after("99999999999999999999999", now),
        Some(Duration::from_secs(u64::MAX))
    );
}

#[test]
fn retry_after_parses_http_dates_in_the_future_and_past() {
    let now = httpdate::parse_http_date("Wed, 21 Oct 2015 07:28:00 GMT").expect("valid date");
    assert_eq!(
        parse_retry_after("Wed, 21 Oct 2015 07:30:00 GMT", now),
        Some(Duration::from_secs(120))
    );
    assert_eq!(
        parse_retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now),
        Some(Duration::ZERO)
    );
}

#[test]
fn retry_after_rejects_garbage() {
    let now = SystemTime::UNIX_EPOCH;
    for bad in ["", "  ", "-1", "1.5", "soon", "12s", "Wed, 99 Oct 2015"] {
        assert_eq!(parse_retry_after(bad, now), None, "{bad:?}");
    }
}

#[test]
fn durations_parse_every_unit() {
    assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
    assert_eq!(parse_duration("5m"), Ok(5 * MIN));
    assert_eq!(parse_duration("2h"), Ok(2 * HOUR));
    assert_eq!(parse_duration("1d"), Ok(24 * HOUR));
    assert_eq!(parse_duration(" 0s "), Ok(Duration::ZERO));
    assert_eq!(parse_duration("36500d"), Ok(LONGEST_DURATION));
}

#[test]
fn durations_reject_missing_or_unknown_units() {
    for bad in [
        "",
        "10",
        "s",
        "10x",
        "1.5s",
        "-1s",
        "10 s",
        "99999999999999999999d",
        "99999999999d",
        "36501d",
    ] {
        assert!(parse_duration(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn schedules_parse_lists_and_empty() {
    assert_eq!(
        parse_schedule("1m,5m,30m,2h,6h,12h"),
        Ok(RetryPolicy::default().schedule)
    );
    assert_eq!(parse_schedule(""), Ok(vec![]));
    assert_eq!(
        parse_schedule("10ms, 1s"),
        Ok(vec![Duration::from_millis(10), Duration::from_secs(1)])
    );
    assert!(parse_schedule("1m,,5m").is_err());
    assert!(parse_schedule("1m,five").is_err());
}

#[test]
fn dead_reasons_round_trip_their_names() {
    for r in [
        DeadReason::Exhausted,
        DeadReason::PermanentStatus,
        DeadReason::TooOld,
    ] {
        assert_eq!(DeadReason::parse(r.as_str()), Some(r));
    }
    assert_eq!(DeadReason::parse("bogus"), None);
}

const RULE: DisableRule = DisableRule {
    after: 50,
    min_window: HOUR,
};

#[test]
fn a_streak_disables_only_at_the_count_and_after_the_window() {
    assert_eq!(should_disable(&RULE, false, 49, 2 * HOUR), None);
    assert_eq!(should_disable(&RULE, false, 50, HOUR - MIN), None);
    assert_eq!(
        should_disable(&RULE, false, 50, HOUR),
        Some(DisableCause::FailingStreak {
            failures: 50,
            lasted: HOUR
        })
    );
    assert!(should_disable(&RULE, false, 500, 3 * HOUR).is_some());
}

#[test]
fn a_zero_window_disables_on_the_count_alone() {
    let rule = DisableRule {
        after: 3,
        min_window: Duration::ZERO,
    };
    assert_eq!(should_disable(&rule, false, 2, Duration::ZERO), None);
    assert!(should_disable(&rule, false, 3, Duration::ZERO).is_some());
}

#[test]
fn no_streak_never_disables_even_with_a_zero_count() {
    let rule = DisableRule {
        after: 0,
        min_window: Duration::ZERO,
    };
    assert_eq!(should_disable(&rule, false, 0, HOUR), None);
}

#[test]
fn gone_disables_at_once_and_is_only_410() {
    assert_eq!(
        should_disable(&RULE, true, 0, Duration::ZERO),
        Some(DisableCause::Gone)
    );
    assert!(is_gone(Some(410)));
    for other in [None, Some(200), Some(404), Some(500), Some(411)] {
        assert!(!is_gone(other), "{other:?}");
    }
    assert_eq!(
        DisableCause::Gone.describe(),
        "the endpoint answered 410 Gone"
    );
    assert_eq!(
        DisableCause::FailingStreak {
            failures: 50,
            lasted: HOUR
        }
        .describe(),
        "50 consecutive failed attempts over 3600s"
    );
}

#[test]
fn a_prompt_endpoint_widens_its_lane_to_the_cap_and_no_further() {
    let rule = LaneRule::for_cap(64);
    assert_eq!(rule.start, 4);
    let mut lane = rule.start;
    for _ in 0..100 {
        lane = next_lane(&rule, lane, Duration::from_millis(3), true);
    }
    assert_eq!(lane, 64);
    assert_eq!(
        next_lane(&LaneRule::for_cap(2), 2, Duration::ZERO, false),
        2
    );
    assert_eq!(LaneRule::for_cap(2).start, 2, "never more than the cap");
}

#[test]
fn a_slow_endpoint_narrows_only_while_others_want_slots() {
    let rule = LaneRule::for_cap(64);
    let slow = Duration::from_secs(5);
    assert_eq!(next_lane(&rule, 64, slow, true), 32);
    assert_eq!(next_lane(&rule, 1, slow, true), 1, "never below one");
    assert_eq!(next_lane(&rule, 32, slow, false), 33, "slack is used");
    // The boundary: exactly the prompt time is prompt.
    assert_eq!(next_lane(&rule, 8, rule.prompt_within, true), 9);
    assert_eq!(
        next_lane(
            &rule,
            8,
            rule.prompt_within + Duration::from_millis(1),
            true
        ),
        4
    );
}

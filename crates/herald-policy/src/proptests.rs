//! Property tests of the parsers of outside input in this crate:
//! `Retry-After` (a receiver's header), durations and schedules (the
//! operator's configuration and the CLI), jitter names and dead reasons.
//! Each property runs a bounded number of cases so the suite stays fast.

use std::time::{Duration, SystemTime};

use proptest::prelude::*;

use super::*;

/// The latest second an HTTP-date can name (31 Dec 9999 23:59:59 GMT).
const YEAR_9999_END: u64 = 253_402_300_799;

const UNITS: [(&str, u64); 5] = [
    ("ms", 1),
    ("s", 1_000),
    ("m", 60_000),
    ("h", 3_600_000),
    ("d", 86_400_000),
];

fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

/// Whitespace `str::trim` removes, as a header or an env var may carry it.
fn padding() -> impl Strategy<Value = String> {
    proptest::collection::vec(prop_oneof![Just(' '), Just('\t')], 0..3)
        .prop_map(|v| v.into_iter().collect())
}

fn unit() -> impl Strategy<Value = (&'static str, u64)> {
    proptest::sample::select(UNITS.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Any text at any time: no panic, and a value only for digits or a date.
    #[test]
    fn retry_after_never_panics(value in any::<String>(), now in 0..=YEAR_9999_END) {
        let parsed = parse_retry_after(&value, at(now));
        if parsed.is_some() {
            let t = value.trim();
            prop_assert!(
                t.bytes().all(|b| b.is_ascii_digit()) || httpdate::parse_http_date(t).is_ok(),
                "{value:?} parsed as {parsed:?}"
            );
        }
    }

    /// Header-ish ASCII (digits, date words, punctuation) is the input most
    /// likely to get half-way through the date parser.
    #[test]
    fn retry_after_never_panics_on_near_dates(
        value in "[0-9A-Za-z ,:+-]{0,40}",
        now in 0..=YEAR_9999_END,
    ) {
        let _ = parse_retry_after(&value, at(now));
    }

    /// delta-seconds: any u64, with leading zeros and padding, is exactly
    /// that many seconds.
    #[test]
    fn retry_after_delta_seconds_parse(
        secs in any::<u64>(),
        zeros in 0usize..4,
        pad_l in padding(),
        pad_r in padding(),
        now in 0..=YEAR_9999_END,
    ) {
        let value = format!("{pad_l}{}{secs}{pad_r}", "0".repeat(zeros));
        prop_assert_eq!(parse_retry_after(&value, at(now)), Some(Duration::from_secs(secs)));
    }

    /// Digit strings too long for u64 saturate instead of failing.
    #[test]
    fn retry_after_huge_delta_seconds_saturate(digits in "[1-9][0-9]{20,60}") {
        prop_assert_eq!(
            parse_retry_after(&digits, SystemTime::UNIX_EPOCH),
            Some(Duration::from_secs(u64::MAX))
        );
    }

    /// HTTP-date: any second from 1970 to 9999 formatted as an IMF-fixdate
    /// is the time until it, or zero when it has passed.
    #[test]
    fn retry_after_http_dates_parse(when in 0..=YEAR_9999_END, now in 0..=YEAR_9999_END) {
        let value = httpdate::fmt_http_date(at(when));
        let expected = Duration::from_secs(when.saturating_sub(now));
        prop_assert_eq!(parse_retry_after(&value, at(now)), Some(expected));
    }

    /// Signed, fractional or suffixed numbers are not delta-seconds: the
    /// schedule applies instead.
    #[test]
    fn retry_after_refuses_signed_fractional_or_suffixed_numbers(
        value in "([+-][0-9]{1,6}|[0-9]{1,6}\\.[0-9]{1,3}|[0-9]{1,6}[a-z]{1,3}|0x[0-9a-f]{1,6})",
    ) {
        prop_assert_eq!(parse_retry_after(&value, SystemTime::UNIX_EPOCH), None);
    }

    /// Text without a digit is never a delay (every HTTP-date has digits).
    #[test]
    fn retry_after_without_digits_is_none(value in "[^0-9]{0,40}") {
        prop_assert_eq!(parse_retry_after(&value, SystemTime::UNIX_EPOCH), None);
    }

    /// Whatever the hint, the delay `decide` schedules stays within the
    /// message's remaining age, and never below the scheduled step's floor.
    #[test]
    fn retry_after_delay_is_bounded_by_the_age_cap(
        value in prop_oneof![
            any::<u64>().prop_map(|n| n.to_string()),
            (0..=YEAR_9999_END).prop_map(|t| httpdate::fmt_http_date(at(t))),
            any::<String>(),
        ],
        status in prop_oneof![Just(429u16), Just(503u16), 500u16..600],
        attempt in 1u32..8,
        age_secs in 0u64..(24 * 3600),
        unit in 0.0f64..1.0,
    ) {
        let policy = RetryPolicy::default();
        let age = Duration::from_secs(age_secs);
        let hint = parse_retry_after(&value, at(1_700_000_000));
        let outcome = Outcome::Response { status, retry_after: hint };
        match decide(&policy, &outcome, attempt, age, unit) {
            Decision::Retry { delay } => prop_assert!(delay <= policy.max_age - age),
            Decision::Dead(_) => {}
            Decision::Delivered => prop_assert!(false, "a {status} is not a delivery"),
        }
    }

    /// Durations: `<n><unit>` with padding and leading zeros is n units,
    /// or an error (not a panic, not a wrapped value) when it overflows or
    /// passes the longest a setting takes.
    #[test]
    fn durations_round_trip_or_overflow(
        n in prop_oneof![0u64..100_000, any::<u64>()],
        (unit, millis_per) in unit(),
        zeros in 0usize..3,
        pad_l in padding(),
        pad_r in padding(),
    ) {
        let text = format!("{pad_l}{}{n}{unit}{pad_r}", "0".repeat(zeros));
        match n.checked_mul(millis_per).map(Duration::from_millis) {
            Some(d) if d <= LONGEST_DURATION => prop_assert_eq!(parse_duration(&text), Ok(d)),
            _ => prop_assert!(parse_duration(&text).is_err(), "{text:?} is too long"),
        }
    }

    /// Digit strings longer than u64 are an error, in every unit.
    #[test]
    fn durations_with_huge_numbers_are_errors(digits in "[1-9][0-9]{20,40}", (unit, _) in unit()) {
        let text = format!("{digits}{unit}");
        prop_assert!(parse_duration(&text).is_err(), "{text:?}");
    }

    /// Any text: no panic, and an accepted one is digits then a known unit.
    #[test]
    fn durations_never_panic_and_accept_only_their_shape(s in any::<String>()) {
        if let Ok(d) = parse_duration(&s) {
            let t = s.trim();
            let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
            let (digits, unit) = t.split_at(split);
            prop_assert!(!digits.is_empty(), "{s:?} → {d:?}");
            prop_assert!(UNITS.iter().any(|(u, _)| *u == unit), "{s:?} → {d:?}");
        }
    }

    /// Near-miss spellings (a sign, a fraction, a space, a capital, an
    /// unknown unit) are refused.
    #[test]
    fn durations_refuse_near_misses(
        value in "([+-][0-9]{1,5}(ms|s|m|h|d)|[0-9]{1,5}\\.[0-9]{1,2}(ms|s|m|h|d)|[0-9]{1,5} (ms|s|m|h|d)|[0-9]{1,5}(MS|S|M|H|D|us|ns|w|y|sec|min)|(ms|s|m|h|d)[0-9]{1,5}|[0-9]{1,5})",
    ) {
        prop_assert!(parse_duration(&value).is_err(), "{value:?}");
    }

    /// A schedule is its durations joined by commas (spaces allowed).
    #[test]
    fn schedules_round_trip(
        steps in proptest::collection::vec((0u64..10_000, unit(), padding()), 1..8),
    ) {
        let text = steps
            .iter()
            .map(|(n, (u, _), pad)| format!("{pad}{n}{u}"))
            .collect::<Vec<_>>()
            .join(",");
        let expected: Vec<Duration> = steps
            .iter()
            .map(|(n, (_, per), _)| Duration::from_millis(n * per))
            .collect();
        prop_assert_eq!(parse_schedule(&text), Ok(expected));
    }

    /// Any text: no panic, and an accepted schedule has one step per comma
    /// plus one (or is empty for blank text).
    #[test]
    fn schedules_never_panic(s in "[0-9mshd, .x-]{0,40}|\\PC{0,40}") {
        if let Ok(steps) = parse_schedule(&s) {
            let expected = if s.trim().is_empty() { 0 } else { s.matches(',').count() + 1 };
            prop_assert_eq!(steps.len(), expected);
        }
    }

    /// Jitter names: any case, any padding; nothing else.
    #[test]
    fn jitter_names_parse_in_any_case(
        (name, jitter) in proptest::sample::select(vec![
            ("full", Jitter::Full),
            ("equal", Jitter::Equal),
            ("none", Jitter::None),
        ]),
        upper in proptest::collection::vec(any::<bool>(), 5),
        pad_l in padding(),
        pad_r in padding(),
    ) {
        let cased: String = name
            .chars()
            .zip(upper)
            .map(|(c, up)| if up { c.to_ascii_uppercase() } else { c })
            .collect();
        prop_assert_eq!(format!("{pad_l}{cased}{pad_r}").parse::<Jitter>(), Ok(jitter));
    }

    #[test]
    fn jitter_refuses_other_text(s in any::<String>()) {
        let name = s.trim().to_ascii_lowercase();
        let known = ["full", "equal", "none"].contains(&name.as_str());
        prop_assert_eq!(s.parse::<Jitter>().is_ok(), known);
    }

    /// Jitter never lengthens a delay of any configurable size (up to
    /// u64::MAX milliseconds), whatever the random sample, NaN included.
    #[test]
    fn jitter_stays_within_the_step(
        millis in any::<u64>(),
        sample in prop_oneof![any::<f64>(), 0.0f64..1.0],
    ) {
        let delay = Duration::from_millis(millis);
        let full = Jitter::Full.apply(delay, sample);
        let equal = Jitter::Equal.apply(delay, sample);
        prop_assert!(full <= delay);
        prop_assert!(equal <= delay && equal >= delay / 2);
        prop_assert_eq!(Jitter::None.apply(delay, sample), delay);
    }

    /// Dead reasons: the four names and nothing else (stored text, and a
    /// query parameter of the API).
    #[test]
    fn dead_reasons_parse_only_their_names(s in any::<String>()) {
        match DeadReason::parse(&s) {
            Some(r) => prop_assert_eq!(r.as_str(), s.as_str()),
            None => prop_assert!(!["exhausted", "permanent_status", "too_old", "expunged"].contains(&s.as_str())),
        }
    }
}

/// Found by `jitter_stays_within_the_step`: a configurable step of about
/// 741,000 years came back a few nanoseconds longer from full jitter with
/// the sample clamped to 1 (f64 rounding in `Duration::mul_f64`).
#[test]
fn regression_full_jitter_of_a_huge_step_is_not_longer_than_the_step() {
    let delay = Duration::from_millis(23_396_638_309_393_245);
    for sample in [9.303_303_654_171_313e117, 1.0, 0.999_999_999_999_999_9] {
        assert!(Jitter::Full.apply(delay, sample) <= delay, "{sample}");
        assert!(Jitter::Equal.apply(delay, sample) <= delay, "{sample}");
    }
    let longest = Duration::from_millis(u64::MAX);
    assert!(Jitter::Full.apply(longest, 1.0) <= longest);
}

proptest! {
    /// Whatever the answers, a lane stays between one and the cap, and it
    /// moves by one up or by half down.
    #[test]
    fn a_lane_stays_within_one_and_the_cap(
        cap in 0usize..200,
        lane in 0usize..400,
        took_ms in 0u64..100_000,
        contended in any::<bool>(),
    ) {
        let rule = LaneRule::for_cap(cap);
        let next = next_lane(&rule, lane, Duration::from_millis(took_ms), contended);
        prop_assert!((1..=rule.cap).contains(&next), "{next} outside 1..={}", rule.cap);
        let was = lane.clamp(1, rule.cap);
        prop_assert!(next == (was + 1).min(rule.cap) || next == (was / 2).max(1));
    }
}

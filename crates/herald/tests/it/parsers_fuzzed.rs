//! Property tests of the API's parsers of outside input: typed ids, the
//! paging `iterator`, query strings, JSON bodies (the 1 MiB payload limit
//! and the 128-deep nesting limit), RFC 3339 times, and Herald's
//! signatures checked by the reference Standard Webhooks implementation.
//! The URL guard's properties are unit tests beside it (`net/proptests.rs`),
//! the retry policy's and the secret format's are in their crates.

use axum::extract::FromRequestParts;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use base64::Engine;
use herald::api::messages::nests_deeper_than;
use herald::api::{
    millis_of_rfc3339, parse_json, rfc3339, ApiQuery, ListParams, ListResponse, MAX_BODY_BYTES,
    MAX_PAYLOAD_BYTES, MAX_PAYLOAD_DEPTH,
};
use herald::ids::{AppId, AttemptId, DeliveryId, EndpointId, MsgId};
use herald_signing::{signature_header, Secret};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use crate::helpers::{spawn_stepped, TOKEN};

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        // No regression files from these: a failure becomes a plain test.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// The status an API error answers with.
fn status_of(e: herald::api::ApiError) -> StatusCode {
    e.into_response().status()
}

/// Runs the paging extractor on a raw query string, as a request would.
fn list_params(query: &str) -> Result<ListParams, StatusCode> {
    let request = axum::http::Request::builder()
        .uri(format!("/api/v1/app?{query}"))
        .body(())
        .map_err(|_| StatusCode::BAD_REQUEST)?;
    let (mut parts, ()) = request.into_parts();
    // The extractor does no I/O: its future is ready at once.
    futures::executor::block_on(ApiQuery::<ListParams>::from_request_parts(&mut parts, &()))
        .map(|q| q.0)
        .map_err(status_of)
}

fn form(value: &str) -> String {
    url::form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

/// JSON text nested `kinds.len()` deep, arrays and objects as `kinds`
/// says, with strings full of brackets beside each level.
fn nested_json(kinds: &[bool], noise: &str) -> String {
    let quoted = serde_json::to_string(noise).expect("a string");
    let mut open = String::new();
    let mut close = String::new();
    for &object in kinds {
        if object {
            open.push_str(&format!("{{{quoted}:"));
            close.insert(0, '}');
        } else {
            open.push_str(&format!("[{quoted},"));
            close.insert(0, ']');
        }
    }
    format!("{open}0{close}")
}

proptest! {
    #![proptest_config(config(256))]

    /// Ids: any text never panics; generated ids parse back as themselves
    /// and as no other kind; an accepted id is its prefix and 26 ULID
    /// characters.
    #[test]
    fn ids_parse_only_their_own_shape(s in prop_oneof![
        any::<String>(),
        "(app|ep|msg|dlv|atmpt)_[0-9A-Za-z]{24,28}",
    ]) {
        for (prefix, ok) in [
            (AppId::PREFIX, AppId::parse(&s).is_some()),
            (EndpointId::PREFIX, EndpointId::parse(&s).is_some()),
            (MsgId::PREFIX, MsgId::parse(&s).is_some()),
            (DeliveryId::PREFIX, DeliveryId::parse(&s).is_some()),
            (AttemptId::PREFIX, AttemptId::parse(&s).is_some()),
        ] {
            if ok {
                let rest = s.strip_prefix(prefix).expect("the prefix");
                prop_assert_eq!(rest.len(), 26);
                prop_assert!(rest.bytes().all(|b| b.is_ascii_alphanumeric()));
            }
        }
    }

    #[test]
    fn generated_ids_round_trip(_n in 0u8..1) {
        let app = AppId::generate();
        let msg = MsgId::generate();
        prop_assert_eq!(AppId::parse(app.as_str()), Some(app.clone()));
        prop_assert_eq!(MsgId::parse(msg.as_str()), Some(msg.clone()));
        prop_assert_eq!(MsgId::parse(app.as_str()), None);
        prop_assert_eq!(EndpointId::parse(msg.as_str()), None);
    }

    /// Any query string: the paging extractor never panics, and answers
    /// 200-worthy values, a 400 or a 422, nothing else.
    #[test]
    fn any_query_string_is_parsed_or_refused(
        query in prop_oneof![
            "[a-z=&%0-9A-F+.~_-]{0,60}",
            "(limit|iterator|order)=(%[0-9A-Fa-f]{2}|[a-z0-9+-]){0,12}(&(limit|iterator|order)=[0-9a-z%-]{0,8})?",
        ],
    ) {
        match list_params(&query) {
            Ok(params) => {
                if let Some(it) = &params.iterator {
                    prop_assert!(!it.chars().any(char::is_control), "{query:?}");
                }
                match params.page(true) {
                    Ok(page) => prop_assert!((1..=250).contains(&page.limit)),
                    Err(e) => prop_assert_eq!(status_of(e), StatusCode::UNPROCESSABLE_ENTITY),
                }
            }
            Err(status) => prop_assert!(
                status == StatusCode::BAD_REQUEST || status == StatusCode::UNPROCESSABLE_ENTITY,
                "{query:?} → {status}"
            ),
        }
    }

    /// Iterators: any text without control characters, form-encoded,
    /// comes back exactly, and a leading '-' turns the page backwards.
    /// Control characters are a 422, invalid UTF-8 a 400.
    #[test]
    fn iterators_round_trip_through_the_query_string(
        it in "\\PC{1,40}",
        limit in 1usize..=250,
        descending in any::<bool>(),
    ) {
        let order = if descending { "descending" } else { "ascending" };
        let query = format!("limit={limit}&order={order}&iterator={}", form(&it));
        let params = list_params(&query).expect("a valid query");
        prop_assert_eq!(params.iterator.as_deref(), Some(it.as_str()));
        let page = params.page(true).expect("a valid page");
        prop_assert_eq!(page.limit, limit);
        prop_assert_eq!(page.ascending, !descending);
        match it.strip_prefix('-') {
            Some(rest) => {
                prop_assert_eq!(page.after.as_deref(), Some(rest));
                prop_assert!(page.backwards);
            }
            None => {
                prop_assert_eq!(page.after.as_deref(), Some(it.as_str()));
                prop_assert!(!page.backwards);
            }
        }
    }

    #[test]
    fn iterators_with_control_characters_or_bad_utf8_are_refused(
        head in "[a-z_]{0,8}",
        bad in prop_oneof![
            (0u8..0x20).prop_map(|b| (format!("%{b:02X}"), StatusCode::UNPROCESSABLE_ENTITY)),
            Just(("%7F".to_owned(), StatusCode::UNPROCESSABLE_ENTITY)),
            Just(("%C2%85".to_owned(), StatusCode::UNPROCESSABLE_ENTITY)),
            (0x80u8..=0xff).prop_map(|b| (format!("%{b:02X}"), StatusCode::BAD_REQUEST)),
            Just(("%C3%28".to_owned(), StatusCode::BAD_REQUEST)),
            Just(("%ED%A0%80".to_owned(), StatusCode::BAD_REQUEST)),
        ],
    ) {
        let (escaped, status) = bad;
        let query = format!("iterator={head}{escaped}");
        prop_assert_eq!(list_params(&query).err(), Some(status), "{}", query);
    }

    /// A list's `iterator` and `prevIterator`, passed back, page on from
    /// its last item and back from its first.
    #[test]
    fn list_envelopes_hand_back_iterators_that_parse(n in 1usize..5) {
        let ids: Vec<MsgId> = (0..n).map(|_| MsgId::generate()).collect();
        let list = ListResponse::new(ids.clone(), true, |id: &MsgId| id.to_string());
        let next = list.iterator.clone().expect("an iterator");
        let prev = list.prev_iterator.clone().expect("a prevIterator");
        let page = list_params(&format!("iterator={}", form(&next)))
            .expect("valid")
            .page(true)
            .expect("valid");
        prop_assert_eq!(page.after.as_deref(), Some(ids[n - 1].as_str()));
        prop_assert!(!page.backwards);
        let page = list_params(&format!("iterator={}", form(&prev)))
            .expect("valid")
            .page(true)
            .expect("valid");
        prop_assert_eq!(page.after.as_deref(), Some(ids[0].as_str()));
        prop_assert!(page.backwards);
    }

    /// `limit`: 1..=250 and nothing else.
    #[test]
    fn limits_outside_the_range_are_a_422(limit in prop_oneof![Just(0u64), 251u64..u64::MAX]) {
        let params = list_params(&format!("limit={limit}")).expect("a valid query");
        prop_assert_eq!(params.page(true).err().map(status_of), Some(StatusCode::UNPROCESSABLE_ENTITY));
    }

    /// Any bytes as a JSON body: no panic; a 400 (not JSON), or a 422 (not
    /// an object, or a field of the wrong type), or a value.
    #[test]
    fn any_body_is_parsed_or_refused(body in prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..200),
        "[\\[\\]{}\":,0-9a-z ]{0,80}".prop_map(String::into_bytes),
    ]) {
        match parse_json::<serde_json::Value>(&body) {
            Ok(value) => prop_assert!(value.is_object()),
            Err(e) => {
                let status = status_of(e);
                prop_assert!(
                    status == StatusCode::BAD_REQUEST || status == StatusCode::UNPROCESSABLE_ENTITY,
                    "{status}"
                );
            }
        }
    }

    /// Nesting: counted exactly, outside strings only, for arrays and
    /// objects mixed; and whatever is accepted, serde_json with its
    /// default limits reads back (receivers parse with it, as does Herald).
    #[test]
    fn nesting_depth_is_counted_exactly(
        kinds in prop_oneof![
            proptest::collection::vec(any::<bool>(), 1..300),
            proptest::collection::vec(any::<bool>(), 120..136),
        ],
        noise in "[\\[\\]{}\"\\\\a ]{0,6}",
    ) {
        let json = nested_json(&kinds, &noise);
        let depth = kinds.len();
        prop_assert_eq!(nests_deeper_than(&json, MAX_PAYLOAD_DEPTH), depth > MAX_PAYLOAD_DEPTH);
        if !nests_deeper_than(&json, MAX_PAYLOAD_DEPTH) {
            // Inside the request body, the payload is one level down.
            let body = format!(r#"{{"payload":{json}}}"#);
            prop_assert!(
                serde_json::from_str::<serde_json::Value>(&json).is_ok(),
                "depth {depth} accepted but not readable by serde_json"
            );
            prop_assert!(
                serde_json::from_str::<serde::de::IgnoredAny>(&body).is_ok(),
                "depth {depth} accepted but its body is not readable"
            );
        }
    }

    /// RFC 3339 times (query parameters): any text never panics, every
    /// millisecond of years 0000 to 9999 round-trips, any i64 formats.
    #[test]
    fn rfc3339_times_round_trip(
        ms in -62_167_219_200_000i64..=253_402_300_799_999,
        any_ms in any::<i64>(),
        text in "\\PC{0,40}|[0-9T:Z.+-]{0,30}",
    ) {
        prop_assert_eq!(millis_of_rfc3339(&rfc3339(ms)), Some(ms));
        let _ = rfc3339(any_ms);
        let _ = millis_of_rfc3339(&text);
    }
}

/// Herald's `webhook-signature` verifies with the reference Standard
/// Webhooks implementation for any key, id and body; any single-byte change
/// of the body, or another timestamp, fails it.
#[test]
fn signatures_verify_with_the_reference_implementation() {
    let mut runner = TestRunner::new(Config {
        cases: 128,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (
        proptest::collection::vec(any::<u8>(), 24..=64),
        proptest::collection::vec(proptest::collection::vec(any::<u8>(), 24..=64), 0..3),
        "\\PC{0,300}",
        any::<prop::sample::Index>(),
        1u8..0x7f,
    );
    runner
        .run(&strategy, |(key, old_keys, body, at, flip)| {
            let b64 = base64::engine::general_purpose::STANDARD;
            let secret = Secret::parse(&format!("whsec_{}", b64.encode(&key))).expect("valid");
            let old: Vec<Secret> = old_keys
                .iter()
                .map(|k| Secret::parse(&format!("whsec_{}", b64.encode(k))).expect("valid"))
                .collect();
            let id = MsgId::generate();
            let ts = chrono::Utc::now().timestamp();
            let header = signature_header(
                std::iter::once(&secret).chain(&old),
                id.as_str(),
                ts,
                body.as_bytes(),
            );
            let headers = |ts: i64, sig: &str| {
                let mut h = http::HeaderMap::new();
                h.insert("webhook-id", id.as_str().parse().expect("header"));
                h.insert("webhook-timestamp", ts.to_string().parse().expect("header"));
                h.insert("webhook-signature", sig.parse().expect("header"));
                h
            };
            let reference =
                standardwebhooks::Webhook::new(&secret.expose()).expect("the reference reads it");
            prop_assert!(reference
                .verify(body.as_bytes(), &headers(ts, &header))
                .is_ok());
            for k in &old {
                let w = standardwebhooks::Webhook::new(&k.expose()).expect("reads it");
                prop_assert!(w.verify(body.as_bytes(), &headers(ts, &header)).is_ok());
            }
            prop_assert!(reference
                .verify(body.as_bytes(), &headers(ts - 1, &header))
                .is_err());
            // One byte changed, kept UTF-8 (an ASCII byte for an ASCII byte),
            // or one byte appended.
            let mut changed = body.clone().into_bytes();
            if changed.is_empty() {
                changed.push(b'x');
            } else {
                let ascii: Vec<usize> = (0..changed.len())
                    .filter(|&i| changed[i].is_ascii())
                    .collect();
                if ascii.is_empty() {
                    changed.push(b'x');
                } else {
                    let i = ascii[at.index(ascii.len())];
                    changed[i] = (changed[i] ^ flip) & 0x7f;
                    if changed[i] == body.as_bytes()[i] {
                        changed.push(b'x');
                    }
                }
            }
            prop_assert!(reference.verify(&changed, &headers(ts, &header)).is_err());
            Ok(())
        })
        .expect("every property holds");
}

/// Through the real API: payloads just under, at and over 1 MiB, and
/// bodies over the body limit, get 202, 202, 413 and 413; nesting 128 deep
/// is a 202, deeper a 422. Few cases: each is a real request of ~1 MiB.
#[test]
fn message_bodies_around_the_limits_get_the_right_status() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let app = runtime.block_on(spawn_stepped(&[]));
    let app_id = runtime.block_on(app.create_app());
    let msg_url = app.url(&format!("/api/v1/app/{app_id}/msg"));
    let post = |body: String| {
        runtime.block_on(async {
            app.client
                .post(&msg_url)
                .bearer_auth(TOKEN)
                .body(body)
                .send()
                .await
                .expect("herald answers")
                .status()
                .as_u16()
        })
    };
    // `{"x":"…"}`: 8 bytes of structure around the filler.
    let payload_of = |len: usize| format!(r#"{{"x":"{}"}}"#, "y".repeat(len - 8));
    let body_of = |payload: &str| format!(r#"{{"eventType":"a.b","payload":{payload}}}"#);

    let mut runner = TestRunner::new(Config {
        cases: 12,
        failure_persistence: None,
        ..Config::default()
    });
    let sizes = prop_oneof![
        (0usize..64).prop_map(|d| (MAX_PAYLOAD_BYTES - d, 202)),
        (1usize..64).prop_map(|d| (MAX_PAYLOAD_BYTES + d, 413)),
        (1usize..4096).prop_map(|d| (MAX_BODY_BYTES + d, 413)),
    ];
    runner
        .run(&sizes, |(len, expected)| {
            let status = post(body_of(&payload_of(len)));
            prop_assert_eq!(status, expected, "payload of {} bytes", len);
            Ok(())
        })
        .expect("sizes get their status");

    let mut runner = TestRunner::new(Config {
        cases: 12,
        failure_persistence: None,
        ..Config::default()
    });
    let depths = (
        prop_oneof![
            120usize..=136,
            Just(MAX_PAYLOAD_DEPTH),
            Just(MAX_PAYLOAD_DEPTH + 1)
        ],
        any::<u64>(),
    );
    runner
        .run(&depths, |(depth, seed)| {
            let kinds: Vec<bool> = (0..depth).map(|i| (seed >> (i % 64)) & 1 == 1).collect();
            let status = post(body_of(&nested_json(&kinds, "[")));
            let expected = if depth > MAX_PAYLOAD_DEPTH { 422 } else { 202 };
            prop_assert_eq!(status, expected, "depth {}", depth);
            Ok(())
        })
        .expect("depths get their status");
    runtime.block_on(app.shutdown());
}

/// Found by `nesting_depth_is_counted_exactly`: a payload 128 deep was
/// accepted (the limit was 128), but serde_json with its defaults, as
/// receivers parse, reads at most 127 levels ("recursion limit exceeded").
#[test]
fn regression_a_payload_at_the_nesting_limit_is_readable_by_serde_json() {
    for kinds in [
        vec![false; MAX_PAYLOAD_DEPTH],
        vec![true; MAX_PAYLOAD_DEPTH],
    ] {
        let json = nested_json(&kinds, "x");
        assert!(!nests_deeper_than(&json, MAX_PAYLOAD_DEPTH));
        let read = serde_json::from_str::<serde_json::Value>(&json);
        assert!(read.is_ok(), "{read:?}");
        let deeper = nested_json(&[kinds.clone(), vec![false]].concat(), "x");
        assert!(nests_deeper_than(&deeper, MAX_PAYLOAD_DEPTH));
    }
    assert!(serde_json::from_str::<serde_json::Value>(&nested_json(&[false; 128], "x")).is_err());
}

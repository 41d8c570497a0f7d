//! Property tests of the `whsec_` secret format (a customer's input, and
//! the operator's configuration) and of the `v1` signatures made with it.
//! The cross-check against the reference implementation of Standard
//! Webhooks lives in Herald's integration tests (`parsers_fuzzed`).

use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE};
use base64::Engine;
use proptest::prelude::*;

use super::*;

fn key() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), MIN_LEN..=MAX_LEN)
}

fn secret_of(key: &[u8]) -> Secret {
    Secret::parse(&format!("whsec_{}", STANDARD.encode(key))).expect("a valid secret")
}

/// The bytes of a `v1,<base64>` signature.
fn mac_of(signature: &str) -> Vec<u8> {
    let b64 = signature.strip_prefix("v1,").expect("a v1 signature");
    STANDARD.decode(b64).expect("base64")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Any text: no panic; what is accepted is `whsec_` and the one
    /// canonical base64 of 24..=64 bytes, so it is shown back unchanged.
    #[test]
    fn secret_parse_never_panics_and_accepts_only_canonical_secrets(
        s in prop_oneof![
            any::<String>(),
            "whsec_[A-Za-z0-9+/=_ -]{0,100}",
        ],
    ) {
        match Secret::parse(&s) {
            Ok(secret) => {
                prop_assert_eq!(secret.expose(), s.clone());
                let decoded = STANDARD.decode(&s["whsec_".len()..]).expect("base64");
                prop_assert!((MIN_LEN..=MAX_LEN).contains(&decoded.len()));
            }
            Err(SecretError::MissingPrefix) => prop_assert!(!s.starts_with("whsec_")),
            Err(SecretError::NotBase64) => {
                prop_assert!(STANDARD.decode(&s["whsec_".len()..]).is_err());
            }
            Err(SecretError::BadLength(n)) => {
                prop_assert!(!(MIN_LEN..=MAX_LEN).contains(&n));
            }
        }
    }

    /// Every key of 0..=100 bytes: accepted and round-tripped exactly when
    /// its length is in the spec's range, otherwise a length error naming it.
    #[test]
    fn secret_lengths_are_checked(key in proptest::collection::vec(any::<u8>(), 0..=100)) {
        let text = format!("whsec_{}", STANDARD.encode(&key));
        if (MIN_LEN..=MAX_LEN).contains(&key.len()) {
            let secret = Secret::parse(&text).expect("in range");
            prop_assert_eq!(secret.expose(), text);
        } else {
            prop_assert_eq!(Secret::parse(&text), Err(SecretError::BadLength(key.len())));
        }
    }

    /// Near misses of a valid secret are refused: unpadded, URL-safe
    /// alphabet, padded with whitespace, another case of the prefix, no
    /// prefix.
    #[test]
    fn secret_near_misses_are_refused(key in key()) {
        let canonical = STANDARD.encode(&key);
        if canonical.ends_with('=') {
            let unpadded = format!("whsec_{}", STANDARD_NO_PAD.encode(&key));
            prop_assert_eq!(Secret::parse(&unpadded), Err(SecretError::NotBase64));
        }
        let url_safe = URL_SAFE.encode(&key);
        if url_safe != canonical {
            let text = format!("whsec_{url_safe}");
            prop_assert_eq!(Secret::parse(&text), Err(SecretError::NotBase64));
        }
        for bad in [
            format!(" whsec_{canonical}"),
            format!("WHSEC_{canonical}"),
            canonical.clone(),
        ] {
            prop_assert_eq!(Secret::parse(&bad), Err(SecretError::MissingPrefix));
        }
        for bad in [format!("whsec_{canonical} "), format!("whsec_{canonical}\n")] {
            prop_assert_eq!(Secret::parse(&bad), Err(SecretError::NotBase64));
        }
    }

    /// A signature is `v1,` and the base64 of 32 bytes, and the same inputs
    /// always sign the same.
    #[test]
    fn signatures_have_the_v1_shape(
        key in key(),
        id in "[ -~]{0,40}",
        ts in any::<i64>(),
        body in proptest::collection::vec(any::<u8>(), 0..512),
    ) {
        let secret = secret_of(&key);
        let sig = secret.sign(&id, ts, &body);
        prop_assert_eq!(mac_of(&sig).len(), 32);
        prop_assert_eq!(sig.clone(), secret.sign(&id, ts, &body));
    }

    /// Any single-byte change of the body, the id or the key, and any other
    /// timestamp, gives another signature: a receiver's check fails.
    #[test]
    fn any_single_byte_change_breaks_the_signature(
        key in key(),
        id in "msg_[0-9A-Z]{26}",
        ts in any::<i64>(),
        other_ts in any::<i64>(),
        body in proptest::collection::vec(any::<u8>(), 1..512),
        at in any::<prop::sample::Index>(),
        flip in 1u8..=255,
    ) {
        let secret = secret_of(&key);
        let sig = secret.sign(&id, ts, &body);

        let mut changed = body.clone();
        let i = at.index(changed.len());
        changed[i] ^= flip;
        prop_assert_ne!(&secret.sign(&id, ts, &changed), &sig);

        let mut id_bytes = id.clone().into_bytes();
        let j = at.index(id_bytes.len());
        id_bytes[j] = if id_bytes[j] == b'Z' { b'Y' } else { b'Z' };
        let other_id = String::from_utf8(id_bytes).expect("ASCII");
        prop_assert_ne!(&secret.sign(&other_id, ts, &body), &sig);

        if other_ts != ts {
            prop_assert_ne!(&secret.sign(&id, other_ts, &body), &sig);
        }

        let mut other_key = key.clone();
        let k = at.index(other_key.len());
        other_key[k] ^= flip;
        prop_assert_ne!(&secret_of(&other_key).sign(&id, ts, &body), &sig);

        // A truncated or extended body is another body too.
        prop_assert_ne!(&secret.sign(&id, ts, &body[..body.len() - 1]), &sig);
        let mut longer = body.clone();
        longer.push(b' ');
        prop_assert_ne!(&secret.sign(&id, ts, &longer), &sig);
    }

    /// The header lists one signature per secret, in order, space-separated.
    #[test]
    fn the_header_lists_each_secret_in_order(
        keys in proptest::collection::vec(key(), 1..5),
        ts in any::<i64>(),
        body in proptest::collection::vec(any::<u8>(), 0..128),
    ) {
        let secrets: Vec<Secret> = keys.iter().map(|k| secret_of(k)).collect();
        let header = signature_header(&secrets, "msg_x", ts, &body);
        let parts: Vec<&str> = header.split(' ').collect();
        prop_assert_eq!(parts.len(), secrets.len());
        for (part, secret) in parts.iter().zip(&secrets) {
            prop_assert_eq!(*part, secret.sign("msg_x", ts, &body));
        }
    }
}

//! Standard Webhooks signatures, version `v1` (HMAC-SHA256).
//!
//! The signed content is `{webhook-id}.{webhook-timestamp}.{body}`; the
//! `webhook-signature` header lists one `v1,<base64>` entry per valid secret,
//! separated by spaces, so receivers keep verifying while a secret rotates.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;

const PREFIX: &str = "whsec_";
/// The spec asks for 24–64 random bytes; we generate 32.
const GENERATED_LEN: usize = 32;
const MIN_LEN: usize = 24;
const MAX_LEN: usize = 64;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SecretError {
    #[error("secret must start with `whsec_`")]
    MissingPrefix,
    #[error("secret is not valid base64 after `whsec_`")]
    NotBase64,
    #[error("secret must decode to between 24 and 64 bytes, got {0}")]
    BadLength(usize),
}

/// An endpoint's signing secret. Its `Debug` form never shows the key.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    key: Vec<u8>,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(whsec_…redacted)")
    }
}

impl Secret {
    /// A fresh random secret.
    pub fn generate() -> Self {
        let mut key = vec![0u8; GENERATED_LEN];
        rand::thread_rng().fill_bytes(&mut key);
        Secret { key }
    }

    /// Parses the `whsec_<base64>` form.
    pub fn parse(s: &str) -> Result<Self, SecretError> {
        let encoded = s.strip_prefix(PREFIX).ok_or(SecretError::MissingPrefix)?;
        let key = B64.decode(encoded).map_err(|_| SecretError::NotBase64)?;
        // The reference vector's secret is 24 bytes; accept the spec's range.
        if !(MIN_LEN..=MAX_LEN).contains(&key.len()) {
            return Err(SecretError::BadLength(key.len()));
        }
        Ok(Secret { key })
    }

    /// A secret as a caller gives one: `whsec_<base64>`, or the base64
    /// alone (Svix's API takes both; it is shown `whsec_`-prefixed after).
    pub fn parse_given(s: &str) -> Result<Self, SecretError> {
        match s.strip_prefix(PREFIX) {
            Some(_) => Self::parse(s),
            None => Self::parse(&format!("{PREFIX}{s}")),
        }
    }

    /// The `whsec_<base64>` form shown to users.
    pub fn expose(&self) -> String {
        format!("{PREFIX}{}", B64.encode(&self.key))
    }

    /// One `v1,<base64>` signature of a message.
    pub fn sign(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> String {
        // HMAC accepts keys of any length, so this cannot fail.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
        mac.update(msg_id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", B64.encode(mac.finalize().into_bytes()))
    }
}

/// The `webhook-signature` header value: one entry per secret, in order.
pub fn signature_header<'a>(
    secrets: impl IntoIterator<Item = &'a Secret>,
    msg_id: &str,
    timestamp: i64,
    body: &[u8],
) -> String {
    secrets
        .into_iter()
        .map(|s| s.sign(msg_id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Which header names carry a signed request's id, timestamp and
/// signature: Standard Webhooks' `webhook-*`, Svix's `svix-*` (what Svix
/// sends unless told otherwise, and what a receiver written by hand for it
/// reads), or both. The values are the same under either name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeaderNames {
    #[default]
    Webhook,
    Svix,
    Both,
}

impl HeaderNames {
    pub fn webhook(self) -> bool {
        self != HeaderNames::Svix
    }

    pub fn svix(self) -> bool {
        self != HeaderNames::Webhook
    }
}

impl std::str::FromStr for HeaderNames {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "webhook" => Ok(HeaderNames::Webhook),
            "svix" => Ok(HeaderNames::Svix),
            "both" => Ok(HeaderNames::Both),
            other => Err(format!("`{other}`: use webhook, svix or both")),
        }
    }
}

#[cfg(test)]
mod proptests;

#[cfg(test)]
mod tests {
    use super::*;

    const REF_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const REF_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const REF_TS: i64 = 1_614_265_330;
    const REF_BODY: &[u8] = br#"{"test": 2432232314}"#;
    const REF_SIG: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    #[test]
    fn matches_the_standard_webhooks_reference_vector() {
        let secret = Secret::parse(REF_SECRET).expect("reference secret parses");
        assert_eq!(secret.sign(REF_ID, REF_TS, REF_BODY), REF_SIG);
    }

    #[test]
    fn a_given_secret_may_leave_out_its_prefix() {
        let bare = REF_SECRET.strip_prefix(PREFIX).expect("prefixed");
        let secret = Secret::parse_given(bare).expect("bare base64 parses");
        assert_eq!(secret.expose(), REF_SECRET);
        assert_eq!(secret.sign(REF_ID, REF_TS, REF_BODY), REF_SIG);
        assert!(Secret::parse_given(REF_SECRET).is_ok());
        assert!(Secret::parse_given("hunter2").is_err());
        assert!(
            Secret::parse(bare).is_err(),
            "a stored secret keeps its prefix"
        );
    }

    #[test]
    fn any_change_to_id_timestamp_or_body_changes_the_signature() {
        let secret = Secret::parse(REF_SECRET).expect("reference secret parses");
        assert_ne!(secret.sign("msg_other", REF_TS, REF_BODY), REF_SIG);
        assert_ne!(secret.sign(REF_ID, REF_TS + 1, REF_BODY), REF_SIG);
        assert_ne!(
            secret.sign(REF_ID, REF_TS, br#"{"test": 2432232315}"#),
            REF_SIG
        );
    }

    #[test]
    fn header_lists_one_signature_per_secret_in_order() {
        let a = Secret::parse(REF_SECRET).expect("parses");
        let b = Secret::generate();
        let header = signature_header([&a, &b], REF_ID, REF_TS, REF_BODY);
        let parts: Vec<&str> = header.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0], REF_SIG);
        assert_eq!(parts[1], b.sign(REF_ID, REF_TS, REF_BODY));
    }

    #[test]
    fn generated_secrets_round_trip_and_differ() {
        let a = Secret::generate();
        let b = Secret::generate();
        assert_ne!(a, b);
        assert_eq!(Secret::parse(&a.expose()), Ok(a.clone()));
        assert!(a.expose().starts_with("whsec_"));
    }

    #[test]
    fn malformed_secrets_are_refused() {
        assert_eq!(
            Secret::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
            Err(SecretError::MissingPrefix)
        );
        assert_eq!(Secret::parse("whsec_!!!"), Err(SecretError::NotBase64));
        assert_eq!(
            Secret::parse("whsec_c2hvcnQ="),
            Err(SecretError::BadLength(5))
        );
    }

    #[test]
    fn debug_never_shows_the_key() {
        let s = Secret::parse(REF_SECRET).expect("parses");
        let shown = format!("{s:?}");
        assert!(!shown.contains("MfKQ9r8"));
    }
}

//! Encryption of stored secrets (AES-256-GCM) under the keys of
//! `HERALD_ENCRYPTION_KEY`.
//!
//! A sealed value is text, so it fits the columns that held the plain
//! value: `enc:v1:<key id>:<base64(nonce || ciphertext || tag)>`, where the
//! key id is the first 8 hex digits of the key's SHA-256 and the nonce is 96
//! random bits. The associated data (which row and column the value belongs
//! to) is authenticated, not stored: a sealed value copied into another row
//! or column does not open. Plain values never start with `enc:` (secrets
//! are `whsec_…`, the other columns JSON), so a reader always knows which it
//! has.
//!
//! The first key seals; every key opens. Keys are never logged or shown
//! (`Debug` prints only how many there are).

use aes_gcm::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::Engine as _;
use sha2::{Digest, Sha256};

/// Prefix of every sealed value.
pub const SEALED_PREFIX: &str = "enc:";
const V1: &str = "enc:v1:";
const NONCE_LEN: usize = 12;
const KEY_ID_LEN: usize = 8;
/// `enc:v1:<8 hex>:`: what every value sealed by one key starts with.
pub const KEY_PREFIX_LEN: usize = V1.len() + KEY_ID_LEN + 1;

/// The configuration key that holds the keys, for messages.
pub const ENV_KEY: &str = "HERALD_ENCRYPTION_KEY";

#[derive(Clone)]
struct Key {
    id: String,
    cipher: Aes256Gcm,
    /// For digests that must not be recomputable from the database alone
    /// ([`Keyring::keyed_digests`]); derived, so no key serves two uses.
    mac_key: [u8; 32],
}

/// The keys values are sealed and opened with; empty when no key is
/// configured (values are then stored and read as they are).
#[derive(Clone, Default)]
pub struct Keyring {
    keys: Vec<Key>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Keyring(<{} keys redacted>)", self.keys.len())
    }
}

/// Why a stored value cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenError {
    /// Sealed, but no key is configured.
    NoKey { key_id: String },
    /// Sealed under a key that is not in the list.
    UnknownKey { key_id: String },
    /// Not a well-formed sealed value, or it fails authentication (another
    /// key with the same id, tampering, or copied from another row).
    Corrupt { key_id: String },
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::NoKey { key_id } => write!(
                f,
                "stored secrets are encrypted (key id {key_id}) but {ENV_KEY} is not set"
            ),
            OpenError::UnknownKey { key_id } => write!(
                f,
                "stored secrets are encrypted with key id {key_id}, which is not among the keys of {ENV_KEY}"
            ),
            OpenError::Corrupt { key_id } => write!(
                f,
                "a stored secret (key id {key_id}) fails decryption: wrong {ENV_KEY}, or the value was altered"
            ),
        }
    }
}

impl std::error::Error for OpenError {}

/// The id of a key as sealed values name it: the first 8 hex digits of its
/// SHA-256.
pub fn key_id(key: &[u8; 32]) -> String {
    let mut id = hex::encode(Sha256::digest(key));
    id.truncate(KEY_ID_LEN);
    id
}

/// The key id a sealed value names (None for a plain value).
pub fn key_id_of(stored: &str) -> Option<&str> {
    stored
        .strip_prefix(V1)
        .and_then(|rest| rest.get(..KEY_ID_LEN))
        .or_else(|| stored.starts_with(SEALED_PREFIX).then_some("?"))
}

/// Whether `stored` is sealed (with any key, in any version).
pub fn is_sealed(stored: &str) -> bool {
    stored.starts_with(SEALED_PREFIX)
}

impl Keyring {
    /// `digest` as the store keeps it: under each key, an HMAC-SHA256 of
    /// it (the first key's is the one to write, the others match what was
    /// written before a rotation), then the digest itself in hex (what was
    /// written before a key was set: matched, never written); with no key,
    /// the digest itself. Whoever holds only the database cannot test a
    /// guess of what was digested against what is written with a key.
    pub fn keyed_digests(&self, digest: &[u8]) -> Vec<String> {
        use hmac::{Hmac, Mac};
        let plain = hex::encode(digest);
        if self.keys.is_empty() {
            return vec![plain];
        }
        self.keys
            .iter()
            .map(|k| {
                // HMAC takes a key of any length: this cannot fail.
                let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&k.mac_key)
                    .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
                mac.update(digest);
                hex::encode(mac.finalize().into_bytes())
            })
            .chain(std::iter::once(plain))
            .collect()
    }

    /// No key: values are stored in plain text.
    pub fn plain() -> Self {
        Keyring::default()
    }

    /// From raw keys, the first sealing.
    pub fn from_keys(keys: &[[u8; 32]]) -> Self {
        Keyring {
            keys: keys
                .iter()
                .map(|k| Key {
                    id: key_id(k),
                    cipher: Aes256Gcm::new(k.into()),
                    mac_key: Sha256::new()
                        .chain_update(b"herald digest key\n")
                        .chain_update(k)
                        .finalize()
                        .into(),
                })
                .collect(),
        }
    }

    /// `HERALD_ENCRYPTION_KEY`: comma-separated standard base64 keys of 32
    /// bytes each; empty is no key. The error names the entry, never its
    /// text.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.is_empty() {
            return Ok(Keyring::plain());
        }
        let mut keys = Vec::new();
        for (i, part) in text.split(',').enumerate() {
            let n = i + 1;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(part.trim())
                .map_err(|_| format!("key {n} of the list is not base64"))?;
            let key: [u8; 32] = bytes.try_into().map_err(|b: Vec<u8>| {
                format!(
                    "key {n} of the list is {} bytes; AES-256 needs 32 (e.g. `openssl rand -base64 32`)",
                    b.len()
                )
            })?;
            keys.push(key);
        }
        let ring = Keyring::from_keys(&keys);
        for (i, k) in ring.keys.iter().enumerate() {
            if ring.keys[..i].iter().any(|o| o.id == k.id) {
                return Err(format!("key {} of the list is given twice", i + 1));
            }
        }
        Ok(ring)
    }

    /// A key is configured: values are sealed.
    pub fn is_enabled(&self) -> bool {
        !self.keys.is_empty()
    }

    /// The id of the key that seals.
    pub fn current_id(&self) -> Option<&str> {
        self.keys.first().map(|k| k.id.as_str())
    }

    /// How many keys there are.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// No key at all.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// What every value sealed by the current key starts with.
    pub fn current_prefix(&self) -> Option<String> {
        self.current_id().map(|id| format!("{V1}{id}:"))
    }

    /// Seals `plain` for the place `aad` names, with the first key; without
    /// a key, `plain` as it is.
    pub fn seal(&self, plain: &str, aad: &str) -> String {
        let Some(key) = self.keys.first() else {
            return plain.to_owned();
        };
        let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
        let sealed = key
            .cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: plain.as_bytes(),
                    aad: aad.as_bytes(),
                },
            )
            // Only inputs beyond GCM's 64 GiB bound fail.
            .unwrap_or_else(|_| unreachable!("AES-GCM seals any value under 64 GiB"));
        let mut raw = Vec::with_capacity(NONCE_LEN + sealed.len());
        raw.extend_from_slice(&nonce);
        raw.extend_from_slice(&sealed);
        format!(
            "{V1}{}:{}",
            key.id,
            base64::engine::general_purpose::STANDARD.encode(raw)
        )
    }

    /// The plain text of `stored` (a plain value is returned as it is).
    pub fn open(&self, stored: &str, aad: &str) -> Result<String, OpenError> {
        if !is_sealed(stored) {
            return Ok(stored.to_owned());
        }
        let key_id = key_id_of(stored).unwrap_or("?").to_owned();
        if self.keys.is_empty() {
            return Err(OpenError::NoKey { key_id });
        }
        let corrupt = || OpenError::Corrupt {
            key_id: key_id.clone(),
        };
        let Some(rest) = stored.strip_prefix(V1) else {
            return Err(corrupt());
        };
        let (id, body) = rest.split_once(':').ok_or_else(corrupt)?;
        let key = self
            .keys
            .iter()
            .find(|k| k.id == id)
            .ok_or_else(|| OpenError::UnknownKey {
                key_id: key_id.clone(),
            })?;
        let raw = base64::engine::general_purpose::STANDARD
            .decode(body)
            .map_err(|_| corrupt())?;
        if raw.len() < NONCE_LEN + 16 {
            return Err(corrupt());
        }
        let (nonce, sealed) = raw.split_at(NONCE_LEN);
        let plain = key
            .cipher
            .decrypt(
                Nonce::from_slice(nonce),
                Payload {
                    msg: sealed,
                    aad: aad.as_bytes(),
                },
            )
            .map_err(|_| corrupt())?;
        String::from_utf8(plain).map_err(|_| corrupt())
    }

    /// Whether `stored` is sealed with the current key (without a key:
    /// whether it is plain).
    pub fn is_current(&self, stored: &str) -> bool {
        match self.current_id() {
            None => !is_sealed(stored),
            Some(id) => stored.strip_prefix(V1).is_some_and(|r| {
                r.len() > KEY_ID_LEN && r.starts_with(id) && r.as_bytes()[KEY_ID_LEN] == b':'
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(seeds: &[u8]) -> Keyring {
        Keyring::from_keys(&seeds.iter().map(|s| [*s; 32]).collect::<Vec<_>>())
    }

    #[test]
    fn round_trip() {
        let r = ring(&[1]);
        let s = r.seal("whsec_abc", "endpoints/ep_1/secret");
        assert!(s.starts_with(&r.current_prefix().unwrap()), "{s}");
        assert!(!s.contains("whsec_abc"));
        assert_eq!(r.open(&s, "endpoints/ep_1/secret").unwrap(), "whsec_abc");
        assert!(r.is_current(&s));
        // Random nonces: the same value seals differently each time.
        assert_ne!(s, r.seal("whsec_abc", "endpoints/ep_1/secret"));
        // Plain values pass through.
        assert_eq!(r.open("whsec_x", "a").unwrap(), "whsec_x");
        assert!(!r.is_current("whsec_x"));
        assert_eq!(Keyring::plain().seal("whsec_x", "a"), "whsec_x");
        assert_eq!(Keyring::plain().open("whsec_x", "a").unwrap(), "whsec_x");
    }

    #[test]
    fn wrong_or_missing_key() {
        let s = ring(&[1]).seal("whsec_abc", "aad");
        let id = key_id(&[1; 32]);
        assert_eq!(
            ring(&[2]).open(&s, "aad"),
            Err(OpenError::UnknownKey { key_id: id.clone() })
        );
        assert_eq!(
            Keyring::plain().open(&s, "aad"),
            Err(OpenError::NoKey { key_id: id.clone() })
        );
        assert!(Keyring::plain()
            .open(&s, "aad")
            .unwrap_err()
            .to_string()
            .contains(ENV_KEY));
        // Any key of the list opens; the first seals.
        let both = ring(&[2, 1]);
        assert_eq!(both.open(&s, "aad").unwrap(), "whsec_abc");
        assert!(!both.is_current(&s));
        assert!(both.is_current(&both.seal("x", "aad")));
        assert_eq!(key_id_of(&s), Some(id.as_str()));
    }

    #[test]
    fn tampered_ciphertext_fails() {
        let r = ring(&[1]);
        let s = r.seal("whsec_abc", "aad");
        let (head, body) = s.split_at(KEY_PREFIX_LEN);
        let mut raw = base64::engine::general_purpose::STANDARD
            .decode(body)
            .unwrap();
        for i in [0, NONCE_LEN, raw.len() - 1] {
            raw[i] ^= 1;
            let t = format!(
                "{head}{}",
                base64::engine::general_purpose::STANDARD.encode(&raw)
            );
            assert!(
                matches!(r.open(&t, "aad"), Err(OpenError::Corrupt { .. })),
                "byte {i}"
            );
            raw[i] ^= 1;
        }
        for bad in [
            format!("{head}!!!"),
            format!("{head}AAAA"),
            "enc:v1:".to_owned(),
            "enc:v9:xx".to_owned(),
        ] {
            assert!(r.open(&bad, "aad").is_err(), "{bad}");
        }
    }

    #[test]
    fn aad_binds_row_and_column() {
        let r = ring(&[1]);
        let s = r.seal("whsec_abc", "endpoints/ep_1/secret");
        for other in ["endpoints/ep_2/secret", "endpoints/ep_1/headers", ""] {
            assert!(matches!(r.open(&s, other), Err(OpenError::Corrupt { .. })));
        }
    }

    #[test]
    fn parse_keys() {
        let k1 = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
        let k2 = base64::engine::general_purpose::STANDARD.encode([8u8; 32]);
        assert!(!Keyring::parse("").unwrap().is_enabled());
        let r = Keyring::parse(&format!("{k1}, {k2}")).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r.current_id(), Some(key_id(&[7; 32]).as_str()));
        assert!(Keyring::parse("not base64!").unwrap_err().contains("key 1"));
        let short = base64::engine::general_purpose::STANDARD.encode([1u8; 16]);
        assert!(Keyring::parse(&format!("{k1},{short}"))
            .unwrap_err()
            .contains("key 2 of the list is 16 bytes"));
        assert!(Keyring::parse(&format!("{k1},{k1}"))
            .unwrap_err()
            .contains("twice"));
        assert!(!format!("{r:?}").contains(&k1));
    }
}

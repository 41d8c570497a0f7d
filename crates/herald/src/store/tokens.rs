//! Application API tokens and Idempotency-Key records.

use super::rows::{col, StoredRow};
use super::*;

/// API tokens and Idempotency-Key records.
#[async_trait]
pub trait Tokens: Send + Sync {
    async fn create_token(&self, token: &ApiToken, sha256_hex: &str) -> StoreResult<()>;
    async fn find_token(&self, sha256_hex: &str) -> StoreResult<Option<ApiToken>>;
    async fn list_tokens(&self, app: &AppId) -> StoreResult<Vec<ApiToken>>;
    async fn delete_token(&self, app: &AppId, id: &str) -> StoreResult<bool>;
    /// Creates a portal token and, in the same transaction, its link's
    /// one-time code (kept as `code_sha256_hex` only), valid as long as the
    /// token.
    async fn create_portal_token(
        &self,
        token: &ApiToken,
        sha256_hex: &str,
        code_sha256_hex: &str,
    ) -> StoreResult<()>;
    /// Takes a link's one-time code: deletes it and returns its token if
    /// the code existed, had not expired by `now`, and its token is live.
    /// A second call with the same code finds nothing, whatever the first
    /// found (the code is gone either way).
    async fn take_portal_code(
        &self,
        code_sha256_hex: &str,
        now: Millis,
    ) -> StoreResult<Option<ApiToken>>;
    /// Makes the application's tokens (only those whose `session_id` is
    /// one of `session_ids`, when given) expire at `at` if they would
    /// expire later, and with them the portal sessions and link codes
    /// made from them, in one transaction. Returns how many tokens.
    async fn expire_tokens(
        &self,
        app: &AppId,
        at: Millis,
        session_ids: Option<&[String]>,
    ) -> StoreResult<u64>;
    /// Ends one token at once, with its portal sessions and link codes.
    async fn end_token(&self, token_id: &str, now: Millis) -> StoreResult<()>;
    /// Tells the other processes sharing this store that tokens were
    /// revoked or ended, so that they drop the lookups they cached
    /// (PostgreSQL: a NOTIFY). A backend used by one process only has no
    /// one to tell.
    async fn announce_token_change(&self) -> StoreResult<()> {
        Ok(())
    }
    /// Signals `changed` whenever another process announces a token change
    /// (and once after the listening connection was lost, whatever was
    /// announced meanwhile). Returns once listening has started; it goes on
    /// in the background.
    async fn listen_for_token_changes(
        &self,
        changed: std::sync::Arc<tokio::sync::Notify>,
    ) -> StoreResult<()> {
        let _ = changed;
        Ok(())
    }
    /// Starts a request carrying an Idempotency-Key (see [`IdemBegin`]).
    /// `request_hashes`: the request's digest as kept (the first), then as
    /// it was kept before a key rotation (`Keyring::keyed_digests`); one
    /// kept that matches any is the same request. Records older than
    /// `valid_after` are forgotten; a still-running one older than
    /// `stale_before` is taken over (its process died).
    async fn idempotency_begin(
        &self,
        scope: &str,
        key: &IdemKey<'_>,
        request_hashes: &[String],
        now: Millis,
        valid_after: Millis,
        stale_before: Millis,
    ) -> StoreResult<IdemBegin>;
    /// Keeps the response of a request begun with `idempotency_begin`.
    async fn idempotency_finish(
        &self,
        scope: &str,
        key: &str,
        status: u16,
        body: &str,
    ) -> StoreResult<()>;
    /// Forgets a begun request that will not be kept (a server error).
    async fn idempotency_abort(&self, scope: &str, key: &str) -> StoreResult<()>;
}

/// An application-scoped API token (its secret is never stored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiToken {
    /// `tok_…`
    pub id: String,
    pub app_id: AppId,
    pub name: String,
    pub created_at: Millis,
    /// None: never (an ordinary application token).
    pub expires_at: Option<Millis>,
    /// The portal capabilities, comma-separated (`api::auth::Capabilities`
    /// parses them); None: an ordinary token, unrestricted within its
    /// application.
    pub capabilities: Option<String>,
    /// Svix's `sessionId`, which `expire-all` can select by.
    pub session_id: Option<String>,
    /// Svix's `featureFlags`, comma-separated: kept, not acted on.
    pub feature_flags: String,
}

impl ApiToken {
    /// An ordinary application token (no expiry, no capabilities).
    pub fn plain(id: String, app_id: AppId, name: String, created_at: Millis) -> Self {
        ApiToken {
            id,
            app_id,
            name,
            created_at,
            expires_at: None,
            capabilities: None,
            session_id: None,
            feature_flags: String::new(),
        }
    }

    /// Whether the token still works at `now`.
    pub fn live_at(&self, now: Millis) -> bool {
        self.expires_at.is_none_or(|at| at > now)
    }
}

/// An Idempotency-Key as kept: the client's key with the request's URL
/// (a key is one per URL, as in Svix), and the key alone as a release
/// before kept it. A record kept under the key alone that this request
/// repeats (same digest) is answered too, so that a retry across the
/// upgrade does not run twice; one that does not match is another URL's.
#[derive(Debug, Clone, Copy)]
pub struct IdemKey<'a> {
    pub key: &'a str,
    pub unscoped: Option<&'a str>,
}

impl<'a> IdemKey<'a> {
    /// A key kept as given, with no earlier form.
    pub fn plain(key: &'a str) -> Self {
        IdemKey {
            key,
            unscoped: None,
        }
    }
}

/// What a record kept under the key alone says, beside a fresh one under
/// the key and URL: its answer when it is this request done, a wait while
/// it runs, nothing otherwise.
pub fn unscoped_verdict(
    found: Option<(String, i64, String, i64)>,
    hashes: &[String],
    valid_after: Millis,
    stale_before: Millis,
) -> Option<IdemBegin> {
    match idem_verdict(found, hashes, valid_after, stale_before) {
        v @ (IdemBegin::Replay { .. } | IdemBegin::InProgress) => Some(v),
        IdemBegin::Fresh | IdemBegin::Mismatch => None,
    }
}

/// What an Idempotency-Key says about a request about to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdemBegin {
    /// First time (or the old record expired): run it, then finish.
    Fresh,
    /// Done before with the same request: answer this again.
    Replay { status: u16, body: String },
    /// The key was used for a different request.
    Mismatch,
    /// The first request with this key is still running.
    InProgress,
}

/// Judges a stored idempotency record `(hash, status, body, created_at)`
/// against a new request (both stores use this).
pub fn idem_verdict(
    found: Option<(String, i64, String, i64)>,
    hashes: &[String],
    valid_after: Millis,
    stale_before: Millis,
) -> IdemBegin {
    match found {
        None => IdemBegin::Fresh,
        Some((_, _, _, created)) if created < valid_after => IdemBegin::Fresh,
        Some((_, 0, _, created)) if created < stale_before => IdemBegin::Fresh,
        Some((stored, _, _, _)) if !hashes.contains(&stored) => IdemBegin::Mismatch,
        Some((_, 0, _, _)) => IdemBegin::InProgress,
        Some((_, status, body, _)) => IdemBegin::Replay {
            status: u16::try_from(status).unwrap_or(500),
            body,
        },
    }
}

/// An application token from its stored row (either backend).
pub(crate) fn token_from_row(r: &impl StoredRow) -> StoreResult<ApiToken> {
    Ok(ApiToken {
        id: col(r, "id")?,
        app_id: AppId::from_trusted(col(r, "app_id")?),
        name: col(r, "name")?,
        created_at: col(r, "created_at")?,
        expires_at: col(r, "expires_at")?,
        capabilities: col(r, "capabilities")?,
        session_id: col(r, "session_id")?,
        feature_flags: col(r, "feature_flags")?,
    })
}

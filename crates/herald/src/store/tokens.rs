//! Application API tokens and Idempotency-Key records.

use super::*;

/// API tokens and Idempotency-Key records.
#[async_trait]
pub trait Tokens: Send + Sync {
    async fn create_token(&self, token: &ApiToken, sha256_hex: &str) -> StoreResult<()>;
    async fn find_token(&self, sha256_hex: &str) -> StoreResult<Option<ApiToken>>;
    async fn list_tokens(&self, app: &AppId) -> StoreResult<Vec<ApiToken>>;
    async fn delete_token(&self, app: &AppId, id: &str) -> StoreResult<bool>;
    /// Starts a request carrying an Idempotency-Key (see [`IdemBegin`]).
    /// Records older than `valid_after` are forgotten; a still-running one
    /// older than `stale_before` is taken over (its process died).
    async fn idempotency_begin(
        &self,
        scope: &str,
        key: &str,
        request_hash: &str,
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
    hash: &str,
    valid_after: Millis,
    stale_before: Millis,
) -> IdemBegin {
    match found {
        None => IdemBegin::Fresh,
        Some((_, _, _, created)) if created < valid_after => IdemBegin::Fresh,
        Some((_, 0, _, created)) if created < stale_before => IdemBegin::Fresh,
        Some((stored, _, _, _)) if stored != hash => IdemBegin::Mismatch,
        Some((_, 0, _, _)) => IdemBegin::InProgress,
        Some((_, status, body, _)) => IdemBegin::Replay {
            status: u16::try_from(status).unwrap_or(500),
            body,
        },
    }
}

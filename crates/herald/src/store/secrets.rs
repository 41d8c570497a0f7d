//! Secrets at rest: the endpoint columns that hold credentials (`secret`,
//! `old_secrets`, `headers`, and `url` when it carries userinfo) are
//! sealed with the store's [`Keyring`] when written and opened when read,
//! here at the store boundary, so nothing above the store sees a sealed
//! value. Each column is sealed whole (the JSON of `old_secrets` and
//! `headers`), bound to its endpoint and column by the associated data
//! `endpoints/<id>/<column>`. The empty values `[]`
//! and `{}` hold nothing and stay as they are (the hot path's no-parse
//! case).
//!
//! Start-up ([`prepare`]) checks that every key the stored values name is
//! configured and opens, then seals what is still plain; `herald
//! rotate-encryption-key` ([`Secrets::reseal_secrets`] with
//! [`ResealScope::NotCurrent`]) re-seals what is not under the first key.

use std::future::Future;

use super::rows::{col, StoredRow};
use super::*;
use crate::crypto::{is_sealed, Keyring, OpenError, SEALED_PREFIX};

/// Rows re-sealed per transaction.
pub const RESEAL_BATCH: usize = 500;

/// An endpoint column that holds credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretColumn {
    Secret,
    OldSecrets,
    Headers,
    /// Sealed only when the URL carries credentials (userinfo); plain
    /// otherwise, so that the common endpoint costs no decryption.
    Url,
}

impl SecretColumn {
    pub const ALL: [SecretColumn; 4] = [
        SecretColumn::Secret,
        SecretColumn::OldSecrets,
        SecretColumn::Headers,
        SecretColumn::Url,
    ];

    pub fn name(self) -> &'static str {
        match self {
            SecretColumn::Secret => "secret",
            SecretColumn::OldSecrets => "old_secrets",
            SecretColumn::Headers => "headers",
            SecretColumn::Url => "url",
        }
    }

    /// The value that holds nothing, stored as it is.
    fn empty(self) -> Option<&'static str> {
        match self {
            SecretColumn::Secret | SecretColumn::Url => None,
            SecretColumn::OldSecrets => Some("[]"),
            SecretColumn::Headers => Some("{}"),
        }
    }

    /// Whether `plain` is stored as it is (nothing secret in it).
    fn stays_plain(self, plain: &str) -> bool {
        self.empty() == Some(plain)
            || (self == SecretColumn::Url && !crate::net::url_has_credentials(plain))
    }

    /// What binds a sealed value to its row and column.
    pub fn aad(self, endpoint_id: &str) -> String {
        format!("endpoints/{endpoint_id}/{}", self.name())
    }
}

/// `value` as column `col` of endpoint `endpoint_id` stores it.
pub fn seal_column(keys: &Keyring, endpoint_id: &str, col: SecretColumn, value: &str) -> String {
    if col.stays_plain(value) {
        return value.to_owned();
    }
    keys.seal(value, &col.aad(endpoint_id))
}

/// The plain value of column `col` as stored.
pub fn open_column(
    keys: &Keyring,
    endpoint_id: &str,
    col: SecretColumn,
    stored: &str,
) -> Result<String, OpenError> {
    keys.open(stored, &col.aad(endpoint_id))
}

/// [`open_column`] for reads that fail as a whole (the API's): the error
/// says what to fix, without the value.
pub fn open_or_fail(
    keys: &Keyring,
    endpoint_id: &str,
    col: SecretColumn,
    stored: &str,
) -> StoreResult<String> {
    open_column(keys, endpoint_id, col, stored).map_err(|e| {
        StoreError::Internal(format!(
            "endpoint {endpoint_id}, column {}: {e}",
            col.name()
        ))
    })
}

/// An endpoint's URL, signing secret and headers (JSON) as a read of the
/// whole endpoint gets them; `unreadable` when a value did not open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenedCredentials {
    pub url: String,
    pub secret: String,
    pub headers_json: String,
    pub unreadable: bool,
}

/// Opens an endpoint's `secret` and `headers` for reading the endpoint.
/// A value that does not open (sealed under a key this process lacks, as
/// during a key roll, or copied from another row) is logged, named by
/// endpoint and column and never by value, and gives empty credentials
/// and `unreadable`: one such row must not fail a page that lists many,
/// and nothing is ever sent to it (the claim makes the same check).
pub fn open_endpoint_credentials(
    keys: &Keyring,
    endpoint_id: &str,
    url: &str,
    secret: &str,
    headers: &str,
) -> OpenedCredentials {
    let opened = (|| {
        Ok::<_, OpenError>((
            open_column(keys, endpoint_id, SecretColumn::Url, url)?,
            open_column(keys, endpoint_id, SecretColumn::Secret, secret)?,
            open_column(keys, endpoint_id, SecretColumn::Headers, headers)?,
        ))
    })();
    match opened {
        Ok((url, secret, headers_json)) => OpenedCredentials {
            url,
            secret,
            headers_json,
            unreadable: false,
        },
        Err(e) => {
            tracing::warn!(
                endpoint = endpoint_id,
                error = %e,
                "endpoint credentials do not open with the configured {}: shown as unreadable, nothing is sent to it",
                crate::crypto::ENV_KEY
            );
            OpenedCredentials {
                // What is stored, masked: enough to tell the endpoint by.
                url: if is_sealed(url) {
                    "(sealed)".to_owned()
                } else {
                    crate::net::masked_url(url)
                },
                secret: String::new(),
                headers_json: "{}".to_owned(),
                unreadable: true,
            }
        }
    }
}

/// One sealed value per (column, key id) found in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedSample {
    pub endpoint_id: String,
    pub column: SecretColumn,
    pub stored: String,
}

/// Which values [`Secrets::reseal_secrets`] seals again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResealScope {
    /// Only plain ones (start-up with a key).
    Plain,
    /// Every one not sealed with the first key (`rotate-encryption-key`).
    NotCurrent,
}

impl ResealScope {
    /// The prefix a value must have to be left alone (besides the empty
    /// values); None without a key (nothing to seal).
    pub fn keep_prefix(self, keys: &Keyring) -> Option<String> {
        let current = keys.current_prefix()?;
        Some(match self {
            ResealScope::Plain => SEALED_PREFIX.to_owned(),
            ResealScope::NotCurrent => current,
        })
    }
}

/// One endpoint's credential columns as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRow {
    pub id: String,
    pub secret: String,
    pub old_secrets: String,
    pub headers: String,
    pub url: String,
}

/// An endpoint's credential columns from their stored row (either
/// backend).
pub(crate) fn secret_row_from_row(r: &impl StoredRow) -> StoreResult<SecretRow> {
    Ok(SecretRow {
        id: col(r, "id")?,
        secret: col(r, "secret")?,
        old_secrets: col(r, "old_secrets")?,
        headers: col(r, "headers")?,
        url: col(r, "url")?,
    })
}

impl SecretRow {
    /// The row sealed again with the first key where `keep` does not
    /// already hold; None if nothing changes. Fails if a value does not open.
    pub fn resealed(&self, keys: &Keyring, keep: &str) -> StoreResult<Option<SecretRow>> {
        let mut out = self.clone();
        let mut changed = false;
        for (col, value) in [
            (SecretColumn::Secret, &mut out.secret),
            (SecretColumn::OldSecrets, &mut out.old_secrets),
            (SecretColumn::Headers, &mut out.headers),
            (SecretColumn::Url, &mut out.url),
        ] {
            let plain_for_good = !is_sealed(value) && col.stays_plain(value);
            if plain_for_good || value.starts_with(keep) {
                continue;
            }
            let plain = open_or_fail(keys, &self.id, col, value)?;
            *value = seal_column(keys, &self.id, col, &plain);
            changed = true;
        }
        Ok(changed.then_some(out))
    }
}

/// Passes over the table at most: a row a concurrent write changed between
/// read and write is looked at again in the next pass.
const RESEAL_PASSES: usize = 3;

/// `reseal_secrets` on either backend: walks the rows `keep` does not
/// hold yet in id order, `RESEAL_BATCH` at a time (`batch_after(id)`:
/// the next ones after `id`), seals each again and writes the changed
/// ones with `write_unchanged`, which writes a row only if it still holds
/// what was read and says how many it wrote. A pass that missed some
/// is followed by another, at most [`RESEAL_PASSES`].
// Plain closures returning futures, not async closures: the futures of
// async closures that borrow cannot yet be shown to be `Send` for every
// lifetime, which `#[async_trait]` asks.
pub(crate) async fn reseal_in_batches<Read, Write>(
    keys: &Keyring,
    keep: &str,
    mut batch_after: impl FnMut(String) -> Read,
    mut write_unchanged: impl FnMut(Vec<(SecretRow, SecretRow)>) -> Write,
) -> StoreResult<u64>
where
    Read: Future<Output = StoreResult<Vec<SecretRow>>>,
    Write: Future<Output = StoreResult<u64>>,
{
    let mut total = 0u64;
    for _ in 0..RESEAL_PASSES {
        let mut after = String::new();
        let mut missed = 0u64;
        loop {
            let batch = batch_after(after).await?;
            let Some(last) = batch.last() else { break };
            after = last.id.clone();
            let mut writes = Vec::with_capacity(batch.len());
            for row in batch {
                if let Some(new) = row.resealed(keys, keep)? {
                    writes.push((row, new));
                }
            }
            if writes.is_empty() {
                continue;
            }
            let wanted = writes.len() as u64;
            let done = write_unchanged(writes).await?;
            total += done;
            missed += wanted.saturating_sub(done);
        }
        if missed == 0 {
            break;
        }
    }
    Ok(total)
}

/// The store's side of secrets at rest.
#[async_trait]
pub trait Secrets: Send + Sync {
    /// One sealed value per column and key id present (an index-free scan:
    /// at start only).
    async fn sealed_samples(&self) -> StoreResult<Vec<SealedSample>>;
    /// Seals again, with the first key, the values `scope` names, in
    /// batches of [`RESEAL_BATCH`] rows per transaction, each row written
    /// only if it still holds what was read (a concurrent write wins and is
    /// looked at again). Returns how many rows were rewritten. Without a
    /// key, does nothing.
    async fn reseal_secrets(&self, scope: ResealScope) -> StoreResult<u64>;
}

/// What [`prepare`] found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrepareReport {
    /// Rows whose plain values were sealed now.
    pub sealed: u64,
}

/// Start-up: every key id the stored values name must be configured and
/// open its sample (else the start stops, naming `HERALD_ENCRYPTION_KEY`);
/// then, with a key, what is still plain is sealed; without one, a warning
/// says that secrets are stored in plain text.
pub async fn prepare(store: &dyn Store, keys: &Keyring) -> anyhow::Result<PrepareReport> {
    for s in store.sealed_samples().await? {
        debug_assert!(is_sealed(&s.stored));
        if let Err(e) = open_column(keys, &s.endpoint_id, s.column, &s.stored) {
            anyhow::bail!(
                "{e} (endpoint {}, column {}); set {} to the key(s) the store was encrypted with",
                s.endpoint_id,
                s.column.name(),
                crate::crypto::ENV_KEY
            );
        }
    }
    if !keys.is_enabled() {
        tracing::warn!(
            "HERALD_ENCRYPTION_KEY is not set: endpoint signing secrets and header values are \
             stored in PLAIN TEXT; set it to encrypt them (see docs/security.md)"
        );
        return Ok(PrepareReport { sealed: 0 });
    }
    let sealed = store.reseal_secrets(ResealScope::Plain).await?;
    if sealed > 0 {
        tracing::info!(
            rows = sealed,
            key_id = keys.current_id().unwrap_or_default(),
            "encrypted endpoints' plain secrets and headers"
        );
    }
    Ok(PrepareReport { sealed })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_values_stay_plain_and_others_seal() {
        let keys = Keyring::from_keys(&[[3; 32]]);
        assert_eq!(
            seal_column(&keys, "ep_1", SecretColumn::Headers, "{}"),
            "{}"
        );
        assert_eq!(
            seal_column(&keys, "ep_1", SecretColumn::OldSecrets, "[]"),
            "[]"
        );
        let s = seal_column(&keys, "ep_1", SecretColumn::Secret, "whsec_x");
        assert!(is_sealed(&s));
        assert!(open_column(&keys, "ep_1", SecretColumn::Headers, &s).is_err());
        let row = SecretRow {
            id: "ep_1".into(),
            secret: s.clone(),
            old_secrets: "[]".into(),
            headers: r#"{"A":"b"}"#.into(),
            url: "https://user:pass@example.com/hook".into(),
        };
        let keep = ResealScope::Plain.keep_prefix(&keys).unwrap();
        let out = row.resealed(&keys, &keep).unwrap().unwrap();
        assert_eq!(out.secret, s);
        assert!(is_sealed(&out.headers));
        assert!(is_sealed(&out.url), "a URL with credentials is sealed");
        let plain_url = seal_column(&keys, "ep_1", SecretColumn::Url, "https://example.com/");
        assert_eq!(plain_url, "https://example.com/", "one without stays plain");
        assert_eq!(out.resealed(&keys, &keep).unwrap(), None);
    }
}

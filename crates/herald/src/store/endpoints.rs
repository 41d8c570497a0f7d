//! Endpoints: their fields, secrets (with rotation), extra headers and
//! the enabled / disabled lifecycle with its health state.

use super::rows::{col, u16_col, u32_col, StoredRow};
use super::*;
use crate::crypto::Keyring;

/// Endpoints, their secrets and their enabled / disabled lifecycle.
#[async_trait]
pub trait Endpoints: Send + Sync {
    async fn create_endpoint(&self, ep: &Endpoint) -> StoreResult<()>;
    /// By id or by `uid`, within the app.
    async fn get_endpoint(&self, app: &AppId, id_or_uid: &str) -> StoreResult<Option<Endpoint>>;
    async fn list_endpoints(&self, app: &AppId, page: &PageReq) -> StoreResult<Page<Endpoint>>;
    /// Writes the fields set in `changes` and `updated_at = now`, nothing
    /// else (see [`EndpointChanges`]); false if it does not exist.
    async fn update_endpoint(
        &self,
        app: &AppId,
        ep: &EndpointId,
        changes: &EndpointChanges,
        now: Millis,
    ) -> StoreResult<bool>;
    /// Replaces the endpoint's extra headers and sets `updated_at = now`,
    /// nothing else; false if it does not exist.
    async fn set_endpoint_headers(
        &self,
        app: &AppId,
        ep: &EndpointId,
        headers: &BTreeMap<String, String>,
        now: Millis,
    ) -> StoreResult<bool>;
    /// Deletes the endpoint and its deliveries (attempt history stays).
    async fn delete_endpoint(&self, app: &AppId, id: &EndpointId) -> StoreResult<bool>;
    /// How many endpoints `app` has (for `HERALD_MAX_ENDPOINTS_PER_APP`).
    async fn count_endpoints(&self, app: &AppId) -> StoreResult<u64>;
    /// Replaces the endpoint's secret with `new_secret`; the current one
    /// keeps signing until `grace_until` (see [`rotated_old_secrets`]).
    /// False if the endpoint does not exist.
    async fn rotate_secret(
        &self,
        app: &AppId,
        ep: &EndpointId,
        new_secret: &str,
        grace_until: Millis,
        now: Millis,
    ) -> StoreResult<bool>;
    /// The endpoint's health state (None if it does not exist).
    async fn endpoint_status(&self, ep: &EndpointId) -> StoreResult<Option<EndpointStatus>>;
    /// Disables an endpoint with a reason. With `streak_started_at`, only
    /// if that failing streak is still the current one (a success since
    /// then wins). False if nothing changed (already disabled, gone, or the
    /// streak moved on).
    async fn disable_endpoint(
        &self,
        ep: &EndpointId,
        reason: &str,
        auto: bool,
        streak_started_at: Option<Millis>,
        now: Millis,
    ) -> StoreResult<bool>;
    /// Enables a disabled endpoint and resets its streak; its held
    /// deliveries resume, except those whose cycle started before
    /// `too_old_before`, which become dead ("too old"). An endpoint that is
    /// already enabled is left exactly as it is (its pending deliveries are
    /// not held, so no age rule applies to them here). None if it does not
    /// exist.
    async fn enable_endpoint(
        &self,
        app: &AppId,
        ep: &EndpointId,
        now: Millis,
        too_old_before: Millis,
    ) -> StoreResult<Option<EnableReport>>;
}

#[derive(Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub id: EndpointId,
    pub app_id: AppId,
    pub uid: Option<String>,
    pub url: String,
    pub description: String,
    /// `None`: every event type. `Some(list)`: only those.
    pub filter_types: Option<Vec<String>>,
    pub disabled: bool,
    /// Svix's `throttleRate` (alias `rateLimit`): requests per second at
    /// most, enforced by the claim (see [`throttled_rate`]); 0 or `None`:
    /// no limit.
    pub rate_limit: Option<u16>,
    /// `"fifo"`: one request at a time, in queue order.
    pub ordering: EndpointOrdering,
    pub metadata: BTreeMap<String, String>,
    /// `None`: every message. `Some(list)`: only messages with one of these.
    pub channels: Option<Vec<String>>,
    /// Extra headers sent with every request to this endpoint.
    pub headers: BTreeMap<String, String>,
    /// `whsec_…`. Never logged: `Debug` redacts it.
    pub secret: String,
    pub created_at: Millis,
    pub updated_at: Millis,
    /// Its stored secret or headers did not open with the configured keys
    /// (see [`crate::store::open_endpoint_credentials`]): `secret` and
    /// `headers` are empty, and must not be written back or shown.
    pub unreadable: bool,
}

impl Endpoint {
    /// A new enabled endpoint of `app_id` with a fresh id and every option
    /// at its default (all event types and channels, no limit, no
    /// ordering, no headers or metadata), created at `now`; set the rest
    /// with struct update syntax.
    pub fn new(
        app_id: AppId,
        url: impl Into<String>,
        secret: impl Into<String>,
        now: Millis,
    ) -> Self {
        Endpoint {
            id: EndpointId::generate(),
            app_id,
            uid: None,
            url: url.into(),
            description: String::new(),
            filter_types: None,
            disabled: false,
            rate_limit: None,
            ordering: EndpointOrdering::default(),
            metadata: BTreeMap::new(),
            channels: None,
            headers: BTreeMap::new(),
            secret: secret.into(),
            created_at: now,
            updated_at: now,
            unreadable: false,
        }
    }
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("id", &self.id)
            .field("app_id", &self.app_id)
            .field("uid", &self.uid)
            .field("url", &self.url)
            .field("filter_types", &self.filter_types)
            .field("disabled", &self.disabled)
            .field("secret", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// What [`Endpoints::update_endpoint`] writes: the fields the API's PUT and
/// PATCH change, each only when `Some` (`None` leaves the stored value).
/// Nothing else is here on purpose: the disabled flag (with its reason,
/// cause and the failing streak) is written only by
/// [`Endpoints::disable_endpoint`] and [`Endpoints::enable_endpoint`], the secrets
/// only by [`Endpoints::rotate_secret`], the headers only by
/// [`Endpoints::set_endpoint_headers`]. A save that wrote back what it had read
/// would undo whatever those did in between.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndpointChanges {
    pub uid: Option<Option<String>>,
    pub url: Option<String>,
    pub description: Option<String>,
    pub filter_types: Option<Option<Vec<String>>>,
    pub rate_limit: Option<Option<u16>>,
    pub ordering: Option<EndpointOrdering>,
    pub metadata: Option<BTreeMap<String, String>>,
    pub channels: Option<Option<Vec<String>>>,
}

/// How an endpoint's deliveries are ordered (the endpoint field
/// `ordering`).
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase", try_from = "String")]
pub enum EndpointOrdering {
    /// Whatever is due goes, up to the concurrency cap (the default).
    #[default]
    None,
    /// At most one request in flight, the deliveries in the order their
    /// messages are stored (their create requests commit; ties broken by
    /// message id); a replayed or resent delivery
    /// goes to the back of the queue. The head retries on the normal
    /// schedule while the others wait; once it is delivered or dead the
    /// next one goes.
    Fifo,
}

/// From the API's text (a string, so that any other JSON type is a
/// field error naming `ordering`, as a wrong string is).
impl TryFrom<String> for EndpointOrdering {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        match s.as_str() {
            "none" => Ok(EndpointOrdering::None),
            "fifo" => Ok(EndpointOrdering::Fifo),
            other => Err(format!(
                "unknown ordering `{other}`: expected `none` or `fifo`"
            )),
        }
    }
}

impl EndpointOrdering {
    pub fn as_str(self) -> &'static str {
        match self {
            EndpointOrdering::None => "none",
            EndpointOrdering::Fifo => "fifo",
        }
    }

    /// As stored; anything but `fifo` is `none`.
    pub fn from_stored(s: &str) -> Self {
        if s == "fifo" {
            EndpointOrdering::Fifo
        } else {
            EndpointOrdering::None
        }
    }
}

/// The requests per second an endpoint's `rate_limit` allows, when it
/// limits them at all (0 is no limit, as absent).
pub fn throttled_rate(rate_limit: Option<i64>) -> Option<u32> {
    rate_limit
        .filter(|r| *r > 0)
        .and_then(|r| u32::try_from(r).ok())
}

/// The JSON-text columns of an [`EndpointChanges`], encoded once for both
/// stores: `None` leaves the column as it is, `Some(None)` clears it.
pub struct EndpointChangesJson {
    pub filter_types: Option<Option<String>>,
    pub metadata: Option<String>,
    pub channels: Option<Option<String>>,
}

impl EndpointChanges {
    pub fn json_columns(&self) -> StoreResult<EndpointChangesJson> {
        fn json<T: serde::Serialize>(v: &T) -> StoreResult<String> {
            serde_json::to_string(v).map_err(|e| StoreError::Internal(e.to_string()))
        }
        Ok(EndpointChangesJson {
            filter_types: self
                .filter_types
                .as_ref()
                .map(|f| f.as_ref().map(json).transpose())
                .transpose()?,
            metadata: self.metadata.as_ref().map(json).transpose()?,
            channels: self
                .channels
                .as_ref()
                .map(|c| c.as_ref().map(json).transpose())
                .transpose()?,
        })
    }
}

/// An endpoint's health state, kept current by [`Queue::complete`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndpointStatus {
    pub fail_streak: u32,
    pub streak_started_at: Option<Millis>,
    pub last_success_at: Option<Millis>,
    pub last_error: Option<String>,
    pub last_error_at: Option<Millis>,
    pub disabled: bool,
    pub disabled_reason: Option<String>,
    pub disabled_at: Option<Millis>,
    /// Herald disabled it (as opposed to a person).
    pub auto_disabled: bool,
}

/// Most secrets a rotation keeps signing with besides the current one.
pub const MAX_OLD_SECRETS: usize = 10;

/// One secret replaced by a rotation, signing until `expires_at`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OldSecret {
    pub key: String,
    pub expires_at: Millis,
}

/// The still-valid old secrets in their stored JSON form (`[]` is the
/// common case and costs no parsing).
pub fn valid_old_secrets(json: &str, now: Millis) -> StoreResult<Vec<String>> {
    if json == "[]" {
        return Ok(Vec::new());
    }
    let all: Vec<OldSecret> = serde_json::from_str(json)
        .map_err(|e| StoreError::Internal(format!("bad old_secrets: {e}")))?;
    Ok(all
        .into_iter()
        .filter(|s| s.expires_at > now)
        .map(|s| s.key)
        .collect())
}

/// The old-secrets JSON after `current` is replaced: `current` first,
/// valid until `grace_until`; expired ones dropped; at most
/// [`MAX_OLD_SECRETS`].
pub fn rotated_old_secrets(
    json: &str,
    current: &str,
    grace_until: Millis,
    now: Millis,
) -> StoreResult<String> {
    let mut all: Vec<OldSecret> = serde_json::from_str(json)
        .map_err(|e| StoreError::Internal(format!("bad old_secrets: {e}")))?;
    all.retain(|s| s.expires_at > now);
    if grace_until > now {
        all.insert(
            0,
            OldSecret {
                key: current.to_owned(),
                expires_at: grace_until,
            },
        );
    }
    all.truncate(MAX_OLD_SECRETS);
    serde_json::to_string(&all).map_err(|e| StoreError::Internal(e.to_string()))
}

/// What rotating endpoint `id`'s secret to `new_secret` writes, sealed:
/// `(secret, old_secrets)`, the current secret (opened from the stored
/// `secret`) kept among the old ones until `grace_until` (see
/// [`rotated_old_secrets`]). Fails if the stored columns do not open.
pub fn rotated_secret_columns(
    keys: &Keyring,
    id: &str,
    stored_secret: &str,
    stored_old: &str,
    new_secret: &str,
    grace_until: Millis,
    now: Millis,
) -> StoreResult<(String, String)> {
    let secret = open_or_fail(keys, id, SecretColumn::Secret, stored_secret)?;
    let old = open_or_fail(keys, id, SecretColumn::OldSecrets, stored_old)?;
    let old = rotated_old_secrets(&old, &secret, grace_until, now)?;
    Ok((
        seal_column(keys, id, SecretColumn::Secret, new_secret),
        seal_column(keys, id, SecretColumn::OldSecrets, &old),
    ))
}

/// An endpoint's extra headers from their stored JSON (`{}` costs no
/// parsing).
pub fn headers_of(json: &str) -> StoreResult<Vec<(String, String)>> {
    if json == "{}" {
        return Ok(Vec::new());
    }
    let map: BTreeMap<String, String> = serde_json::from_str(json)
        .map_err(|e| StoreError::Internal(format!("bad endpoint headers: {e}")))?;
    Ok(map.into_iter().collect())
}

/// What enabling an endpoint did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EnableReport {
    /// It was disabled before.
    pub was_disabled: bool,
    /// Held deliveries past the age cap, now dead as "too old".
    pub expired: u64,
}

/// An endpoint from its stored row (either backend), its credentials
/// opened with `keys`.
pub(crate) fn endpoint_from_row(r: &impl StoredRow, keys: &Keyring) -> StoreResult<Endpoint> {
    let filter: Option<String> = col(r, "filter_types")?;
    let id: String = col(r, "id")?;
    let opened = open_endpoint_credentials(
        keys,
        &id,
        &col::<String>(r, "url")?,
        &col::<String>(r, "secret")?,
        &col::<String>(r, "headers")?,
    );
    Ok(Endpoint {
        id: EndpointId::from_trusted(id),
        app_id: AppId::from_trusted(col(r, "app_id")?),
        uid: col(r, "uid")?,
        url: opened.url,
        description: col(r, "description")?,
        filter_types: filter.as_deref().map(from_json).transpose()?,
        disabled: col(r, "disabled")?,
        rate_limit: u16_col(r, "rate_limit")?,
        ordering: EndpointOrdering::from_stored(&col::<String>(r, "ordering")?),
        metadata: from_json(&col::<String>(r, "metadata")?)?,
        channels: col::<Option<String>>(r, "channels")?
            .as_deref()
            .map(from_json)
            .transpose()?,
        headers: from_json(&opened.headers_json)?,
        secret: opened.secret,
        unreadable: opened.unreadable,
        created_at: col(r, "created_at")?,
        updated_at: col(r, "updated_at")?,
    })
}

/// `disabled_by` as stored: "auto" when Herald disabled the endpoint
/// itself, "operator" when someone asked.
pub(crate) fn disabled_by(auto: bool) -> &'static str {
    if auto {
        "auto"
    } else {
        "operator"
    }
}

/// An endpoint's health state from its stored row (either backend).
pub(crate) fn status_from_row(r: &impl StoredRow) -> StoreResult<EndpointStatus> {
    let by: Option<String> = col(r, "disabled_by")?;
    Ok(EndpointStatus {
        fail_streak: u32_col(r, "fail_streak")?,
        streak_started_at: col(r, "streak_started_at")?,
        last_success_at: col(r, "last_success_at")?,
        last_error: col(r, "last_error")?,
        last_error_at: col(r, "last_error_at")?,
        disabled: col(r, "disabled")?,
        disabled_reason: col(r, "disabled_reason")?,
        disabled_at: col(r, "disabled_at")?,
        auto_disabled: by.as_deref() == Some(disabled_by(true)),
    })
}

//! Endpoint lifecycle and operator events.
//!
//! Enabling and disabling an endpoint go through here, whoever asks (the
//! API, the dashboard, the CLI through the API, the dispatcher's
//! auto-disable), so the rules hold the same everywhere: enabling a
//! disabled endpoint resets the failing streak and lets held deliveries
//! resume, except those past the age cap, which become dead as "too old";
//! enabling one that is enabled, or disabling one that is disabled, changes
//! nothing.
//!
//! When `HERALD_OPERATOR_WEBHOOK_URL` is set, the changes (and deliveries
//! going dead) are also sent there as signed webhooks. They travel the
//! ordinary durable path: an internal application with one endpoint, so
//! they are stored, retried and survive restarts like any other message.
//!
//! That application is known by the id Herald recorded in its settings
//! when it made it, never by a name: a uid can be chosen by whoever creates
//! an application, and the operator application's endpoint is the one
//! thing Herald sends to without the SSRF guard. Its uid `herald-operator`
//! (like every `herald-` uid) is refused to the API, and no application
//! token or portal link can be made for it.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context;
use serde_json::json;
use tokio::sync::Notify;

use crate::config::Config;
use crate::ids::{AppId, EndpointId};
use crate::store::{
    now_millis, App, ClaimedDelivery, Completion, EnableReport, Endpoint, EndpointChanges, Millis,
    NewMessage, NextState, PageReq, Store, StoreError, StoreResult,
};

/// The `uid` of the application that carries operator events (when no
/// other application holds it: see [`Operator::start`]).
pub const OPERATOR_APP_UID: &str = "herald-operator";
/// The `uid` of its one endpoint.
pub const OPERATOR_ENDPOINT_UID: &str = "operator";
/// Application uids with this prefix are Herald's: the API refuses them.
pub const RESERVED_UID_PREFIX: &str = "herald-";
/// The setting holding the operator application's id.
const OPERATOR_APP_SETTING: &str = "operator_app_id";
const OPERATOR_APP_NAME: &str = "Herald operator events";

#[derive(Clone)]
pub struct Operator {
    store: Arc<dyn Store>,
    wake: Arc<Notify>,
    max_age: Duration,
    /// The operator application, when operator webhooks are configured.
    events_app: Option<AppId>,
    /// Told of every endpoint this process disables (the dispatcher, so
    /// that deliveries it already holds for it are not sent). A hook rather
    /// than a call: the dispatcher sits above this module.
    on_disabled: Arc<OnceLock<DisabledHook>>,
    /// Its endpoint and the configured URL: the one destination sent
    /// without the SSRF guard.
    events_endpoint: Option<(EndpointId, String)>,
}

/// See [`Operator::on_disabled`].
pub type DisabledHook = Box<dyn Fn(&EndpointId) + Send + Sync>;

impl Operator {
    /// Without operator webhooks.
    pub fn new(store: Arc<dyn Store>, config: &Config, wake: Arc<Notify>) -> Self {
        Operator {
            store,
            wake,
            max_age: config.delivery.retry.max_age,
            events_app: None,
            events_endpoint: None,
            on_disabled: Arc::new(OnceLock::new()),
        }
    }

    /// Sets what is told of each endpoint disabled through this operator
    /// (or a clone of it) from now on; the first caller wins.
    pub fn on_disabled(&self, hook: DisabledHook) {
        if self.on_disabled.set(hook).is_err() {
            tracing::error!("an endpoint-disabled hook is already set");
        }
    }

    /// With operator webhooks when configured: makes sure the operator
    /// application and its endpoint exist and point where the configuration
    /// says (several processes may do this at once).
    pub async fn start(
        store: Arc<dyn Store>,
        config: &Config,
        wake: Arc<Notify>,
    ) -> anyhow::Result<Self> {
        let mut op = Operator::new(store.clone(), config, wake);
        let Some((url, secret)) = &config.delivery.operator_webhook else {
            return Ok(op);
        };
        let app_id = operator_app_id(store.as_ref(), url).await?;
        let app = operator_app(store.as_ref(), &app_id).await?;
        let endpoint = operator_endpoint(store.as_ref(), &app, url, secret).await?;
        // Userinfo in the URL is a credential: never logged.
        tracing::info!(url = %crate::net::masked_url(url), app = %app.id, "operator webhooks are on");
        op.events_app = Some(app.id);
        op.events_endpoint = Some((endpoint.id, url.clone()));
        Ok(op)
    }

    /// Whether `app` is the operator application (whose own changes are
    /// not reported, and for which no token is made).
    pub fn is_operator_app(&self, app: &AppId) -> bool {
        self.events_app.as_ref() == Some(app)
    }

    /// Whether `app` is, or was, Herald's operator application, configured
    /// here or not (another process may send its events): it gets no
    /// application tokens.
    pub async fn owns(&self, app: &AppId) -> StoreResult<bool> {
        if self.is_operator_app(app) {
            return Ok(true);
        }
        let recorded = self.store.get_setting(OPERATOR_APP_SETTING).await?;
        Ok(recorded.as_deref() == Some(app.as_str()))
    }

    /// Whether `d` may be sent without the SSRF guard: only a delivery to
    /// the operator application's own endpoint, still at the configured
    /// URL. Anything else in that application (an endpoint the admin
    /// added, or its URL changed through the API) is guarded like a
    /// customer's.
    pub fn sends_unguarded(&self, d: &ClaimedDelivery) -> bool {
        self.is_operator_app(&d.app_id)
            && self
                .events_endpoint
                .as_ref()
                .is_some_and(|(id, url)| *id == d.endpoint_id && *url == d.url)
    }

    /// Stores one operator event for delivery.
    async fn emit(&self, event_type: &str, data: serde_json::Value) {
        self.emit_all(vec![(event_type, data)]).await;
    }

    /// Stores operator events for delivery, in one transaction; a failure
    /// is logged, never passed on (the changes they report have happened).
    async fn emit_all(&self, events: Vec<(&str, serde_json::Value)>) {
        let Some(app) = &self.events_app else { return };
        if events.is_empty() {
            return;
        }
        let now = now_millis();
        let messages: Vec<NewMessage> = events
            .into_iter()
            .map(|(event_type, data)| {
                let payload = json!({
                    "type": event_type,
                    "timestamp": crate::store::rfc3339(now),
                    "data": data,
                });
                NewMessage::plain(app, event_type, payload.to_string(), now)
            })
            .collect();
        match self.store.insert_messages(&messages).await {
            Ok(_) => self.wake.notify_one(),
            Err(e) => {
                tracing::warn!(error = %e, count = messages.len(), "could not store operator events")
            }
        }
    }

    /// Disables an endpoint for `reason`. `auto`: Herald decided, and the
    /// endpoint keeps collecting new messages (held); otherwise a person
    /// did, and nothing new is routed to it until it is enabled. With
    /// `streak_started_at`, only if that failing streak is still current.
    pub async fn disable(
        &self,
        app: &AppId,
        ep: &EndpointId,
        reason: &str,
        auto: bool,
        streak_started_at: Option<Millis>,
    ) -> StoreResult<bool> {
        let changed = self
            .store
            .disable_endpoint(ep, reason, auto, streak_started_at, now_millis())
            .await?;
        if changed {
            if let Some(hook) = self.on_disabled.get() {
                hook(ep);
            }
            tracing::warn!(app = %app, endpoint = %ep, reason, auto, "endpoint disabled");
            if !self.is_operator_app(app) {
                let (app_uid, ep_uid) = self.uids(app, ep).await;
                self.emit(
                    "endpoint.disabled",
                    json!({
                        "appId": app.as_str(),
                        "appUid": app_uid,
                        "endpointId": ep.as_str(),
                        "endpointUid": ep_uid,
                        "reason": reason,
                        "trigger": if auto { "automatic" } else { "manual" },
                        "failSince": streak_started_at.map(crate::store::rfc3339),
                    }),
                )
                .await;
            }
        }
        Ok(changed)
    }

    /// Tells operators of a circuit breaker's transition, once (the
    /// completer batch that made it calls this): `endpoint.circuit_opened`
    /// when a closed breaker opens, with the window's figures, and
    /// `endpoint.circuit_closed` when a probe closes it. A reopening after
    /// a failed probe is only logged: the endpoint was open all along.
    pub async fn circuit_changed(&self, change: &crate::store::CircuitChange) {
        use crate::store::Transition;
        let (app, ep) = (&change.app_id, &change.endpoint_id);
        let c = &change.circuit;
        let (event, figures) = match change.transition {
            Transition::Opened {
                attempts,
                failures,
                failure_rate,
            } => {
                tracing::warn!(app = %app, endpoint = %ep, attempts, failures, failure_rate, until = ?c.until, "circuit opened");
                (
                    "endpoint.circuit_opened",
                    json!({
                        "attempts": attempts,
                        "failures": failures,
                        "failureRate": failure_rate,
                        "openUntil": c.until.map(crate::store::rfc3339),
                        "cooldownSeconds": c.cooldown_ms / 1000,
                    }),
                )
            }
            Transition::Reopened => {
                tracing::warn!(app = %app, endpoint = %ep, until = ?c.until, cooldown_ms = c.cooldown_ms, "circuit reopened: the probe failed");
                return;
            }
            Transition::Closed => {
                tracing::info!(app = %app, endpoint = %ep, "circuit closed: the probe succeeded");
                ("endpoint.circuit_closed", json!({}))
            }
        };
        if self.is_operator_app(app) {
            return;
        }
        let (app_uid, ep_uid) = self.uids(app, ep).await;
        let mut data = json!({
            "appId": app.as_str(),
            "appUid": app_uid,
            "endpointId": ep.as_str(),
            "endpointUid": ep_uid,
        });
        if let (Some(obj), serde_json::Value::Object(more)) = (data.as_object_mut(), figures) {
            obj.extend(more);
        }
        self.emit(event, data).await;
    }

    /// Enables an endpoint (see the module comment). None if not found.
    pub async fn enable(&self, app: &AppId, ep: &EndpointId) -> StoreResult<Option<EnableReport>> {
        let now = now_millis();
        let max_age = i64::try_from(self.max_age.as_millis()).unwrap_or(i64::MAX);
        let report = self
            .store
            .enable_endpoint(app, ep, now, now.saturating_sub(max_age))
            .await?;
        if let Some(r) = report {
            if r.was_disabled {
                // Its held deliveries are claimable again.
                self.wake.notify_one();
                tracing::info!(app = %app, endpoint = %ep, expired = r.expired, "endpoint enabled");
                if !self.is_operator_app(app) {
                    let (app_uid, ep_uid) = self.uids(app, ep).await;
                    self.emit(
                        "endpoint.enabled",
                        json!({
                            "appId": app.as_str(),
                            "appUid": app_uid,
                            "endpointId": ep.as_str(),
                            "endpointUid": ep_uid,
                            "expiredDeliveries": r.expired,
                        }),
                    )
                    .await;
                }
            }
        }
        Ok(report)
    }

    /// Reports, among `moved` (completions recorded as having moved their
    /// delivery on, [`crate::store::Completed`]), as Svix does:
    /// `message.attempt.exhausted` for each that went dead,
    /// `message.attempt.failing` for the fourth failed attempt of a
    /// retry cycle that will be retried, and `message.attempt.recovered`
    /// for a success after that (the fifth attempt of the cycle or later).
    /// A stale completion, whose delivery was resent or re-claimed
    /// meanwhile, moved nothing and must not be passed here.
    pub async fn report_attempts(&self, moved: &[&Completion]) {
        if self.events_app.is_none() {
            return;
        }
        let chosen: Vec<(&Completion, &str, Option<&str>)> = moved
            .iter()
            .filter(|c| !self.is_operator_app(&c.attempt.app_id))
            .filter_map(|&c| match c.next {
                NextState::Dead(reason) => {
                    Some((c, "message.attempt.exhausted", Some(reason.as_str())))
                }
                NextState::Retry { .. } if c.cycle_attempt == FAILING_AFTER => {
                    Some((c, "message.attempt.failing", None))
                }
                NextState::Delivered if c.cycle_attempt > FAILING_AFTER => {
                    Some((c, "message.attempt.recovered", None))
                }
                _ => None,
            })
            .collect();
        if chosen.is_empty() {
            return;
        }
        // Rare (a handful per failing endpoint), so the uids Svix's shape
        // carries are looked up here rather than carried on the hot path.
        let mut events = Vec::with_capacity(chosen.len());
        for (c, event_type, reason) in chosen {
            let a = &c.attempt;
            let app_uid = self.app_uid(&a.app_id).await;
            let event_id = match self.store.get_message(&a.app_id, a.msg_id.as_str()).await {
                Ok(m) => m.and_then(|m| m.event_id),
                Err(_) => None,
            };
            let mut data = json!({
                "appId": a.app_id.as_str(),
                "appUid": app_uid,
                "msgId": a.msg_id.as_str(),
                "msgEventId": event_id,
                "endpointId": a.endpoint_id.as_str(),
                "deliveryId": a.delivery_id.as_str(),
                "lastAttempt": {
                    "id": a.id.as_str(),
                    "timestamp": crate::store::rfc3339(a.started_at),
                    "responseStatusCode": a.status_code.unwrap_or(0),
                    "error": a.error,
                },
            });
            if let (Some(reason), Some(obj)) = (reason, data.as_object_mut()) {
                obj.insert("reason".into(), json!(reason));
            }
            events.push((event_type, data));
        }
        self.emit_all(events).await;
    }

    /// `endpoint.created`, `endpoint.updated` or `endpoint.deleted` (Svix's
    /// shape: app and endpoint ids and uids) of `ep` as the change left it
    /// (as it was, for a deletion), for a change made through the API.
    pub async fn endpoint_changed(&self, event_type: EndpointEvent, ep: &Endpoint) {
        let app = &ep.app_id;
        if self.events_app.is_none() || self.is_operator_app(app) {
            return;
        }
        let app_uid = self.app_uid(app).await;
        self.emit(
            event_type.name(),
            json!({
                "appId": app.as_str(),
                "appUid": app_uid,
                "endpointId": ep.id.as_str(),
                "endpointUid": ep.uid.as_deref(),
            }),
        )
        .await;
    }

    async fn uids(&self, app: &AppId, ep: &EndpointId) -> (Option<String>, Option<String>) {
        let ep_uid = match self.store.get_endpoint(app, ep.as_str()).await {
            Ok(found) => found.and_then(|e| e.uid),
            Err(_) => None,
        };
        (self.app_uid(app).await, ep_uid)
    }

    async fn app_uid(&self, app: &AppId) -> Option<String> {
        match self.store.get_app(app.as_str()).await {
            Ok(found) => found.and_then(|a| a.uid),
            Err(_) => None,
        }
    }
}

/// Which endpoint change [`Operator::endpoint_changed`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointEvent {
    Created,
    Updated,
    Deleted,
}

impl EndpointEvent {
    pub fn name(self) -> &'static str {
        match self {
            EndpointEvent::Created => "endpoint.created",
            EndpointEvent::Updated => "endpoint.updated",
            EndpointEvent::Deleted => "endpoint.deleted",
        }
    }
}

/// Svix sends `message.attempt.failing` after this many failed attempts.
const FAILING_AFTER: u32 = 4;

/// The operator application's id: the one recorded in the settings, or at
/// the first start with operator webhooks, a new one (several processes
/// may start at once: the first recorded wins). An application an earlier
/// Herald made under the uid `herald-operator` is adopted only if it is
/// plainly that one (see [`adoptable`]); any other holder of the uid stays
/// an ordinary, guarded application.
async fn operator_app_id(store: &dyn Store, url: &str) -> anyhow::Result<AppId> {
    if let Some(stored) = store.get_setting(OPERATOR_APP_SETTING).await? {
        return AppId::parse(&stored)
            .with_context(|| format!("setting {OPERATOR_APP_SETTING} is not an application id"));
    }
    let proposed = match store.get_app(OPERATOR_APP_UID).await? {
        Some(old) => match adoptable(store, &old, url).await? {
            Ok(()) => {
                tracing::info!(app = %old.id, "adopting the operator application an earlier Herald made");
                old.id
            }
            Err(why) => {
                tracing::warn!(
                    app = %old.id,
                    why,
                    "the application with uid {OPERATOR_APP_UID} is not Herald's operator \
                     application: it stays an ordinary application and a new one carries \
                     operator events; if an earlier Herald wrote the operator webhook's \
                     secret into it, rotate HERALD_OPERATOR_WEBHOOK_SECRET"
                );
                AppId::generate()
            }
        },
        None => AppId::generate(),
    };
    let kept = store
        .init_setting(OPERATOR_APP_SETTING, proposed.as_str())
        .await?;
    AppId::parse(&kept)
        .with_context(|| format!("setting {OPERATOR_APP_SETTING} is not an application id"))
}

/// Ok if `app`, found under the uid `herald-operator` in a store an earlier
/// Herald used, is the operator application that Herald made: nothing but
/// the one endpoint Herald makes, at the configured URL, and no API token
/// (so no customer ever held it). Otherwise why not.
async fn adoptable(
    store: &dyn Store,
    app: &App,
    url: &str,
) -> StoreResult<Result<(), &'static str>> {
    if !store.list_tokens(&app.id).await?.is_empty() {
        return Ok(Err("it has application tokens"));
    }
    let endpoints = store
        .list_endpoints(
            &app.id,
            &PageReq {
                limit: 2,
                after: None,
                ascending: true,
                backwards: false,
            },
        )
        .await?
        .items;
    Ok(match endpoints.as_slice() {
        [ep] if ep.uid.as_deref() == Some(OPERATOR_ENDPOINT_UID) && ep.url == url => Ok(()),
        [_] => Err("its endpoint is not Herald's at the configured URL"),
        _ => Err("it does not have exactly one endpoint"),
    })
}

/// The operator application with id `id`, made if it does not exist (yet,
/// or any more): under the uid `herald-operator` if that is free.
async fn operator_app(store: &dyn Store, id: &AppId) -> anyhow::Result<App> {
    // `get_app` matches uids too: only the application with this very id.
    let find = |found: Option<App>| found.filter(|app| app.id == *id);
    if let Some(app) = find(store.get_app(id.as_str()).await?) {
        return Ok(app);
    }
    let now = now_millis();
    let mut app = App {
        id: id.clone(),
        uid: None,
        name: OPERATOR_APP_NAME.to_owned(),
        rate_limit: None,
        metadata: Default::default(),
        created_at: now,
        updated_at: now,
    };
    if store.get_app(OPERATOR_APP_UID).await?.is_none() {
        app.uid = Some(OPERATOR_APP_UID.to_owned());
    }
    match store.create_app(&app).await {
        Ok(()) => return Ok(app),
        Err(StoreError::Conflict(_)) => {}
        Err(e) => return Err(e.into()),
    }
    // Another process made it first, or took the uid in between.
    if let Some(app) = find(store.get_app(id.as_str()).await?) {
        return Ok(app);
    }
    app.uid = None;
    match store.create_app(&app).await {
        Ok(()) => Ok(app),
        Err(StoreError::Conflict(_)) => find(store.get_app(id.as_str()).await?)
            .context("the operator application could not be made"),
        Err(e) => Err(e.into()),
    }
}

/// The operator application's one endpoint, made or set to the configured
/// URL and secret.
async fn operator_endpoint(
    store: &dyn Store,
    app: &App,
    url: &str,
    secret: &str,
) -> anyhow::Result<Endpoint> {
    let now = now_millis();
    if let Some(mut ep) = store.get_endpoint(&app.id, OPERATOR_ENDPOINT_UID).await? {
        if ep.url != url {
            let changes = EndpointChanges {
                url: Some(url.to_owned()),
                ..EndpointChanges::default()
            };
            store
                .update_endpoint(&app.id, &ep.id, &changes, now)
                .await?;
            ep.url = url.to_owned();
        }
        if ep.secret != secret {
            // The configured secret is the one its receiver checks: the old
            // one keeps no grace period.
            store
                .rotate_secret(&app.id, &ep.id, secret, now, now)
                .await?;
            ep.secret = secret.to_owned();
        }
        return Ok(ep);
    }
    let ep = Endpoint {
        uid: Some(OPERATOR_ENDPOINT_UID.to_owned()),
        description: OPERATOR_APP_NAME.to_owned(),
        ..Endpoint::new(app.id.clone(), url, secret, now)
    };
    match store.create_endpoint(&ep).await {
        Ok(()) => Ok(ep),
        // Another process made it first.
        Err(StoreError::Conflict(_)) => store
            .get_endpoint(&app.id, OPERATOR_ENDPOINT_UID)
            .await?
            .context("operator endpoint vanished"),
        Err(e) => Err(e.into()),
    }
}

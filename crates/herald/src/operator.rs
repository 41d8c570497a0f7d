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
//! ordinary durable path: an internal application (`uid` `herald-operator`)
//! with one endpoint, so they are stored, retried and survive restarts like
//! any other message.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context;
use serde_json::json;
use tokio::sync::Notify;

use crate::config::Config;
use crate::ids::{AppId, EndpointId, MsgId};
use crate::store::{
    now_millis, App, Completion, EnableReport, Endpoint, EndpointChanges, Millis, NewMessage,
    NextState, Store, StoreError, StoreResult,
};

/// The `uid` of the application that carries operator events.
pub const OPERATOR_APP_UID: &str = "herald-operator";
/// The `uid` of its one endpoint.
pub const OPERATOR_ENDPOINT_UID: &str = "operator";

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
}

/// See [`Operator::on_disabled`].
pub type DisabledHook = Box<dyn Fn(&EndpointId) + Send + Sync>;

impl Operator {
    /// Without operator webhooks.
    pub fn new(store: Arc<dyn Store>, config: &Config, wake: Arc<Notify>) -> Self {
        Operator {
            store,
            wake,
            max_age: config.retry.max_age,
            events_app: None,
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
        let Some((url, secret)) = &config.operator_webhook else {
            return Ok(op);
        };
        let now = now_millis();
        let app = match store.get_app(OPERATOR_APP_UID).await? {
            Some(app) => app,
            None => {
                let app = App {
                    id: AppId::generate(),
                    uid: Some(OPERATOR_APP_UID.to_owned()),
                    name: "Herald operator events".to_owned(),
                    rate_limit: None,
                    metadata: Default::default(),
                    created_at: now,
                    updated_at: now,
                };
                match store.create_app(&app).await {
                    Ok(()) => app,
                    // Another process made it first.
                    Err(StoreError::Conflict(_)) => store
                        .get_app(OPERATOR_APP_UID)
                        .await?
                        .context("operator application vanished")?,
                    Err(e) => return Err(e.into()),
                }
            }
        };
        match store.get_endpoint(&app.id, OPERATOR_ENDPOINT_UID).await? {
            Some(ep) => {
                if ep.url != *url {
                    let changes = EndpointChanges {
                        url: Some(url.clone()),
                        ..EndpointChanges::default()
                    };
                    store
                        .update_endpoint(&app.id, &ep.id, &changes, now)
                        .await?;
                }
                if ep.secret != *secret {
                    // The configured secret is the one its receiver checks:
                    // the old one keeps no grace period.
                    store
                        .rotate_secret(&app.id, &ep.id, secret, now, now)
                        .await?;
                }
            }
            None => {
                let ep = Endpoint {
                    id: EndpointId::generate(),
                    app_id: app.id.clone(),
                    uid: Some(OPERATOR_ENDPOINT_UID.to_owned()),
                    url: url.clone(),
                    description: "Herald operator events".to_owned(),
                    filter_types: None,
                    disabled: false,
                    rate_limit: None,
                    metadata: Default::default(),
                    channels: None,
                    headers: Default::default(),
                    secret: secret.clone(),
                    created_at: now,
                    updated_at: now,
                };
                match store.create_endpoint(&ep).await {
                    Ok(()) | Err(StoreError::Conflict(_)) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        tracing::info!(url = %url, "operator webhooks are on");
        op.events_app = Some(app.id);
        Ok(op)
    }

    pub fn is_operator_app(&self, app: &AppId) -> bool {
        self.events_app.as_ref() == Some(app)
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
            .map(|(event_type, data)| NewMessage {
                id: MsgId::generate(),
                app_id: app.clone(),
                event_type: event_type.to_owned(),
                event_id: None,
                payload: json!({
                    "type": event_type,
                    "timestamp": crate::api::rfc3339(now),
                    "data": data,
                })
                .to_string(),
                channels: None,
                created_at: now,
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
                self.emit(
                    "endpoint.disabled",
                    json!({
                        "appId": app.as_str(),
                        "endpointId": ep.as_str(),
                        "reason": reason,
                        "trigger": if auto { "automatic" } else { "manual" },
                        "failSince": streak_started_at.map(crate::api::rfc3339),
                    }),
                )
                .await;
            }
        }
        Ok(changed)
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
                    self.emit(
                        "endpoint.enabled",
                        json!({
                            "appId": app.as_str(),
                            "endpointId": ep.as_str(),
                            "expiredDeliveries": r.expired,
                        }),
                    )
                    .await;
                }
            }
        }
        Ok(report)
    }

    /// Reports the deliveries that went dead among `moved`: completions
    /// recorded as having moved their delivery on ([`crate::store::Completed`]).
    /// A stale one, whose delivery was resent or re-claimed meanwhile, did
    /// not make it dead and must not be passed here.
    pub async fn report_dead(&self, moved: &[&Completion]) {
        if self.events_app.is_none() {
            return;
        }
        let events = moved
            .iter()
            .filter_map(|&c| match c.next {
                NextState::Dead(reason) if !self.is_operator_app(&c.attempt.app_id) => {
                    Some((c, reason))
                }
                _ => None,
            })
            .map(|(c, reason)| {
                let a = &c.attempt;
                (
                    "message.attempt.exhausted",
                    json!({
                        "appId": a.app_id.as_str(),
                        "msgId": a.msg_id.as_str(),
                        "endpointId": a.endpoint_id.as_str(),
                        "deliveryId": a.delivery_id.as_str(),
                        "reason": reason.as_str(),
                        "lastAttempt": {
                            "id": a.id.as_str(),
                            "timestamp": crate::api::rfc3339(a.started_at),
                            "responseStatusCode": a.status_code,
                            "error": a.error,
                        },
                    }),
                )
            })
            .collect();
        self.emit_all(events).await;
    }
}

//! The store conformance suite: every behaviour the engine relies on,
//! written once and run against each backend (the River habit). A new
//! backend adds one arm to `helpers::Backend` and must pass all of it.
//!
//! The PostgreSQL runs need a server: `HERALD_TEST_POSTGRES_URL` (e.g.
//! `postgres://postgres@127.0.0.1:5432/test`). Each test gets its own
//! schema. Without the variable they say SKIPPED on stderr and pass.
//! Its store builders (`app`, `endpoint`, `message`, `claim`) serve other
//! files too.

pub(crate) use std::collections::HashMap;
pub(crate) use std::sync::Arc;
pub(crate) use std::time::Duration;

pub(crate) use crate::helpers::OnPostgres;
pub(crate) use herald::ids::{AppId, AttemptId, DeliveryId, EndpointId, MsgId};
pub(crate) use herald::store::*;
pub(crate) use herald_policy::DeadReason;

mod apps_and_endpoints;
mod circuits;
mod finder;
mod health;
mod lock_order;
mod queue;
mod replay;
mod retention;
mod throttle_and_fifo;
mod tokens_and_sessions;
mod wake_ups;

pub(crate) const T0: Millis = 1_700_000_000_000;

pub(crate) fn dead_of(app: &AppId, ep: Option<&EndpointId>) -> DeadFilter {
    DeadFilter {
        app: Some(app.clone()),
        endpoint: ep.cloned(),
        ..DeadFilter::default()
    }
}

/// A completion of `d` that failed (`status`) or succeeded, started at
/// `at` and taking `ms`.
pub(crate) fn outcome(
    d: &ClaimedDelivery,
    ok: bool,
    status: u16,
    at: Millis,
    ms: i64,
) -> Completion {
    let next = if ok {
        NextState::Delivered
    } else {
        NextState::Retry { at: at + 60_000 }
    };
    let mut c = completion(d, next, at + ms);
    c.attempt.started_at = at;
    c.attempt.duration_ms = ms;
    c.attempt.status_code = Some(status);
    c.attempt.success = ok;
    c
}

pub(crate) async fn claim_n(
    store: &Arc<dyn Store>,
    app: &AppId,
    n: usize,
    now: Millis,
) -> Vec<ClaimedDelivery> {
    let ms: Vec<_> = (0..n).map(|_| message(app, "x", None)).collect();
    store.insert_messages(&ms).await.expect("insert");
    // Every due delivery: n per subscribed endpoint.
    claim(store, now, 1000, &HashMap::new(), 1000).await
}

/// A new application with one endpoint and `n` messages, their
/// deliveries claimed at `T0` (up to 10).
pub(crate) async fn claimed_at_t0(
    store: &Arc<dyn Store>,
    n: usize,
) -> (App, Endpoint, Vec<ClaimedDelivery>) {
    let a = app(store, None).await;
    let e = endpoint(store, &a.id, None, false).await;
    let ms: Vec<_> = (0..n).map(|_| message(&a.id, "x", None)).collect();
    store.insert_messages(&ms).await.expect("insert");
    let got = claim(store, T0, 10, &HashMap::new(), 10).await;
    (a, e, got)
}

pub(crate) async fn app(store: &Arc<dyn Store>, uid: Option<&str>) -> App {
    let a = App {
        id: AppId::generate(),
        uid: uid.map(str::to_owned),
        name: "app".into(),
        rate_limit: None,
        metadata: [("k".to_owned(), "v".to_owned())].into(),
        created_at: T0,
        updated_at: T0,
    };
    store.create_app(&a).await.expect("create app");
    a
}

pub(crate) async fn endpoint(
    store: &Arc<dyn Store>,
    app: &AppId,
    filter: Option<Vec<&str>>,
    disabled: bool,
) -> Endpoint {
    let e = Endpoint {
        filter_types: filter.map(|f| f.into_iter().map(str::to_owned).collect()),
        disabled,
        ..Endpoint::new(
            app.clone(),
            "http://127.0.0.1:9/",
            herald_signing::Secret::generate().expose(),
            T0,
        )
    };
    store.create_endpoint(&e).await.expect("create endpoint");
    e
}

pub(crate) fn message(app: &AppId, event_type: &str, event_id: Option<&str>) -> NewMessage {
    NewMessage {
        event_id: event_id.map(str::to_owned),
        ..NewMessage::plain(app, event_type, r#"{"a": 1}"#.into(), T0)
    }
}

/// [`message`], stored.
pub(crate) async fn sent(
    store: &Arc<dyn Store>,
    app: &AppId,
    event_type: &str,
    event_id: Option<&str>,
) -> NewMessage {
    let m = message(app, event_type, event_id);
    store
        .insert_messages(std::slice::from_ref(&m))
        .await
        .expect("insert");
    m
}

pub(crate) async fn claim(
    store: &Arc<dyn Store>,
    now: Millis,
    limit: usize,
    in_flight: &HashMap<EndpointId, usize>,
    cap: usize,
) -> Vec<ClaimedDelivery> {
    store
        .claim(&ClaimRequest {
            now,
            lease_until: now + 60_000,
            limit,
            in_flight,
            endpoint_cap: cap,
            unlisted_cap: cap,
        })
        .await
        .expect("claim")
}

/// The endpoint's health state (the test fails if it has none).
pub(crate) async fn status_of(store: &Arc<dyn Store>, ep: &EndpointId) -> EndpointStatus {
    store
        .endpoint_status(ep)
        .await
        .expect("status")
        .expect("the endpoint exists")
}

pub(crate) async fn circuit_of(store: &Arc<dyn Store>, ep: &EndpointId) -> Circuit {
    store
        .circuit_of(ep)
        .await
        .expect("circuit")
        .expect("the endpoint exists")
}

pub(crate) fn completion(d: &ClaimedDelivery, next: NextState, now: Millis) -> Completion {
    Completion {
        attempt: AttemptRecord {
            id: AttemptId::generate(),
            delivery_id: d.id.clone(),
            msg_id: d.msg_id.clone(),
            endpoint_id: d.endpoint_id.clone(),
            app_id: d.app_id.clone(),
            url: d.url.clone(),
            attempt_number: d.attempts + 1,
            started_at: now,
            duration_ms: 3,
            status_code: Some(if next == NextState::Delivered {
                200
            } else {
                500
            }),
            response: "excerpt".into(),
            error: None,
            success: next == NextState::Delivered,
            manual: d.manual,
        },
        lease_token: d.lease_token.clone(),
        next,
        now,
        cycle_attempt: d.attempts + 1,
    }
}

pub(crate) fn page(limit: usize, after: Option<String>, ascending: bool) -> PageReq {
    PageReq {
        limit,
        after,
        ascending,
        backwards: false,
    }
}

/// The kept counters (an endpoint's stats, the queue's totals) against a
/// full count of every delivery of `msgs` read back one by one.
pub(crate) async fn assert_counts_exact(
    store: &Arc<dyn Store>,
    msgs: &[(AppId, MsgId)],
    endpoints: &[EndpointId],
    disabled: &[EndpointId],
    step: &str,
) {
    let mut full: HashMap<EndpointId, DeliveryCounts> = HashMap::new();
    for (app, msg) in msgs {
        for d in store
            .list_deliveries_of_message(app, msg)
            .await
            .expect("deliveries")
        {
            let c = full.entry(d.endpoint_id.clone()).or_default();
            match d.state {
                DeliveryState::Pending => c.pending += 1,
                DeliveryState::Delivering => c.delivering += 1,
                DeliveryState::Delivered => c.delivered += 1,
                DeliveryState::Dead => c.dead += 1,
            }
        }
    }
    for ep in endpoints {
        let kept = store.endpoint_delivery_counts(ep).await.expect("counts");
        let want = full.get(ep).copied().unwrap_or_default();
        assert_eq!(kept, want, "{step}: endpoint {ep}");
    }
    let total = |f: fn(&DeliveryCounts) -> u64| full.values().map(f).sum::<u64>();
    let held: u64 = disabled
        .iter()
        .filter_map(|ep| full.get(ep))
        .map(|c| c.pending)
        .sum();
    let stats = store.queue_stats(T0).await.expect("stats");
    assert_eq!(
        (stats.pending, stats.delivering, stats.dead, stats.held),
        (
            total(|c| c.pending),
            total(|c| c.delivering),
            total(|c| c.dead),
            held
        ),
        "{step}: queue totals"
    );
}

/// An endpoint of `app` with `throttleRate` `rate` and `ordering`.
pub(crate) async fn endpoint_with(
    store: &Arc<dyn Store>,
    app: &AppId,
    rate: Option<u16>,
    ordering: EndpointOrdering,
) -> Endpoint {
    let e = endpoint(store, app, None, false).await;
    let changes = EndpointChanges {
        rate_limit: Some(rate),
        ordering: Some(ordering),
        ..EndpointChanges::default()
    };
    assert!(store
        .update_endpoint(app, &e.id, &changes, T0)
        .await
        .expect("update"));
    e
}

/// `n` messages of `app`, created 1 ms apart (so in this order).
pub(crate) async fn messages_in_order(
    store: &Arc<dyn Store>,
    app: &AppId,
    n: i64,
) -> Vec<NewMessage> {
    let ms: Vec<_> = (0..n)
        .map(|i| NewMessage {
            created_at: T0 - 10_000 + i,
            ..message(app, "x", None)
        })
        .collect();
    store.insert_messages(&ms).await.expect("insert");
    ms
}

/// Whether `m` is still stored, the states of its deliveries (in state
/// order: pending, delivering, delivered, dead) and
/// how many attempts it has logged.
pub(crate) async fn history(
    store: &Arc<dyn Store>,
    m: &NewMessage,
) -> (bool, Vec<DeliveryState>, usize) {
    let stored = store
        .get_message(&m.app_id, m.id.as_str())
        .await
        .expect("get")
        .is_some();
    let mut states: Vec<DeliveryState> = store
        .list_deliveries_of_message(&m.app_id, &m.id)
        .await
        .expect("list")
        .into_iter()
        .map(|d| d.state)
        .collect();
    states.sort_by_key(|s| *s as i64);
    let attempts = store
        .list_attempts_of_message(&m.app_id, &m.id, &page(100, None, true))
        .await
        .expect("attempts")
        .items
        .len();
    (stored, states, attempts)
}

/// `n` messages of `app` of type `event_type`, created 1 ms apart from
/// `from` (so due in this order).
pub(crate) async fn typed_in_order(
    store: &Arc<dyn Store>,
    app: &AppId,
    event_type: &str,
    from: Millis,
    n: i64,
) -> Vec<NewMessage> {
    let ms: Vec<_> = (0..n)
        .map(|i| NewMessage {
            created_at: from + i,
            ..message(app, event_type, None)
        })
        .collect();
    store.insert_messages(&ms).await.expect("insert");
    ms
}

/// Completes every one of `got` as delivered at `now`.
pub(crate) async fn deliver_all(store: &Arc<dyn Store>, got: &[ClaimedDelivery], now: Millis) {
    let done: Vec<_> = got
        .iter()
        .map(|d| completion(d, NextState::Delivered, now))
        .collect();
    store.complete(&done).await.expect("complete");
}

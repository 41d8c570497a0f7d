//! The store conformance suite: every behaviour the engine relies on,
//! written once and run against each backend (the River habit). A new
//! backend adds one line to `backends!` below and must pass all of it.
//!
//! The PostgreSQL runs need a server: `HERALD_TEST_POSTGRES_URL` (e.g.
//! `postgres://postgres@127.0.0.1:5432/test`). Each test gets its own
//! schema. Without the variable they say SKIPPED on stderr and pass.

use std::collections::HashMap;
use std::sync::Arc;

use herald::ids::{AppId, AttemptId, DeliveryId, EndpointId, MsgId};
use herald::store::*;
use herald_policy::DeadReason;

const T0: Millis = 1_700_000_000_000;

struct Fixture {
    store: Arc<dyn Store>,
    _dir: tempfile::TempDir,
}

async fn sqlite() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("conformance.db").display());
    let store = herald::store::sqlite::SqliteStore::open(&url)
        .await
        .expect("open sqlite");
    Fixture {
        store: Arc::new(store),
        _dir: dir,
    }
}

/// A PostgreSQL store in a throw-away schema of the server named by
/// `HERALD_TEST_POSTGRES_URL`, dropped when the test ends.
struct PgFixture {
    store: Arc<herald::store::postgres::PostgresStore>,
    url: String,
    schema: String,
}

const POSTGRES_URL_VAR: &str = "HERALD_TEST_POSTGRES_URL";

/// `None` (after saying so on stderr) when no server is configured.
async fn postgres(test: &str) -> Option<PgFixture> {
    let url = match std::env::var(POSTGRES_URL_VAR) {
        Ok(url) if !url.trim().is_empty() => url,
        _ => {
            // Written to the real stderr, not through eprintln!, which the
            // test harness captures and hides for passing tests.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED ({POSTGRES_URL_VAR} unset): {test}"
            );
            return None;
        }
    };
    let schema = format!("herald_test_{:016x}", rand::random::<u64>());
    let store = herald::store::postgres::PostgresStore::open(&url, &schema)
        .await
        .expect("open postgres");
    Some(PgFixture {
        store: Arc::new(store),
        url,
        schema,
    })
}

impl PgFixture {
    /// Runs `test`, then drops the schema whether it passed or not.
    async fn run<F, Fut>(self, test: F)
    where
        F: FnOnce(Arc<dyn Store>) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        use futures::FutureExt;
        let store: Arc<dyn Store> = self.store.clone();
        let outcome = std::panic::AssertUnwindSafe(test(store))
            .catch_unwind()
            .await;
        self.store.close().await;
        self.drop_schema().await;
        if let Err(panic) = outcome {
            std::panic::resume_unwind(panic);
        }
    }

    async fn drop_schema(&self) {
        use sqlx::Connection;
        let dropped = async {
            let mut conn = sqlx::PgConnection::connect(&self.url).await?;
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP SCHEMA IF EXISTS \"{}\" CASCADE",
                self.schema
            )))
            .execute(&mut conn)
            .await?;
            conn.close().await
        }
        .await;
        if let Err(e) = dropped {
            eprintln!("could not drop schema {}: {e}", self.schema);
        }
    }
}

macro_rules! backends {
    ($($test:ident),* $(,)?) => {
        mod sqlite_backend {
            $(
                #[tokio::test]
                async fn $test() {
                    let f = super::sqlite().await;
                    super::$test(f.store.clone()).await;
                }
            )*
        }

        mod postgres_backend {
            $(
                #[tokio::test]
                async fn $test() {
                    let name = concat!("store_conformance::postgres_backend::", stringify!($test));
                    let Some(f) = super::postgres(name).await else {
                        return;
                    };
                    f.run(super::$test).await;
                }
            )*
        }
    };
}

backends!(
    settings_are_initialised_once,
    apps_and_endpoints_round_trip_and_resolve_uids,
    lists_page_in_stable_order_both_ways,
    insert_fans_out_to_subscribed_enabled_endpoints,
    duplicate_event_ids_are_refused_within_and_across_batches,
    claim_leases_and_expired_leases_come_back,
    claim_respects_the_limit_and_the_endpoint_cap,
    claim_skips_disabled_endpoints,
    completion_moves_deliveries_and_logs_attempts,
    a_stale_lease_token_cannot_move_a_reclaimed_delivery,
    dead_deliveries_are_never_claimed_and_replay_starts_a_new_cycle,
    resend_reuses_the_delivery_or_creates_one,
    deleting_an_endpoint_removes_its_deliveries,
);

async fn app(store: &Arc<dyn Store>, uid: Option<&str>) -> App {
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

async fn endpoint(
    store: &Arc<dyn Store>,
    app: &AppId,
    filter: Option<Vec<&str>>,
    disabled: bool,
) -> Endpoint {
    let e = Endpoint {
        id: EndpointId::generate(),
        app_id: app.clone(),
        uid: None,
        url: "http://127.0.0.1:9/".into(),
        description: String::new(),
        filter_types: filter.map(|f| f.into_iter().map(str::to_owned).collect()),
        disabled,
        rate_limit: None,
        metadata: Default::default(),
        secret: herald_signing::Secret::generate().expose(),
        created_at: T0,
        updated_at: T0,
    };
    store.create_endpoint(&e).await.expect("create endpoint");
    e
}

fn message(app: &AppId, event_type: &str, event_id: Option<&str>) -> NewMessage {
    NewMessage {
        id: MsgId::generate(),
        app_id: app.clone(),
        event_type: event_type.into(),
        event_id: event_id.map(str::to_owned),
        payload: r#"{"a": 1}"#.into(),
        created_at: T0,
    }
}

async fn claim(
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
        })
        .await
        .expect("claim")
}

fn completion(d: &ClaimedDelivery, next: NextState, now: Millis) -> Completion {
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
    }
}

fn page(limit: usize, after: Option<String>, ascending: bool) -> PageReq {
    PageReq {
        limit,
        after,
        ascending,
    }
}

async fn settings_are_initialised_once(store: Arc<dyn Store>) {
    assert_eq!(store.get_setting("k").await.expect("get"), None);
    assert_eq!(
        store.init_setting("k", "first").await.expect("init"),
        "first"
    );
    assert_eq!(
        store.init_setting("k", "second").await.expect("init"),
        "first"
    );
    assert_eq!(
        store.get_setting("k").await.expect("get").as_deref(),
        Some("first")
    );
}

async fn apps_and_endpoints_round_trip_and_resolve_uids(store: Arc<dyn Store>) {
    let a = app(&store, Some("acme")).await;
    assert_eq!(
        store.get_app(a.id.as_str()).await.expect("get"),
        Some(a.clone())
    );
    assert_eq!(store.get_app("acme").await.expect("get"), Some(a.clone()));
    assert_eq!(store.get_app("nope").await.expect("get"), None);
    let dup = App {
        id: AppId::generate(),
        ..a.clone()
    };
    assert!(matches!(
        store.create_app(&dup).await,
        Err(StoreError::Conflict(_))
    ));

    let mut e = endpoint(&store, &a.id, Some(vec!["a.b"]), false).await;
    assert_eq!(
        store.get_endpoint(&a.id, e.id.as_str()).await.expect("get"),
        Some(e.clone())
    );
    e.uid = Some("main".into());
    e.disabled = true;
    e.filter_types = None;
    assert!(store.update_endpoint(&e).await.expect("update"));
    assert_eq!(
        store.get_endpoint(&a.id, "main").await.expect("get"),
        Some(e.clone())
    );
    let other = app(&store, None).await;
    assert_eq!(
        store
            .get_endpoint(&other.id, e.id.as_str())
            .await
            .expect("get"),
        None,
        "scoped to its app"
    );
}

async fn lists_page_in_stable_order_both_ways(store: Arc<dyn Store>) {
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(app(&store, None).await.id.into_string());
    }
    let first = store.list_apps(&page(2, None, true)).await.expect("list");
    assert!(first.has_more);
    let second = store
        .list_apps(&page(2, Some(first.items[1].id.to_string()), true))
        .await
        .expect("list");
    let third = store
        .list_apps(&page(2, Some(second.items[1].id.to_string()), true))
        .await
        .expect("list");
    assert!(!third.has_more);
    let seen: Vec<String> = first
        .items
        .iter()
        .chain(&second.items)
        .chain(&third.items)
        .map(|a| a.id.to_string())
        .collect();
    assert_eq!(seen, ids);
    let desc = store.list_apps(&page(10, None, false)).await.expect("list");
    let mut reversed = ids.clone();
    reversed.reverse();
    assert_eq!(
        desc.items
            .iter()
            .map(|a| a.id.to_string())
            .collect::<Vec<_>>(),
        reversed
    );
}

async fn insert_fans_out_to_subscribed_enabled_endpoints(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let all = endpoint(&store, &a.id, None, false).await;
    let only_b = endpoint(&store, &a.id, Some(vec!["b"]), false).await;
    let _off = endpoint(&store, &a.id, None, true).await;
    let m1 = message(&a.id, "a", None);
    let m2 = message(&a.id, "b", None);
    let out = store
        .insert_messages(&[m1.clone(), m2.clone()])
        .await
        .expect("insert");
    assert_eq!(
        out,
        vec![
            InsertOutcome::Inserted { deliveries: 1 },
            InsertOutcome::Inserted { deliveries: 2 }
        ]
    );
    assert_eq!(
        store.get_message(&a.id, m1.id.as_str()).await.expect("get"),
        Some(m1.clone())
    );
    let d1 = store
        .list_deliveries_of_message(&a.id, &m1.id)
        .await
        .expect("list");
    assert_eq!(d1.len(), 1);
    assert_eq!(d1[0].endpoint_id, all.id);
    assert_eq!(d1[0].state, DeliveryState::Pending);
    let mut eps: Vec<_> = store
        .list_deliveries_of_message(&a.id, &m2.id)
        .await
        .expect("list")
        .into_iter()
        .map(|d| d.endpoint_id)
        .collect();
    eps.sort();
    let mut expected = vec![all.id.clone(), only_b.id.clone()];
    expected.sort();
    assert_eq!(eps, expected);
}

async fn duplicate_event_ids_are_refused_within_and_across_batches(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    endpoint(&store, &a.id, None, false).await;
    let first = message(&a.id, "x", Some("evt-1"));
    let same_batch = message(&a.id, "x", Some("evt-1"));
    let no_id = message(&a.id, "x", None);
    let out = store
        .insert_messages(&[first.clone(), same_batch, no_id])
        .await
        .expect("insert");
    assert_eq!(
        out,
        vec![
            InsertOutcome::Inserted { deliveries: 1 },
            InsertOutcome::DuplicateEventId,
            InsertOutcome::Inserted { deliveries: 1 }
        ]
    );
    let later = store
        .insert_messages(&[message(&a.id, "x", Some("evt-1"))])
        .await
        .expect("insert");
    assert_eq!(later, vec![InsertOutcome::DuplicateEventId]);
    assert_eq!(
        store
            .get_message(&a.id, "evt-1")
            .await
            .expect("get")
            .map(|m| m.id),
        Some(first.id)
    );
    let other = app(&store, None).await;
    let elsewhere = store
        .insert_messages(&[message(&other.id, "x", Some("evt-1"))])
        .await
        .expect("insert");
    assert_eq!(elsewhere, vec![InsertOutcome::Inserted { deliveries: 0 }]);
}

async fn claim_leases_and_expired_leases_come_back(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let e = endpoint(&store, &a.id, None, false).await;
    let m = message(&a.id, "x", None);
    store
        .insert_messages(std::slice::from_ref(&m))
        .await
        .expect("insert");
    let none = HashMap::new();
    assert!(
        claim(&store, T0 - 1, 10, &none, 10).await.is_empty(),
        "not due before its time"
    );
    let got = claim(&store, T0, 10, &none, 10).await;
    assert_eq!(got.len(), 1);
    let c = &got[0];
    assert_eq!(
        (
            c.msg_id.clone(),
            c.endpoint_id.clone(),
            c.attempts,
            c.manual
        ),
        (m.id.clone(), e.id.clone(), 0, false)
    );
    assert_eq!(c.payload, m.payload);
    assert_eq!(c.secret, e.secret);
    assert_eq!(c.cycle_started_at, T0);
    let ds = store
        .list_deliveries_of_message(&a.id, &m.id)
        .await
        .expect("list");
    assert_eq!(ds[0].state, DeliveryState::Delivering);
    assert!(
        claim(&store, T0 + 59_999, 10, &none, 10).await.is_empty(),
        "held while the lease lasts"
    );
    assert_eq!(store.next_due_at().await.expect("next"), Some(T0 + 60_000));
    let again = claim(&store, T0 + 60_000, 10, &none, 10).await;
    assert_eq!(
        again.len(),
        1,
        "an expired lease makes it due again (the crash path)"
    );
    assert_eq!(again[0].id, c.id);
    assert_ne!(again[0].lease_token, c.lease_token);
}

async fn claim_respects_the_limit_and_the_endpoint_cap(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let busy = endpoint(&store, &a.id, None, false).await;
    let b = app(&store, None).await;
    let quiet = endpoint(&store, &b.id, None, false).await;
    // The busy endpoint's backlog comes first in time.
    let early: Vec<_> = (0..20)
        .map(|_| NewMessage {
            created_at: T0 - 1000,
            ..message(&a.id, "x", None)
        })
        .collect();
    store.insert_messages(&early).await.expect("insert");
    let late: Vec<_> = (0..3).map(|_| message(&b.id, "x", None)).collect();
    store.insert_messages(&late).await.expect("insert");

    let none = HashMap::new();
    let got = claim(&store, T0, 8, &none, 3).await;
    let busy_n = got.iter().filter(|d| d.endpoint_id == busy.id).count();
    let quiet_n = got.iter().filter(|d| d.endpoint_id == quiet.id).count();
    assert_eq!(
        (busy_n, quiet_n),
        (3, 3),
        "the cap leaves room for the other endpoint"
    );

    // With the busy endpoint already at its cap, nothing more of it.
    let in_flight: HashMap<EndpointId, usize> = [(busy.id.clone(), 3)].into();
    let more = claim(&store, T0, 8, &in_flight, 3).await;
    assert!(more.is_empty(), "{more:?}");
    let in_flight: HashMap<EndpointId, usize> = [(busy.id.clone(), 1)].into();
    let more = claim(&store, T0, 8, &in_flight, 3).await;
    assert_eq!(more.len(), 2);
    let limited = claim(&store, T0, 1, &HashMap::new(), 100).await;
    assert_eq!(limited.len(), 1);
}

async fn claim_skips_disabled_endpoints(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let mut e = endpoint(&store, &a.id, None, false).await;
    store
        .insert_messages(&[message(&a.id, "x", None)])
        .await
        .expect("insert");
    e.disabled = true;
    store.update_endpoint(&e).await.expect("disable");
    assert!(
        claim(&store, T0, 10, &HashMap::new(), 10).await.is_empty(),
        "held while disabled"
    );
    e.disabled = false;
    store.update_endpoint(&e).await.expect("enable");
    assert_eq!(
        claim(&store, T0, 10, &HashMap::new(), 10).await.len(),
        1,
        "resumes when enabled"
    );
}

async fn completion_moves_deliveries_and_logs_attempts(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let e = endpoint(&store, &a.id, None, false).await;
    let ms: Vec<_> = (0..3).map(|_| message(&a.id, "x", None)).collect();
    store.insert_messages(&ms).await.expect("insert");
    let got = claim(&store, T0, 10, &HashMap::new(), 10).await;
    assert_eq!(got.len(), 3);
    let batch = vec![
        completion(&got[0], NextState::Delivered, T0 + 5),
        completion(&got[1], NextState::Retry { at: T0 + 1_000 }, T0 + 5),
        completion(
            &got[2],
            NextState::Dead(DeadReason::PermanentStatus),
            T0 + 5,
        ),
    ];
    store.complete(&batch).await.expect("complete");
    let state_of = |d: &ClaimedDelivery| {
        let store = store.clone();
        let (app, msg) = (a.id.clone(), d.msg_id.clone());
        async move {
            store
                .list_deliveries_of_message(&app, &msg)
                .await
                .expect("list")
                .remove(0)
        }
    };
    let d0 = state_of(&got[0]).await;
    assert_eq!(
        (d0.state, d0.attempts, d0.last_status),
        (DeliveryState::Delivered, 1, Some(200))
    );
    let d1 = state_of(&got[1]).await;
    assert_eq!(
        (d1.state, d1.next_attempt_at),
        (DeliveryState::Pending, T0 + 1_000)
    );
    let d2 = state_of(&got[2]).await;
    assert_eq!(
        (d2.state, d2.dead_reason),
        (DeliveryState::Dead, Some(DeadReason::PermanentStatus))
    );

    assert!(claim(&store, T0 + 999, 10, &HashMap::new(), 10)
        .await
        .is_empty());
    let retry = claim(&store, T0 + 1_000, 10, &HashMap::new(), 10).await;
    assert_eq!(retry.len(), 1);
    assert_eq!(retry[0].attempts, 1, "the next attempt is number 2");

    let attempts = store
        .list_attempts_of_endpoint(&a.id, &e.id, &page(10, None, true))
        .await
        .expect("list");
    assert_eq!(attempts.items.len(), 3);
    assert_eq!(attempts.items[0], batch[0].attempt);
    let of_msg = store
        .list_attempts_of_message(&a.id, &got[1].msg_id, &page(10, None, true))
        .await
        .expect("list");
    assert_eq!(of_msg.items, vec![batch[1].attempt.clone()]);
}

async fn a_stale_lease_token_cannot_move_a_reclaimed_delivery(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    endpoint(&store, &a.id, None, false).await;
    let m = message(&a.id, "x", None);
    store
        .insert_messages(std::slice::from_ref(&m))
        .await
        .expect("insert");
    let first = claim(&store, T0, 1, &HashMap::new(), 10).await.remove(0);
    let second = claim(&store, T0 + 60_000, 1, &HashMap::new(), 10)
        .await
        .remove(0);
    // The first holder's late outcome is logged but does not move the state.
    store
        .complete(&[completion(
            &first,
            NextState::Dead(DeadReason::Exhausted),
            T0 + 60_001,
        )])
        .await
        .expect("complete");
    let d = store
        .list_deliveries_of_message(&a.id, &m.id)
        .await
        .expect("list")
        .remove(0);
    assert_eq!(d.state, DeliveryState::Delivering);
    store
        .complete(&[completion(&second, NextState::Delivered, T0 + 60_002)])
        .await
        .expect("complete");
    let d = store
        .list_deliveries_of_message(&a.id, &m.id)
        .await
        .expect("list")
        .remove(0);
    assert_eq!(d.state, DeliveryState::Delivered);
    let log = store
        .list_attempts_of_message(&a.id, &m.id, &page(10, None, true))
        .await
        .expect("list");
    assert_eq!(log.items.len(), 2, "both attempts happened and are logged");
}

async fn dead_deliveries_are_never_claimed_and_replay_starts_a_new_cycle(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let e = endpoint(&store, &a.id, None, false).await;
    let ms: Vec<_> = (0..3).map(|_| message(&a.id, "x", None)).collect();
    store.insert_messages(&ms).await.expect("insert");
    let got = claim(&store, T0, 10, &HashMap::new(), 10).await;
    let dead: Vec<_> = got
        .iter()
        .map(|d| completion(d, NextState::Dead(DeadReason::Exhausted), T0 + 1))
        .collect();
    store.complete(&dead).await.expect("complete");
    assert!(
        claim(&store, T0 + 365 * 86_400_000, 10, &HashMap::new(), 10)
            .await
            .is_empty(),
        "dead is final"
    );
    assert_eq!(store.next_due_at().await.expect("next"), None);

    let listed = store
        .list_dead(&a.id, Some(&e.id), &page(2, None, false))
        .await
        .expect("list");
    assert_eq!(listed.items.len(), 2);
    assert!(listed.has_more);
    assert!(listed
        .items
        .iter()
        .all(|d| d.dead_reason == Some(DeadReason::Exhausted)));

    let one = got[0].id.clone();
    assert!(store
        .replay_dead(&a.id, &one, T0 + 10_000)
        .await
        .expect("replay"));
    assert!(
        !store
            .replay_dead(&a.id, &one, T0 + 10_000)
            .await
            .expect("replay"),
        "only dead ones"
    );
    assert!(!store
        .replay_dead(&a.id, &DeliveryId::generate(), T0)
        .await
        .expect("replay"));
    let again = claim(&store, T0 + 10_000, 10, &HashMap::new(), 10).await;
    assert_eq!(again.len(), 1);
    assert_eq!(
        again[0].id, one,
        "same delivery, so the same Idempotency-Key"
    );
    assert!(again[0].manual);
    assert_eq!(
        (
            again[0].attempts,
            again[0].cycle_base,
            again[0].cycle_started_at
        ),
        (1, 1, T0 + 10_000)
    );

    assert_eq!(
        store
            .replay_dead_of_endpoint(&a.id, &e.id, T0 + 20_000)
            .await
            .expect("replay all"),
        2
    );
    assert_eq!(
        store
            .list_dead(&a.id, None, &page(10, None, true))
            .await
            .expect("list")
            .items
            .len(),
        0
    );
}

async fn resend_reuses_the_delivery_or_creates_one(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let e = endpoint(&store, &a.id, Some(vec!["other"]), false).await;
    let m = message(&a.id, "x", None);
    store
        .insert_messages(std::slice::from_ref(&m))
        .await
        .expect("insert");
    assert!(store
        .list_deliveries_of_message(&a.id, &m.id)
        .await
        .expect("list")
        .is_empty());
    assert_eq!(
        store
            .resend(&a.id, &m.id, &e.id, T0 + 5)
            .await
            .expect("resend"),
        ResendOutcome::Queued
    );
    let ds = store
        .list_deliveries_of_message(&a.id, &m.id)
        .await
        .expect("list");
    assert_eq!(ds.len(), 1);
    assert_eq!(
        store
            .resend(&a.id, &m.id, &e.id, T0 + 6)
            .await
            .expect("resend"),
        ResendOutcome::Queued
    );
    let again = store
        .list_deliveries_of_message(&a.id, &m.id)
        .await
        .expect("list");
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].id, ds[0].id, "reused, so the key is stable");
    assert_eq!(
        store
            .resend(&a.id, &MsgId::generate(), &e.id, T0)
            .await
            .expect("resend"),
        ResendOutcome::NoSuchMessage
    );
    assert_eq!(
        store
            .resend(&a.id, &m.id, &EndpointId::generate(), T0)
            .await
            .expect("resend"),
        ResendOutcome::NoSuchEndpoint
    );
}

async fn deleting_an_endpoint_removes_its_deliveries(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let e = endpoint(&store, &a.id, None, false).await;
    let m = message(&a.id, "x", None);
    store
        .insert_messages(std::slice::from_ref(&m))
        .await
        .expect("insert");
    assert!(store.delete_endpoint(&a.id, &e.id).await.expect("delete"));
    assert!(!store.delete_endpoint(&a.id, &e.id).await.expect("delete"));
    assert!(store
        .list_deliveries_of_message(&a.id, &m.id)
        .await
        .expect("list")
        .is_empty());
    assert!(claim(&store, T0, 10, &HashMap::new(), 10).await.is_empty());
}

//! The store conformance suite: every behaviour the engine relies on,
//! written once and run against each backend (the River habit). A new
//! backend adds one arm to `helpers::Backend` and must pass all of it.
//!
//! The PostgreSQL runs need a server: `HERALD_TEST_POSTGRES_URL` (e.g.
//! `postgres://postgres@127.0.0.1:5432/test`). Each test gets its own
//! schema. Without the variable they say SKIPPED on stderr and pass.
//! Its store builders (`app`, `endpoint`, `message`, `claim`) serve other
//! files too.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use herald::ids::{AppId, AttemptId, DeliveryId, EndpointId, MsgId};
use herald::store::*;
use herald_policy::DeadReason;

pub(crate) const T0: Millis = 1_700_000_000_000;

crate::on_both_stores!(store:
    settings_are_initialised_once,
    apps_and_endpoints_round_trip_and_resolve_uids,
    endpoint_updates_write_only_what_they_change,
    lists_page_in_stable_order_both_ways,
    insert_fans_out_to_subscribed_enabled_endpoints,
    duplicate_event_ids_are_refused_within_and_across_batches,
    claim_leases_and_expired_leases_come_back,
    claim_respects_the_limit_and_the_endpoint_cap,
    claim_gives_unlisted_endpoints_their_own_cap,
    claim_and_next_due_at_skip_disabled_endpoints,
    ingest_claims_new_deliveries_within_the_limits,
    completion_moves_deliveries_and_logs_attempts,
    a_stale_lease_token_cannot_move_a_reclaimed_delivery,
    completion_stores_any_text_a_receiver_can_send,
    completion_tells_which_completions_moved_their_delivery,
    dead_deliveries_are_never_claimed_and_replay_starts_a_new_cycle,
    resend_reuses_the_delivery_or_creates_one,
    resend_refuses_a_delivery_in_flight,
    deleting_an_endpoint_removes_its_deliveries,
    prune_removes_old_finished_history_only,
    streaks_count_failures_in_a_row_and_reset_on_success,
    stats_buckets_add_up_per_endpoint_and_prune_by_age,
    disabling_is_guarded_by_the_streak_and_enabling_expires_old_held_deliveries,
    retention_expires_held_deliveries_past_the_age_cap,
    enabling_an_enabled_endpoint_changes_nothing,
    only_auto_disabled_endpoints_collect_new_messages,
    dead_letters_filter_across_apps_and_replay_in_bulk,
    queue_stats_count_live_dead_due_and_disabled,
    queue_stats_count_held_deliveries_apart_from_due_ones,
    find_messages_filters_by_each_field_within_the_scope,
    find_apps_by_name_uid_or_id,
    delivery_counts_stay_exact_through_every_state_change,
    overview_lists_failing_endpoints_first,
    rotated_secrets_sign_until_their_grace_ends,
    event_types_are_created_listed_updated_and_deleted,
    apps_update_and_delete_with_everything_under_them,
    tokens_are_found_by_digest_and_go_with_their_app,
    idempotency_keys_replay_refuse_and_expire,
    portal_codes_are_taken_once_and_expire_with_their_token,
    sessions_are_found_by_digest_expire_and_end_with_their_token,
    circuit_breakers_are_stepped_by_completions_and_stored,
    only_one_of_two_concurrent_probers_wins,
    retention_expires_deliveries_held_by_an_open_breaker,
    claim_reserves_throttle_slots_within_the_horizon,
    a_changed_throttle_rate_moves_the_next_slot,
    claim_takes_only_a_fifo_endpoints_head_one_at_a_time,
    throttled_and_fifo_endpoints_are_never_handed_off_at_ingest,
    first_attempts_get_their_share_of_a_claim_during_a_retry_storm,
    a_full_endpoints_backlog_waits_aside_and_comes_back_oldest_first,
    fifo_and_throttled_backlogs_set_aside_come_back_in_order,
    a_fifo_head_in_flight_holds_a_scheduled_message_that_falls_due,
    switching_to_fifo_queues_what_is_due_behind_what_is_in_flight,
    a_fifo_endpoints_order_is_the_order_its_messages_are_stored_in,
);

fn dead_of(app: &AppId, ep: Option<&EndpointId>) -> DeadFilter {
    DeadFilter {
        app: Some(app.clone()),
        endpoint: ep.cloned(),
        ..DeadFilter::default()
    }
}

/// A completion of `d` that failed (`status`) or succeeded, started at
/// `at` and taking `ms`.
fn outcome(d: &ClaimedDelivery, ok: bool, status: u16, at: Millis, ms: i64) -> Completion {
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

async fn claim_n(
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
        id: MsgId::generate(),
        app_id: app.clone(),
        event_type: event_type.into(),
        event_id: event_id.map(str::to_owned),
        payload: r#"{"a": 1}"#.into(),
        created_at: T0,
        traceparent: None,
        tags: None,
        deliver_at: None,
        payload_expires_at: None,
        application: None,
        channels: None,
    }
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
        cycle_attempt: d.attempts + 1,
    }
}

fn page(limit: usize, after: Option<String>, ascending: bool) -> PageReq {
    PageReq {
        limit,
        after,
        ascending,
        backwards: false,
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
    let changes = EndpointChanges {
        uid: Some(Some("main".into())),
        filter_types: Some(None),
        ..EndpointChanges::default()
    };
    assert!(store
        .update_endpoint(&a.id, &e.id, &changes, T0 + 1)
        .await
        .expect("update"));
    e.uid = Some("main".into());
    e.filter_types = None;
    e.updated_at = T0 + 1;
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
    assert!(!store
        .update_endpoint(&other.id, &e.id, &changes, T0 + 2)
        .await
        .expect("update"));
}

/// An update writes the fields it is given and nothing else: not the
/// disabled flag and its cause, nor the secrets, nor the headers, nor the
/// fields it leaves out, whatever they became since the caller read them.
async fn endpoint_updates_write_only_what_they_change(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let e = endpoint(&store, &a.id, None, false).await;
    let headers: std::collections::BTreeMap<String, String> =
        [("X-Team".to_owned(), "blue".to_owned())].into();
    assert!(store
        .set_endpoint_headers(&a.id, &e.id, &headers, T0 + 1)
        .await
        .expect("headers"));
    assert!(store
        .disable_endpoint(&e.id, "by hand", false, None, T0 + 2)
        .await
        .expect("disable"));
    let rotated = herald_signing::Secret::generate().expose();
    assert!(store
        .rotate_secret(&a.id, &e.id, &rotated, T0 + 100_000, T0 + 3)
        .await
        .expect("rotate"));

    let changes = EndpointChanges {
        description: Some("renamed".into()),
        ..EndpointChanges::default()
    };
    assert!(store
        .update_endpoint(&a.id, &e.id, &changes, T0 + 4)
        .await
        .expect("update"));
    let saved = store
        .get_endpoint(&a.id, e.id.as_str())
        .await
        .expect("get")
        .expect("exists");
    assert_eq!(
        saved,
        Endpoint {
            description: "renamed".into(),
            disabled: true,
            headers: headers.clone(),
            secret: rotated.clone(),
            updated_at: T0 + 4,
            ..e.clone()
        }
    );
    let status = store
        .endpoint_status(&e.id)
        .await
        .expect("status")
        .expect("exists");
    assert_eq!(
        (
            status.disabled,
            status.auto_disabled,
            status.disabled_reason.as_deref()
        ),
        (true, false, Some("by hand"))
    );

    // Headers alone: the description just written stays.
    assert!(store
        .set_endpoint_headers(&a.id, &e.id, &Default::default(), T0 + 5)
        .await
        .expect("headers"));
    let saved = store
        .get_endpoint(&a.id, e.id.as_str())
        .await
        .expect("get")
        .expect("exists");
    assert_eq!(
        (
            saved.description.as_str(),
            saved.headers.len(),
            saved.disabled
        ),
        ("renamed", 0, true)
    );
    assert!(store
        .enable_endpoint(&a.id, &e.id, T0 + 6, T0)
        .await
        .expect("enable")
        .is_some());
    // The old secret still signs: the update did not write the rotation back.
    store
        .insert_messages(&[message(&a.id, "x", None)])
        .await
        .expect("insert");
    let got = claim(&store, T0 + 10, 10, &HashMap::new(), 10).await;
    assert_eq!(
        (got[0].secret.clone(), got[0].old_secrets.clone()),
        (rotated, vec![e.secret.clone()])
    );
    let stranger = app(&store, None).await;
    assert!(!store
        .set_endpoint_headers(&stranger.id, &e.id, &headers, T0 + 7)
        .await
        .expect("headers"));
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
            channels: None,
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

/// `unlisted_cap`: an endpoint the request's `in_flight` does not list
/// gets that much room (a new lane's), a listed one `endpoint_cap` less
/// what it counts; the same for a backlog set aside and given back.
async fn claim_gives_unlisted_endpoints_their_own_cap(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let unseen = endpoint(&store, &a.id, None, false).await;
    let b = app(&store, None).await;
    let known = endpoint(&store, &b.id, None, false).await;
    for app_id in [&a.id, &b.id] {
        let ms: Vec<_> = (0..20)
            .map(|_| NewMessage {
                created_at: T0 - 1000,
                ..message(app_id, "x", None)
            })
            .collect();
        store.insert_messages(&ms).await.expect("insert");
    }
    let take = |in_flight: HashMap<EndpointId, usize>| {
        let store = store.clone();
        async move {
            store
                .claim(&ClaimRequest {
                    now: T0,
                    lease_until: T0 + 60_000,
                    limit: 100,
                    in_flight: &in_flight,
                    endpoint_cap: 10,
                    unlisted_cap: 3,
                })
                .await
                .expect("claim")
        }
    };
    let got = take([(known.id.clone(), 0)].into()).await;
    let count = |ep: &EndpointId| got.iter().filter(|d| d.endpoint_id == *ep).count();
    assert_eq!(
        (count(&unseen.id), count(&known.id)),
        (3, 10),
        "unlisted: 3; listed with nothing in flight: the whole cap"
    );
    // Listed now, with what it holds: the cap minus that.
    let got = take([(unseen.id.clone(), 3), (known.id.clone(), 10)].into()).await;
    assert_eq!(got.len(), 7, "{got:?}");
    assert!(got.iter().all(|d| d.endpoint_id == unseen.id));
}

async fn claim_and_next_due_at_skip_disabled_endpoints(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let e = endpoint(&store, &a.id, None, false).await;
    store
        .insert_messages(&[message(&a.id, "x", None)])
        .await
        .expect("insert");
    assert!(store
        .disable_endpoint(&e.id, "r", false, None, T0)
        .await
        .expect("disable"));
    assert!(
        claim(&store, T0, 10, &HashMap::new(), 10).await.is_empty(),
        "held while disabled"
    );
    // A held delivery is not due work: an idle dispatcher that took it
    // for some would claim again at once, forever.
    assert_eq!(store.next_due_at().await.expect("next"), None, "just due");
    // Long overdue (SQLite parks it out of the claim index by now).
    assert!(claim(&store, T0 + 60_000, 10, &HashMap::new(), 10)
        .await
        .is_empty());
    assert_eq!(store.next_due_at().await.expect("next"), None, "overdue");
    store
        .enable_endpoint(&a.id, &e.id, T0 + 60_000, T0)
        .await
        .expect("enable");
    assert!(store.next_due_at().await.expect("next").is_some());
    assert_eq!(
        claim(&store, T0 + 60_000, 10, &HashMap::new(), 10)
            .await
            .len(),
        1,
        "resumes when enabled"
    );
}

/// The handoff: an ingest batch claims its own new deliveries, under the
/// same limits and with the same lease as a claim.
async fn ingest_claims_new_deliveries_within_the_limits(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let busy = endpoint(&store, &a.id, None, false).await;
    let free = endpoint(&store, &a.id, None, false).await;
    let held = endpoint(&store, &a.id, None, false).await;
    assert!(store
        .disable_endpoint(&held.id, "r", true, None, T0)
        .await
        .expect("disable"));
    let b = app(&store, None).await;
    let late = endpoint(&store, &b.id, None, false).await;
    let first = message(&a.id, "x", Some("once"));
    let mut batch = vec![
        first.clone(),
        message(&a.id, "x", None),
        message(&a.id, "x", None),
        message(&a.id, "x", Some("once")),
    ];
    batch.extend((0..2).map(|_| message(&b.id, "y", None)));
    // `busy` has one in flight of its cap of two; four slots in all. In
    // batch order: busy 1, free 2 (its cap), then late 1 (the limit).
    let in_flight: HashMap<EndpointId, usize> = [(busy.id.clone(), 1)].into();
    let lease_until = T0 + 30_000;
    let (outcomes, handed) = store
        .insert_messages_claiming(
            &batch,
            &ClaimRequest {
                now: T0,
                lease_until,
                limit: 4,
                in_flight: &in_flight,
                endpoint_cap: 2,
                unlisted_cap: 2,
            },
        )
        .await
        .expect("insert");
    let three = InsertOutcome::Inserted { deliveries: 3 };
    let one = InsertOutcome::Inserted { deliveries: 1 };
    assert_eq!(
        outcomes,
        vec![
            three.clone(),
            three.clone(),
            three,
            InsertOutcome::DuplicateEventId,
            one.clone(),
            one
        ]
    );
    let count = |ep: &Endpoint| handed.iter().filter(|d| d.endpoint_id == ep.id).count();
    assert_eq!(
        (count(&busy), count(&free), count(&held), count(&late)),
        (1, 2, 0, 1),
        "{handed:?}"
    );
    for d in &handed {
        let m = batch
            .iter()
            .find(|m| m.id == d.msg_id)
            .expect("a message of the batch");
        let e = [&busy, &free, &late]
            .into_iter()
            .find(|e| e.id == d.endpoint_id)
            .expect("a claimable endpoint");
        assert_eq!(
            (&d.app_id, &d.url, &d.secret, &d.event_type, &d.payload),
            (&m.app_id, &e.url, &e.secret, &m.event_type, &m.payload)
        );
        assert_eq!(
            (d.attempts, d.cycle_started_at, d.cycle_base, d.manual),
            (0, T0, 0, false)
        );
        assert_eq!(d.lease_token, handed[0].lease_token, "one lease per batch");
        let stored = store
            .get_delivery(&d.app_id, &d.id)
            .await
            .expect("get")
            .expect("stored");
        assert_eq!(
            (stored.state, stored.next_attempt_at),
            (DeliveryState::Delivering, lease_until)
        );
    }

    // A claim gets the rest (not the held endpoint's), never these.
    let rest = claim(&store, T0, 100, &HashMap::new(), 100).await;
    assert_eq!(rest.len(), 11 - 3 - 4, "{rest:?}");
    assert!(rest.iter().all(|r| handed.iter().all(|h| h.id != r.id)));

    // The lease is a claim's: its token records the outcome, and what was
    // not recorded is due again when it runs out.
    let done = store
        .complete(&[completion(&handed[0], NextState::Delivered, T0 + 10)])
        .await;
    assert!(done.is_ok(), "{done:?}");
    assert!(claim(&store, lease_until - 1, 100, &HashMap::new(), 100)
        .await
        .is_empty());
    let mut back: Vec<_> = claim(&store, lease_until, 100, &HashMap::new(), 100)
        .await
        .into_iter()
        .map(|d| d.id)
        .collect();
    let mut expected: Vec<_> = handed[1..].iter().map(|d| d.id.clone()).collect();
    back.sort_by(|x, y| x.as_str().cmp(y.as_str()));
    expected.sort_by(|x, y| x.as_str().cmp(y.as_str()));
    assert_eq!(back, expected);
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

async fn completion_stores_any_text_a_receiver_can_send(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let e = endpoint(&store, &a.id, None, false).await;
    let ms: Vec<_> = (0..2).map(|_| message(&a.id, "x", None)).collect();
    store.insert_messages(&ms).await.expect("insert");
    let got = claim(&store, T0, 10, &HashMap::new(), 10).await;
    // A NUL (which PostgreSQL refuses in text) in an excerpt, and in an
    // error text, beside an ordinary outcome in the same batch.
    let mut odd = outcome(&got[0], false, 500, T0, 5);
    odd.attempt.response = "ok\0done".into();
    odd.attempt.error = Some("reset\0by peer".into());
    let plain = outcome(&got[1], true, 200, T0, 5);
    let done = store
        .complete(&[odd.clone(), plain.clone()])
        .await
        .expect("complete");
    assert_eq!(done.moved, vec![true, true]);
    let logged = store
        .get_attempt(&a.id, &odd.attempt.id)
        .await
        .expect("get")
        .expect("logged");
    assert_eq!(logged.response, "ok\u{FFFD}done");
    assert_eq!(logged.error.as_deref(), Some("reset\u{FFFD}by peer"));
    let d = store
        .get_delivery(&a.id, &odd.attempt.delivery_id)
        .await
        .expect("get")
        .expect("exists");
    assert_eq!(
        (d.state, d.last_error.as_deref()),
        (DeliveryState::Pending, Some("reset\u{FFFD}by peer"))
    );
    let status = store
        .endpoint_status(&e.id)
        .await
        .expect("status")
        .expect("exists");
    assert_eq!(status.last_error.as_deref(), Some("reset\u{FFFD}by peer"));
    let other = store
        .get_attempt(&a.id, &plain.attempt.id)
        .await
        .expect("get")
        .expect("logged");
    assert_eq!(other, plain.attempt, "the rest of the batch as it was");
}

async fn completion_tells_which_completions_moved_their_delivery(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let e = endpoint(&store, &a.id, None, false).await;
    let ms: Vec<_> = (0..2).map(|_| message(&a.id, "x", None)).collect();
    store.insert_messages(&ms).await.expect("insert");
    let got = claim(&store, T0, 10, &HashMap::new(), 10).await;
    let (resent, kept) = (&got[0], &got[1]);
    // The first released (pending again, its lease cleared) while its
    // outcome was on the way: that outcome is stale. (A resend of it did
    // this once; a resend of a delivery in flight is refused now.) The
    // second is completed twice under the same lease: only the first of
    // those moves it.
    store
        .release(&resent.id, &resent.lease_token, T0 + 1)
        .await
        .expect("release");
    let batch = [
        completion(kept, NextState::Delivered, T0 + 2),
        completion(kept, NextState::Dead(DeadReason::Exhausted), T0 + 3),
        completion(resent, NextState::Dead(DeadReason::Exhausted), T0 + 4),
    ];
    let done = store.complete(&batch).await.expect("complete");
    assert_eq!(done.moved, vec![true, false, false]);
    let state = |d: &ClaimedDelivery| {
        let (store, app, id) = (store.clone(), a.id.clone(), d.id.clone());
        async move {
            store
                .get_delivery(&app, &id)
                .await
                .expect("get")
                .expect("exists")
                .state
        }
    };
    assert_eq!(
        state(resent).await,
        DeliveryState::Pending,
        "left as the release made it"
    );
    assert_eq!(state(kept).await, DeliveryState::Delivered);
    // Every attempt is logged all the same, and the failed ones count in
    // the endpoint's streak: they were its answers.
    for c in &batch {
        assert!(store
            .get_attempt(&a.id, &c.attempt.id)
            .await
            .expect("get")
            .is_some());
    }
    assert_eq!(
        done.streaks
            .iter()
            .map(|s| (&s.endpoint_id, s.fail_streak))
            .collect::<Vec<_>>(),
        vec![(&e.id, 2)]
    );
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
        .list_dead(&dead_of(&a.id, Some(&e.id)), &page(2, None, false))
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
            .list_dead(&dead_of(&a.id, None), &page(10, None, true))
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

/// Review of the release binary, item 13: a resend of a delivery in flight
/// made it pending and due at once beside its attempt. It is refused
/// (`InFlight`) and changes nothing: the lease holder's outcome still moves
/// it; then a resend queues it again, its attempts counted on.
async fn resend_refuses_a_delivery_in_flight(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let e = endpoint(&store, &a.id, None, false).await;
    let got = claim_n(&store, &a.id, 1, T0).await;
    assert_eq!(got.len(), 1);
    let m = got[0].msg_id.clone();
    assert_eq!(
        store
            .resend(&a.id, &m, &e.id, T0 + 1)
            .await
            .expect("resend"),
        ResendOutcome::InFlight
    );
    let none = HashMap::new();
    assert!(
        claim(&store, T0 + 2, 100, &none, 100).await.is_empty(),
        "nothing queued again beside the attempt in flight"
    );
    let done = completion(&got[0], NextState::Delivered, T0 + 3);
    let moved = store.complete(&[done]).await.expect("complete");
    let ds = store
        .list_deliveries_of_message(&a.id, &m)
        .await
        .expect("list");
    assert_eq!(ds[0].state, DeliveryState::Delivered, "{moved:?}");
    assert_eq!(
        store
            .resend(&a.id, &m, &e.id, T0 + 4)
            .await
            .expect("resend"),
        ResendOutcome::Queued
    );
    let again = claim(&store, T0 + 5, 100, &none, 100).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].id, got[0].id, "the same delivery, so the same key");
    assert_eq!(again[0].attempts, 1, "X-Attempt 2: attempts count on");
    assert!(again[0].manual);
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

/// Whether `m` is still stored, the states of its deliveries (in state
/// order: pending, delivering, delivered, dead) and
/// how many attempts it has logged.
async fn history(store: &Arc<dyn Store>, m: &NewMessage) -> (bool, Vec<DeliveryState>, usize) {
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

async fn prune_removes_old_finished_history_only(store: Arc<dyn Store>) {
    use DeliveryState::{Dead, Delivered, Delivering, Pending};
    // Messages created before FINISHED_BEFORE are old; dead deliveries
    // last changed before DEAD_BEFORE are past their retention.
    const FINISHED_BEFORE: Millis = T0 + 1_000;
    const DEAD_BEFORE: Millis = T0 + 5_000;
    let a = app(&store, None).await;
    // No endpoints: its messages have no deliveries.
    let quiet = app(&store, None).await;
    let e1 = endpoint(&store, &a.id, None, false).await;
    let e2 = endpoint(&store, &a.id, Some(vec!["two"]), false).await;
    let e3 = endpoint(&store, &a.id, Some(vec!["three"]), false).await;
    let at = |created_at: Millis, event_type: &str| NewMessage {
        created_at,
        channels: None,
        ..message(&a.id, event_type, None)
    };
    // "one" goes to e1, "two" to e1 and e2, "three" to e1 and e3.
    let done = at(T0, "two");
    let no_deliveries = message(&quiet.id, "x", None);
    let retrying = at(T0, "two");
    let in_flight = at(T0, "two");
    let young = at(T0 + 2_000, "one");
    let dead_old = at(T0, "one");
    let dead_recent = at(T0, "one");
    let dead_and_done = at(T0, "two");
    let dead_and_retrying = at(T0, "two");
    let young_dead = at(T0 + 2_000, "one");
    let endpoint_deleted = at(T0, "three");
    let all = [
        &done,
        &no_deliveries,
        &retrying,
        &in_flight,
        &young,
        &dead_old,
        &dead_recent,
        &dead_and_done,
        &dead_and_retrying,
        &young_dead,
        &endpoint_deleted,
    ];
    store
        .insert_messages(&all.iter().map(|m| (*m).clone()).collect::<Vec<_>>())
        .await
        .expect("insert");

    // How each delivery ends: (message, endpoint) -> (next state, when).
    // Not listed: left delivering.
    let delivered = (NextState::Delivered, T0 + 100);
    let retry = (NextState::Retry { at: T0 + 1_000_000 }, T0 + 100);
    let dead_long_ago = (NextState::Dead(DeadReason::Exhausted), T0 + 3_000);
    let dead_lately = (NextState::Dead(DeadReason::Exhausted), T0 + 6_000);
    let plan: HashMap<(MsgId, EndpointId), (NextState, Millis)> = [
        (&done, &e1, delivered),
        (&done, &e2, delivered),
        (&retrying, &e1, delivered),
        (&retrying, &e2, retry),
        (&in_flight, &e1, delivered),
        (&young, &e1, delivered),
        (&dead_old, &e1, dead_long_ago),
        (&dead_recent, &e1, dead_lately),
        (&dead_and_done, &e1, delivered),
        (&dead_and_done, &e2, dead_long_ago),
        (&dead_and_retrying, &e1, retry),
        (&dead_and_retrying, &e2, dead_long_ago),
        (&young_dead, &e1, dead_long_ago),
        (&endpoint_deleted, &e1, delivered),
        (&endpoint_deleted, &e3, delivered),
    ]
    .into_iter()
    .map(|(m, e, outcome)| ((m.id.clone(), e.id.clone()), outcome))
    .collect();
    let got = claim(&store, T0 + 3_000, 100, &HashMap::new(), 100).await;
    assert_eq!(got.len(), plan.len() + 1, "every delivery claimed");
    let completions: Vec<Completion> = got
        .iter()
        .filter_map(|d| {
            plan.get(&(d.msg_id.clone(), d.endpoint_id.clone()))
                .map(|(next, now)| completion(d, *next, *now))
        })
        .collect();
    assert_eq!(completions.len(), plan.len());
    store.complete(&completions).await.expect("complete");
    // Its deliveries go, its attempts stay: history of a deleted endpoint.
    assert!(store.delete_endpoint(&a.id, &e3.id).await.expect("delete"));

    // Dead deliveries go first, so a message left with delivered ones
    // only goes in the same call.
    let report = store
        .prune(FINISHED_BEFORE, DEAD_BEFORE, 100)
        .await
        .expect("prune");
    assert_eq!(
        report,
        PruneReport {
            messages: 5,
            dead_deliveries: 4,
            more: false
        }
    );

    let gone = (false, vec![], 0);
    assert_eq!(history(&store, &done).await, gone, "delivered and old");
    assert_eq!(history(&store, &no_deliveries).await, gone, "no deliveries");
    assert_eq!(
        history(&store, &retrying).await,
        (true, vec![Pending, Delivered], 2),
        "a pending delivery keeps all of it"
    );
    assert_eq!(
        history(&store, &in_flight).await,
        (true, vec![Delivering, Delivered], 1),
        "a delivering one too"
    );
    assert_eq!(
        history(&store, &young).await,
        (true, vec![Delivered], 1),
        "within retention"
    );
    assert_eq!(history(&store, &dead_old).await, gone, "dead long ago");
    assert_eq!(
        history(&store, &dead_recent).await,
        (true, vec![Dead], 1),
        "dead within the dead retention"
    );
    assert_eq!(history(&store, &dead_and_done).await, gone);
    assert_eq!(
        history(&store, &dead_and_retrying).await,
        (true, vec![Pending], 1),
        "the dead delivery and its attempt go; the rest stays"
    );
    assert_eq!(
        history(&store, &young_dead).await,
        (true, vec![], 0),
        "the dead delivery goes, the young message stays"
    );
    assert_eq!(
        history(&store, &endpoint_deleted).await,
        gone,
        "with the attempts of its deleted endpoint"
    );
    // Counted per endpoint, without the message: a pruned message leaves
    // no delivery behind.
    assert_eq!(
        store
            .endpoint_delivery_counts(&e1.id)
            .await
            .expect("counts"),
        DeliveryCounts {
            pending: 1,
            delivering: 0,
            delivered: 3,
            dead: 1
        }
    );
    assert_eq!(
        store
            .endpoint_delivery_counts(&e2.id)
            .await
            .expect("counts"),
        DeliveryCounts {
            pending: 1,
            delivering: 1,
            ..DeliveryCounts::default()
        }
    );
    assert!(store
        .list_attempts_of_endpoint(&a.id, &e3.id, &page(10, None, true))
        .await
        .expect("attempts")
        .items
        .is_empty());
    let dead_left: Vec<MsgId> = store
        .list_dead(&dead_of(&a.id, None), &page(10, None, true))
        .await
        .expect("dead")
        .items
        .into_iter()
        .map(|d| d.msg_id)
        .collect();
    assert_eq!(dead_left, vec![dead_recent.id.clone()]);
    assert_eq!(
        store
            .prune(FINISHED_BEFORE, DEAD_BEFORE, 100)
            .await
            .expect("prune"),
        PruneReport::default(),
        "nothing more to do"
    );

    // Small batches: at most `batch` of each per call, `more` while full.
    let empty: Vec<NewMessage> = (0..5).map(|_| message(&quiet.id, "x", None)).collect();
    let dying: Vec<NewMessage> = (0..3).map(|_| at(T0, "one")).collect();
    store.insert_messages(&empty).await.expect("insert");
    store.insert_messages(&dying).await.expect("insert");
    let got = claim(&store, T0 + 3_000, 100, &HashMap::new(), 100).await;
    assert_eq!(got.len(), 3);
    let dead: Vec<Completion> = got
        .iter()
        .map(|d| completion(d, NextState::Dead(DeadReason::Exhausted), T0 + 3_000))
        .collect();
    store.complete(&dead).await.expect("complete");
    let mut reports = Vec::new();
    loop {
        let r = store
            .prune(FINISHED_BEFORE, DEAD_BEFORE, 2)
            .await
            .expect("prune");
        assert!(r.messages <= 2 && r.dead_deliveries <= 2, "{r:?}");
        assert_eq!(r.more, r.messages == 2 || r.dead_deliveries == 2, "{r:?}");
        reports.push(r);
        if !r.more {
            break;
        }
        assert!(reports.len() < 20, "prune never finished: {reports:?}");
    }
    assert!(reports[0].more, "{reports:?}");
    let messages: u64 = reports.iter().map(|r| r.messages).sum();
    let dead_deliveries: u64 = reports.iter().map(|r| r.dead_deliveries).sum();
    assert_eq!((messages, dead_deliveries), (8, 3), "{reports:?}");
    for m in empty.iter().chain(&dying) {
        assert_eq!(history(&store, m).await, gone);
    }
    assert_eq!(
        history(&store, &retrying).await,
        (true, vec![Pending, Delivered], 2)
    );
    assert_eq!(history(&store, &dead_recent).await, (true, vec![Dead], 1));
}

/// Waits up to 10 s for a wake-up.
async fn woken(wake: &tokio::sync::Notify) -> bool {
    tokio::time::timeout(Duration::from_secs(10), wake.notified())
        .await
        .is_ok()
}

/// True if a wake-up comes within a short while (for checking none does).
async fn woken_soon(wake: &tokio::sync::Notify) -> bool {
    tokio::time::timeout(Duration::from_millis(300), wake.notified())
        .await
        .is_ok()
}

#[tokio::test]
async fn postgres_wakes_other_processes_on_the_same_schema() {
    let Some(f) = crate::helpers::postgres::postgres(
        "store_conformance::postgres_wakes_other_processes_on_the_same_schema",
    )
    .await
    else {
        return;
    };
    let (url, schema) = (f.url.clone(), f.schema.clone());
    assert_eq!(f.store.wake_channel(), format!("herald_wake_{schema}"));
    f.run_postgres(|first| async move {
        let store: Arc<dyn Store> = first;
        // Another process on the same schema.
        let other = herald::store::postgres::PostgresStore::open(&url, &schema)
            .await
            .expect("open the second store");
        let wake = Arc::new(tokio::sync::Notify::new());
        other.listen_for_work(wake.clone()).await.expect("listen");

        let a = app(&store, None).await;
        store
            .insert_messages(&[message(&a.id, "x", None)])
            .await
            .expect("insert");
        assert!(!woken_soon(&wake).await, "no delivery, no work: no wake-up");

        let e = endpoint(&store, &a.id, None, false).await;
        let m = message(&a.id, "x", None);
        store
            .insert_messages(std::slice::from_ref(&m))
            .await
            .expect("insert");
        assert!(woken(&wake).await, "a new delivery wakes the other process");

        let got = claim(&store, T0, 10, &HashMap::new(), 10).await;
        store
            .complete(&[completion(
                &got[0],
                NextState::Dead(DeadReason::Exhausted),
                T0 + 1,
            )])
            .await
            .expect("complete");
        assert!(!woken_soon(&wake).await);
        assert!(store
            .replay_dead(&a.id, &got[0].id, T0 + 2)
            .await
            .expect("replay"));
        assert!(woken(&wake).await, "a replay wakes it");
        assert_eq!(
            store
                .resend(&a.id, &m.id, &e.id, T0 + 3)
                .await
                .expect("resend"),
            ResendOutcome::Queued
        );
        assert!(woken(&wake).await, "a resend wakes it");
        other.close().await;
    })
    .await;
}

/// The backend LISTENing on `channel`, if any.
async fn listener_pid(admin: &mut sqlx::PgConnection, channel: &str) -> Option<i32> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
         AND query LIKE $1 AND pid <> pg_backend_pid()",
    )
    .bind(format!("LISTEN \"{channel}\"%"))
    .fetch_optional(admin)
    .await
    .expect("pg_stat_activity")
}

#[tokio::test]
async fn postgres_listener_survives_a_lost_connection() {
    let Some(f) = crate::helpers::postgres::postgres(
        "store_conformance::postgres_listener_survives_a_lost_connection",
    )
    .await
    else {
        return;
    };
    let url = f.url.clone();
    f.run_postgres(|pg| async move {
        use sqlx::Connection;
        let channel = pg.wake_channel().to_owned();
        let store: Arc<dyn Store> = pg;
        let wake = Arc::new(tokio::sync::Notify::new());
        store.listen_for_work(wake.clone()).await.expect("listen");
        let mut admin = sqlx::PgConnection::connect(&url).await.expect("connect");
        let old = listener_pid(&mut admin, &channel)
            .await
            .expect("a listening backend");
        let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
            .bind(old)
            .fetch_one(&mut admin)
            .await
            .expect("terminate");
        assert!(killed);

        // It listens again on a new connection, then wakes the dispatcher
        // once for whatever it may have missed.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            match listener_pid(&mut admin, &channel).await {
                Some(pid) if pid != old => break,
                _ if tokio::time::Instant::now() > deadline => panic!("never listened again"),
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        assert!(woken(&wake).await, "a wake-up after reconnecting");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let _ = woken_soon(&wake).await;

        let a = app(&store, None).await;
        endpoint(&store, &a.id, None, false).await;
        store
            .insert_messages(&[message(&a.id, "x", None)])
            .await
            .expect("insert");
        assert!(woken(&wake).await, "notifications arrive again");
        let _ = admin.close().await;
    })
    .await;
}

#[tokio::test]
async fn postgres_wake_channel_fits_long_schema_names() {
    use sqlx::Connection;
    let Some(url) = crate::helpers::postgres_url(
        "store_conformance::postgres_wake_channel_fits_long_schema_names",
    ) else {
        return;
    };
    // 63 bytes, the longest schema name PostgreSQL keeps whole.
    let schema = format!(
        "Herald Test {:016x} {}",
        rand::random::<u64>(),
        "x".repeat(34)
    );
    assert_eq!(schema.len(), 63);
    let pg = Arc::new(
        herald::store::postgres::PostgresStore::open(&url, &schema)
            .await
            .expect("open"),
    );
    let channel = pg.wake_channel().to_owned();
    let wake = Arc::new(tokio::sync::Notify::new());
    let listened = pg.listen_for_work(wake.clone()).await;
    let store: Arc<dyn Store> = pg.clone();
    let a = app(&store, None).await;
    endpoint(&store, &a.id, None, false).await;
    store
        .insert_messages(&[message(&a.id, "x", None)])
        .await
        .expect("insert");
    let was_woken = woken(&wake).await;
    pg.close().await;
    let mut conn = sqlx::PgConnection::connect(&url).await.expect("connect");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA \"{schema}\" CASCADE"
    )))
    .execute(&mut conn)
    .await
    .expect("drop schema");
    listened.expect("listen");
    assert!(channel.starts_with("herald_wake_"), "{channel}");
    assert_eq!(channel.len(), 63, "{channel}");
    assert!(was_woken);
}

async fn streaks_count_failures_in_a_row_and_reset_on_success(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let e = endpoint(&store, &a.id, None, false).await;
    let status = store
        .endpoint_status(&e.id)
        .await
        .expect("status")
        .expect("exists");
    assert_eq!(
        status,
        EndpointStatus::default(),
        "a new endpoint has no history"
    );

    let got = claim_n(&store, &a.id, 2, T0).await;
    let streaks = store
        .complete(&[
            outcome(&got[0], false, 500, T0, 5),
            outcome(&got[1], false, 503, T0 + 10, 5),
        ])
        .await
        .expect("complete")
        .streaks;
    assert_eq!(
        streaks,
        vec![StreakUpdate {
            endpoint_id: e.id.clone(),
            app_id: a.id.clone(),
            fail_streak: 2,
            streak_started_at: Some(T0),
            disabled: false,
        }]
    );
    let status = store
        .endpoint_status(&e.id)
        .await
        .expect("status")
        .expect("exists");
    assert_eq!(status.last_error.as_deref(), Some("HTTP 503"));
    assert_eq!(status.last_error_at, Some(T0 + 10));

    // The next batch goes on counting from the same start.
    let got = claim_n(&store, &a.id, 1, T0 + 100).await;
    let streaks = store
        .complete(&[outcome(&got[0], false, 500, T0 + 100, 5)])
        .await
        .expect("complete")
        .streaks;
    assert_eq!(
        (streaks[0].fail_streak, streaks[0].streak_started_at),
        (3, Some(T0))
    );

    // fail, success, fail in one batch: the streak is the last failure.
    let got = claim_n(&store, &a.id, 3, T0 + 200).await;
    let streaks = store
        .complete(&[
            outcome(&got[0], false, 500, T0 + 200, 5),
            outcome(&got[1], true, 200, T0 + 210, 5),
            outcome(&got[2], false, 500, T0 + 220, 5),
        ])
        .await
        .expect("complete")
        .streaks;
    assert_eq!(
        (streaks[0].fail_streak, streaks[0].streak_started_at),
        (1, Some(T0 + 220))
    );
    let status = store
        .endpoint_status(&e.id)
        .await
        .expect("status")
        .expect("exists");
    assert_eq!(status.last_success_at, Some(T0 + 210));

    // A success last: no streak, and nothing reported.
    let got = claim_n(&store, &a.id, 1, T0 + 300).await;
    let streaks = store
        .complete(&[outcome(&got[0], true, 204, T0 + 300, 5)])
        .await
        .expect("complete")
        .streaks;
    assert!(streaks.is_empty());
    let status = store
        .endpoint_status(&e.id)
        .await
        .expect("status")
        .expect("exists");
    assert_eq!(
        (
            status.fail_streak,
            status.streak_started_at,
            status.last_success_at
        ),
        (0, None, Some(T0 + 300))
    );
    assert_eq!(
        status.last_error.as_deref(),
        Some("HTTP 500"),
        "the last error stays visible"
    );
}

async fn stats_buckets_add_up_per_endpoint_and_prune_by_age(store: Arc<dyn Store>) {
    use herald::health::{bucket_of, latency_slot, BUCKET_MS};
    let a = app(&store, None).await;
    let e = endpoint(&store, &a.id, None, false).await;
    let other = endpoint(&store, &a.id, None, false).await;
    let start = bucket_of(T0);
    let got = claim_n(&store, &a.id, 3, T0).await;
    let (mine, theirs): (Vec<_>, Vec<_>) = got.iter().partition(|d| d.endpoint_id == e.id);
    assert_eq!((mine.len(), theirs.len()), (3, 3));
    store
        .complete(&[
            outcome(mine[0], true, 200, start, 7),
            outcome(mine[1], false, 500, start + 1, 400),
            outcome(mine[2], true, 200, start + BUCKET_MS, 40_000),
            outcome(theirs[0], true, 200, start, 1),
        ])
        .await
        .expect("complete");
    // A second batch adds to the same bucket.
    store
        .complete(&[outcome(theirs[1], false, 500, start + 2, 9)])
        .await
        .expect("complete");
    let buckets = store.endpoint_stats(&e.id, start).await.expect("stats");
    assert_eq!(buckets.len(), 2);
    let first = &buckets[0];
    assert_eq!(
        (
            first.bucket,
            first.attempts,
            first.successes,
            first.failures,
            first.latency_sum_ms
        ),
        (start, 2, 1, 1, 407)
    );
    assert_eq!(first.histogram[latency_slot(7)], 1);
    assert_eq!(first.histogram[latency_slot(400)], 1);
    assert_eq!(first.histogram.iter().sum::<u64>(), 2);
    assert_eq!(
        buckets[1].histogram[11], 1,
        "over 30 s goes in the last slot"
    );
    let theirs_buckets = store.endpoint_stats(&other.id, start).await.expect("stats");
    assert_eq!(
        (
            theirs_buckets.len(),
            theirs_buckets[0].attempts,
            theirs_buckets[0].failures
        ),
        (1, 2, 1)
    );
    assert_eq!(
        store
            .endpoint_stats(&e.id, start + 1)
            .await
            .expect("stats")
            .len(),
        1,
        "since bounds the read"
    );
    // A page's endpoints in one read: the same buckets, one without any
    // absent, `since` bounding it alike.
    let quiet = endpoint(&store, &a.id, None, false).await;
    let page = [e.id.clone(), other.id.clone(), quiet.id.clone()];
    let all = store.endpoints_stats(&page, start).await.expect("stats");
    assert_eq!(all.get(&e.id), Some(&buckets));
    assert_eq!(all.get(&other.id), Some(&theirs_buckets));
    assert_eq!(all.len(), 2, "an endpoint without buckets is absent");
    let later = store
        .endpoints_stats(&page, start + 1)
        .await
        .expect("stats");
    assert_eq!(later.get(&e.id).map(Vec::len), Some(1));
    assert_eq!(later.get(&other.id), None);
    assert!(store
        .endpoints_stats(&[], start)
        .await
        .expect("stats")
        .is_empty());
    assert_eq!(
        store.prune_stats(start + BUCKET_MS).await.expect("prune"),
        2
    );
    assert_eq!(
        store.endpoint_stats(&e.id, 0).await.expect("stats").len(),
        1
    );
}

async fn disabling_is_guarded_by_the_streak_and_enabling_expires_old_held_deliveries(
    store: Arc<dyn Store>,
) {
    let a = app(&store, None).await;
    let e = endpoint(&store, &a.id, None, false).await;
    let got = claim_n(&store, &a.id, 1, T0).await;
    store
        .complete(&[outcome(&got[0], false, 500, T0, 5)])
        .await
        .expect("complete");
    assert!(
        !store
            .disable_endpoint(&e.id, "streak", true, Some(T0 - 1), T0 + 1)
            .await
            .expect("disable"),
        "another streak's start: no change"
    );
    assert!(store
        .disable_endpoint(&e.id, "50 failures", true, Some(T0), T0 + 1)
        .await
        .expect("disable"));
    assert!(
        !store
            .disable_endpoint(&e.id, "again", false, None, T0 + 2)
            .await
            .expect("disable"),
        "already disabled"
    );
    let status = store
        .endpoint_status(&e.id)
        .await
        .expect("status")
        .expect("exists");
    assert!(status.disabled && status.auto_disabled);
    assert_eq!(
        (status.disabled_reason.as_deref(), status.disabled_at),
        (Some("50 failures"), Some(T0 + 1))
    );

    // Held: the retry falls due but is not claimed.
    let mut fresh = message(&a.id, "x", None);
    fresh.created_at = T0 + 10_000;
    store
        .insert_messages(&[fresh.clone()])
        .await
        .expect("insert");
    assert!(claim(&store, T0 + 100_000, 10, &HashMap::new(), 10)
        .await
        .is_empty());

    // The first delivery's cycle began at T0: past the cap at re-enable.
    let report = store
        .enable_endpoint(&a.id, &e.id, T0 + 100_000, T0 + 5_000)
        .await
        .expect("enable")
        .expect("exists");
    assert_eq!(
        report,
        EnableReport {
            was_disabled: true,
            expired: 1
        }
    );
    let dead = store
        .list_dead(&dead_of(&a.id, Some(&e.id)), &page(10, None, true))
        .await
        .expect("dead");
    assert_eq!(dead.items.len(), 1);
    assert_eq!(dead.items[0].dead_reason, Some(DeadReason::TooOld));
    let resumed = claim(&store, T0 + 100_000, 10, &HashMap::new(), 10).await;
    assert_eq!(resumed.len(), 1, "the young one resumes");
    assert_eq!(resumed[0].msg_id, fresh.id);
    let status = store
        .endpoint_status(&e.id)
        .await
        .expect("status")
        .expect("exists");
    assert_eq!(
        (status.disabled, status.fail_streak, status.disabled_reason),
        (false, 0, None)
    );
    let again = store
        .enable_endpoint(&a.id, &e.id, T0 + 100_001, T0)
        .await
        .expect("enable")
        .expect("exists");
    assert_eq!(again, EnableReport::default());
    let stranger = app(&store, None).await;
    assert_eq!(
        store
            .enable_endpoint(&stranger.id, &e.id, T0, T0)
            .await
            .expect("enable"),
        None,
        "another app's endpoint is not found"
    );
}

/// Issue 16, defect 6: an endpoint nobody enables kept its held deliveries
/// for ever. Retention now gives them the age cap, as enabling it would:
/// those whose cycle began before it are dead ("too old"), in batches, and
/// replay like any dead letter; younger ones, and every live delivery of
/// an enabled endpoint, are left alone.
async fn retention_expires_held_deliveries_past_the_age_cap(store: Arc<dyn Store>) {
    const TOO_OLD_BEFORE: Millis = T0 + 10_000;
    let a = app(&store, None).await;
    let stuck = endpoint(&store, &a.id, None, false).await;
    let b = app(&store, None).await;
    let healthy = endpoint(&store, &b.id, None, false).await;
    let at = |app: &AppId, created_at: Millis| NewMessage {
        created_at,
        ..message(app, "x", None)
    };
    // Pending when the endpoint is disabled, and new ones after (held
    // too: an auto-disabled endpoint collects new messages).
    let before = at(&a.id, T0);
    store
        .insert_messages(std::slice::from_ref(&before))
        .await
        .expect("insert");
    assert!(store
        .disable_endpoint(&stuck.id, "failing", true, None, T0 + 1)
        .await
        .expect("disable"));
    let after = at(&a.id, T0 + 1_000);
    let young = at(&a.id, T0 + 50_000);
    store
        .insert_messages(&[after.clone(), young.clone()])
        .await
        .expect("insert");
    assert!(
        claim(&store, T0 + 100_000, 10, &HashMap::new(), 10)
            .await
            .is_empty(),
        "held"
    );
    // As old as the first, but its endpoint is enabled.
    let live = at(&b.id, T0);
    store
        .insert_messages(std::slice::from_ref(&live))
        .await
        .expect("insert");

    let now = T0 + 100_000;
    let mut passes = Vec::new();
    loop {
        let n = store
            .expire_held(TOO_OLD_BEFORE, now, 1)
            .await
            .expect("expire");
        passes.push(n);
        if n < 1 {
            break;
        }
    }
    assert_eq!(passes, vec![1, 1, 0], "two, one per batch of 1");
    let state_of = |app: AppId, m: MsgId| {
        let store = store.clone();
        async move {
            let ds = store
                .list_deliveries_of_message(&app, &m)
                .await
                .expect("list");
            assert_eq!(ds.len(), 1);
            (ds[0].state, ds[0].dead_reason)
        }
    };
    let too_old = (DeliveryState::Dead, Some(DeadReason::TooOld));
    let pending = (DeliveryState::Pending, None);
    assert_eq!(state_of(a.id.clone(), before.id.clone()).await, too_old);
    assert_eq!(state_of(a.id.clone(), after.id.clone()).await, too_old);
    assert_eq!(state_of(a.id.clone(), young.id.clone()).await, pending);
    assert_eq!(state_of(b.id.clone(), live.id.clone()).await, pending);
    let dead = store
        .list_dead(&dead_of(&a.id, Some(&stuck.id)), &page(10, None, true))
        .await
        .expect("dead");
    assert_eq!(dead.items.len(), 2);
    assert!(dead.items.iter().all(|d| d.updated_at == now));
    assert_eq!(
        store.expire_held(now, now, 10).await.expect("expire"),
        1,
        "the young one too, once past the cap"
    );

    // Replayed, they are pending in a new cycle: held while the endpoint
    // is disabled, sent once it is enabled.
    assert_eq!(
        store
            .replay_dead_of_endpoint(&a.id, &stuck.id, T0 + 200_000)
            .await
            .expect("replay"),
        3
    );
    let got = claim(&store, T0 + 200_000, 10, &HashMap::new(), 10).await;
    assert_eq!(
        got.iter().map(|d| d.msg_id.clone()).collect::<Vec<_>>(),
        vec![live.id.clone()],
        "only the enabled endpoint's"
    );
    assert_eq!(got[0].endpoint_id, healthy.id);
    store
        .complete(&[completion(&got[0], NextState::Delivered, T0 + 200_001)])
        .await
        .expect("complete");
    assert_eq!(
        store
            .expire_held(T0 + 200_000, T0 + 200_000, 10)
            .await
            .expect("expire"),
        0,
        "a replay starts the age cap over"
    );
    let report = store
        .enable_endpoint(&a.id, &stuck.id, T0 + 300_000, T0 + 150_000)
        .await
        .expect("enable")
        .expect("exists");
    assert_eq!(report.expired, 0);
    let resumed = claim(&store, T0 + 300_000, 10, &HashMap::new(), 10).await;
    assert_eq!(resumed.len(), 3, "resumed when enabled");
    assert!(resumed
        .iter()
        .all(|d| d.manual && d.endpoint_id == stuck.id));
}

/// The age cap at enable is for deliveries held while the endpoint was
/// off: enabling one that is enabled kills nothing and resets nothing.
async fn enabling_an_enabled_endpoint_changes_nothing(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let e = endpoint(&store, &a.id, None, false).await;
    let got = claim_n(&store, &a.id, 1, T0).await;
    store
        .complete(&[outcome(&got[0], false, 500, T0, 5)])
        .await
        .expect("complete");
    // Its cycle began at T0, long before the cap; the retry is due.
    let report = store
        .enable_endpoint(&a.id, &e.id, T0 + 100_000, T0 + 50_000)
        .await
        .expect("enable")
        .expect("exists");
    assert_eq!(report, EnableReport::default());
    let status = store
        .endpoint_status(&e.id)
        .await
        .expect("status")
        .expect("exists");
    assert_eq!(
        (
            status.disabled,
            status.fail_streak,
            status.streak_started_at
        ),
        (false, 1, Some(T0)),
        "the streak goes on"
    );
    assert!(store
        .list_dead(&dead_of(&a.id, None), &page(10, None, true))
        .await
        .expect("dead")
        .items
        .is_empty());
    let again = claim(&store, T0 + 100_000, 10, &HashMap::new(), 10).await;
    assert_eq!(again.len(), 1, "still pending, and due");
    assert_eq!(again[0].id, got[0].id);
}

async fn only_auto_disabled_endpoints_collect_new_messages(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let auto = endpoint(&store, &a.id, None, false).await;
    let by_hand = endpoint(&store, &a.id, None, false).await;
    assert!(store
        .disable_endpoint(&auto.id, "r", true, None, T0)
        .await
        .expect("disable"));
    assert!(store
        .disable_endpoint(&by_hand.id, "r", false, None, T0)
        .await
        .expect("disable"));
    let m = message(&a.id, "x", None);
    store
        .insert_messages(std::slice::from_ref(&m))
        .await
        .expect("insert");
    let deliveries = store
        .list_deliveries_of_message(&a.id, &m.id)
        .await
        .expect("list");
    assert_eq!(
        deliveries
            .iter()
            .map(|d| d.endpoint_id.clone())
            .collect::<Vec<_>>(),
        vec![auto.id.clone()],
        "held for the auto-disabled endpoint only"
    );
}

async fn dead_letters_filter_across_apps_and_replay_in_bulk(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let b = app(&store, None).await;
    let ea = endpoint(&store, &a.id, None, false).await;
    let eb = endpoint(&store, &b.id, None, false).await;
    let mut ms = Vec::new();
    for (app, t) in [
        (&a.id, "order.created"),
        (&a.id, "order.paid"),
        (&b.id, "order.created"),
    ] {
        ms.push(message(app, t, None));
    }
    store.insert_messages(&ms).await.expect("insert");
    let got = claim(&store, T0, 10, &HashMap::new(), 10).await;
    assert_eq!(got.len(), 3);
    let batch: Vec<_> = got
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let reason = if i == 0 {
                DeadReason::PermanentStatus
            } else {
                DeadReason::Exhausted
            };
            completion(d, NextState::Dead(reason), T0 + 100 * i as i64)
        })
        .collect();
    store.complete(&batch).await.expect("complete");
    let ids = |p: Page<Delivery>| p.items.into_iter().map(|d| d.id).collect::<Vec<_>>();
    let all = ids(store
        .list_dead(&DeadFilter::default(), &page(10, None, false))
        .await
        .expect("list"));
    assert_eq!(all.len(), 3, "every app");
    assert!(
        all.windows(2).all(|w| w[0].as_str() > w[1].as_str()),
        "newest first"
    );
    let of = |f: DeadFilter| {
        let store = store.clone();
        async move {
            store
                .list_dead(&f, &page(10, None, true))
                .await
                .expect("list")
                .items
                .len()
        }
    };
    assert_eq!(of(dead_of(&a.id, None)).await, 2);
    assert_eq!(of(dead_of(&b.id, Some(&eb.id))).await, 1);
    assert_eq!(of(dead_of(&a.id, Some(&eb.id))).await, 0);
    assert_eq!(
        of(DeadFilter {
            event_type: Some("order.created".into()),
            ..DeadFilter::default()
        })
        .await,
        2
    );
    assert_eq!(
        of(DeadFilter {
            reason: Some(DeadReason::PermanentStatus),
            ..DeadFilter::default()
        })
        .await,
        1
    );
    assert_eq!(
        of(DeadFilter {
            since: Some(T0 + 100),
            ..DeadFilter::default()
        })
        .await,
        2
    );
    assert_eq!(
        of(DeadFilter {
            until: Some(T0 + 100),
            ..DeadFilter::default()
        })
        .await,
        1
    );
    let second_page = store
        .list_dead(&DeadFilter::default(), &page(2, None, false))
        .await
        .expect("list");
    assert!(second_page.has_more);

    // Replay: only the named ids that match, at most `limit`.
    let a_ids: Vec<DeliveryId> = got
        .iter()
        .filter(|d| d.app_id == a.id)
        .map(|d| d.id.clone())
        .collect();
    let b_id = got
        .iter()
        .find(|d| d.app_id == b.id)
        .map(|d| d.id.clone())
        .expect("b");
    let n = store
        .replay_dead_matching(
            &dead_of(&a.id, None),
            Some(std::slice::from_ref(&b_id)),
            100,
            T0 + 1_000,
        )
        .await
        .expect("replay");
    assert_eq!(n, 0, "b's delivery is outside a's filter");
    let n = store
        .replay_dead_matching(&dead_of(&a.id, Some(&ea.id)), None, 1, T0 + 1_000)
        .await
        .expect("replay");
    assert_eq!(n, 1, "the limit holds");
    let n = store
        .replay_dead_matching(&DeadFilter::default(), Some(&a_ids), 100, T0 + 1_000)
        .await
        .expect("replay");
    assert_eq!(n, 1, "the one left of a's");
    assert_eq!(of(DeadFilter::default()).await, 1);
    let replayed = claim(&store, T0 + 1_000, 10, &HashMap::new(), 10).await;
    assert_eq!(replayed.len(), 2);
    assert!(replayed.iter().all(|d| d.manual && d.app_id == a.id));
}

async fn queue_stats_count_live_dead_due_and_disabled(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    endpoint(&store, &a.id, None, false).await;
    endpoint(&store, &a.id, None, true).await;
    let empty = store.queue_stats(T0).await.expect("stats");
    assert_eq!(
        empty,
        QueueStats {
            disabled_endpoints: 1,
            ..QueueStats::default()
        }
    );
    let ms: Vec<_> = (0..4).map(|_| message(&a.id, "x", None)).collect();
    store.insert_messages(&ms).await.expect("insert");
    let got = claim(&store, T0, 3, &HashMap::new(), 10).await;
    assert_eq!(got.len(), 3);
    store
        .complete(&[
            completion(&got[0], NextState::Dead(DeadReason::Exhausted), T0),
            completion(&got[1], NextState::Retry { at: T0 + 60_000 }, T0),
        ])
        .await
        .expect("complete");
    let stats = store.queue_stats(T0 + 1).await.expect("stats");
    assert_eq!(
        stats,
        QueueStats {
            pending: 2,
            delivering: 1,
            dead: 1,
            due: 1,
            oldest_due_at: Some(T0),
            held: 0,
            disabled_endpoints: 1,
        }
    );
    let later = store.queue_stats(T0 + 60_000).await.expect("stats");
    assert_eq!((later.due, later.oldest_due_at), (2, Some(T0)));
}

async fn queue_stats_count_held_deliveries_apart_from_due_ones(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let open = endpoint(&store, &a.id, None, false).await;
    let paused = endpoint(&store, &a.id, None, false).await;
    let ms: Vec<_> = (0..3).map(|_| message(&a.id, "x", None)).collect();
    store.insert_messages(&ms).await.expect("insert");
    assert!(store
        .disable_endpoint(&paused.id, "receiver down", false, None, T0)
        .await
        .expect("disable"));
    let stats = store.queue_stats(T0 + 1).await.expect("stats");
    // Three due for the open endpoint; the paused one's three are held,
    // pending but neither due nor the oldest due.
    assert_eq!(
        (
            stats.pending,
            stats.due,
            stats.held,
            stats.disabled_endpoints
        ),
        (6, 3, 3, 1)
    );
    assert_eq!(stats.oldest_due_at, Some(T0));
    let got = claim(&store, T0 + 1, 10, &HashMap::new(), 10).await;
    assert_eq!(got.len(), 3);
    assert!(got.iter().all(|d| d.endpoint_id == open.id));
    let stats = store.queue_stats(T0 + 2).await.expect("stats");
    assert_eq!((stats.due, stats.held, stats.oldest_due_at), (0, 3, None));
    store
        .enable_endpoint(&a.id, &paused.id, T0 + 3, 0)
        .await
        .expect("enable")
        .expect("exists");
    let stats = store.queue_stats(T0 + 4).await.expect("stats");
    assert_eq!((stats.due, stats.held), (3, 0));
}

async fn find_messages_filters_by_each_field_within_the_scope(store: Arc<dyn Store>) {
    let acme = app(&store, Some("acme")).await;
    let other = app(&store, Some("other")).await;
    let ep = endpoint(&store, &acme.id, None, false).await;
    endpoint(&store, &other.id, None, false).await;
    let mut inv42 = message(&acme.id, "invoice.paid", Some("inv-42"));
    inv42.created_at = T0 + 10;
    let mut inv43 = message(&acme.id, "invoice.paid", Some("inv-43"));
    inv43.created_at = T0 + 20;
    inv43.channels = Some(vec!["eu".into(), "project-1".into()]);
    let mut order = message(&acme.id, "order.created", None);
    order.created_at = T0 + 30;
    let mut elsewhere = message(&other.id, "invoice.paid", Some("inv-42"));
    elsewhere.created_at = T0 + 10;
    store
        .insert_messages(&[
            inv42.clone(),
            inv43.clone(),
            order.clone(),
            elsewhere.clone(),
        ])
        .await
        .expect("insert");
    // inv-42 delivered, the order dead, inv-43 left pending.
    let got = claim(&store, T0 + 40, 10, &HashMap::new(), 10).await;
    let of = |m: &NewMessage| {
        got.iter()
            .find(|d| d.msg_id == m.id)
            .expect("claimed")
            .clone()
    };
    store
        .complete(&[
            completion(&of(&inv42), NextState::Delivered, T0 + 41),
            completion(&of(&order), NextState::Dead(DeadReason::Exhausted), T0 + 41),
        ])
        .await
        .expect("complete");
    let pending = of(&inv43);
    store
        .release(&pending.id, &pending.lease_token, T0 + 42)
        .await
        .expect("release");

    let find = |filter: FindFilter| {
        let store = store.clone();
        async move {
            let page = store
                .find_messages(
                    &filter,
                    &PageReq {
                        limit: 10,
                        ..PageReq::default()
                    },
                )
                .await
                .expect("find");
            page.items.into_iter().map(|m| m.id).collect::<Vec<_>>()
        }
    };
    let in_acme = |f: FindFilter| FindFilter {
        app: Some(acme.id.clone()),
        ..f
    };
    // Newest first; all apps unless scoped.
    assert_eq!(
        find(FindFilter::default()).await,
        vec![
            elsewhere.id.clone(),
            order.id.clone(),
            inv43.id.clone(),
            inv42.id.clone()
        ]
    );
    assert_eq!(
        find(in_acme(FindFilter::default())).await,
        vec![order.id.clone(), inv43.id.clone(), inv42.id.clone()]
    );
    let by_event_id = FindFilter {
        id_or_event_id: Some("inv-42".into()),
        ..FindFilter::default()
    };
    assert_eq!(
        find(by_event_id.clone()).await,
        vec![elsewhere.id.clone(), inv42.id.clone()]
    );
    assert_eq!(find(in_acme(by_event_id)).await, vec![inv42.id.clone()]);
    let by_id = FindFilter {
        id_or_event_id: Some(order.id.as_str().to_owned()),
        ..FindFilter::default()
    };
    assert_eq!(find(by_id.clone()).await, vec![order.id.clone()]);
    let other_scope = FindFilter {
        app: Some(other.id.clone()),
        ..by_id
    };
    assert!(
        find(other_scope).await.is_empty(),
        "another app's id finds nothing"
    );
    let by_type = FindFilter {
        event_type: Some("invoice.paid".into()),
        ..FindFilter::default()
    };
    assert_eq!(
        find(in_acme(by_type)).await,
        vec![inv43.id.clone(), inv42.id.clone()]
    );
    for (state, want) in [
        (DeliveryState::Delivered, vec![inv42.id.clone()]),
        (DeliveryState::Dead, vec![order.id.clone()]),
        (DeliveryState::Pending, vec![inv43.id.clone()]),
        (DeliveryState::Delivering, vec![]),
    ] {
        let f = in_acme(FindFilter {
            status: Some(state),
            ..FindFilter::default()
        });
        assert_eq!(find(f).await, want, "{state:?}");
    }
    let by_channel = |c: &str| FindFilter {
        channel: Some(c.into()),
        ..FindFilter::default()
    };
    assert_eq!(find(by_channel("project-1")).await, vec![inv43.id.clone()]);
    assert!(
        find(by_channel("project")).await.is_empty(),
        "whole channels only"
    );
    let window = in_acme(FindFilter {
        created_after: Some(T0 + 20),
        created_before: Some(T0 + 30),
        ..FindFilter::default()
    });
    assert_eq!(find(window).await, vec![inv43.id.clone()]);

    // Each with its deliveries counted by state, and its app's name.
    let page = store
        .find_messages(
            &in_acme(FindFilter::default()),
            &PageReq {
                limit: 2,
                ..PageReq::default()
            },
        )
        .await
        .expect("find");
    assert!(page.has_more);
    assert_eq!(page.items.len(), 2);
    assert_eq!(page.items[0].deliveries.dead, 1);
    assert_eq!(page.items[1].deliveries.pending, 1);
    assert_eq!(page.items[1].event_id.as_deref(), Some("inv-43"));
    assert_eq!(page.items[0].app_name, acme.name);
    let next = store
        .find_messages(
            &in_acme(FindFilter::default()),
            &PageReq {
                limit: 2,
                after: Some(page.items[1].id.as_str().to_owned()),
                ..PageReq::default()
            },
        )
        .await
        .expect("find");
    assert_eq!(
        next.items.iter().map(|m| m.id.clone()).collect::<Vec<_>>(),
        vec![inv42.id.clone()]
    );
    assert_eq!(next.items[0].deliveries.delivered, 1);
    assert!(!next.has_more);
    let _ = ep;
}

async fn find_apps_by_name_uid_or_id(store: Arc<dyn Store>) {
    let mut acme = app(&store, Some("acme-uid")).await;
    acme.name = "Acme 100% Shop".into();
    assert!(store.update_app(&acme).await.expect("update"));
    let mut other = app(&store, Some("initech")).await;
    other.name = "Initech".into();
    assert!(store.update_app(&other).await.expect("update"));
    let find = |q: Option<&str>| {
        let store = store.clone();
        let q = q.map(str::to_owned);
        async move {
            store
                .find_apps(
                    q.as_deref(),
                    &PageReq {
                        limit: 10,
                        ..PageReq::default()
                    },
                )
                .await
                .expect("find apps")
                .items
                .into_iter()
                .map(|a| a.id)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(find(None).await, vec![other.id.clone(), acme.id.clone()]);
    assert_eq!(
        find(Some("acme")).await,
        vec![acme.id.clone()],
        "name, any case"
    );
    assert_eq!(find(Some("100%")).await, vec![acme.id.clone()]);
    assert!(find(Some("1_0")).await.is_empty(), "_ is not a wildcard");
    assert_eq!(find(Some("initech")).await, vec![other.id.clone()]);
    assert_eq!(find(Some("acme-uid")).await, vec![acme.id.clone()]);
    assert_eq!(find(Some(acme.id.as_str())).await, vec![acme.id.clone()]);
    assert!(find(Some("globex")).await.is_empty());
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

async fn delivery_counts_stay_exact_through_every_state_change(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let b = app(&store, None).await;
    let e1 = endpoint(&store, &a.id, None, false).await;
    let e2 = endpoint(&store, &a.id, None, false).await;
    let e3 = endpoint(&store, &a.id, None, false).await;
    let e4 = endpoint(&store, &b.id, None, false).await;
    let mut eps = vec![e1.id.clone(), e2.id.clone(), e3.id.clone(), e4.id.clone()];
    let mut disabled: Vec<EndpointId> = Vec::new();
    let mut msgs: Vec<(AppId, MsgId)> = Vec::new();
    let mut batch: Vec<NewMessage> = (0..5).map(|_| message(&a.id, "x", None)).collect();
    batch.extend((0..2).map(|_| message(&b.id, "x", None)));
    msgs.extend(batch.iter().map(|m| (m.app_id.clone(), m.id.clone())));
    store.insert_messages(&batch).await.expect("insert");
    assert_counts_exact(&store, &msgs, &eps, &disabled, "ingest").await;

    let handoff: Vec<NewMessage> = (0..2).map(|_| message(&a.id, "x", None)).collect();
    msgs.extend(handoff.iter().map(|m| (m.app_id.clone(), m.id.clone())));
    let (_, handed) = store
        .insert_messages_claiming(
            &handoff,
            &ClaimRequest {
                now: T0,
                lease_until: T0 + 30_000,
                limit: 3,
                in_flight: &HashMap::new(),
                endpoint_cap: 10,
                unlisted_cap: 10,
            },
        )
        .await
        .expect("insert claiming");
    assert_eq!(handed.len(), 3);
    assert_counts_exact(&store, &msgs, &eps, &disabled, "handoff").await;

    let got = claim(&store, T0, 8, &HashMap::new(), 10).await;
    assert_eq!(got.len(), 8);
    assert_counts_exact(&store, &msgs, &eps, &disabled, "claim").await;

    store
        .complete(&[
            completion(&got[0], NextState::Delivered, T0 + 1),
            completion(&got[1], NextState::Delivered, T0 + 1),
            completion(&got[2], NextState::Retry { at: T0 + 60_000 }, T0 + 1),
            completion(&got[3], NextState::Dead(DeadReason::Exhausted), T0 + 1),
            completion(&got[4], NextState::Dead(DeadReason::Exhausted), T0 + 1),
            completion(&handed[0], NextState::Delivered, T0 + 1),
        ])
        .await
        .expect("complete");
    assert_counts_exact(&store, &msgs, &eps, &disabled, "complete").await;

    store
        .release(&got[5].id, &got[5].lease_token, T0 + 2)
        .await
        .expect("release");
    assert_counts_exact(&store, &msgs, &eps, &disabled, "release").await;

    assert!(store
        .replay_dead(&got[3].app_id, &got[3].id, T0 + 3)
        .await
        .expect("replay"));
    assert_counts_exact(&store, &msgs, &eps, &disabled, "replay").await;
    store
        .resend(&got[0].app_id, &got[0].msg_id, &got[0].endpoint_id, T0 + 3)
        .await
        .expect("resend");
    assert_counts_exact(&store, &msgs, &eps, &disabled, "resend").await;

    for ep in [&e2, &e3] {
        assert!(store
            .disable_endpoint(&ep.id, "down", false, None, T0 + 4)
            .await
            .expect("disable"));
        disabled.push(ep.id.clone());
    }
    assert_counts_exact(&store, &msgs, &eps, &disabled, "disable (hold)").await;
    store
        .enable_endpoint(&a.id, &e2.id, T0 + 5, 0)
        .await
        .expect("enable")
        .expect("exists");
    disabled.retain(|ep| *ep != e2.id);
    assert_counts_exact(&store, &msgs, &eps, &disabled, "enable (unhold)").await;
    while store
        .expire_held(T0 + 1_000_000, T0 + 6, 1)
        .await
        .expect("expire held")
        > 0
    {}
    assert_counts_exact(&store, &msgs, &eps, &disabled, "held past the age cap").await;

    // Everything of e1 finished, then retention.
    let rest = claim(&store, T0 + 100_000, 100, &HashMap::new(), 100).await;
    let done: Vec<Completion> = rest
        .iter()
        .map(|d| completion(d, NextState::Delivered, T0 + 100_001))
        .collect();
    store.complete(&done).await.expect("complete");
    assert_counts_exact(&store, &msgs, &eps, &disabled, "complete the rest").await;
    while store
        .prune(T0 + 200_000, T0 + 200_000, 3)
        .await
        .expect("prune")
        .more
    {}
    assert_counts_exact(&store, &msgs, &eps, &disabled, "retention").await;

    // Deletions cascade: an endpoint, then an application.
    let more: Vec<NewMessage> = (0..2).map(|_| message(&a.id, "x", None)).collect();
    let more_b: Vec<NewMessage> = (0..2).map(|_| message(&b.id, "x", None)).collect();
    msgs.extend(
        more.iter()
            .chain(&more_b)
            .map(|m| (m.app_id.clone(), m.id.clone())),
    );
    store.insert_messages(&more).await.expect("insert");
    store.insert_messages(&more_b).await.expect("insert");
    assert_counts_exact(&store, &msgs, &eps, &disabled, "ingest again").await;
    assert!(store.delete_endpoint(&a.id, &e1.id).await.expect("delete"));
    eps.retain(|ep| *ep != e1.id);
    assert_counts_exact(&store, &msgs, &eps, &disabled, "endpoint deleted").await;
    assert_eq!(
        store
            .endpoint_delivery_counts(&e1.id)
            .await
            .expect("counts"),
        DeliveryCounts::default()
    );
    assert!(store.delete_app(&b.id).await.expect("delete app"));
    eps.retain(|ep| *ep != e4.id);
    assert_counts_exact(&store, &msgs, &eps, &disabled, "application deleted").await;
}

async fn overview_lists_failing_endpoints_first(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let b = app(&store, None).await;
    let quiet = endpoint(&store, &a.id, None, false).await;
    let failing = endpoint(&store, &b.id, None, false).await;
    let ms = vec![message(&b.id, "x", None)];
    store.insert_messages(&ms).await.expect("insert");
    let got = claim(&store, T0, 10, &HashMap::new(), 10).await;
    store
        .complete(&[outcome(&got[0], false, 500, T0, 5)])
        .await
        .expect("complete");
    let all = store
        .list_endpoint_overview(None, 0, 10)
        .await
        .expect("overview");
    assert_eq!(
        all.iter()
            .map(|o| o.endpoint.id.clone())
            .collect::<Vec<_>>(),
        vec![failing.id.clone(), quiet.id.clone()]
    );
    assert_eq!(all[0].status.fail_streak, 1);
    assert_eq!(all[0].app_name, "app");
    let page2 = store
        .list_endpoint_overview(None, 1, 10)
        .await
        .expect("overview");
    assert_eq!(page2.len(), 1);
    let of_a = store
        .list_endpoint_overview(Some(&a.id), 0, 10)
        .await
        .expect("overview");
    assert_eq!(of_a.len(), 1);
    assert_eq!(of_a[0].endpoint.id, quiet.id);
}

async fn rotated_secrets_sign_until_their_grace_ends(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let e = endpoint(&store, &a.id, None, false).await;
    let first = e.secret.clone();
    let second = herald_signing::Secret::generate().expose();
    assert!(store
        .rotate_secret(&a.id, &e.id, &second, T0 + 1_000, T0)
        .await
        .expect("rotate"));
    let m = message(&a.id, "x", None);
    store
        .insert_messages(std::slice::from_ref(&m))
        .await
        .expect("insert");
    let got = claim(&store, T0, 10, &HashMap::new(), 10).await;
    assert_eq!(got[0].secret, second);
    assert_eq!(got[0].old_secrets, vec![first.clone()], "within the grace");
    let got_ep = store
        .get_endpoint(&a.id, e.id.as_str())
        .await
        .expect("get")
        .expect("exists");
    assert_eq!(got_ep.secret, second);

    // A zero grace drops the replaced secret at once; older ones live on.
    let third = herald_signing::Secret::generate().expose();
    assert!(store
        .rotate_secret(&a.id, &e.id, &third, T0 + 500, T0 + 500)
        .await
        .expect("rotate"));
    store
        .release(&got[0].id, &got[0].lease_token, T0 + 500)
        .await
        .expect("release");
    let got = claim(&store, T0 + 500, 10, &HashMap::new(), 10).await;
    assert_eq!(
        (got[0].secret.clone(), got[0].old_secrets.clone()),
        (third.clone(), vec![first])
    );
    store
        .release(&got[0].id, &got[0].lease_token, T0 + 1_000)
        .await
        .expect("release");
    let got = claim(&store, T0 + 1_000, 10, &HashMap::new(), 10).await;
    assert!(got[0].old_secrets.is_empty(), "the grace has ended");

    // At most ten old secrets are kept.
    for i in 0..12 {
        let s = herald_signing::Secret::generate().expose();
        assert!(store
            .rotate_secret(&a.id, &e.id, &s, T0 + 100_000, T0 + 2_000 + i)
            .await
            .expect("rotate"));
    }
    store
        .release(&got[0].id, &got[0].lease_token, T0 + 3_000)
        .await
        .expect("release");
    let got = claim(&store, T0 + 3_000, 10, &HashMap::new(), 10).await;
    assert_eq!(got[0].old_secrets.len(), MAX_OLD_SECRETS);
    let stranger = app(&store, None).await;
    assert!(!store
        .rotate_secret(&stranger.id, &e.id, &third, T0, T0)
        .await
        .expect("rotate"));
}

async fn event_types_are_created_listed_updated_and_deleted(store: Arc<dyn Store>) {
    let et = |name: &str, archived: bool| EventType {
        name: name.to_owned(),
        description: "d".into(),
        archived,
        deprecated: false,
        schemas: Some(r#"{"1":{}}"#.into()),
        feature_flag: None,
        group_name: Some("g".into()),
        created_at: T0,
        updated_at: T0,
    };
    for (name, archived) in [("b.two", false), ("a.one", false), ("c.old", true)] {
        store
            .create_event_type(&et(name, archived))
            .await
            .expect("create");
    }
    assert!(matches!(
        store.create_event_type(&et("a.one", false)).await,
        Err(StoreError::Conflict(_))
    ));
    assert_eq!(
        store.get_event_type("a.one").await.expect("get"),
        Some(et("a.one", false))
    );
    let names = |p: Page<EventType>| p.items.into_iter().map(|e| e.name).collect::<Vec<_>>();
    assert_eq!(
        names(
            store
                .list_event_types(false, &page(10, None, true))
                .await
                .expect("list")
        ),
        vec!["a.one", "b.two"]
    );
    let first = store
        .list_event_types(true, &page(2, None, true))
        .await
        .expect("list");
    assert!(first.has_more);
    assert_eq!(
        names(
            store
                .list_event_types(true, &page(2, Some("b.two".into()), true))
                .await
                .expect("list")
        ),
        vec!["c.old"]
    );
    let mut changed = et("a.one", true);
    changed.description = "new".into();
    changed.updated_at = T0 + 1;
    assert!(store.update_event_type(&changed).await.expect("update"));
    assert_eq!(
        store.get_event_type("a.one").await.expect("get"),
        Some(changed)
    );
    assert!(!store
        .update_event_type(&et("zzz", false))
        .await
        .expect("update"));
    assert_eq!(
        store
            .unknown_event_types(&["a.one".into(), "nope".into(), "c.old".into()])
            .await
            .expect("unknown"),
        vec!["nope".to_owned()]
    );
    assert!(store.delete_event_type("a.one").await.expect("delete"));
    assert!(!store.delete_event_type("a.one").await.expect("delete"));
}

async fn apps_update_and_delete_with_everything_under_them(store: Arc<dyn Store>) {
    let a = app(&store, Some("one")).await;
    let b = app(&store, None).await;
    let e = endpoint(&store, &a.id, None, false).await;
    endpoint(&store, &b.id, None, false).await;
    let mut changed = a.clone();
    changed.uid = Some("uno".into());
    changed.name = "renamed".into();
    changed.updated_at = T0 + 1;
    assert!(store.update_app(&changed).await.expect("update"));
    assert_eq!(store.get_app("uno").await.expect("get"), Some(changed));
    assert_eq!(store.get_app("one").await.expect("get"), None);

    let ms = vec![message(&a.id, "x", None), message(&b.id, "x", None)];
    store.insert_messages(&ms).await.expect("insert");
    let got = claim(&store, T0, 10, &HashMap::new(), 10).await;
    let of_a: Vec<_> = got.iter().filter(|d| d.app_id == a.id).collect();
    store
        .complete(&[completion(of_a[0], NextState::Retry { at: T0 + 1 }, T0)])
        .await
        .expect("complete");
    assert!(store.delete_app(&a.id).await.expect("delete"));
    assert!(!store.delete_app(&a.id).await.expect("delete"));
    assert_eq!(store.get_app(a.id.as_str()).await.expect("get"), None);
    assert_eq!(
        store.endpoint_delivery_counts(&e.id).await.expect("counts"),
        DeliveryCounts::default(),
        "the app's deliveries go with it"
    );
    assert_eq!(
        store.get_endpoint(&a.id, e.id.as_str()).await.expect("get"),
        None
    );
    assert_eq!(
        store
            .get_message(&a.id, ms[0].id.as_str())
            .await
            .expect("get"),
        None
    );
    assert!(store
        .list_attempts_of_endpoint(&a.id, &e.id, &page(10, None, true))
        .await
        .expect("attempts")
        .items
        .is_empty());
    assert!(store
        .get_message(&b.id, ms[1].id.as_str())
        .await
        .expect("get")
        .is_some());
    assert!(!store.update_app(&a).await.expect("update"));

    // A message for a deleted app is refused alone; the batch goes on.
    let later = vec![message(&a.id, "x", None), message(&b.id, "x", None)];
    let outcomes = store.insert_messages(&later).await.expect("insert");
    assert_eq!(
        outcomes,
        vec![
            InsertOutcome::NoSuchApp,
            InsertOutcome::Inserted { deliveries: 1 }
        ]
    );
}

async fn tokens_are_found_by_digest_and_go_with_their_app(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let t = ApiToken::plain("tok_1".into(), a.id.clone(), "ci".into(), T0);
    store.create_token(&t, "ab12").await.expect("create");
    assert_eq!(
        store.find_token("ab12").await.expect("find"),
        Some(t.clone())
    );
    assert_eq!(store.find_token("ffff").await.expect("find"), None);
    assert_eq!(
        store.list_tokens(&a.id).await.expect("list"),
        vec![t.clone()]
    );
    let other = app(&store, None).await;
    assert!(!store
        .delete_token(&other.id, "tok_1")
        .await
        .expect("delete"));
    assert!(store.delete_token(&a.id, "tok_1").await.expect("delete"));
    store.create_token(&t, "ab12").await.expect("again");
    assert!(store.delete_app(&a.id).await.expect("delete app"));
    assert_eq!(store.find_token("ab12").await.expect("find"), None);
}

async fn idempotency_keys_replay_refuse_and_expire(store: Arc<dyn Store>) {
    let begin = |key: &'static str, hash: &'static str, now: Millis| {
        let store = store.clone();
        async move {
            store
                .idempotency_begin("admin", key, hash, now, now - 1_000, now - 100)
                .await
                .expect("begin")
        }
    };
    assert_eq!(begin("k", "h1", T0).await, IdemBegin::Fresh);
    assert_eq!(begin("k", "h1", T0 + 1).await, IdemBegin::InProgress);
    assert_eq!(begin("k", "h2", T0 + 1).await, IdemBegin::Mismatch);
    store
        .idempotency_finish("admin", "k", 202, r#"{"id":"msg_1"}"#)
        .await
        .expect("finish");
    assert_eq!(
        begin("k", "h1", T0 + 2).await,
        IdemBegin::Replay {
            status: 202,
            body: r#"{"id":"msg_1"}"#.into()
        }
    );
    // Scopes are apart.
    assert_eq!(
        store
            .idempotency_begin("tok_x", "k", "h9", T0, T0 - 1_000, T0 - 100)
            .await
            .expect("begin"),
        IdemBegin::Fresh
    );
    // Past its lifetime a key is fresh again; a dead "in progress" too.
    assert_eq!(begin("k", "h2", T0 + 5_000).await, IdemBegin::Fresh);
    assert_eq!(begin("k", "h2", T0 + 5_000 + 200).await, IdemBegin::Fresh);
    // Aborted: fresh at once.
    assert_eq!(begin("j", "h", T0).await, IdemBegin::Fresh);
    store.idempotency_abort("admin", "j").await.expect("abort");
    assert_eq!(begin("j", "h", T0 + 1).await, IdemBegin::Fresh);
    assert!(store.prune_idempotency(T0 + 10_000).await.expect("prune") >= 2);
    assert_eq!(begin("k", "zz", T0 + 10_001).await, IdemBegin::Fresh);
}

/// PostgreSQL lock order: a connection of the test's own on `schema`,
/// and its backend's pid.
async fn pg_connection(url: &str, schema: &str) -> (sqlx::PgConnection, i32) {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(url).await.expect("connect");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SET search_path TO \"{schema}\""
    )))
    .execute(&mut conn)
    .await
    .expect("search_path");
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut conn)
        .await
        .expect("pid");
    (conn, pid)
}

/// The backends waiting for a lock that `pid` holds.
async fn blocked_by(monitor: &mut sqlx::PgConnection, pid: i32) -> Vec<i32> {
    sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))")
        .bind(pid)
        .fetch_all(monitor)
        .await
        .expect("pg_stat_activity")
}

/// Interleaves two store calls at their locks, deterministically: the
/// test's own transaction takes `hold` (a row lock, bound to `arg`); then
/// `first` runs until it waits for that lock, and `second` until it waits
/// for `first` (or ends); then the test lets go. Two calls that take their
/// locks in one order both get through; in opposite orders they close a
/// cycle, and PostgreSQL aborts one of them ("deadlock detected").
async fn interleaved<A, B>(
    url: &str,
    schema: &str,
    hold: &str,
    arg: &str,
    first: impl std::future::Future<Output = A> + Send + 'static,
    second: impl std::future::Future<Output = B> + Send + 'static,
) -> (A, B)
where
    A: Send + 'static,
    B: Send + 'static,
{
    use sqlx::Connection;
    let (mut monitor, _) = pg_connection(url, schema).await;
    let (mut blocker, blocker_pid) = pg_connection(url, schema).await;
    let mut held = blocker.begin().await.expect("begin");
    sqlx::query(sqlx::AssertSqlSafe(hold.to_owned()))
        .bind(arg)
        .fetch_one(&mut *held)
        .await
        .expect("the held row exists");
    let deadline = tokio::time::Instant::now() + crate::helpers::PATIENCE;
    let first = tokio::spawn(first);
    let first_pid = loop {
        if let Some(pid) = blocked_by(&mut monitor, blocker_pid).await.first() {
            break *pid;
        }
        assert!(
            !first.is_finished(),
            "the first call never waited for the held lock"
        );
        assert!(tokio::time::Instant::now() < deadline, "nothing waited");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let second = tokio::spawn(second);
    while !second.is_finished() && blocked_by(&mut monitor, first_pid).await.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the second call hung"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    held.rollback().await.expect("let go");
    let (a, b) = (first.await.expect("first"), second.await.expect("second"));
    (a, b)
}

/// Deleting an application while a completer records outcomes for its
/// endpoint: the completer holds the endpoint and adds to its stats
/// bucket; the deletion must not hold that bucket while it waits for the
/// endpoint. Held here: the application (so the deletion waits early).
#[tokio::test]
async fn postgres_deleting_an_app_and_completing_lock_in_one_order() {
    let Some(f) = crate::helpers::postgres::postgres(
        "store_conformance::postgres_deleting_an_app_and_completing_lock_in_one_order",
    )
    .await
    else {
        return;
    };
    let (url, schema) = (f.url.clone(), f.schema.clone());
    f.run_postgres(|pg| async move {
        let store: Arc<dyn Store> = pg;
        let a = app(&store, None).await;
        endpoint(&store, &a.id, None, false).await;
        let got = claim_n(&store, &a.id, 2, T0).await;
        // A first outcome makes the stats bucket the second one adds to.
        store
            .complete(&[outcome(&got[0], true, 200, T0, 5)])
            .await
            .expect("complete");
        let late = outcome(&got[1], true, 200, T0, 5);
        let (deleting, completing) = (store.clone(), store.clone());
        let app_id = a.id.clone();
        let (deleted, completed) = interleaved(
            &url,
            &schema,
            "SELECT 1 FROM applications WHERE id = $1 FOR KEY SHARE",
            a.id.as_str(),
            async move { deleting.delete_app(&app_id).await },
            async move { completing.complete(&[late]).await },
        )
        .await;
        assert!(matches!(deleted, Ok(true)), "{deleted:?}");
        assert!(completed.is_ok(), "{completed:?}");
        assert_eq!(store.get_app(a.id.as_str()).await.expect("get"), None);
    })
    .await;
}

/// Deleting an application while a message of it is resent: the resend
/// must take the endpoint before the message, as the deletion does. Held
/// here: the message (so the deletion waits there, holding the endpoint).
#[tokio::test]
async fn postgres_deleting_an_app_and_resending_lock_in_one_order() {
    let Some(f) = crate::helpers::postgres::postgres(
        "store_conformance::postgres_deleting_an_app_and_resending_lock_in_one_order",
    )
    .await
    else {
        return;
    };
    let (url, schema) = (f.url.clone(), f.schema.clone());
    f.run_postgres(|pg| async move {
        let store: Arc<dyn Store> = pg;
        let a = app(&store, None).await;
        let e = endpoint(&store, &a.id, None, false).await;
        let m = message(&a.id, "x", None);
        store
            .insert_messages(std::slice::from_ref(&m))
            .await
            .expect("insert");
        let (deleting, resending) = (store.clone(), store.clone());
        let (app_id, resend_app, msg_id) = (a.id.clone(), a.id.clone(), m.id.clone());
        let (deleted, resent) = interleaved(
            &url,
            &schema,
            "SELECT 1 FROM messages WHERE id = $1 FOR KEY SHARE",
            m.id.as_str(),
            async move { deleting.delete_app(&app_id).await },
            async move { resending.resend(&resend_app, &msg_id, &e.id, T0).await },
        )
        .await;
        assert!(matches!(deleted, Ok(true)), "{deleted:?}");
        assert!(resent.is_ok(), "{resent:?}");
    })
    .await;
}

/// Deleting an application while retention prunes an old message of it:
/// retention locks the message, then its deliveries; the deletion must
/// take the messages before the deliveries too. Held here: an older
/// message of the app (so the deletion waits at the messages, before it
/// reaches the one pruned).
#[tokio::test]
async fn postgres_deleting_an_app_and_pruning_lock_in_one_order() {
    let Some(f) = crate::helpers::postgres::postgres(
        "store_conformance::postgres_deleting_an_app_and_pruning_lock_in_one_order",
    )
    .await
    else {
        return;
    };
    let (url, schema) = (f.url.clone(), f.schema.clone());
    f.run_postgres(|pg| async move {
        let store: Arc<dyn Store> = pg;
        let a = app(&store, None).await;
        endpoint(&store, &a.id, None, false).await;
        // The held one first by id and on disk: the deletion meets it first.
        let mut two = [message(&a.id, "x", None), message(&a.id, "x", None)];
        two.sort_by(|x, y| x.id.as_str().cmp(y.id.as_str()));
        for m in &two {
            store
                .insert_messages(std::slice::from_ref(m))
                .await
                .expect("insert");
        }
        let held = &two[0];
        let got = claim(&store, T0, 10, &HashMap::new(), 10).await;
        let done: Vec<Completion> = got
            .iter()
            .map(|d| completion(d, NextState::Delivered, T0 + 1))
            .collect();
        store.complete(&done).await.expect("complete");
        let (deleting, pruning) = (store.clone(), store.clone());
        let app_id = a.id.clone();
        let (deleted, report) = interleaved(
            &url,
            &schema,
            "SELECT 1 FROM messages WHERE id = $1 FOR KEY SHARE",
            held.id.as_str(),
            async move { deleting.delete_app(&app_id).await },
            async move { pruning.prune(T0 + 10, T0 + 10, 100).await },
        )
        .await;
        assert!(matches!(deleted, Ok(true)), "{deleted:?}");
        assert!(report.is_ok(), "{report:?}");
    })
    .await;
}

fn portal_token(app: &AppId, id: &str, expires_at: Millis, session_id: Option<&str>) -> ApiToken {
    ApiToken {
        expires_at: Some(expires_at),
        capabilities: Some("ViewBase".into()),
        session_id: session_id.map(str::to_owned),
        ..ApiToken::plain(id.into(), app.clone(), "portal".into(), T0)
    }
}

async fn portal_codes_are_taken_once_and_expire_with_their_token(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let t = portal_token(&a.id, "tok_p1", T0 + 3_600_000, Some("s1"));
    store
        .create_portal_token(&t, "tokdigest1", "codedigest1")
        .await
        .expect("create");
    assert_eq!(
        store.find_token("tokdigest1").await.expect("find"),
        Some(t.clone())
    );
    assert_eq!(
        store
            .take_portal_code("codedigest1", T0 + 1)
            .await
            .expect("take"),
        Some(t.clone())
    );
    assert_eq!(
        store
            .take_portal_code("codedigest1", T0 + 2)
            .await
            .expect("take again"),
        None,
        "a code is taken once"
    );
    // A code past its token's expiry is gone and gives nothing.
    let late = portal_token(&a.id, "tok_p2", T0 + 1000, None);
    store
        .create_portal_token(&late, "tokdigest2", "codedigest2")
        .await
        .expect("create");
    assert_eq!(
        store
            .take_portal_code("codedigest2", T0 + 1000)
            .await
            .expect("take"),
        None
    );
    // expire-all by session id touches only the chosen tokens.
    let other = portal_token(&a.id, "tok_p3", T0 + 3_600_000, Some("s2"));
    store
        .create_portal_token(&other, "tokdigest3", "codedigest3")
        .await
        .expect("create");
    let n = store
        .expire_tokens(&a.id, T0 + 10, Some(&["s1".to_owned()]))
        .await
        .expect("expire");
    assert_eq!(n, 1);
    let found = store
        .find_token("tokdigest1")
        .await
        .expect("find")
        .expect("kept");
    assert_eq!(found.expires_at, Some(T0 + 10));
    assert!(!found.live_at(T0 + 10));
    let untouched = store
        .find_token("tokdigest3")
        .await
        .expect("find")
        .expect("kept");
    assert_eq!(untouched.expires_at, Some(T0 + 3_600_000));
    // Without session ids: every token of the app, plain ones included.
    let plain = ApiToken::plain("tok_plain".into(), a.id.clone(), "ci".into(), T0);
    store
        .create_token(&plain, "tokdigest4")
        .await
        .expect("create");
    store
        .expire_tokens(&a.id, T0 + 20, None)
        .await
        .expect("expire");
    let ended = store
        .find_token("tokdigest4")
        .await
        .expect("find")
        .expect("kept");
    assert_eq!(ended.expires_at, Some(T0 + 20));
    assert_eq!(
        store
            .take_portal_code("codedigest3", T0 + 21)
            .await
            .expect("take"),
        None,
        "its code expired with it"
    );
}

fn portal_session(app: &AppId, token: &str, expires_at: Millis) -> Session {
    Session {
        kind: SessionKind::Portal,
        app_id: Some(app.clone()),
        token_id: Some(token.into()),
        capabilities: Some("ViewBase".into()),
        session_id: Some("s1".into()),
        theme: "darkMode=true".into(),
        csrf: "csrf1".into(),
        flash: None,
        created_at: T0,
        expires_at,
    }
}

async fn sessions_are_found_by_digest_expire_and_end_with_their_token(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let t = portal_token(&a.id, "tok_s1", T0 + 3_600_000, Some("s1"));
    store
        .create_portal_token(&t, "stok1", "scode1")
        .await
        .expect("token");
    let s = portal_session(&a.id, "tok_s1", T0 + 3_600_000);
    store.create_session("sess1", &s).await.expect("create");
    assert_eq!(
        store.find_session("sess1", T0).await.expect("find"),
        Some(s.clone())
    );
    assert_eq!(store.find_session("nope", T0).await.expect("find"), None);
    assert_eq!(
        store
            .find_session("sess1", T0 + 3_600_000)
            .await
            .expect("find"),
        None,
        "expired"
    );
    // The flash is shown once.
    store
        .set_session_flash("sess1", "Saved")
        .await
        .expect("flash");
    let with = store
        .find_session("sess1", T0)
        .await
        .expect("find")
        .expect("live");
    assert_eq!(with.flash.as_deref(), Some("Saved"));
    let without = store
        .find_session("sess1", T0)
        .await
        .expect("find")
        .expect("live");
    assert_eq!(without.flash, None);
    // A dashboard session has no app.
    let d = Session {
        kind: SessionKind::Dashboard,
        app_id: None,
        token_id: None,
        capabilities: None,
        session_id: None,
        theme: String::new(),
        ..s.clone()
    };
    store.create_session("dash1", &d).await.expect("create");
    assert_eq!(
        store.find_session("dash1", T0).await.expect("find"),
        Some(d)
    );
    store.delete_session("dash1").await.expect("delete");
    assert_eq!(store.find_session("dash1", T0).await.expect("find"), None);
    // Expiring the token expires its sessions; ending it ends them.
    store
        .expire_tokens(&a.id, T0 + 5, None)
        .await
        .expect("expire");
    assert_eq!(
        store.find_session("sess1", T0 + 5).await.expect("find"),
        None
    );
    assert!(store
        .find_session("sess1", T0 + 4)
        .await
        .expect("find")
        .is_some());
    store.end_token("tok_s1", T0 + 1).await.expect("end");
    assert_eq!(store.find_session("sess1", T0).await.expect("find"), None);
    // Retention prunes expired sessions.
    store
        .create_session("sess2", &portal_session(&a.id, "tok_s1", T0 + 100))
        .await
        .expect("create");
    assert_eq!(store.prune_sessions(T0 + 100).await.expect("prune"), 1);
    assert_eq!(store.prune_sessions(T0 + 100).await.expect("prune"), 0);
}

/// A breaker that opens on four attempts at 50 %, with a 30 s cooldown.
fn breaker_rule() -> BreakerRule {
    BreakerRule {
        min_attempts: 4,
        window: Duration::from_secs(60),
        failure_rate: 0.5,
        cooldown: Duration::from_secs(30),
        max_cooldown: Duration::from_secs(600),
    }
}

/// The stored breaker: stepped by completion batches in their transaction,
/// read back by `circuit_of` and (while not closed) `broken_circuits`,
/// moved to half-open by `swap_circuit`, closed by the probe's success.
async fn circuit_breakers_are_stepped_by_completions_and_stored(store: Arc<dyn Store>) {
    let rule = breaker_rule();
    let a = app(&store, None).await;
    let e = endpoint(&store, &a.id, None, false).await;
    let other = endpoint(&store, &a.id, None, false).await;
    assert_eq!(
        store.circuit_of(&e.id).await.expect("read"),
        Some(Circuit::default())
    );
    assert_eq!(
        store
            .circuit_of(&EndpointId::generate())
            .await
            .expect("read"),
        None
    );
    assert!(store.broken_circuits().await.expect("read").is_empty());

    // Three of e's four fail, all of `other`'s succeed: e opens alone.
    let got = claim_n(&store, &a.id, 4, T0).await;
    let (mine, theirs): (Vec<_>, Vec<_>) = got.iter().partition(|d| d.endpoint_id == e.id);
    let mut batch: Vec<Completion> = mine
        .iter()
        .enumerate()
        .map(|(i, d)| outcome(d, i == 0, 500, T0 + i as i64, 5))
        .collect();
    batch.extend(theirs.iter().map(|d| outcome(d, true, 200, T0, 5)));
    let done = store
        .complete_with_circuits(&batch, &rule)
        .await
        .expect("complete");
    assert_eq!(done.circuits.len(), 1, "{:?}", done.circuits);
    let change = &done.circuits[0];
    assert_eq!(change.endpoint_id, e.id);
    assert_eq!(change.app_id, a.id);
    assert_eq!(
        change.transition,
        Transition::Opened {
            attempts: 4,
            failures: 3,
            failure_rate: 0.75
        }
    );
    let now = batch.iter().map(|c| c.now).max().expect("a batch");
    let open = store
        .circuit_of(&e.id)
        .await
        .expect("read")
        .expect("exists");
    assert_eq!(open.state, CircuitState::Open);
    assert_eq!(open.until, Some(now + 30_000));
    assert_eq!(open.cooldown_ms, 30_000);
    assert_eq!((open.window.attempts, open.window.failures), (4, 3));
    assert_eq!(
        store
            .circuit_of(&other.id)
            .await
            .expect("read")
            .expect("exists")
            .state,
        CircuitState::Closed
    );
    let broken = store.broken_circuits().await.expect("read");
    assert_eq!(
        broken,
        vec![EndpointCircuit {
            endpoint_id: e.id.clone(),
            app_id: a.id.clone(),
            circuit: open.clone(),
        }]
    );
    // The overview a listed page reads carries each endpoint's breaker, so
    // the page needs no store-wide read of them.
    let listed: HashMap<EndpointId, Circuit> = store
        .list_endpoint_overview(Some(&a.id), 0, 10)
        .await
        .expect("overview")
        .into_iter()
        .map(|o| (o.endpoint.id, o.circuit))
        .collect();
    assert_eq!(listed.get(&e.id), Some(&open));
    assert_eq!(
        listed.get(&other.id).map(|c| c.state),
        Some(CircuitState::Closed)
    );

    // A late answer while open changes nothing.
    let late = claim(&store, T0 + 70_000, 10, &HashMap::new(), 10).await;
    let late_e: Vec<_> = late.iter().filter(|d| d.endpoint_id == e.id).collect();
    assert!(!late_e.is_empty());
    let done = store
        .complete_with_circuits(&[outcome(late_e[0], true, 200, T0 + 60_000, 5)], &rule)
        .await
        .expect("complete");
    assert!(done.circuits.is_empty());
    assert_eq!(
        store.circuit_of(&e.id).await.expect("read"),
        Some(open.clone())
    );

    // Half-open, won by "p1"; its probe succeeds: closed, window fresh.
    let won = herald_policy::breaker::probe(&open, now + 30_000, Duration::from_secs(60), "p1")
        .expect("cooldown over");
    assert!(store.swap_circuit(&e.id, &open, &won).await.expect("swap"));
    assert!(
        !store.swap_circuit(&e.id, &open, &won).await.expect("swap"),
        "the row no longer holds what was read"
    );
    assert_eq!(
        store.circuit_of(&e.id).await.expect("read"),
        Some(won.clone())
    );
    let done = store
        .complete_with_circuits(&[outcome(late_e[1], true, 200, now + 30_001, 5)], &rule)
        .await
        .expect("complete");
    assert_eq!(done.circuits.len(), 1);
    assert_eq!(done.circuits[0].transition, Transition::Closed);
    let closed = store
        .circuit_of(&e.id)
        .await
        .expect("read")
        .expect("exists");
    assert_eq!(closed.state, CircuitState::Closed);
    assert_eq!((closed.cooldown_ms, closed.probe_by), (0, None));
    assert!(store.broken_circuits().await.expect("read").is_empty());
}

/// Of two callers trying to win the same probe at once, one does.
async fn only_one_of_two_concurrent_probers_wins(store: Arc<dyn Store>) {
    let rule = breaker_rule();
    let a = app(&store, None).await;
    let e = endpoint(&store, &a.id, None, false).await;
    let got = claim_n(&store, &a.id, 4, T0).await;
    let failed: Vec<_> = got.iter().map(|d| outcome(d, false, 500, T0, 5)).collect();
    store
        .complete_with_circuits(&failed, &rule)
        .await
        .expect("complete");
    let open = store
        .circuit_of(&e.id)
        .await
        .expect("read")
        .expect("exists");
    assert_eq!(open.state, CircuitState::Open);
    let at = open.until.expect("open until");
    let timeout = Duration::from_secs(60);
    for round in 0..5 {
        let seen = store
            .circuit_of(&e.id)
            .await
            .expect("read")
            .expect("exists");
        let now = at + i64::from(round) * 61_000;
        let one = herald_policy::breaker::probe(&seen, now, timeout, "one").expect("due");
        let two = herald_policy::breaker::probe(&seen, now, timeout, "two").expect("due");
        let (s1, s2) = (store.clone(), store.clone());
        let (r1, r2) = tokio::join!(
            async { s1.swap_circuit(&e.id, &seen, &one).await.expect("swap") },
            async { s2.swap_circuit(&e.id, &seen, &two).await.expect("swap") },
        );
        assert!(r1 ^ r2, "round {round}: exactly one wins ({r1}, {r2})");
        let winner = if r1 { "one" } else { "two" };
        let stored = store
            .circuit_of(&e.id)
            .await
            .expect("read")
            .expect("exists");
        assert_eq!(stored.state, CircuitState::HalfOpen);
        assert_eq!(stored.probe_by.as_deref(), Some(winner));
    }
}

/// Deliveries an open breaker holds back (pending, unclaimed) die by the
/// age cap in retention; a closed endpoint's as old ones do not.
async fn retention_expires_deliveries_held_by_an_open_breaker(store: Arc<dyn Store>) {
    let rule = breaker_rule();
    let a = app(&store, None).await;
    let e = endpoint(&store, &a.id, None, false).await;
    let b = app(&store, None).await;
    let healthy = endpoint(&store, &b.id, None, false).await;
    let got = claim_n(&store, &a.id, 4, T0).await;
    let failed: Vec<_> = got.iter().map(|d| outcome(d, false, 500, T0, 5)).collect();
    store
        .complete_with_circuits(&failed, &rule)
        .await
        .expect("complete");
    assert_eq!(
        store
            .circuit_of(&e.id)
            .await
            .expect("read")
            .expect("exists")
            .state,
        CircuitState::Open
    );
    let live = message(&b.id, "x", None);
    store
        .insert_messages(std::slice::from_ref(&live))
        .await
        .expect("insert");
    let mut total = 0;
    for _ in 0..10 {
        let n = store
            .expire_circuit_held(T0 + 1, T0 + 100_000, 3)
            .await
            .expect("expire");
        total += n;
        if n < 3 {
            break;
        }
    }
    assert_eq!(total, 4, "the four retries held by the open breaker");
    let dead = store
        .list_dead(&dead_of(&a.id, Some(&e.id)), &page(10, None, true))
        .await
        .expect("dead");
    assert_eq!(dead.items.len(), 4);
    assert!(dead
        .items
        .iter()
        .all(|d| d.dead_reason == Some(DeadReason::TooOld)));
    assert_eq!(history(&store, &live).await.1, vec![DeliveryState::Pending]);
    let _ = healthy;
}

/// An endpoint of `app` with `throttleRate` `rate` and `ordering`.
async fn endpoint_with(
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
async fn messages_in_order(store: &Arc<dyn Store>, app: &AppId, n: i64) -> Vec<NewMessage> {
    let ms: Vec<_> = (0..n)
        .map(|i| NewMessage {
            created_at: T0 - 10_000 + i,
            ..message(app, "x", None)
        })
        .collect();
    store.insert_messages(&ms).await.expect("insert");
    ms
}

/// Issue 13, throttle: a claim takes a throttled endpoint's slots within
/// `THROTTLE_HORIZON_MS`, each delivery with its slot, `1/rate` apart and
/// moving on from where the last claim left off; other endpoints are not
/// held up; a rate lifted shows at the next claim.
/// A new `throttleRate` moves the next slot as if the last one taken had
/// been spaced at it: a raise applies from the next claim; a lowered rate
/// waits a second after the last slot (the old slots were denser, and no
/// second may hold more than the new rate + 1).
async fn a_changed_throttle_rate_moves_the_next_slot(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    // 5/s: slots 200 ms apart; the first claim takes T0 only (the next,
    // T0 + 200, is past the 100 ms horizon).
    let ep = endpoint_with(&store, &a.id, Some(5), EndpointOrdering::None).await;
    messages_in_order(&store, &a.id, 20).await;
    let none = HashMap::new();
    let first = claim(&store, T0, 100, &none, 100).await;
    assert_eq!(
        first.iter().map(|d| d.send_at).collect::<Vec<_>>(),
        vec![Some(T0)]
    );
    let rate = |r: u16| EndpointChanges {
        rate_limit: Some(Some(r)),
        ..EndpointChanges::default()
    };
    // Raised to 50/s: the next slot is 20 ms after the last, not 200.
    assert!(store
        .update_endpoint(&a.id, &ep.id, &rate(50), T0)
        .await
        .expect("raise"));
    let raised = claim(&store, T0 + 1, 100, &none, 100).await;
    assert_eq!(
        raised.iter().map(|d| d.send_at).collect::<Vec<_>>(),
        vec![
            Some(T0 + 20),
            Some(T0 + 40),
            Some(T0 + 60),
            Some(T0 + 80),
            Some(T0 + 100)
        ],
        "the raise applies from the next claim"
    );
    // Lowered to 2/s: nothing until a second after the last slot.
    assert!(store
        .update_endpoint(&a.id, &ep.id, &rate(2), T0 + 1)
        .await
        .expect("lower"));
    assert!(
        claim(&store, T0 + 1_000, 100, &none, 100).await.is_empty(),
        "within a second of the last slot"
    );
    let lowered = claim(&store, T0 + 1_050, 100, &none, 100).await;
    assert_eq!(
        lowered.iter().map(|d| d.send_at).collect::<Vec<_>>(),
        vec![Some(T0 + 1_100)],
        "a second after the last slot, then 500 ms apart"
    );
}

async fn claim_reserves_throttle_slots_within_the_horizon(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    // 50/s: a slot every 20 ms, five within the 100 ms horizon.
    let fast = endpoint_with(&store, &a.id, Some(50), EndpointOrdering::None).await;
    messages_in_order(&store, &a.id, 12).await;
    let none = HashMap::new();
    let got = claim(&store, T0, 100, &none, 100).await;
    let slots: Vec<_> = got.iter().map(|d| d.send_at).collect();
    assert_eq!(
        slots,
        vec![
            Some(T0),
            Some(T0 + 20),
            Some(T0 + 40),
            Some(T0 + 60),
            Some(T0 + 80)
        ],
        "five slots 20 ms apart from now"
    );
    assert!(got
        .iter()
        .all(|d| d.attempts == 0 && d.endpoint_id == fast.id));
    assert!(
        claim(&store, T0, 100, &none, 100).await.is_empty(),
        "the horizon's slots are taken"
    );
    // 30 ms later the horizon reaches T0 + 130: slots T0 + 100 and + 120.
    let next = claim(&store, T0 + 30, 100, &none, 100).await;
    assert_eq!(
        next.iter().map(|d| d.send_at).collect::<Vec<_>>(),
        vec![Some(T0 + 100), Some(T0 + 120)],
        "the next slots follow the last one, not the clock"
    );
    let waiting = store.throttle_waiting().await.expect("waiting");
    assert_eq!(waiting.len(), 1);
    assert_eq!(
        (waiting[0].rate, waiting[0].waiting),
        (50, 5),
        "{waiting:?}"
    );
    assert_eq!(
        store
            .throttle_waiting_of(&waiting[0].endpoint_id)
            .await
            .expect("waiting of one"),
        5
    );

    // An unthrottled neighbour in the same claim goes at once, all of it.
    let b = app(&store, None).await;
    let free = endpoint(&store, &b.id, None, false).await;
    assert_eq!(
        store
            .throttle_waiting_of(&free.id)
            .await
            .expect("waiting of one"),
        0,
        "an endpoint without a rate waits for no slot"
    );
    messages_in_order(&store, &b.id, 4).await;
    let mixed = claim(&store, T0 + 30, 100, &none, 100).await;
    assert_eq!(mixed.len(), 4, "{mixed:?}");
    assert!(mixed
        .iter()
        .all(|d| d.endpoint_id == free.id && d.send_at.is_none()));

    // Lifted: the rest go at the next claim, with no slot.
    let lift = EndpointChanges {
        rate_limit: Some(None),
        ..EndpointChanges::default()
    };
    store
        .update_endpoint(&a.id, &fast.id, &lift, T0)
        .await
        .expect("update");
    let rest = claim(&store, T0 + 30, 100, &none, 100).await;
    assert_eq!(rest.len(), 5, "{rest:?}");
    assert!(rest.iter().all(|d| d.send_at.is_none()));

    // At 1,000/s the slots are 1,009 µs apart, not 1 ms: requests sent up
    // to 10 ms late must still put no more than 1,001 into a second the
    // receiver sees (exact 1 ms slots put 1,004 there in the bench).
    let c = app(&store, None).await;
    endpoint_with(&store, &c.id, Some(1000), EndpointOrdering::None).await;
    messages_in_order(&store, &c.id, 120).await;
    let got = claim(&store, T0, 200, &none, 200).await;
    let want: Vec<_> = (0..100)
        .map(|i| Some(T0 + (i * 1009 + 999) / 1000))
        .collect();
    assert_eq!(
        got.iter().map(|d| d.send_at).collect::<Vec<_>>(),
        want,
        "a hundred slots within the 100 ms horizon, 1,009 µs apart"
    );
}

/// Issue 13, ordering: of a FIFO endpoint a claim takes only the first
/// live delivery in creation order, and nothing while it is in flight or
/// waiting for its retry; once it is delivered the next one goes; a
/// replayed dead one goes to the back of the queue.
async fn claim_takes_only_a_fifo_endpoints_head_one_at_a_time(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let ep = endpoint_with(&store, &a.id, None, EndpointOrdering::Fifo).await;
    let ms = messages_in_order(&store, &a.id, 4).await;
    let none = HashMap::new();
    let first = claim(&store, T0, 100, &none, 100).await;
    assert_eq!(first.len(), 1, "one at a time: {first:?}");
    assert_eq!(first[0].msg_id, ms[0].id, "the oldest first");
    assert!(
        claim(&store, T0, 100, &none, 100).await.is_empty(),
        "head in flight"
    );
    // The head fails and waits for its retry: the others wait with it.
    let retry = completion(&first[0], NextState::Retry { at: T0 + 5_000 }, T0);
    store.complete(&[retry]).await.expect("complete");
    assert!(
        claim(&store, T0 + 1_000, 100, &none, 100).await.is_empty(),
        "behind the head"
    );
    // Its lease expiring (a crashed worker) gives it back, not the next.
    let again = claim(&store, T0 + 5_000, 100, &none, 100).await;
    assert_eq!(
        again.iter().map(|d| &d.msg_id).collect::<Vec<_>>(),
        vec![&ms[0].id]
    );
    let retaken = claim(&store, T0 + 5_000 + 60_001, 100, &none, 100).await;
    assert_eq!(
        retaken.iter().map(|d| &d.msg_id).collect::<Vec<_>>(),
        vec![&ms[0].id],
        "expired lease: the head again"
    );
    // Dead: the next one goes.
    let dead = completion(
        &retaken[0],
        NextState::Dead(DeadReason::Exhausted),
        T0 + 70_000,
    );
    store.complete(&[dead]).await.expect("complete");
    let second = claim(&store, T0 + 70_000, 100, &none, 100).await;
    assert_eq!(
        second.iter().map(|d| &d.msg_id).collect::<Vec<_>>(),
        vec![&ms[1].id]
    );
    // No room (an open breaker passes the cap as in flight): nothing,
    // even the head. Room left, however much is counted against the
    // endpoint (lanes raise the count): the head, and only the head.
    store
        .release(&second[0].id, &second[0].lease_token, T0 + 70_000)
        .await
        .expect("release");
    let full: HashMap<EndpointId, usize> = [(ep.id.clone(), 100)].into();
    assert!(
        claim(&store, T0 + 70_000, 100, &full, 100).await.is_empty(),
        "room 0"
    );
    let counted: HashMap<EndpointId, usize> = [(ep.id.clone(), 60)].into();
    let head = claim(&store, T0 + 70_000, 100, &counted, 100).await;
    assert_eq!(
        head.iter().map(|d| &d.msg_id).collect::<Vec<_>>(),
        vec![&ms[1].id],
        "room left: the head alone"
    );
    store
        .release(&head[0].id, &head[0].lease_token, T0 + 70_000)
        .await
        .expect("release");
    let second = claim(&store, T0 + 70_000, 100, &none, 100).await;
    assert_eq!(
        second.iter().map(|d| &d.msg_id).collect::<Vec<_>>(),
        vec![&ms[1].id],
        "released: still the head"
    );
    let done = completion(&second[0], NextState::Delivered, T0 + 70_001);
    store.complete(&[done]).await.expect("complete");
    // The dead first message replayed: behind messages 2 and 3.
    let replayed = store
        .replay_dead_matching(&dead_of(&a.id, Some(&ep.id)), None, 100, T0 + 70_002)
        .await
        .expect("replay");
    assert_eq!(replayed, 1);
    let mut order = Vec::new();
    for step in 0..3 {
        let now = T0 + 80_000 + step;
        let got = claim(&store, now, 100, &none, 100).await;
        assert_eq!(got.len(), 1, "one at a time: {got:?}");
        order.push(got[0].msg_id.clone());
        let ok = completion(&got[0], NextState::Delivered, now);
        store.complete(&[ok]).await.expect("complete");
    }
    assert_eq!(
        order,
        vec![ms[2].id.clone(), ms[3].id.clone(), ms[0].id.clone()]
    );
}

/// Issue 13: an ingest batch's handoff never takes a throttled or FIFO
/// endpoint's deliveries (the claim's statement reserves the throttle's
/// slots and finds the queue's head); an ordinary one's it does.
async fn throttled_and_fifo_endpoints_are_never_handed_off_at_ingest(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let throttled = endpoint_with(&store, &a.id, Some(1000), EndpointOrdering::None).await;
    let fifo = endpoint_with(&store, &a.id, None, EndpointOrdering::Fifo).await;
    let plain = endpoint(&store, &a.id, None, false).await;
    let none = HashMap::new();
    let req = ClaimRequest {
        now: T0,
        lease_until: T0 + 60_000,
        limit: 100,
        in_flight: &none,
        endpoint_cap: 100,
        unlisted_cap: 100,
    };
    let (outcomes, handed) = store
        .insert_messages_claiming(&[message(&a.id, "x", None)], &req)
        .await
        .expect("insert");
    assert_eq!(outcomes, vec![InsertOutcome::Inserted { deliveries: 3 }]);
    assert_eq!(
        handed.iter().map(|d| &d.endpoint_id).collect::<Vec<_>>(),
        vec![&plain.id]
    );
    let claimed = claim(&store, T0, 100, &none, 100).await;
    let mut eps: Vec<_> = claimed.iter().map(|d| d.endpoint_id.clone()).collect();
    eps.sort();
    let mut want = vec![throttled.id.clone(), fifo.id.clone()];
    want.sort();
    assert_eq!(eps, want, "the loop's claim takes them");
}

/// Issue 13, item 4: two hundred retries of one endpoint fall due together,
/// before ten first attempts to another: a claim of ten gives the first
/// attempts half, the retries half (not all ten to the older retries);
/// with no first attempt waiting, the retries take every slot.
async fn first_attempts_get_their_share_of_a_claim_during_a_retry_storm(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let stormy = endpoint(&store, &a.id, None, false).await;
    // More than a claim's window (64 rows): the first attempts lie beyond
    // what the walk of the due head reads.
    let claimed = claim_n(&store, &a.id, 200, T0).await;
    assert_eq!(claimed.len(), 200);
    let retries: Vec<_> = claimed
        .iter()
        .map(|d| completion(d, NextState::Retry { at: T0 + 1 }, T0))
        .collect();
    store.complete(&retries).await.expect("complete");
    let b = app(&store, None).await;
    let healthy = endpoint(&store, &b.id, None, false).await;
    let fresh: Vec<_> = (0..10)
        .map(|_| NewMessage {
            created_at: T0 + 2,
            ..message(&b.id, "x", None)
        })
        .collect();
    store.insert_messages(&fresh).await.expect("insert");
    let none = HashMap::new();
    let got = claim(&store, T0 + 10, 10, &none, 100).await;
    let firsts = got.iter().filter(|d| d.endpoint_id == healthy.id).count();
    let again = got.iter().filter(|d| d.endpoint_id == stormy.id).count();
    assert_eq!((firsts, again), (5, 5), "half the slots each");
    assert!(got
        .iter()
        .filter(|d| d.endpoint_id == stormy.id)
        .all(|d| d.attempts == 1));
    // The other five first attempts next, beside five more retries.
    let got = claim(&store, T0 + 10, 10, &none, 100).await;
    assert_eq!(
        got.iter().filter(|d| d.endpoint_id == healthy.id).count(),
        5
    );
    // No first attempt left: retries take all the slots.
    let got = claim(&store, T0 + 10, 10, &none, 100).await;
    assert_eq!(
        got.iter().filter(|d| d.endpoint_id == stormy.id).count(),
        10
    );
}

/// `n` messages of `app` of type `event_type`, created 1 ms apart from
/// `from` (so due in this order).
async fn typed_in_order(
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
async fn deliver_all(store: &Arc<dyn Store>, got: &[ClaimedDelivery], now: Millis) {
    let done: Vec<_> = got
        .iter()
        .map(|d| completion(d, NextState::Delivered, now))
        .collect();
    store.complete(&done).await.expect("complete");
}

/// Issue 13, item 5: a full endpoint's overdue backlog is set aside by the
/// claims that pass it (parked), while a healthy endpoint's rows behind it
/// are claimed; it still counts as due; once the endpoint has room it
/// comes back oldest first, each row exactly once.
async fn a_full_endpoints_backlog_waits_aside_and_comes_back_oldest_first(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let full = endpoint(&store, &a.id, Some(vec!["f"]), false).await;
    let ok = endpoint(&store, &a.id, Some(vec!["o"]), false).await;
    // Due 10 s before T0, then the healthy endpoint's rows behind them.
    let backlog = typed_in_order(&store, &a.id, "f", T0 - 10_000, 300).await;
    let healthy = typed_in_order(&store, &a.id, "o", T0 - 5_000, 20).await;
    let cap = 4;
    let saturated: HashMap<EndpointId, usize> = [(full.id.clone(), cap)].into();
    let mut sent = Vec::new();
    for _ in 0..10 {
        let got = claim(&store, T0, 8, &saturated, cap).await;
        assert!(got.len() <= cap, "{got:?}");
        assert!(got.iter().all(|d| d.endpoint_id == ok.id), "{got:?}");
        sent.extend(got.iter().map(|d| d.msg_id.clone()));
        deliver_all(&store, &got, T0).await;
    }
    let want: Vec<_> = healthy.iter().map(|m| m.id.clone()).collect();
    assert_eq!(sent, want, "the healthy rows behind the backlog, in order");
    let stats = store.queue_stats(T0).await.expect("stats");
    assert_eq!(
        (stats.pending, stats.due, stats.oldest_due_at),
        (300, 300, Some(T0 - 10_000)),
        "the backlog set aside is still pending and due"
    );
    assert_eq!(
        store.next_due_at().await.expect("next due"),
        Some(T0 - 10_000)
    );
    // Room again: `cap` at a time, oldest first, none twice.
    let none = HashMap::new();
    let mut back = Vec::new();
    for _ in 0..100 {
        let got = claim(&store, T0 + 1_000, 100, &none, cap).await;
        if got.is_empty() {
            break;
        }
        assert!(got.len() <= cap, "{got:?}");
        assert!(got.iter().all(|d| d.endpoint_id == full.id), "{got:?}");
        back.extend(got.iter().map(|d| d.msg_id.clone()));
        deliver_all(&store, &got, T0 + 1_000).await;
    }
    let want: Vec<_> = backlog.iter().map(|m| m.id.clone()).collect();
    assert_eq!(back, want, "every row of the backlog once, oldest first");
    let stats = store.queue_stats(T0 + 1_000).await.expect("stats");
    assert_eq!((stats.pending, stats.due), (0, 0));
    assert_eq!(store.next_due_at().await.expect("next due"), None);
}

/// A FIFO endpoint's 12 overdue messages, set aside while its breaker
/// gives it no room, then sent a head at a time in their order, each once.
/// With `met_first`, a claim with room has met them first (and so queued
/// them: it takes the head, the rest wait behind it).
async fn fifo_backlog_set_aside_comes_back_in_order(store: &Arc<dyn Store>, met_first: bool) {
    let a = app(store, None).await;
    let fifo = endpoint_with(store, &a.id, None, EndpointOrdering::Fifo).await;
    let ms = messages_in_order(store, &a.id, 12).await;
    let cap = 4;
    let none = HashMap::new();
    let mut order = Vec::new();
    if met_first {
        let got = claim(store, T0, 10, &none, cap).await;
        assert_eq!(got.len(), 1, "{got:?}");
        order.push(got[0].msg_id.clone());
        deliver_all(store, &got, T0).await;
    }
    let broken: HashMap<EndpointId, usize> = [(fifo.id.clone(), cap)].into();
    for _ in 0..3 {
        assert!(claim(store, T0, 10, &broken, cap).await.is_empty());
    }
    for _ in 0..30 {
        let got = claim(store, T0, 10, &none, cap).await;
        if got.is_empty() {
            break;
        }
        assert_eq!(got.len(), 1, "a FIFO endpoint's head alone: {got:?}");
        assert!(
            claim(store, T0, 10, &none, cap).await.is_empty(),
            "nothing behind a head in flight"
        );
        order.push(got[0].msg_id.clone());
        deliver_all(store, &got, T0).await;
    }
    let want: Vec<_> = ms.iter().map(|m| m.id.clone()).collect();
    assert_eq!(order, want, "the FIFO backlog in its order, once each");
}

/// Issue 13, item 5: a FIFO endpoint's backlog set aside while its breaker
/// gave it no room, and a throttled one's while it had no slot, come back
/// in their order: the FIFO one a head at a time, the throttled one a
/// slot at a time; nothing lost, nothing twice.
async fn fifo_and_throttled_backlogs_set_aside_come_back_in_order(store: Arc<dyn Store>) {
    // Met by a claim first, and never met before the breaker opened (both
    // stores give such rows their queue place as they park them: SQLite
    // once left them parked for good, as `unpark` gives a FIFO endpoint
    // back only its queued head).
    fifo_backlog_set_aside_comes_back_in_order(&store, true).await;
    fifo_backlog_set_aside_comes_back_in_order(&store, false).await;
    let none = HashMap::new();
    let b = app(&store, None).await;
    // 50/s: a slot every 20 ms, five within the 100 ms horizon.
    let slow = endpoint_with(&store, &b.id, Some(50), EndpointOrdering::None).await;
    let ms = messages_in_order(&store, &b.id, 23).await;
    let mut order = Vec::new();
    let mut now = T0;
    for _ in 0..20 {
        // Out of slots: the rest wait aside.
        let got = claim(&store, now, 100, &none, 100).await;
        assert!(got.len() <= 5, "{got:?}");
        assert!(got.iter().all(|d| d.endpoint_id == slow.id));
        assert!(claim(&store, now, 100, &none, 100).await.is_empty());
        order.extend(got.iter().map(|d| d.msg_id.clone()));
        deliver_all(&store, &got, now).await;
        now += 100;
    }
    let want: Vec<_> = ms.iter().map(|m| m.id.clone()).collect();
    assert_eq!(order, want, "the throttled backlog in its order, once each");
}

/// The ids of `got`'s messages.
fn msg_ids(got: &[ClaimedDelivery]) -> Vec<MsgId> {
    got.iter().map(|d| d.msg_id.clone()).collect()
}

/// A message of `app` created 20 s before T0 and scheduled for `due`.
async fn scheduled_early(store: &Arc<dyn Store>, app: &AppId, due: Millis) -> NewMessage {
    let scheduled = NewMessage {
        created_at: T0 - 20_000,
        deliver_at: Some(due),
        ..message(app, "x", None)
    };
    store
        .insert_messages(std::slice::from_ref(&scheduled))
        .await
        .expect("insert");
    scheduled
}

/// Review of the release binary, item 10: a scheduled message (`deliverAt`)
/// takes its queue place when a claim first meets it, by its creation; one
/// created before the FIFO head in flight replaced that head and went out
/// beside it, on both stores. Now it waits, neither taken nor set aside,
/// while the head is in flight (also when the endpoint is full, an open
/// breaker, and its rows are parked), then takes its place in order: it
/// goes first, before the rows created after it.
async fn a_fifo_head_in_flight_holds_a_scheduled_message_that_falls_due(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let ep = endpoint_with(&store, &a.id, None, EndpointOrdering::Fifo).await;
    let scheduled = scheduled_early(&store, &a.id, T0 + 5_000).await;
    let ms = messages_in_order(&store, &a.id, 3).await;
    let none = HashMap::new();
    let first = claim(&store, T0, 100, &none, 100).await;
    assert_eq!(msg_ids(&first), vec![ms[0].id.clone()], "not due yet");
    // Due, while the head is in flight (its lease runs to T0 + 60 s).
    let beside = claim(&store, T0 + 5_000, 100, &none, 100).await;
    assert!(
        beside.is_empty(),
        "sent beside the head in flight: {beside:?}"
    );
    // Overdue while the endpoint has no room (its rows are parked), then
    // room again with the head still out: still nothing.
    let full: HashMap<EndpointId, usize> = [(ep.id.clone(), 100)].into();
    assert!(claim(&store, T0 + 7_000, 100, &full, 100).await.is_empty());
    let beside = claim(&store, T0 + 7_000, 100, &none, 100).await;
    assert!(
        beside.is_empty(),
        "sent beside the head in flight: {beside:?}"
    );
    deliver_all(&store, &first, T0 + 8_000).await;
    let mut order = Vec::new();
    for step in 0..3 {
        let now = T0 + 8_000 + step;
        let got = claim(&store, now, 100, &none, 100).await;
        assert_eq!(got.len(), 1, "one at a time: {got:?}");
        let behind = claim(&store, now, 100, &none, 100).await;
        assert!(behind.is_empty(), "two in flight: {behind:?}");
        order.extend(msg_ids(&got));
        deliver_all(&store, &got, now).await;
    }
    assert_eq!(
        order,
        vec![scheduled.id.clone(), ms[1].id.clone(), ms[2].id.clone()],
        "the scheduled message in its place (created first), then the rest"
    );
    assert!(claim(&store, T0 + 9_000, 100, &none, 100).await.is_empty());
}

/// Switches `ep` of `app` to FIFO at `now`.
async fn switch_to_fifo(store: &Arc<dyn Store>, app: &AppId, ep: &EndpointId, now: Millis) {
    let changes = EndpointChanges {
        ordering: Some(EndpointOrdering::Fifo),
        ..EndpointChanges::default()
    };
    assert!(store
        .update_endpoint(app, ep, &changes, now)
        .await
        .expect("update"));
}

/// Claims a FIFO endpoint's deliveries one at a time from `now` on,
/// delivering each, until a claim finds none; their messages in order.
async fn drain_fifo(store: &Arc<dyn Store>, now: Millis) -> Vec<MsgId> {
    let none = HashMap::new();
    let mut order = Vec::new();
    for step in 0..20 {
        let at = now + step;
        let got = claim(store, at, 100, &none, 100).await;
        if got.is_empty() {
            break;
        }
        assert_eq!(got.len(), 1, "one at a time: {got:?}");
        let behind = claim(store, at, 100, &none, 100).await;
        assert!(behind.is_empty(), "two in flight: {behind:?}");
        order.extend(msg_ids(&got));
        deliver_all(store, &got, at).await;
    }
    order
}

/// Review of the release binary, item 12: switching an endpoint to FIFO
/// queued every live delivery by creation, a scheduled one not due for an
/// hour too, which so became the head and held the whole queue until it
/// fell due. Now only due ones take their places then (the scheduled one
/// takes its own once due); and those in flight at the switch go first,
/// so the pending ones wait for them (one request at a time from the
/// switch on), not only for the first of them.
async fn switching_to_fifo_queues_what_is_due_behind_what_is_in_flight(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let ep = endpoint(&store, &a.id, None, false).await;
    let scheduled = scheduled_early(&store, &a.id, T0 + 3_600_000).await;
    let ms = messages_in_order(&store, &a.id, 3).await;
    switch_to_fifo(&store, &a.id, &ep.id, T0).await;
    assert_eq!(
        drain_fifo(&store, T0).await,
        msg_ids_of(&ms),
        "the due ones at once, in order, not held by the scheduled one"
    );
    assert_eq!(
        drain_fifo(&store, T0 + 3_600_000).await,
        vec![scheduled.id.clone()],
        "the scheduled one when due"
    );

    // Two in flight at the switch, the older of them failed since and due
    // for its retry: nothing goes until the other is over.
    let b = app(&store, None).await;
    let ep = endpoint(&store, &b.id, None, false).await;
    let ms = messages_in_order(&store, &b.id, 4).await;
    let none = HashMap::new();
    let out = claim(&store, T0, 2, &none, 100).await;
    assert_eq!(msg_ids(&out), msg_ids_of(&ms[..2]));
    let retry = completion(&out[0], NextState::Retry { at: T0 }, T0);
    store.complete(&[retry]).await.expect("complete");
    switch_to_fifo(&store, &b.id, &ep.id, T0).await;
    let beside = claim(&store, T0, 100, &none, 100).await;
    assert!(beside.is_empty(), "sent beside one in flight: {beside:?}");
    deliver_all(&store, &out[1..], T0 + 1).await;
    assert_eq!(
        drain_fifo(&store, T0 + 2).await,
        vec![ms[0].id.clone(), ms[2].id.clone(), ms[3].id.clone()]
    );
}

/// The ids of `ms`.
fn msg_ids_of(ms: &[NewMessage]) -> Vec<MsgId> {
    ms.iter().map(|m| m.id.clone()).collect()
}

/// Review of the release binary, item 11: a FIFO endpoint's order is the
/// order in which its messages are stored (their batches commit), not
/// their `created_at`, which the API takes before: of two API processes'
/// messages, the one made first may be stored second, after a claim took
/// the other. It used to take its place by `created_at`, before that one,
/// and went ahead of its retry. Now it comes after it.
async fn a_fifo_endpoints_order_is_the_order_its_messages_are_stored_in(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    endpoint_with(&store, &a.id, None, EndpointOrdering::Fifo).await;
    let made_first = NewMessage {
        created_at: T0 - 10,
        ..message(&a.id, "x", None)
    };
    let stored_first = NewMessage {
        created_at: T0 - 5,
        ..message(&a.id, "x", None)
    };
    store
        .insert_messages(std::slice::from_ref(&stored_first))
        .await
        .expect("insert");
    let none = HashMap::new();
    let got = claim(&store, T0, 100, &none, 100).await;
    assert_eq!(msg_ids(&got), vec![stored_first.id.clone()]);
    let retry = completion(&got[0], NextState::Retry { at: T0 + 1_000 }, T0);
    store.complete(&[retry]).await.expect("complete");
    store
        .insert_messages(std::slice::from_ref(&made_first))
        .await
        .expect("insert");
    assert!(
        claim(&store, T0 + 500, 100, &none, 100).await.is_empty(),
        "behind the first one stored, waiting for its retry"
    );
    assert_eq!(
        drain_fifo(&store, T0 + 1_000).await,
        vec![stored_first.id.clone(), made_first.id.clone()]
    );
}

/// Item 11 with batches really concurrent: another process's batch holds
/// the FIFO endpoint's row (here the test's transaction, which has moved
/// its `fifo_last` on, as a batch does); a batch made meanwhile waits for
/// it, its statement's snapshot older than that commit. Its place must
/// come after the place the other one took: read from the row as locked
/// (the newest version), not from its snapshot.
#[tokio::test]
async fn postgres_a_batch_waiting_for_a_fifo_endpoint_queues_after_the_one_it_waited_for() {
    use sqlx::Connection;
    let Some(f) = crate::helpers::postgres::postgres(
        "store_conformance::postgres_a_batch_waiting_for_a_fifo_endpoint_queues_after_the_one_it_waited_for",
    )
    .await
    else {
        return;
    };
    let (url, schema) = (f.url.clone(), f.schema.clone());
    f.run_postgres(|pg| async move {
        let store: Arc<dyn Store> = pg;
        let a = app(&store, None).await;
        let ep = endpoint_with(&store, &a.id, None, EndpointOrdering::Fifo).await;
        let (mut monitor, _) = pg_connection(&url, &schema).await;
        let (mut other, other_pid) = pg_connection(&url, &schema).await;
        let mut held = other.begin().await.expect("begin");
        let taken = T0 + 1_000;
        sqlx::query("UPDATE endpoints SET fifo_last = $2 WHERE id = $1")
            .bind(ep.id.as_str())
            .bind(taken)
            .execute(&mut *held)
            .await
            .expect("the other batch's place");
        let made = NewMessage {
            created_at: T0 - 10,
            ..message(&a.id, "x", None)
        };
        let inserting = {
            let (store, made) = (store.clone(), made.clone());
            tokio::spawn(async move { store.insert_messages(&[made]).await })
        };
        let deadline = tokio::time::Instant::now() + crate::helpers::PATIENCE;
        while blocked_by(&mut monitor, other_pid).await.is_empty() {
            assert!(!inserting.is_finished(), "the batch never waited");
            assert!(tokio::time::Instant::now() < deadline, "nothing waited");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        held.commit().await.expect("commit");
        inserting.await.expect("task").expect("insert");
        let place: Option<i64> =
            sqlx::query_scalar("SELECT queued_at FROM deliveries WHERE msg_id = $1")
                .bind(made.id.as_str())
                .fetch_one(&mut monitor)
                .await
                .expect("place");
        assert_eq!(place, Some(taken + 1), "after the batch it waited for");
    })
    .await;
}

/// Two processes' claims racing on one FIFO endpoint whose new deliveries
/// have no queue place yet. A claim reads a snapshot, then locks the FIFO
/// endpoints' rows; one whose snapshot predates another claim's commit but
/// whose lock comes after it saw the head still unclaimed, and took the
/// delivery behind it (found in CI: message 1 sent while message 0 was
/// waiting for its retry). Thousands of other FIFO endpoints, locked by
/// every claim before this one, widen that window from microseconds to
/// milliseconds, so staggered claims meet it within a few rounds. A claim
/// locks only FIFO endpoints with work in reach, so each of them has a
/// request in flight (its lease far off) and a delivery set aside behind
/// it: noted in `parked_endpoints`, locked by every claim, taken by none.
#[tokio::test]
async fn postgres_racing_claims_never_take_two_of_a_fifo_endpoint() {
    use sqlx::Connection;
    let Some(f) = crate::helpers::postgres::postgres(
        "store_conformance::postgres_racing_claims_never_take_two_of_a_fifo_endpoint",
    )
    .await
    else {
        return;
    };
    let (url, schema) = (f.url.clone(), f.schema.clone());
    f.run_postgres(|first| async move {
        let store: Arc<dyn Store> = first;
        let second = Arc::new(
            herald::store::postgres::PostgresStore::open(&url, &schema)
                .await
                .expect("open the second store"),
        );
        let other: Arc<dyn Store> = second.clone();
        // The other FIFO endpoints, of another application (so the
        // messages below do not go to them), made before the one raced
        // for, so that claims lock them first.
        let elsewhere = app(&store, None).await;
        let model = endpoint_with(&store, &elsewhere.id, None, EndpointOrdering::Fifo).await;
        let (mut conn, _) = pg_connection(&url, &schema).await;
        sqlx::query(
            "INSERT INTO endpoints SELECT (jsonb_populate_record(NULL::endpoints, \
               to_jsonb(e) || jsonb_build_object('id', e.id || '_' || g, 'uid', NULL))).* \
             FROM endpoints e, generate_series(1, 5000) g WHERE e.id = $1",
        )
        .bind(model.id.as_str())
        .execute(&mut conn)
        .await
        .expect("other endpoints");
        sqlx::query(
            "INSERT INTO messages (id, app_id, event_type, payload, created_at) \
             VALUES ('msg_filler_head', $1, 'x', '{}', 1), ('msg_filler_next', $1, 'x', '{}', 2)",
        )
        .bind(elsewhere.id.as_str())
        .execute(&mut conn)
        .await
        .expect("their messages");
        sqlx::query(
            "INSERT INTO deliveries (id, msg_id, endpoint_id, app_id, state, next_attempt_at, \
                                     lease_token, queued_at, parked, cycle_started_at, \
                                     created_at, updated_at) \
             SELECT 'dlv_head_' || e.id, 'msg_filler_head', e.id, e.app_id, 1, $2, 'filler', \
                    1, FALSE, 1, 1, 1 FROM endpoints e WHERE e.app_id = $1 \
             UNION ALL \
             SELECT 'dlv_next_' || e.id, 'msg_filler_next', e.id, e.app_id, 0, 2, NULL, \
                    2, TRUE, 2, 2, 2 FROM endpoints e WHERE e.app_id = $1",
        )
        .bind(elsewhere.id.as_str())
        .bind(i64::MAX / 2)
        .execute(&mut conn)
        .await
        .expect("their deliveries");
        sqlx::query(
            "INSERT INTO parked_endpoints (endpoint_id) SELECT id FROM endpoints WHERE app_id = $1",
        )
        .bind(elsewhere.id.as_str())
        .execute(&mut conn)
        .await
        .expect("noted as having parked rows");
        conn.close().await.expect("close");
        let a = app(&store, None).await;
        endpoint_with(&store, &a.id, None, EndpointOrdering::Fifo).await;
        let none = HashMap::new();
        let mut overlaps = Vec::new();
        for round in 0..40i64 {
            let ms: Vec<_> = (0..3)
                .map(|i| NewMessage {
                    created_at: T0 + round * 10 + i,
                    ..message(&a.id, "x", None)
                })
                .collect();
            let now = T0 + 1_000_000 + round * 10;
            let stagger = Duration::from_millis(u64::try_from(round % 20).unwrap_or(0) * 3);
            // The head first; the two behind it come once the first claim
            // has read its snapshot, before the second claim reads its.
            store.insert_messages(&ms[..1]).await.expect("insert");
            let (s1, s2, n1, n2) = (store.clone(), other.clone(), none.clone(), none.clone());
            let one = tokio::spawn(async move { claim(&s1, now, 10, &n1, 10).await });
            tokio::time::sleep(Duration::from_millis(2)).await;
            store.insert_messages(&ms[1..]).await.expect("insert");
            let two = tokio::spawn(async move {
                tokio::time::sleep(stagger).await;
                claim(&s2, now, 10, &n2, 10).await
            });
            let mut got = one.await.expect("claim one");
            got.extend(two.await.expect("claim two"));
            if got.len() > 1 {
                overlaps.push((
                    round,
                    got.iter().map(|d| d.msg_id.clone()).collect::<Vec<_>>(),
                ));
            }
            // Deliver the round's three, one at a time, in order.
            let mut open = got;
            for _ in 0..4 {
                for d in open.drain(..) {
                    store
                        .complete(&[completion(&d, NextState::Delivered, now)])
                        .await
                        .expect("complete");
                }
                open = claim(&store, now, 10, &none, 10).await;
            }
            assert!(open.is_empty(), "round {round}: all delivered");
        }
        assert!(overlaps.is_empty(), "two in flight at once: {overlaps:?}");
        second.close().await;
    })
    .await;
}

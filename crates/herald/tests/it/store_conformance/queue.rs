//! The hot path: ingest fan-out, claims, leases, completions, and backlogs set aside.

use super::*;

crate::on_both_stores!(store:
    insert_fans_out_to_subscribed_enabled_endpoints,
    duplicate_event_ids_are_refused_within_and_across_batches,
    claim_leases_and_expired_leases_come_back,
    claim_respects_the_limit_and_the_endpoint_cap,
    claim_gives_unlisted_endpoints_their_own_cap,
    claim_and_next_due_at_skip_disabled_endpoints,
    expired_leases_of_a_disabled_endpoint_are_held_not_left_in_the_way,
    ingest_claims_new_deliveries_within_the_limits,
    completion_moves_deliveries_and_logs_attempts,
    a_stale_lease_token_cannot_move_a_reclaimed_delivery,
    completion_stores_any_text_a_receiver_can_send,
    completion_tells_which_completions_moved_their_delivery,
    a_full_endpoints_backlog_waits_aside_and_comes_back_oldest_first,
);

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
    let m = sent(&store, &a.id, "x", None).await;
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

/// A process died holding deliveries of an endpoint that was disabled
/// since: when their leases end, a claim gives them up and holds them
/// (pending, with the endpoint's other held ones) rather than leave them
/// in the due order, where enough of them filled every claim's window and
/// nothing behind them (another endpoint's deliveries) was ever claimed.
async fn expired_leases_of_a_disabled_endpoint_are_held_not_left_in_the_way(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let off = endpoint(&store, &a.id, None, false).await;
    // More than any claim's window (four times its limit, at least 64).
    let stuck = claim_n(&store, &a.id, 300, T0).await;
    assert_eq!(stuck.len(), 300);
    assert!(store
        .disable_endpoint(&off.id, "r", false, None, T0 + 1)
        .await
        .expect("disable"));
    let on = endpoint(&store, &a.id, None, false).await;
    // Due after the leases end (60 s): behind them in the due order.
    let later = NewMessage::plain(&a.id, "x", "{}".into(), T0 + 61_000);
    store
        .insert_messages(std::slice::from_ref(&later))
        .await
        .expect("insert");
    // Each claim sets aside at most its window of them: a few claims of
    // one reach the other endpoint's delivery, and hold all of them.
    let mut got = Vec::new();
    for _ in 0..10 {
        got.extend(claim(&store, T0 + 120_000, 1, &HashMap::new(), 10).await);
    }
    assert_eq!(got.len(), 1, "the enabled endpoint's delivery is claimed");
    assert_eq!(got[0].endpoint_id, on.id);
    let counts = store
        .endpoint_delivery_counts(&off.id)
        .await
        .expect("counts");
    assert_eq!(
        (counts.pending, counts.delivering),
        (300, 0),
        "given up and held: {counts:?}"
    );
    assert_eq!(store.queue_stats(T0).await.expect("stats").held, 300);
    // Enabling brings them back, each once.
    store
        .enable_endpoint(&a.id, &off.id, T0 + 120_000, T0)
        .await
        .expect("enable");
    let back = claim(&store, T0 + 120_000, 1000, &HashMap::new(), 1000).await;
    assert_eq!(back.len(), 300, "all back once enabled");
    assert!(back.iter().all(|d| d.endpoint_id == off.id));
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
    let (a, e, got) = claimed_at_t0(&store, 3).await;
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
    let m = sent(&store, &a.id, "x", None).await;
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
    let d = first_delivery(&store, &a.id, &m.id).await;
    assert_eq!(d.state, DeliveryState::Delivering);
    store
        .complete(&[completion(&second, NextState::Delivered, T0 + 60_002)])
        .await
        .expect("complete");
    let d = first_delivery(&store, &a.id, &m.id).await;
    assert_eq!(d.state, DeliveryState::Delivered);
    let log = store
        .list_attempts_of_message(&a.id, &m.id, &page(10, None, true))
        .await
        .expect("list");
    assert_eq!(log.items.len(), 2, "both attempts happened and are logged");
}

async fn completion_stores_any_text_a_receiver_can_send(store: Arc<dyn Store>) {
    let (a, e, got) = claimed_at_t0(&store, 2).await;
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
    let logged = logged_attempt(&store, &a.id, &odd.attempt.id).await;
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
    let status = status_of(&store, &e.id).await;
    assert_eq!(status.last_error.as_deref(), Some("reset\u{FFFD}by peer"));
    let other = logged_attempt(&store, &a.id, &plain.attempt.id).await;
    assert_eq!(other, plain.attempt, "the rest of the batch as it was");
}

async fn completion_tells_which_completions_moved_their_delivery(store: Arc<dyn Store>) {
    let (a, e, got) = claimed_at_t0(&store, 2).await;
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

/// The first delivery of message `m` of `app`.
async fn first_delivery(store: &Arc<dyn Store>, app: &AppId, m: &MsgId) -> Delivery {
    store
        .list_deliveries_of_message(app, m)
        .await
        .expect("list")
        .remove(0)
}

/// The attempt `id` of `app` as logged (the test fails if it is not).
async fn logged_attempt(store: &Arc<dyn Store>, app: &AppId, id: &AttemptId) -> AttemptRecord {
    store
        .get_attempt(app, id)
        .await
        .expect("get")
        .expect("logged")
}

//! What retention prunes, and the age cap on held deliveries.

use super::*;

crate::on_both_stores!(store:
    prune_removes_old_finished_history_only,
    retention_expires_held_deliveries_past_the_age_cap,
);

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

//! Dead letters, replays and resends.

use super::*;

crate::on_both_stores!(store:
    dead_deliveries_are_never_claimed_and_replay_starts_a_new_cycle,
    resend_reuses_the_delivery_or_creates_one,
    resend_refuses_a_delivery_in_flight,
    dead_letters_filter_across_apps_and_replay_in_bulk,
);

async fn dead_deliveries_are_never_claimed_and_replay_starts_a_new_cycle(store: Arc<dyn Store>) {
    let (a, e, got) = claimed_at_t0(&store, 3).await;
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
    let m = sent(&store, &a.id, "x", None).await;
    assert!(deliveries_of(&store, &a.id, &m.id).await.is_empty());
    assert_eq!(
        resent(&store, &a.id, &m.id, &e.id, T0 + 5).await,
        ResendOutcome::Queued
    );
    let ds = deliveries_of(&store, &a.id, &m.id).await;
    assert_eq!(ds.len(), 1);
    assert_eq!(
        resent(&store, &a.id, &m.id, &e.id, T0 + 6).await,
        ResendOutcome::Queued
    );
    let again = deliveries_of(&store, &a.id, &m.id).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].id, ds[0].id, "reused, so the key is stable");
    assert_eq!(
        resent(&store, &a.id, &MsgId::generate(), &e.id, T0).await,
        ResendOutcome::NoSuchMessage
    );
    assert_eq!(
        resent(&store, &a.id, &m.id, &EndpointId::generate(), T0).await,
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
        resent(&store, &a.id, &m, &e.id, T0 + 1).await,
        ResendOutcome::InFlight
    );
    let none = HashMap::new();
    assert!(
        claim(&store, T0 + 2, 100, &none, 100).await.is_empty(),
        "nothing queued again beside the attempt in flight"
    );
    let done = completion(&got[0], NextState::Delivered, T0 + 3);
    let moved = store.complete(&[done]).await.expect("complete");
    let ds = deliveries_of(&store, &a.id, &m).await;
    assert_eq!(ds[0].state, DeliveryState::Delivered, "{moved:?}");
    assert_eq!(
        resent(&store, &a.id, &m, &e.id, T0 + 4).await,
        ResendOutcome::Queued
    );
    let again = claim(&store, T0 + 5, 100, &none, 100).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].id, got[0].id, "the same delivery, so the same key");
    assert_eq!(again[0].attempts, 1, "X-Attempt 2: attempts count on");
    assert!(again[0].manual);
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

/// A resend of message `m` of `app` to endpoint `ep` at `now`: its outcome.
async fn resent(
    store: &Arc<dyn Store>,
    app: &AppId,
    m: &MsgId,
    ep: &EndpointId,
    now: Millis,
) -> ResendOutcome {
    store.resend(app, m, ep, now).await.expect("resend")
}

/// The deliveries of message `m` of `app`.
async fn deliveries_of(store: &Arc<dyn Store>, app: &AppId, m: &MsgId) -> Vec<Delivery> {
    store
        .list_deliveries_of_message(app, m)
        .await
        .expect("list")
}

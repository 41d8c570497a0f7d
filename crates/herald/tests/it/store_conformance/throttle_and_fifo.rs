//! The claim rules: throttle slots, FIFO heads and order, the retry share.

use super::lock_order::{blocked_by, pg_connection};
use super::*;

crate::on_both_stores!(postgres_store:
    a_batch_waiting_for_a_fifo_endpoint_queues_after_the_one_it_waited_for,
    racing_claims_never_take_two_of_a_fifo_endpoint,
);

crate::on_both_stores!(store:
    claim_reserves_throttle_slots_within_the_horizon,
    a_changed_throttle_rate_moves_the_next_slot,
    claim_takes_only_a_fifo_endpoints_head_one_at_a_time,
    throttled_and_fifo_endpoints_are_never_handed_off_at_ingest,
    first_attempts_get_their_share_of_a_claim_during_a_retry_storm,
    fifo_and_throttled_backlogs_set_aside_come_back_in_order,
    a_fifo_head_in_flight_holds_a_scheduled_message_that_falls_due,
    switching_to_fifo_queues_what_is_due_behind_what_is_in_flight,
    a_fifo_endpoints_order_is_the_order_its_messages_are_stored_in,
);

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
async fn a_batch_waiting_for_a_fifo_endpoint_queues_after_the_one_it_waited_for(
    OnPostgres { store, url, schema }: OnPostgres,
) {
    use sqlx::Connection;

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
async fn racing_claims_never_take_two_of_a_fifo_endpoint(
    OnPostgres { store, url, schema }: OnPostgres,
) {
    use sqlx::Connection;

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
}

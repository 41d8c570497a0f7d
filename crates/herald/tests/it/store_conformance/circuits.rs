//! The stored circuit breaker: stepped by completions, probed once, its age cap.

use super::*;

crate::on_both_stores!(store:
    circuit_breakers_are_stepped_by_completions_and_stored,
    only_one_of_two_concurrent_probers_wins,
    retention_expires_deliveries_held_by_an_open_breaker,
    deliveries_held_by_an_open_breaker_are_not_due,
);

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

/// Claims four deliveries of `app` at `T0` and completes them all as
/// failed (500) under `rule`: its endpoint's breaker opens.
async fn fail_four(store: &Arc<dyn Store>, app: &AppId, rule: &BreakerRule) {
    let got = claim_n(store, app, 4, T0).await;
    let failed: Vec<_> = got.iter().map(|d| outcome(d, false, 500, T0, 5)).collect();
    store
        .complete_with_circuits(&failed, rule)
        .await
        .expect("complete");
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
    let open = circuit_of(&store, &e.id).await;
    assert_eq!(open.state, CircuitState::Open);
    assert_eq!(open.until, Some(now + 30_000));
    assert_eq!(open.cooldown_ms, 30_000);
    assert_eq!((open.window.attempts, open.window.failures), (4, 3));
    assert_eq!(
        circuit_of(&store, &other.id).await.state,
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
    let closed = circuit_of(&store, &e.id).await;
    assert_eq!(closed.state, CircuitState::Closed);
    assert_eq!((closed.cooldown_ms, closed.probe_by), (0, None));
    assert!(store.broken_circuits().await.expect("read").is_empty());
}

/// Of two callers trying to win the same probe at once, one does.
async fn only_one_of_two_concurrent_probers_wins(store: Arc<dyn Store>) {
    let rule = breaker_rule();
    let a = app(&store, None).await;
    let e = endpoint(&store, &a.id, None, false).await;
    fail_four(&store, &a.id, &rule).await;
    let open = circuit_of(&store, &e.id).await;
    assert_eq!(open.state, CircuitState::Open);
    let at = open.until.expect("open until");
    let timeout = Duration::from_secs(60);
    for round in 0..5 {
        let seen = circuit_of(&store, &e.id).await;
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
        let stored = circuit_of(&store, &e.id).await;
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
    fail_four(&store, &a.id, &rule).await;
    assert_eq!(circuit_of(&store, &e.id).await.state, CircuitState::Open);
    let live = sent(&store, &b.id, "x", None).await;
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

/// Retries held by an open breaker are not the due backlog, nor its
/// oldest (`herald_due_backlog`, `herald_oldest_due_age_seconds`), as a
/// disabled endpoint's are not: the claims walk past and park them, and
/// they were counted as due, so one customer's endpoint being down fired
/// the "backlog old" alert meant for too few workers.
async fn deliveries_held_by_an_open_breaker_are_not_due(store: Arc<dyn Store>) {
    // Open past the retries' due time: no probe is claimed.
    let rule = BreakerRule {
        cooldown: Duration::from_secs(600),
        ..breaker_rule()
    };
    let a = app(&store, None).await;
    let e = endpoint(&store, &a.id, None, false).await;
    fail_four(&store, &a.id, &rule).await;
    assert_eq!(circuit_of(&store, &e.id).await.state, CircuitState::Open);
    // The retries are due a minute on; claims then meet them twice, a
    // second apart, and park them: the dispatcher's breakers give the
    // endpoint no room (its in-flight count at the cap).
    let due_at = T0 + 60_000;
    let no_room = HashMap::from([(e.id.clone(), 10)]);
    for at in [due_at + 1_500, due_at + 3_000] {
        assert!(claim(&store, at, 10, &no_room, 10).await.is_empty());
    }
    let stats = store.queue_stats(due_at + 4_000).await.expect("stats");
    assert_eq!(
        (stats.pending, stats.due, stats.oldest_due_at),
        (4, 0, None),
        "{stats:?}"
    );
    // Another endpoint's due delivery is the backlog, and its oldest.
    let b = app(&store, None).await;
    endpoint(&store, &b.id, None, false).await;
    sent(&store, &b.id, "x", None).await;
    let stats = store.queue_stats(due_at + 4_000).await.expect("stats");
    assert_eq!(
        (stats.due, stats.oldest_due_at.is_some()),
        (1, true),
        "{stats:?}"
    );
}

//! Failing streaks, stats buckets, disable and enable, queue stats and the kept counts.

use super::*;

crate::on_both_stores!(store:
    streaks_count_failures_in_a_row_and_reset_on_success,
    stats_buckets_add_up_per_endpoint_and_prune_by_age,
    disabling_is_guarded_by_the_streak_and_enabling_expires_old_held_deliveries,
    enabling_an_enabled_endpoint_changes_nothing,
    only_auto_disabled_endpoints_collect_new_messages,
    queue_stats_count_live_dead_due_and_disabled,
    queue_stats_count_held_deliveries_apart_from_due_ones,
    delivery_counts_stay_exact_through_every_state_change,
    overview_lists_failing_endpoints_first,
);

async fn streaks_count_failures_in_a_row_and_reset_on_success(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let e = endpoint(&store, &a.id, None, false).await;
    let status = status_of(&store, &e.id).await;
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
    let status = status_of(&store, &e.id).await;
    assert_eq!(status.last_error.as_deref(), Some("HTTP 503"));
    assert_eq!(status.last_error_at, Some(T0 + 10));

    // The next batch goes on counting from the same start.
    let (_, done) = one_completed(&store, &a.id, false, 500, T0 + 100).await;
    let streaks = done.streaks;
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
    let status = status_of(&store, &e.id).await;
    assert_eq!(status.last_success_at, Some(T0 + 210));

    // A success last: no streak, and nothing reported.
    let (_, done) = one_completed(&store, &a.id, true, 204, T0 + 300).await;
    let streaks = done.streaks;
    assert!(streaks.is_empty());
    let status = status_of(&store, &e.id).await;
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
    one_completed(&store, &a.id, false, 500, T0).await;
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
    let status = status_of(&store, &e.id).await;
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
    let status = status_of(&store, &e.id).await;
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

/// The age cap at enable is for deliveries held while the endpoint was
/// off: enabling one that is enabled kills nothing and resets nothing.
async fn enabling_an_enabled_endpoint_changes_nothing(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let e = endpoint(&store, &a.id, None, false).await;
    let (got, _) = one_completed(&store, &a.id, false, 500, T0).await;
    // Its cycle began at T0, long before the cap; the retry is due.
    let report = store
        .enable_endpoint(&a.id, &e.id, T0 + 100_000, T0 + 50_000)
        .await
        .expect("enable")
        .expect("exists");
    assert_eq!(report, EnableReport::default());
    let status = status_of(&store, &e.id).await;
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
    let m = sent(&store, &a.id, "x", None).await;
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

/// One new message of `app`, its delivery claimed and completed at `now`
/// (succeeded or not, answered `status`): what was claimed, and what the
/// completion reports.
async fn one_completed(
    store: &Arc<dyn Store>,
    app: &AppId,
    ok: bool,
    status: u16,
    now: Millis,
) -> (Vec<ClaimedDelivery>, Completed) {
    let got = claim_n(store, app, 1, now).await;
    let done = store
        .complete(&[outcome(&got[0], ok, status, now, 5)])
        .await
        .expect("complete");
    (got, done)
}

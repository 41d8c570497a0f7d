//! PostgreSQL: transactions that lock several tables take them in one order.

use super::*;

crate::on_both_stores!(postgres_store:
    deleting_an_app_and_completing_lock_in_one_order,
    deleting_an_app_and_resending_lock_in_one_order,
    deleting_an_app_and_pruning_lock_in_one_order,
);

/// PostgreSQL lock order: a connection of the test's own on `schema`,
/// and its backend's pid.
pub(super) async fn pg_connection(url: &str, schema: &str) -> (sqlx::PgConnection, i32) {
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
pub(super) async fn blocked_by(monitor: &mut sqlx::PgConnection, pid: i32) -> Vec<i32> {
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
async fn deleting_an_app_and_completing_lock_in_one_order(
    OnPostgres { store, url, schema }: OnPostgres,
) {
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
}

/// Deleting an application while a message of it is resent: the resend
/// must take the endpoint before the message, as the deletion does. Held
/// here: the message (so the deletion waits there, holding the endpoint).
async fn deleting_an_app_and_resending_lock_in_one_order(
    OnPostgres { store, url, schema }: OnPostgres,
) {
    let a = app(&store, None).await;
    let e = endpoint(&store, &a.id, None, false).await;
    let m = sent(&store, &a.id, "x", None).await;
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
}

/// Deleting an application while retention prunes an old message of it:
/// retention locks the message, then its deliveries; the deletion must
/// take the messages before the deliveries too. Held here: an older
/// message of the app (so the deletion waits at the messages, before it
/// reaches the one pruned).
async fn deleting_an_app_and_pruning_lock_in_one_order(
    OnPostgres { store, url, schema }: OnPostgres,
) {
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
}

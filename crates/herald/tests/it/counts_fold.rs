//! SQLite's kept delivery counts, folded in memory per transaction and
//! written before COMMIT (`store/sqlite/counts.rs`, migration 0018): a
//! job rolled back inside a group commit takes its share back, and a
//! connection that writes deliveries without the fold fails loudly
//! instead of leaving the counts wrong.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use herald::ids::{AppId, MsgId};
use herald::store::*;

use crate::store_conformance::{app, assert_counts_exact, claim, endpoint, message, sent, T0};

struct Sqlite {
    store: Arc<dyn Store>,
    path: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

async fn sqlite() -> Sqlite {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("counts.db");
    let url = format!("sqlite://{}", path.display());
    let store = herald::store::sqlite::SqliteStore::open(&url)
        .await
        .expect("open sqlite");
    Sqlite {
        store: Arc::new(store),
        path,
        _dir: dir,
    }
}

fn connect(path: &std::path::Path) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(path).expect("open the SQLite file");
    conn.busy_timeout(Duration::from_secs(10))
        .expect("busy timeout");
    conn
}

/// Four writes queue up while another connection holds the write lock, so
/// the writer runs them in at most two transactions, the failing one
/// beside at least one that commits. The failing job inserted deliveries
/// (and so folded +1s) before its second message's delivery aborted; its
/// rollback must take those back, while the others' changes (inserts, a
/// claim's moves) are kept.
#[tokio::test]
async fn a_job_rolled_back_inside_a_group_commit_leaves_the_counts_exact() {
    job_rolled_back_in_a_group_commit(Poisoned::Second).await;
}

/// The same with the failing job first in its transaction, where it runs
/// without a savepoint and the writer rolls the transaction back and
/// begins another for the jobs after it.
#[tokio::test]
async fn a_failing_first_job_of_a_group_commit_leaves_the_others_and_the_counts_exact() {
    job_rolled_back_in_a_group_commit(Poisoned::First).await;
}

/// Where the failing job is queued among the group commit's jobs.
enum Poisoned {
    First,
    Second,
}

async fn job_rolled_back_in_a_group_commit(poisoned: Poisoned) {
    let db = sqlite().await;
    let store = &db.store;
    let a = app(store, None).await;
    let e1 = endpoint(store, &a.id, None, false).await;
    let e2 = endpoint(store, &a.id, None, false).await;
    let eps = vec![e1.id.clone(), e2.id.clone()];
    let first = message(&a.id, "x", None);
    let doomed = message(&a.id, "x", None);
    let poison = message(&a.id, "poison", None);
    let last = message(&a.id, "x", None);
    // A fault to inject: the second delivery of the `poison` message (one
    // per endpoint) breaks a unique index, which aborts its statement, and
    // with it the writer job that inserted it, after the job's first
    // deliveries went in. (An index, not a trigger: the writer runs with
    // the schema's triggers off, see store/sqlite/counts.rs.)
    let outside = connect(&db.path);
    outside
        .execute_batch(&format!(
            "CREATE UNIQUE INDEX poison ON deliveries(msg_id) WHERE msg_id = '{}';",
            poison.id.as_str()
        ))
        .expect("create the fault index");

    let kept: Vec<(AppId, MsgId)> = [&first, &last]
        .iter()
        .map(|m| (m.app_id.clone(), m.id.clone()))
        .collect();

    outside
        .execute_batch("BEGIN IMMEDIATE")
        .expect("take the write lock");
    let no_flight = HashMap::new();
    let (b1, b2, b3) = (
        vec![first.clone()],
        vec![doomed.clone(), poison.clone()],
        vec![last.clone()],
    );
    // The order of the join is the order the jobs reach the writer.
    let (queued_1, queued_2) = match poisoned {
        Poisoned::First => (&b2, &b1),
        Poisoned::Second => (&b1, &b2),
    };
    let all = async {
        tokio::join!(
            store.insert_messages(queued_1),
            store.insert_messages(queued_2),
            store.insert_messages(&b3),
            claim(store, T0, 1, &no_flight, 10),
        )
    };
    tokio::pin!(all);
    // One poll queues every job (each sends to the writer at once); the
    // writer waits on the lock meanwhile.
    assert!(futures::poll!(all.as_mut()).is_pending());
    outside.execute_batch("COMMIT").expect("let the writer go");
    let (ra, rb, r3, claimed) = all.await;
    let (r1, r2) = match poisoned {
        Poisoned::First => (rb, ra),
        Poisoned::Second => (ra, rb),
    };
    r1.expect("the first batch commits");
    r3.expect("the last batch commits");
    let err = r2.expect_err("the poisoned batch fails");
    assert!(err.to_string().contains("UNIQUE"), "{err}");
    assert_eq!(claimed.len(), 1, "the claim moved a delivery: {claimed:?}");
    assert!(
        store
            .list_deliveries_of_message(&a.id, &doomed.id)
            .await
            .expect("deliveries")
            .is_empty(),
        "the failed job's first message was rolled back with it"
    );
    assert_counts_exact(store, &kept, &eps, &[], "after the rolled-back job").await;
    // And nothing stale is carried into the next transaction.
    store
        .insert_messages(&[message(&a.id, "x", None)])
        .await
        .expect("insert");
    let counts = store
        .endpoint_delivery_counts(&e1.id)
        .await
        .expect("counts");
    assert_eq!(
        counts.pending + counts.delivering,
        3,
        "e1: first, last and the new one: {counts:?}"
    );
}

/// Another connection that writes deliveries must fold and flush the
/// counts itself: without the function its statement fails, and the
/// counts are as they were. (With the function registered but outside a
/// counted transaction it fails too, and inside one the counts are exact:
/// `store::sqlite::queue::tests::another_connection_counts_only_in_a_counted_transaction`,
/// since the fold is the store's own.)
#[tokio::test]
async fn a_connection_without_the_fold_cannot_change_deliveries_silently() {
    let db = sqlite().await;
    let store = &db.store;
    let a = app(store, None).await;
    let e = endpoint(store, &a.id, None, false).await;
    let m = sent(store, &a.id, "x", None).await;
    let insert =
        "INSERT INTO deliveries (id, msg_id, endpoint_id, app_id, state, next_attempt_at, \
                  cycle_started_at, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, 3, 0, 0, 0, 0)";
    let args = |n: &str| {
        [
            format!("dlv_outside_{n}"),
            m.id.as_str().to_owned(),
            e.id.as_str().to_owned(),
            a.id.as_str().to_owned(),
        ]
    };

    let bare = connect(&db.path);
    let err = bare
        .execute(insert, args("bare"))
        .expect_err("no function, no write");
    assert!(
        err.to_string().contains("no such function: herald_count"),
        "{err}"
    );

    let msgs = vec![(a.id.clone(), m.id.clone())];
    assert_counts_exact(
        store,
        &msgs,
        std::slice::from_ref(&e.id),
        &[],
        "outside writes",
    )
    .await;
    let counts = store.endpoint_delivery_counts(&e.id).await.expect("counts");
    assert_eq!((counts.pending, counts.dead), (1, 0), "{counts:?}");
}

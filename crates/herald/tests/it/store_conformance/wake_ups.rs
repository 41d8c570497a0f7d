//! PostgreSQL wake-ups: LISTEN/NOTIFY across processes and after a lost connection.

use super::*;
use crate::helpers::PgSchema;

crate::on_both_stores!(postgres:
    wakes_other_processes_on_the_same_schema,
    listener_survives_a_lost_connection,
    wake_channel_fits_long_schema_names,
);

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

/// A new application with one endpoint and one message: one new
/// delivery, which is work.
async fn a_delivery_due(store: &Arc<dyn Store>) {
    let a = app(store, None).await;
    endpoint(store, &a.id, None, false).await;
    store
        .insert_messages(&[message(&a.id, "x", None)])
        .await
        .expect("insert");
}

async fn wakes_other_processes_on_the_same_schema(pg: PgSchema) {
    let own = Arc::new(pg.open().await);
    let store: Arc<dyn Store> = own.clone();
    // Another process on the same schema.
    let other = pg.open().await;
    assert_eq!(other.wake_channel(), format!("herald_wake_{}", pg.schema));
    let wake = Arc::new(tokio::sync::Notify::new());
    other.listen_for_work(wake.clone()).await.expect("listen");

    let a = app(&store, None).await;
    store
        .insert_messages(&[message(&a.id, "x", None)])
        .await
        .expect("insert");
    assert!(!woken_soon(&wake).await, "no delivery, no work: no wake-up");

    let e = endpoint(&store, &a.id, None, false).await;
    let m = sent(&store, &a.id, "x", None).await;
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
    own.close().await;
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

async fn listener_survives_a_lost_connection(pg: PgSchema) {
    let url = pg.url.clone();
    let pg = Arc::new(pg.open().await);
    use sqlx::Connection;
    let channel = pg.wake_channel().to_owned();
    let store: Arc<dyn Store> = pg.clone();
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

    a_delivery_due(&store).await;
    assert!(woken(&wake).await, "notifications arrive again");
    let _ = admin.close().await;
    pg.close().await;
}

async fn wake_channel_fits_long_schema_names(pg: PgSchema) {
    // 63 bytes, the longest schema name PostgreSQL keeps whole.
    let long = PgSchema {
        url: pg.url,
        schema: format!(
            "Herald Test {:016x} {}",
            rand::random::<u64>(),
            "x".repeat(34)
        ),
    };
    assert_eq!(long.schema.len(), 63);
    let pg = Arc::new(long.open().await);
    let channel = pg.wake_channel().to_owned();
    let wake = Arc::new(tokio::sync::Notify::new());
    let listened = pg.listen_for_work(wake.clone()).await;
    let store: Arc<dyn Store> = pg.clone();
    a_delivery_due(&store).await;
    let was_woken = woken(&wake).await;
    pg.close().await;
    long.drop_schema().await;
    listened.expect("listen");
    assert!(channel.starts_with("herald_wake_"), "{channel}");
    assert_eq!(channel.len(), 63, "{channel}");
    assert!(was_woken);
}

//! The transactional outbox: commit delivers, rollback never does.
//!
//! Against the PostgreSQL named by `HERALD_TEST_POSTGRES_URL` (SKIPPED
//! without it), each test in a throw-away schema: the application's side
//! is a plain connection with the default search_path, writing a business
//! table and calling the `send_message` SQL function (or the Rust API) in
//! its own transaction.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use herald::ids::{DeliveryId, EndpointId, MsgId};
use herald::outbox::OutboxError;
use herald::store::postgres::PostgresStore;
use herald::store::*;
use sqlx::{Connection, PgConnection};

use crate::helpers::postgres::postgres;
use crate::store_conformance::{app, claim, endpoint};

/// Which way the application queues its message.
#[derive(Debug, Clone, Copy)]
enum Via {
    Sql,
    Rust,
}

/// One test's world: Herald's store on a fresh schema, an app `acme`
/// with one endpoint subscribed to everything (and two that must not get
/// deliveries), a business table `orders` in the same schema, and the
/// application's own connection.
struct World {
    store: Arc<dyn Store>,
    schema: String,
    app: App,
    endpoint: Endpoint,
    conn: PgConnection,
    url: String,
}

async fn world(pg: &Arc<PostgresStore>, url: &str, schema: &str) -> World {
    let store: Arc<dyn Store> = pg.clone();
    let app = app(&store, Some("acme")).await;
    let endpoint = endpoint(&store, &app.id, None, false).await;
    // Not subscribed, and disabled: no delivery for either.
    self::endpoint(&store, &app.id, Some(vec!["other.event"]), false).await;
    self::endpoint(&store, &app.id, None, true).await;
    let mut conn = PgConnection::connect(url).await.expect("connect");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE \"{schema}\".orders (id TEXT PRIMARY KEY)"
    )))
    .execute(&mut conn)
    .await
    .expect("create the business table");
    World {
        store,
        schema: schema.to_owned(),
        app,
        endpoint,
        conn,
        url: url.to_owned(),
    }
}

impl World {
    async fn orders(&mut self) -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM \"{}\".orders",
            self.schema
        )))
        .fetch_one(&mut self.conn)
        .await
        .expect("count orders")
    }

    /// Rows in one of Herald's tables, whatever the app.
    async fn rows(&mut self, table: &str) -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM \"{}\".{table}",
            self.schema
        )))
        .fetch_one(&mut self.conn)
        .await
        .expect("count rows")
    }
}

/// Inserts an order and queues its message in `tx`; the message id.
async fn order_and_message(
    tx: &mut PgConnection,
    schema: &str,
    via: Via,
    order: &str,
    event_id: Option<&str>,
) -> Result<String, OutboxError> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO \"{schema}\".orders (id) VALUES ($1)"
    )))
    .bind(order)
    .execute(&mut *tx)
    .await?;
    let payload = serde_json::json!({ "orderId": order, "totalCents": 1999 });
    match via {
        Via::Sql => Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT \"{schema}\".send_message('acme', 'order.created', $1::jsonb, $2)"
        )))
        .bind(payload.to_string())
        .bind(event_id)
        .fetch_one(&mut *tx)
        .await?),
        Via::Rust => {
            herald::outbox::send_message(tx, schema, "acme", "order.created", &payload, event_id)
                .await
                .map(MsgId::into_string)
        }
    }
}

async fn woken(wake: &tokio::sync::Notify, within: Duration) -> bool {
    tokio::time::timeout(within, wake.notified()).await.is_ok()
}

/// Runs `test` on a fresh schema, dropped afterwards.
async fn with_world<F, Fut>(name: &str, test: F)
where
    F: FnOnce(Arc<PostgresStore>, World) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let Some(f) = postgres(name).await else {
        return;
    };
    let (url, schema) = (f.url.clone(), f.schema.clone());
    f.run_postgres(|pg| async move {
        let w = world(&pg, &url, &schema).await;
        test(pg, w).await;
    })
    .await;
}

async fn commit_delivers(via: Via, pg: Arc<PostgresStore>, mut w: World) {
    let wake = Arc::new(tokio::sync::Notify::new());
    pg.listen_for_work(wake.clone()).await.expect("listen");
    let before = now_millis();
    let mut tx = w.conn.begin().await.expect("begin");
    let id = order_and_message(&mut tx, &w.schema, via, "ord_1", Some("order-1"))
        .await
        .expect("send_message");
    assert!(
        !woken(&wake, Duration::from_millis(300)).await,
        "nothing until the commit"
    );
    tx.commit().await.expect("commit");
    let after = now_millis();
    assert!(
        woken(&wake, Duration::from_secs(10)).await,
        "the commit wakes the dispatchers"
    );

    let msg_id = MsgId::parse(&id).unwrap_or_else(|| panic!("`{id}` is not a message id"));
    assert_eq!(w.orders().await, 1);
    let m = w
        .store
        .get_message(&w.app.id, "order-1")
        .await
        .expect("get")
        .expect("the message exists");
    assert_eq!(m.id, msg_id);
    assert_eq!(
        (m.event_type.as_str(), m.event_id.as_deref()),
        ("order.created", Some("order-1"))
    );
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&m.payload).expect("JSON payload"),
        serde_json::json!({ "orderId": "ord_1", "totalCents": 1999 })
    );
    assert!(
        (before - 1_000..=after + 1_000).contains(&m.created_at),
        "created_at {} not in {before}..{after}",
        m.created_at
    );

    let ds = w
        .store
        .list_deliveries_of_message(&w.app.id, &msg_id)
        .await
        .expect("deliveries");
    assert_eq!(ds.len(), 1, "subscribed, enabled endpoints only: {ds:?}");
    let d = &ds[0];
    assert!(DeliveryId::parse(d.id.as_str()).is_some(), "{}", d.id);
    assert_eq!(
        (&d.endpoint_id, d.state, d.attempts, d.next_attempt_at),
        (&w.endpoint.id, DeliveryState::Pending, 0, m.created_at)
    );

    let got = claim(&w.store, after + 1_000, 10, &HashMap::new(), 10).await;
    assert_eq!(got.len(), 1);
    let c = &got[0];
    assert_eq!((&c.id, &c.msg_id), (&d.id, &msg_id));
    assert_eq!(
        (c.url.as_str(), c.secret.as_str()),
        (w.endpoint.url.as_str(), w.endpoint.secret.as_str())
    );
    assert_eq!(
        (c.event_type.as_str(), c.payload.as_str()),
        ("order.created", m.payload.as_str())
    );
    assert_eq!(
        (c.attempts, c.cycle_started_at, c.manual),
        (0, m.created_at, false)
    );
}

async fn rollback_leaves_nothing(via: Via, pg: Arc<PostgresStore>, mut w: World) {
    let wake = Arc::new(tokio::sync::Notify::new());
    pg.listen_for_work(wake.clone()).await.expect("listen");
    let mut tx = w.conn.begin().await.expect("begin");
    let id = order_and_message(&mut tx, &w.schema, via, "ord_1", Some("order-1"))
        .await
        .expect("send_message");
    tx.rollback().await.expect("rollback");

    assert_eq!(w.orders().await, 0);
    assert_eq!(
        (w.rows("messages").await, w.rows("deliveries").await),
        (0, 0)
    );
    assert_eq!(
        w.store.get_message(&w.app.id, &id).await.expect("get"),
        None
    );
    assert!(
        claim(&w.store, now_millis() + 60_000, 10, &HashMap::new(), 10)
            .await
            .is_empty()
    );
    assert!(
        !woken(&wake, Duration::from_millis(300)).await,
        "no wake-up for a rolled-back message"
    );
}

#[tokio::test]
async fn sql_function_commit_delivers() {
    with_world("outbox::sql_function_commit_delivers", |pg, w| {
        commit_delivers(Via::Sql, pg, w)
    })
    .await;
}

#[tokio::test]
async fn sql_function_rollback_leaves_nothing() {
    with_world("outbox::sql_function_rollback_leaves_nothing", |pg, w| {
        rollback_leaves_nothing(Via::Sql, pg, w)
    })
    .await;
}

#[tokio::test]
async fn rust_api_commit_delivers() {
    with_world("outbox::rust_api_commit_delivers", |pg, w| {
        commit_delivers(Via::Rust, pg, w)
    })
    .await;
}

#[tokio::test]
async fn rust_api_rollback_leaves_nothing() {
    with_world("outbox::rust_api_rollback_leaves_nothing", |pg, w| {
        rollback_leaves_nothing(Via::Rust, pg, w)
    })
    .await;
}

#[tokio::test]
async fn unknown_apps_and_duplicate_event_ids_are_clear_errors() {
    with_world(
        "outbox::unknown_apps_and_duplicate_event_ids_are_clear_errors",
        |_pg, mut w| async move {
            let schema = w.schema.clone();
            let payload = serde_json::json!({ "a": 1 });

            // Rust: typed errors.
            let mut tx = w.conn.begin().await.expect("begin");
            let err = herald::outbox::send_message(&mut tx, &schema, "nope", "x", &payload, None)
                .await
                .expect_err("unknown app");
            assert!(
                matches!(&err, OutboxError::UnknownApp(app) if app == "nope"),
                "{err:?}"
            );
            assert_eq!(
                err.to_string(),
                "no Herald application with id or uid `nope`"
            );
            tx.rollback().await.expect("rollback");

            // By id as well as by uid.
            let mut tx = w.conn.begin().await.expect("begin");
            herald::outbox::send_message(
                &mut tx,
                &schema,
                w.app.id.as_str(),
                "x",
                &payload,
                Some("evt-1"),
            )
            .await
            .expect("send by app id");
            tx.commit().await.expect("commit");

            // A duplicate, inside a savepoint: the transaction goes on.
            let mut tx = w.conn.begin().await.expect("begin");
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO \"{schema}\".orders (id) VALUES ('ord_2')"
            )))
            .execute(&mut *tx)
            .await
            .expect("insert order");
            let mut savepoint = tx.begin().await.expect("savepoint");
            let err = herald::outbox::send_message(
                &mut savepoint,
                &schema,
                "acme",
                "x",
                &payload,
                Some("evt-1"),
            )
            .await
            .expect_err("duplicate");
            assert!(
                matches!(&err, OutboxError::DuplicateEventId(id) if id == "evt-1"),
                "{err:?}"
            );
            assert_eq!(
                err.to_string(),
                "a message with eventId `evt-1` already exists in this application"
            );
            savepoint.rollback().await.expect("rollback to savepoint");
            tx.commit().await.expect("commit");
            assert_eq!(w.orders().await, 1, "the order survived the duplicate");
            assert_eq!(w.rows("messages").await, 1);

            // What the API refuses, the outbox refuses.
            let mut tx = w.conn.begin().await.expect("begin");
            let err =
                herald::outbox::send_message(&mut tx, &schema, "acme", "not valid", &payload, None)
                    .await
                    .expect_err("bad event type");
            assert!(
                matches!(&err, OutboxError::Invalid(m) if m.contains("event_type")),
                "{err:?}"
            );
            tx.rollback().await.expect("rollback");

            // SQL: the errors PostgreSQL callers see.
            let sql_err = |e: sqlx::Error| match e {
                sqlx::Error::Database(db) => (
                    db.code().map(|c| c.into_owned()),
                    db.message().to_owned(),
                    db.constraint().map(str::to_owned),
                ),
                other => panic!("not a database error: {other}"),
            };
            let call = format!("SELECT \"{schema}\".send_message($1, 'x', '{{}}'::jsonb, $2)");
            let err = sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(call.clone()))
                .bind("nope")
                .bind(None::<String>)
                .fetch_one(&mut w.conn)
                .await
                .expect_err("unknown app");
            let (code, message, _) = sql_err(err);
            assert_eq!(code.as_deref(), Some("P0002"));
            assert_eq!(
                message,
                "herald send_message: no application with id or uid \"nope\""
            );
            let err = sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(call))
                .bind("acme")
                .bind("evt-1")
                .fetch_one(&mut w.conn)
                .await
                .expect_err("duplicate");
            let (code, message, constraint) = sql_err(err);
            assert_eq!(code.as_deref(), Some("23505"), "{message}");
            assert_eq!(constraint.as_deref(), Some("messages_app_id_event_id_key"));
            assert_eq!(w.rows("messages").await, 1);
        },
    )
    .await;
}

/// Counts per state of `ep`, counted afresh from `deliveries`.
async fn fresh_counts(w: &mut World, ep: &EndpointId) -> DeliveryCounts {
    let rows: Vec<(i16, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT state, count(*) FROM \"{}\".deliveries WHERE endpoint_id = $1 GROUP BY state",
        w.schema
    )))
    .bind(ep.as_str())
    .fetch_all(&mut w.conn)
    .await
    .expect("count deliveries");
    let mut counts = DeliveryCounts::default();
    for (state, n) in rows {
        counts.set(i64::from(state), n);
    }
    counts
}

/// A caller's transaction held open around `send_message` delays no one:
/// a claim that moves the same endpoint's deliveries, and another
/// producer's message to it, go on while it is open (the kept counts once
/// made them wait for its commit); the counts stay exact.
async fn an_open_outbox_transaction_delays_no_claim(_pg: Arc<PostgresStore>, mut w: World) {
    const LIVENESS: Duration = Duration::from_secs(20);
    let mut producer = PgConnection::connect(&w.url).await.expect("connect");
    let committed = format!(
        "SELECT \"{}\".send_message('acme', 'order.created', '{{}}'::jsonb)",
        w.schema
    );
    for _ in 0..2 {
        sqlx::query(sqlx::AssertSqlSafe(committed.clone()))
            .execute(&mut producer)
            .await
            .expect("a committed message");
    }
    let mut tx = w.conn.begin().await.expect("begin");
    order_and_message(&mut tx, &w.schema, Via::Sql, "ord_1", None)
        .await
        .expect("send_message");
    // Held open: the claim takes the committed deliveries meanwhile.
    let got = tokio::time::timeout(
        LIVENESS,
        claim(&w.store, now_millis() + 1_000, 10, &HashMap::new(), 10),
    )
    .await
    .expect("a claim does not wait for an open outbox transaction");
    assert_eq!(got.len(), 2, "the committed ones only");
    tokio::time::timeout(
        LIVENESS,
        sqlx::query(sqlx::AssertSqlSafe(committed.clone())).execute(&mut producer),
    )
    .await
    .expect("another producer does not wait for it either")
    .expect("a committed message");
    tx.commit().await.expect("commit");

    let ep = w.endpoint.id.clone();
    let kept = w.store.endpoint_delivery_counts(&ep).await.expect("counts");
    assert_eq!(kept, fresh_counts(&mut w, &ep).await, "before a fold");
    assert!(w.store.fold_delivery_counts().await.expect("fold") > 0);
    let kept = w.store.endpoint_delivery_counts(&ep).await.expect("counts");
    assert_eq!(kept, fresh_counts(&mut w, &ep).await, "after a fold");
    assert_eq!(
        (kept.pending, kept.delivering),
        (2, 2),
        "two committed after the claim (one through the outbox), two claimed"
    );
}

#[tokio::test]
async fn an_open_outbox_transaction_delays_no_claim_nor_producer() {
    with_world(
        "outbox::an_open_outbox_transaction_delays_no_claim_nor_producer",
        an_open_outbox_transaction_delays_no_claim,
    )
    .await;
}

/// Deleting an endpoint leaves no kept-count row of it, folded or not.
async fn deleted_endpoints_leave_no_counts(_pg: Arc<PostgresStore>, mut w: World) {
    let mut producer = PgConnection::connect(&w.url).await.expect("connect");
    for _ in 0..3 {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT \"{}\".send_message('acme', 'order.created', '{{}}'::jsonb)",
            w.schema
        )))
        .execute(&mut producer)
        .await
        .expect("a committed message");
    }
    claim(&w.store, now_millis() + 1_000, 1, &HashMap::new(), 10).await;
    w.store.fold_delivery_counts().await.expect("fold");
    let ep = w.endpoint.id.clone();
    assert!(w
        .store
        .delete_endpoint(&w.app.id, &ep)
        .await
        .expect("delete"));
    w.store.fold_delivery_counts().await.expect("fold");
    for table in ["delivery_counts", "delivery_count_deltas"] {
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM \"{}\".{table} WHERE endpoint_id = $1",
            w.schema
        )))
        .bind(ep.as_str())
        .fetch_one(&mut w.conn)
        .await
        .expect("count");
        assert_eq!(n, 0, "{table} still describes the deleted endpoint");
    }
    let stats = w.store.queue_stats(now_millis()).await.expect("stats");
    assert_eq!((stats.pending, stats.delivering), (0, 0), "{stats:?}");
}

#[tokio::test]
async fn deleting_an_endpoint_leaves_no_kept_counts_of_it() {
    with_world(
        "outbox::deleting_an_endpoint_leaves_no_kept_counts_of_it",
        deleted_endpoints_leave_no_counts,
    )
    .await;
}

use sqlx::Connection;

use super::*;

const URL_VAR: &str = "HERALD_TEST_POSTGRES_URL";
const NOW: Millis = 10_000_000;
const CAP: usize = 128;
/// Held by the tests here that count what a claim touches: run beside
/// each other, the backlog's claim touched 1,433 buffers instead of
/// 483 while reading the same rows (the other test's schema being made
/// and dropped at the same time, its catalog changes, is the likely
/// cause).
static PLANS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The database URL of these tests, or `None` (said on stderr) when
/// it is not set.
fn test_url() -> Option<String> {
    let url = std::env::var(URL_VAR).ok().filter(|u| !u.trim().is_empty());
    if url.is_none() {
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "SKIPPED ({URL_VAR} unset)");
    }
    url
}

/// A store in a fresh schema (its name returned) with one application.
async fn store_with_app(url: &str) -> (PostgresStore, String, App) {
    let schema = format!("herald_test_{:016x}", rand::random::<u64>());
    let store = PostgresStore::open(url, &schema).await.expect("open");
    let app = App {
        id: AppId::generate(),
        uid: None,
        name: "a".into(),
        rate_limit: None,
        metadata: Default::default(),
        created_at: 0,
        updated_at: 0,
    };
    store.create_app(&app).await.expect("app");
    (store, schema, app)
}

/// `n` messages of `app` (`msg_{prefix}1` …, created at `from + 1` …),
/// each with a pending delivery to `ep` due at its creation.
async fn pending(
    store: &PostgresStore,
    app: &App,
    ep: &EndpointId,
    prefix: &str,
    from: i64,
    n: i64,
) {
    sqlx::query(
        "WITH m AS ( \
             INSERT INTO messages (id, app_id, event_type, payload, created_at) \
             SELECT 'msg_' || $1 || i, $2, 'x', '{}', $3 + i FROM generate_series(1, $4::int8) i \
             RETURNING id, created_at) \
         INSERT INTO deliveries (id, msg_id, endpoint_id, app_id, state, next_attempt_at, \
                                 cycle_started_at, created_at, updated_at) \
         SELECT 'dlv_' || m.id, m.id, $5, $2, 0, m.created_at, m.created_at, m.created_at, \
                m.created_at FROM m",
    )
    .bind(prefix)
    .bind(app.id.as_str())
    .bind(from)
    .bind(n)
    .bind(ep.as_str())
    .execute(&store.pool)
    .await
    .expect("fill");
}

/// Closes `store` and drops its schema.
async fn drop_schema(store: PostgresStore, url: &str, schema: &str) {
    store.close().await;
    let mut conn = sqlx::PgConnection::connect(url).await.expect("connect");
    sqlx::query(AssertSqlSafe(format!("DROP SCHEMA \"{schema}\" CASCADE")))
        .execute(&mut conn)
        .await
        .expect("drop schema");
}

/// A store in a fresh schema with one app, a `full` endpoint with
/// `backlog` pending deliveries long overdue (due at 1, 2, …, like a
/// backlog after an outage) and an `ok` one with 1,000 due behind them.
async fn backlog(url: &str, backlog: i64) -> (PostgresStore, String, EndpointId) {
    let (store, schema, app) = store_with_app(url).await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let ep = Endpoint::new(
            app.id.clone(),
            "http://127.0.0.1:9/",
            herald_signing::Secret::generate().expose(),
            0,
        );
        store.create_endpoint(&ep).await.expect("endpoint");
        ids.push(ep.id);
    }
    for (ep, prefix, from, n) in [(&ids[0], "f", 0, backlog), (&ids[1], "o", backlog, 1_000)] {
        pending(&store, &app, ep, prefix, from, n).await;
    }
    let full = ids.swap_remove(0);
    (store, schema, full)
}

fn count(v: &serde_json::Value, key: &str) -> u64 {
    v.get(key).and_then(serde_json::Value::as_u64).unwrap_or(0)
}

/// Rows the plan node `v` and those under it read from `table`
/// (returned or filtered out, over all loops).
fn rows_of(v: &serde_json::Value, table: &str) -> u64 {
    let own = if v.get("Relation Name").and_then(serde_json::Value::as_str) == Some(table) {
        (count(v, "Actual Rows")
            + count(v, "Rows Removed by Filter")
            + count(v, "Rows Removed by Index Recheck"))
            * count(v, "Actual Loops").max(1)
    } else {
        0
    };
    let under: u64 = v
        .get("Plans")
        .and_then(serde_json::Value::as_array)
        .map(|ps| ps.iter().map(|p| rows_of(p, table)).sum())
        .unwrap_or(0);
    own + under
}

/// A claim of 16 at `NOW` with `in_flight`, every cap `CAP`.
fn claim_of_16(in_flight: &HashMap<EndpointId, usize>) -> ClaimRequest<'_> {
    ClaimRequest {
        now: NOW,
        lease_until: NOW + 60_000,
        limit: 16,
        in_flight,
        endpoint_cap: CAP,
        unlisted_cap: CAP,
    }
}

/// The claim `req`, run (so taking what it claims) under
/// `EXPLAIN (<options>)`: the plan, as JSON.
async fn explain_claim(
    store: &PostgresStore,
    req: &ClaimRequest<'_>,
    options: &str,
) -> serde_json::Value {
    let plan: String = ClaimArgs::new(req)
        .bind(AssertSqlSafe(format!("EXPLAIN ({options}) {CLAIM_SQL}")))
        .fetch_one(&store.pool)
        .await
        .expect("explain")
        // `json`, read as its text (sqlx is built without its json type).
        .try_get_unchecked(0)
        .expect("plan");
    serde_json::from_str(&plan).expect("plan json")
}

/// One claim of 16 with `full` saturated, run under EXPLAIN ANALYZE:
/// (rows read from `deliveries`, shared buffers touched).
async fn explained_claim(store: &PostgresStore, full: &EndpointId) -> (u64, u64) {
    let in_flight: HashMap<EndpointId, usize> = [(full.clone(), CAP)].into();
    let req = claim_of_16(&in_flight);
    let plan = explain_claim(store, &req, "ANALYZE, BUFFERS, FORMAT JSON").await;
    let top = &plan[0]["Plan"];
    (
        rows_of(top, "deliveries"),
        count(top, "Shared Hit Blocks") + count(top, "Shared Read Blocks"),
    )
}

async fn scalar(store: &PostgresStore, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(&store.pool)
        .await
        .expect("count")
}

/// The figures of one backlog: (rows read by the first claim, rows
/// read and buffers touched by a claim once the backlog is parked,
/// parked rows), its schema dropped.
async fn measure(url: &str, n: i64) -> (u64, u64, u64, i64) {
    let (store, schema, full) = backlog(url, n).await;
    sqlx::query("ANALYZE deliveries")
        .execute(&store.pool)
        .await
        .expect("analyze");
    let (first, _) = explained_claim(&store, &full).await;
    // The claims park `PASSED_PER_CLAIM` rows each.
    for _ in 0..n / PASSED_PER_CLAIM + 1 {
        explained_claim(&store, &full).await;
    }
    // As autovacuum would after that many updates: the index entries of
    // the rows' old versions go (dead ones are still read, if skipped).
    sqlx::query("VACUUM ANALYZE deliveries")
        .execute(&store.pool)
        .await
        .expect("vacuum");
    explained_claim(&store, &full).await;
    let (rows, buffers) = explained_claim(&store, &full).await;
    let parked = scalar(&store, "SELECT COUNT(*) FROM deliveries WHERE parked").await;
    drop_schema(store, url, &schema).await;
    (first, rows, buffers, parked)
}

/// Issue 13, item 5 (SQLite: `a_claim_costs_what_it_takes_whatever_
/// claimable_backlog_lies_behind`): the due scan read past every row
/// of a saturated endpoint on every claim. Once parked, a claim reads
/// the same whether 1,000 or 40,000 of them wait.
#[tokio::test]
async fn a_claim_costs_the_same_whatever_saturated_backlog_waits() {
    let Some(url) = test_url() else {
        return;
    };
    let _alone = PLANS.lock().await;
    let (first_small, rows_small, buffers_small, parked_small) = measure(&url, 1_000).await;
    let (first_large, rows_large, buffers_large, parked_large) = measure(&url, 40_000).await;
    eprintln!(
        "first claim read {first_small} / {first_large} rows; parked: \
         {rows_small} / {rows_large} rows, {buffers_small} / {buffers_large} buffers"
    );
    assert_eq!((parked_small, parked_large), (1_000, 40_000));
    // What the statement read before parking: the whole backlog.
    assert!(first_large >= 40_000, "{first_large}");
    assert!(
        rows_large < rows_small * 2 && rows_large < 2_000,
        "a claim past 40,000 parked rows read {rows_large} rows, past 1,000 {rows_small}"
    );
    assert!(
        buffers_large < buffers_small * 2,
        "a claim past 40,000 parked rows touched {buffers_large} buffers, past 1,000 {buffers_small}"
    );
}

/// The node of `plan` (or under it) that computes the CTE `name`.
fn cte<'v>(plan: &'v serde_json::Value, name: &str) -> Option<&'v serde_json::Value> {
    if plan.get("Subplan Name").and_then(serde_json::Value::as_str) == Some(&format!("CTE {name}"))
    {
        return Some(plan);
    }
    plan.get("Plans")
        .and_then(serde_json::Value::as_array)?
        .iter()
        .find_map(|p| cte(p, name))
}

/// A claim locked the row of every enabled FIFO endpoint, twice
/// (`fifo_locked`, then `no_room`), idle or not, and read them all to
/// tell FIFO rows apart: with 5,000 idle ones it took 20 ms of the
/// server's time. It now locks and reads only those with work in reach
/// (due rows, or noted in `parked_endpoints`), still takes the busy
/// one's head, and forgets an idle one's `parked_endpoints` entry.
#[tokio::test]
async fn a_claim_locks_only_the_fifo_endpoints_it_may_take_from() {
    let Some(url) = test_url() else {
        return;
    };
    let _alone = PLANS.lock().await;
    let (store, schema, app) = store_with_app(&url).await;
    let fifo = |url: &str| {
        let mut ep = Endpoint::new(
            app.id.clone(),
            url,
            herald_signing::Secret::generate().expose(),
            0,
        );
        ep.ordering = crate::store::EndpointOrdering::Fifo;
        ep
    };
    let (idle, busy) = (
        fifo("http://127.0.0.1:9/idle"),
        fifo("http://127.0.0.1:9/busy"),
    );
    store.create_endpoint(&idle).await.expect("idle endpoint");
    store.create_endpoint(&busy).await.expect("busy endpoint");
    // 5,000 more idle ones.
    sqlx::query(
        "INSERT INTO endpoints SELECT (jsonb_populate_record(NULL::endpoints, \
           to_jsonb(e) || jsonb_build_object('id', e.id || '_' || g, 'uid', NULL))).* \
         FROM endpoints e, generate_series(1, 5000) g WHERE e.id = $1",
    )
    .bind(idle.id.as_str())
    .execute(&store.pool)
    .await
    .expect("idle endpoints");
    pending(&store, &app, &busy.id, "b", 0, 3).await;
    // An idle one noted as having parked rows, as when its last
    // parked row was delivered: a claim forgets it, as it would if it
    // were not FIFO.
    sqlx::query("INSERT INTO parked_endpoints (endpoint_id) VALUES ($1)")
        .bind(idle.id.as_str())
        .execute(&store.pool)
        .await
        .expect("parked endpoint");
    // Of this schema only: a database-wide ANALYZE would re-plan other
    // tests' schemas as they measure.
    sqlx::query("ANALYZE endpoints, deliveries, parked_endpoints")
        .execute(&store.pool)
        .await
        .expect("analyze");
    // Under EXPLAIN ANALYZE the statement runs, and so takes the head.
    let none = HashMap::new();
    let req = claim_of_16(&none);
    let plan = explain_claim(&store, &req, "ANALYZE, FORMAT JSON").await;
    let locked = |name| {
        cte(&plan[0]["Plan"], name)
            .map(|n| count(n, "Actual Rows"))
            .unwrap_or_else(|| panic!("no CTE {name} in the plan"))
    };
    // The busy one, and the idle one noted in `parked_endpoints`.
    assert_eq!(
        (locked("fifo_locked"), locked("no_room")),
        (2, 2),
        "FIFO endpoint rows locked by one claim"
    );
    // Each endpoint it needs by key (seq scans of all 5,002 read
    // 10,010 before `parked_eps` and `eps` looked them up by key).
    let read = rows_of(&plan[0]["Plan"], "endpoints");
    assert!(read < 100, "the claim read {read} rows of endpoints");
    let head: Vec<(String, i16)> = sqlx::query_as(
        "SELECT msg_id, state FROM deliveries WHERE endpoint_id = $1 ORDER BY msg_id",
    )
    .bind(busy.id.as_str())
    .fetch_all(&store.pool)
    .await
    .expect("states");
    assert_eq!(
        head,
        [
            ("msg_b1".into(), 1),
            ("msg_b2".into(), 0),
            ("msg_b3".into(), 0)
        ],
        "the busy endpoint's head taken, the rest waiting"
    );
    // The next claim takes nothing: the head is in flight.
    assert!(store.claim(&req).await.expect("claim").is_empty());
    // That claim parked the two behind the head (long due), so the
    // busy endpoint is noted; the idle one is forgotten.
    let noted: Vec<String> = sqlx::query_scalar("SELECT endpoint_id FROM parked_endpoints")
        .fetch_all(&store.pool)
        .await
        .expect("parked endpoints");
    assert_eq!(
        noted,
        [busy.id.as_str()],
        "endpoints noted as having parked rows"
    );
    drop_schema(store, &url, &schema).await;
}

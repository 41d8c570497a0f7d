use super::*;

/// A fresh database in `dir` with one app and `endpoints` enabled
/// endpoints, each with `per_endpoint` pending deliveries long overdue
/// (due at 1, 2, …, like a backlog after an outage).
fn backlog(
    dir: &std::path::Path,
    endpoints: usize,
    per_endpoint: usize,
) -> (Connection, CountFold) {
    let (mut conn, counts) = open_writer(&dir.join("claims.db")).expect("open");
    migrate(&mut conn, &counts).expect("migrate");
    counts::use_writer_triggers(&conn).expect("writer triggers");
    in_tx(&conn, &counts, |conn| conn.execute_batch(&format!(
        "INSERT INTO applications (id, name, created_at, updated_at) VALUES ('app_1', 'a', 0, 0);
         WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < {endpoints})
         INSERT INTO endpoints (id, app_id, url, secret, created_at, updated_at)
           SELECT printf('ep_%04d', i), 'app_1', 'http://127.0.0.1:9/', 's', 0, 0 FROM n;
         WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < {per_endpoint})
         INSERT INTO messages (id, app_id, event_type, payload, created_at)
           SELECT printf('msg_%08d', i), 'app_1', 'x', '{{}}', 1 + i FROM n;
         INSERT INTO deliveries (id, msg_id, endpoint_id, app_id, state, next_attempt_at,
                                 cycle_started_at, created_at, updated_at)
           SELECT 'dlv_' || m.id || e.id, m.id, e.id, 'app_1', 0, m.created_at, m.created_at,
                  m.created_at, m.created_at
           FROM messages m, endpoints e;"
    )))
    .expect("fill");
    (conn, counts)
}

/// Runs `f` in a transaction with the kept counts flushed before the
/// commit, as the writer thread does.
fn in_tx<T>(conn: &Connection, counts: &CountFold, f: impl FnOnce(&Connection) -> T) -> T {
    conn.execute_batch("BEGIN IMMEDIATE").expect("begin");
    counts.install();
    counts.begin();
    let out = f(conn);
    counts.flush(conn).expect("flush the counts");
    conn.execute_batch("COMMIT").expect("commit");
    out
}

/// One claim of `limit` with nothing in flight, and the SQLite VM
/// instructions it ran ([`vm_instructions`]).
fn counted_claim(
    (conn, counts): &(Connection, CountFold),
    now: Millis,
    limit: usize,
) -> (usize, u64) {
    let (claimed, ops) = in_tx(conn, counts, |conn| {
        vm_instructions(conn, || {
            claim_tx(
                conn,
                &Keyring::plain(),
                now,
                now + 60_000,
                limit,
                &HashMap::new(),
                (128, 128),
            )
        })
    });
    (claimed.expect("claim").len(), ops)
}

/// One claim of up to 100 at `now` (leased for a minute) with
/// `in_flight` and the caps `caps`, in a counted transaction.
fn claim_100(
    conn: &Connection,
    counts: &CountFold,
    now: Millis,
    in_flight: &HashMap<EndpointId, usize>,
    caps: (usize, usize),
) -> Vec<ClaimedDelivery> {
    in_tx(conn, counts, |c| {
        claim_tx(
            c,
            &Keyring::plain(),
            now,
            now + 60_000,
            100,
            in_flight,
            caps,
        )
    })
    .expect("claim")
}

fn count(conn: &Connection, sql: &str) -> i64 {
    conn.query_row(sql, [], |r| r.get(0)).expect("count")
}

/// Issue 16, defect 7: with a claimable backlog and no endpoint full, a
/// claim's parking walked the whole overdue head of the claim index
/// (22 ms per claim over 200,000 rows on the single writer). A claim
/// now costs the same over 40 times the backlog, and parks nothing.
#[test]
fn a_claim_costs_what_it_takes_whatever_claimable_backlog_lies_behind() {
    let now = 10_000_000;
    let (small_dir, large_dir) = (
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    );
    let small = backlog(small_dir.path(), 50, 20);
    let large = backlog(large_dir.path(), 50, 800);
    // The first claim of each also prepares its statements.
    counted_claim(&small, now, 16);
    counted_claim(&large, now, 16);
    let (got_small, ops_small) = counted_claim(&small, now, 16);
    let (got_large, ops_large) = counted_claim(&large, now, 16);
    assert_eq!((got_small, got_large), (16, 16));
    assert!(
        ops_large < ops_small * 2,
        "a claim over 40,000 overdue rows ran {ops_large} VM instructions, \
         over 1,000 rows {ops_small}"
    );
    let set_aside = "SELECT COUNT(*) FROM deliveries WHERE parked <> 0";
    assert_eq!(count(&large.0, set_aside), 0, "nothing parked or held");
    assert_eq!(count(&large.0, "SELECT COUNT(*) FROM parked_endpoints"), 0);
}

/// The walk still sets aside what claims would pass over again: a
/// full endpoint's overdue rows (parked, and given back once it has
/// room) and a disabled endpoint's (held until it is enabled).
#[test]
fn the_walk_parks_a_full_endpoints_rows_and_holds_a_disabled_ones() {
    let now = 10_000_000;
    let dir = tempfile::tempdir().expect("tempdir");
    let (conn, counts) = backlog(dir.path(), 3, 10);
    conn.execute("UPDATE endpoints SET disabled = 1 WHERE id = 'ep_0002'", [])
        .expect("disable");
    let full: HashMap<EndpointId, usize> =
        [(EndpointId::from_trusted("ep_0000".to_owned()), 128)].into();
    let got = claim_100(&conn, &counts, now, &full, (128, 128));
    assert_eq!(got.len(), 10);
    assert!(got.iter().all(|d| d.endpoint_id.as_str() == "ep_0001"));
    let parked = "SELECT COUNT(*) FROM deliveries WHERE parked = 1 AND endpoint_id = 'ep_0000'";
    let held = "SELECT COUNT(*) FROM deliveries WHERE parked = 2 AND endpoint_id = 'ep_0002'";
    assert_eq!((count(&conn, parked), count(&conn, held)), (10, 10));
    // Room again: the parked rows come back, oldest first; the held
    // ones stay.
    let got = claim_100(&conn, &counts, now, &HashMap::new(), (4, 4));
    assert_eq!(got.len(), 4);
    assert!(got.iter().all(|d| d.endpoint_id.as_str() == "ep_0000"));
    assert_eq!(count(&conn, held), 10);
}

/// A connection other than the writer changes deliveries only with the
/// fold registered and inside a counted transaction, and then the kept
/// counts follow.
#[test]
fn another_connection_counts_only_in_a_counted_transaction() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _writer = backlog(dir.path(), 1, 2);
    let kill = "UPDATE deliveries SET state = 3 WHERE id = (SELECT min(id) FROM deliveries)";
    let dead = |conn: &Connection| -> i64 {
        conn.query_row(
            "SELECT coalesce(sum(n), 0) FROM delivery_counts WHERE state = 3",
            [],
            |r| r.get(0),
        )
        .expect("read the counts")
    };

    let bare = Connection::open(dir.path().join("claims.db")).expect("open");
    let err = bare.execute(kill, []).expect_err("no function, no write");
    assert!(
        err.to_string().contains("no such function: herald_count"),
        "{err}"
    );

    let conn = Connection::open(dir.path().join("claims.db")).expect("open");
    let fold = CountFold::register(&conn).expect("register");
    let err = conn
        .execute(kill, [])
        .expect_err("not in a counted transaction");
    assert!(
        err.to_string().contains("outside a counted transaction"),
        "{err}"
    );
    assert_eq!(dead(&conn), 0);

    conn.execute_batch("BEGIN IMMEDIATE").expect("begin");
    fold.begin();
    conn.execute(kill, []).expect("kill one");
    fold.flush(&conn).expect("flush");
    conn.execute_batch("COMMIT").expect("commit");
    assert_eq!(dead(&conn), 1, "the counted transaction moved the count");
}

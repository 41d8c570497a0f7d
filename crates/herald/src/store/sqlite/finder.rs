//! The finding tools' searches on SQLite.

use super::*;
use crate::store::finder::{add_counts, like_pattern};

/// A search by a status that at most this many deliveries have (of every
/// application, as `delivery_counts` says) starts from those deliveries'
/// own index: it costs them, sorted, however many messages there are.
/// Above it, matches are common enough that walking messages newest first
/// and testing each stops after a page. (The walk costs about
/// `page × messages / matches`; at 10 M messages both cost alike near here.)
pub(super) const STATUS_DRIVEN_AT_MOST: i64 = 20_000;

/// The deliveries in `state`, by an index that holds only them (for
/// `app`'s alone where one does), or `None` for a state no such index
/// holds (`delivered`: every delivery's end state, never rare for long).
/// Each part names its partial index's own condition, so SQLite may use it.
fn deliveries_in_state(state: DeliveryState, app: Option<&AppId>) -> Option<(String, Vec<Value>)> {
    let app_cond = if app.is_some() { " AND app_id = ?" } else { "" };
    let s = state as i64;
    let (sql, parts) = match state {
        DeliveryState::Pending | DeliveryState::Delivering => (
            format!(
                "SELECT msg_id FROM deliveries INDEXED BY deliveries_due \
                  WHERE state < 2 AND parked = 0 AND state = {s}{app_cond} \
                 UNION ALL SELECT msg_id FROM deliveries INDEXED BY deliveries_parked \
                  WHERE parked = 1 AND state = {s}{app_cond} \
                 UNION ALL SELECT msg_id FROM deliveries INDEXED BY deliveries_held \
                  WHERE parked = 2 AND state = {s}{app_cond}"
            ),
            3,
        ),
        DeliveryState::Dead if app.is_some() => (
            "SELECT msg_id FROM deliveries INDEXED BY deliveries_dead \
              WHERE state = 3 AND app_id = ?"
                .to_owned(),
            1,
        ),
        DeliveryState::Dead => (
            "SELECT msg_id FROM deliveries INDEXED BY deliveries_dead_all WHERE state = 3"
                .to_owned(),
            0,
        ),
        DeliveryState::Delivered => return None,
    };
    let args = match app {
        Some(app) => vec![Value::from(app.as_str().to_owned()); parts],
        None => Vec::new(),
    };
    Some((sql, args))
}

/// The messages search on one connection (see [`Finder::find_messages`]).
pub(super) fn find_messages_on(
    c: &Connection,
    filter: &FindFilter,
    page: &PageReq,
) -> StoreResult<Page<FoundMessage>> {
    let (cond, mut args) = sqlite_where(filter.conditions(Dialect::Sqlite));
    let select =
        "SELECT m.id, m.app_id, a.name AS app_name, m.event_type, m.event_id, m.created_at";
    // An id or eventId is one index step already.
    let driven = match filter.status {
        Some(state) if filter.id_or_event_id.is_none() => {
            match deliveries_in_state(state, filter.app.as_ref()) {
                Some(rows) => {
                    let n: i64 = c
                        .prepare_cached(
                            "SELECT COALESCE(SUM(n), 0) FROM delivery_counts WHERE state = ?1",
                        )
                        .and_then(|mut st| st.query_row(params![state as i64], |r| r.get(0)))?;
                    (n <= STATUS_DRIVEN_AT_MOST).then_some(rows)
                }
                None => None,
            }
        }
        _ => None,
    };
    let sql = match driven {
        // The matching deliveries' messages, looked up by id and sorted
        // (CROSS JOIN keeps that order of the loops): the filter's other
        // terms, and its status test, still apply to each.
        Some((rows, mut row_args)) => {
            row_args.append(&mut args);
            args = row_args;
            format!(
                "{select} FROM (SELECT DISTINCT msg_id FROM ({rows})) s \
                 CROSS JOIN messages m ON m.id = s.msg_id \
                 JOIN applications a ON a.id = m.app_id WHERE {cond}"
            )
        }
        None => {
            format!("{select} FROM messages m JOIN applications a ON a.id = m.app_id WHERE {cond}")
        }
    };
    let mut found = page_of(c, &sql, "m.id", args, page, |r| found_from_row(r))?;
    if found.items.is_empty() {
        return Ok(found);
    }
    let ids: Vec<&str> = found.items.iter().map(|m| m.id.as_str()).collect();
    let mut stmt = c.prepare_cached(
        "SELECT msg_id, state, COUNT(*) FROM deliveries INDEXED BY deliveries_by_msg \
             WHERE msg_id IN (SELECT value FROM json_each(?1)) GROUP BY msg_id, state",
    )?;
    let counts = stmt
        .query_map(params![to_json(&ids)?], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })?
        .collect::<Result<Vec<(String, i64, i64)>, _>>()?;
    add_counts(&mut found.items, counts);
    Ok(found)
}

#[async_trait]
impl Finder for SqliteStore {
    async fn find_messages(
        &self,
        filter: &FindFilter,
        page: &PageReq,
    ) -> StoreResult<Page<FoundMessage>> {
        let (filter, page) = (filter.clone(), page.clone());
        self.read(move |c| find_messages_on(c, &filter, &page))
            .await
    }

    async fn find_apps(&self, search: Option<&str>, page: &PageReq) -> StoreResult<Page<App>> {
        let mut sql = String::from("SELECT * FROM applications WHERE 1 = 1");
        let mut args: Vec<Value> = Vec::new();
        if let Some(search) = search {
            // Applications are few beside messages: the walk by id with
            // this test stops after a page of matches.
            sql.push_str(" AND (name LIKE ? ESCAPE '\\' OR uid = ? OR id = ?)");
            args.push(like_pattern(search).into());
            args.push(search.to_owned().into());
            args.push(search.to_owned().into());
        }
        let page = page.clone();
        self.read(move |c| page_of(c, &sql, "id", args, &page, |r| app_from_row(r)))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store of `messages` messages with one delivery each, all delivered
    /// but the oldest few: three dead, two pending, one parked, one held
    /// (written through the schema's count triggers, as any connection but
    /// the writer's does).
    fn history(dir: &std::path::Path, messages: usize) -> Connection {
        let (mut conn, counts) = open_writer(&dir.join("finder.db")).expect("open");
        migrate(&mut conn, &counts).expect("migrate");
        conn.execute_batch("BEGIN IMMEDIATE").expect("begin");
        counts.install();
        counts.begin();
        conn.execute_batch(&format!(
            "INSERT INTO applications (id, name, created_at, updated_at) VALUES ('app_1', 'a', 0, 0);
             INSERT INTO endpoints (id, app_id, url, secret, created_at, updated_at)
               VALUES ('ep_1', 'app_1', 'http://127.0.0.1:9/', 's', 0, 0);
             WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < {messages})
             INSERT INTO messages (id, app_id, event_type, payload, created_at)
               SELECT printf('msg_%08d', i), 'app_1', 'x', '{{}}', 1 + i FROM n;
             INSERT INTO deliveries (id, msg_id, endpoint_id, app_id, state, parked, next_attempt_at,
                                     cycle_started_at, created_at, updated_at)
               SELECT 'dlv_' || substr(id, 5), id, 'ep_1', 'app_1',
                      CASE WHEN created_at <= 3 THEN 3 WHEN created_at <= 7 THEN 0 ELSE 2 END,
                      CASE WHEN created_at = 4 THEN 1 WHEN created_at = 5 THEN 2 ELSE 0 END,
                      created_at, created_at, created_at, created_at
               FROM messages;"
        ))
        .expect("fill");
        counts.flush(&conn).expect("flush the counts");
        conn.execute_batch("COMMIT").expect("commit");
        conn
    }

    /// The search's ids and the SQLite VM instructions it ran.
    fn counted_find(conn: &Connection, filter: &FindFilter, page: &PageReq) -> (Vec<String>, u64) {
        let (found, ops) = vm_instructions(conn, || find_messages_on(conn, filter, page));
        let ids = found
            .expect("find")
            .items
            .iter()
            .map(|m| m.id.as_str().to_owned())
            .collect();
        (ids, ops)
    }

    fn ids(numbers: &[usize]) -> Vec<String> {
        numbers.iter().map(|i| format!("msg_{i:08}")).collect()
    }

    /// The issue-13 finding: a search by a status few messages have walked
    /// every message (9.4 s at 10 M). It now costs the same over 40 times
    /// the messages, with each status's matches newest first, paged.
    #[test]
    fn a_rare_status_costs_its_matches_not_the_messages() {
        let (small_dir, large_dir) = (
            tempfile::tempdir().expect("tempdir"),
            tempfile::tempdir().expect("tempdir"),
        );
        let (small_n, large_n) = (1_000, 40_000);
        let small = history(small_dir.path(), small_n);
        let large = history(large_dir.path(), large_n);
        let app = AppId::from_trusted("app_1".to_owned());
        let page = PageReq {
            limit: 2,
            ..PageReq::default()
        };
        for scoped in [None, Some(app.clone())] {
            for (state, first, all) in [
                (DeliveryState::Dead, [2, 1], vec![2, 1, 0]),
                (DeliveryState::Pending, [6, 5], vec![6, 5, 4, 3]),
            ] {
                let filter = FindFilter {
                    app: scoped.clone(),
                    status: Some(state),
                    ..FindFilter::default()
                };
                // The first run of each also prepares its statements.
                counted_find(&small, &filter, &page);
                counted_find(&large, &filter, &page);
                let (got_small, ops_small) = counted_find(&small, &filter, &page);
                let (got_large, ops_large) = counted_find(&large, &filter, &page);
                assert_eq!(got_small, ids(&first), "{state:?}");
                assert_eq!(got_large, ids(&first), "{state:?}");
                assert!(
                    ops_large < ops_small * 2,
                    "{state:?} (scoped: {}): {ops_large} VM instructions over {large_n} messages, \
                     {ops_small} over {small_n}",
                    scoped.is_some()
                );
                // The next page, after the cursor, holds the rest.
                let rest = PageReq {
                    limit: 10,
                    after: got_large.last().cloned(),
                    ..PageReq::default()
                };
                let (next, _) = counted_find(&large, &filter, &rest);
                let mut every = got_large.clone();
                every.extend(next);
                assert_eq!(every, ids(&all), "{state:?}");
            }
        }
        // A common status still walks messages and stops after a page.
        let delivered = FindFilter {
            status: Some(DeliveryState::Delivered),
            ..FindFilter::default()
        };
        let (got, _) = counted_find(&large, &delivered, &page);
        assert_eq!(got, ids(&[large_n - 1, large_n - 2]));
    }
}

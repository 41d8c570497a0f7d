//! The kept delivery counts (`delivery_counts`), folded per transaction.
//!
//! Migration 0018's triggers on `deliveries` call `herald_count(endpoint,
//! state, held, delta)`, a Rust function registered on every connection
//! that writes deliveries. It only adds the delta into an in-memory map;
//! the owner of the connection writes the map's net changes into
//! `delivery_counts` (one upsert per (endpoint, state, held) changed)
//! just before it commits, in the same transaction, so a reader never
//! sees deliveries and counts disagree. Row triggers writing the table
//! (migration 0016) cost the hot path one B-tree upsert per delivery
//! change; the fold costs a hash lookup.
//!
//! Exactness rests on three rules, all enforced here or loudly:
//! - deltas are taken only inside a counted transaction (between
//!   [`CountFold::begin`] and [`CountFold::flush`]); outside one, the
//!   function fails and so does the statement ("no such function" on a
//!   connection without it), rather than lose a change silently;
//! - a writer job rolled back to its savepoint takes its deltas back
//!   ([`CountFold::job_start`] / [`CountFold::job_rollback`]);
//! - a transaction that fails to commit loses nothing kept: the flushed
//!   rows roll back with it, and the next `begin` starts from an empty map.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use rusqlite::functions::FunctionFlags;
use rusqlite::types::ValueRef;
use rusqlite::{params, Connection};

/// The function the triggers call.
pub const COUNT_FUNCTION: &str = "herald_count";

/// Delivery states are 0 pending, 1 delivering, 2 delivered, 3 dead (and
/// room for a few more); a slot is `state * 2 + held`.
const STATES: usize = 8;
const SLOTS: usize = STATES * 2;

#[derive(Default)]
struct Fold {
    /// Between `begin` and `flush`: deltas are accepted.
    armed: bool,
    /// Endpoint id → its row in `changes`.
    index: HashMap<Box<str>, usize>,
    changes: Vec<(Box<str>, [i64; SLOTS])>,
    /// The current job's deltas, (row, slot, delta), undone on rollback.
    journal: Vec<(usize, usize, i64)>,
    /// A job's rollback failed: this transaction's counts are unknown.
    broken: bool,
}

impl Fold {
    fn add(&mut self, endpoint: &str, state: i64, held: i64, delta: i64) -> Result<(), String> {
        if !self.armed {
            return Err(format!(
                "{COUNT_FUNCTION}: a delivery changed outside a counted transaction \
                 (register and flush herald::store::sqlite::CountFold around it)"
            ));
        }
        let state = usize::try_from(state)
            .ok()
            .filter(|s| *s < STATES)
            .ok_or_else(|| format!("{COUNT_FUNCTION}: delivery state {state} out of range"))?;
        let slot = state * 2 + usize::from(held != 0);
        let row = match self.index.get(endpoint) {
            Some(row) => *row,
            None => {
                let row = self.changes.len();
                self.changes.push((endpoint.into(), [0; SLOTS]));
                self.index.insert(endpoint.into(), row);
                row
            }
        };
        self.changes[row].1[slot] += delta;
        self.journal.push((row, slot, delta));
        Ok(())
    }

    fn clear(&mut self) {
        self.index.clear();
        self.changes.clear();
        self.journal.clear();
        self.broken = false;
    }
}

/// The count deltas of one connection's current transaction (a cheap
/// handle: clones share the map).
#[derive(Clone)]
pub struct CountFold(Arc<Mutex<Fold>>);

impl CountFold {
    /// Registers `herald_count` on `conn`, folding into the returned map.
    /// Every connection that writes deliveries needs it (the triggers fail
    /// with "no such function" without it).
    pub fn register(conn: &Connection) -> rusqlite::Result<CountFold> {
        let fold = CountFold(Arc::new(Mutex::new(Fold::default())));
        let inner = fold.0.clone();
        // Not DETERMINISTIC: it has a side effect, and must run every time.
        conn.create_scalar_function(COUNT_FUNCTION, 4, FunctionFlags::SQLITE_UTF8, move |ctx| {
            let endpoint = match ctx.get_raw(0) {
                ValueRef::Text(t) => std::str::from_utf8(t)
                    .map_err(|e| rusqlite::Error::UserFunctionError(Box::new(e)))?,
                _ => {
                    return Err(rusqlite::Error::UserFunctionError(
                        format!("{COUNT_FUNCTION}: endpoint id is not text").into(),
                    ))
                }
            };
            let (state, held, delta) = (ctx.get::<i64>(1)?, ctx.get::<i64>(2)?, ctx.get::<i64>(3)?);
            lock(&inner)
                .add(endpoint, state, held, delta)
                .map_err(|e| rusqlite::Error::UserFunctionError(e.into()))?;
            Ok(rusqlite::types::Null)
        })?;
        Ok(fold)
    }

    /// A transaction begins: deltas are accepted from now on, from an empty
    /// map (whatever a failed transaction left is dropped).
    pub fn begin(&self) {
        let mut f = lock(&self.0);
        f.clear();
        f.armed = true;
    }

    /// A writer job begins (in its own savepoint).
    pub fn job_start(&self) {
        lock(&self.0).journal.clear();
    }

    /// The job failed and was rolled back to its savepoint (`undone`): its
    /// deltas go too. If that rollback itself failed, which of its rows
    /// remain is unknown, so the transaction must not commit: `flush`
    /// refuses.
    pub fn job_rollback(&self, undone: bool) {
        let mut f = lock(&self.0);
        let journal = std::mem::take(&mut f.journal);
        if !undone {
            f.broken = true;
            return;
        }
        for (row, slot, delta) in journal {
            f.changes[row].1[slot] -= delta;
        }
    }

    /// Writes the net changes into `delivery_counts` on `conn`, inside the
    /// transaction about to commit, and stops accepting deltas. Changes of
    /// an endpoint deleted meanwhile are dropped: its rows went with it.
    pub fn flush(&self, conn: &Connection) -> rusqlite::Result<()> {
        let mut f = lock(&self.0);
        f.armed = false;
        let broken = f.broken;
        let changes = std::mem::take(&mut f.changes);
        f.clear();
        drop(f);
        if broken {
            return Err(rusqlite::Error::UserFunctionError(
                format!(
                    "{COUNT_FUNCTION}: a job's rollback failed, so the kept counts of this \
                     transaction are unknown; it is rolled back whole"
                )
                .into(),
            ));
        }
        if changes.is_empty() {
            return Ok(());
        }
        let mut upsert = conn.prepare_cached(
            "INSERT INTO delivery_counts (endpoint_id, state, held, n) \
             SELECT ?1, ?2, ?3, ?4 WHERE EXISTS (SELECT 1 FROM endpoints WHERE id = ?1) \
             ON CONFLICT (endpoint_id, state, held) DO UPDATE SET n = n + excluded.n",
        )?;
        for (endpoint, slots) in &changes {
            for (slot, delta) in slots.iter().enumerate().filter(|(_, d)| **d != 0) {
                let (state, held) = (slot / 2, slot % 2);
                upsert.execute(params![
                    &**endpoint,
                    i64::try_from(state).unwrap_or(0),
                    i64::try_from(held).unwrap_or(0),
                    delta
                ])?;
            }
        }
        Ok(())
    }

    /// The transaction failed: drop its deltas and accept no more.
    pub fn discard(&self) {
        let mut f = lock(&self.0);
        f.clear();
        f.armed = false;
    }
}

fn lock(m: &Mutex<Fold>) -> MutexGuard<'_, Fold> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

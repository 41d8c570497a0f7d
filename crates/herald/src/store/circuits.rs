//! The per-endpoint circuit breaker as stored: its state on the endpoint's
//! row (so every process and the API see it), written by the completer in
//! the transaction that records a batch's attempts
//! ([`Queue::complete_with_circuits`]), read by the dispatchers' view, and
//! moved to half-open by one compare-and-set per probe
//! ([`Circuits::swap_circuit`]). The transitions themselves are
//! `herald_policy::breaker`'s.

use super::*;
pub use herald_policy::breaker::{
    BreakerRule, Circuit, CircuitState, Seen, Transition, WindowCounts,
};

/// An endpoint's breaker, with whose it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointCircuit {
    pub endpoint_id: EndpointId,
    pub app_id: AppId,
    pub circuit: Circuit,
}

/// A transition a completion batch made (see [`Completed::circuits`]).
#[derive(Debug, Clone, PartialEq)]
pub struct CircuitChange {
    pub endpoint_id: EndpointId,
    pub app_id: AppId,
    pub transition: Transition,
    /// The breaker after it.
    pub circuit: Circuit,
}

#[async_trait]
pub trait Circuits: Send + Sync {
    /// Every endpoint whose breaker is not closed: the dispatchers' view
    /// (an index holds only those rows).
    async fn broken_circuits(&self) -> StoreResult<Vec<EndpointCircuit>>;
    /// One endpoint's breaker; None when there is no such endpoint.
    async fn circuit_of(&self, ep: &EndpointId) -> StoreResult<Option<Circuit>>;
    /// Writes `next` as `ep`'s breaker if the row still holds `seen` (its
    /// state, since and probe winner): one atomic statement, so of
    /// concurrent callers from the same `seen` exactly one gets true.
    async fn swap_circuit(
        &self,
        ep: &EndpointId,
        seen: &Circuit,
        next: &Circuit,
    ) -> StoreResult<bool>;
    /// The age cap on deliveries an open breaker holds back (pending, of an
    /// endpoint whose breaker is not closed): those whose cycle started
    /// before `too_old_before` become dead (`too_old`). At most `batch` per
    /// call; returns how many (the caller repeats while a batch was full).
    async fn expire_circuit_held(
        &self,
        too_old_before: Millis,
        now: Millis,
        batch: usize,
    ) -> StoreResult<u64>;
}

/// What a batch says of each endpoint's breaker, by endpoint id.
pub fn fold_seen(batch: &[Completion]) -> BTreeMap<&str, Seen> {
    let mut by_ep: BTreeMap<&str, (Seen, Millis)> = BTreeMap::new();
    for c in batch {
        let a = &c.attempt;
        let (seen, last_at) = by_ep
            .entry(a.endpoint_id.as_str())
            .or_insert((Seen::default(), Millis::MIN));
        seen.attempts = seen.attempts.saturating_add(1);
        if !a.success {
            seen.failures = seen.failures.saturating_add(1);
        }
        if a.started_at >= *last_at {
            *last_at = a.started_at;
            seen.last_succeeded = a.success;
        }
    }
    by_ep.into_iter().map(|(k, (s, _))| (k, s)).collect()
}

/// Steps each endpoint's stored breaker with what the batch saw: the new
/// breaker per endpoint (to write) and the transitions to tell.
pub fn step_circuits(
    rule: &BreakerRule,
    stored: Vec<EndpointCircuit>,
    seen: &BTreeMap<&str, Seen>,
    now: Millis,
) -> (Vec<EndpointCircuit>, Vec<CircuitChange>) {
    let mut changes = Vec::new();
    let next = stored
        .into_iter()
        .map(|e| {
            let s = seen
                .get(e.endpoint_id.as_str())
                .copied()
                .unwrap_or_default();
            let (circuit, t) = herald_policy::breaker::step(rule, &e.circuit, &s, now);
            if let Some(transition) = t {
                changes.push(CircuitChange {
                    endpoint_id: e.endpoint_id.clone(),
                    app_id: e.app_id.clone(),
                    transition,
                    circuit: circuit.clone(),
                });
            }
            EndpointCircuit { circuit, ..e }
        })
        .collect();
    (next, changes)
}

/// The breaker from its stored columns (both stores keep the same ones).
#[allow(clippy::too_many_arguments)]
pub fn circuit_from_columns(
    state: i64,
    since: Option<Millis>,
    until: Option<Millis>,
    cooldown_ms: i64,
    probe_by: Option<String>,
    window: [i64; 5],
) -> Circuit {
    let count = |v: i64| u32::try_from(v.max(0)).unwrap_or(u32::MAX);
    Circuit {
        state: CircuitState::from_code(state),
        since,
        until,
        cooldown_ms,
        probe_by,
        window: WindowCounts {
            started_at: window[0],
            attempts: count(window[1]),
            failures: count(window[2]),
            prev_attempts: count(window[3]),
            prev_failures: count(window[4]),
        },
    }
}

/// The columns a breaker is read from, in [`circuit_from_columns`]' order.
pub const CIRCUIT_COLUMNS: &str =
    "circuit_state, circuit_since, circuit_until, circuit_cooldown_ms, \
     circuit_probe_by, circuit_window_at, circuit_attempts, circuit_failures, \
     circuit_prev_attempts, circuit_prev_failures";

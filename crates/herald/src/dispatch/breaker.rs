//! The dispatcher's view of the circuit breakers that are not closed, and
//! how it shapes the room each claim and handoff gives an endpoint.
//!
//! The breakers live on the endpoints' rows (the completer steps them with
//! each batch, `herald_policy::breaker::step`); this view re-reads the few
//! broken ones at most every [`REFRESH`] (one indexed query) and learns the
//! completer's own transitions at once. An open breaker's endpoint gets no
//! room: its deliveries stay pending, unclaimed, spending no attempt. When
//! its cooldown is over, the refresh tries to win the probe with one
//! compare-and-set ([`crate::store::Circuits::swap_circuit`]); of all the
//! processes sharing the store one wins, and only that one gives the
//! endpoint a room of one, once, in the loop's claim (never in an ingest
//! handoff, so the two cannot both take a probe).

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use herald_policy::breaker::{probe, room, BreakerRule, Circuit, CircuitState, Transition};

use crate::ids::EndpointId;
use crate::metrics::AttemptMetrics;
use crate::store::{CircuitChange, Millis, Store, StoreResult};

/// How stale the view may get before a claim reads the store again.
pub const REFRESH: Duration = Duration::from_millis(250);

pub struct Breakers {
    rule: BreakerRule,
    /// This process's name as a probe winner.
    me: String,
    /// A won probe with no answer after this may be won again (its
    /// winner died or never sent it): the lease, which bounds any request.
    probe_timeout: Duration,
    view: Mutex<View>,
}

#[derive(Default)]
struct View {
    refreshed_at: Option<Instant>,
    broken: HashMap<EndpointId, Entry>,
    /// `endpoint` label values whose open gauge this process set to 1.
    gauged: HashSet<String>,
    /// Bumped by each [`Breakers::note`]: a refresh whose read began
    /// before one may hold a state older than the noted one, and is
    /// dropped rather than undo it.
    noted: u64,
}

struct Entry {
    circuit: Circuit,
    /// The probe this process won has been given to a claim.
    probe_taken: bool,
}

impl Breakers {
    pub fn new(rule: BreakerRule, probe_timeout: Duration) -> Self {
        Breakers {
            rule,
            me: ulid::Ulid::new().to_string(),
            probe_timeout,
            view: Mutex::new(View::default()),
        }
    }

    pub fn rule(&self) -> &BreakerRule {
        &self.rule
    }

    fn view(&self) -> std::sync::MutexGuard<'_, View> {
        self.view.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Re-reads the broken breakers if the view is older than [`REFRESH`]
    /// (or `force`), and tries to win the probe of each whose cooldown is
    /// over: one compare-and-set per such breaker, not per delivery.
    pub async fn refresh(
        &self,
        store: &dyn Store,
        now: Millis,
        force: bool,
        metrics: &AttemptMetrics,
    ) -> StoreResult<()> {
        if self.rule.is_off() {
            return Ok(());
        }
        if !force
            && self
                .view()
                .refreshed_at
                .is_some_and(|at| at.elapsed() < REFRESH)
        {
            return Ok(());
        }
        let noted_before = self.view().noted;
        let mut read = store.broken_circuits().await?;
        let mut won_here = Vec::new();
        for e in &mut read {
            if let Some(won) = probe(&e.circuit, now, self.probe_timeout, &self.me) {
                if store.swap_circuit(&e.endpoint_id, &e.circuit, &won).await? {
                    tracing::info!(endpoint = %e.endpoint_id, "circuit half-open: this process sends the probe");
                    e.circuit = won.clone();
                    won_here.push((e.endpoint_id.clone(), won));
                }
            }
        }
        let mut view = self.view();
        if view.noted != noted_before {
            // The completer moved a breaker meanwhile: the rest of this
            // read may be older than what it noted, so only the probes won
            // just now (the store's word, after any such write) are kept;
            // the next claim reads the rest again.
            for (ep, circuit) in won_here {
                view.broken.insert(
                    ep,
                    Entry {
                        circuit,
                        probe_taken: false,
                    },
                );
            }
            view.refreshed_at = None;
            set_gauges(&mut view, metrics);
            return Ok(());
        }
        let before = std::mem::take(&mut view.broken);
        for e in read {
            // The same probe as before keeps its "taken" mark.
            let probe_taken = before.get(&e.endpoint_id).is_some_and(|old| {
                old.probe_taken
                    && old.circuit.state == e.circuit.state
                    && old.circuit.since == e.circuit.since
                    && old.circuit.probe_by == e.circuit.probe_by
            });
            view.broken.insert(
                e.endpoint_id,
                Entry {
                    circuit: e.circuit,
                    probe_taken,
                },
            );
        }
        view.refreshed_at = Some(Instant::now());
        set_gauges(&mut view, metrics);
        Ok(())
    }

    /// Shapes a claim's per-endpoint counts (`in_flight`, against `cap`)
    /// so that each broken endpoint gets the room its breaker allows: none
    /// when open, one when half-open with this process's untaken probe
    /// and `probe` (the loop's claim, not a handoff), while `registered`
    /// (deliveries this process holds for an endpoint; `in_flight` may
    /// count more, as lanes narrow it) says none is already here. Returns
    /// the endpoints given their probe, marked taken (see
    /// [`Breakers::settle`]).
    pub fn shape(
        &self,
        in_flight: &mut HashMap<EndpointId, usize>,
        cap: usize,
        probe: bool,
        registered: impl Fn(&EndpointId) -> usize,
    ) -> Vec<EndpointId> {
        if self.rule.is_off() {
            return Vec::new();
        }
        let mut view = self.view();
        let mut probing = Vec::new();
        for (ep, e) in view.broken.iter_mut() {
            let now_in = in_flight.get(ep).copied().unwrap_or(0);
            // A probe still waiting or in flight here is one already.
            let taken = e.probe_taken || !probe || registered(ep) > 0;
            let allowed = room(&e.circuit, &self.me, taken, cap.saturating_sub(now_in));
            if allowed > 0 && e.circuit.state == CircuitState::HalfOpen {
                e.probe_taken = true;
                probing.push(ep.clone());
            }
            in_flight.insert(ep.clone(), cap.saturating_sub(allowed));
        }
        probing
    }

    /// After the claim: a probe given to it that found no due delivery is
    /// untaken again, for the next claim.
    pub fn settle(&self, probing: &[EndpointId], claimed: impl Fn(&EndpointId) -> bool) {
        if probing.is_empty() {
            return;
        }
        let mut view = self.view();
        for ep in probing.iter().filter(|ep| !claimed(ep)) {
            if let Some(e) = view.broken.get_mut(ep) {
                e.probe_taken = false;
            }
        }
    }

    /// Whether a delivery to `ep` claimed at `claimed_at`, through its gate
    /// now, must go back unsent: the breaker opened since, or it is
    /// half-open and this is not the probe (claimed before the probe was
    /// won here, or the probe is another process's).
    pub fn holds(&self, ep: &EndpointId, claimed_at: Millis) -> bool {
        if self.rule.is_off() {
            return false;
        }
        match self.view().broken.get(ep).map(|e| &e.circuit) {
            None => false,
            Some(c) => match c.state {
                CircuitState::Closed => false,
                CircuitState::Open => true,
                CircuitState::HalfOpen => {
                    c.probe_by.as_deref() != Some(self.me.as_str())
                        || c.since.is_none_or(|since| claimed_at < since)
                }
            },
        }
    }

    /// The completer's transitions, known at once (no wait for a refresh).
    pub fn note(&self, changes: &[CircuitChange], metrics: &AttemptMetrics) {
        if changes.is_empty() {
            return;
        }
        let mut view = self.view();
        view.noted = view.noted.wrapping_add(1);
        for c in changes {
            match c.transition {
                Transition::Closed => {
                    view.broken.remove(&c.endpoint_id);
                }
                Transition::Opened { .. } | Transition::Reopened => {
                    crate::metrics::circuit_opened();
                    view.broken.insert(
                        c.endpoint_id.clone(),
                        Entry {
                            circuit: c.circuit.clone(),
                            probe_taken: false,
                        },
                    );
                }
            }
        }
        set_gauges(&mut view, metrics);
    }

    /// The earliest end of an open breaker's cooldown in the view, if any
    /// breaker is not closed (half-open ones: `now`).
    pub fn next_change(&self, now: Millis) -> Option<Millis> {
        if self.rule.is_off() {
            return None;
        }
        self.view()
            .broken
            .values()
            .map(|e| match e.circuit.state {
                CircuitState::Open => e.circuit.until.unwrap_or(now),
                _ => now,
            })
            .min()
    }
}

/// `herald_endpoint_circuit_open{endpoint}`: 1 per broken endpoint with its
/// own label, the count of those sharing `other`; 0 again once closed.
fn set_gauges(view: &mut View, metrics: &AttemptMetrics) {
    let mut counts: HashMap<String, f64> = HashMap::new();
    for ep in view.broken.keys() {
        *counts.entry(metrics.label(ep)).or_default() += 1.0;
    }
    for gone in view.gauged.iter().filter(|l| !counts.contains_key(*l)) {
        crate::metrics::circuit_open(gone, 0.0);
    }
    for (label, n) in &counts {
        crate::metrics::circuit_open(label, *n);
    }
    view.gauged = counts.into_keys().collect();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn half_open_here(b: &Breakers, ep: &EndpointId, since: Millis) {
        let circuit = Circuit {
            state: CircuitState::HalfOpen,
            since: Some(since),
            probe_by: Some(b.me.clone()),
            ..Circuit::default()
        };
        b.view().broken.insert(
            ep.clone(),
            Entry {
                circuit,
                probe_taken: false,
            },
        );
    }

    #[test]
    fn a_won_probe_is_given_to_one_claim_whatever_lanes_withhold() {
        let b = Breakers::new(BreakerRule::default(), Duration::from_secs(60));
        let ep = EndpointId::generate();
        half_open_here(&b, &ep, 1_000);
        // A narrowed lane counts 100 of 128 as taken; nothing is registered.
        let mut in_flight = HashMap::from([(ep.clone(), 100)]);
        let probing = b.shape(&mut in_flight, 128, true, |_| 0);
        assert_eq!(probing, vec![ep.clone()]);
        assert_eq!(in_flight[&ep], 127, "room for one");
        // Taken: the next claim, and any handoff, get none.
        let mut next = HashMap::new();
        assert!(b.shape(&mut next, 128, true, |_| 0).is_empty());
        assert_eq!(next[&ep], 128);
        // The claim found nothing due: the probe is there for the next one.
        b.settle(&probing, |_| false);
        let mut handoff = HashMap::new();
        assert!(b.shape(&mut handoff, 128, false, |_| 0).is_empty());
        assert_eq!(handoff[&ep], 128, "never in a handoff");
        let mut busy = HashMap::new();
        assert!(
            b.shape(&mut busy, 128, true, |_| 1).is_empty(),
            "one already registered here"
        );
        let mut again = HashMap::new();
        assert_eq!(b.shape(&mut again, 128, true, |_| 0), vec![ep.clone()]);
        // At the gate: only what was claimed since the probe was won goes.
        assert!(b.holds(&ep, 999));
        assert!(!b.holds(&ep, 1_000));
        assert!(!b.holds(&EndpointId::generate(), 0));
    }

    #[test]
    fn open_gets_no_room_and_off_shapes_nothing() {
        let b = Breakers::new(BreakerRule::default(), Duration::from_secs(60));
        let ep = EndpointId::generate();
        let metrics = AttemptMetrics::new(10);
        b.note(
            &[CircuitChange {
                endpoint_id: ep.clone(),
                app_id: crate::ids::AppId::generate(),
                transition: Transition::Reopened,
                circuit: Circuit {
                    state: CircuitState::Open,
                    since: Some(0),
                    until: Some(60_000),
                    cooldown_ms: 60_000,
                    ..Circuit::default()
                },
            }],
            &metrics,
        );
        let mut in_flight = HashMap::new();
        assert!(b.shape(&mut in_flight, 64, true, |_| 0).is_empty());
        assert_eq!(in_flight[&ep], 64);
        assert!(b.holds(&ep, 10_000));
        assert_eq!(b.next_change(5), Some(60_000));

        let off = Breakers::new(BreakerRule::OFF, Duration::from_secs(60));
        half_open_here(&off, &ep, 0);
        let mut untouched = HashMap::new();
        assert!(off.shape(&mut untouched, 64, true, |_| 0).is_empty());
        assert!(untouched.is_empty());
        assert!(!off.holds(&ep, 0));
    }
}

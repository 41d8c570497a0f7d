//! Keeps a throttled endpoint's actual sends within its rate.
//!
//! The claim gives each throttled delivery a send slot, spaced so that
//! sends up to `THROTTLE_DRIFT_US` late still fit the rate. A send can be
//! later than that: its timer fires late on a loaded host, or it waited at
//! its endpoint's gate. A late send then lands in the same second as
//! on-time sends a second after it, and the receiver sees rate + 2 or more.
//! The pacer closes that gap in this process: it keeps the times of an
//! endpoint's last `rate` sends, and a send goes only once the oldest of
//! them is a second old, so no one-second window holds more than `rate`
//! sends from here. Sends that are on time never wait; a late one waits at
//! most until the send `rate` places before it is a second old.
//!
//! In memory and per process: across processes sharing a PostgreSQL
//! database, the claim's slots (and their drift margin) are the bound.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::ids::EndpointId;

/// The window the rate counts in.
const WINDOW: Duration = Duration::from_secs(1);

/// Every this many turns, endpoints that sent nothing for a window are
/// forgotten (their history can no longer hold anyone back).
const PRUNE_EVERY: u32 = 4096;

#[derive(Default)]
pub struct Pacer {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Per endpoint, its recent sends' times, oldest first.
    sent: HashMap<EndpointId, VecDeque<Instant>>,
    turns: u32,
}

impl Pacer {
    /// Takes a turn to send to `endpoint` at `rate` per second now, if the
    /// last second holds fewer than `rate` of its sends; otherwise says
    /// when to ask again.
    pub fn try_turn(&self, endpoint: &EndpointId, rate: u32, now: Instant) -> Result<(), Instant> {
        let rate = usize::try_from(rate.max(1)).unwrap_or(usize::MAX);
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.turns = inner.turns.wrapping_add(1);
        if inner.turns.is_multiple_of(PRUNE_EVERY) {
            inner
                .sent
                .retain(|_, times| times.back().is_some_and(|t| now < *t + WINDOW));
        }
        let times = inner.sent.entry(endpoint.clone()).or_default();
        // A lowered rate counts only the newest `rate` sends.
        while times.len() > rate {
            times.pop_front();
        }
        if times.len() == rate {
            let free_at = times.front().map_or(now, |oldest| *oldest + WINDOW);
            if now < free_at {
                return Err(free_at);
            }
            times.pop_front();
        }
        times.push_back(now);
        Ok(())
    }

    /// Waits for a turn to send to `endpoint` (at most one window, since
    /// the oldest send that holds it back is then a window old).
    pub async fn turn(&self, endpoint: &EndpointId, rate: u32) {
        loop {
            match self.try_turn(endpoint, rate, Instant::now()) {
                Ok(()) => return,
                Err(at) => {
                    crate::metrics::throttle_paced();
                    tokio::time::sleep_until(at).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(n: u8) -> EndpointId {
        EndpointId::from_trusted(format!("ep_{n:026}"))
    }

    /// The most turns any half-open window of one second holds.
    fn busiest_window(times: &[Instant]) -> usize {
        times
            .iter()
            .map(|start| {
                times
                    .iter()
                    .filter(|t| **t >= *start && **t < *start + WINDOW)
                    .count()
            })
            .max()
            .unwrap_or(0)
    }

    #[tokio::test(start_paused = true)]
    async fn late_sends_beside_on_time_ones_stay_within_the_rate() {
        let pacer = std::sync::Arc::new(Pacer::default());
        let ep = endpoint(1);
        let rate = 10;
        // Slots 100 ms apart; the first three fire 300 ms late, so
        // without the pacer four sends share the second after them.
        let start = Instant::now();
        let mut tasks = Vec::new();
        for n in 0..30u64 {
            let late = if n < 3 { 300 } else { 0 };
            let (pacer, ep) = (pacer.clone(), ep.clone());
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep_until(start + Duration::from_millis(n * 100 + late)).await;
                pacer.turn(&ep, rate).await;
                Instant::now()
            }));
        }
        let mut times = Vec::new();
        for t in tasks {
            times.push(t.await.expect("task"));
        }
        times.sort();
        assert_eq!(busiest_window(&times), 10, "{times:?}");
        // Nothing waited longer than the lateness it made up for.
        let last = times.last().copied().expect("30 sends");
        assert!(
            last - start <= Duration::from_millis(2_900 + 300),
            "{:?}",
            last - start
        );
    }

    #[test]
    fn on_time_sends_never_wait_and_a_burst_is_cut_at_the_rate() {
        let pacer = Pacer::default();
        let (a, b) = (endpoint(1), endpoint(2));
        let t0 = Instant::now();
        for n in 0..5 {
            assert_eq!(pacer.try_turn(&a, 5, t0 + Duration::from_millis(n)), Ok(()));
        }
        // The sixth within the second waits for the first to be a second old.
        assert_eq!(
            pacer.try_turn(&a, 5, t0 + Duration::from_millis(10)),
            Err(t0 + WINDOW)
        );
        // Another endpoint is not held back.
        assert_eq!(
            pacer.try_turn(&b, 5, t0 + Duration::from_millis(10)),
            Ok(())
        );
        assert_eq!(pacer.try_turn(&a, 5, t0 + WINDOW), Ok(()));
        // A lowered rate counts only the newest sends.
        assert_eq!(
            pacer.try_turn(&a, 1, t0 + WINDOW + Duration::from_millis(1)),
            Err(t0 + WINDOW + WINDOW)
        );
    }
}

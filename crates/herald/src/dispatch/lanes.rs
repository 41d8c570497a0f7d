//! Lanes: how many deliveries each endpoint may hold in this process, sized
//! by how it answers (`herald_policy::next_lane`), so that sending slots
//! follow where requests finish.
//!
//! A fixed cap per endpoint let ten stuck endpoints × 2 × 64 claims take
//! every one of 512 slots, and the 90 healthy endpoints beside them waited
//! for the stuck ones' timeouts (healthy p99 25× the all-healthy run). A
//! lane starts small, widens by one per prompt answer (doubling per round
//! trip up to the cap), and halves at a slow answer while other deliveries
//! want slots. The claim and the ingest handoff see a narrow lane as an
//! endpoint with that much less room (the store's interface is unchanged:
//! the counts of claimed deliveries they get are raised by what the lane
//! withholds).
//!
//! Everything here is memory, per process, a lock per finished request: no
//! store round trip. An endpoint this process has no delivery of and never
//! slowed, whether it has not seen it yet (after a restart, or two minutes
//! idle) or its lane is only starting out, gets a new lane's room in a
//! claim ([`Lanes::narrow`]'s answer, the claim's `unlisted_cap`), never
//! its whole cap: ten stuck endpoints with backlogs once took 128 slots
//! each in their first claims after a restart, and healthy endpoints
//! waited seconds. Once it has deliveries here its lane decides. A claim
//! thus looks only at the lanes of endpoints with deliveries here, of
//! slowed ones and of wide ones used in the last seconds, not at every
//! lane of the last minutes.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use herald_policy::{next_lane, LaneRule};

use crate::ids::EndpointId;
use crate::store::{now_millis, Millis};

/// A lane nobody used for this long is forgotten (the endpoint starts
/// afresh), which bounds the map by the endpoints of the last minutes.
const FORGET_AFTER: Duration = Duration::from_secs(120);
/// How often the forgetting runs (it walks every lane).
const SWEEP_EVERY: Duration = Duration::from_secs(10);
/// "Other deliveries want slots" lasts this long after it was last seen.
const CONTENDED_FOR: Millis = 1_000;
/// A lane wider than a new one's, used this recently, keeps its room in a
/// claim even while the endpoint has nothing in flight here: a busy
/// endpoint whose requests all finished between two claims must not start
/// over at a new lane's room.
const RECENTLY_USED: Duration = Duration::from_secs(2);

pub struct Lanes {
    rule: LaneRule,
    lanes: Mutex<LaneMap>,
    /// When a claim or a handoff last found fewer free slots than it could
    /// use (ms since the epoch; 0: never).
    contended_at: AtomicI64,
}

struct Lane {
    size: usize,
    used_at: Instant,
}

struct LaneMap {
    by_endpoint: HashMap<EndpointId, Lane>,
    /// Endpoints whose lane a slow answer narrowed and that have not
    /// widened back to the cap: withheld from even while idle here.
    slowed: HashSet<EndpointId>,
    swept_at: Instant,
}

impl LaneMap {
    /// Forgets the lanes unused for [`FORGET_AFTER`], every
    /// [`SWEEP_EVERY`] at most.
    fn sweep(&mut self, now: Instant) {
        if now.duration_since(self.swept_at) < SWEEP_EVERY {
            return;
        }
        self.swept_at = now;
        self.by_endpoint
            .retain(|_, l| now.duration_since(l.used_at) < FORGET_AFTER);
        let by_endpoint = &self.by_endpoint;
        self.slowed.retain(|ep| by_endpoint.contains_key(ep));
    }
}

impl Lanes {
    pub fn new(endpoint_cap: usize) -> Self {
        Lanes {
            rule: LaneRule::for_cap(endpoint_cap),
            lanes: Mutex::new(LaneMap {
                by_endpoint: HashMap::new(),
                slowed: HashSet::new(),
                swept_at: Instant::now(),
            }),
            contended_at: AtomicI64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LaneMap> {
        self.lanes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Some claim or handoff wanted more slots than were free.
    pub fn contended(&self) {
        self.contended_at.store(now_millis(), Ordering::Relaxed);
    }

    fn is_contended(&self) -> bool {
        now_millis().saturating_sub(self.contended_at.load(Ordering::Relaxed)) < CONTENDED_FOR
    }

    /// A delivery of `ep` was claimed: its lane exists from now on.
    pub fn claimed(&self, ep: &EndpointId) {
        let mut lanes = self.lock();
        let now = Instant::now();
        lanes
            .by_endpoint
            .entry(ep.clone())
            .and_modify(|l| l.used_at = now)
            .or_insert(Lane {
                size: self.rule.start,
                used_at: now,
            });
    }

    /// A request to `ep` finished (answered or not) after `took`.
    pub fn finished(&self, ep: &EndpointId, took: Duration) {
        let contended = self.is_contended();
        let mut lanes = self.lock();
        let Some(lane) = lanes.by_endpoint.get_mut(ep) else {
            return;
        };
        let was = lane.size;
        lane.size = next_lane(&self.rule, was, took, contended);
        lane.used_at = Instant::now();
        let size = lane.size;
        if size < was {
            lanes.slowed.insert(ep.clone());
        } else if size >= self.rule.cap {
            lanes.slowed.remove(ep);
        }
    }

    /// Raises `in_flight` (claimed deliveries per endpoint, as a claim
    /// counts them against `room_per_lane_slot × cap`) by what each narrow
    /// lane withholds, so the claim gives such an endpoint
    /// `room_per_lane_slot × lane` at most: the endpoints listed (those
    /// with deliveries here) and the slowed ones. Returns the room of an
    /// endpoint left unlisted (the claim's `unlisted_cap`): a new lane's,
    /// `room_per_lane_slot × start`. Costs what those are, not every lane
    /// known.
    pub fn narrow(
        &self,
        in_flight: &mut HashMap<EndpointId, usize>,
        room_per_lane_slot: usize,
    ) -> usize {
        let mut lanes = self.lock();
        lanes.sweep(Instant::now());
        let cap = self.rule.cap;
        let withheld =
            |lane: &Lane| (cap.saturating_sub(lane.size)).saturating_mul(room_per_lane_slot);
        for (ep, count) in in_flight.iter_mut() {
            if let Some(lane) = lanes.by_endpoint.get(ep) {
                *count = count.saturating_add(withheld(lane));
            }
        }
        for ep in &lanes.slowed {
            if in_flight.contains_key(ep) {
                continue;
            }
            if let Some(lane) = lanes.by_endpoint.get(ep) {
                in_flight.insert(ep.clone(), withheld(lane));
            }
        }
        let now = Instant::now();
        for (ep, lane) in &lanes.by_endpoint {
            if lane.size > self.rule.start
                && now.duration_since(lane.used_at) < RECENTLY_USED
                && !in_flight.contains_key(ep)
            {
                in_flight.insert(ep.clone(), withheld(lane));
            }
        }
        self.rule.start.saturating_mul(room_per_lane_slot)
    }

    /// The lane of `ep`, if this process has one (tests, the dashboard).
    pub fn size_of(&self, ep: &EndpointId) -> Option<usize> {
        self.lock().by_endpoint.get(ep).map(|l| l.size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stuck_endpoint_beside_busy_ones_is_left_a_few_slots() {
        let lanes = Lanes::new(64);
        let (stuck, healthy) = (EndpointId::generate(), EndpointId::generate());
        lanes.claimed(&stuck);
        lanes.claimed(&healthy);
        for _ in 0..100 {
            lanes.finished(&healthy, Duration::from_millis(2));
        }
        lanes.contended();
        lanes.finished(&stuck, Duration::from_secs(5));
        assert_eq!(lanes.size_of(&healthy), Some(64));
        assert_eq!(lanes.size_of(&stuck), Some(2), "4 halved");

        let mut in_flight = HashMap::from([(stuck.clone(), 3)]);
        let unlisted = lanes.narrow(&mut in_flight, 2);
        // The claim's room is 2 × 64 − count: 2 × 2 − 3 = 1 for the stuck
        // one, the whole 128 for the healthy one (idle here, but used just
        // now: listed with nothing withheld); an unseen one gets 2 × 4.
        assert_eq!(in_flight.get(&stuck), Some(&(3 + 2 * 62)));
        assert_eq!(in_flight.get(&healthy), Some(&0));
        assert_eq!(unlisted, 2 * 4);
    }

    #[test]
    fn a_claim_weighs_the_lanes_of_busy_and_slowed_endpoints_only() {
        let lanes = Lanes::new(64);
        let (busy, slowed, young, wide) = (
            EndpointId::generate(),
            EndpointId::generate(),
            EndpointId::generate(),
            EndpointId::generate(),
        );
        for ep in [&busy, &slowed, &young, &wide] {
            lanes.claimed(ep);
        }
        for _ in 0..100 {
            lanes.finished(&wide, Duration::from_millis(2));
        }
        lanes.contended();
        lanes.finished(&slowed, Duration::from_secs(5));
        assert_eq!(lanes.size_of(&slowed), Some(2));
        assert_eq!(lanes.size_of(&young), Some(4));
        // `busy` has 3 here; the others none.
        let mut in_flight = HashMap::from([(busy.clone(), 3), (wide.clone(), 1)]);
        lanes.narrow(&mut in_flight, 2);
        assert_eq!(in_flight.get(&busy), Some(&(3 + 2 * 60)), "lane 4 of 64");
        assert_eq!(
            in_flight.get(&wide),
            Some(&1),
            "at the cap: nothing withheld"
        );
        assert_eq!(
            in_flight.get(&slowed),
            Some(&(2 * 62)),
            "slowed, idle or not"
        );
        assert_eq!(
            in_flight.get(&young),
            None,
            "idle and only starting out: a new lane's room, as an unseen endpoint"
        );
        // Widened back to the cap, it is not slowed any more; used just
        // now, it keeps its whole room while idle here.
        for _ in 0..100 {
            lanes.finished(&slowed, Duration::from_millis(2));
        }
        let mut in_flight = HashMap::new();
        lanes.narrow(&mut in_flight, 2);
        assert_eq!(in_flight.get(&slowed), Some(&0), "{in_flight:?}");
        assert_eq!(in_flight.get(&young), None, "{in_flight:?}");
    }

    #[test]
    fn without_contention_a_slow_endpoint_widens() {
        let lanes = Lanes::new(64);
        let slow = EndpointId::generate();
        lanes.claimed(&slow);
        lanes.finished(&slow, Duration::from_secs(5));
        assert_eq!(lanes.size_of(&slow), Some(5));
    }
}

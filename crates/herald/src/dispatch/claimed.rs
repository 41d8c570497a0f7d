//! What this process has claimed and not finished: the count of free
//! slots, each endpoint's registered deliveries and gate, the endpoints
//! left short of room, and the stop marks that keep a disabled or gone
//! endpoint's claimed deliveries from being sent.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, Semaphore};

use super::*;

/// Claimed deliveries not yet finished, in total and per endpoint, and
/// each endpoint's gate that lets `endpoint_cap` of them send at once.
pub(super) struct Claimed {
    pub(super) slots: Mutex<Slots>,
    /// Signalled whenever a claimed delivery is finished or released, or
    /// reserved slots are given back.
    pub(super) freed: Notify,
    /// Signalled when a delivery of an endpoint the loop's last claim left
    /// short of room (see [`Slots::short_of_room`]) is finished or
    /// released: only then may a claim find more for it.
    pub(super) room: Notify,
}

#[derive(Default)]
pub(super) struct Slots {
    pub(super) per_endpoint: HashMap<EndpointId, EndpointSlots>,
    /// Registered deliveries, over all endpoints.
    pub(super) claimed: usize,
    /// Slots promised to a claim (of the loop, or of an ingest batch's
    /// handoff) whose deliveries are not registered yet.
    pub(super) reserved: usize,
    /// Shutting down: no more reservations.
    pub(super) closed: bool,
    /// The endpoints whose room the loop's last claim used up (their due
    /// deliveries, if more, were left for want of room). A finished
    /// request of any other endpoint gives a claim nothing new to find:
    /// waking the loop for each one made a claim per finished request
    /// beside a stuck endpoint's due backlog, hundreds a second, each
    /// finding nothing.
    pub(super) short_of_room: std::collections::HashSet<EndpointId>,
    /// Endpoints that answered 410 here whose disabling the completer has
    /// not recorded yet: until it has, the store still offers their
    /// deliveries to claims, so none of them is sent, whenever claimed.
    /// Kept apart from `per_endpoint`, whose entries go with their last
    /// delivery.
    pub(super) gone_unrecorded: std::collections::HashSet<EndpointId>,
}

/// One endpoint's registered deliveries, while it has any.
pub(super) struct EndpointSlots {
    pub(super) registered: usize,
    pub(super) gate: Arc<Semaphore>,
    /// When the endpoint was last disabled (or answered 410) as far as this
    /// process knows: deliveries claimed before then are not sent.
    pub(super) stopped_at: Option<crate::store::Millis>,
}

/// What a claim promised one delivery: when it was claimed and until when
/// its lease lasts.
#[derive(Debug, Clone, Copy)]
pub(super) struct Lease {
    pub(super) claimed_at: crate::store::Millis,
    pub(super) until: crate::store::Millis,
}

impl Claimed {
    pub(super) fn new() -> Self {
        Claimed {
            slots: Mutex::new(Slots::default()),
            freed: Notify::new(),
            room: Notify::new(),
        }
    }

    pub(super) fn slots(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reserves up to `want` of the `max` slots that are neither claimed
    /// nor reserved, and returns how many with each endpoint's count of
    /// claimed deliveries. Reserving is what keeps the loop's claims and
    /// ingest's handoffs from both filling the same free slots.
    pub(super) fn reserve(&self, max: usize, want: usize) -> (usize, HashMap<EndpointId, usize>) {
        let mut slots = self.slots();
        let taken = slots.claimed + slots.reserved;
        let n = if slots.closed {
            0
        } else {
            max.saturating_sub(taken).min(want)
        };
        slots.reserved += n;
        let counts = slots
            .per_endpoint
            .iter()
            .map(|(k, e)| (k.clone(), e.registered))
            .collect();
        (n, counts)
    }

    /// Gives back `n` reserved slots (those used were registered by `add`
    /// meanwhile). `max`: wake the loop if it may be waiting for a slot,
    /// that is if all `max` were taken before.
    pub(super) fn unreserve(&self, n: usize, max: Option<usize>) {
        if n == 0 {
            return;
        }
        let was_full = {
            let mut slots = self.slots();
            let taken = slots.claimed + slots.reserved;
            slots.reserved -= n;
            max.is_some_and(|max| taken >= max)
        };
        if was_full {
            self.freed.notify_one();
        }
    }

    /// Deliveries registered for `ep` (claimed, not finished).
    pub(super) fn registered(&self, ep: &EndpointId) -> usize {
        self.slots()
            .per_endpoint
            .get(ep)
            .map_or(0, |e| e.registered)
    }

    /// Claimed or reserved, in all.
    pub(super) fn busy(&self) -> usize {
        let slots = self.slots();
        slots.claimed + slots.reserved
    }

    pub(super) fn close(&self) {
        self.slots().closed = true;
    }

    /// Registers a claimed delivery; returns its endpoint's gate.
    pub(super) fn add(&self, ep: &EndpointId, cap: usize) -> Arc<Semaphore> {
        let mut slots = self.slots();
        slots.claimed += 1;
        let entry = slots
            .per_endpoint
            .entry(ep.clone())
            .or_insert_with(|| EndpointSlots {
                registered: 0,
                gate: Arc::new(Semaphore::new(cap)),
                stopped_at: None,
            });
        entry.registered += 1;
        entry.gate.clone()
    }

    pub(super) fn remove(&self, ep: &EndpointId) {
        let short_of_room = {
            let mut slots = self.slots();
            slots.claimed -= 1;
            if let Some(entry) = slots.per_endpoint.get_mut(ep) {
                entry.registered -= 1;
                if entry.registered == 0 {
                    // Its stop mark concerned only the deliveries it held.
                    slots.per_endpoint.remove(ep);
                }
            }
            slots.short_of_room.contains(ep)
        };
        self.freed.notify_one();
        if short_of_room {
            self.room.notify_one();
        }
    }

    /// After a claim: the endpoints it left without room.
    pub(super) fn set_short_of_room(&self, endpoints: std::collections::HashSet<EndpointId>) {
        self.slots().short_of_room = endpoints;
    }

    /// The endpoint was disabled (or answered 410) at `at`: the deliveries
    /// registered for it, claimed before then, are released rather than
    /// sent when its gate lets them through. Those claimed later saw the
    /// store's word on the endpoint and are sent.
    pub(super) fn stop(&self, ep: &EndpointId, at: crate::store::Millis) {
        if let Some(entry) = self.slots().per_endpoint.get_mut(ep) {
            entry.stopped_at = Some(entry.stopped_at.map_or(at, |s| s.max(at)));
        }
    }

    pub(super) fn is_stopped(&self, ep: &EndpointId, claimed_at: crate::store::Millis) -> bool {
        let slots = self.slots();
        slots.gone_unrecorded.contains(ep)
            || slots
                .per_endpoint
                .get(ep)
                .and_then(|e| e.stopped_at)
                .is_some_and(|at| claimed_at <= at)
    }

    /// `ep` answered 410: nothing of it is sent until the completer has
    /// recorded that (and so disabled it in the store).
    pub(super) fn hold_until_recorded(&self, ep: &EndpointId) {
        self.slots().gone_unrecorded.insert(ep.clone());
    }

    /// The 410 of `ep` is recorded (it is disabled in the store): claims
    /// from now on see that, and the stop mark covers those made before.
    /// Also when the 410 could not be recorded at all: then the endpoint is
    /// as the store has it (enabled), and is sent to again.
    pub(super) fn gone_recorded(&self, ep: &EndpointId) {
        self.slots().gone_unrecorded.remove(ep);
    }
}

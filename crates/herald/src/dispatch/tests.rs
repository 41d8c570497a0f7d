use super::*;

#[test]
fn reservations_and_claims_share_the_free_slots() {
    let c = Claimed::new();
    let ep = EndpointId::generate();
    let _gate = c.add(&ep, 2);
    // One of four slots is claimed; a batch asks for more than is left.
    let (first, counts) = c.reserve(4, 10);
    assert_eq!(first, 3);
    assert_eq!(counts.get(&ep), Some(&1));
    // Nothing is left for the loop or another batch until they settle.
    assert_eq!(c.reserve(4, 10).0, 0);
    assert_eq!(c.busy(), 4);
    // The batch used one slot (registered) and gives its three back.
    let _gate = c.add(&ep, 2);
    c.unreserve(first, Some(4));
    assert_eq!(c.busy(), 2);
    use futures::FutureExt;
    assert!(
        c.freed.notified().now_or_never().is_some(),
        "all slots were taken: the loop may be waiting and is woken"
    );
    assert_eq!(c.reserve(4, 1).0, 1, "at most what is asked for");
    c.unreserve(1, Some(4));
    assert!(
        c.freed.notified().now_or_never().is_none(),
        "slots were free all along: the loop is not woken for nothing"
    );
}

#[test]
fn the_endpoints_a_claim_left_without_room() {
    let (full, filled, roomy, idle) = (
        EndpointId::generate(),
        EndpointId::generate(),
        EndpointId::generate(),
        EndpointId::generate(),
    );
    // Room for 4 each: `full` held 4 already; `filled` held 1 and got 3;
    // `roomy` held 1 and got 1; `idle` held 3 and got none.
    let in_flight = HashMap::from([
        (full.clone(), 4),
        (filled.clone(), 1),
        (roomy.clone(), 1),
        (idle.clone(), 3),
    ]);
    let claimed = [&filled, &filled, &filled, &roomy];
    let short = short_of_room(&in_flight, (4, 2), claimed);
    assert_eq!(short, [full, filled].into_iter().collect());
    // A first claim's endpoint (not counted before) given all of an
    // unlisted endpoint's room (2), though less than a listed one's.
    let first = EndpointId::generate();
    let short = short_of_room(&HashMap::new(), (4, 2), [&first, &first]);
    assert_eq!(short, [first.clone()].into_iter().collect());
    let short = short_of_room(&HashMap::new(), (4, 3), [&first, &first]);
    assert!(short.is_empty(), "{short:?}");
}

#[test]
fn only_an_endpoint_short_of_room_wakes_the_loop_for_room() {
    use futures::FutureExt;
    let c = Claimed::new();
    let (busy, other) = (EndpointId::generate(), EndpointId::generate());
    let _gates = (c.add(&busy, 1), c.add(&busy, 1), c.add(&other, 1));
    c.set_short_of_room([busy.clone()].into_iter().collect());
    c.remove(&other);
    assert!(
        c.room.notified().now_or_never().is_none(),
        "a finished request of an endpoint with room left gives a claim nothing new"
    );
    assert!(c.freed.notified().now_or_never().is_some());
    c.remove(&busy);
    assert!(
        c.room.notified().now_or_never().is_some(),
        "the endpoint the claim left short has room again"
    );
}

#[test]
fn a_closed_dispatcher_reserves_nothing() {
    let c = Claimed::new();
    c.close();
    assert_eq!(c.reserve(4, 4).0, 0);
    assert_eq!(c.busy(), 0);
}

//! What a client written for Svix relies on beyond the shapes of its
//! calls, read in svix-server's source: how a list filtered by `after`
//! pages, which status a delivery waiting for its retry has, which lists
//! are newest first, what creating an archived event type does.

use axum::http::StatusCode;
use serde_json::json;

use crate::helpers::*;

crate::on_both_stores!(
    a_list_after_a_time_starts_at_its_oldest_and_walks_on_with_prev_iterator,
    a_repeat_waits_for_the_first_request_with_its_key,
);

/// `after` alone pages as Svix does: the first page is the oldest items
/// after the time (newest first within it) and `prevIterator` walks on
/// towards now, so a client syncing "everything since" sees every item.
/// The first page was the newest, and its `prevIterator` led nowhere: the
/// items between were never listed. An item of `after`'s own millisecond
/// is listed too (it was left out).
async fn a_list_after_a_time_starts_at_its_oldest_and_walks_on_with_prev_iterator(
    backend: &Backend,
) {
    let app = backend.spawn_stepped(&[]).await;
    let rx = Receiver::start().await;
    let app_id = app.create_app().await;
    let ep = app.create_endpoint(&app_id, &rx.url("/"), json!({})).await;
    let ep = ep["id"].as_str().expect("id");
    let mut sent = Vec::new();
    for n in 0..6 {
        let id = app.send_message(&app_id, "a.b", json!({ "n": n })).await;
        let (_, msg) = app.get(&format!("/api/v1/app/{app_id}/msg/{id}")).await;
        sent.push((id, msg["timestamp"].as_str().expect("timestamp").to_owned()));
        // Each message its own millisecond, so `after` can fall between.
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    }
    app.step().await;
    rx.wait_for(6).await;
    // The third message's own time: `after` includes its millisecond, as
    // Svix's does (an id above the first one of that millisecond).
    let after = urlencoding(&sent[2].1);
    let listed = |v: &serde_json::Value, field: &str| -> Vec<String> {
        v["data"]
            .as_array()
            .unwrap_or_else(|| panic!("{v}"))
            .iter()
            .map(|x| x[field].as_str().expect("field").to_owned())
            .collect()
    };
    let ids = |range: std::ops::Range<usize>| -> Vec<String> {
        sent[range].iter().rev().map(|(id, _)| id.clone()).collect()
    };
    for (path, field) in [
        (format!("/api/v1/app/{app_id}/msg"), "id"),
        (format!("/api/v1/app/{app_id}/endpoint/{ep}/msg"), "id"),
    ] {
        let (_, first) = app.get(&format!("{path}?limit=2&after={after}")).await;
        assert_eq!(listed(&first, field), ids(2..4), "{path}: {first}");
        assert_eq!(first["done"], false, "{path}");
        let prev = first["prevIterator"].as_str().expect("prevIterator");
        let (_, next) = app
            .get(&format!("{path}?limit=2&after={after}&iterator={prev}"))
            .await;
        assert_eq!(listed(&next, field), ids(4..6), "{path}: {next}");
        let prev = next["prevIterator"].as_str().expect("prevIterator");
        let (_, last) = app
            .get(&format!("{path}?limit=2&after={after}&iterator={prev}"))
            .await;
        assert_eq!(listed(&last, field), ids(6..6), "{path}: {last}");
        assert_eq!(last["done"], true, "{path}");
        // Ascending, the same items from the oldest, `iterator` going on.
        let (_, up) = app
            .get(&format!("{path}?limit=4&after={after}&order=ascending"))
            .await;
        let mut oldest_first = ids(2..6);
        oldest_first.reverse();
        assert_eq!(listed(&up, field), oldest_first, "{path}: {up}");
    }
    app.shutdown().await;
}

/// An RFC 3339 time as a query value (`+` would read as a space).
fn urlencoding(time: &str) -> String {
    time.replace('+', "%2B").replace(':', "%3A")
}

/// Creating an event type that was archived brings it back with the
/// fields given (201), as Svix's create does; a live one is a 409 that
/// names it. An "ensure it exists" script that took 409 as done left the
/// type archived.
#[tokio::test]
async fn creating_an_archived_event_type_brings_it_back() {
    let app = spawn_stepped(&[]).await;
    let body = json!({"name": "order.shipped", "description": "first"});
    let (s, _) = app.post("/api/v1/event-type", body.clone()).await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, out) = app.post("/api/v1/event-type", body).await;
    assert_eq!(s, StatusCode::CONFLICT, "{out}");
    assert!(
        out["detail"]
            .as_str()
            .is_some_and(|d| d.contains("order.shipped")),
        "{out}"
    );
    let (s, _) = app.delete("/api/v1/event-type/order.shipped").await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, out) = app
        .post(
            "/api/v1/event-type",
            json!({"name": "order.shipped", "description": "again"}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{out}");
    let (_, got) = app.get("/api/v1/event-type/order.shipped").await;
    assert_eq!(
        (&got["archived"], &got["description"]),
        (&json!(false), &json!("again"))
    );
    app.shutdown().await;
}

/// A delivery waiting for its retry is `sending` (3), as Svix shows one
/// with a next attempt set, and `status=3` finds it; `pending` (1) is
/// only a delivery not yet tried. A retry was shown as 1, and a client
/// looking for what is being retried with `status=3` found nothing.
#[tokio::test]
async fn a_delivery_waiting_for_its_retry_is_sending() {
    let app = spawn_stepped(&[("HERALD_RETRY_SCHEDULE", "1h")]).await;
    let rx = Receiver::start().await;
    rx.script([Reply::status(500)]);
    let (app_id, ep) = app.app_with_endpoint(&rx.url("/"), json!({})).await;
    let msg = app.send_message(&app_id, "a.b", json!({})).await;
    let list = |status: &str| format!("/api/v1/app/{app_id}/endpoint/{ep}/msg?status={status}");
    let statuses = |v: &serde_json::Value| -> Vec<(String, serde_json::Value)> {
        v["data"]
            .as_array()
            .unwrap_or_else(|| panic!("{v}"))
            .iter()
            .map(|m| {
                (
                    m["id"].as_str().unwrap_or_default().to_owned(),
                    m["statusText"].clone(),
                )
            })
            .collect()
    };
    let (_, before) = app.get(&list("1")).await;
    assert_eq!(
        statuses(&before),
        [(msg.clone(), json!("pending"))],
        "not tried yet"
    );
    app.step().await;
    rx.wait_for(1).await;
    let (_, retrying) = app.get(&list("3")).await;
    assert_eq!(statuses(&retrying), [(msg.clone(), json!("sending"))]);
    assert_eq!(retrying["data"][0]["status"], 3);
    let (_, pending) = app.get(&list("1")).await;
    assert_eq!(statuses(&pending), []);
    let (_, destinations) = app
        .get(&format!("/api/v1/app/{app_id}/msg/{msg}/endpoint"))
        .await;
    assert_eq!(destinations["data"][0]["status"], 3, "{destinations}");
    app.shutdown().await;
}

/// An application's endpoints list newest first unless asked otherwise,
/// as Svix lists them (its applications, oldest first).
#[tokio::test]
async fn endpoints_list_newest_first_by_default() {
    let app = spawn_stepped(&[]).await;
    let app_id = app.create_app().await;
    let mut made = Vec::new();
    for n in 0..3 {
        let ep = app
            .create_endpoint(&app_id, &format!("http://127.0.0.1:9/{n}"), json!({}))
            .await;
        made.push(ep["id"].as_str().expect("id").to_owned());
    }
    let ids = |v: &serde_json::Value| -> Vec<String> {
        v["data"]
            .as_array()
            .unwrap_or_else(|| panic!("{v}"))
            .iter()
            .map(|e| e["id"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    let path = format!("/api/v1/app/{app_id}/endpoint");
    let (_, newest) = app.get(&path).await;
    let (_, oldest) = app.get(&format!("{path}?order=ascending")).await;
    assert_eq!(ids(&oldest), made);
    made.reverse();
    assert_eq!(ids(&newest), made);
    app.shutdown().await;
}

/// A repeat sent while the request with its `Idempotency-Key` is still
/// running waits for it, as Svix waits (up to 5 s): it gets the first
/// one's answer once kept, or runs itself when the first kept none (a
/// refusal, a crash); one still running after the wait is refused (409),
/// never run twice. It was refused at once, and a client that timed out
/// and retried took the 409 for a failure. The first request is played
/// here by the store's own calls, holding the key as a running request
/// does.
async fn a_repeat_waits_for_the_first_request_with_its_key(backend: &Backend) {
    use axum::http::{Method, Uri};
    use herald::store::IdemKey;

    let app = backend.spawn_stepped(&[]).await;
    let app_id = app.create_app().await;
    let store = app.running().store.clone();
    let body = json!({"eventType": "a.b", "payload": {"n": 1}});
    // As the middleware keys it: the URL under `/api/v1`, the body's digest.
    let route = format!("/app/{app_id}/msg");
    let bytes = serde_json::to_vec(&body).expect("json");
    let uri: Uri = route.parse().expect("uri");
    let hashes = vec![hex::encode(herald::api::idempotency::request_digest(
        &Method::POST,
        &uri,
        &bytes,
    ))];
    let first_running = |key: &'static str| {
        let (store, scoped, hashes) = (store.clone(), format!("{key}\n{route}"), hashes.clone());
        async move {
            let now = herald::store::now_millis();
            let idem = IdemKey {
                key: &scoped,
                unscoped: Some(key),
            };
            let begun = store
                .idempotency_begin("admin", &idem, &hashes, now, now - 3_600_000, now - 60_000)
                .await
                .expect("begin");
            assert_eq!(begun, herald::store::IdemBegin::Fresh);
            scoped
        }
    };
    let admin = app.as_token(TOKEN);
    let path = format!("/api/v1{route}");
    let pause = || tokio::time::sleep(std::time::Duration::from_millis(600));

    // The first finishes while the repeat waits: its answer is the repeat's.
    let scoped = first_running("k-finished").await;
    let kept = r#"{"id":"msg_kept_by_the_first"}"#;
    let ((status, replayed, text), ()) =
        tokio::join!(admin.post_keyed(&path, "k-finished", body.clone()), async {
            pause().await;
            store
                .idempotency_finish("admin", &scoped, 202, kept)
                .await
                .expect("finish");
        });
    assert_eq!(
        (status, replayed, text.as_str()),
        (StatusCode::ACCEPTED, true, kept)
    );

    // The first ends without an answer kept: the repeat runs itself.
    let scoped = first_running("k-aborted").await;
    let ((status, replayed, text), ()) =
        tokio::join!(admin.post_keyed(&path, "k-aborted", body.clone()), async {
            pause().await;
            store
                .idempotency_abort("admin", &scoped)
                .await
                .expect("abort");
        });
    assert_eq!((status, replayed), (StatusCode::ACCEPTED, false), "{text}");
    assert!(text.contains("\"id\":\"msg_"), "{text}");

    // Still running after the wait: refused, and nothing stored.
    first_running("k-stuck").await;
    let (status, _, text) = admin.post_keyed(&path, "k-stuck", body.clone()).await;
    assert_eq!(status, StatusCode::CONFLICT, "{text}");
    assert!(text.contains("still in progress"), "{text}");
    let (_, listed) = app.get(&format!("/api/v1/app/{app_id}/msg")).await;
    assert_eq!(listed["data"].as_array().map(Vec::len), Some(1), "{listed}");
    app.shutdown().await;
}

//! Settings, applications, endpoints (writes, paging, secrets) and event types.

use super::*;

crate::on_both_stores!(store:
    settings_are_initialised_once,
    apps_and_endpoints_round_trip_and_resolve_uids,
    endpoint_updates_write_only_what_they_change,
    lists_page_in_stable_order_both_ways,
    deleting_an_endpoint_removes_its_deliveries,
    rotated_secrets_sign_until_their_grace_ends,
    event_types_are_created_listed_updated_and_deleted,
    apps_update_and_delete_with_everything_under_them,
);

async fn settings_are_initialised_once(store: Arc<dyn Store>) {
    assert_eq!(store.get_setting("k").await.expect("get"), None);
    assert_eq!(
        store.init_setting("k", "first").await.expect("init"),
        "first"
    );
    assert_eq!(
        store.init_setting("k", "second").await.expect("init"),
        "first"
    );
    assert_eq!(
        store.get_setting("k").await.expect("get").as_deref(),
        Some("first")
    );
    // put_setting replaces, and makes a key that was not there.
    store.put_setting("k", "third").await.expect("put");
    store.put_setting("other", "x").await.expect("put");
    assert_eq!(
        store.get_setting("k").await.expect("get").as_deref(),
        Some("third")
    );
    assert_eq!(
        store.get_setting("other").await.expect("get").as_deref(),
        Some("x")
    );
}

async fn apps_and_endpoints_round_trip_and_resolve_uids(store: Arc<dyn Store>) {
    let a = app(&store, Some("acme")).await;
    assert_eq!(
        store.get_app(a.id.as_str()).await.expect("get"),
        Some(a.clone())
    );
    assert_eq!(store.get_app("acme").await.expect("get"), Some(a.clone()));
    assert_eq!(store.get_app("nope").await.expect("get"), None);
    let dup = App {
        id: AppId::generate(),
        ..a.clone()
    };
    assert!(matches!(
        store.create_app(&dup).await,
        Err(StoreError::Conflict(_))
    ));

    let mut e = endpoint(&store, &a.id, Some(vec!["a.b"]), false).await;
    assert_eq!(
        store.get_endpoint(&a.id, e.id.as_str()).await.expect("get"),
        Some(e.clone())
    );
    let changes = EndpointChanges {
        uid: Some(Some("main".into())),
        filter_types: Some(None),
        ..EndpointChanges::default()
    };
    assert!(store
        .update_endpoint(&a.id, &e.id, &changes, T0 + 1)
        .await
        .expect("update"));
    e.uid = Some("main".into());
    e.filter_types = None;
    e.updated_at = T0 + 1;
    assert_eq!(
        store.get_endpoint(&a.id, "main").await.expect("get"),
        Some(e.clone())
    );
    let other = app(&store, None).await;
    assert_eq!(
        store
            .get_endpoint(&other.id, e.id.as_str())
            .await
            .expect("get"),
        None,
        "scoped to its app"
    );
    assert!(!store
        .update_endpoint(&other.id, &e.id, &changes, T0 + 2)
        .await
        .expect("update"));
}

/// An update writes the fields it is given and nothing else: not the
/// disabled flag and its cause, nor the secrets, nor the headers, nor the
/// fields it leaves out, whatever they became since the caller read them.
async fn endpoint_updates_write_only_what_they_change(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let e = endpoint(&store, &a.id, None, false).await;
    let headers: std::collections::BTreeMap<String, String> =
        [("X-Team".to_owned(), "blue".to_owned())].into();
    assert!(store
        .set_endpoint_headers(&a.id, &e.id, &headers, T0 + 1)
        .await
        .expect("headers"));
    assert!(store
        .disable_endpoint(&e.id, "by hand", false, None, T0 + 2)
        .await
        .expect("disable"));
    let rotated = herald_signing::Secret::generate().expose();
    assert!(store
        .rotate_secret(&a.id, &e.id, &rotated, T0 + 100_000, T0 + 3)
        .await
        .expect("rotate"));

    let changes = EndpointChanges {
        description: Some("renamed".into()),
        ..EndpointChanges::default()
    };
    assert!(store
        .update_endpoint(&a.id, &e.id, &changes, T0 + 4)
        .await
        .expect("update"));
    let saved = stored_endpoint(&store, &a.id, &e.id).await;
    assert_eq!(
        saved,
        Endpoint {
            description: "renamed".into(),
            disabled: true,
            headers: headers.clone(),
            secret: rotated.clone(),
            updated_at: T0 + 4,
            ..e.clone()
        }
    );
    let status = status_of(&store, &e.id).await;
    assert_eq!(
        (
            status.disabled,
            status.auto_disabled,
            status.disabled_reason.as_deref()
        ),
        (true, false, Some("by hand"))
    );

    // Headers alone: the description just written stays.
    assert!(store
        .set_endpoint_headers(&a.id, &e.id, &Default::default(), T0 + 5)
        .await
        .expect("headers"));
    let saved = stored_endpoint(&store, &a.id, &e.id).await;
    assert_eq!(
        (
            saved.description.as_str(),
            saved.headers.len(),
            saved.disabled
        ),
        ("renamed", 0, true)
    );
    assert!(store
        .enable_endpoint(&a.id, &e.id, T0 + 6, T0)
        .await
        .expect("enable")
        .is_some());
    // The old secret still signs: the update did not write the rotation back.
    store
        .insert_messages(&[message(&a.id, "x", None)])
        .await
        .expect("insert");
    let got = claim(&store, T0 + 10, 10, &HashMap::new(), 10).await;
    assert_eq!(
        (got[0].secret.clone(), got[0].old_secrets.clone()),
        (rotated, vec![e.secret.clone()])
    );
    let stranger = app(&store, None).await;
    assert!(!store
        .set_endpoint_headers(&stranger.id, &e.id, &headers, T0 + 7)
        .await
        .expect("headers"));
}

async fn lists_page_in_stable_order_both_ways(store: Arc<dyn Store>) {
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(app(&store, None).await.id.into_string());
    }
    let first = store.list_apps(&page(2, None, true)).await.expect("list");
    assert!(first.has_more);
    let second = store
        .list_apps(&page(2, Some(first.items[1].id.to_string()), true))
        .await
        .expect("list");
    let third = store
        .list_apps(&page(2, Some(second.items[1].id.to_string()), true))
        .await
        .expect("list");
    assert!(!third.has_more);
    let seen: Vec<String> = first
        .items
        .iter()
        .chain(&second.items)
        .chain(&third.items)
        .map(|a| a.id.to_string())
        .collect();
    assert_eq!(seen, ids);
    let desc = store.list_apps(&page(10, None, false)).await.expect("list");
    let mut reversed = ids.clone();
    reversed.reverse();
    assert_eq!(
        desc.items
            .iter()
            .map(|a| a.id.to_string())
            .collect::<Vec<_>>(),
        reversed
    );
}

async fn rotated_secrets_sign_until_their_grace_ends(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let e = endpoint(&store, &a.id, None, false).await;
    let first = e.secret.clone();
    let second = herald_signing::Secret::generate().expose();
    assert!(store
        .rotate_secret(&a.id, &e.id, &second, T0 + 1_000, T0)
        .await
        .expect("rotate"));
    sent(&store, &a.id, "x", None).await;
    let got = claim(&store, T0, 10, &HashMap::new(), 10).await;
    assert_eq!(got[0].secret, second);
    assert_eq!(got[0].old_secrets, vec![first.clone()], "within the grace");
    let got_ep = stored_endpoint(&store, &a.id, &e.id).await;
    assert_eq!(got_ep.secret, second);

    // A zero grace drops the replaced secret at once; older ones live on.
    let third = herald_signing::Secret::generate().expose();
    assert!(store
        .rotate_secret(&a.id, &e.id, &third, T0 + 500, T0 + 500)
        .await
        .expect("rotate"));
    let got = claimed_again(&store, &got[0], T0 + 500).await;
    assert_eq!(
        (got[0].secret.clone(), got[0].old_secrets.clone()),
        (third.clone(), vec![first])
    );
    let got = claimed_again(&store, &got[0], T0 + 1_000).await;
    assert!(got[0].old_secrets.is_empty(), "the grace has ended");

    // At most ten old secrets are kept.
    for i in 0..12 {
        let s = herald_signing::Secret::generate().expose();
        assert!(store
            .rotate_secret(&a.id, &e.id, &s, T0 + 100_000, T0 + 2_000 + i)
            .await
            .expect("rotate"));
    }
    let got = claimed_again(&store, &got[0], T0 + 3_000).await;
    assert_eq!(got[0].old_secrets.len(), MAX_OLD_SECRETS);
    let stranger = app(&store, None).await;
    assert!(!store
        .rotate_secret(&stranger.id, &e.id, &third, T0, T0)
        .await
        .expect("rotate"));
}

async fn event_types_are_created_listed_updated_and_deleted(store: Arc<dyn Store>) {
    let et = |name: &str, archived: bool| EventType {
        name: name.to_owned(),
        description: "d".into(),
        archived,
        deprecated: false,
        schemas: Some(r#"{"1":{}}"#.into()),
        feature_flag: None,
        group_name: Some("g".into()),
        created_at: T0,
        updated_at: T0,
    };
    for (name, archived) in [("b.two", false), ("a.one", false), ("c.old", true)] {
        store
            .create_event_type(&et(name, archived))
            .await
            .expect("create");
    }
    assert!(matches!(
        store.create_event_type(&et("a.one", false)).await,
        Err(StoreError::Conflict(_))
    ));
    assert_eq!(
        store.get_event_type("a.one").await.expect("get"),
        Some(et("a.one", false))
    );
    let names = |p: Page<EventType>| p.items.into_iter().map(|e| e.name).collect::<Vec<_>>();
    assert_eq!(
        names(
            store
                .list_event_types(false, &page(10, None, true))
                .await
                .expect("list")
        ),
        vec!["a.one", "b.two"]
    );
    let first = store
        .list_event_types(true, &page(2, None, true))
        .await
        .expect("list");
    assert!(first.has_more);
    assert_eq!(
        names(
            store
                .list_event_types(true, &page(2, Some("b.two".into()), true))
                .await
                .expect("list")
        ),
        vec!["c.old"]
    );
    let mut changed = et("a.one", true);
    changed.description = "new".into();
    changed.updated_at = T0 + 1;
    assert!(store.update_event_type(&changed).await.expect("update"));
    assert_eq!(
        store.get_event_type("a.one").await.expect("get"),
        Some(changed)
    );
    assert!(!store
        .update_event_type(&et("zzz", false))
        .await
        .expect("update"));
    assert_eq!(
        store
            .unknown_event_types(&["a.one".into(), "nope".into(), "c.old".into()])
            .await
            .expect("unknown"),
        vec!["nope".to_owned()]
    );
    assert!(store.delete_event_type("a.one").await.expect("delete"));
    assert!(!store.delete_event_type("a.one").await.expect("delete"));
}

async fn apps_update_and_delete_with_everything_under_them(store: Arc<dyn Store>) {
    let a = app(&store, Some("one")).await;
    let b = app(&store, None).await;
    let e = endpoint(&store, &a.id, None, false).await;
    endpoint(&store, &b.id, None, false).await;
    let mut changed = a.clone();
    changed.uid = Some("uno".into());
    changed.name = "renamed".into();
    changed.updated_at = T0 + 1;
    assert!(store.update_app(&changed).await.expect("update"));
    assert_eq!(store.get_app("uno").await.expect("get"), Some(changed));
    assert_eq!(store.get_app("one").await.expect("get"), None);

    let ms = vec![message(&a.id, "x", None), message(&b.id, "x", None)];
    store.insert_messages(&ms).await.expect("insert");
    let got = claim(&store, T0, 10, &HashMap::new(), 10).await;
    let of_a: Vec<_> = got.iter().filter(|d| d.app_id == a.id).collect();
    store
        .complete(&[completion(of_a[0], NextState::Retry { at: T0 + 1 }, T0)])
        .await
        .expect("complete");
    assert!(store.delete_app(&a.id).await.expect("delete"));
    assert!(!store.delete_app(&a.id).await.expect("delete"));
    assert_eq!(store.get_app(a.id.as_str()).await.expect("get"), None);
    assert_eq!(
        store.endpoint_delivery_counts(&e.id).await.expect("counts"),
        DeliveryCounts::default(),
        "the app's deliveries go with it"
    );
    assert_eq!(
        store.get_endpoint(&a.id, e.id.as_str()).await.expect("get"),
        None
    );
    assert_eq!(
        store
            .get_message(&a.id, ms[0].id.as_str())
            .await
            .expect("get"),
        None
    );
    assert!(store
        .list_attempts_of_endpoint(&a.id, &e.id, &page(10, None, true))
        .await
        .expect("attempts")
        .items
        .is_empty());
    assert!(store
        .get_message(&b.id, ms[1].id.as_str())
        .await
        .expect("get")
        .is_some());
    assert!(!store.update_app(&a).await.expect("update"));

    // A message for a deleted app is refused alone; the batch goes on.
    let later = vec![message(&a.id, "x", None), message(&b.id, "x", None)];
    let outcomes = store.insert_messages(&later).await.expect("insert");
    assert_eq!(
        outcomes,
        vec![
            InsertOutcome::NoSuchApp,
            InsertOutcome::Inserted { deliveries: 1 }
        ]
    );
}

async fn deleting_an_endpoint_removes_its_deliveries(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let e = endpoint(&store, &a.id, None, false).await;
    let m = sent(&store, &a.id, "x", None).await;
    assert!(store.delete_endpoint(&a.id, &e.id).await.expect("delete"));
    assert!(!store.delete_endpoint(&a.id, &e.id).await.expect("delete"));
    assert!(store
        .list_deliveries_of_message(&a.id, &m.id)
        .await
        .expect("list")
        .is_empty());
    assert!(claim(&store, T0, 10, &HashMap::new(), 10).await.is_empty());
}

/// Endpoint `ep` of `app` as stored (the test fails if it is not).
async fn stored_endpoint(store: &Arc<dyn Store>, app: &AppId, ep: &EndpointId) -> Endpoint {
    store
        .get_endpoint(app, ep.as_str())
        .await
        .expect("get")
        .expect("exists")
}

/// Gives the claimed delivery `d` back at `now`, then claims (up to 10)
/// again at `now`.
async fn claimed_again(
    store: &Arc<dyn Store>,
    d: &ClaimedDelivery,
    now: Millis,
) -> Vec<ClaimedDelivery> {
    store
        .release(&d.id, &d.lease_token, now)
        .await
        .expect("release");
    claim(store, now, 10, &HashMap::new(), 10).await
}

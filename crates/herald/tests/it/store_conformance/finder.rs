//! The finding tools: messages by each field, applications by name, uid or id.

use super::*;

crate::on_both_stores!(store:
    find_messages_filters_by_each_field_within_the_scope,
    find_apps_by_name_uid_or_id,
);

async fn find_messages_filters_by_each_field_within_the_scope(store: Arc<dyn Store>) {
    let acme = app(&store, Some("acme")).await;
    let other = app(&store, Some("other")).await;
    let ep = endpoint(&store, &acme.id, None, false).await;
    endpoint(&store, &other.id, None, false).await;
    let mut inv42 = message(&acme.id, "invoice.paid", Some("inv-42"));
    inv42.created_at = T0 + 10;
    let mut inv43 = message(&acme.id, "invoice.paid", Some("inv-43"));
    inv43.created_at = T0 + 20;
    inv43.channels = Some(vec!["eu".into(), "project-1".into()]);
    let mut order = message(&acme.id, "order.created", None);
    order.created_at = T0 + 30;
    let mut elsewhere = message(&other.id, "invoice.paid", Some("inv-42"));
    elsewhere.created_at = T0 + 10;
    store
        .insert_messages(&[
            inv42.clone(),
            inv43.clone(),
            order.clone(),
            elsewhere.clone(),
        ])
        .await
        .expect("insert");
    // inv-42 delivered, the order dead, inv-43 left pending.
    let got = claim(&store, T0 + 40, 10, &HashMap::new(), 10).await;
    let of = |m: &NewMessage| {
        got.iter()
            .find(|d| d.msg_id == m.id)
            .expect("claimed")
            .clone()
    };
    store
        .complete(&[
            completion(&of(&inv42), NextState::Delivered, T0 + 41),
            completion(&of(&order), NextState::Dead(DeadReason::Exhausted), T0 + 41),
        ])
        .await
        .expect("complete");
    let pending = of(&inv43);
    store
        .release(&pending.id, &pending.lease_token, T0 + 42)
        .await
        .expect("release");

    let find = |filter: FindFilter| {
        let store = store.clone();
        async move {
            let page = store
                .find_messages(
                    &filter,
                    &PageReq {
                        limit: 10,
                        ..PageReq::default()
                    },
                )
                .await
                .expect("find");
            page.items.into_iter().map(|m| m.id).collect::<Vec<_>>()
        }
    };
    let in_acme = |f: FindFilter| FindFilter {
        app: Some(acme.id.clone()),
        ..f
    };
    // Newest first; all apps unless scoped.
    assert_eq!(
        find(FindFilter::default()).await,
        vec![
            elsewhere.id.clone(),
            order.id.clone(),
            inv43.id.clone(),
            inv42.id.clone()
        ]
    );
    assert_eq!(
        find(in_acme(FindFilter::default())).await,
        vec![order.id.clone(), inv43.id.clone(), inv42.id.clone()]
    );
    let by_event_id = FindFilter {
        id_or_event_id: Some("inv-42".into()),
        ..FindFilter::default()
    };
    assert_eq!(
        find(by_event_id.clone()).await,
        vec![elsewhere.id.clone(), inv42.id.clone()]
    );
    assert_eq!(find(in_acme(by_event_id)).await, vec![inv42.id.clone()]);
    let by_id = FindFilter {
        id_or_event_id: Some(order.id.as_str().to_owned()),
        ..FindFilter::default()
    };
    assert_eq!(find(by_id.clone()).await, vec![order.id.clone()]);
    let other_scope = FindFilter {
        app: Some(other.id.clone()),
        ..by_id
    };
    assert!(
        find(other_scope).await.is_empty(),
        "another app's id finds nothing"
    );
    let by_type = FindFilter {
        event_type: Some("invoice.paid".into()),
        ..FindFilter::default()
    };
    assert_eq!(
        find(in_acme(by_type)).await,
        vec![inv43.id.clone(), inv42.id.clone()]
    );
    for (state, want) in [
        (DeliveryState::Delivered, vec![inv42.id.clone()]),
        (DeliveryState::Dead, vec![order.id.clone()]),
        (DeliveryState::Pending, vec![inv43.id.clone()]),
        (DeliveryState::Delivering, vec![]),
    ] {
        let f = in_acme(FindFilter {
            status: Some(state),
            ..FindFilter::default()
        });
        assert_eq!(find(f).await, want, "{state:?}");
    }
    let by_channel = |c: &str| FindFilter {
        channel: Some(c.into()),
        ..FindFilter::default()
    };
    assert_eq!(find(by_channel("project-1")).await, vec![inv43.id.clone()]);
    assert!(
        find(by_channel("project")).await.is_empty(),
        "whole channels only"
    );
    let window = in_acme(FindFilter {
        created_after: Some(T0 + 20),
        created_before: Some(T0 + 30),
        ..FindFilter::default()
    });
    assert_eq!(find(window).await, vec![inv43.id.clone()]);

    // Each with its deliveries counted by state, and its app's name.
    let page = store
        .find_messages(
            &in_acme(FindFilter::default()),
            &PageReq {
                limit: 2,
                ..PageReq::default()
            },
        )
        .await
        .expect("find");
    assert!(page.has_more);
    assert_eq!(page.items.len(), 2);
    assert_eq!(page.items[0].deliveries.dead, 1);
    assert_eq!(page.items[1].deliveries.pending, 1);
    assert_eq!(page.items[1].event_id.as_deref(), Some("inv-43"));
    assert_eq!(page.items[0].app_name, acme.name);
    let next = store
        .find_messages(
            &in_acme(FindFilter::default()),
            &PageReq {
                limit: 2,
                after: Some(page.items[1].id.as_str().to_owned()),
                ..PageReq::default()
            },
        )
        .await
        .expect("find");
    assert_eq!(
        next.items.iter().map(|m| m.id.clone()).collect::<Vec<_>>(),
        vec![inv42.id.clone()]
    );
    assert_eq!(next.items[0].deliveries.delivered, 1);
    assert!(!next.has_more);
    let _ = ep;
}

async fn find_apps_by_name_uid_or_id(store: Arc<dyn Store>) {
    let mut acme = app(&store, Some("acme-uid")).await;
    acme.name = "Acme 100% Shop".into();
    assert!(store.update_app(&acme).await.expect("update"));
    let mut other = app(&store, Some("initech")).await;
    other.name = "Initech".into();
    assert!(store.update_app(&other).await.expect("update"));
    let find = |q: Option<&str>| {
        let store = store.clone();
        let q = q.map(str::to_owned);
        async move {
            store
                .find_apps(
                    q.as_deref(),
                    &PageReq {
                        limit: 10,
                        ..PageReq::default()
                    },
                )
                .await
                .expect("find apps")
                .items
                .into_iter()
                .map(|a| a.id)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(find(None).await, vec![other.id.clone(), acme.id.clone()]);
    assert_eq!(
        find(Some("acme")).await,
        vec![acme.id.clone()],
        "name, any case"
    );
    assert_eq!(find(Some("100%")).await, vec![acme.id.clone()]);
    assert!(find(Some("1_0")).await.is_empty(), "_ is not a wildcard");
    assert_eq!(find(Some("initech")).await, vec![other.id.clone()]);
    assert_eq!(find(Some("acme-uid")).await, vec![acme.id.clone()]);
    assert_eq!(find(Some(acme.id.as_str())).await, vec![acme.id.clone()]);
    assert!(find(Some("globex")).await.is_empty());
}

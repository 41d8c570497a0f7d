//! The audit log: changes made through the API (admin and application
//! tokens) and the dashboard, read back through `GET /api/v1/audit-log`;
//! its filters, pages and retention; and that no secret ever lands in it.
//! The store's part runs on SQLite and PostgreSQL alike.

use std::sync::Arc;

use axum::http::StatusCode;
use serde_json::{json, Value};

use herald::ids::{AppId, AuditId};
use herald::store::*;

use crate::helpers::*;

/// Every entry the query matches, page by page (`limit` a page), with
/// the raw text of every page.
async fn audit_all(app: &TestApp, query: &str, limit: usize) -> (Vec<Value>, String) {
    let mut entries = Vec::new();
    let mut raw = String::new();
    let mut iterator: Option<String> = None;
    for _ in 0..1000 {
        let mut path = format!("/api/v1/audit-log?limit={limit}");
        if !query.is_empty() {
            path.push('&');
            path.push_str(query);
        }
        if let Some(it) = &iterator {
            path.push_str(&format!("&iterator={it}"));
        }
        let (status, body) = app.get(&path).await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
        raw.push_str(&body.to_string());
        let data = body["data"].as_array().expect("data").clone();
        assert!(data.len() <= limit);
        entries.extend(data);
        if body["done"].as_bool().expect("done") {
            return (entries, raw);
        }
        iterator = Some(body["iterator"].as_str().expect("iterator").to_owned());
    }
    panic!("the audit log never ended");
}

fn actions(entries: &[Value]) -> Vec<String> {
    entries
        .iter()
        .map(|e| e["action"].as_str().expect("action").to_owned())
        .collect()
}

fn find<'a>(entries: &'a [Value], action: &str) -> &'a Value {
    entries
        .iter()
        .find(|e| e["action"] == action)
        .unwrap_or_else(|| panic!("no {action} in {entries:#?}"))
}

#[tokio::test]
async fn api_changes_are_audited_with_actor_target_and_source_and_never_a_secret() {
    let app = spawn_stepped(&[]).await;
    let rx = Receiver::start().await;
    rx.always(Reply::status(400));
    let (app_id, ep_id) = app.app_with_endpoint(&rx.url("/hooks"), json!({})).await;
    let msg = app
        .send_message(&app_id, "invoice.paid", json!({"n": 1}))
        .await;
    app.step().await;
    let dlv = app.deliveries(&app_id, &msg).await[0]["id"]
        .as_str()
        .expect("delivery")
        .to_owned();
    let ep_path = format!("/api/v1/app/{app_id}/endpoint/{ep_id}");

    let (s, first_secret) = app.get(&format!("{ep_path}/secret")).await;
    assert_eq!(s, StatusCode::OK);
    let (s, rotated) = app
        .post(&format!("{ep_path}/secret/rotate"), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{rotated}");
    let (s, _) = app.patch(&ep_path, json!({"description": "billing"})).await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = app
        .put(
            &format!("{ep_path}/headers"),
            json!({"headers": {"X-Api-Key": "hdr-value-s3cr3t"}}),
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, body) = app.replay_dead(&app_id, &dlv).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{body}");
    let (s, body) = app.resend(&app_id, &msg, &ep_id).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{body}");
    let (s, token) = app
        .post(
            &format!("/api/v1/app/{app_id}/token"),
            json!({"name": "ci"}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{token}");
    let (tok_id, tok) = (
        token["id"].as_str().expect("id").to_owned(),
        token["token"].as_str().expect("token").to_owned(),
    );

    // The application token: its own changes carry its id; the audit log
    // is the admin's alone.
    let (s, _) = app
        .as_token(&tok)
        .patch(
            &ep_path,
            json!({"url": rx.url("/v2"), "metadata": {"k": "v"}}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, body) = app.as_token(&tok).get("/api/v1/audit-log").await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{body}");
    let (s, _) = app
        .as_token(&tok)
        .post(&format!("{ep_path}/disable"), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK);

    let (s, _) = app
        .delete(&format!("/api/v1/app/{app_id}/token/{tok_id}"))
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _) = app.delete(&ep_path).await;
    assert_eq!(s, StatusCode::NO_CONTENT);

    let (entries, raw) = audit_all(&app, "", 250).await;
    let mut expected = vec![
        "app.created",
        "endpoint.created",
        "endpoint.secret_revealed",
        "endpoint.secret_rotated",
        "endpoint.updated",
        "endpoint.headers_updated",
        "dead.replayed",
        "message.resent",
        "token.created",
        "endpoint.updated",
        "endpoint.disabled",
        "token.revoked",
        "endpoint.deleted",
    ];
    expected.reverse(); // newest first
    assert_eq!(actions(&entries), expected, "{entries:#?}");
    for e in &entries {
        assert_eq!(e["source"], "127.0.0.1", "{e}");
        assert!(e["id"].as_str().expect("id").starts_with("audit_"), "{e}");
        assert!(
            herald::api::millis_of_rfc3339(e["at"].as_str().expect("at")).is_some(),
            "{e}"
        );
        assert_eq!(e["appId"], app_id.as_str(), "{e}");
    }
    let by_token: Vec<&Value> = entries
        .iter()
        .filter(|e| e["actorKind"] == "app_token")
        .collect();
    assert_eq!(by_token.len(), 2, "{entries:#?}");
    for e in &by_token {
        assert_eq!(e["actor"], tok_id.as_str());
        assert_eq!(e["target"], ep_id.as_str());
    }
    assert!(entries
        .iter()
        .filter(|e| e["actorKind"] == "admin")
        .all(|e| e["actor"] == "admin"));
    assert_eq!(find(&entries, "dead.replayed")["target"], dlv.as_str());
    assert_eq!(find(&entries, "message.resent")["target"], msg.as_str());
    assert_eq!(find(&entries, "token.created")["target"], tok_id.as_str());
    assert_eq!(find(&entries, "token.revoked")["target"], tok_id.as_str());
    assert_eq!(
        find(&entries, "endpoint.secret_revealed")["target"],
        ep_id.as_str()
    );
    assert_eq!(find(&entries, "app.created")["target"], app_id.as_str());
    // Updates name the fields, not their values.
    assert_eq!(
        find(&entries, "endpoint.updated")["details"]["fields"],
        json!(["url", "metadata"])
    );

    // No secret, token or header value anywhere in it.
    for secret in [
        first_secret["key"].as_str().expect("secret"),
        rotated["key"].as_str().expect("new secret"),
        tok.as_str(),
        TOKEN,
        "hdr-value-s3cr3t",
    ] {
        assert!(!raw.contains(secret), "{secret} is in the audit log: {raw}");
    }
    // Creating a message is data, not a change: not audited.
    assert!(!raw.contains("message.created"));

    // Filters.
    let (only, _) = audit_all(&app, "action=endpoint.updated", 250).await;
    assert_eq!(only.len(), 2);
    let (only, _) = audit_all(&app, "actorKind=app_token", 250).await;
    assert_eq!(actions(&only), ["endpoint.disabled", "endpoint.updated"]);
    let (only, _) = audit_all(&app, &format!("actor={tok_id}"), 250).await;
    assert_eq!(only.len(), 2);
    let (only, _) = audit_all(&app, &format!("target={tok_id}"), 250).await;
    assert_eq!(actions(&only), ["token.revoked", "token.created"]);
    let (only, _) = audit_all(&app, &format!("appId={app_id}"), 250).await;
    assert_eq!(only.len(), entries.len());
    let (only, _) = audit_all(&app, &format!("appId={}", AppId::generate()), 250).await;
    assert!(only.is_empty());
    let (only, _) = audit_all(&app, "after=2100-01-01T00:00:00Z", 250).await;
    assert!(only.is_empty());
    let (only, _) = audit_all(&app, "before=2100-01-01T00:00:00Z", 250).await;
    assert_eq!(only.len(), entries.len());
    for bad in [
        "actorKind=root",
        "appId=nope",
        "before=yesterday",
        "limit=0",
    ] {
        let (s, body) = app.get(&format!("/api/v1/audit-log?{bad}")).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {body}");
    }

    // Pages of 3 walk the same entries in the same order, and back.
    let (paged, _) = audit_all(&app, "", 3).await;
    assert_eq!(paged, entries);
    let (s, first_page) = app.get("/api/v1/audit-log?limit=3").await;
    assert_eq!(s, StatusCode::OK);
    let it = first_page["iterator"].as_str().expect("iterator");
    let (_, second) = app
        .get(&format!("/api/v1/audit-log?limit=3&iterator={it}"))
        .await;
    let prev = second["prevIterator"].as_str().expect("prev");
    let (_, back) = app
        .get(&format!("/api/v1/audit-log?limit=3&iterator={prev}"))
        .await;
    assert_eq!(back["data"], first_page["data"]);
    app.shutdown().await;
}

#[tokio::test]
async fn dashboard_log_ins_and_changes_are_audited_as_the_session() {
    let app = spawn_stepped(&[]).await;
    let rx = Receiver::start().await;
    let (app_id, ep_id) = app.app_with_endpoint(&rx.url("/hooks"), json!({})).await;
    let browser = cookie_client();
    let wrong = "wrong-token-attempt-0123456789abcdef";
    let resp = login_with(&browser, &app, wrong).await;
    assert_eq!(resp.status(), 401);
    let resp = login_with(&browser, &app, TOKEN).await;
    assert_eq!(resp.status(), 303);
    let ep_page = format!("/dashboard/app/{app_id}/endpoint/{ep_id}");
    let html = browser.get(app.url(&ep_page)).text_answer().await;
    let csrf = csrf_of(&html);
    let resp = browser
        .post(app.url(&format!("{ep_page}/disable")))
        .form(&[("csrf", csrf.as_str()), ("reason", "maintenance")])
        .send()
        .await
        .expect("answer");
    assert_eq!(resp.status(), 303);
    let secret = browser
        .get(app.url(&format!("{ep_page}/secret")))
        .text_answer()
        .await;
    assert!(secret.starts_with("whsec_"), "{secret}");

    let (entries, raw) = audit_all(&app, "actorKind=dashboard", 50).await;
    assert_eq!(
        actions(&entries),
        [
            "endpoint.secret_revealed",
            "endpoint.disabled",
            "dashboard.login",
            "dashboard.login_failed"
        ],
        "{entries:#?}"
    );
    let failed = find(&entries, "dashboard.login_failed");
    assert_eq!(failed["actor"], "", "no session: no actor");
    let session = find(&entries, "dashboard.login")["actor"]
        .as_str()
        .expect("label")
        .to_owned();
    assert_eq!(session.len(), 8, "a short label of the session: {session}");
    for e in &entries {
        assert_eq!(e["source"], "127.0.0.1", "{e}");
    }
    for action in ["endpoint.disabled", "endpoint.secret_revealed"] {
        let e = find(&entries, action);
        assert_eq!(e["actor"], session.as_str());
        assert_eq!(e["target"], ep_id.as_str());
        assert_eq!(e["appId"], app_id.as_str());
    }
    for never in [wrong, TOKEN, secret.as_str()] {
        assert!(!raw.contains(never), "{never} in {raw}");
    }
    // The cookie is not the label either.
    let cookie_value = {
        let jar_page = get_answer(&browser, &app, "/dashboard/audit").await;
        assert_eq!(jar_page.status(), 200);
        let page = jar_page.text().await.expect("page");
        assert!(page.contains("Audit log"));
        assert!(page.contains("dashboard.login_failed"), "{page}");
        assert!(page.contains("endpoint.disabled"));
        assert!(!page.contains(wrong));
        page
    };
    assert!(
        cookie_value.contains(r#"href="/dashboard/audit""#),
        "linked from the navigation"
    );
    // Filtered by action on the dashboard page.
    let page = browser
        .get(app.url("/dashboard/audit?action=dashboard.login"))
        .text_answer()
        .await;
    assert!(page.contains("<code>dashboard.login</code>"), "{page}");
    assert!(!page.contains("<code>endpoint.disabled</code>"), "{page}");

    // Logging out is the session's last entry.
    let resp = browser
        .post(app.url("/dashboard/logout"))
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .expect("answer");
    assert_eq!(resp.status(), 303);
    let (entries, _) = audit_all(&app, "action=dashboard.logout", 50).await;
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0]["actor"], session.as_str());
    app.shutdown().await;
}

// The store's part, on both backends.

fn entry(at: Millis, action: &str, app: Option<&AppId>, kind: ActorKind) -> AuditEntry {
    AuditEntry {
        id: AuditId::generate(),
        at,
        actor_kind: kind,
        actor_id: match kind {
            ActorKind::Admin => "admin".to_owned(),
            _ => "tok_1".to_owned(),
        },
        action: action.to_owned(),
        app_id: app.cloned(),
        target: format!("target-{at}"),
        source: "::1".to_owned(),
        details: json!({"fields": ["url"], "n": at}),
    }
}

crate::on_both_stores!(store: audit_round_trips_filters_pages_and_prunes);

async fn audit_round_trips_filters_pages_and_prunes(store: Arc<dyn Store>) {
    const T0: Millis = 1_700_000_000_000;
    let (a, b) = (AppId::generate(), AppId::generate());
    let mut made = Vec::new();
    for i in 0..10 {
        let e = entry(
            T0 + i * 1000,
            if i % 2 == 0 {
                "endpoint.updated"
            } else {
                "dead.replayed"
            },
            if i < 5 {
                Some(&a)
            } else if i < 8 {
                Some(&b)
            } else {
                None
            },
            if i % 3 == 0 {
                ActorKind::AppToken
            } else {
                ActorKind::Admin
            },
        );
        store.insert_audit(&e).await.expect("insert");
        made.push(e);
    }
    let page = |limit, after: Option<String>| PageReq {
        limit,
        after,
        ascending: false,
        backwards: false,
    };
    let all = store
        .list_audit(&AuditFilter::default(), &page(100, None))
        .await
        .expect("list");
    let mut newest_first = made.clone();
    newest_first.reverse();
    assert_eq!(all.items, newest_first, "every field back as written");
    assert!(!all.has_more);

    // Pages of 4.
    let mut walked = Vec::new();
    let mut after = None;
    loop {
        let p = store
            .list_audit(&AuditFilter::default(), &page(4, after.clone()))
            .await
            .expect("page");
        walked.extend(p.items.clone());
        if !p.has_more {
            break;
        }
        after = p.items.last().map(|e| e.id.as_str().to_owned());
    }
    assert_eq!(walked, newest_first);

    let count = |f: AuditFilter| {
        let store = store.clone();
        async move {
            store
                .list_audit(&f, &page(100, None))
                .await
                .expect("list")
                .items
                .len()
        }
    };
    let f = |g: fn(&mut AuditFilter)| {
        let mut f = AuditFilter::default();
        g(&mut f);
        f
    };
    assert_eq!(
        count(AuditFilter {
            action: Some("endpoint.updated".into()),
            ..AuditFilter::default()
        })
        .await,
        5
    );
    assert_eq!(
        count(AuditFilter {
            app: Some(a.clone()),
            ..AuditFilter::default()
        })
        .await,
        5
    );
    assert_eq!(
        count(AuditFilter {
            app: Some(b.clone()),
            action: Some("dead.replayed".into()),
            ..AuditFilter::default()
        })
        .await,
        2
    );
    assert_eq!(
        count(f(|f| f.actor_kind = Some(ActorKind::AppToken))).await,
        4
    );
    assert_eq!(count(f(|f| f.actor_id = Some("tok_1".into()))).await, 4);
    assert_eq!(
        count(AuditFilter {
            target: Some(format!("target-{}", T0 + 3000)),
            ..AuditFilter::default()
        })
        .await,
        1
    );
    // `after` includes its own millisecond (as Svix's), `before` not:
    // the entries at 2000, 3000, 4000 and 5000.
    assert_eq!(
        count(AuditFilter {
            after: Some(T0 + 2000),
            before: Some(T0 + 6000),
            ..AuditFilter::default()
        })
        .await,
        4
    );

    // Pruning: oldest first, in batches.
    assert_eq!(store.prune_audit(T0 + 4500, 3).await.expect("prune"), 3);
    assert_eq!(store.prune_audit(T0 + 4500, 3).await.expect("prune"), 2);
    assert_eq!(store.prune_audit(T0 + 4500, 3).await.expect("prune"), 0);
    assert_eq!(store.prune_audit(T0 + 99_999, 0).await.expect("prune"), 0);
    let left = store
        .list_audit(&AuditFilter::default(), &page(100, None))
        .await
        .expect("list");
    assert_eq!(left.items, newest_first[..5].to_vec());
    // The retention task's own loop takes the rest.
    herald::server::prune_audit(
        &*store,
        T0 + 99_999,
        &tokio_util::sync::CancellationToken::new(),
    )
    .await;
    assert!(store
        .list_audit(&AuditFilter::default(), &page(100, None))
        .await
        .expect("list")
        .items
        .is_empty());
}

#[tokio::test]
async fn the_retention_pass_prunes_entries_older_than_the_audit_retention() {
    let overrides = [("HERALD_AUDIT_RETENTION", "1d")];
    let app = spawn_stepped(&overrides).await;
    app.create_app().await;
    let store = app.running().store.clone();
    let day = 86_400_000;
    let old = entry(
        now_millis() - 2 * day,
        "endpoint.deleted",
        None,
        ActorKind::Admin,
    );
    store.insert_audit(&old).await.expect("insert");
    let (before, _) = audit_all(&app, "", 50).await;
    assert_eq!(before.len(), 2);
    let config = test_config(app._dir.path(), &overrides);
    assert_eq!(
        config.retention.audit_retention,
        std::time::Duration::from_secs(86_400)
    );
    let shutdown = tokio_util::sync::CancellationToken::new();
    herald::server::retention_pass(&*store, &config, now_millis(), &shutdown).await;
    let (after, _) = audit_all(&app, "", 50).await;
    assert_eq!(actions(&after), ["app.created"]);
    // A year on, the default retention takes the rest.
    let defaults = test_config(app._dir.path(), &[]);
    assert_eq!(
        defaults.retention.audit_retention,
        std::time::Duration::from_secs(365 * 86_400)
    );
    herald::server::retention_pass(&*store, &defaults, now_millis() + 366 * day, &shutdown).await;
    let (after, _) = audit_all(&app, "", 50).await;
    assert!(after.is_empty(), "{after:#?}");
    app.shutdown().await;
}

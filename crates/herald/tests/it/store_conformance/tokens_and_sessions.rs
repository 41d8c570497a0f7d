//! API tokens, Idempotency-Key records, portal link codes and sessions.

use super::*;

crate::on_both_stores!(store:
    tokens_are_found_by_digest_and_go_with_their_app,
    idempotency_keys_replay_refuse_and_expire,
    portal_codes_are_taken_once_and_expire_with_their_token,
    sessions_are_found_by_digest_expire_and_end_with_their_token,
);

async fn tokens_are_found_by_digest_and_go_with_their_app(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let t = ApiToken::plain("tok_1".into(), a.id.clone(), "ci".into(), T0);
    store.create_token(&t, "ab12").await.expect("create");
    assert_eq!(
        store.find_token("ab12").await.expect("find"),
        Some(t.clone())
    );
    assert_eq!(store.find_token("ffff").await.expect("find"), None);
    assert_eq!(
        store.list_tokens(&a.id).await.expect("list"),
        vec![t.clone()]
    );
    let other = app(&store, None).await;
    assert!(!store
        .delete_token(&other.id, "tok_1")
        .await
        .expect("delete"));
    assert!(store.delete_token(&a.id, "tok_1").await.expect("delete"));
    store.create_token(&t, "ab12").await.expect("again");
    assert!(store.delete_app(&a.id).await.expect("delete app"));
    assert_eq!(store.find_token("ab12").await.expect("find"), None);
}

async fn idempotency_keys_replay_refuse_and_expire(store: Arc<dyn Store>) {
    let begin_as = |key: IdemKey<'static>, hash: &'static str, now: Millis| {
        let store = store.clone();
        async move {
            store
                .idempotency_begin(
                    "admin",
                    &key,
                    &[hash.to_owned()],
                    now,
                    now - 1_000,
                    now - 100,
                )
                .await
                .expect("begin")
        }
    };
    let begin = |key: &'static str, hash: &'static str, now: Millis| {
        begin_as(IdemKey::plain(key), hash, now)
    };
    assert_eq!(begin("k", "h1", T0).await, IdemBegin::Fresh);
    assert_eq!(begin("k", "h1", T0 + 1).await, IdemBegin::InProgress);
    assert_eq!(begin("k", "h2", T0 + 1).await, IdemBegin::Mismatch);
    store
        .idempotency_finish("admin", "k", 202, r#"{"id":"msg_1"}"#)
        .await
        .expect("finish");
    assert_eq!(
        begin("k", "h1", T0 + 2).await,
        IdemBegin::Replay {
            status: 202,
            body: r#"{"id":"msg_1"}"#.into()
        }
    );
    // Scopes are apart.
    assert_eq!(
        store
            .idempotency_begin(
                "tok_x",
                &IdemKey::plain("k"),
                &["h9".to_owned()],
                T0,
                T0 - 1_000,
                T0 - 100
            )
            .await
            .expect("begin"),
        IdemBegin::Fresh
    );
    // Past its lifetime a key is fresh again; a dead "in progress" too.
    assert_eq!(begin("k", "h2", T0 + 5_000).await, IdemBegin::Fresh);
    assert_eq!(begin("k", "h2", T0 + 5_000 + 200).await, IdemBegin::Fresh);
    // Aborted: fresh at once.
    assert_eq!(begin("j", "h", T0).await, IdemBegin::Fresh);
    store.idempotency_abort("admin", "j").await.expect("abort");
    assert_eq!(begin("j", "h", T0 + 1).await, IdemBegin::Fresh);
    assert!(store.prune_idempotency(T0 + 10_000).await.expect("prune") >= 2);
    assert_eq!(begin("k", "zz", T0 + 10_001).await, IdemBegin::Fresh);
    // After a key rotation the request's digest under the retired key
    // (not the first, kept one) still names the same request.
    store
        .idempotency_finish("admin", "k", 201, "{}")
        .await
        .expect("finish");
    let rotated = ["new".to_owned(), "zz".to_owned()];
    assert_eq!(
        store
            .idempotency_begin("admin", &IdemKey::plain("k"), &rotated, T0 + 10_002, T0, T0)
            .await
            .expect("begin"),
        IdemBegin::Replay {
            status: 201,
            body: "{}".into()
        }
    );
    // Kept per URL now, under the key alone before: the earlier record of
    // the same request is its answer (a retry across the upgrade), and
    // nothing is begun under the new key; one of another request (another
    // URL) is not, and the new key is begun.
    let per_url = |unscoped: &'static str, hash: &'static str, now: Millis| {
        let key = IdemKey {
            key: "k\n/api/v1/app",
            unscoped: Some(unscoped),
        };
        begin_as(key, hash, now)
    };
    let earlier = IdemBegin::Replay {
        status: 201,
        body: "{}".into(),
    };
    assert_eq!(per_url("k", "zz", T0 + 10_003).await, earlier);
    assert_eq!(
        per_url("k", "zz", T0 + 10_004).await,
        earlier,
        "nothing was begun"
    );
    assert_eq!(per_url("k", "other", T0 + 10_005).await, IdemBegin::Fresh);
    assert_eq!(
        per_url("k", "other", T0 + 10_006).await,
        IdemBegin::InProgress
    );
    assert_eq!(per_url("none", "h", T0 + 10_007).await, IdemBegin::Mismatch);
}

fn portal_token(app: &AppId, id: &str, expires_at: Millis, session_id: Option<&str>) -> ApiToken {
    ApiToken {
        expires_at: Some(expires_at),
        capabilities: Some("ViewBase".into()),
        session_id: session_id.map(str::to_owned),
        ..ApiToken::plain(id.into(), app.clone(), "portal".into(), T0)
    }
}

async fn portal_codes_are_taken_once_and_expire_with_their_token(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let t = portal_token(&a.id, "tok_p1", T0 + 3_600_000, Some("s1"));
    create_portal_token(&store, &t, "tokdigest1", "codedigest1").await;
    assert_eq!(
        store.find_token("tokdigest1").await.expect("find"),
        Some(t.clone())
    );
    assert_eq!(
        take_code(&store, "codedigest1", T0 + 1).await,
        Some(t.clone())
    );
    assert_eq!(
        take_code(&store, "codedigest1", T0 + 2).await,
        None,
        "a code is taken once"
    );
    // A code past its token's expiry is gone and gives nothing.
    let late = portal_token(&a.id, "tok_p2", T0 + 1000, None);
    create_portal_token(&store, &late, "tokdigest2", "codedigest2").await;
    assert_eq!(take_code(&store, "codedigest2", T0 + 1000).await, None);
    // expire-all by session id touches only the chosen tokens.
    let other = portal_token(&a.id, "tok_p3", T0 + 3_600_000, Some("s2"));
    create_portal_token(&store, &other, "tokdigest3", "codedigest3").await;
    let n = store
        .expire_tokens(&a.id, T0 + 10, Some(&["s1".to_owned()]))
        .await
        .expect("expire");
    assert_eq!(n, 1);
    let found = kept_token(&store, "tokdigest1").await;
    assert_eq!(found.expires_at, Some(T0 + 10));
    assert!(!found.live_at(T0 + 10));
    let untouched = kept_token(&store, "tokdigest3").await;
    assert_eq!(untouched.expires_at, Some(T0 + 3_600_000));
    // Without session ids: every token of the app, plain ones included.
    let plain = ApiToken::plain("tok_plain".into(), a.id.clone(), "ci".into(), T0);
    store
        .create_token(&plain, "tokdigest4")
        .await
        .expect("create");
    store
        .expire_tokens(&a.id, T0 + 20, None)
        .await
        .expect("expire");
    let ended = kept_token(&store, "tokdigest4").await;
    assert_eq!(ended.expires_at, Some(T0 + 20));
    assert_eq!(
        take_code(&store, "codedigest3", T0 + 21).await,
        None,
        "its code expired with it"
    );
}

fn portal_session(app: &AppId, token: &str, expires_at: Millis) -> Session {
    Session {
        kind: SessionKind::Portal,
        app_id: Some(app.clone()),
        token_id: Some(token.into()),
        capabilities: Some("ViewBase".into()),
        session_id: Some("s1".into()),
        theme: "darkMode=true".into(),
        csrf: "csrf1".into(),
        flash: None,
        created_at: T0,
        expires_at,
    }
}

async fn sessions_are_found_by_digest_expire_and_end_with_their_token(store: Arc<dyn Store>) {
    let a = app(&store, None).await;
    let t = portal_token(&a.id, "tok_s1", T0 + 3_600_000, Some("s1"));
    create_portal_token(&store, &t, "stok1", "scode1").await;
    let s = portal_session(&a.id, "tok_s1", T0 + 3_600_000);
    store.create_session("sess1", &s).await.expect("create");
    assert_eq!(
        store.find_session("sess1", T0).await.expect("find"),
        Some(s.clone())
    );
    assert_eq!(store.find_session("nope", T0).await.expect("find"), None);
    assert_eq!(
        store
            .find_session("sess1", T0 + 3_600_000)
            .await
            .expect("find"),
        None,
        "expired"
    );
    // The flash is shown once.
    store
        .set_session_flash("sess1", "Saved")
        .await
        .expect("flash");
    let with = store
        .find_session("sess1", T0)
        .await
        .expect("find")
        .expect("live");
    assert_eq!(with.flash.as_deref(), Some("Saved"));
    let without = store
        .find_session("sess1", T0)
        .await
        .expect("find")
        .expect("live");
    assert_eq!(without.flash, None);
    // A dashboard session has no app.
    let d = Session {
        kind: SessionKind::Dashboard,
        app_id: None,
        token_id: None,
        capabilities: None,
        session_id: None,
        theme: String::new(),
        ..s.clone()
    };
    store.create_session("dash1", &d).await.expect("create");
    assert_eq!(
        store.find_session("dash1", T0).await.expect("find"),
        Some(d)
    );
    store.delete_session("dash1").await.expect("delete");
    assert_eq!(store.find_session("dash1", T0).await.expect("find"), None);
    // Expiring the token expires its sessions; ending it ends them.
    store
        .expire_tokens(&a.id, T0 + 5, None)
        .await
        .expect("expire");
    assert_eq!(
        store.find_session("sess1", T0 + 5).await.expect("find"),
        None
    );
    assert!(store
        .find_session("sess1", T0 + 4)
        .await
        .expect("find")
        .is_some());
    store.end_token("tok_s1", T0 + 1).await.expect("end");
    assert_eq!(store.find_session("sess1", T0).await.expect("find"), None);
    // Retention prunes expired sessions.
    store
        .create_session("sess2", &portal_session(&a.id, "tok_s1", T0 + 100))
        .await
        .expect("create");
    assert_eq!(store.prune_sessions(T0 + 100).await.expect("prune"), 1);
    assert_eq!(store.prune_sessions(T0 + 100).await.expect("prune"), 0);
}

/// Stores the portal token `t` under `digest`, with its link's `code`.
async fn create_portal_token(store: &Arc<dyn Store>, t: &ApiToken, digest: &str, code: &str) {
    store
        .create_portal_token(t, digest, code)
        .await
        .expect("create");
}

/// The token a portal link's code (`code_digest`) is taken for at `now`.
async fn take_code(store: &Arc<dyn Store>, code_digest: &str, now: Millis) -> Option<ApiToken> {
    store
        .take_portal_code(code_digest, now)
        .await
        .expect("take")
}

/// The token stored under `digest` (the test fails if there is none).
async fn kept_token(store: &Arc<dyn Store>, digest: &str) -> ApiToken {
    store.find_token(digest).await.expect("find").expect("kept")
}

//! `Idempotency-Key` on POST: a repeat of a request within 12 h gets the
//! first response again (status and body), marked `idempotent-replayed:
//! true`, and changes nothing. Keys are per token and URL (as in Svix:
//! the same key on another URL is another request). The same key with a
//! different body is refused with 409. A repeat while the first is still
//! running waits for it (up to 5 s, as Svix waits) and gets its answer;
//! one still running then is refused with 409. Only successes are kept, so
//! a retry after a refusal or a server error runs again. Requests are compared by meaning: a
//! JSON body re-serialised (other spacing, other key order) is the same
//! request ([`request_digest`]).
//!
//! An answer that shows an endpoint URL with credentials in it is kept
//! with them masked ([`kept_as`]). An answer that shows a secret once (an
//! endpoint secret, an application token, a portal link and its token:
//! [`ShownOnce`]) is never kept: the
//! stored record is a 409 saying so, and a repeat gets that 409 (and
//! changes nothing) instead of the secret. The table holds no secret with
//! or without `HERALD_ENCRYPTION_KEY`, and a "shown once" secret is shown
//! once; a client that lost the answer asks again with a new key.
//!
//! The Svix SDKs send `idempotency-key: auto_<uuid>` on every POST, so this
//! runs on the hot path: one write before (claim the key) and one after
//! (keep the answer), both joining the store's group commits.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};
use std::time::Duration;

use super::auth::Principal;
use super::{ApiError, ApiState, MAX_BODY_BYTES};
use crate::store::{now_millis, IdemBegin, IdemKey};

/// Marks a response (an extension) whose body shows a secret once; see
/// the module. Set by [`shown_once`].
#[derive(Debug, Clone, Copy)]
pub struct ShownOnce;

/// `response`, marked [`ShownOnce`].
pub fn shown_once(response: impl IntoResponse) -> Response {
    let mut response = response.into_response();
    response.extensions_mut().insert(ShownOnce);
    response
}

/// The body kept for a repeat in place of the one sent (an extension); see
/// [`kept_as`].
#[derive(Debug, Clone)]
struct KeptBody(String);

/// `response`, kept for a repeat of its request as `kept` rather than as
/// sent: for an answer that shows a credential in passing (an endpoint
/// URL's userinfo, which the store otherwise holds only sealed), so that
/// the idempotency table never holds it in the clear. The caller gets
/// `response` whole; a repeat gets `kept` with the same status. Should
/// `kept` not serialize, nothing is kept ([`ShownOnce`]).
pub fn kept_as(response: impl IntoResponse, kept: &impl serde::Serialize) -> Response {
    let mut response = response.into_response();
    match serde_json::to_string(kept) {
        Ok(text) => {
            response.extensions_mut().insert(KeptBody(text));
        }
        Err(_) => {
            response.extensions_mut().insert(ShownOnce);
        }
    }
    response
}

/// What is kept for, and replayed to, a repeat of a request whose answer
/// showed a secret: a 409 and its JSON body.
fn not_kept() -> (StatusCode, String) {
    let body = super::error::ErrorBody {
        code: "conflict",
        detail: "this Idempotency-Key was already used: the request succeeded, and its answer \
                 showed a secret once, which is not kept; send a new Idempotency-Key to make \
                 another request"
            .to_owned(),
    };
    let text = serde_json::to_string(&body)
        .unwrap_or_else(|_| r#"{"code":"conflict","detail":"answer not kept"}"#.to_owned());
    (StatusCode::CONFLICT, text)
}

/// How long a key is remembered.
pub const KEY_LIFETIME_MS: i64 = 12 * 3600 * 1000;
/// A first request still "running" after this is taken to have died.
const STALE_AFTER_MS: i64 = 60 * 1000;
/// How long a repeat waits for the first request's answer before it is
/// refused (409), and how often it looks: Svix's 5 s and 200 ms.
const WAIT_FOR_FIRST: Duration = Duration::from_secs(5);
const WAIT_STEP: Duration = Duration::from_millis(200);

pub async fn idempotency(State(state): State<ApiState>, request: Request, next: Next) -> Response {
    if request.method() != Method::POST {
        return next.run(request).await;
    }
    let Some(key) = request
        .headers()
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .map(str::to_owned)
    else {
        return next.run(request).await;
    };
    if key.len() > 256 {
        return ApiError::BadRequest("Idempotency-Key must be at most 256 characters".into())
            .into_response();
    }
    let scope = request
        .extensions()
        .get::<Principal>()
        .map(|p| p.scope().to_owned())
        .unwrap_or_else(|| "admin".to_owned());
    let (parts, body) = request.into_parts();
    // One key per URL (path and query), as Svix keeps them: the same key
    // on another URL is another request, not a conflict.
    let url = parts.uri.path_and_query().map_or("", |p| p.as_str());
    let scoped = format!("{key}\n{url}");
    let bytes = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(_) => {
            return ApiError::PayloadTooLarge(format!(
                "request body exceeds {MAX_BODY_BYTES} bytes"
            ))
            .into_response()
        }
    };
    // Kept keyed (with HERALD_ENCRYPTION_KEY): the body may carry
    // credentials, and a plain digest would let whoever holds the database
    // test guesses of them.
    let hashes = state
        .keys
        .keyed_digests(&request_digest(&parts.method, &parts.uri, &bytes));
    let begin = || {
        let now = now_millis();
        let idem_key = IdemKey {
            key: &scoped,
            unscoped: Some(&key),
        };
        let (store, scope, hashes) = (&state.store, &scope, &hashes);
        async move {
            store
                .idempotency_begin(
                    scope,
                    &idem_key,
                    hashes,
                    now,
                    now - KEY_LIFETIME_MS,
                    now - STALE_AFTER_MS,
                )
                .await
        }
    };
    // A repeat sent while the first is still running (a client that timed
    // out and retried) waits for its answer, as Svix waits, rather than
    // being refused: the answer it then gets is the first one's, or it
    // runs itself when the first ended without keeping one.
    let mut begun = begin().await;
    let mut waited = Duration::ZERO;
    while matches!(begun, Ok(IdemBegin::InProgress)) && waited < WAIT_FOR_FIRST {
        tokio::time::sleep(WAIT_STEP).await;
        waited += WAIT_STEP;
        begun = begin().await;
    }
    match begun {
        Err(e) => return ApiError::from(e).into_response(),
        Ok(IdemBegin::Mismatch) => {
            return ApiError::Conflict(
                "this Idempotency-Key was already used for a different request".into(),
            )
            .into_response()
        }
        Ok(IdemBegin::InProgress) => {
            return ApiError::Conflict(format!(
                "a request with this Idempotency-Key is still in progress after {} s; \
                 repeat it later to get its answer",
                WAIT_FOR_FIRST.as_secs()
            ))
            .into_response()
        }
        Ok(IdemBegin::Replay { status, body }) => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
            let mut response = (status, body).into_response();
            let headers = response.headers_mut();
            headers.insert(
                axum::http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
            return response;
        }
        Ok(IdemBegin::Fresh) => {}
    }
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    let status = response.status();
    // Only a success is kept, as Svix keeps it: a request refused for
    // something the client then fixes (an application not yet made, a
    // field) runs again when repeated with its key, where the refusal was
    // answered again for 12 hours.
    if !status.is_success() {
        if let Err(e) = state.store.idempotency_abort(&scope, &scoped).await {
            tracing::warn!(error = %e, "could not release an idempotency key");
        }
        return response;
    }
    let (parts, body) = response.into_parts();
    let bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!(error = %e, "could not read a response to keep it");
            let _ = state.store.idempotency_abort(&scope, &scoped).await;
            return ApiError::Internal.into_response();
        }
    };
    let (kept_status, kept_body) = if parts.extensions.get::<ShownOnce>().is_some() {
        not_kept()
    } else if let Some(KeptBody(kept)) = parts.extensions.get::<KeptBody>() {
        (status, kept.clone())
    } else {
        (status, String::from_utf8_lossy(&bytes).into_owned())
    };
    if let Err(e) = state
        .store
        .idempotency_finish(&scope, &scoped, kept_status.as_u16(), &kept_body)
        .await
    {
        // The answer stands; a repeat would run again once the key is
        // taken to have died.
        tracing::warn!(error = %e, "could not keep an idempotent response");
    }
    Response::from_parts(parts, Body::from(bytes))
}

/// What makes two requests the same: method, path, query and body, the
/// body as JSON when it parses (so whitespace and object-key order do not
/// count), else as bytes. The JSON is walked once into the hash, keys of
/// each object in sorted order, with every value tagged and every string
/// length-prefixed, so no two different documents feed the same bytes.
/// Numbers count as written and repeated keys each count: Herald stores
/// and sends the body's own bytes, so two bodies that a parse would make
/// alike (a number past f64's precision, `{"a":1,"a":2}`) are different
/// requests.
pub fn request_digest(method: &Method, uri: &axum::http::Uri, body: &[u8]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(method.as_str().as_bytes());
    hasher.update(b" ");
    hasher.update(uri.path().as_bytes());
    hasher.update(b"?");
    hasher.update(uri.query().unwrap_or_default().as_bytes());
    hasher.update(b"\n");
    let mut as_json = hasher.clone();
    as_json.update(b"json:");
    match serde_json::from_slice::<&RawValue>(body).and_then(|v| feed_json(v, &mut as_json)) {
        Ok(()) => as_json.finalize().into(),
        Err(_) => {
            hasher.update(b"raw:");
            hasher.update(body);
            hasher.finalize().into()
        }
    }
}

/// An object's members in the order written, repeated keys included.
struct Members<'a>(Vec<(String, &'a RawValue)>);

impl<'de> serde::Deserialize<'de> for Members<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Members<'de>, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry::<String, &'de RawValue>()? {
                    members.push(member);
                }
                Ok(Members(members))
            }
        }
        d.deserialize_map(Visit)
    }
}

fn feed_json(value: &RawValue, hasher: &mut Sha256) -> serde_json::Result<()> {
    let text = |hasher: &mut Sha256, s: &str| {
        hasher.update((s.len() as u64).to_le_bytes());
        hasher.update(s.as_bytes());
    };
    let json = value.get().trim();
    match json.as_bytes().first() {
        Some(b'n') => hasher.update(b"n"),
        Some(b't') => hasher.update(b"t"),
        Some(b'f') => hasher.update(b"f"),
        Some(b'"') => {
            let s: String = serde_json::from_str(json)?;
            hasher.update(b"s");
            text(hasher, &s);
        }
        Some(b'[') => {
            let items: Vec<&RawValue> = serde_json::from_str(json)?;
            hasher.update(b"[");
            hasher.update((items.len() as u64).to_le_bytes());
            for item in items {
                feed_json(item, hasher)?;
            }
        }
        Some(b'{') => {
            let Members(mut members) = serde_json::from_str(json)?;
            // Stable: repeated keys keep their written order.
            members.sort_by(|a, b| a.0.cmp(&b.0));
            hasher.update(b"{");
            hasher.update((members.len() as u64).to_le_bytes());
            for (key, item) in members {
                text(hasher, &key);
                feed_json(item, hasher)?;
            }
        }
        // A number, as written.
        _ => {
            hasher.update(b"d");
            text(hasher, json);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(path: &str, body: &str) -> [u8; 32] {
        request_digest(&Method::POST, &path.parse().expect("uri"), body.as_bytes())
    }

    /// A body written as clients write them digests as it did before
    /// numbers counted as written (the digest the release before this
    /// one computed, recorded): an idempotent retry across the upgrade
    /// still finds its record.
    #[test]
    fn an_ordinary_body_digests_as_before() {
        let d = digest(
            "/api/v1/app/x/msg",
            r#"{"eventType":"a.b","payload":{"n":-12.5,"s":"x\u00e9","t":true,"z":null,"l":[1,{"b":2,"a":1}]}}"#,
        );
        assert_eq!(
            hex::encode(d),
            "ea79298e1ca8bcc32059da558b12be2a467d598c75e511e65cc4031ca92adabe"
        );
    }

    #[test]
    fn requests_are_the_same_when_their_json_means_the_same() {
        let a = digest(
            "/api/v1/app/x/msg",
            r#"{"eventType":"a","payload":{"x":1,"y":[1,2]}}"#,
        );
        let b = digest(
            "/api/v1/app/x/msg",
            "{ \"payload\" : { \"y\": [1, 2], \"x\": 1 },\n  \"eventType\": \"a\" }",
        );
        assert_eq!(a, b);
        // Each differs from `a` in one thing: a value, an order that
        // matters, a type, the path, the query.
        for (path, body) in [
            (
                "/api/v1/app/x/msg",
                r#"{"eventType":"a","payload":{"x":2,"y":[1,2]}}"#,
            ),
            (
                "/api/v1/app/x/msg",
                r#"{"eventType":"a","payload":{"x":1,"y":[2,1]}}"#,
            ),
            (
                "/api/v1/app/x/msg",
                r#"{"eventType":"a","payload":{"x":"1","y":[1,2]}}"#,
            ),
            (
                "/api/v1/app/y/msg",
                r#"{"eventType":"a","payload":{"x":1,"y":[1,2]}}"#,
            ),
            (
                "/api/v1/app/x/msg?with_content=false",
                r#"{"eventType":"a","payload":{"x":1,"y":[1,2]}}"#,
            ),
        ] {
            assert_ne!(a, digest(path, body), "{path} {body}");
        }
        // Strings that would run together without their lengths.
        assert_ne!(digest("/p", r#"{"ab":"c"}"#), digest("/p", r#"{"a":"bc"}"#));
        // What a parse would make alike is not: Herald sends the bytes.
        for (one, other) in [
            (
                r#"{"account":12345678901234567890123}"#,
                r#"{"account":12345678901234567890124}"#,
            ),
            (r#"{"amount":100,"amount":999}"#, r#"{"amount":999}"#),
            (r#"{"a":1,"a":2}"#, r#"{"a":2,"a":1}"#),
            (r#"[0.1000000000000000055511151231257827]"#, r#"[0.1]"#),
        ] {
            assert_ne!(digest("/p", one), digest("/p", other), "{one} {other}");
        }
        // Not JSON: compared as bytes.
        assert_eq!(digest("/p", "not json"), digest("/p", "not json"));
        assert_ne!(digest("/p", "not json"), digest("/p", "not  json"));
    }
}

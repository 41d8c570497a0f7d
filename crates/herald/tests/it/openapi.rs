//! `/api/v1/openapi.json`: served without a token, a sound OpenAPI 3
//! document, and complete: every route of `api::router` is in it with
//! exactly the methods the running server answers on it.
//!
//! The API's routes are registered from their annotations; the ones
//! registered by hand are read from the router's own source, and the
//! methods from the server itself (the `Allow` header of a 405), so neither
//! is a second list kept by hand: a route added without an annotation
//! fails here.

use std::collections::{BTreeMap, BTreeSet};

use axum::http::StatusCode;
use serde_json::Value;

use crate::helpers::*;

/// The file that holds `api::router`.
const ROUTER_SOURCE: &str = include_str!("../../src/api/mod.rs");

/// The HTTP methods an OpenAPI path item can name.
const METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

/// The string literal that starts `text` (after blanks), if any.
fn leading_literal(text: &str) -> Option<&str> {
    let rest = text.trim_start().strip_prefix('"')?;
    rest.find('"').map(|end| &rest[..end])
}

/// Every path given to `.route(` in `text`.
fn route_literals(text: &str) -> Vec<String> {
    text.match_indices(".route(")
        .map(|(at, call)| {
            leading_literal(&text[at + call.len()..])
                .unwrap_or_else(|| panic!("a `.route(` without a literal path at byte {at}"))
                .to_owned()
        })
        .collect()
}

/// The paths `api::router` registers by hand: those at the root (health,
/// readiness, metrics, this document, Svix's health routes). The API's own
/// are registered from their handlers' annotations (`api::v1_routes`), so
/// each is in the document by construction; a `.route(` added to the API's
/// router beside them would not be, and fails here.
fn hand_routed_paths() -> BTreeSet<String> {
    let start = ROUTER_SOURCE
        .find("pub fn router(")
        .expect("api/mod.rs defines `pub fn router(`");
    let body = &ROUTER_SOURCE[start..];
    let body = &body[..body.find("\n}\n").expect("router's body ends")];
    assert!(
        body.contains("v1_routes().split_for_parts()"),
        "the API's routes come from their annotations"
    );
    let api_start = body.find("let api = api").expect("the `api` router");
    let api_len = body[api_start..]
        .find(';')
        .expect("the `api` statement ends");
    assert!(
        !body[api_start..api_start + api_len].contains(".route("),
        "a route of the API registered by hand, not from its annotation"
    );
    assert!(
        body.contains(r#".nest("/api/v1", api)"#),
        "the `api` router is nested at /api/v1"
    );
    route_literals(body).into_iter().collect()
}

/// `/app/{app_id}` → `/app/x`: a path the router matches.
fn concrete(template: &str) -> String {
    let mut out = String::new();
    let mut in_param = false;
    for c in template.chars() {
        match c {
            '{' => in_param = true,
            '}' => {
                in_param = false;
                out.push('x');
            }
            _ if !in_param => out.push(c),
            _ => {}
        }
    }
    out
}

/// The methods the running server routes on `path`: a method that no route
/// uses is answered 405 with the allowed ones in `Allow`.
async fn served_methods(app: &TestApp, path: &str) -> BTreeSet<String> {
    let resp = app
        .client
        .request(reqwest::Method::TRACE, app.url(&concrete(path)))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("request reaches herald");
    assert_eq!(
        resp.status().as_u16(),
        405,
        "TRACE {path} should be 405 (is the path routed?)"
    );
    let allow = resp
        .headers()
        .get("allow")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_else(|| panic!("405 on {path} has an Allow header"))
        .to_owned();
    allow
        .split(',')
        .map(|m| m.trim().to_ascii_lowercase())
        // axum answers HEAD wherever GET is routed; the document names GET.
        .filter(|m| !m.is_empty() && m != "head")
        .collect()
}

/// Every `$ref` in `value`, with where it was found.
fn refs<'a>(value: &'a Value, at: String, out: &mut Vec<(String, &'a str)>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                if k == "$ref" {
                    if let Some(r) = v.as_str() {
                        out.push((at.clone(), r));
                    }
                }
                refs(v, format!("{at}/{k}"), out);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                refs(v, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

async fn fetch_document(app: &TestApp) -> Value {
    // No token: tools fetch the description before they have one.
    let resp = app
        .client
        .get(app.url("/api/v1/openapi.json"))
        .send()
        .await
        .expect("request reaches herald");
    assert_eq!(resp.status().as_u16(), 200);
    let content_type = header_text(resp.headers(), "content-type");
    assert!(
        content_type.starts_with("application/json"),
        "{content_type}"
    );
    let text = resp.text().await.expect("body");
    serde_json::from_str(&text).expect("the document is JSON")
}

#[tokio::test]
async fn openapi_document_is_served_without_a_token_and_is_sound() {
    let app = spawn_stepped(&[]).await;
    let doc = fetch_document(&app).await;

    let version = doc["openapi"].as_str().expect("`openapi` is a string");
    assert!(version.starts_with("3."), "openapi: {version}");
    assert_eq!(doc["info"]["title"], "Herald");
    assert!(doc["info"]["version"].is_string());
    let schemas = doc["components"]["schemas"]
        .as_object()
        .expect("components.schemas is an object");
    for name in [
        "ApplicationIn",
        "ApplicationOut",
        "EndpointIn",
        "EndpointOut",
        "EndpointPatch",
        "MessageIn",
        "MessageOut",
        "AttemptOut",
        "DeliveryOut",
        "EventTypeOut",
        "EndpointHealth",
        "ErrorBody",
        "ValidationErrorBody",
        "FieldError",
    ] {
        assert!(schemas.contains_key(name), "components.schemas.{name}");
    }
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"],
        serde_json::json!({"type": "http", "scheme": "bearer"})
    );
    assert_eq!(doc["security"], serde_json::json!([{"bearer": []}]));

    // Every reference points into this document, at something that exists.
    let mut found = Vec::new();
    refs(&doc, String::new(), &mut found);
    assert!(!found.is_empty());
    for (at, r) in &found {
        let pointer = r
            .strip_prefix('#')
            .unwrap_or_else(|| panic!("{at}: `{r}` is not local"));
        assert!(doc.pointer(pointer).is_some(), "{at}: `{r}` resolves");
    }

    // Each operation: a unique operationId, its path parameters declared,
    // and, behind the token, its 401 documented.
    let paths = doc["paths"].as_object().expect("paths is an object");
    let mut operation_ids = BTreeSet::new();
    for (path, item) in paths {
        let templated: BTreeSet<&str> = path
            .split('{')
            .skip(1)
            .filter_map(|s| s.split('}').next())
            .collect();
        for (method, op) in item.as_object().expect("path item is an object") {
            if !METHODS.contains(&method.as_str()) {
                continue;
            }
            let id = op["operationId"].as_str().expect("operationId");
            assert!(operation_ids.insert(id.to_owned()), "{id} is unique");
            let declared: BTreeSet<&str> = op["parameters"]
                .as_array()
                .map(|ps| {
                    ps.iter()
                        .filter(|p| p["in"] == "path")
                        .filter_map(|p| p["name"].as_str())
                        .collect()
                })
                .unwrap_or_default();
            assert_eq!(declared, templated, "{method} {path}: path parameters");
            let responses = op["responses"].as_object().expect("responses");
            assert!(
                responses.keys().any(|s| s.starts_with('2')),
                "{method} {path} documents its success"
            );
            let open = op["security"] == serde_json::json!([{}]);
            assert_eq!(
                open,
                !path.starts_with("/api/v1/")
                    || path == "/api/v1/openapi.json"
                    || path.starts_with("/api/v1/health"),
                "{method} {path}: only the root routes, Svix's health routes and this document need no token"
            );
            // 400 and 429 come from the middleware in front of every call
            // that needs a token; the open routes are routed beside it and
            // cannot give them.
            for status in ["401", "400", "429"] {
                if open {
                    assert!(
                        !responses.contains_key(status),
                        "{method} {path} is outside the API's layers: no {status}"
                    );
                } else {
                    assert_eq!(
                        responses[status]["content"]["application/json"]["schema"]["$ref"],
                        "#/components/schemas/ErrorBody",
                        "{method} {path} documents {status}"
                    );
                }
            }
        }
    }

    // The bounds the handlers enforce on stored strings are described.
    for (schema, field, max) in [
        ("ApplicationIn", "name", 256),
        ("ApplicationPatch", "name", 256),
        ("EndpointIn", "url", 65536),
        ("EndpointIn", "description", 4096),
        ("MessageIn", "eventId", 256),
        ("TokenIn", "name", 256),
        ("EventTypeIn", "description", 8192),
    ] {
        assert_eq!(
            schemas[schema]["properties"][field]["maxLength"], max,
            "{schema}.{field}: {}",
            schemas[schema]["properties"][field]
        );
    }

    // The token is still required everywhere else under /api/v1.
    let resp = app
        .client
        .get(app.url("/api/v1/app"))
        .send()
        .await
        .expect("request reaches herald");
    assert_eq!(resp.status().as_u16(), 401);
}

#[tokio::test]
async fn openapi_document_has_every_route_with_its_methods() {
    let app = spawn_stepped(&[]).await;
    let doc = fetch_document(&app).await;

    let routed = hand_routed_paths();
    // Guards the source reading itself: a parse that finds nothing passes
    // nothing.
    for expected in ["/healthz", "/metrics", "/api/v1/openapi.json"] {
        assert!(routed.contains(expected), "router has {expected}");
    }

    let documented: BTreeMap<String, BTreeSet<String>> = doc["paths"]
        .as_object()
        .expect("paths is an object")
        .iter()
        .map(|(path, item)| {
            let methods = item
                .as_object()
                .expect("path item is an object")
                .keys()
                .filter(|k| METHODS.contains(&k.as_str()))
                .cloned()
                .collect();
            (path.clone(), methods)
        })
        .collect();
    for expected in [
        "/api/v1/app",
        "/api/v1/app/{app_id}/msg",
        "/api/v1/app/{app_id}/endpoint/{endpoint_id}",
    ] {
        assert!(documented.contains_key(expected), "document has {expected}");
    }

    let missing: Vec<_> = routed
        .iter()
        .filter(|p| !documented.contains_key(*p))
        .collect();
    assert!(
        missing.is_empty(),
        "routes without an OpenAPI path: {missing:?}"
    );

    // Every documented path is routed (TRACE is a 405, not a 404) with
    // exactly the methods documented.
    for (path, methods) in &documented {
        let served = served_methods(&app, path).await;
        assert_eq!(
            &served, methods,
            "{path}: methods routed (left) vs documented (right)"
        );
    }

    // And the document's own example of a protected call answers as
    // documented: a list envelope with `iterator` present.
    let (status, body) = app.get("/api/v1/app").await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.get("iterator").is_some(), "{body}");
}

/// What schemathesis found (`.ci/schemathesis`), kept fixed: a body that is
/// JSON but not an object, and a boolean query parameter that is neither
/// `true` nor `false`, are 422s naming the problem, not silently taken.
#[tokio::test]
async fn schemathesis_findings_stay_fixed() {
    let app = spawn_stepped(&[]).await;
    let (status, created) = app
        .post(
            "/api/v1/app",
            serde_json::json!({"name": "Acme", "uid": "acme"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");

    // serde's derived structs take an array as the fields in order: this
    // PATCH used to clear the uid.
    for body in [
        serde_json::json!([null, null]),
        serde_json::json!(null),
        serde_json::json!("x"),
    ] {
        let (status, err) = app.patch("/api/v1/app/acme", body).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{err}");
        assert_eq!(err["detail"][0]["loc"], serde_json::json!(["body"]));
    }
    let (status, kept) = app.get("/api/v1/app/acme").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(kept["uid"], "acme");

    // Malformed JSON is still a 400, whatever it starts with.
    let resp = app
        .client
        .patch(app.url("/api/v1/app/acme"))
        .bearer_auth(TOKEN)
        .body("[1,")
        .send()
        .await
        .expect("request reaches herald");
    assert_eq!(resp.status().as_u16(), 400);

    let (status, err) = app
        .post(
            "/api/v1/app?get_if_exists=yes",
            serde_json::json!({"name": "Acme", "uid": "acme"}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{err}");
    assert_eq!(
        err["detail"][0]["loc"],
        serde_json::json!(["query", "get_if_exists"])
    );
    let (status, _) = app
        .post(
            "/api/v1/app?get_if_exists=true",
            serde_json::json!({"name": "Acme", "uid": "acme"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);

    app.create_event_types(&["invoice.paid"]).await;
    let (status, err) = app
        .delete("/api/v1/event-type/invoice.paid?expunge=AAA")
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{err}");
    assert_eq!(
        err["detail"][0]["loc"],
        serde_json::json!(["query", "expunge"])
    );
    let (status, et) = app.get("/api/v1/event-type/invoice.paid").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(et["archived"], false, "nothing happened: {et}");
}

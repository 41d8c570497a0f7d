//! The OpenAPI 3 description of the HTTP API, served at
//! `/api/v1/openapi.json`. It is derived from the handlers' `#[utoipa::path]`
//! annotations and the request and response types themselves (their serde
//! names included), so renaming a field changes the description with it.
//! The test `tests/it/openapi.rs` checks that every route of [`super::router`]
//! is in it with exactly the methods the router answers.

use axum::response::IntoResponse;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::OpenApi;

/// The whole description: the token-free routes at the root, the API under
/// `/api/v1`. The dashboard (HTML with its own log-in) is not part of it.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Herald",
        description = "Durable, signed, retried outbound webhooks. The API is shaped like \
                       Svix's API v1 (camelCase JSON, prefixed ids, list envelopes \
                       `{data, iterator, prevIterator, done}`, errors `{code, detail}`), \
                       so the official Svix SDKs can drive it.",
    ),
    paths(
        super::healthz,
        super::readyz,
        super::svix_health,
        super::health_ping,
        super::metrics,
        openapi_json
    ),
    // Those only named by error responses, parameter types and optional
    // bodies, which the derive does not collect by itself. (An optional body
    // is named by reference: given as its type, utoipa would mark it
    // required, or as `Option<T>` allow `null`, while it may be absent,
    // never null.)
    components(schemas(
        super::error::ErrorBody,
        super::error::ValidationErrorBody,
        super::error::FieldError,
        super::ListOrder,
        super::endpoints::DisableIn,
        super::endpoint_secrets::RotateIn,
        super::auth::TokenIn,
        super::portal_access::AppPortalAccessIn,
        super::portal_access::ApplicationTokenExpireIn,
        super::auth::Capability,
    )),
    security(("bearer" = [])),
)]
pub struct HeraldApi;

/// The routes under `/api/v1` that the API's layers stand in front of
/// (this document is served beside them, without a token).
fn is_api_route(path: &str) -> bool {
    path.starts_with("/api/v1/") && path != "/api/v1/openapi.json"
}

/// The operations of a path item, for the modifiers that add to each.
fn operations(
    item: &mut utoipa::openapi::PathItem,
) -> impl Iterator<Item = &mut utoipa::openapi::path::Operation> {
    [
        &mut item.get,
        &mut item.put,
        &mut item.post,
        &mut item.delete,
        &mut item.patch,
    ]
    .into_iter()
    .flatten()
}

/// Declares the `bearer` scheme that `security(("bearer" = []))` refers to:
/// the admin token in `Authorization: Bearer …`.
struct BearerScheme;

impl utoipa::Modify for BearerScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

/// Every POST under `/api/v1` passes through `idempotency::idempotency`,
/// so each gets its header, its 400 (a key over 256 characters) and its 409
/// (the key reused), here rather than in each handler's annotation.
struct IdempotencyKey;

impl utoipa::Modify for IdempotencyKey {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::path::{ParameterBuilder, ParameterIn};
        use utoipa::openapi::{ObjectBuilder, Required, Type};
        let responses = {
            use utoipa::IntoResponses;
            let mut all = super::error::BadRequestResponse::responses();
            all.extend(super::error::ConflictResponse::responses());
            all
        };
        for (path, item) in openapi.paths.paths.iter_mut() {
            let Some(post) = item.post.as_mut() else {
                continue;
            };
            if !is_api_route(path) {
                continue;
            }
            post.parameters.get_or_insert_with(Vec::new).push(
                ParameterBuilder::new()
                    .name("idempotency-key")
                    .parameter_in(ParameterIn::Header)
                    .required(Required::False)
                    .description(Some(
                        "A repeat within 12 h gets the first answer again and changes \
                         nothing; the same key with another request is a 409.",
                    ))
                    .schema(Some(
                        ObjectBuilder::new()
                            .schema_type(Type::String)
                            .max_length(Some(256)),
                    ))
                    .build(),
            );
            for (status, response) in &responses {
                post.responses
                    .responses
                    .entry(status.clone())
                    .or_insert_with(|| response.clone());
            }
        }
    }
}

/// What the layers in front of every handler under `/api/v1` may answer,
/// here rather than in each annotation: 400 for a path or query parameter
/// that is not text (`path_params_are_text`, `ApiQuery`), 401 without a
/// token that reaches the route and 429 for an address over its
/// failed-authentication limit (`auth::require_token`); and for a call
/// with a body, 413 and 422 (`ApiJson`: too large, or not what the schema
/// says). An operation annotated `security(())` (Svix's health routes) is
/// routed beside those layers, not behind them (`api::router`), so it gets
/// none of their answers.
struct CommonErrors;

impl utoipa::Modify for CommonErrors {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use super::error::{
            BadRequestResponse, PayloadTooLargeResponse, TooManyRequestsResponse,
            UnauthorizedResponse, ValidationResponse,
        };
        use utoipa::IntoResponses;
        let mut from_layers = BadRequestResponse::responses();
        from_layers.extend(UnauthorizedResponse::responses());
        from_layers.extend(TooManyRequestsResponse::responses());
        let mut with_body = PayloadTooLargeResponse::responses();
        with_body.extend(ValidationResponse::responses());
        for (path, item) in openapi.paths.paths.iter_mut() {
            if !is_api_route(path) {
                continue;
            }
            for op in operations(item) {
                let behind_layers = !op.security.as_ref().is_some_and(|required| {
                    required.contains(&utoipa::openapi::security::SecurityRequirement::default())
                });
                let has_body = op.request_body.is_some();
                let responses = from_layers
                    .iter()
                    .filter(|_| behind_layers)
                    .chain(with_body.iter().filter(|_| has_body));
                for (status, response) in responses {
                    op.responses
                        .responses
                        .entry(status.clone())
                        .or_insert_with(|| response.clone());
                }
            }
        }
    }
}

/// What each path parameter is, by name: written once here rather than
/// in each of the ~50 annotations whose path names it.
const PATH_PARAMS: &[(&str, &str)] = &[
    ("app_id", "The application's id (app_…) or uid"),
    ("endpoint_id", "The endpoint's id (ep_…) or uid"),
    ("msg_id", "The message's id (msg_…) or eventId"),
    ("attempt_id", "The attempt's id (atmpt_…)"),
    ("delivery_id", "The delivery's id (dlv_…)"),
    ("token_id", "The token's id (tok_…)"),
    ("event_type_name", "The event type's name"),
];

/// Gives every operation each parameter of its path template, in the
/// template's order and ahead of its query parameters, described from
/// [`PATH_PARAMS`]; one an annotation describes itself keeps that
/// description (`PUT /app/{app_id}` says what a new uid does).
struct PathParams;

impl utoipa::Modify for PathParams {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::path::{Parameter, ParameterBuilder, ParameterIn};
        use utoipa::openapi::{ObjectBuilder, Required, Type};
        for (path, item) in openapi.paths.paths.iter_mut() {
            let names: Vec<&str> = path
                .split('/')
                .filter_map(|part| part.strip_prefix('{')?.strip_suffix('}'))
                .collect();
            if names.is_empty() {
                continue;
            }
            for op in operations(item) {
                let params = op.parameters.get_or_insert_with(Vec::new);
                let mut in_path: Vec<Parameter> = Vec::new();
                for name in &names {
                    let description = PATH_PARAMS
                        .iter()
                        .find(|(known, _)| known == name)
                        .map(|(_, d)| *d);
                    let declared = params
                        .iter()
                        .position(|p| p.name == *name && p.parameter_in == ParameterIn::Path);
                    in_path.push(match declared {
                        Some(at) => {
                            let mut p = params.remove(at);
                            if p.description.is_none() {
                                p.description = description.map(str::to_owned);
                            }
                            p
                        }
                        None => ParameterBuilder::new()
                            .name(*name)
                            .parameter_in(ParameterIn::Path)
                            .required(Required::True)
                            .description(description)
                            .schema(Some(ObjectBuilder::new().schema_type(Type::String)))
                            .build(),
                    });
                }
                params.splice(0..0, in_path);
            }
        }
    }
}

/// The description as JSON. Built once per process: it never changes while
/// the process runs.
pub fn document() -> &'static str {
    static DOCUMENT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DOCUMENT.get_or_init(|| {
        let (_, v1) = super::v1_routes().split_for_parts();
        let mut whole = HeraldApi::openapi().nest("/api/v1", v1);
        // After the nest: they add to the routes under `/api/v1`.
        for modifier in [
            &BearerScheme as &dyn utoipa::Modify,
            &IdempotencyKey,
            &CommonErrors,
            &PathParams,
        ] {
            modifier.modify(&mut whole);
        }
        whole.to_json().unwrap_or_else(|e| {
            // Serializing in-memory structs of strings and maps cannot fail;
            // if it ever did, say so instead of serving a broken document.
            tracing::error!(error = %e, "cannot serialize the OpenAPI description");
            String::from("{}")
        })
    })
}

/// This document (no token).
#[utoipa::path(
    get,
    path = "/api/v1/openapi.json",
    tag = "Health",
    security(()),
    responses((status = 200, description = "This OpenAPI 3 description", body = Object)),
)]
pub async fn openapi_json() -> axum::response::Response {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        document(),
    )
        .into_response()
}

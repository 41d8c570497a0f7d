//! Herald's one integration-test binary: every test starts the real server
//! on port 0 with a fresh SQLite file, and delivers to real receivers on
//! 127.0.0.1.

mod api;
mod audit;
mod binary;
mod completions;
mod dashboard;
mod delivery;
mod egress;
mod egress_parts;
mod endpoint_health;
mod endpoint_writes;
mod engine;
mod expunge;
mod gates;
mod helpers;
mod listener_and_operator;
mod listener_tls;
mod message_fields;
mod metrics;
mod openapi;
mod outbox;
mod parsers_fuzzed;
mod readme;
mod replay_missing;
mod scale_out;
mod sdk;
mod secrets_at_rest;
mod security;
mod send_example;
mod store_conformance;
mod tenancy;
mod tracing_otlp;

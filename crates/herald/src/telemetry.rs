//! Logs, and optional OpenTelemetry traces (`HERALD_OTLP_ENDPOINT`).
//!
//! Spans meant for export are `trace`-level spans of target [`TARGET`]:
//! the log layer (`HERALD_LOG`, `info` by default) never enables them, so
//! with export off their callsites are disabled and cost a relaxed load.
//! With export on, only the OTLP layer sees them. They carry ids, counts,
//! statuses and durations: never a payload, a secret or a header value.

use std::str::FromStr;

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::{EnvFilter, LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

use crate::config::Config;

/// The target of every span that is exported.
pub const TARGET: &str = "herald::otel";

/// The exporter, flushed at shutdown.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Sends the spans still buffered (bounded by the exporter's timeout).
    pub fn shutdown(&self) {
        if let Some(provider) = &self.provider {
            if let Err(e) = provider.shutdown() {
                tracing::warn!(error = %e, "OpenTelemetry export did not shut down cleanly");
            }
        }
    }
}

/// Installs the process's subscriber: the log, and the OTLP exporter when
/// configured.
pub fn init(config: &Config) -> anyhow::Result<Telemetry> {
    // Checked when the configuration was read (`HERALD_LOG`).
    let filter = EnvFilter::from_str(&config.telemetry.log)
        .map_err(|e| anyhow::anyhow!("HERALD_LOG: {e}"))?;
    // Logs go to stderr: stdout carries what Herald prints for people and
    // scripts (the generated admin token, the address it listens on).
    // Colours only for a terminal: a log file or a collector gets plain text.
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(filter);
    let Some(otlp) = &config.telemetry.otlp else {
        tracing_subscriber::registry().with(log).try_init()?;
        return Ok(Telemetry { provider: None });
    };
    use opentelemetry_otlp::{WithExportConfig, WithHttpConfig as _};
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(format!("{}/v1/traces", otlp.endpoint.trim_end_matches('/')))
        .with_timeout(std::time::Duration::from_secs(10))
        .with_headers(Default::default())
        .build()
        .map_err(|e| anyhow::anyhow!("HERALD_OTLP_ENDPOINT: {e}"))?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        // A sampled caller's trace is kept whatever the ratio.
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            otlp.sample_ratio,
        ))))
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(otlp.service_name.clone())
                .build(),
        )
        .build();
    let tracer = provider.tracer("herald");
    let spans = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(Targets::new().with_target(TARGET, LevelFilter::TRACE));
    tracing_subscriber::registry()
        .with(log)
        .with(spans)
        .try_init()?;
    tracing::info!(
        endpoint = %crate::net::masked_url(&otlp.endpoint),
        ratio = otlp.sample_ratio,
        "exporting traces over OTLP"
    );
    Ok(Telemetry {
        provider: Some(provider),
    })
}

/// Makes `span` a child of the W3C `traceparent` given (a caller's, or the
/// one stored with a message). Nothing happens when the span is disabled.
pub fn set_parent(span: &tracing::Span, traceparent: Option<&str>) {
    let Some(traceparent) = traceparent else {
        return;
    };
    if span.is_disabled() {
        return;
    }
    let cx = TraceContextPropagator::new().extract(&One(traceparent));
    let _ = span.set_parent(cx);
}

/// The `traceparent` naming `span` (exported), if it is being recorded.
pub fn traceparent_of(span: &tracing::Span) -> Option<String> {
    if span.is_disabled() {
        return None;
    }
    let mut injected = None;
    TraceContextPropagator::new().inject_context(&span.context(), &mut Inject(&mut injected));
    injected.filter(|t: &String| !t.starts_with("00-00000000000000000000000000000000"))
}

/// A W3C `traceparent` value as received: checked for its shape only
/// (`00-<32 hex>-<16 hex>-<2 hex>`, ids not all zero), so what Herald
/// stores and forwards is never arbitrary text.
pub fn valid_traceparent(value: &str) -> Option<&str> {
    let parts: Vec<&str> = value.split('-').collect();
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    };
    let [version, trace, parent, flags] = parts[..] else {
        return None;
    };
    let ok = version == "00"
        && hex(trace, 32)
        && hex(parent, 16)
        && hex(flags, 2)
        && trace.bytes().any(|b| b != b'0')
        && parent.bytes().any(|b| b != b'0');
    ok.then_some(value)
}

struct One<'a>(&'a str);

impl Extractor for One<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        (key == "traceparent").then_some(self.0)
    }
    fn keys(&self) -> Vec<&str> {
        vec!["traceparent"]
    }
}

struct Inject<'a>(&'a mut Option<String>);

impl Injector for Inject<'_> {
    fn set(&mut self, key: &str, value: String) {
        if key == "traceparent" {
            *self.0 = Some(value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_well_formed_traceparents_are_kept() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(valid_traceparent(good), Some(good));
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
        ] {
            assert_eq!(valid_traceparent(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_disabled_span_has_no_traceparent() {
        assert_eq!(traceparent_of(&tracing::Span::none()), None);
    }
}

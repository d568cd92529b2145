//! Trace context from publish to consumer (feature `trace-context`), through
//! OpenTelemetry's API (`opentelemetry`, the W3C propagator of
//! `opentelemetry_sdk`):
//!
//! - [`Outbox::publish`](crate::Outbox::publish) records the current context
//!   (`opentelemetry::Context::current()`) in the event's headers as W3C
//!   [`HEADER_TRACEPARENT`] and [`HEADER_TRACESTATE`], unless the event names
//!   a `traceparent` of its own or no span is current;
//! - the relay's send of a batch is a span (`<destination> publish`, kind
//!   producer) with a link to each event's context: a batch has many
//!   parents, so they are links, not a parent;
//! - the Kafka and RabbitMQ consumer loops run the handler inside a span
//!   (`<event type> process`, kind consumer) whose parent is the publisher's
//!   context, attached as the current context while the handler runs, so its
//!   own spans nest under it.
//!
//! The spans go to the global tracer provider
//! (`opentelemetry::global::set_tracer_provider`), tracer `txbox`; with none
//! set they cost next to nothing. The API works on plain threads: its current
//! context is a thread-local, which a blocking service sets with
//! `Context::attach`. A service that traces with `tracing` and
//! `tracing-opentelemetry` attaches its span's context around the publish
//! (`let _g = tracing::Span::current().context().attach();`), and reads the
//! consumer's span the same way. Without the feature nothing of this is in
//! the build.

use std::collections::BTreeMap;

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{Link, SpanKind, TraceContextExt, Tracer};
use opentelemetry::{global, Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;

use crate::event::{Event, EventId};

/// The W3C trace context header publish records.
pub const HEADER_TRACEPARENT: &str = "traceparent";
/// The W3C trace state header publish records with it.
pub const HEADER_TRACESTATE: &str = "tracestate";

/// The instrumentation scope of txbox's spans.
const TRACER: &str = "txbox";

/// An event's headers as the propagator reads and writes them.
struct Headers<'a>(&'a mut BTreeMap<String, String>);

impl Injector for Headers<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key.to_owned(), value);
    }
}

/// Headers read by the propagator.
struct ReadHeaders<'a>(&'a BTreeMap<String, String>);

impl Extractor for ReadHeaders<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

/// Records the current context in `headers` (publish), unless they name a
/// `traceparent` already or no span is current.
pub(crate) fn inject(headers: &mut BTreeMap<String, String>) {
    if headers.contains_key(HEADER_TRACEPARENT) {
        return;
    }
    let cx = Context::current();
    if !cx.span().span_context().is_valid() {
        return;
    }
    TraceContextPropagator::new().inject_context(&cx, &mut Headers(headers));
}

/// The context recorded in `headers`, or an empty one.
fn extract(headers: &BTreeMap<String, String>) -> Context {
    TraceContextPropagator::new().extract(&ReadHeaders(headers))
}

/// The span of one batch's send: open from the handover to the sender until
/// the broker's acks, then ended (on drop).
pub(crate) struct BatchSpan(global::BoxedSpan);

impl BatchSpan {
    /// A span for sending `events` to `destination`, linked to each event's
    /// recorded context.
    pub(crate) fn start(destination: &str, events: &[Event]) -> BatchSpan {
        let links: Vec<Link> = events
            .iter()
            .map(|e| extract(&e.headers).span().span_context().clone())
            .filter(|sc| sc.is_valid())
            .map(Link::with_context)
            .collect();
        let tracer = global::tracer(TRACER);
        let span = tracer
            .span_builder(format!("{destination} publish"))
            .with_kind(SpanKind::Producer)
            .with_links(links)
            .with_attributes([
                KeyValue::new("messaging.operation.type", "send"),
                KeyValue::new("messaging.destination.name", destination.to_owned()),
                KeyValue::new("messaging.batch.message_count", events.len() as i64),
            ])
            .start_with_context(&tracer, &Context::new());
        BatchSpan(span)
    }

    /// Records how many of the batch's events the broker did not take.
    pub(crate) fn failed(&mut self, n: usize) {
        use opentelemetry::trace::Span;
        if n > 0 {
            self.0
                .set_attribute(KeyValue::new("txbox.failed_count", n as i64));
            self.0
                .set_status(opentelemetry::trace::Status::error(format!(
                    "{n} events not acked"
                )));
        }
    }
}

/// A received message, as much of it as its span needs.
pub(crate) struct Received<'a> {
    pub(crate) event_type: Option<&'a str>,
    pub(crate) id: Option<EventId>,
    pub(crate) headers: &'a BTreeMap<String, String>,
}

/// Runs `handle` inside a span whose parent is the context `event` carries
/// (the publisher's), attached as the current context meanwhile.
pub(crate) fn in_consumer_span<T>(event: Received<'_>, handle: impl FnOnce() -> T) -> T {
    let parent = extract(event.headers);
    let tracer = global::tracer(TRACER);
    let name = event.event_type.unwrap_or("event");
    let mut builder = tracer
        .span_builder(format!("{name} process"))
        .with_kind(SpanKind::Consumer)
        .with_attributes([KeyValue::new("messaging.operation.type", "process")]);
    if let Some(id) = event.id {
        builder = builder.with_attributes([
            KeyValue::new("messaging.operation.type", "process"),
            KeyValue::new("messaging.message.id", id.to_string()),
        ]);
    }
    let span = builder.start_with_context(&tracer, &parent);
    let cx = parent.with_span(span);
    let guard = cx.clone().attach();
    let out = handle();
    drop(guard);
    cx.span().end();
    out
}

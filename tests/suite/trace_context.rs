//! The W3C trace context from publish to consumer (feature `trace-context`),
//! through the real brokers: the spans go to the OpenTelemetry SDK's
//! in-memory exporter, set as the process's global tracer provider (other
//! tests' spans land there too: each test reads only its own trace).

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use opentelemetry::trace::{SpanContext, SpanKind, TraceContextExt, Tracer};
use opentelemetry::{global, Context};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};

use crate::common::*;
use txbox::{Config, Outbox, Relay, SenderFactory, StopSignal};

/// The exporter every span of this process goes to.
fn exporter() -> &'static InMemorySpanExporter {
    static EXPORTER: OnceLock<InMemorySpanExporter> = OnceLock::new();
    EXPORTER.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        global::set_tracer_provider(provider);
        exporter
    })
}

/// The finished spans of `trace`.
fn spans_of(publisher: &SpanContext) -> Vec<SpanData> {
    exporter()
        .get_finished_spans()
        .unwrap()
        .into_iter()
        .filter(|s| s.span_context.trace_id() == publisher.trace_id())
        .collect()
}

/// Publishes one event of type `e` on the tables of `p` inside a span of the
/// test's ("place order"), relays it with `sender` to `destination`, runs
/// `consume` with a handler that records the current span context, and
/// checks the trace: the handler runs in the consumer's span, whose parent
/// is the publisher's span in the publisher's trace, and the relay's send of
/// the batch is a producer span linked to the publisher's context.
pub(crate) fn traced_through(
    p: &str,
    destination: &str,
    sender: impl SenderFactory,
    consume: impl FnOnce(Handler) -> (StopSignal, std::thread::JoinHandle<()>),
) {
    exporter();
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let config = Config::builder()
        .table_prefix(p)
        .defaults(|e| e.adaptive_polling(ms(20), ms(200), 1.5))
        .event("e", |e| e.destination(destination))
        .build()
        .unwrap();
    let outbox = Outbox::new(&config).unwrap();
    let tracer = global::tracer("txbox-test");
    let cx = Context::new().with_span(tracer.start("place order"));
    let publisher = cx.span().span_context().clone();
    {
        let _attached = cx.clone().attach();
        let mut tx = client.transaction().unwrap();
        outbox.publish(&mut tx, "e", &"traced").unwrap();
        tx.commit().unwrap();
    }
    cx.span().end();
    let relay = Relay::start(store, &config, sender).unwrap();
    let seen: Arc<Mutex<Vec<(SpanContext, String)>>> = Arc::default();
    let got = {
        let seen = seen.clone();
        consume_events(1, move |mut h| {
            consume(Box::new(move |e| {
                let current = Context::current().span().span_context().clone();
                let traceparent = e.headers.get("traceparent").cloned().unwrap_or_default();
                seen.lock().unwrap().push((current, traceparent));
                h(e)
            }))
        })
    };
    relay.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(got.len(), 1);
    let (handler_span, traceparent) = seen.lock().unwrap()[0].clone();
    assert_eq!(
        traceparent,
        format!("00-{}-{}-01", publisher.trace_id(), publisher.span_id()),
        "the event carries the publisher's context"
    );
    assert_eq!(
        handler_span.trace_id(),
        publisher.trace_id(),
        "the handler runs in the publisher's trace"
    );
    let spans = spans_of(&publisher);
    let consumer = spans
        .iter()
        .find(|s| s.span_context.span_id() == handler_span.span_id())
        .expect("the handler's span exported");
    assert_eq!(consumer.span_kind, SpanKind::Consumer);
    assert_eq!(consumer.name, "e process");
    assert_eq!(
        consumer.parent_span_id,
        publisher.span_id(),
        "its parent is the publisher's span"
    );
    assert!(consumer.parent_span_is_remote);
    // the send of the batch: its own trace, linked to the event's context
    let producer = exporter()
        .get_finished_spans()
        .unwrap()
        .into_iter()
        .find(|s| {
            s.span_kind == SpanKind::Producer
                && s.links.iter().any(|l| {
                    // the link's context came from the headers: remote
                    l.span_context.trace_id() == publisher.trace_id()
                        && l.span_context.span_id() == publisher.span_id()
                })
        })
        .expect("the relay's send span, linked to the publisher");
    assert_eq!(producer.name, format!("{destination} publish"));
}

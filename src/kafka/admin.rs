//! Topic creation, for brokers that do not create topics themselves.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::RDKafkaErrorCode;

use super::kafka_err;
use crate::error::{Error, Result};

/// Creates `topic` with `partitions` partitions (replication 1) unless it exists.
/// For brokers that do not auto-create topics (Tansu) and for tests and demos;
/// production topics are usually managed elsewhere.
///
/// ```no_run
/// txbox::kafka::ensure_topic("127.0.0.1:9092", "orders", 3).unwrap();
/// ```
pub fn ensure_topic(bootstrap_servers: &str, topic: &str, partitions: i32) -> Result<()> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap_servers)
        .create()
        .map_err(|e| kafka_err("admin client", e))?;
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let opts = AdminOptions::new().request_timeout(Some(Duration::from_secs(10)));
    let results =
        block_on(admin.create_topics([&new], &opts)).map_err(|e| kafka_err("create topic", e))?;
    for r in results {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => {
                return Err(Error::broker(format!(
                    "kafka create topic {name}: {code:?}"
                )))
            }
        }
    }
    Ok(())
}

/// Runs a future to completion on this thread (rdkafka's admin calls are futures
/// completed by librdkafka's own thread; no runtime is needed).
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    use std::task::{Context, Poll, Wake, Waker};
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

//! RabbitMQ (feature `rabbitmq`): a [`RabbitSender`] for the relay and a
//! [`RabbitConsumer`] loop, on `amiquip`.
//!
//! ## Message contract
//! - exchange: the event type's `destination`; routing key: its `routing_key`
//!   (default: the event type);
//! - body: the JSON payload; `content_type` `application/json`; `type` the event type;
//! - `message_id` and the header `txbox-event-id`: the event id; header
//!   `txbox-event-type`: the event type; `txbox-event-key`: the event's key, when
//!   it has one; then the user's headers (string values);
//! - persistent (`delivery_mode` 2) and `mandatory`: a message no queue takes comes
//!   back as a failure and is never counted as sent.
//!
//! Each relay thread gets its own connection and channel with publisher confirms; a
//! batch waits for the broker's ack of every message, while the relay publishes its
//! next batch on the same channel ([`Sender::start`](crate::Sender::start)). A dropped connection fails
//! the unconfirmed messages of every batch in flight and is opened again on a later
//! batch, with backoff.
//!
//! The sender is in `sender.rs`, the consumer loop in `consumer.rs`; each item
//! has one path: `txbox::rabbitmq::...`.

use std::time::Duration;

mod consumer;
mod sender;

pub use consumer::{OnError, RabbitConsumer, RabbitConsumerBuilder};
pub use sender::{RabbitSender, RabbitSenderBuilder};

/// Opens a plain-TCP AMQP connection (`amqp://`; TLS is not built in) with
/// `TCP_NODELAY` set.
///
/// amiquip does not set it, and it writes a message's frames (method, header,
/// body) as its I/O thread receives them, sometimes in two writes. With Nagle's
/// algorithm on, the second write then waits for the broker's delayed ACK of the
/// first: 40 ms on Linux, measured as a p99 of 44-49 ms per event on some
/// connections (docs/BENCHMARKS.md). So the socket is opened here, and the URL
/// read as amiquip reads it: user and password, virtual host, and the
/// `heartbeat`, `channel_max` and `connection_timeout` parameters. A URL this
/// does not read in full goes to amiquip's own `open`, which connects without
/// `TCP_NODELAY` or reports what is wrong with the URL.
pub(crate) fn open(
    url: &str,
    tuning: amiquip::ConnectionTuning,
) -> std::result::Result<amiquip::Connection, amiquip::Error> {
    match nodelay_stream(url) {
        Some((stream, options)) => {
            amiquip::Connection::insecure_open_stream(stream, options, tuning)
        }
        None => amiquip::Connection::insecure_open_tuned(url, tuning),
    }
}

/// The socket (connecting, `TCP_NODELAY` on) and the options of an `amqp://`
/// URL; `None` for any URL amiquip should read itself.
fn nodelay_stream(
    url: &str,
) -> Option<(
    mio::net::TcpStream,
    amiquip::ConnectionOptions<amiquip::Auth>,
)> {
    use amiquip::{Auth, ConnectionOptions};
    let url = url::Url::parse(url).ok()?;
    if url.scheme() != "amqp" {
        return None;
    }
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .ok()
            .map(|s| s.into_owned())
    };
    let mut options = ConnectionOptions::<Auth>::default();
    // `amqp://host` has no path at all, `amqp://host/` an empty one: both the
    // default virtual host
    if let Some(mut path) = url.path_segments() {
        match path.next() {
            None | Some("") => {}
            Some(vhost) => options = options.virtual_host(decode(vhost)?),
        }
        if path.next().is_some() {
            return None;
        }
    }
    if !url.username().is_empty() || url.password().is_some() {
        let username = match url.username() {
            "" => "guest".to_string(),
            u => decode(u)?,
        };
        let password = decode(url.password().unwrap_or("guest"))?;
        options = options.auth(Auth::Plain { username, password });
    }
    for (k, v) in url.query_pairs() {
        options = match k.as_ref() {
            "heartbeat" => options.heartbeat(v.parse().ok()?),
            "channel_max" => options.channel_max(v.parse().ok()?),
            "connection_timeout" => {
                options.connection_timeout(Some(Duration::from_millis(v.parse().ok()?)))
            }
            _ => return None,
        };
    }
    let host = match url.host_str() {
        None | Some("") => "localhost",
        Some(h) => h,
    };
    let addr = std::net::ToSocketAddrs::to_socket_addrs(&(host, url.port().unwrap_or(5672)))
        .ok()?
        .next()?;
    let stream = mio::net::TcpStream::connect(&addr).ok()?;
    stream.set_nodelay(true).ok()?;
    Some((stream, options))
}

/// Shortest and longest wait before a lost connection is opened again.
pub(crate) const MIN_RECONNECT: Duration = Duration::from_millis(100);
pub(crate) const MAX_RECONNECT: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::nodelay_stream;

    /// Connecting needs no broker: the socket is non-blocking and still connecting.
    #[test]
    fn the_url_forms_in_use_get_a_socket_with_nodelay() {
        for url in [
            "amqp://guest:guest@127.0.0.1:5672",
            "amqp://guest:guest@127.0.0.1:5672/",
            "amqp://guest:guest@127.0.0.1:5672/%2f",
            "amqp://us%40er:p%3Ass@127.0.0.1:5672/vhost?heartbeat=30&connection_timeout=5000",
            "amqp://127.0.0.1?channel_max=16",
        ] {
            let (stream, _) = nodelay_stream(url).unwrap_or_else(|| panic!("{url} not read"));
            assert!(stream.nodelay().unwrap(), "{url}: TCP_NODELAY not set");
        }
    }

    /// What this does not read, amiquip reads (and refuses, with its own error).
    #[test]
    fn other_urls_are_left_to_amiquip() {
        for url in [
            "amqps://127.0.0.1:5671",
            "amqp://127.0.0.1/a/b",
            "amqp://127.0.0.1?heartbeat=many",
            "amqp://127.0.0.1?auth_mechanism=external",
            "amqp://127.0.0.1?frame_max=1",
            "not a url",
        ] {
            assert!(nodelay_stream(url).is_none(), "{url} read");
        }
    }
}

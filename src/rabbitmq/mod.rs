//! RabbitMQ (feature `rabbitmq`): a [`RabbitSender`] for the relay and a
//! [`RabbitConsumer`] loop, on `amiquip`.
//!
//! ## Message contract
//! - exchange: the event type's `destination`; routing key: the one the sender
//!   has for the type ([`RabbitSenderBuilder::routing_key`], `[rabbitmq.routing_keys]`)
//!   (default: the event type);
//! - body: the payload (the JSON text, or the bytes of an event published as
//!   bytes); `content_type` `application/json` or the bytes' content type; `type`
//!   the event type;
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
//! The sender as the relay is given it is in `factory.rs`, each relay thread's channel in
//! `sender.rs`, the consumer loop in `consumer.rs`; each item
//! has one path: `txbox::rabbitmq::...`.

use std::time::Duration;

mod consumer;
mod factory;
mod sender;

pub use consumer::{OnError, RabbitConsumer, RabbitConsumerBuilder};
pub use factory::{RabbitSender, RabbitSenderBuilder, DEFAULT_MAX_MESSAGE_SIZE};

/// Opens an AMQP connection (`amqp://`, or `amqps://` over TLS) with
/// `TCP_NODELAY` set, giving up on a broker that does not finish the handshake
/// within the URL's `connection_timeout` (default [`CONNECTION_TIMEOUT`]).
///
/// amiquip does not set it, and it writes a message's frames (method, header,
/// body) as its I/O thread receives them, sometimes in two writes. With Nagle's
/// algorithm on, the second write then waits for the broker's delayed ACK of the
/// first: 40 ms on Linux, measured as a p99 of 44-49 ms per event on some
/// connections (docs/BENCHMARKS.md). So the socket is opened here, and the URL
/// read as amiquip reads it: user and password, virtual host, and the
/// `heartbeat`, `channel_max` and `connection_timeout` parameters; and, for
/// `amqps://`, the TLS parameters of RabbitMQ's URI spec: `cacertfile` (the
/// CAs to trust instead of the system's), `certfile` and `keyfile` (a client
/// certificate), `verify` (`verify_peer`, the default, or `verify_none`) and
/// `server_name_indication` (the name the certificate must carry, by default
/// the URL's host). A URL this does not read in full goes to amiquip's own
/// `open`, which reports what is wrong with it.
pub(crate) fn open(
    url: &str,
    tuning: amiquip::ConnectionTuning,
) -> std::result::Result<amiquip::Connection, crate::Error> {
    // amiquip's error names the URL, password included: its text only,
    // redacted, and no source
    let broker = |e: amiquip::Error| crate::Error::Connect {
        to: format!("RabbitMQ at {}", crate::redact::urls(url)),
        reason: crate::redact::urls(&e.to_string()),
        source: None,
    };
    // what this does not read, amiquip reads: with the same timeout
    let amiquip_open = |tuning| {
        amiquip::Connection::insecure_open_tuned(&with_defaults(url), tuning).map_err(broker)
    };
    let Some(target) = nodelay_target(url)? else {
        return amiquip_open(tuning);
    };
    match open_first(&target, &tuning) {
        Some(result) => result.map_err(broker),
        None => amiquip_open(tuning),
    }
}

/// `url` with `connection_timeout` [`CONNECTION_TIMEOUT`] and `heartbeat`
/// [`HEARTBEAT`] unless it sets them (or is no URL: amiquip then says what is
/// wrong with it).
fn with_defaults(url: &str) -> String {
    let Ok(mut u) = url::Url::parse(url) else {
        return url.to_owned();
    };
    let defaults = [
        (
            "connection_timeout",
            CONNECTION_TIMEOUT.as_millis().to_string(),
        ),
        ("heartbeat", HEARTBEAT.to_string()),
    ];
    for (key, value) in defaults {
        if !u.query_pairs().any(|(k, _)| k == key) {
            u.query_pairs_mut().append_pair(key, &value);
        }
    }
    u.into()
}

/// The heartbeat interval a connection asks for, in seconds, when the URL does
/// not say (`heartbeat`): the lower of it and the broker's (RabbitMQ's 60 s)
/// is used, and a broker that turns heartbeats off (0) turns them off. A
/// connection whose link drops or holds everything (a partition, a frozen
/// broker) is closed after two intervals without a frame, 10 s, and its
/// batches go back.
pub const HEARTBEAT: u16 = 5;

/// How long a connection may take to connect and finish the AMQP handshake
/// (TLS included) when the URL does not say (`connection_timeout`, in ms):
/// a broker that accepts the connection and never answers (a load balancer
/// without a backend, a frozen host) fails it then, instead of holding the
/// relay thread for good.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest frame a connection asks for (the broker's default): the
/// sender refuses a message whose content header would not fit one
/// ([`RabbitSenderBuilder::max_message_size`] bounds the body).
pub const FRAME_MAX: usize = 131_072;

/// Where a URL connects, and how.
struct Target {
    addrs: Vec<std::net::SocketAddr>,
    options: amiquip::ConnectionOptions<amiquip::Auth>,
    /// For `amqps://`: the connector and the name the certificate must carry.
    tls: Option<(native_tls::TlsConnector, String)>,
}

/// Opens a connection to the first of `addrs` that takes it, each in turn as
/// amiquip does. The last error when none did; `None` with no address.
fn open_first(
    target: &Target,
    tuning: &amiquip::ConnectionTuning,
) -> Option<std::result::Result<amiquip::Connection, amiquip::Error>> {
    let mut last = None;
    for addr in &target.addrs {
        let (options, tuning) = (target.options.clone(), tuning.clone());
        let attempt = nodelay_socket(addr).and_then(|stream| match &target.tls {
            Some((connector, name)) => amiquip::Connection::open_tls_stream(
                connector.clone(),
                name,
                stream,
                options,
                tuning,
            ),
            None => amiquip::Connection::insecure_open_stream(stream, options, tuning),
        });
        match attempt {
            Ok(c) => return Some(Ok(c)),
            Err(e) => last = Some(Err(e)),
        }
    }
    last
}

/// A socket connected to `addr` within [`TCP_CONNECT_TIMEOUT`], with
/// `TCP_NODELAY` set.
fn nodelay_socket(
    addr: &std::net::SocketAddr,
) -> std::result::Result<mio::net::TcpStream, amiquip::Error> {
    let io = |source| amiquip::Error::IoErrorWritingSocket { source };
    let stream = std::net::TcpStream::connect_timeout(addr, TCP_CONNECT_TIMEOUT).map_err(io)?;
    stream.set_nodelay(true).map_err(io)?;
    mio::net::TcpStream::from_stream(stream).map_err(io)
}

/// How long the TCP connect of a connection may take, within its
/// `connection_timeout`: a link that drops everything (a partition) loses the
/// connect's SYN, and the next try, at most [`MAX_RECONNECT`] later, sends a
/// fresh one instead of waiting for the kernel's retransmission (1, 3, 7 s):
/// the link back, the broker is connected to within about 2 s (the poller
/// asks a broker that could not be reached again within a second).
const TCP_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The addresses, the options and the TLS of an `amqp://` or `amqps://` URL;
/// `None` for any URL amiquip should read itself; an error for TLS settings
/// that cannot be used (a CA file that cannot be read, a bad `verify`).
fn nodelay_target(url: &str) -> crate::Result<Option<Target>> {
    let Ok(parsed) = url::Url::parse(url) else {
        return Ok(None);
    };
    let tls = match parsed.scheme() {
        "amqp" => None,
        "amqps" => Some(tls_of(&parsed)?),
        _ => return Ok(None),
    };
    Ok(
        amqp_target(&parsed, tls.is_some()).map(|(addrs, options)| Target {
            addrs,
            options,
            tls,
        }),
    )
}

/// The URL's TLS parameters (RabbitMQ's URI spec) as a connector, and the name
/// the server's certificate must carry.
fn tls_of(url: &url::Url) -> crate::Result<(native_tls::TlsConnector, String)> {
    use crate::tls::{TlsOptions, Verify};
    let get = |key: &str| {
        url.query_pairs()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.into_owned())
    };
    let bad = |message: String| crate::Error::Config {
        path: "rabbitmq url".into(),
        message,
    };
    let verify = match get("verify").as_deref() {
        None | Some("verify_peer") => Verify::Full,
        Some("verify_none") => Verify::Nothing,
        Some(v) => return Err(bad(format!("verify={v:?}: use verify_peer or verify_none"))),
    };
    let mut tls = TlsOptions::new(verify);
    tls.roots = get("cacertfile").map(Into::into);
    match (get("certfile"), get("keyfile")) {
        (Some(c), Some(k)) => tls.identity = Some((c.into(), k.into())),
        (None, None) => {}
        _ => return Err(bad("certfile and keyfile go together".into())),
    }
    let name = get("server_name_indication")
        .or_else(|| {
            url.host_str()
                .map(|h| h.trim_matches(['[', ']']).to_owned())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    Ok((tls.connector()?, name))
}

/// The addresses and options of an AMQP URL, or `None` when it holds what this
/// does not read.
fn amqp_target(
    url: &url::Url,
    tls: bool,
) -> Option<(
    Vec<std::net::SocketAddr>,
    amiquip::ConnectionOptions<amiquip::Auth>,
)> {
    use amiquip::{Auth, ConnectionOptions};
    let port = if tls { 5671 } else { 5672 };
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .ok()
            .map(|s| s.into_owned())
    };
    let mut options = ConnectionOptions::<Auth>::default()
        .connection_timeout(Some(CONNECTION_TIMEOUT))
        .heartbeat(HEARTBEAT)
        .frame_max(FRAME_MAX as u32);
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
            "cacertfile" | "certfile" | "keyfile" | "verify" | "server_name_indication" if tls => {
                options
            }
            _ => return None,
        };
    }
    // `socket_addrs` takes an IPv6 host out of its brackets; no host is localhost
    let addrs: Vec<std::net::SocketAddr> = if url.host_str().is_none_or(str::is_empty) {
        std::net::ToSocketAddrs::to_socket_addrs(&("localhost", url.port().unwrap_or(port)))
            .ok()?
            .collect()
    } else {
        url.socket_addrs(|| Some(port)).ok()?
    };
    (!addrs.is_empty()).then_some((addrs, options))
}

/// Shortest and longest wait before a lost connection is opened again (a
/// broker back after an outage is connected to within about 2 s).
pub(crate) const MIN_RECONNECT: Duration = Duration::from_millis(100);
pub(crate) const MAX_RECONNECT: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::{nodelay_socket, nodelay_target, Target};

    fn target(url: &str) -> Option<Target> {
        nodelay_target(url).unwrap_or_else(|e| panic!("{url}: {e}"))
    }

    /// Each URL form is read to its addresses; a socket connects with
    /// `TCP_NODELAY` set (to a listener of the test's own).
    #[test]
    fn the_url_forms_in_use_get_a_socket_with_nodelay() {
        for (url, port) in [
            ("amqp://guest:guest@127.0.0.1:5672", 5672),
            ("amqp://guest:guest@127.0.0.1:5673/", 5673),
            ("amqp://guest:guest@127.0.0.1/%2f", 5672),
            (
                "amqp://us%40er:p%3Ass@127.0.0.1:5672/vhost?heartbeat=30&connection_timeout=5000",
                5672,
            ),
            ("amqp://127.0.0.1?channel_max=16", 5672),
            ("amqp://[::1]:5672", 5672),
            ("amqp://localhost", 5672),
            ("amqps://localhost", 5671),
            (
                "amqps://guest:guest@127.0.0.1:5681/?verify=verify_none",
                5681,
            ),
            (
                "amqps://localhost?server_name_indication=rabbit.internal",
                5671,
            ),
        ] {
            let t = target(url).unwrap_or_else(|| panic!("{url} not read"));
            assert_eq!(t.tls.is_some(), url.starts_with("amqps"), "{url}");
            let addrs = t.addrs;
            assert!(addrs.iter().all(|a| a.port() == port), "{url}: {addrs:?}");
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = nodelay_socket(&listener.local_addr().unwrap()).unwrap();
        assert!(stream.nodelay().unwrap(), "TCP_NODELAY not set");
    }

    /// A refused first address: the next one takes the connection (against
    /// the local RabbitMQ; `CI=true` makes its absence a failure).
    #[test]
    fn a_refused_address_falls_over_to_the_next() {
        let broker: std::net::SocketAddr = "127.0.0.1:5672".parse().unwrap();
        if std::net::TcpStream::connect_timeout(&broker, std::time::Duration::from_secs(2)).is_err()
        {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "RabbitMQ is down"
            );
            eprintln!("SKIPPED: no RabbitMQ on {broker}");
            return;
        }
        let mut t = target("amqp://guest:guest@127.0.0.1:5672").unwrap();
        let refused: std::net::SocketAddr = "127.0.0.1:1".parse().unwrap();
        let tuning = amiquip::ConnectionTuning::default();
        t.addrs = vec![refused, broker];
        let conn = super::open_first(&t, &tuning).unwrap();
        conn.unwrap().close().unwrap();
        t.addrs = vec![refused];
        let alone = super::open_first(&t, &tuning).unwrap();
        assert!(alone.is_err(), "nothing listens on port 1");
        t.addrs = vec![];
        assert!(super::open_first(&t, &tuning).is_none());
    }

    /// What this does not read, amiquip reads (and refuses, with its own error).
    #[test]
    fn other_urls_are_left_to_amiquip() {
        for url in [
            "amqp://127.0.0.1/a/b",
            "amqp://127.0.0.1?cacertfile=/ca.pem",
            "amqp://127.0.0.1?heartbeat=many",
            "amqp://127.0.0.1?auth_mechanism=external",
            "amqp://127.0.0.1?frame_max=1",
            "not a url",
        ] {
            assert!(target(url).is_none(), "{url} read");
        }
    }

    /// A URL left to amiquip gets the connection timeout and the heartbeat
    /// too, unless it sets them.
    #[test]
    fn urls_left_to_amiquip_get_the_timeout_and_heartbeat() {
        assert_eq!(
            super::with_defaults("amqps://h/a/b?auth_mechanism=external"),
            "amqps://h/a/b?auth_mechanism=external&connection_timeout=10000&heartbeat=5"
        );
        assert_eq!(
            super::with_defaults("amqp://h?connection_timeout=5&heartbeat=30"),
            "amqp://h?connection_timeout=5&heartbeat=30"
        );
        assert_eq!(super::with_defaults("not a url"), "not a url");
    }

    /// A URL read here asks for a heartbeat of [`super::HEARTBEAT`] unless it
    /// sets one.
    #[test]
    fn the_heartbeat_defaults_to_five_seconds() {
        let options = |heartbeat| {
            amiquip::ConnectionOptions::<amiquip::Auth>::default()
                .connection_timeout(Some(super::CONNECTION_TIMEOUT))
                .heartbeat(heartbeat)
                .frame_max(super::FRAME_MAX as u32)
        };
        let read = |url: &str| target(url).expect("read").options;
        assert_eq!(read("amqp://127.0.0.1"), options(5));
        assert_eq!(read("amqp://127.0.0.1?heartbeat=30"), options(30));
    }

    /// TLS settings that cannot work are an error naming what is wrong.
    #[test]
    fn unusable_tls_settings_are_errors() {
        for (url, says) in [
            ("amqps://localhost?verify=maybe", "verify"),
            ("amqps://localhost?certfile=/c.pem", "keyfile"),
            (
                "amqps://localhost?cacertfile=/nonexistent/ca.pem",
                "/nonexistent/ca.pem",
            ),
        ] {
            let e = nodelay_target(url)
                .err()
                .unwrap_or_else(|| panic!("{url} accepted"));
            assert!(e.to_string().contains(says), "{url}: {e}");
        }
    }
}

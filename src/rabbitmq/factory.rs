//! The relay's RabbitMQ sender as the relay is given it: its settings, the
//! routing key of each event type, the `[rabbitmq]` table of a file. Each
//! relay thread gets a channel of its own from it (`sender.rs`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::sender::RabbitChannel;
use crate::error::{Error, Result};
use crate::sender::{Sender, SenderFactory};

/// The relay's RabbitMQ sender: built once, it gives each relay thread a
/// connection and a confirm-mode channel of its own ([`SenderFactory`]).
///
/// ```no_run
/// use std::time::Duration;
/// let sender = txbox::rabbitmq::RabbitSender::builder("amqp://guest:guest@127.0.0.1:5672")
///     .confirm_timeout(Duration::from_secs(10))
///     .build()?;
/// # let _ = sender;
/// # Ok::<(), txbox::Error>(())
/// ```
#[derive(Clone)]
pub struct RabbitSender {
    pub(super) url: String,
    pub(super) confirm_timeout: Duration,
    pub(super) max_message_size: usize,
    /// The routing keys of the event types.
    pub(super) routes: Arc<Routes>,
}

/// The routing key of each event type's messages.
#[derive(Debug, Clone, Default)]
pub(super) struct Routes {
    /// Set per event type.
    by_type: BTreeMap<String, String>,
    /// The key of a type without one of its own; `None`: the type's name.
    default: Option<String>,
}

impl Routes {
    pub(super) fn key<'a>(&'a self, event_type: &'a str) -> &'a str {
        self.by_type
            .get(event_type)
            .or(self.default.as_ref())
            .map_or(event_type, String::as_str)
    }
}

/// The largest message body a [`RabbitSender`] publishes unless told
/// otherwise ([`RabbitSenderBuilder::max_message_size`]): RabbitMQ's own
/// default `max_message_size` since 4.0, 16 MiB.
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 16 * 1024 * 1024;

/// Builds a [`RabbitSender`]. Its `Debug` redacts the URL's password.
#[derive(Clone)]
pub struct RabbitSenderBuilder {
    sender: RabbitSender,
}

/// The URL's password is redacted.
impl std::fmt::Debug for RabbitSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitSender")
            .field("url", &crate::redact::urls(&self.url))
            .field("confirm_timeout", &self.confirm_timeout)
            .field("max_message_size", &self.max_message_size)
            .field("routes", &self.routes)
            .finish()
    }
}

impl std::fmt::Debug for RabbitSenderBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitSenderBuilder")
            .field("sender", &self.sender)
            .finish()
    }
}

impl RabbitSender {
    /// A builder for the broker at `url` (`amqp://user:pass@host:port/vhost`).
    pub fn builder(url: &str) -> RabbitSenderBuilder {
        RabbitSenderBuilder {
            sender: RabbitSender {
                url: url.to_string(),
                confirm_timeout: Duration::from_secs(30),
                max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
                routes: Arc::default(),
            },
        }
    }

    /// The sender the `[rabbitmq]` table of a configuration file describes
    /// (the file [`Config::from_toml`](crate::Config::from_toml) reads, which
    /// leaves this table to the broker): `url`, or `url_env` naming the
    /// environment variable that holds it (a password stays out of the
    /// file; the URL is never printed: `Debug` redacts it), `confirm_timeout`
    /// (a duration such as `"10s"`), `max_message_size` (bytes),
    /// `default_routing_key` (every type's without one of its own) and
    /// `[rabbitmq.routing_keys]`, an event type's routing key by its name.
    /// Errors name the key path.
    ///
    /// ```
    /// let text = r#"
    ///     [events.order-created]
    ///     destination = "orders"
    ///
    ///     [rabbitmq]
    ///     url = "amqp://guest:guest@127.0.0.1:5672"
    ///     confirm_timeout = "10s"
    ///     [rabbitmq.routing_keys]
    ///     order-created = "orders.created"
    /// "#;
    /// let config = txbox::Config::from_toml(text)?;
    /// let sender = txbox::rabbitmq::RabbitSender::from_toml(text)?;
    /// assert_eq!(sender.routing_key("order-created"), "orders.created");
    /// assert_eq!(sender.routing_key("order-paid"), "order-paid");
    ///
    /// let err = txbox::rabbitmq::RabbitSender::from_toml("[rabbitmq]\nurl = 5").unwrap_err();
    /// assert_eq!(err.to_string(), "rabbitmq.url is not valid: invalid type: integer `5`, expected a string");
    /// # Ok::<(), txbox::Error>(())
    /// ```
    pub fn from_toml(text: &str) -> Result<RabbitSender> {
        /// The `[rabbitmq]` table.
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Section {
            url: Option<String>,
            url_env: Option<String>,
            #[serde(default, with = "crate::config::optional_duration")]
            confirm_timeout: Option<Duration>,
            max_message_size: Option<usize>,
            default_routing_key: Option<String>,
            #[serde(default)]
            routing_keys: BTreeMap<String, String>,
        }
        let Some(section) = crate::config::broker_section::<Section>(text, "rabbitmq")? else {
            return Err(Error::config(
                "rabbitmq",
                "must be set (a [rabbitmq] table with its url)",
            ));
        };
        let url = match (section.url, section.url_env) {
            (Some(url), None) => url,
            (None, Some(var)) => crate::config::from_env("rabbitmq.url_env", &var)?,
            (Some(_), Some(_)) => {
                return Err(Error::config(
                    "rabbitmq",
                    "has both url and url_env: keep one",
                ))
            }
            (None, None) => {
                return Err(Error::config(
                    "rabbitmq.url",
                    "must be set (or url_env, the environment variable that holds it)",
                ))
            }
        };
        let mut builder = RabbitSender::builder(&url);
        if let Some(d) = section.confirm_timeout {
            builder = builder.confirm_timeout(d);
        }
        if let Some(n) = section.max_message_size {
            builder = builder.max_message_size(n);
        }
        if let Some(key) = section.default_routing_key {
            builder = builder.default_routing_key(key);
        }
        for (event_type, key) in section.routing_keys {
            builder = builder.routing_key(event_type, key);
        }
        builder.build()
    }

    /// The routing key of `event_type`'s messages: the one set for it
    /// ([`RabbitSenderBuilder::routing_key`]), else the default
    /// ([`RabbitSenderBuilder::default_routing_key`]), else its name.
    pub fn routing_key<'a>(&'a self, event_type: &'a str) -> &'a str {
        self.routes.key(event_type)
    }
}

impl RabbitSenderBuilder {
    /// Longest wait for the broker's confirms of one batch (default 30s).
    pub fn confirm_timeout(mut self, d: Duration) -> Self {
        self.sender.confirm_timeout = d;
        self
    }

    /// The largest message body the broker takes: its `max_message_size`
    /// (default [`DEFAULT_MAX_MESSAGE_SIZE`]; RabbitMQ before 4.0 takes 128
    /// MiB unless its operator set less). A larger event fails alone, as its
    /// own permanent failure, without being published: RabbitMQ would close
    /// the channel for it, and every message in flight on it would go back.
    /// Should the broker refuse a message for its size all the same (its limit
    /// is lower than this), only the message over the limit it names fails,
    /// and the sender uses that limit from then on.
    pub fn max_message_size(mut self, bytes: usize) -> Self {
        self.sender.max_message_size = bytes;
        self
    }

    /// The routing key of `event_type`'s messages (default: the event
    /// type's name). The exchange is the type's destination
    /// ([`EventSettings::destination`](crate::EventSettings::destination)).
    pub fn routing_key(mut self, event_type: impl Into<String>, key: impl Into<String>) -> Self {
        Arc::make_mut(&mut self.sender.routes)
            .by_type
            .insert(event_type.into(), key.into());
        self
    }

    /// The routing key of every event type without one of its own (default:
    /// each type's name).
    pub fn default_routing_key(mut self, key: impl Into<String>) -> Self {
        Arc::make_mut(&mut self.sender.routes).default = Some(key.into());
        self
    }

    /// The sender. It connects when a relay thread first needs it. An error
    /// names a routing key RabbitMQ cannot take (over 255 bytes) or that
    /// holds control characters, and a confirm timeout of zero.
    pub fn build(self) -> Result<RabbitSender> {
        let routes = &self.sender.routes;
        let default = routes
            .default
            .iter()
            .map(|k| ("rabbitmq.default_routing_key".to_owned(), k));
        let by_type = routes.by_type.iter().map(|(event_type, k)| {
            let path = format!("rabbitmq.routing_keys.{}", event_type.escape_debug());
            (path, k)
        });
        for (path, key) in default.chain(by_type) {
            let path = || path.clone();
            if key.len() > 255 {
                return Err(Error::config(path(), "must be at most 255 bytes"));
            }
            if key.chars().any(char::is_control) {
                return Err(Error::config(path(), "must not contain control characters"));
            }
        }
        if self.sender.confirm_timeout.is_zero() {
            return Err(Error::config(
                "rabbitmq.confirm_timeout",
                "must be more than 0",
            ));
        }
        Ok(self.sender)
    }
}

impl SenderFactory for RabbitSender {
    fn create(&self) -> Result<Box<dyn Sender>> {
        Ok(Box::new(RabbitChannel::new(self)))
    }

    fn ack_wait(&self) -> Option<Duration> {
        Some(self.confirm_timeout)
    }

    /// A routing key set for an event type the relay's configuration does
    /// not have is refused: a misspelt type would route nothing.
    fn check_event_types(&self, event_types: &[&str]) -> Result<()> {
        match self
            .routes
            .by_type
            .keys()
            .find(|t| !event_types.contains(&t.as_str()))
        {
            Some(t) => Err(Error::config(
                format!("rabbitmq.routing_keys.{}", t.escape_debug()),
                "names an event type the configuration does not have",
            )),
            None => Ok(()),
        }
    }
}

//! Secrets stay out of what txbox prints, logs or puts in an error: each type
//! that holds a URL or client properties is printed with `{:?}` here, and the
//! errors that name a URL are checked, with a password that must not show.
#![cfg(all(feature = "kafka", feature = "rabbitmq", feature = "admin-http"))]

use std::time::Duration;

use txbox::admin::AdminOptions;
use txbox::kafka::{KafkaConsumer, KafkaSender};
use txbox::rabbitmq::{RabbitConsumer, RabbitSender};
use txbox::{Config, Sender, SenderFactory};

const PASSWORD: &str = "hunter2-s3cret";

fn assert_hidden(what: &str, shown: &str) {
    assert!(
        !shown.contains(PASSWORD),
        "{what} shows the password: {shown}"
    );
}

#[test]
fn debug_output_redacts_passwords_in_urls_and_properties() {
    let url = format!("amqp://app:{PASSWORD}@127.0.0.1:5672/vh");
    let factory = RabbitSender::builder(&url).build().unwrap();
    let shown = format!("{factory:?}");
    assert_hidden("RabbitSender", &shown);
    assert!(
        shown.contains("amqp://app:<redacted>@127.0.0.1:5672/vh"),
        "{shown}"
    );
    assert_hidden(
        "RabbitConsumer",
        &format!("{:?}", RabbitConsumer::builder(&url, "q")),
    );

    let sender = KafkaSender::builder("127.0.0.1:9092")
        .property("security.protocol", "SASL_PLAINTEXT")
        .property("sasl.mechanism", "PLAIN")
        .property("sasl.username", "app")
        .property("sasl.password", PASSWORD);
    let shown = format!("{sender:?}");
    assert_hidden("KafkaSenderBuilder", &shown);
    assert!(shown.contains("sasl.username"), "{shown}");
    let consumer =
        KafkaConsumer::builder("127.0.0.1:9092", "g").property("ssl.key.password", PASSWORD);
    assert_hidden("KafkaConsumerBuilder", &format!("{consumer:?}"));

    // the file's [kafka] table goes to the Kafka builders, whose Debug hides it;
    // the core configuration does not hold it
    let text = format!("[kafka]\n\"sasl.password\" = \"{PASSWORD}\"\n");
    let config = Config::from_toml(&text).unwrap();
    assert_hidden("Config from TOML", &format!("{config:?}"));
    let properties = txbox::kafka::properties_from_toml(&text).unwrap();
    let builder = KafkaSender::builder("127.0.0.1:9092").properties(&properties);
    assert_hidden("KafkaSenderBuilder from TOML", &format!("{builder:?}"));

    assert_hidden(
        "AdminOptions",
        &format!("{:?}", AdminOptions::new().token(PASSWORD)),
    );
}

#[test]
fn errors_that_name_a_url_redact_its_password() {
    // an unknown scheme: the URL is echoed, its password not
    let err = Config::builder()
        .build()
        .unwrap()
        .connect(&format!("postgress://app:{PASSWORD}@db/x"))
        .err()
        .expect("refused")
        .to_string();
    assert_hidden("Config::connect", &err);
    assert!(err.contains("unknown scheme \"postgress\""), "{err}");
    for url in [
        format!("host=db user=app password={PASSWORD}"),
        format!("postgress://db/x?password={PASSWORD}"),
    ] {
        let err = Config::builder()
            .build()
            .unwrap()
            .connect(&url)
            .err()
            .expect("refused")
            .to_string();
        assert_hidden("Config::connect", &err);
    }

    // amiquip's connect error names the URL: the sender's error (logged, and
    // stored as the events' last error) does not show its password
    let mut sender = RabbitSender::builder(&format!(
        "amqp://app:{PASSWORD}@no-such-host.invalid:5672/vh"
    ))
    .confirm_timeout(Duration::from_secs(1))
    .build()
    .unwrap()
    .create()
    .unwrap();
    let err = sender.ready().expect_err("the host does not resolve");
    assert_hidden("RabbitSender::ready", &err.message);
    // the error does name the URL (so the scrubbing ran), without its password
    assert!(
        err.message.contains("no-such-host.invalid"),
        "{}",
        err.message
    );
    let event = txbox::Event {
        id: txbox::EventId::new(),
        event_type: "e".into(),
        destination: "x".into(),
        key: None,
        headers: Default::default(),
        payload: b"{}".to_vec(),
        content_type: None,
        attempts: 0,
    };
    // until the reconnect backoff is over and a send tries to connect again
    crate::common::wait_until(
        "a send that connects again",
        Duration::from_secs(10),
        || {
            let results = sender.send(std::slice::from_ref(&event));
            let message = &results[0].as_ref().unwrap_err().message;
            assert_hidden("RabbitSender::send", message);
            message.contains("no-such-host.invalid")
        },
    );
}

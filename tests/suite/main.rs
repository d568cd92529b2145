//! The integration tests that share the machine's services with each other: one
//! test binary (one link of rdkafka, amiquip and every driver), a module per
//! subject. The tests that stop a broker, kill relays again and again, install
//! a process-wide recorder or migrate with short lock timeouts (which other
//! tests' migrations and open transactions would make them miss) are binaries
//! of their own (`broker_outage`, `crash_brokers`, `faults`, `metrics_facade`,
//! `migrations`): cargo runs test binaries one after another, so nothing here
//! runs beside them.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod clocks;
mod conformance;
mod connections;
#[cfg(all(
    feature = "diesel",
    feature = "postgres",
    feature = "mysql",
    feature = "sqlite"
))]
mod diesel;
mod inbox;
mod inbox_brokers;
mod kafka;
mod ops;
mod postgres_outbox;
mod postgres_relay;
mod rabbitmq;
#[cfg(feature = "cli")]
mod relay_process;
mod secrets;
#[cfg(feature = "trace-context")]
mod trace_context;
mod wake;
mod web_service;

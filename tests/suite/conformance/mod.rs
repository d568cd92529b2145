//! One suite, every SQL dialect: each test below runs unchanged against PostgreSQL,
//! MariaDB/MySQL (feature `mysql`), SQLite (feature `sqlite`) and Oracle (feature
//! `oracle`, only when `TXBOX_ORACLE_URL` is set: it cannot run here), through the
//! `Store` trait and each dialect's own business transactions. A dialect that passes
//! it is done. SQLite has one writer per database: its "several instances" tests are
//! several stores (connections) in one process, which is what SQLite can offer.

use std::sync::Mutex;

use crate::common::ms;

use crate::common::backend::Backend;
use txbox::Config;

mod claims;
mod dead_letters;
mod delayed;
mod inbox;
mod migrations;
mod ordering;
mod pause;
mod relay;

pub(super) fn config(prefix: &str) -> Config {
    Config::builder()
        .table_prefix(prefix)
        .defaults(|e| e.adaptive_polling(ms(10), ms(100), 1.5))
        .event("e", |e| e)
        .event("f", |e| e)
        .build()
        .unwrap()
}

/// The tests that run four relays take one backend's turn each: two at once,
/// beside the rest of the suite, took more connections than PostgreSQL's
/// default 100.
pub(super) fn four_relays_turn(b: Backend) -> std::sync::MutexGuard<'static, ()> {
    static TURNS: [Mutex<()>; 4] = [
        Mutex::new(()),
        Mutex::new(()),
        Mutex::new(()),
        Mutex::new(()),
    ];
    TURNS[b as usize % 4]
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// A relay per sender on the tables of `fx`: the first on its store, the
/// others on stores of their own.
pub(super) fn relays_of(
    fx: &crate::common::backend::Fixture,
    c: &Config,
    senders: &[txbox::MemorySender],
) -> Vec<txbox::Relay> {
    senders
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let store = if i == 0 {
                fx.store.clone()
            } else {
                fx.another_store()
            };
            txbox::Relay::start(store, c, s.clone()).unwrap()
        })
        .collect()
}

/// The suite, instantiated per backend; each test gets its own table prefix
/// (`c<tag>_<short>_`).
macro_rules! suite {
    ($module:ident, $backend:expr, $tag:literal) => {
        suite!(@tests $module, $backend, $tag;
            claims::publish_commits_and_rollback_leaves_nothing => "pub",
            claims::claims_are_disjoint_and_bounded => "claim",
            claims::claims_after_an_id_skip_lower_ones_until_asked_without => "after",
            claims::finish_checks_the_token_and_recovery_counts_no_attempt => "fence",
            claims::acked_rows_are_deleted_under_the_token_when_none_are_kept => "del",
            claims::retries_wait_for_their_backoff_then_fail => "retry",
            dead_letters::dead_letters_move_list_retry_resolve_and_clean => "dlq",
            dead_letters::binary_payloads_come_back_unchanged_through_the_dead_letters => "bin",
            claims::cleanup_deletes_old_processed_rows_in_bounded_batches => "clean",
            claims::lease_locks_have_one_holder => "lock",
            inbox::inbox_inserts_if_absent => "inbox",
            inbox::the_inbox_deduplicates_per_consumer => "fan",
            migrations::migrate_upgrades_a_0_1_inbox_in_place_keeping_its_rows => "up",
            migrations::two_instances_migrating_at_once_both_succeed => "up2",
            migrations::an_upgrade_keeps_the_order_of_the_events_waiting => "upord",
            relay::four_relays_deliver_every_event_exactly_once => "four",
            dead_letters::failing_sender_ends_in_the_dlq_and_a_retry_delivers => "relay",
            relay::pipelined_batches_finish_in_order_and_retry => "pipe",
            relay::a_release_finishes_the_batches_in_flight_before_backing_off => "rel",
            relay::a_wake_after_the_commit_sends_at_once_on_every_dialect => "wake",
            ordering::ordered_claims_take_one_event_per_key_in_order => "ord",
            ordering::ordered_claims_walk_the_keys_from_a_cursor => "walk",
            ordering::four_relays_keep_each_keys_order => "ord4",
            ordering::a_poison_event_blocks_or_is_skipped => "poison",
            relay::deliver_pending_sends_what_is_due_and_reports_it => "flush",
            relay::deliver_pending_claims_nothing_while_the_sender_is_not_ready => "unready",
            relay::deliver_pending_with_batches_in_flight_sends_every_keys_events => "flight",
            relay::a_row_with_unreadable_headers_fails_alone => "hdr",
            relay::a_pipelining_sender_of_ones_own_keeps_batches_in_flight => "third",
            relay::a_stores_calls_reach_its_configurations_observer => "obs",
            migrations::migrate_twice_is_fine => "mig",
            claims::ping_answers_without_reading_a_table => "ping",
            claims::a_store_does_what_its_capabilities_say => "caps",
            delayed::a_delayed_event_is_claimed_only_once_due => "due",
            delayed::a_relay_sends_delayed_events_when_due => "duerel",
            delayed::a_long_transaction_does_not_shorten_a_delay => "duelong",
            pause::a_paused_type_is_sent_by_no_relay_until_resumed => "pause",
        );
    };
    (@tests $module:ident, $backend:expr, $tag:literal; $($group:ident :: $test:ident => $short:literal,)*) => {
        mod $module {
            use super::*;
            $(
                #[test]
                fn $test() {
                    super::$group::$test($backend, concat!("c", $tag, "_", $short, "_"));
                }
            )*
        }
    };
}

suite!(postgres, Backend::Postgres, "pg");
#[cfg(feature = "mysql")]
suite!(mysql, Backend::MySql, "my");
#[cfg(feature = "sqlite")]
suite!(sqlite, Backend::Sqlite, "lite");
#[cfg(feature = "oracle")]
suite!(oracle, Backend::Oracle, "ora");

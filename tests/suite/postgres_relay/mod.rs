//! The relay against a real PostgreSQL, with the in-memory sender standing in for
//! the broker (the relay's logic is under test here, not a broker), a module per
//! subject.

use crate::common::ms;

use txbox::EventSettings;

pub(super) fn fast(e: EventSettings) -> EventSettings {
    e.adaptive_polling(ms(10), ms(100), 1.5)
}

mod compact;
mod config;
mod connections;
mod delivery;
mod errors;
pub(super) mod held;
mod snapshot;
mod wake;

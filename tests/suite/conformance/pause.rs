//! Pausing an event type: every relay on the tables stops claiming it,
//! publishing goes on, a relay started while it is paused sends nothing, and
//! a resume sends what waited.

use std::collections::HashSet;
use std::time::Duration;

use crate::common::backend::{Backend, Fixture};
use crate::common::wait_until;
use txbox::{MemorySender, Pauses, Relay};

use super::{config, four_relays_turn};

pub(super) fn a_paused_type_is_sent_by_no_relay_until_resumed(b: Backend, p: &str) {
    let _turn = four_relays_turn(b);
    let Some(fx) = Fixture::new(b, p) else { return };
    let c = config(p);
    let pauses = Pauses::new(fx.store.clone());
    let senders: Vec<MemorySender> = (0..4).map(|_| MemorySender::new()).collect();
    let mut relays: Vec<Relay> = super::relays_of(&fx, &c, &senders);
    let sent_of = |t: &str| {
        senders
            .iter()
            .flat_map(MemorySender::sent)
            .filter(|e| e.event_type == t)
            .count()
    };
    // running relays, sending the type
    let mut published: HashSet<_> = fx.publish(&c, "e", 20, true).into_iter().collect();
    wait_until(
        "the type sent while running",
        Duration::from_secs(20),
        || sent_of("e") == 20,
    );
    assert!(pauses.pause("e").unwrap(), "it was running");
    assert!(!pauses.pause("e").unwrap(), "paused already");
    assert_eq!(pauses.list().unwrap(), ["e"]);
    // publishing goes on; another type is sent as before
    published.extend(fx.publish(&c, "e", 1000, true));
    let others = fx.publish(&c, "f", 10, true);
    wait_until("the other type sent", Duration::from_secs(20), || {
        sent_of("f") == others.len()
    });
    // a relay started while the type is paused sends nothing of it either
    // (on the first relay's connections: five relays' pools at once would
    // crowd PostgreSQL's 100 beside the rest of the suite)
    let late = MemorySender::new();
    relays.push(Relay::start(fx.store.clone(), &c, late.clone()).unwrap());
    std::thread::sleep(Duration::from_secs(2));
    let late_e = || late.sent().iter().filter(|e| e.event_type == "e").count();
    assert_eq!(sent_of("e") + late_e(), 20, "{b:?}: a paused type was sent");
    assert_eq!(fx.counts("e").pending, 1000, "every event waits, unclaimed");
    assert!(pauses.resume("e").unwrap(), "it was paused");
    assert!(!pauses.resume("e").unwrap(), "running already");
    assert!(pauses.list().unwrap().is_empty());
    let total = || sent_of("e") + late_e();
    wait_until("every paused event sent", Duration::from_secs(60), || {
        total() >= 1020
    });
    published.extend(others);
    let mut all = senders.clone();
    all.push(late);
    crate::common::shut_down_and_check_each_once(relays, &all, &published);
}

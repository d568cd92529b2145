//! Part `slow-link`: the relay's drain rate with its database far away
//! (issue 46: 200 ms each way, a database in another region), through a
//! forwarder of the bench's own that holds every chunk it reads for the
//! delay before it writes it on (each direction in order, at any rate: a long
//! link, not a narrow one). The publisher fills the table directly; the relay
//! drains it to a sender that acks at once, so the figure is the relay's
//! round trips to the database. `FLIGHTS=1` prints the start of each chunk
//! the relay sends (readable with `?sslmode=disable` in `TXBOX_PG_URL`): what
//! each round trip carries.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use txbox::{EventSettings, MemorySender, Outbox, PgStore, Relay};

use crate::common::*;

/// A forwarder to `to` that delivers what it reads `delay` later, each way;
/// it counts the chunks the clients send (about one per round trip).
struct Far {
    port: u16,
    sent: Arc<AtomicU64>,
}

impl Far {
    fn start(to: &str, delay: Duration) -> Res<Far> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let sent = Arc::new(AtomicU64::new(0));
        let (to, counted) = (to.to_owned(), sent.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(&to) else {
                    continue;
                };
                let _ = (client.set_nodelay(true), server.set_nodelay(true));
                let (Ok(c), Ok(s)) = (client.try_clone(), server.try_clone()) else {
                    continue;
                };
                pipe(c, s, delay, Some(counted.clone()));
                pipe(server, client, delay, None);
            }
        });
        Ok(Far { port, sent })
    }
}

/// Copies `from` into `into`, each chunk `delay` after it was read.
fn pipe(mut from: TcpStream, mut into: TcpStream, delay: Duration, count: Option<Arc<AtomicU64>>) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        for (due, chunk) in rx {
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            if into.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = into.shutdown(std::net::Shutdown::Both);
    });
    let print = count.is_some() && std::env::var_os("FLIGHTS").is_some();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf) {
            if let Some(c) = &count {
                c.fetch_add(1, Ordering::Relaxed);
                if print {
                    let t: String = String::from_utf8_lossy(&buf[..n.min(200)])
                        .chars()
                        .map(|c| {
                            if c.is_ascii_graphic() || c == ' ' {
                                c
                            } else {
                                '.'
                            }
                        })
                        .collect();
                    eprintln!("FLIGHT {n} {t}");
                }
            }
            if tx
                .send((Instant::now() + delay, buf[..n].to_vec()))
                .is_err()
            {
                break;
            }
        }
    });
}

/// The drain rate with the database `delay` away each way, beside the rate
/// the issue asks for (`batch_size * in_flight / RTT`), and what each batch
/// cost in round trips.
pub(crate) fn slow_link(s: &Size, delay: Duration, out: &mut Vec<Row>) -> Res<()> {
    let p = "bench_slow_";
    let n = (s.floor / 5).max(2_000);
    let settings = EventSettings::default();
    let (batch, in_flight) = (settings.batch_size, settings.in_flight);
    let cfg = s.relay_config(p, settings);
    let (_, mut c) = fresh(p)?;
    fill(&mut c, &Outbox::new(&cfg)?, n)?;
    let far = Far::start("127.0.0.1:5432", delay)?;
    let url = pg_url().replace("127.0.0.1:5432", &format!("127.0.0.1:{}", far.port));
    let calls = Arc::new(Claims::default());
    let store = Arc::new(PgStore::connect(
        &url,
        &cfg.clone().observed(calls.clone()),
    )?);
    let sender = MemorySender::new();
    let relay = Relay::start(store, &cfg, sender.clone())?;
    // from the first event sent: the pool's connects (a few round trips
    // each) are not the drain's
    if sender.wait_for(1, Duration::from_secs(120)) < 1 {
        return Err("slow link: nothing sent in 2 minutes".into());
    }
    let (t, sent0) = (Instant::now(), far.sent.load(Ordering::Relaxed));
    let claims0 = calls.count();
    let first = sender.sent().len();
    if sender.wait_for(n, Duration::from_secs(1200)) < n {
        return Err(format!("slow link: not all {n} sent in 20 minutes").into());
    }
    let took = t.elapsed().as_secs_f64();
    let flights = far.sent.load(Ordering::Relaxed) - sent0;
    let claims = calls.count() - claims0;
    relay.shutdown(Duration::from_secs(30))?;
    let rate = (n - first) as f64 / took;
    let rtt = 2.0 * delay.as_secs_f64();
    let want = (batch * in_flight) as f64 / rtt;
    let ms = delay.as_millis();
    out.push(row(
        format!("relay drain, database {ms} ms away each way, {n} events (-> memory)"),
        format!("{rate:.0} ev/s"),
        format!("{want:.0} ev/s (batch x in_flight / RTT)"),
        rate / want,
        ">= 1.0 (issue 46)",
    ));
    let batches = (n - first) as f64 / batch as f64;
    out.push(row(
        format!("the same: chunks the relay sent per batch of {batch} (TLS splits some)"),
        format!("{:.1}", flights as f64 / batches),
        format!("{:.2} claims per batch", claims as f64 / batches),
        rate * rtt / batch as f64,
        "reported (ratio: batches per RTT)",
    ));
    out.push(row(
        "the same: store calls that failed (a timeout at the defaults)".to_string(),
        format!("{}", calls.calls().1),
        format!("{} calls", calls.calls().0),
        0.0,
        "0",
    ));
    Ok(())
}

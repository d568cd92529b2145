//! The operations surface against a real PostgreSQL: the DLQ admin API under
//! contention, the `txbox` CLI run as a process, the HTTP admin endpoint driven by a
//! real HTTP client, and the metrics.
#![cfg(all(feature = "cli", feature = "admin-http"))]

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use crate::common::backend::{Backend, Fixture};
use crate::common::wait_until;
use txbox::admin::{AdminOptions, AdminServer};
use txbox::store::Outcome;
use txbox::{Config, Dlq, DlqStatus, EventId, MemorySender, Relay};
use uuid::Uuid;

fn config(prefix: &str) -> Config {
    Config::builder()
        .table_prefix(prefix)
        .defaults(|e| {
            e.adaptive_polling(Duration::from_millis(10), Duration::from_millis(100), 1.5)
        })
        .event("order-created", |e| e)
        .event("order-paid", |e| e)
        .build()
        .unwrap()
}

/// `n` dead letters of `event_type`, with their ids.
fn dead_letters(fx: &Fixture, c: &Config, event_type: &str, n: usize) -> Vec<EventId> {
    let ids = failed_in_the_outbox(fx, c, event_type, n);
    assert_eq!(fx.store.move_failed_to_dlq(1000).unwrap(), n as u64);
    ids
}

/// `n` events of `event_type` that used up their retries, left FAILED in the outbox
/// (where a relay with the DLQ off leaves them).
fn failed_in_the_outbox(fx: &Fixture, c: &Config, event_type: &str, n: usize) -> Vec<EventId> {
    let ids = fx.publish(c, event_type, n, true);
    let t = Uuid::now_v7();
    fx.store
        .claim(event_type, n, Duration::from_secs(60), t)
        .unwrap();
    let failed: Vec<_> = ids
        .iter()
        .map(|id| {
            let error = format!("broker said no to {id}");
            (*id, Outcome::Failed { error })
        })
        .collect();
    fx.store.finish(t, &failed).unwrap();
    assert_eq!(fx.counts(event_type).failed, n as u64);
    ids
}

/// With the DLQ off nothing moves FAILED events out of the outbox: an operator
/// moves them to the dead letters (CLI `dlq move`, `POST /dlq/move`), and from
/// there lists, retries, resolves or deletes them. No state is out of reach.
#[test]
fn failed_events_are_reachable_by_an_operator_with_the_dlq_off() {
    let p = "t_ops_failed_";
    let Some(fx) = Fixture::new(Backend::Postgres, p) else {
        return;
    };
    let c = config(p);
    let ids = failed_in_the_outbox(&fx, &c, "order-paid", 3);
    let (code, out, err) = cli(p, &["dlq", "move"]);
    assert_eq!(
        (code, out.trim()),
        (0, "3 failed events moved to the dead letters"),
        "{err}"
    );
    assert_eq!(fx.counts("order-paid").failed, 0);
    let (code, out, _) = cli(p, &["--json", "dlq", "list"]);
    assert_eq!(code, 0);
    let listed: Vec<String> = serde_json::from_str::<serde_json::Value>(&out)
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        listed,
        ids.iter().map(|i| i.to_string()).collect::<Vec<_>>()
    );
    assert_eq!(cli(p, &["dlq", "retry", &ids[0].to_string()]).0, 0);
    // with the DLQ threads off no relay requeues it: the retry itself does, and
    // a relay without the DLQ sends it again
    let off = Config::builder()
        .table_prefix(p)
        .defaults(|e| {
            e.adaptive_polling(Duration::from_millis(10), Duration::from_millis(100), 1.5)
        })
        .event("order-paid", |e| e)
        .dlq(|d| d.enabled(false))
        .build()
        .unwrap();
    let sender = MemorySender::new();
    let relay = Relay::start(fx.store.clone(), &off, sender.clone()).unwrap();
    wait_until(
        "the retried event sent again",
        Duration::from_secs(10),
        || sender.sent().iter().any(|e| e.id == ids[0]),
    );
    relay.shutdown(Duration::from_secs(5)).unwrap();
    assert!(
        matches!(
            Dlq::new(fx.store.clone()).get(ids[0]),
            Err(txbox::Error::NotFound(_))
        ),
        "the retried dead letter left the dead letters"
    );

    // the same over HTTP, behind the token
    let more = failed_in_the_outbox(&fx, &c, "order-created", 2);
    let server = AdminServer::start(fx.store.clone(), AdminOptions::new().token("s3cret")).unwrap();
    let (agent, base) = http(&server);
    let (code, _) = body(agent.post(format!("{base}/dlq/move")).send_empty().unwrap());
    assert_eq!(code, 401, "moving needs the token");
    let (code, text) = body(
        agent
            .post(format!("{base}/dlq/move"))
            .header("Authorization", "Bearer s3cret")
            .send_empty()
            .unwrap(),
    );
    assert_eq!((code, text.as_str()), (200, r#"{"moved":2}"#));
    let dlq = Dlq::new(fx.store.clone());
    for id in more {
        assert_eq!(dlq.get(id).unwrap().status, DlqStatus::Dead);
    }
    server.shutdown();
}

fn cli(prefix: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_txbox"))
        .args([
            "--database-url",
            &crate::common::pg_url(),
            "--table-prefix",
            prefix,
        ])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_dead_letter_another_instance_holds_is_refused_with_a_clear_error() {
    let p = "t_ops_held_";
    let Some(fx) = Fixture::new(Backend::Postgres, p) else {
        return;
    };
    let c = config(p);
    let ids = dead_letters(&fx, &c, "order-created", 1);
    let mut other = crate::common::client().unwrap();
    let mut tx = other.transaction().unwrap();
    tx.execute(
        &format!("SELECT 1 FROM {p}outbox_dead_letters WHERE id = $1 FOR UPDATE"),
        &[&ids[0].as_uuid()],
    )
    .unwrap();
    let dlq = Dlq::new(fx.store.clone());
    let err = dlq.resolve(ids[0]).unwrap_err();
    assert!(
        matches!(err, txbox::Error::InvalidTransition { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("another instance holds"), "{err}");
    tx.rollback().unwrap();
    dlq.resolve(ids[0]).unwrap();
    assert_eq!(dlq.get(ids[0]).unwrap().status, DlqStatus::Resolved);
    // batch forms by type
    dead_letters(&fx, &c, "order-paid", 3);
    assert_eq!(dlq.retry_type("order-paid").unwrap(), 3);
    assert_eq!(
        dlq.delete_type("order-paid").unwrap(),
        0,
        "marked for retry: not deletable"
    );
    assert_eq!(dlq.delete_type("order-created").unwrap(), 1);
    let too_many: Vec<EventId> = (0..1001).map(|_| EventId::new()).collect();
    assert!(dlq
        .retry_many(&too_many)
        .unwrap_err()
        .to_string()
        .contains("at most 1000"));
}

#[test]
fn the_cli_migrates_shows_status_and_operates_the_dlq() {
    let p = "t_ops_cli_";
    let Some(fx) = Fixture::new(Backend::Postgres, p) else {
        return;
    };
    let c = config(p);
    let (code, out, _) = cli(p, &["migrate"]);
    assert_eq!((code, out.trim()), (0, "migrated"));
    fx.publish(&c, "order-created", 4, true);
    let ids = dead_letters(&fx, &c, "order-paid", 3);

    let (code, out, _) = cli(p, &["status"]);
    assert_eq!(code, 0);
    assert!(
        out.lines().next().unwrap().starts_with("EVENT TYPE"),
        "{out}"
    );
    let row = out
        .lines()
        .find(|l| l.starts_with("order-created"))
        .expect(&out);
    assert_eq!(row.split_whitespace().nth(1), Some("4"), "{row}");
    let (code, out, _) = cli(p, &["--json", "status"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["event_type"], "order-created");
    assert_eq!(v[0]["pending"], 4);

    let (code, out, _) = cli(
        p,
        &[
            "--json",
            "dlq",
            "list",
            "--type",
            "order-paid",
            "--limit",
            "2",
        ],
    );
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 2);
    assert_eq!(v[0]["id"], ids[0].to_string());
    let (code, out, _) = cli(p, &["dlq", "list"]);
    assert_eq!(code, 0);
    assert_eq!(out.lines().count(), 4, "a header and three rows:\n{out}");
    assert!(out.contains("broker said no"), "{out}");

    let (code, out, _) = cli(p, &["dlq", "show", &ids[1].to_string()]);
    assert_eq!(code, 0);
    assert!(
        out.contains(&format!("id:         {}", ids[1])) && out.contains("payload:    1"),
        "{out}"
    );
    let (code, out, _) = cli(p, &["--json", "dlq", "show", &ids[1].to_string()]);
    assert_eq!(code, 0);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&out).unwrap()["status"],
        "DEAD"
    );

    assert_eq!(cli(p, &["dlq", "retry", &ids[0].to_string()]).0, 0);
    assert_eq!(cli(p, &["dlq", "resolve", &ids[1].to_string()]).0, 0);
    assert_eq!(cli(p, &["dlq", "delete", &ids[2].to_string()]).0, 0);
    let dlq = Dlq::new(fx.store.clone());
    assert_eq!(dlq.get(ids[0]).unwrap().status, DlqStatus::Retry);
    assert_eq!(dlq.get(ids[1]).unwrap().status, DlqStatus::Resolved);
    assert!(dlq.get(ids[2]).is_err());

    // bad input: one line on stderr, never a panic; 2 for usage, 1 for errors
    for (args, want) in [
        (vec!["dlq", "show", "not-a-uuid"], 2),
        (vec!["dlq", "list", "--status", "SLEEPING"], 2),
        (vec!["dlq", "list", "--limit", "ten"], 2),
        (vec!["frobnicate"], 2),
        (vec!["dlq", "retry"], 2),
        (vec!["dlq", "show", &EventId::new().to_string()], 1),
        (vec!["dlq", "resolve", &ids[1].to_string()], 1),
    ] {
        let (code, _, err) = cli(p, &args);
        assert_eq!(code, want, "{args:?}: {err}");
        assert!(
            err.starts_with("txbox: ") && !err.contains("panicked"),
            "{args:?}: {err}"
        );
    }
    // help for every command, and a suggestion for a typo
    for args in [
        vec!["--help"],
        vec!["dlq", "--help"],
        vec!["dlq", "retry", "--help"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_txbox"))
            .args(&args)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert!(text.contains("Usage: txbox"), "{args:?}: {text}");
    }
    let (code, _, err) = cli(p, &["dlq", "lisst"]);
    assert_eq!(code, 2);
    assert!(err.contains("a similar subcommand exists: 'list'"), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_txbox"))
        .args(["status"])
        .env_remove("TXBOX_DATABASE_URL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "no database given");
    let out = Command::new(env!("CARGO_BIN_EXE_txbox"))
        .args([
            "--database-url",
            "postgres://nobody@127.0.0.1:1/none",
            "status",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "unreachable database");
}

/// Hostile input on the command line: an argument that is not UTF-8 is a usage
/// error (exit 2, one line), not a panic; a dead letter whose error text holds
/// terminal escape sequences and newlines is shown with them escaped.
#[test]
fn the_cli_refuses_non_utf8_arguments_and_escapes_what_it_prints() {
    use std::os::unix::ffi::OsStrExt;
    let p = "t_ops_cli_hostile_";
    let Some(fx) = Fixture::new(Backend::Postgres, p) else {
        return;
    };
    let out = Command::new(env!("CARGO_BIN_EXE_txbox"))
        .arg("--table-prefix")
        .arg(std::ffi::OsStr::from_bytes(b"bad\xff"))
        .arg("status")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.starts_with("txbox: argument 2 is not valid UTF-8"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");

    let c = config(p);
    let ids = fx.publish(&c, "order-paid", 1, true);
    let t = Uuid::now_v7();
    fx.store
        .claim("order-paid", 1, Duration::from_secs(60), t)
        .unwrap();
    let hostile = "boom\x1b[2J\x1b]0;owned\x07\nstatus:     RESOLVED\u{202e}";
    let failed = [(
        ids[0],
        Outcome::Failed {
            error: hostile.into(),
        },
    )];
    fx.store.finish(t, &failed).unwrap();
    fx.store.move_failed_to_dlq(10).unwrap();
    for args in [
        vec!["dlq", "show", &ids[0].to_string()],
        vec!["dlq", "list"],
    ] {
        let (code, out, _) = cli(p, &args);
        assert_eq!(code, 0);
        assert!(
            !out.contains('\x1b') && !out.contains('\x07') && !out.contains('\u{202e}'),
            "{args:?} printed control characters raw: {out:?}"
        );
        assert!(out.contains("boom\\u{1b}[2J"), "{out}");
    }
    // what an error line echoes is escaped too (clap quotes the bad value)
    let (code, _, err) = cli(p, &["dlq", "list", "--status", "\x1b[2J\u{202e}"]);
    assert_eq!(code, 2);
    assert!(
        !err.contains('\x1b') && !err.contains('\u{202e}'),
        "an error line printed control characters raw: {err:?}"
    );
    let (_, out, _) = cli(p, &["dlq", "show", &ids[0].to_string()]);
    assert!(
        !out.lines().any(|l| l.starts_with("status:     RESOLVED")),
        "a forged line: {out}"
    );
}

/// An admin endpoint behind the token `s3cret` on the tables of `prefix`, with
/// `request_timeout`.
fn guarded_server(prefix: &str, request_timeout: Duration) -> Option<(Fixture, AdminServer)> {
    let fx = Fixture::new(Backend::Postgres, prefix)?;
    let server = AdminServer::start(
        fx.store.clone(),
        AdminOptions::new()
            .token("s3cret")
            .request_timeout(request_timeout),
    )
    .unwrap();
    Some((fx, server))
}

fn http(server: &AdminServer) -> (ureq::Agent, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    (agent, format!("http://{}", server.addr()))
}

fn body(r: ureq::http::Response<ureq::Body>) -> (u16, String) {
    let code = r.status().as_u16();
    (code, r.into_body().read_to_string().unwrap_or_default())
}

#[test]
fn the_http_endpoint_serves_health_metrics_and_the_dlq() {
    let p = "t_ops_http_";
    let Some(fx) = Fixture::new(Backend::Postgres, p) else {
        return;
    };
    let c = config(p);
    let ids = dead_letters(&fx, &c, "order-paid", 2);
    let sender = MemorySender::new();
    let relay = Relay::start(fx.store.clone(), &c, sender.clone()).unwrap();
    fx.publish(&c, "order-created", 5, true);
    wait_until("5 sent", Duration::from_secs(10), || sender.len() >= 5);
    txbox::metrics::record_status(
        fx.store.status().unwrap(),
        fx.store.dlq_count(&txbox::DlqFilter::default()).unwrap(),
    );

    let server = AdminServer::start(
        fx.store.clone(),
        AdminOptions::new().token("s3cret").relay(relay.probe()),
    )
    .unwrap();
    assert!(server.addr().ip().is_loopback());
    let (agent, base) = http(&server);
    let (code, text) = body(agent.get(format!("{base}/health")).call().unwrap());
    assert_eq!(code, 200, "{text}");
    let health = serde_json::from_str::<serde_json::Value>(&text).unwrap();
    assert_eq!(health["status"], "ok");
    // PostgreSQL's notification queue, which a listener that stopped reading fills
    let usage = health["notify_queue_usage"]
        .as_f64()
        .expect("notify_queue_usage");
    assert!((0.0..0.5).contains(&usage), "{usage}");

    let (code, text) = body(agent.get(format!("{base}/metrics")).call().unwrap());
    assert_eq!(code, 200);
    let mut samples = 0;
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (name, value) = line.rsplit_once(' ').expect(line);
        assert!(value.parse::<f64>().is_ok(), "value of {line:?}");
        let metric = name.split('{').next().unwrap();
        assert!(
            metric
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "{line:?}"
        );
        assert!(!name.contains('{') || name.ends_with('}'), "{line:?}");
        samples += 1;
    }
    assert!(samples > 20, "{text}");
    let sent: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("txbox_events_sent_total "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(sent >= 5.0);
    assert!(
        text.contains("txbox_outbox_pending{event_type=") || text.contains("txbox_dlq_size 2"),
        "{text}"
    );
    assert!(text.contains("txbox_send_latency_seconds_bucket{le=\"+Inf\"}"));

    let (code, text) = body(
        agent
            .get(format!("{base}/dlq/events?type=order-paid&limit=1"))
            .header("Authorization", "Bearer s3cret")
            .call()
            .unwrap(),
    );
    assert_eq!(code, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        (v["total"].as_u64(), v["events"].as_array().map(Vec::len)),
        (Some(2), Some(1))
    );
    let (code, text) = body(
        agent
            .get(format!("{base}/dlq/events/{}", ids[1]))
            .header("Authorization", "Bearer s3cret")
            .call()
            .unwrap(),
    );
    assert_eq!(
        (
            code,
            serde_json::from_str::<serde_json::Value>(&text).unwrap()["attempts"].as_u64()
        ),
        (200, Some(1))
    );

    let url = format!("{base}/dlq/events/{}", ids[0]);
    let (code, _) = body(agent.patch(&url).send("{\"status\":\"RESOLVED\"}").unwrap());
    assert_eq!(code, 401, "no token");
    let (code, _) = body(
        agent
            .patch(&url)
            .header("Authorization", "Bearer wrong")
            .send("{\"status\":\"RESOLVED\"}")
            .unwrap(),
    );
    assert_eq!(code, 401);
    let authed = |r: ureq::RequestBuilder<ureq::typestate::WithBody>| {
        r.header("Authorization", "Bearer s3cret")
    };
    let (code, text) = body(
        authed(agent.patch(&url))
            .send("{\"status\":\"RESOLVED\"}")
            .unwrap(),
    );
    assert_eq!(code, 200, "{text}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&text).unwrap()["status"],
        "RESOLVED"
    );
    let (code, text) = body(
        authed(agent.patch(&url))
            .send("{\"status\":\"RESOLVED\"}")
            .unwrap(),
    );
    assert_eq!(code, 409, "{text}");
    for (bad, why) in [
        ("{status: RETRY", "malformed"),
        ("{\"status\":\"IN_PROCESS\"}", "internal state"),
        ("{\"status\":\"DEAD\"}", "not settable"),
    ] {
        let (code, text) = body(authed(agent.patch(&url)).send(bad).unwrap());
        assert_eq!(code, 400, "{why}: {text}");
        assert!(serde_json::from_str::<serde_json::Value>(&text).unwrap()["error"].is_string());
    }
    let (code, _) = body(authed(agent.patch(&url)).send(vec![b' '; 70_000]).unwrap());
    assert_eq!(code, 413);
    let (code, _) = body(
        agent
            .get(format!("{base}/dlq/events/not-a-uuid"))
            .header("Authorization", "Bearer s3cret")
            .call()
            .unwrap(),
    );
    assert_eq!(code, 400);
    let (code, _) = body(
        agent
            .get(format!("{base}/dlq/events/{}", EventId::new()))
            .header("Authorization", "Bearer s3cret")
            .call()
            .unwrap(),
    );
    assert_eq!(code, 404);
    let (code, text) = body(
        agent
            .get(format!("{base}/nope"))
            .header("Authorization", "Bearer s3cret")
            .call()
            .unwrap(),
    );
    assert_eq!(code, 404);
    assert!(text.contains("error"));
    let (code, _) = body(
        agent
            .get(format!("{base}/dlq/events?limit=ten"))
            .header("Authorization", "Bearer s3cret")
            .call()
            .unwrap(),
    );
    assert_eq!(code, 400);
    let (code, _) = body(
        agent
            .delete(format!("{base}/dlq/events/{}", ids[1]))
            .header("Authorization", "Bearer s3cret")
            .call()
            .unwrap(),
    );
    assert_eq!(code, 204);
    assert!(Dlq::new(fx.store.clone()).get(ids[1]).is_err());

    // the relay stopped: health says so
    relay.shutdown(Duration::from_secs(5)).unwrap();
    let (code, text) = body(agent.get(format!("{base}/health")).call().unwrap());
    assert_eq!(code, 503, "{text}");
    server.shutdown();

    // without a token, mutating routes are off
    let server = AdminServer::start(fx.store.clone(), AdminOptions::new()).unwrap();
    let (agent, base) = http(&server);
    let (code, _) = body(
        agent
            .delete(format!("{base}/dlq/events/{}", ids[0]))
            .header("Authorization", "Bearer s3cret")
            .call()
            .unwrap(),
    );
    assert_eq!(code, 403);
}

/// Dead letters hold payloads, keys and headers: every DLQ route needs the token,
/// reads too. The scheme is case-insensitive; `/health` and `/metrics` are open
/// unless protected.
#[test]
fn every_dlq_route_needs_the_token_and_probes_can_be_protected() {
    let p = "t_ops_auth_";
    let Some(fx) = Fixture::new(Backend::Postgres, p) else {
        return;
    };
    let c = config(p);
    let ids = dead_letters(&fx, &c, "order-paid", 1);
    let server = AdminServer::start(fx.store.clone(), AdminOptions::new().token("s3cret")).unwrap();
    let (agent, base) = http(&server);
    let get = |path: &str, auth: Option<&str>| {
        let mut r = agent.get(format!("{base}{path}"));
        if let Some(a) = auth {
            r = r.header("Authorization", a);
        }
        body(r.call().unwrap())
    };
    let one = format!("/dlq/events/{}", ids[0]);
    for path in ["/dlq/events", one.as_str()] {
        let (code, text) = get(path, None);
        assert_eq!(code, 401, "{path}: {text}");
        assert!(!text.contains("payload"), "{text}");
        assert_eq!(get(path, Some("Bearer wrong")).0, 401);
        assert_eq!(
            get(path, Some("Bearer s3cre")).0,
            401,
            "a prefix of the token"
        );
        assert_eq!(get(path, Some("Basic s3cret")).0, 401, "another scheme");
        assert_eq!(get(path, Some("s3cret")).0, 401, "no scheme");
        for scheme in ["Bearer", "bearer", "BEARER"] {
            let (code, text) = get(path, Some(&format!("{scheme} s3cret")));
            assert_eq!(code, 200, "{scheme}: {text}");
        }
    }
    assert_eq!(get("/health", None).0, 200, "open by default");
    assert_eq!(get("/metrics", None).0, 200, "open by default");
    server.shutdown();

    let server = AdminServer::start(
        fx.store.clone(),
        AdminOptions::new()
            .token("s3cret")
            .protect_health_and_metrics(true),
    )
    .unwrap();
    let (agent, base) = http(&server);
    for path in ["/health", "/metrics"] {
        let (code, _) = body(agent.get(format!("{base}{path}")).call().unwrap());
        assert_eq!(code, 401, "{path} protected");
        let (code, _) = body(
            agent
                .get(format!("{base}{path}"))
                .header("Authorization", "Bearer s3cret")
                .call()
                .unwrap(),
        );
        assert_eq!(code, 200, "{path} with the token");
    }
    server.shutdown();

    // no token configured: the DLQ is off, reads too
    let server = AdminServer::start(fx.store.clone(), AdminOptions::new()).unwrap();
    let (agent, base) = http(&server);
    let (code, text) = body(agent.get(format!("{base}/dlq/events")).call().unwrap());
    assert_eq!(code, 403, "{text}");
    server.shutdown();
}

/// Clients that stall or trickle (a `Content-Length` and then silence, a body
/// one byte at a time, headers that never end, an absurd `Content-Length`)
/// neither keep `/health` from answering nor `shutdown` from returning; each is
/// answered 408 once its time is up; an endpoint idle for longer than the
/// request timeout still serves.
#[test]
fn a_stalled_client_blocks_neither_health_nor_shutdown() {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    let Some((_fx, server)) = guarded_server("t_ops_stall_", Duration::from_secs(1)) else {
        return;
    };
    let addr = server.addr();
    let (agent, base) = http(&server);
    let health = || {
        let t = std::time::Instant::now();
        let (code, _) = body(agent.get(format!("{base}/health")).call().unwrap());
        assert_eq!(code, 200);
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "health took {:?} while clients stall",
            t.elapsed()
        );
    };
    // idle for longer than the request timeout: still serving
    std::thread::sleep(Duration::from_millis(1500));
    health();

    let id = EventId::new();
    let open = |text: String| {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(text.as_bytes()).unwrap();
        s
    };
    let patch = format!(
        "PATCH /dlq/events/{id} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\n\
         Content-Length: 60000\r\n\r\n{{\"sta"
    );
    // authorized, a body announced and never sent
    let mut silent = open(patch.clone());
    // the same body trickled one byte at a time, for longer than the timeout
    let mut trickle = open(patch);
    let mut trickler = trickle.try_clone().unwrap();
    let dripping = std::thread::spawn(move || {
        for _ in 0..25 {
            std::thread::sleep(Duration::from_millis(200));
            if trickler.write_all(b" ").is_err() {
                return;
            }
        }
    });
    // GETs that announce bodies they never send, one absurdly large
    let mut huge_get =
        open("GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000000\r\n\r\n".into());
    let mut max_get = open(format!(
        "GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        u64::MAX
    ));
    // headers that never end
    let mut half = open("GET /health HTTP/1.1\r\nHost: x\r\n".into());
    std::thread::sleep(Duration::from_millis(100));
    for _ in 0..5 {
        health();
    }
    // each stalled request is answered 408 within its time (plus one read)
    let t = std::time::Instant::now();
    for (what, s) in [
        ("silent body", &mut silent),
        ("trickled body", &mut trickle),
    ] {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 408"), "{what}: {answer:?}");
    }
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "408s took {:?}",
        t.elapsed()
    );
    // a GET's announced body is not read: answered at once, whatever its size;
    // the headers that never end time out
    for (what, s, want) in [
        ("huge GET body", &mut huge_get, "HTTP/1.1 200"),
        ("u64::MAX GET body", &mut max_get, "HTTP/1.1 200"),
        ("headers never ending", &mut half, "HTTP/1.1 408"),
    ] {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        assert!(answer.starts_with(want), "{what}: {answer:?}");
    }
    // shutdown while a client still holds its headers open
    let half2 = open("GET /health HTTP/1.1\r\n".into());
    let t = std::time::Instant::now();
    server.shutdown();
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "shutdown took {:?}",
        t.elapsed()
    );
    dripping.join().unwrap();
    drop((huge_get, max_get, half, half2));
}

/// `/health` says the database is unreachable and why goes to the log: no
/// error text (hosts, users, server messages) to whoever reaches the port.
#[test]
fn health_gives_a_short_reason_not_the_database_error() {
    let pool = r2d2::Pool::builder()
        .max_size(1)
        .connection_timeout(Duration::from_millis(500))
        .build_unchecked(r2d2_postgres::PostgresConnectionManager::new(
            "postgres://admin:hunter2@127.0.0.1:1/secretdb"
                .parse()
                .unwrap(),
            postgres::NoTls,
        ));
    let store = Arc::new(
        txbox::PgStore::from_pool(pool, &crate::common::prefix_config("t_ops_down_")).unwrap(),
    );
    let server = AdminServer::start(store, AdminOptions::new()).unwrap();
    let (agent, base) = http(&server);
    // the check's answer (a request waits for it 0.5 s at most: on a loaded
    // machine the pool's 0.5 s may come after, and the answer with the next)
    let (mut code, mut text) = (0, String::new());
    crate::common::wait_until("the check's answer", Duration::from_secs(5), || {
        (code, text) = body(agent.get(format!("{base}/health")).call().unwrap());
        !text.contains("no answer for")
    });
    assert_eq!(code, 503, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["database"], "unreachable");
    for secret in [
        "hunter2",
        "admin",
        "secretdb",
        "127.0.0.1",
        "refused",
        "error",
    ] {
        assert!(!text.contains(secret), "{secret} in {text}");
    }
    server.shutdown();
}

#[test]
fn the_metrics_snapshot_counts_what_happened() {
    let p = "t_ops_metrics_";
    let Some(fx) = Fixture::new(Backend::Postgres, p) else {
        return;
    };
    // a registry of its own: exact counts, whatever else runs in the process
    let registry = std::sync::Arc::new(txbox::metrics::Registry::new());
    let c = config(p).observed(registry.clone());
    let sender = MemorySender::new();
    let relay = Relay::start(fx.store.clone(), &c, sender.clone()).unwrap();
    fx.publish(&c, "order-created", 7, true);
    wait_until("7 sent", Duration::from_secs(10), || {
        registry.snapshot().events_sent == 7
    });
    relay.shutdown(Duration::from_secs(5)).unwrap();
    let after = registry.snapshot();
    assert_eq!(sender.len(), 7);
    assert_eq!((after.events_published, after.events_sent), (7, 7));
    assert_eq!((after.events_retried, after.events_failed), (0, 0));
    assert!((1..=7).contains(&after.send_latency.count), "{after:?}");
    assert_eq!(after.commit_to_ack.count, 7);
    assert!(after.polling_delay_seconds.contains_key("order-created"));
    let text = registry.prometheus();
    assert!(text.contains("\ntxbox_events_sent_total 7\n"), "{text}");
}

/// Two relays in one process, each configuration with a registry of its own:
/// each counts its own events and gauges, not the sum of both (before 0.3 the
/// counters were process-wide and the gauges overwrote each other).
#[test]
fn two_relays_with_registries_of_their_own_count_apart() {
    let (pa, pb) = ("t_ops_obs_a_", "t_ops_obs_b_");
    let (Some(a), Some(b)) = (
        Fixture::new(Backend::Postgres, pa),
        Fixture::new(Backend::Postgres, pb),
    ) else {
        return;
    };
    let (ra, rb) = (
        std::sync::Arc::new(txbox::metrics::Registry::new()),
        std::sync::Arc::new(txbox::metrics::Registry::new()),
    );
    // a recovery run (which reads the outbox gauges) every 100 ms
    let observed = |prefix: &str, r: &std::sync::Arc<txbox::metrics::Registry>| {
        Config::builder()
            .table_prefix(prefix)
            .event("order-created", |e| {
                e.fixed_polling(Duration::from_millis(10))
            })
            .maintenance(|m| m.recovery_interval(Duration::from_millis(100)))
            .build()
            .unwrap()
            .observed(r.clone())
    };
    let (ca, cb) = (observed(pa, &ra), observed(pb, &rb));
    failed_in_the_outbox(&a, &ca, "order-created", 1);
    let (sa, sb) = (MemorySender::new(), MemorySender::new());
    let relay_a = Relay::start(a.store.clone(), &ca, sa.clone()).unwrap();
    let relay_b = Relay::start(b.store.clone(), &cb, sb.clone()).unwrap();
    a.publish(&ca, "order-created", 5, true);
    b.publish(&cb, "order-created", 3, true);
    wait_until("both sent", Duration::from_secs(10), || {
        ra.snapshot().events_sent == 5 && rb.snapshot().events_sent == 3
    });
    // each recovery run reads its own tables into its own gauges: A's
    // failed event, moved to A's dead letters, is in A's, and B has none
    wait_until("the dead-letter gauges", Duration::from_secs(10), || {
        ra.snapshot().dlq_size == Some(1) && rb.snapshot().dlq_size == Some(0)
    });
    relay_a.shutdown(Duration::from_secs(5)).unwrap();
    relay_b.shutdown(Duration::from_secs(5)).unwrap();
    let (x, y) = (ra.snapshot(), rb.snapshot());
    assert_eq!(
        (x.events_published, x.events_sent),
        (6, 5),
        "one of A's failed"
    );
    assert_eq!((y.events_published, y.events_sent), (3, 3));
    assert_eq!((x.commit_to_ack.count, y.commit_to_ack.count), (5, 3));
    assert_eq!((sa.len(), sb.len()), (5, 3));
    // the admin endpoint serves the registry it is given
    let server = AdminServer::start(a.store.clone(), AdminOptions::new().metrics(ra)).unwrap();
    let (agent, base) = http(&server);
    let (code, text) = body(agent.get(format!("{base}/metrics")).call().unwrap());
    assert_eq!(code, 200);
    assert!(text.contains("\ntxbox_events_sent_total 5\n"), "{text}");
    server.shutdown();
}

/// Clients that connect and send half a request line, however many, must not
/// make `/health` answer 503 (an orchestrator would read that as "restart
/// me"): a connection takes a request slot only once its head has arrived, and
/// past the readers' limit the oldest stalled one is closed. 400 of them: more
/// than every slot and more than the readers' limit.
#[test]
fn stalled_clients_however_many_leave_health_answering() {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    let Some((_fx, server)) = guarded_server("t_ops_full_", Duration::from_secs(5)) else {
        return;
    };
    let addr = server.addr();
    let mut stalled: Vec<TcpStream> = (0..400)
        .map(|_| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(b"GET /health HTTP/1.1\r\n").unwrap();
            s
        })
        .collect();
    let (agent, base) = http(&server);
    for _ in 0..3 {
        let (code, text) = body(agent.get(format!("{base}/health")).call().unwrap());
        assert_eq!(code, 200, "health with 400 clients stalled: {text}");
        let (code, _) = body(agent.get(format!("{base}/metrics")).call().unwrap());
        assert_eq!(code, 200, "metrics with 400 clients stalled");
        let (code, text) = body(
            agent
                .get(format!("{base}/dlq/events"))
                .header("Authorization", "Bearer s3cret")
                .call()
                .unwrap(),
        );
        assert_eq!(code, 200, "a stalled client holds no slot: {text}");
    }
    // the oldest stalled connections were closed to make room (at once, not
    // after the 5 s request timeout)
    let mut first = [0u8; 64];
    stalled[0]
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    let read = stalled[0].read(&mut first);
    assert!(
        matches!(read, Ok(0))
            || read
                .as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "the oldest stalled client is still connected: {read:?}"
    );
    drop(stalled);
    server.shutdown();
}

/// An ordered type's key held back by a dead letter: the CLI (`dlq blocked`)
/// and the HTTP route (`GET /dlq/blocked`) name the key, the event that holds
/// it and how many wait; resolving the dead letter clears it.
#[test]
fn the_cli_and_http_show_which_keys_are_blocked_and_by_what() {
    let p = "t_ops_blocked_";
    let Some((fx, server)) = guarded_server(p, Duration::from_secs(5)) else {
        return;
    };
    let c = Config::builder()
        .table_prefix(p)
        .event("order-events", |e| e.ordering(txbox::EventOrder::Key))
        .build()
        .unwrap();
    let events = (0..3)
        .map(|i| {
            txbox::NewEvent::new("order-events", &i)
                .unwrap()
                .key("order-7")
        })
        .collect();
    let ids = fx.publish_events(&c, events);
    let t = Uuid::now_v7();
    let args = txbox::store::ClaimArgs::new("order-events", 10, Duration::from_secs(60))
        .ordered(txbox::OnPoison::Block);
    let claimed = fx.store.claim_after(&args, t).unwrap();
    assert_eq!(claimed.len(), 1, "one event of the key at a time");
    let error = "poison".to_string();
    fx.store
        .finish(t, &[(ids[0], Outcome::Failed { error })])
        .unwrap();
    fx.store.move_failed_to_dlq(10).unwrap();

    let (code, out, err) = cli(p, &["dlq", "blocked", "--type", "order-events"]);
    assert_eq!(code, 0, "{err}");
    let line = out.lines().nth(1).unwrap_or_default().to_string();
    for word in ["order-events", "order-7", &ids[0].to_string(), "DEAD", "2"] {
        assert!(line.contains(word), "{word} not in {out}");
    }
    let (agent, base) = http(&server);
    let r = agent
        .get(format!("{base}/dlq/blocked?type=order-events"))
        .header("Authorization", "Bearer s3cret")
        .call()
        .unwrap();
    let (code, text) = body(r);
    assert_eq!(code, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["keys"][0]["key"], "order-7");
    assert_eq!(v["keys"][0]["blocked_by"], ids[0].to_string());
    assert_eq!(v["keys"][0]["waiting"], 2);
    let (code, _) = body(
        agent
            .get(format!("{base}/dlq/blocked"))
            .header("Authorization", "Bearer s3cret")
            .call()
            .unwrap(),
    );
    assert_eq!(code, 400, "the type is required");

    Dlq::new(fx.store.clone()).resolve(ids[0]).unwrap();
    let (code, out, _) = cli(p, &["--json", "dlq", "blocked", "--type", "order-events"]);
    assert_eq!((code, out.trim()), (0, "[]"));
}

/// `txbox migrate --dry-run` lists what `migrate` would run, with its SQL, and
/// changes nothing: on a current schema nothing, with a version missing that
/// version alone (the baseline runs only where there is no version table), on
/// an empty database every file.
#[test]
fn migrate_dry_run_lists_what_would_run_and_changes_nothing() {
    let p = "t_ops_dry_";
    let Some(fx) = Fixture::new(Backend::Postgres, p) else {
        return;
    };
    assert!(fx.store.pending_migrations().unwrap().is_empty());
    let (code, out, _) = cli(p, &["migrate", "--dry-run"]);
    assert_eq!(
        (code, out.trim()),
        (0, "the schema is current: nothing to run")
    );
    let mut c = crate::common::client().unwrap();
    c.batch_execute(&format!(
        "DELETE FROM {p}txbox_schema_version WHERE version = 10"
    ))
    .unwrap();
    let pending = fx.store.pending_migrations().unwrap();
    let versions: Vec<i64> = pending.iter().map(|m| m.version).collect();
    assert_eq!(versions, vec![10]);
    assert!(pending[0]
        .title
        .starts_with("txbox schema 10 for PostgreSQL"));
    assert!(pending[0]
        .sql
        .contains(&format!("{p}outbox_events_fresh_idx")));
    let (code, out, _) = cli(p, &["migrate", "--dry-run"]);
    assert_eq!(code, 0);
    assert!(out.contains("-- version 10: txbox schema 10"), "{out}");
    assert!(!out.contains("{prefix}"), "the prefix is filled in");
    // nothing changed
    assert_eq!(fx.store.pending_migrations().unwrap().len(), 1);
    let (code, out, _) = cli(p, &["--json", "migrate", "--dry-run"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["pending"][0]["version"], 10);
    fx.store.migrate().unwrap();
    assert!(fx.store.pending_migrations().unwrap().is_empty());
    // a database without the tables: every file
    let fresh = "t_ops_dry_none_";
    for t in [
        "outbox_events",
        "outbox_dead_letters",
        "inbox_consumed",
        "job_locks",
        "txbox_schema_version",
        "outbox_quiet_types",
        "outbox_paused_types",
    ] {
        c.batch_execute(&format!("DROP TABLE IF EXISTS {fresh}{t}"))
            .unwrap();
    }
    let (code, out, _) = cli(fresh, &["--json", "migrate", "--dry-run"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["pending"].as_array().unwrap().len(), 10);
}

/// `txbox pause` / `resume` / `status`, the HTTP routes behind the token,
/// `/health` and the metrics all show a paused type; on PostgreSQL a resume
/// wakes the relay's poller at once (its polling delay here is 30 s).
#[test]
fn a_type_is_paused_and_resumed_from_the_cli_and_http() {
    let p = "t_ops_pause_";
    let Some(fx) = Fixture::new(Backend::Postgres, p) else {
        return;
    };
    let registry = Arc::new(txbox::metrics::Registry::new());
    let c = Config::builder()
        .table_prefix(p)
        .defaults(|e| e.fixed_polling(Duration::from_secs(30)))
        .maintenance(|m| m.recovery_interval(Duration::from_millis(200)))
        .event("order-created", |e| e)
        .build()
        .unwrap()
        .observed(registry.clone());
    let (code, out, err) = cli(p, &["pause", "order-created"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("paused order-created"), "{out}");
    let (_, out, _) = cli(p, &["pause", "order-created"]);
    assert!(out.contains("was paused already"), "{out}");
    let (code, out, _) = cli(p, &["--json", "status"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["event_type"], "order-created");
    assert_eq!(v[0]["paused"], true, "listed without events: {v}");

    let sender = MemorySender::new();
    let relay = Relay::start(fx.store.clone(), &c, sender.clone()).unwrap();
    fx.publish(&c, "order-created", 5, true);
    wait_until("the metrics say paused", Duration::from_secs(10), || {
        registry.snapshot().paused == ["order-created"]
    });
    assert!(registry
        .prometheus()
        .contains("txbox_event_type_paused{event_type=\"order-created\"} 1"));
    let server = AdminServer::start(fx.store.clone(), AdminOptions::new().token("s3cret")).unwrap();
    let (agent, base) = http(&server);
    let (code, text) = body(agent.get(format!("{base}/health")).call().unwrap());
    assert_eq!(code, 200);
    let health: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        health["paused"],
        serde_json::json!(["order-created"]),
        "{text}"
    );
    let (code, _) = body(agent.get(format!("{base}/types/paused")).call().unwrap());
    assert_eq!(code, 401, "the pause routes need the token");
    let (code, text) = body(
        agent
            .get(format!("{base}/types/paused"))
            .header("Authorization", "Bearer s3cret")
            .call()
            .unwrap(),
    );
    assert_eq!(
        (code, text.as_str()),
        (200, r#"{"paused":["order-created"]}"#)
    );
    assert_eq!(sender.len(), 0, "nothing sent while paused");

    // resumed over HTTP: the poller, asleep for 30 s, is woken by the resume
    let resumed_at = std::time::Instant::now();
    let (code, text) = body(
        agent
            .post(format!("{base}/types/order-created/resume"))
            .header("Authorization", "Bearer s3cret")
            .send_empty()
            .unwrap(),
    );
    assert_eq!((code, text.as_str()), (200, r#"{"resumed":true}"#));
    assert_eq!(sender.wait_for(5, Duration::from_secs(10)), 5);
    assert!(
        resumed_at.elapsed() < Duration::from_secs(10),
        "sent {:?} after the resume",
        resumed_at.elapsed()
    );
    // paused again over HTTP (a type name with a space, percent-encoded),
    // resumed from the command line
    let (code, text) = body(
        agent
            .post(format!("{base}/types/order%20paid/pause"))
            .header("Authorization", "Bearer s3cret")
            .send_empty()
            .unwrap(),
    );
    assert_eq!((code, text.as_str()), (200, r#"{"paused":true}"#));
    let (code, out, _) = cli(p, &["status"]);
    assert_eq!(code, 0);
    assert!(
        out.lines()
            .any(|l| l.starts_with("order paid") && l.ends_with("paused")),
        "{out}"
    );
    let (code, out, _) = cli(p, &["resume", "order paid"]);
    assert_eq!((code, out.trim()), (0, "resumed order paid"));
    let (code, _) = body(
        agent
            .post(format!("{base}/types/%00/pause"))
            .header("Authorization", "Bearer s3cret")
            .send_empty()
            .unwrap(),
    );
    assert_eq!(code, 400, "a type with a control character is refused");
    server.shutdown();
    relay.shutdown(Duration::from_secs(5)).unwrap();
}

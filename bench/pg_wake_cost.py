# Bench part for PostgreSQL (issue 27), run by hand: `python3 bench/pg_wake_cost.py
# [SECONDS] [ROUNDS]` from the repository, against the PostgreSQL of .ci/services.sh
# (pgbench and psql on the PATH). What the wake-up on commit costs the publishers,
# taken apart: N concurrent pgbench clients, each transaction one business row and
# one outbox row (the shipped schema, in a scratch database), no relay running, for
# each way of waking a relay below. The variants take turns, fresh tables each run;
# each figure is the median of the rounds, and the ratio is to "no trigger".
import os, statistics, subprocess, sys, tempfile, glob

SECS = int(sys.argv[1]) if len(sys.argv) > 1 else 8
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
# optional: the client counts ("8,32") and the variants whose names start with
# one of the words given ("no trigger,schema 6 as shipped,a deferred")
CLIENTS = [int(c) for c in sys.argv[3].split(",")] if len(sys.argv) > 3 else [1, 8, 32, 64]
ONLY = sys.argv[4].split(",") if len(sys.argv) > 4 else None
DB = "txbox_wake_cost"
PG = ["-h", "127.0.0.1", "-U", "postgres"]
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def psql(sql, db=DB):
    subprocess.run(["psql", *PG, "-d", db, "-qAt", "-v", "ON_ERROR_STOP=1"],
                   input=sql, text=True, check=True, capture_output=True)


INSERT = ("INSERT INTO outbox_events (id, event_type, payload) "
          "VALUES (gen_random_uuid(), 'orders', '{\"v\": 1}')")
# the publishers' transaction; {outbox} is the outbox statement of the variant
SCRIPT = """\\set v random(1, 1000000)
BEGIN;
INSERT INTO business (v) VALUES (:v);
{outbox};
END;
"""
OFF = "ALTER TABLE outbox_events DISABLE TRIGGER outbox_events_wake"
# (name, SQL run after the schema, the outbox statement)
VARIANTS = [
    ("no trigger", OFF, INSERT),
    ("schema 6 as shipped (notifies, rationed)", "", INSERT),
    ("schema 6, the type quiet: fires, locks, sends nothing",
     "INSERT INTO outbox_quiet_types VALUES ('orders')", INSERT),
    ("a deferred row trigger that returns at once",
     OFF + "; CREATE FUNCTION nop() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;"
     " CREATE CONSTRAINT TRIGGER nop AFTER INSERT ON outbox_events DEFERRABLE INITIALLY DEFERRED"
     " FOR EACH ROW EXECUTE FUNCTION nop()", INSERT),
    ("a deferred row trigger: try-lock, notify (no shared lock, no bookkeeping)",
     OFF + "; CREATE FUNCTION dtry() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
     " IF pg_try_advisory_xact_lock(hashtext(TG_TABLE_NAME), hashtext(NEW.event_type)) THEN"
     " PERFORM pg_notify(TG_TABLE_NAME, NEW.event_type); END IF; RETURN NULL; END $$;"
     " CREATE CONSTRAINT TRIGGER dtry AFTER INSERT ON outbox_events DEFERRABLE INITIALLY DEFERRED"
     " FOR EACH ROW EXECUTE FUNCTION dtry()", INSERT),
    ("an immediate row trigger: try-lock, notify (the issue's experiment)",
     OFF + "; CREATE FUNCTION try_notify() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
     " IF pg_try_advisory_xact_lock(hashtext(TG_TABLE_NAME), hashtext(NEW.event_type)) THEN"
     " PERFORM pg_notify(TG_TABLE_NAME, NEW.event_type); END IF; RETURN NULL; END $$;"
     " CREATE TRIGGER try_notify AFTER INSERT ON outbox_events FOR EACH ROW EXECUTE FUNCTION try_notify()",
     INSERT),
    ("no trigger, the INSERT itself try-locks and notifies", OFF,
     "WITH e AS (" + INSERT + " RETURNING event_type) SELECT pg_notify('outbox_events', e.event_type)"
     " FROM e WHERE pg_try_advisory_xact_lock(hashtext('outbox_events'), hashtext(e.event_type))"),
    ("schema 3 (every commit notifies)",
     OFF + "; CREATE FUNCTION every() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
     " PERFORM pg_notify(TG_TABLE_NAME, 'orders'); RETURN NULL; END $$;"
     " CREATE TRIGGER every AFTER INSERT ON outbox_events FOR EACH STATEMENT EXECUTE FUNCTION every()",
     INSERT),
]


if ONLY:
    VARIANTS = [v for v in VARIANTS if any(v[0].startswith(w) for w in ONLY)]


def schema():
    files = sorted(glob.glob(os.path.join(ROOT, "sql", "postgres", "0*.sql")))
    return "\n".join(open(f).read().replace("{prefix}", "") for f in files)


def fresh(setup):
    psql(f"DROP DATABASE IF EXISTS {DB}", "postgres")
    psql(f"CREATE DATABASE {DB}", "postgres")
    psql("CREATE TABLE business (id bigserial PRIMARY KEY, v int NOT NULL);\n" + schema())
    if setup:
        psql(setup + ";")
    psql("CHECKPOINT; VACUUM ANALYZE;")


def tps(outbox, clients):
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(SCRIPT.format(outbox=outbox))
    try:
        out = subprocess.run(["pgbench", *PG, "-n", "-M", "prepared", "-c", str(clients),
                              "-j", str(min(clients, 2)), "-T", str(SECS), "-f", f.name, DB],
                             text=True, check=True, capture_output=True).stdout
    finally:
        os.unlink(f.name)
    line = next(l for l in out.splitlines() if l.startswith("tps"))
    return float(line.split("=")[1].split()[0])


results = {}
for r in range(ROUNDS):
    for clients in CLIENTS:
        order = VARIANTS if r % 2 == 0 else list(reversed(VARIANTS))
        for name, setup, outbox in order:
            fresh(setup)
            results.setdefault((name, clients), []).append(tps(outbox, clients))
            print(f"round {r + 1}, {clients} clients, {name}: {results[(name, clients)][-1]:.0f} tps",
                  file=sys.stderr, flush=True)
psql(f"DROP DATABASE IF EXISTS {DB}", "postgres")

print(f"\n{SECS} s per run, {ROUNDS} rounds, median tps (ratio to no trigger)\n")
print("| variant | " + " | ".join(f"{c} clients" for c in CLIENTS) + " |")
print("|---|" + "---:|" * len(CLIENTS))
for name, _, _ in VARIANTS:
    cells = []
    for c in CLIENTS:
        m = statistics.median(results[(name, c)])
        base = statistics.median(results[("no trigger", c)])
        cells.append(f"{m:,.0f} ({m / base:.2f})")
    print(f"| {name} | " + " | ".join(cells) + " |")

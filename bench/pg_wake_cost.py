# Bench part for PostgreSQL (issue 27), run by hand from the repository, against the
# PostgreSQL of .ci/services.sh (pgbench and psql on the PATH). What the wake-up on
# commit costs the publishers, taken apart, for each way of waking a relay below; the
# shipped schema in a scratch database, no relay running. Two measures:
#
#   python3 bench/pg_wake_cost.py [--secs 8] [--rounds 3] [--clients 1,8,32,64]
#       N concurrent pgbench clients, each transaction one business row and one
#       outbox row; the variants take turns, fresh tables each run; each figure is
#       the median tps of the rounds and its ratio to "no trigger". On a 2-core
#       machine a round's ratio moves by +-4 %: take many rounds.
#   python3 bench/pg_wake_cost.py --cpu [--commits 20000] [--rounds 3]
#       One session commits that transaction COMMITS times in a procedure
#       (synchronous_commit off: no WAL flush to wait for): the CPU each variant
#       adds to a commit, in microseconds, the least of the rounds. Steady to
#       about 1 us where the concurrent runs' noise is a tenth of a commit.
#
# `--only WORD,WORD`: the variants whose names start with one of the words.
# Variants marked "(held)" run while another session holds the type's lock, as the
# relay's listener does while commits come faster than its claims: every commit's
# try then fails and it skips its notification (the common case under load).
import argparse, os, statistics, subprocess, sys, tempfile, glob, time

ap = argparse.ArgumentParser()
ap.add_argument("--secs", type=int, default=8)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--clients", default="1,8,32,64")
ap.add_argument("--only", default=None)
ap.add_argument("--cpu", action="store_true")
ap.add_argument("--commits", type=int, default=20000)
args = ap.parse_args()
CLIENTS = [int(c) for c in args.clients.split(",")]
DB = "txbox_wake_cost"
PG = ["-h", "127.0.0.1", "-U", "postgres"]
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def psql(sql, db=DB):
    return subprocess.run(["psql", *PG, "-d", db, "-qAt", "-v", "ON_ERROR_STOP=1"],
                          input=sql, text=True, check=True, capture_output=True).stdout


def schema_file(n):
    return open(glob.glob(os.path.join(ROOT, "sql", "postgres", f"{n:03}_*.sql"))[0]).read()


def create_lines(text):
    return "\n".join(l for l in text.replace("{prefix}", "").splitlines()
                     if l.startswith(("CREATE OR REPLACE FUNCTION", "CREATE FUNCTION")))


INSERT = ("INSERT INTO outbox_events (id, event_type, payload) "
          "VALUES (gen_random_uuid(), 'orders', '{\"v\": 1}')")
OFF = "ALTER TABLE outbox_events DISABLE TRIGGER outbox_events_wake"
DEFERRED = "CREATE CONSTRAINT TRIGGER {n} AFTER INSERT ON outbox_events DEFERRABLE INITIALLY DEFERRED FOR EACH ROW {when} EXECUTE FUNCTION {n}()"
WHEN6 = "WHEN (NEW.status = 'PENDING' AND NEW.next_attempt_at <= now())"


def trigger(name, body, when=""):
    return (OFF + f"; CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ {body} $$; "
            + DEFERRED.format(n=name, when=when))


# schema 6's trigger as it shipped: the due check in a WHEN clause
SCHEMA_6 = (OFF + "; " + create_lines(schema_file(6)).replace("txbox_wake()", "wake6()", 1)
            + "; " + DEFERRED.format(n="wake6", when=WHEN6))
TRY = ("IF pg_try_advisory_xact_lock(hashtext(TG_TABLE_NAME), hashtext(NEW.event_type)) THEN"
       " PERFORM pg_notify(TG_TABLE_NAME, NEW.event_type); END IF;")
SHARED = "PERFORM pg_advisory_xact_lock_shared(hashtextextended(TG_TABLE_NAME || ' ' || NEW.event_type, 0));"
# (name, SQL run after the schema, the outbox statement, a session holds the type)
VARIANTS = [
    ("no trigger", OFF, INSERT, False),
    ("as shipped (schema 8) (held)", "", INSERT, True),
    ("as shipped (schema 8), nobody holds the type", "", INSERT, False),
    ("schema 6's trigger, the due check in WHEN (held)", SCHEMA_6, INSERT, True),
    ("the type quiet: fires, locks, sends nothing",
     "INSERT INTO outbox_quiet_types VALUES ('orders')", INSERT, False),
    ("a deferred row trigger that returns at once",
     trigger("nop", "BEGIN RETURN NULL; END"), INSERT, False),
    ("a deferred row trigger that returns at once, with schema 6's WHEN",
     trigger("nopw", "BEGIN RETURN NULL; END", WHEN6), INSERT, False),
    ("a deferred row trigger: shared lock, try-lock, notify (what no commit left behind needs) (held)",
     trigger("dst", "BEGIN " + SHARED + " " + TRY + " RETURN NULL; END"), INSERT, True),
    ("a deferred row trigger: the same two lock calls on keys of its own session (no two sessions share a lock)",
     trigger("dmine", "BEGIN PERFORM pg_advisory_xact_lock_shared(pg_backend_pid()::int8);"
             " IF pg_try_advisory_xact_lock(pg_backend_pid(), 0) THEN RETURN NULL; END IF; RETURN NULL; END"),
     INSERT, False),
    ("a deferred row trigger: try-lock, notify (held)",
     trigger("dtry", "BEGIN " + TRY + " RETURN NULL; END"), INSERT, True),
    ("an immediate row trigger: try-lock, notify (the issue's experiment)",
     OFF + "; CREATE FUNCTION try_notify() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN " + TRY
     + " RETURN NULL; END $$; CREATE TRIGGER try_notify AFTER INSERT ON outbox_events"
     " FOR EACH ROW EXECUTE FUNCTION try_notify()", INSERT, False),
    ("no trigger, the INSERT itself try-locks and notifies", OFF,
     "WITH e AS (" + INSERT + " RETURNING event_type) SELECT pg_notify('outbox_events', e.event_type)"
     " FROM e WHERE pg_try_advisory_xact_lock(hashtext('outbox_events'), hashtext(e.event_type))", False),
    ("schema 3 (every commit notifies)",
     OFF + "; CREATE FUNCTION every() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
     " PERFORM pg_notify(TG_TABLE_NAME, 'orders'); RETURN NULL; END $$;"
     " CREATE TRIGGER every AFTER INSERT ON outbox_events FOR EACH STATEMENT EXECUTE FUNCTION every()",
     INSERT, False),
]
if args.only:
    words = args.only.split(",")
    VARIANTS = [v for v in VARIANTS if v[0] == "no trigger" or any(v[0].startswith(w) for w in words)]


if args.cpu:
    # a procedure runs the INSERT itself; a statement with a data-modifying WITH cannot
    VARIANTS = [v for v in VARIANTS if v[2] == INSERT]


def fresh(setup):
    psql(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)", "postgres")
    psql(f"CREATE DATABASE {DB}", "postgres")
    files = sorted(glob.glob(os.path.join(ROOT, "sql", "postgres", "0*.sql")))
    psql("CREATE TABLE business (id bigserial PRIMARY KEY, v int NOT NULL);\n"
         + "\n".join(open(f).read().replace("{prefix}", "") for f in files))
    if setup:
        psql(setup + ";")
    psql("CHECKPOINT; VACUUM ANALYZE;")


class Holder:
    """Another session holds the type's lock, as the relay's listener does."""

    def __init__(self, held):
        self.held = held

    def __enter__(self):
        if self.held:
            self.p = subprocess.Popen(
                ["psql", *PG, "-d", DB, "-qAt", "-c",
                 "SELECT pg_advisory_lock(hashtext('outbox_events'), hashtext('orders')), pg_sleep(3600)"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.time() + 10
            while psql("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted").strip() == "0":
                if time.time() > deadline:
                    sys.exit("the holding session did not take the lock")
                time.sleep(0.05)

    def __exit__(self, *_):
        if self.held:
            self.p.kill()
            self.p.wait()


def tps(outbox, clients):
    script = f"\\set v random(1, 1000000)\nBEGIN;\nINSERT INTO business (v) VALUES (:v);\n{outbox};\nEND;\n"
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(script)
    try:
        out = subprocess.run(["pgbench", *PG, "-n", "-M", "prepared", "-c", str(clients),
                              "-j", str(min(clients, 2)), "-T", str(args.secs), "-f", f.name, DB],
                             text=True, check=True, capture_output=True).stdout
    finally:
        os.unlink(f.name)
    line = next(l for l in out.splitlines() if l.startswith("tps"))
    return float(line.split("=")[1].split()[0])


def cpu_per_commit(outbox):
    psql("CREATE PROCEDURE commits(n int) LANGUAGE plpgsql AS $$ BEGIN FOR i IN 1..n LOOP "
         f"INSERT INTO business (v) VALUES (i); {outbox}; COMMIT; END LOOP; END $$;")
    out = psql("SET synchronous_commit = off;\nSELECT extract(epoch FROM clock_timestamp());\n"
               f"CALL commits({args.commits});\nSELECT extract(epoch FROM clock_timestamp());\n").split()
    return (float(out[1]) - float(out[0])) / args.commits * 1e6


results = {}
points = [None] if args.cpu else CLIENTS
for r in range(args.rounds):
    for clients in points:
        # every other round backwards: none always goes first
        order = VARIANTS if r % 2 == 0 else list(reversed(VARIANTS))
        for name, setup, outbox, held in order:
            fresh(setup)
            with Holder(held):
                got = cpu_per_commit(outbox) if args.cpu else tps(outbox, clients)
            results.setdefault((name, clients), []).append(got)
            unit = "us a commit" if args.cpu else f"tps, {clients} clients"
            print(f"round {r + 1}, {name}: {got:.1f} {unit}", file=sys.stderr, flush=True)
psql(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)", "postgres")

if args.cpu:
    print(f"\none session, {args.commits} commits a round, {args.rounds} rounds, "
          "the least us per commit (added to no trigger)\n")
    print("| variant | us per commit | added |\n|---|---:|---:|")
    base = min(results[("no trigger", None)])
    for name, *_ in VARIANTS:
        m = min(results[(name, None)])
        print(f"| {name} | {m:.1f} | {m - base:+.1f} |")
else:
    print(f"\n{args.secs} s per run, {args.rounds} rounds, median tps (ratio to no trigger; "
          "the rounds' lowest-highest ratio)\n")
    print("| variant | " + " | ".join(f"{c} clients" for c in CLIENTS) + " |")
    print("|---|" + "---:|" * len(CLIENTS))
    for name, *_ in VARIANTS:
        cells = []
        for c in CLIENTS:
            got, base = results[(name, c)], results[("no trigger", c)]
            m = statistics.median(got)
            each = [g / b for g, b in zip(got, base)]
            cells.append(f"{m:,.0f} ({m / statistics.median(base):.2f}; {min(each):.2f}-{max(each):.2f})")
        print(f"| {name} | " + " | ".join(cells) + " |")

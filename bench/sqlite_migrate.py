# Bench part for SQLite (issue 30), run by hand: `python3 bench/sqlite_migrate.py
# [EVENTS]` from the repository (Python's own sqlite3, no server). Each upgrade
# to the current schema from every earlier version, over N events (a tenth
# unsent, 1,000 keys), the remaining files run in one transaction as `migrate`
# runs them on SQLite: SQLite has one writer, so every publish waits for the
# whole upgrade; the table says how long that is. (Python's SQLite, not the
# one rusqlite bundles: a measure of the statements, not of txbox's build.)
import glob, os, sqlite3, sys, tempfile, time

N = int(sys.argv[1]) if len(sys.argv) > 1 else 1000000
P = "bench_lite_"
here = os.path.dirname(os.path.abspath(__file__))
files = sorted(glob.glob(os.path.join(here, "..", "sql", "sqlite", "0*.sql")))
def sql(path, from_):
    text = open(path).read().replace("{prefix}", P)
    if from_ == 0 and path.endswith("001_schema.sql"):
        # txbox 0.1 had no version table
        text = text[: text.index("CREATE TABLE IF NOT EXISTS " + P + "txbox_schema_version")]
    return text
print("| database | upgrade | events | the upgrade (every publish waits) |")
print("|---|---|---:|---:|")
for from_ in range(0, len(files)):
    path = os.path.join(tempfile.mkdtemp(), "bench.db")
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("PRAGMA journal_mode = WAL")
    for f in files[: max(from_, 1)]:
        c.executescript(sql(f, from_))
    c.execute(
        f"WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {N}) "
        f"INSERT INTO {P}outbox_events (id, event_type, event_key, payload, status, "
        f"next_attempt_at, created_at, processed_at) "
        f"SELECT printf('%036d', n), 'bench', 'k' || (n % 1000), '{{}}', "
        f"CASE WHEN n % 10 = 0 THEN 'PENDING' ELSE 'PROCESSED' END, '2026-12-01T00:00:00Z', "
        f"'2026-12-01T00:00:00Z', CASE WHEN n % 10 = 0 THEN NULL ELSE '2026-12-01T00:00:00Z' END "
        f"FROM g"
    )
    rest = files[max(from_, 1) if from_ > 0 else 0 :]
    t = time.monotonic()
    # one transaction, as migrate's (executescript runs the files' triggers whole)
    c.executescript("BEGIN IMMEDIATE;" + "".join(sql(f, 5) for f in rest) + "COMMIT;")
    took = time.monotonic() - t
    name = "0.1" if from_ == 0 else f"schema {from_}"
    print(f"| SQLite {sqlite3.sqlite_version} | {name} -> {len(files)} | {N:,} | {took * 1000:,.0f} ms |", flush=True)
    c.close()

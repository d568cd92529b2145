# Bench part for MariaDB (issue 30), run by hand: `pip install pymysql; python3
# bench/mariadb_migrate.py [EVENTS]` from the repository, against the MariaDB of
# .ci/services.sh. Each upgrade to the current schema from every earlier version, over
# N events (a tenth unsent, 1,000 keys), the files' statements applied one by
# one, as `migrate` applies them on MySQL (without its named lock and lock
# timeouts, which do not change what they hold), while a publisher commits one
# event per transaction: the upgrade's time and the longest commit meanwhile.
import os, sys, time, threading, glob, pymysql
N = int(sys.argv[1]) if len(sys.argv) > 1 else 1000000
P = "bench_my_"
files = sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sql", "mysql", "0*.sql")))
def stmts(path, from_):
    out, cur = [], ""
    for line in open(path).read().replace("{prefix}", P).splitlines():
        code = line.split("--")[0]
        if not code.strip():
            continue
        cur += code + "\n"
        if code.rstrip().endswith(";"):
            out.append(cur.strip().rstrip(";")); cur = ""
    if path.endswith("001_schema.sql") and from_ < 5:
        out = [s.replace(" DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin", "") for s in out]
    return out
def conn():
    return pymysql.connect(host="127.0.0.1", user="root", database="test", autocommit=True)
c = conn(); cur = c.cursor()
cols = "(id, event_type, event_key, headers, payload, status, next_attempt_at, created_at, processed_at)"
for from_ in range(0, len(files)):
    for t in ["outbox_events", "outbox_dead_letters", "inbox_consumed", "job_locks", "txbox_schema_version"]:
        cur.execute(f"DROP TABLE IF EXISTS {P}{t}")
    for f in files[:max(from_, 1)]:
        for s in stmts(f, from_):
            if from_ == 0 and "txbox_schema_version" in s:
                continue
            cur.execute(s)
    cur.execute(f"INSERT INTO {P}outbox_events {cols} SELECT UNHEX(REPLACE(UUID(),'-','')), 'bench', "
                f"CONCAT('k', seq % 1000), '{{}}', '1', IF(seq % 10 = 0, 'PENDING', 'PROCESSED'), UTC_TIMESTAMP(6), "
                f"UTC_TIMESTAMP(6), IF(seq % 10 = 0, NULL, UTC_TIMESTAMP(6)) FROM seq_1_to_{N}")
    longest = [0.0]; stop = [False]
    def publish():
        pc = conn(); pcur = pc.cursor()
        while not stop[0]:
            t = time.monotonic()
            pcur.execute("START TRANSACTION")
            pcur.execute(f"INSERT INTO {P}outbox_events (id, event_type, event_key, headers, payload, next_attempt_at, created_at) "
                         "VALUES (UNHEX(REPLACE(UUID(),'-','')), 'bench', NULL, '{}', '1', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))")
            pcur.execute("COMMIT")
            longest[0] = max(longest[0], time.monotonic() - t)
    th = threading.Thread(target=publish); th.start()
    time.sleep(0.5); before = longest[0]; longest[0] = 0.0
    t = time.monotonic()
    for f in files[max(from_, 1) if from_ > 0 else 0:]:
        for s in stmts(f, 5):
            try:
                cur.execute(s)
            except pymysql.err.MySQLError as e:
                if e.args[0] not in (1061, 1060, 1062, 1091):
                    raise
    took = time.monotonic() - t
    time.sleep(0.2); stop[0] = True; th.join()
    name = "0.1" if from_ == 0 else f"schema {from_}"
    print(f"| MariaDB | {name} -> {len(files)} | {N:,} | {took*1000:,.0f} ms | {longest[0]*1000:,.0f} ms ({before*1000:.1f} ms) |", flush=True)

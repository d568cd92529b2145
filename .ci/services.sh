#!/usr/bin/env bash
# Installs (if missing) and starts the services the tests need, then waits until
# each answers. Safe to run again: running services are left alone.
set -euo pipefail

log() { echo "[services] $*"; }

# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

ensure_postgres() {
    if pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null &&
        psql -h 127.0.0.1 -U postgres -d test -c 'SELECT 1' >/dev/null 2>&1; then
        log "PostgreSQL is up"
        ensure_prepared_transactions
        return
    fi
    if ! command -v pg_ctlcluster >/dev/null 2>&1; then
        log "installing PostgreSQL"
        apt_install postgresql postgresql-client
    fi
    local ver
    ver=$(ls /etc/postgresql | sort -V | tail -1)
    local hba="/etc/postgresql/$ver/main/pg_hba.conf"
    if ! grep -q '^host all all 127.0.0.1/32 trust' "$hba"; then
        log "PostgreSQL: trust on loopback for the test user"
        sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\nlocal all all trust' "$hba"
    fi
    pg_ctlcluster --skip-systemctl-redirect "$ver" main start 2>/dev/null ||
        pg_ctlcluster --skip-systemctl-redirect "$ver" main reload 2>/dev/null || true
    wait_for PostgreSQL 60 pg_isready -h 127.0.0.1 -p 5432
    if ! psql -h 127.0.0.1 -U postgres -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'test'" | grep -q 1; then
        psql -h 127.0.0.1 -U postgres -d postgres -c 'CREATE DATABASE test' >/dev/null
    fi
    wait_for "PostgreSQL database test" 30 psql -h 127.0.0.1 -U postgres -d test -c 'SELECT 1'
    ensure_prepared_transactions
}

# two-phase commit (the wake-up test prepares a transaction): off by default,
# and the setting takes a restart
ensure_prepared_transactions() {
    local max
    max=$(psql -h 127.0.0.1 -U postgres -d test -tAc 'SHOW max_prepared_transactions')
    if [ "$max" != "0" ]; then
        return
    fi
    log "PostgreSQL: max_prepared_transactions = 16 (restart)"
    psql -h 127.0.0.1 -U postgres -d test -qc 'ALTER SYSTEM SET max_prepared_transactions = 16'
    local ver
    ver=$(ls /etc/postgresql | sort -V | tail -1)
    pg_ctlcluster --skip-systemctl-redirect "$ver" main restart
    wait_for "PostgreSQL after restart" 60 psql -h 127.0.0.1 -U postgres -d test -c 'SELECT 1'
}

rabbit_up() { (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null; }

# The largest message RabbitMQ takes, as operators lower it (its default is
# 128 MiB before 4.0): the tests of a message it refuses send one just over it.
RABBIT_MAX_MESSAGE=2097152

rabbit_limits() {
    local conf=/etc/rabbitmq/rabbitmq.conf
    if ! grep -q '^max_message_size' "$conf" 2>/dev/null; then
        echo "max_message_size = $RABBIT_MAX_MESSAGE" >>"$conf"
    fi
    # new channels read it: no restart needed
    rabbitmqctl -q eval "application:set_env(rabbit, max_message_size, $RABBIT_MAX_MESSAGE)." >/dev/null
}

ensure_rabbitmq() {
    if rabbit_up && rabbitmqctl -q status >/dev/null 2>&1; then
        log "RabbitMQ is up"
        rabbit_limits
        return
    fi
    if ! command -v rabbitmq-server >/dev/null 2>&1; then
        log "installing RabbitMQ"
        apt_install rabbitmq-server
    fi
    rabbitmq-server -detached >/dev/null 2>&1 || true
    wait_for "RabbitMQ node" 120 rabbitmqctl -q await_startup
    rabbitmqctl -q start_app >/dev/null 2>&1 || true
    wait_for "RabbitMQ port" 60 rabbit_up
    rabbit_limits
}

ensure_redis() {
    if redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; then
        log "Redis is up"
        return
    fi
    if ! command -v redis-server >/dev/null 2>&1; then
        log "installing Redis"
        apt_install redis-server
    fi
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no >/dev/null
    wait_for Redis 30 sh -c 'redis-cli -h 127.0.0.1 -p 6379 ping | grep -q PONG'
}

mariadb_up() { mysql -h 127.0.0.1 -P 3306 -u root -e 'SELECT 1' test >/dev/null 2>&1; }

ensure_mariadb() {
    if mariadb_up; then
        log "MariaDB is up"
        return
    fi
    if ! command -v mariadbd >/dev/null 2>&1 && [ ! -x /usr/sbin/mariadbd ]; then
        log "installing MariaDB"
        apt_install mariadb-server mariadb-client
    fi
    start_mariadb >/dev/null 2>&1 || true
    wait_for "MariaDB socket" 60 mysqladmin ping
    # root over TCP with no password, and the test database (a fresh install only
    # lets root in through the socket)
    mysql -u root -e "CREATE DATABASE IF NOT EXISTS test;
        CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY '';
        GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;
        ALTER USER 'root'@'localhost' IDENTIFIED VIA mysql_native_password USING PASSWORD('') OR unix_socket;
        FLUSH PRIVILEGES;" 2>/dev/null || true
    wait_for "MariaDB on 127.0.0.1:3306" 30 mariadb_up
}

# A second MariaDB whose server character set is latin1 (upstream MariaDB's
# default through 11.5), on 3308: the tests of tables that must be utf8mb4
# whatever the server's default.
ensure_mariadb_latin1() {
    mariadb_instance latin1 3308 --skip-ssl \
        --character-set-server=latin1 --collation-server=latin1_swedish_ci
    wait_for "MariaDB latin1 answers" 30 mysql -h 127.0.0.1 -P 3308 -u root -e 'CREATE DATABASE IF NOT EXISTS test'
}

ensure_kafka() {
    bash "$(dirname "$0")/kafka.sh" start
}

# the tests black-hole connections of their own with iptables, and publish
# from a process whose clock is off with faketime (libfaketime)
ensure_tools() {
    command -v iptables >/dev/null 2>&1 || {
        log "installing iptables"
        apt_install iptables
    }
    command -v faketime >/dev/null 2>&1 || {
        log "installing faketime"
        apt_install faketime
    }
}

# TLS on each of them (a test CA, certificates, listeners): after they are up
ensure_tls() {
    bash "$(dirname "$0")/tls.sh"
}

for s in ${@:-postgres mariadb rabbitmq kafka redis tls tools}; do
    case "$s" in
        postgres) ensure_postgres ;;
        rabbitmq) ensure_rabbitmq ;;
        kafka) ensure_kafka ;;
        redis) ensure_redis ;;
        mariadb) ensure_mariadb; ensure_mariadb_latin1 ;;
        tls) ensure_tls ;;
        tools) ensure_tools ;;
        *) log "unknown service $s"; exit 2 ;;
    esac
done

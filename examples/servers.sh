# shellcheck shell=bash
# Shared by examples/acl.sh and examples/tls.sh (sourced after `set -euo pipefail`): the ports, a
# temporary folder removed on exit with every server the example started, and two waits. Leaves
# the shell in that folder.
ns_port=${EXAMPLE_NAMESRV_PORT:-19876}
broker_port=${EXAMPLE_BROKER_PORT:-20911}
ns=127.0.0.1:$ns_port
dir=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
wait_for() {  # wait_for WHAT COMMAND...: retry COMMAND for up to 30 s
    local what=$1
    shift
    for _ in $(seq 150); do
        if "$@" > /dev/null 2>&1; then return 0; fi
        sleep 0.2
    done
    echo "FAILED: $what within 30 s" >&2
    tail -n 20 "$dir"/*.log >&2
    exit 1
}
registered() {  # the name server routes to the broker
    tidemq admin clusterList -n "$ns" | grep -q "127.0.0.1:$broker_port"
}
cd "$dir" || exit

#!/usr/bin/env bash
# ACL end to end: a broker started with examples/plain_acl.yml, an admin account creating a topic,
# an application account sending and consuming, and the refusals a client gets. Needs tidemq on
# PATH; run it from the repository root:
#
#   bash examples/acl.sh
#
# It starts `tidemq namesrv` and `tidemq broker` in a temporary folder (ports $EXAMPLE_NAMESRV_PORT
# and $EXAMPLE_BROKER_PORT, default 19876 and 20911, so a running `tidemq local` is not disturbed),
# then stops them and removes the folder.
set -euo pipefail

acl_file=$(cd "$(dirname "$0")" && pwd)/plain_acl.yml
# shellcheck source=examples/servers.sh
source "$(dirname "$0")/servers.sh"

tidemq namesrv --listen "$ns" > namesrv.log 2>&1 &
pids+=($!)
# the broker registers at start and then every 30 s: start it once the name server answers
wait_for "the name server did not answer" tidemq admin clusterList -n "$ns"
# --acl-file turns ACL on: every request to the broker must be signed by an account of the file.
tidemq broker --namesrv "$ns" --listen "127.0.0.1:$broker_port" --store store \
    --acl-file "$acl_file" > broker.log 2>&1 &
pids+=($!)
wait_for "the broker did not register" registered

# The CLI signs with TIDEMQ_ACCESS_KEY / TIDEMQ_SECRET_KEY (never flags: `ps` shows flags).
# Creating topics and groups needs an account with admin: true.
TIDEMQ_ACCESS_KEY=tidemq-admin TIDEMQ_SECRET_KEY=change-me-admin-secret \
    tidemq admin updateTopic -n "$ns" -c DefaultCluster -t orders -r 4 -w 4
TIDEMQ_ACCESS_KEY=tidemq-admin TIDEMQ_SECRET_KEY=change-me-admin-secret \
    tidemq admin updateSubGroup -n "$ns" -c DefaultCluster -g orders-app-group

# The application account: PUB|SUB on orders, SUB on its group (ClientConfig(access_key=...,
# secret_key=...) in Python).
export TIDEMQ_ACCESS_KEY=orders-app TIDEMQ_SECRET_KEY=change-me-orders-secret
tidemq send -n "$ns" -t orders -b 'hello with a signature'
tidemq consume -n "$ns" -t orders -g orders-app-group -c 1 --from-beginning

# Refused: an admin request from a non-admin account, and a wrong secret key. The client shows the
# broker's answer, as RocketMQ 4.9 words it: "AclException: ...".
refused() {
    local out
    if out=$("$@" 2>&1); then
        echo "FAILED: accepted: $*" >&2
        exit 1
    fi
    echo "refused: ${out##*$'\n'}"
}
refused tidemq admin updateTopic -n "$ns" -c DefaultCluster -t other -r 1 -w 1
TIDEMQ_SECRET_KEY=not-the-secret refused tidemq send -n "$ns" -t orders -b 'forged'

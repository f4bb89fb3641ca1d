#!/usr/bin/env bash
# TLS end to end: a name server and a broker that accept only TLS, the broker registering with the
# name server over TLS, and the CLI talking TLS to both. Needs openssl and tidemq on PATH.
#
#   bash examples/tls.sh
#
# It makes a throwaway CA and a certificate for localhost / 127.0.0.1 in a temporary folder, starts
# `tidemq namesrv` and `tidemq broker` there (ports $EXAMPLE_NAMESRV_PORT and $EXAMPLE_BROKER_PORT,
# default 19876 and 20911, so a running `tidemq local` is not disturbed), creates a topic, sends and
# consumes a message over TLS, shows that a plaintext client is turned away, then stops the servers
# and removes the folder.
set -euo pipefail

# shellcheck source=examples/servers.sh
source "$(dirname "$0")/servers.sh"

# 1. A CA, and a server certificate signed by it. Clients check the name they dial (here
#    127.0.0.1, the address the broker advertises): it must be in the certificate's
#    subjectAltName, or name it with --tls-server-name / TIDEMQ_TLS_SERVER_NAME.
openssl req -x509 -new -nodes -newkey rsa:2048 -days 2 -subj "/CN=TideMQ example CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -keyout ca.key -out ca.crt 2>/dev/null
openssl req -new -nodes -newkey rsa:2048 -subj "/CN=localhost" -keyout tls.key -out tls.csr 2>/dev/null
printf '%s\n' "subjectAltName=DNS:localhost,IP:127.0.0.1" "basicConstraints=critical,CA:FALSE" \
    "keyUsage=critical,digitalSignature,keyEncipherment" "extendedKeyUsage=serverAuth" \
    "authorityKeyIdentifier=keyid" > server.ext
openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
    -extfile server.ext -out tls.crt 2>/dev/null

# 2. The name server: TLS only on its port (permissive would serve plaintext clients as well).
tidemq namesrv --listen "$ns" --tls-mode enforcing --tls-cert-file tls.crt --tls-key-file tls.key \
    > namesrv.log 2>&1 &
pids+=($!)
# the broker registers at start and then every 30 s: start it once the name server answers
wait_for "the name server did not answer" env TIDEMQ_TLS=1 TIDEMQ_TLS_CA_FILE=ca.crt tidemq admin clusterList -n "$ns"

# 3. The broker: TLS only on its own port, and --namesrv-tls to register with the name server over
#    TLS, verifying it with --tls-ca-file.
tidemq broker --namesrv "$ns" --namesrv-tls --tls-ca-file ca.crt \
    --listen "127.0.0.1:$broker_port" --tls-mode enforcing --tls-cert-file tls.crt --tls-key-file tls.key \
    --store store > broker.log 2>&1 &
pids+=($!)

# 4. Clients: TIDEMQ_TLS=1 means TLS to the name servers *and* the brokers, both verified with
#    TIDEMQ_TLS_CA_FILE (else the system's CAs). In Python: ClientConfig(tls=True, tls_ca_file=...).
export TIDEMQ_TLS=1 TIDEMQ_TLS_CA_FILE="$dir/ca.crt"
wait_for "the broker did not register" registered
tidemq admin clusterList -n "$ns"
tidemq admin updateTopic -n "$ns" -c DefaultCluster -t tls-demo -r 1 -w 1
tidemq send -n "$ns" -t tls-demo -b 'hello over TLS'
tidemq consume -n "$ns" -t tls-demo -g tls-demo-group -c 1 --from-beginning

# 5. A plaintext client is turned away.
if TIDEMQ_TLS=0 tidemq admin clusterList -n "$ns" > /dev/null 2>&1; then
    echo "FAILED: a plaintext client was served by a TLS-only name server" >&2
    exit 1
fi
echo "a plaintext client was refused, as it should be"

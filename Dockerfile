# syntax=docker/dockerfile:1
# tradecore: one image for every process (API, worker host, migrations, admin commands).
#   docker build -t tradecore .
#   docker run --rm tradecore --version
# The command is a `tradecore` subcommand; the default serves the API on port 8080.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: a virtual environment with tradecore and the server extra, pinned by constraints
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/tradecore
COPY constraints.txt pyproject.toml README.md LICENSE ./
COPY src ./src
# a wheel install (not editable, bytecode compiled by pip): the runtime stage copies the
# venv alone, without /src
RUN /opt/tradecore/bin/pip install --constraint constraints.txt ".[server]"

# --- runtime: the slim base, the venv and an unprivileged user; no compiler, no pip cache
FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="tradecore" \
      org.opencontainers.image.description="Trading automation service: API, worker hosts, migrations" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 tradecore \
    && useradd --system --uid 10001 --gid tradecore --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin tradecore
COPY --from=build /opt/tradecore /opt/tradecore
ENV PATH=/opt/tradecore/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TRADECORE_ENV=production
# numeric, so an orchestrator can verify runAsNonRoot without reading /etc/passwd
USER 10001:10001
EXPOSE 8080
# Ready only when Postgres and Redis answer (GET /health/ready). For the API; compose.yaml
# gives worker hosts and the one-shot migration their own check.
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8080/health/ready', timeout=2).status != 200)"]
ENTRYPOINT ["tradecore"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080"]

# syntax=docker/dockerfile:1
# One image recipe, three targets:
#   docker build --target epp -t epp .
#   docker build --target bbr -t bbr .
#   docker build --target pd-sidecar -t pd-sidecar .   (the P/D routing sidecar, docs/pd.md)
# All run as the non-root user 65532 (the charts pin the same UID) on a read-only root
# filesystem; nothing is written outside /tmp.

ARG PYTHON_IMAGE=python:3.12-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/venv
# Only what the services import: no extras (the Envoy binary and the terminal UI are the
# `local` extra), and the simulator and benchmarks stay out of the image. The sidecar is
# small and reads the pool with the EPP's own datastore and sources.
COPY pyproject.toml README.md LICENSE ./
COPY shared shared
COPY modelserver modelserver
COPY bbr bbr
COPY epp epp
COPY sidecar sidecar
RUN /opt/venv/bin/pip install . \
 && /opt/venv/bin/pip install --no-deps --force-reinstall "$(/opt/venv/bin/python -m shared.otelproto)" \
 && /opt/venv/bin/python -m compileall -q /opt/venv

FROM ${PYTHON_IMAGE} AS runtime
COPY --from=build /opt/venv /opt/venv
# The commit the info gauges report (`--build-arg BUILD_COMMIT=$(git rev-parse HEAD)`).
ARG BUILD_COMMIT=""
ENV BUILD_COMMIT=${BUILD_COMMIT} \
    PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 65532:65532
WORKDIR /tmp

FROM runtime AS bbr
# ext_proc, gRPC health, Prometheus metrics
EXPOSE 9004 9005 9090
ENTRYPOINT ["bbr"]

FROM runtime AS epp
# ext_proc, gRPC health, Prometheus metrics
EXPOSE 9002 9003 9090
ENTRYPOINT ["epp"]

FROM runtime AS pd-sidecar
# the proxy in front of vLLM (the pool's target port), its Prometheus metrics
EXPOSE 8000 9090
ENTRYPOINT ["pd-sidecar"]

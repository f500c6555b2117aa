# syntax=docker/dockerfile:1
# Two images from one file:
#   docker build --target full -t triton-warmup .             init container: warm on GPUs
#   docker build --target sidecar -t triton-warmup-sidecar .  the sidecar: no torch, no triton
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04
ARG PYTHON_IMAGE=python:3.12-slim-bookworm

# ---- the package's sources, once for both images ----------------------------------------
FROM scratch AS source
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY deploy/install.sh deploy/requirements-sidecar.txt deploy/
COPY registry registry
COPY kernels kernels
COPY warmup warmup

# ---- sidecar: probes, metrics, bundle hot reload ---------------------------------------
FROM ${PYTHON_IMAGE} AS sidecar-build
WORKDIR /src
COPY --from=source /src ./
RUN deploy/install.sh sidecar /opt/venv

FROM ${PYTHON_IMAGE} AS sidecar
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="triton-warmup-sidecar" \
      org.opencontainers.image.description="Readiness, metrics and config-bundle hot reload for Triton inference pods" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://example.invalid/triton-warmup"
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin warmup
COPY --from=sidecar-build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
EXPOSE 9400
ENTRYPOINT ["triton-warmup"]
CMD ["serve"]

# ---- full: the init container that compiles and tunes on the pod's GPUs ----------------
FROM ${CUDA_IMAGE} AS python-base
# Triton builds its driver stubs (C extensions) with cc against Python.h on first launch:
# gcc, libc headers and the headers of this python3 are runtime dependencies.
# apt versions follow the CUDA image's Ubuntu release; exact pins break with each base tag.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev \
      gcc libc6-dev ca-certificates \
 && rm -rf /var/lib/apt/lists/*

FROM python-base AS full-build
ARG TORCH_SPEC=torch==2.11.0
WORKDIR /src
COPY --from=source /src ./
RUN TORCH_SPEC="${TORCH_SPEC}" deploy/install.sh full /opt/venv

FROM python-base AS full
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="triton-warmup" \
      org.opencontainers.image.description="Warms Triton kernels (compile, tune, verify) before an inference server starts" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://example.invalid/triton-warmup"
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin warmup
COPY --from=full-build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TRITON_WARMUP_DEVICE=cuda
USER 10001:10001
# An image without a compiler or Python headers fails here, not at its first kernel launch.
RUN triton-warmup doctor --only compiler
ENTRYPOINT ["triton-warmup"]
CMD ["run"]

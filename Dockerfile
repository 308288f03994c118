# syntax=docker/dockerfile:1
# gpugate: admission webhook server (`gpugate serve`); the same image runs `gpugate balance`,
# `gpugate certs` and `gpugate stack canary --watch` in the balancer, TLS and canary manifests (they
# override the command).
#
# Pinned base: a full Python patch release on Debian bookworm. Bump it deliberately (and pin a
# digest, python:3.11.14-slim-bookworm@sha256:..., where the registry is reachable).
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

# --- build: install the package and its runtime dependencies into a self-contained venv ----
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/gpugate
WORKDIR /src
# Only what the wheel needs (see .dockerignore): no tests, manifests, policies or data.
COPY pyproject.toml README.md ./
COPY webhook ./webhook
# The `stack` extra (kubernetes-validate), not the others: the replay's numpy/matplotlib and the test
# tools stay out of the image. The canary controller (`gpugate stack canary --watch`) validates every
# commit it makes as `gpugate stack` does, with kubernetes-validate and `kubectl kustomize`.
RUN /opt/gpugate/bin/pip install ".[stack]" \
 && /opt/gpugate/bin/pip uninstall --yes pip setuptools wheel \
 && find /opt/gpugate -name '__pycache__' -type d -prune -exec rm -rf {} +
# kubectl from the Kubernetes project's own image, at the minor the e2e control plane runs.
COPY --from=registry.k8s.io/kubectl:v1.37.2 /bin/kubectl /opt/gpugate/bin/kubectl

# --- runtime: the venv and an unprivileged user, nothing else -------------------------------
FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="gpugate" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
# UID/GID 10001 match runAsUser/runAsGroup in manifests/; no home, no login shell.
RUN groupadd --system --gid 10001 gpugate \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin gpugate
# git: the canary controller clones the GitOps repository and pushes its decisions there.
RUN apt-get update \
 && apt-get install --yes --no-install-recommends git ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/gpugate /opt/gpugate
ENV PATH=/opt/gpugate/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# The root filesystem is read-only in the cluster; /tmp is an emptyDir there.
WORKDIR /tmp
USER 10001:10001
EXPOSE 8443 9090
ENTRYPOINT ["gpugate", "serve"]
CMD ["--bind=0.0.0.0:8443"]

# The topology-agent image: init container and sidecar. Build: docker build -t <registry>/topology-agent:0.1.0 .
# BASE: an image laid out as the official Python one (Python 3.11 at /usr/local/bin, pip, groupadd and useradd);
# CI builds on one made from Debian's packages (scripts/image), as it reaches no container registry.
ARG BASE=python:3.11-slim
FROM ${BASE} AS build
WORKDIR /src
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY requirements.lock ./
RUN python -m pip install --prefix=/install --no-deps --require-hashes -r requirements.lock
COPY pyproject.toml README.md ./
COPY agent ./agent
# The package data agent/runtime links to (one source: manifests/webhook, manifests/trainer); the wheel carries
# the files themselves.
COPY manifests/webhook/mutatingwebhookconfiguration.yaml ./manifests/webhook/
COPY manifests/trainer ./manifests/trainer
RUN python -m pip install --prefix=/install --no-deps .

FROM ${BASE}
LABEL org.opencontainers.image.title="topology-agent" \
      org.opencontainers.image.description="Configures multi-pod training jobs: torch.env, hostfile, SSH, elastic sidecar"
COPY --from=build /install /usr/local
# The interpreter may be run, not read, by any user but root: the kernel starts a program its user cannot read
# non-dumpable, so no process of the agent's user (the trainer's, for a sidecar that signals) can open an agent
# process's /proc/<pid>/root or environ, not even before the agent marks itself (docs/security.md).
RUN groupadd --system --gid 65532 agent \
    && useradd --system --uid 65532 --gid agent --no-create-home --shell /usr/sbin/nologin agent \
    && chmod 0711 /usr/local/bin/python3.11
USER 65532:65532
ENTRYPOINT ["topology-agent"]
CMD ["init"]

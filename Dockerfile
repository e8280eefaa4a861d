# modelsec: `modelsec serve` (gRPC service), `modelsec webhook serve` (admission) and the CLI.
#
#   docker build --build-arg PYTHON_IMAGE="$(cat deploy/base-image.txt)" \
#     -t registry.internal/modelsec/modelsec:0.1.0 .
#   docker run --read-only --tmpfs /tmp -v snapshots:/var/run/modelsec -v cache:/var/cache/modelsec \
#     registry.internal/modelsec/modelsec:0.1.0 verify /models/m --policy /etc/modelsec/policy/policy.yaml
#
# The base image is pinned by digest in one file, deploy/base-image.txt (scripts/update_base_image.sh
# refreshes it); the build argument has no default, so an unpinned base is never used by accident. The
# install is one script, deploy/image/install.sh, which the tests also run in a fresh virtual environment:
# it installs exactly the files of requirements/image.txt (hash-pinned, scripts/lock_image.sh regenerates
# it; pip --require-hashes), then modelsec itself without dependencies.
ARG PYTHON_IMAGE

FROM ${PYTHON_IMAGE} AS build
COPY . /src
RUN sh /src/deploy/image/install.sh /src /opt/modelsec

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="modelsec" \
      org.opencontainers.image.description="Model supply-chain integrity: sign, verify, admit" \
      org.opencontainers.image.source="https://github.com/modelsec/modelsec"
COPY --from=build /opt/modelsec /opt/modelsec
# The only writable places at run time (mount volumes there; the root filesystem is read-only): the runtime
# guard's private snapshots of verified files, caches, and /tmp.
RUN install -d -o 65532 -g 65532 -m 0700 /var/run/modelsec /var/run/modelsec/snapshots /var/cache/modelsec
ENV PATH=/opt/modelsec/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    MODELSEC_SNAPSHOT_DIR=/var/run/modelsec/snapshots \
    XDG_CACHE_HOME=/var/cache/modelsec
VOLUME ["/var/run/modelsec", "/var/cache/modelsec", "/tmp"]
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["modelsec"]
CMD ["--help"]

# autonodes' container image: one statically linked binary on an empty base, run as a
# non-root user. No shell, no package manager, no libraries.
#
# `scripts/image.sh` builds it with Debian's buildah: it compiles the binary on the host and
# hands it in as the `build` stage (`--build-context build=...`), so the build stage below is
# skipped and nothing is pulled from a registry. `docker build .` (or `buildah build .`) with
# registry access runs the build stage itself.

ARG RUST_IMAGE=docker.io/library/rust:1.95-bookworm

FROM ${RUST_IMAGE} AS build
ARG REVISION=unknown
WORKDIR /src
COPY . .
# glibc linked statically (`crt-static`): name lookups (files, dns) are built into glibc
# 2.36, so the binary needs nothing from the image. AUTONODES_REVISION becomes the
# `revision` label of autonodes_build_info.
RUN AUTONODES_REVISION="${REVISION}" RUSTFLAGS="-C target-feature=+crt-static" \
      cargo build --release --locked -p autonodes --bin autonodes \
        --target x86_64-unknown-linux-gnu \
 && mkdir -p /out \
 && cp target/x86_64-unknown-linux-gnu/release/autonodes /out/autonodes \
 && strip /out/autonodes

FROM scratch
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="autonodes" \
      org.opencontainers.image.description="KubeVirt virtual machines as worker nodes for tenant clusters, picked by cost and scaled by node pools" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/autonodes/autonodes"
COPY --from=build /out/autonodes /autonodes
# The chart's securityContext runs it as this user too (runAsNonRoot).
USER 65532:65532
ENTRYPOINT ["/autonodes"]
CMD ["run"]

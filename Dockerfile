# sluice, CPU image.
#
#   docker build -t sluice .
#   docker run -v "$PWD/model-repository:/models" -p 8080:8080 -p 8081:8081 sluice
#
# The final image is built FROM scratch: the stripped sluice binary, the ONNX
# Runtime library from the pinned PyPI wheel (scripts/fetch-onnxruntime.sh:
# same version, same sha256), config/sluice.toml, and only the glibc /
# libstdc++ / libgcc_s files that `ldd` lists for those two. No shell, no
# package manager. It runs as uid 10001, serves /models, listens on 0.0.0.0
# (8080 HTTP, 8081 gRPC), and sluice is PID 1: SIGTERM turns readiness off,
# drains the accepted requests (shutdown.grace_period_seconds, 30 s by
# default) and exits 0. Give `docker stop -t` / Kubernetes'
# terminationGracePeriodSeconds at least that grace period.
#
# Targets:
#   (default) runtime  the small image above
#   debian             the same files on ${RUNTIME_IMAGE} (a shell for debugging):
#                      docker build --target debian -t sluice:debian .
#   build              the compiler stage (/src/target/release/sluice)
#
# Build arguments (base images; scripts/docker-test.sh passes locally made
# ones on machines without a registry):
#   BUILDER_IMAGE  a Debian bookworm image with Rust >= 1.92 and gcc; python3
#                  (>= 3.11) + pip for the wheel fetch are apt-get installed
#                  when it lacks them
#   RUNTIME_IMAGE  base of the `debian` target (glibc 2.36, as the builder's)
#
# Configuration inside the image: /sluice/config/sluice.toml, the repository's
# defaults (the working directory is /sluice, so sluice finds it as
# config/sluice.toml; mount a ConfigMap over /sluice/config, or pass --config
# FILE). ORT_DYLIB_PATH names the library (a runtime.onnxruntime_library key
# wins over it). SLUICE_MODEL_REPOSITORY__PATH=/models sets the repository:
# as an environment variable it also wins over a config file's
# model_repository.path, so change the repository with the variable or with
# `serve --model-repository DIR` (flags win over both).
# ORT_DISABLE_TELEMETRY=1: ONNX Runtime 1.31's Linux library carries
# Microsoft's OneDS telemetry client (mobile.events.data.microsoft.com);
# without the variable it starts it, and in this image logs two warnings
# (no CA bundle to upload with, no place to keep a device ID). A server
# should not phone home.
#
# Without BuildKit the classic builder also builds the `debian` stage (it
# builds every stage before the target); BuildKit skips it.

ARG BUILDER_IMAGE=rust:1.95-slim-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

# ---- toolchain: the builder image plus python3/pip/strip ----------------------
FROM ${BUILDER_IMAGE} AS toolchain
RUN set -eux; \
    if ! python3 -m pip --version >/dev/null 2>&1 || ! command -v strip >/dev/null 2>&1; then \
        apt-get update; \
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
            python3 python3-pip binutils ca-certificates; \
        rm -rf /var/lib/apt/lists/*; \
    fi
WORKDIR /src

# ---- onnxruntime: the pinned wheel, verified and unpacked by the project script
FROM toolchain AS onnxruntime
COPY scripts/fetch-onnxruntime.sh scripts/
RUN scripts/fetch-onnxruntime.sh && rm -rf .cache

# ---- build: sluice, release, locked --------------------------------------------
# (This stage and `toolchain` are the same text in Dockerfile and
# Dockerfile.cuda, so the two images share their cached layers.)
FROM toolchain AS build
# Dependencies (and build-dependencies) first, in a layer of their own that
# only Cargo.toml and Cargo.lock invalidate: a change under src/ or proto/
# does not recompile them. That build runs on empty stand-ins for every
# target the manifest declares (the library, binaries, [[bench]], [[test]],
# [[example]]) and for build.rs; the bench/test/example stand-ins stay, as
# the manifest must parse (nothing builds them).
COPY Cargo.toml Cargo.lock ./
RUN set -eux; \
    python3 -c 'import os, tomllib; m = tomllib.load(open("Cargo.toml", "rb")); \
dirs = {"bin": "src/bin", "bench": "benches", "test": "tests", "example": "examples"}; \
mains = ["src/main.rs", "build.rs"] + [t.get("path") or "%s/%s.rs" % (d, t["name"]) for k, d in dirs.items() for t in m.get(k, [])]; \
lib = m.get("lib", {}).get("path", "src/lib.rs"); \
[os.makedirs(os.path.dirname(p) or ".", exist_ok=True) or open(p, "w").write("" if p == lib else "fn main() {}\n") for p in mains + [lib]]; \
print("stand-ins:", " ".join(mains + [lib]))'; \
    cargo build --release --locked; \
    rm -rf src build.rs
COPY build.rs ./
COPY proto/ proto/
COPY src/ src/
# COPY keeps the files' old mtimes; touch them so cargo sees they are newer
# than the dummy build.
RUN set -eux; \
    find build.rs proto src -type f -exec touch {} +; \
    cargo build --release --locked; \
    strip --strip-all target/release/sluice; \
    target/release/sluice --version

# ---- rootfs: exactly the files of the final image ------------------------------
FROM build AS rootfs
COPY --from=onnxruntime /src/.ort/cpu/ /src/.ort/cpu/
COPY config/sluice.toml /src/config/sluice.toml
RUN set -eux; \
    R=/rootfs; \
    mkdir -p "$R/usr/local/bin" "$R/opt/onnxruntime/lib" "$R/sluice/config" "$R/models" "$R/etc" "$R/tmp"; \
    chmod 1777 "$R/tmp"; \
    cp target/release/sluice "$R/usr/local/bin/sluice"; \
    cp -P .ort/cpu/libonnxruntime.so .ort/cpu/libonnxruntime.so.1 .ort/cpu/libonnxruntime.so.1.31.1 \
          .ort/cpu/libonnxruntime_providers_shared.so "$R/opt/onnxruntime/lib/"; \
    cp config/sluice.toml "$R/sluice/config/sluice.toml"; \
    # The C/C++ runtime the binary and the library link (libc, libm, libstdc++,
    # libgcc_s, ld-linux, ...), at the paths ldd resolves them to.
    for f in $(ldd target/release/sluice .ort/cpu/libonnxruntime.so.1.31.1 .ort/cpu/libonnxruntime_providers_shared.so \
               | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | sort -u); do \
        cp -L --parents "$f" "$R/"; \
    done; \
    printf 'root:x:0:0:root:/root:/sbin/nologin\nsluice:x:10001:10001:sluice:/nonexistent:/sbin/nologin\n' > "$R/etc/passwd"; \
    printf 'root:x:0:\nsluice:x:10001:\n' > "$R/etc/group"; \
    printf 'passwd: files\ngroup: files\nhosts: files dns\n' > "$R/etc/nsswitch.conf"; \
    # The copied tree must run on its own: check with its own loader.
    chroot "$R" /usr/local/bin/sluice --version; \
    du -sh "$R"

# ---- debian: the same files on a Debian base, with a shell ----------------------
FROM ${RUNTIME_IMAGE} AS debian
COPY --from=rootfs /rootfs/usr/local/bin/sluice /usr/local/bin/sluice
COPY --from=rootfs /rootfs/opt/onnxruntime/ /opt/onnxruntime/
COPY --from=rootfs /rootfs/sluice/ /sluice/
RUN set -eux; \
    grep -q '^sluice:' /etc/passwd || echo 'sluice:x:10001:10001:sluice:/nonexistent:/usr/sbin/nologin' >> /etc/passwd; \
    grep -q '^sluice:' /etc/group || echo 'sluice:x:10001:' >> /etc/group; \
    mkdir -p /models
ENV ORT_DYLIB_PATH=/opt/onnxruntime/lib/libonnxruntime.so.1.31.1 \
    ORT_DISABLE_TELEMETRY=1 \
    SLUICE_MODEL_REPOSITORY__PATH=/models
WORKDIR /sluice
USER 10001:10001
EXPOSE 8080 8081
ENTRYPOINT ["/usr/local/bin/sluice"]
CMD ["serve"]

# ---- runtime (default): from scratch ---------------------------------------------
FROM scratch AS runtime
COPY --from=rootfs /rootfs/ /
ENV ORT_DYLIB_PATH=/opt/onnxruntime/lib/libonnxruntime.so.1.31.1 \
    ORT_DISABLE_TELEMETRY=1 \
    SLUICE_MODEL_REPOSITORY__PATH=/models
WORKDIR /sluice
USER 10001:10001
EXPOSE 8080 8081
LABEL org.opencontainers.image.title="sluice" \
      org.opencontainers.image.description="Multi-model ONNX inference server (CPU, ONNX Runtime 1.31.1)" \
      org.opencontainers.image.licenses="Apache-2.0"
ENTRYPOINT ["/usr/local/bin/sluice"]
CMD ["serve"]

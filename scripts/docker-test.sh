#!/usr/bin/env bash
# Build the sluice image and test it for real, on a machine with or without an
# image registry (`make docker-test`). Too slow for every CI run (a cold build
# compiles sluice in a container: minutes).
#
# Usage:
#   scripts/docker-test.sh            # CPU image (Dockerfile): build, run, check
#   scripts/docker-test.sh --cuda     # also build Dockerfile.cuda, check its
#                                     # libraries, and serve with it on the CPU
#   scripts/docker-test.sh --keep     # keep the containers, the temp folder and a
#                                     # dockerd this script started (prints how to stop it)
#   scripts/docker-test.sh --verbose  # print the whole `docker build` output
#
# What it does:
#   1. Docker engine: uses the running one. If none answers, it installs
#      docker.io with apt-get when dockerd is missing (as root), starts its own
#      dockerd in the background (pidfile and log in a temp folder), and on exit
#      stops only that dockerd, by its PID (and the containerd it spawned).
#   2. Base images (build arguments of the Dockerfiles): BUILDER_IMAGE
#      (default rust:1.95-slim-bookworm) and RUNTIME_IMAGE (debian:bookworm-slim)
#      are used when present or pullable. Otherwise it makes them, once (they
#      are reused by later runs):
#        sluice-base:bookworm  `debootstrap --variant=minbase bookworm` | docker import
#        sluice-rust:bookworm  that + gcc, python3-pip, binutils (apt-get, in
#                              docker build) + the host's Rust toolchain
#                              (rustc >= 1.92, copied), or rustup-init 1.95.0
#                              from static.rust-lang.org when the host has none.
#      Crates (crates.io), Debian packages and the PyPI wheels are fetched over
#      the network inside `docker build`; CA certificates the host added in
#      /usr/local/share/ca-certificates (a TLS-intercepting proxy) are added
#      to sluice-rust:bookworm so that pip and cargo trust them there too.
#   3. Builds the CPU image (and the `debian` debug target), starts it with a
#      temp copy of model-repository/ mounted at /models, the ports published
#      on 127.0.0.1, a read-only root filesystem and no capabilities (as
#      deploy/k8s runs it), and runs scripts/docker_checks.py from the host: readiness,
#      non-root, V1 predict and V2 infer on `digits` against
#      tests/fixtures/digits_expected.json, /metrics, a hot reload by editing the
#      mounted model-settings.json, and `docker stop` with requests in flight
#      (all answered, exit code 0). One PASS/FAIL line per check; image sizes at
#      the end. Exit status 0 only when every check passed.
#
# Environment: BUILDER_IMAGE, RUNTIME_IMAGE, SLUICE_IMAGE (tag to build, default
# sluice:docker-test), SLUICE_CUDA_IMAGE, DEBIAN_MIRROR, READY_TIMEOUT (s).
set -euo pipefail
shopt -s lastpipe  # `... | record` counts in this shell

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$(pwd -P)"

IMAGE="${SLUICE_IMAGE:-sluice:docker-test}"
CUDA_IMAGE="${SLUICE_CUDA_IMAGE:-sluice:docker-test-cuda}"
DEBUG_IMAGE="${IMAGE}-debian"
DEFAULT_BUILDER_IMAGE="rust:1.95-slim-bookworm"
DEFAULT_RUNTIME_IMAGE="debian:bookworm-slim"
BUILDER_IMAGE="${BUILDER_IMAGE:-$DEFAULT_BUILDER_IMAGE}"
RUNTIME_IMAGE="${RUNTIME_IMAGE:-$DEFAULT_RUNTIME_IMAGE}"
LOCAL_BASE="sluice-base:bookworm"
LOCAL_BUILDER="sluice-rust:bookworm"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
READY_TIMEOUT="${READY_TIMEOUT:-180}"
RUSTUP_TOOLCHAIN_VERSION="1.95.0"

cuda=0 keep=0 verbose=0
for arg in "$@"; do
  case "$arg" in
    --cuda) cuda=1 ;;
    --keep) keep=1 ;;
    --verbose) verbose=1 ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "docker-test: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

log() { printf '==> %s\n' "$*"; }
die() { printf 'docker-test: error: %s\n' "$*" >&2; exit 1; }

T0=$SECONDS
work="$(mktemp -d "${TMPDIR:-/tmp}/sluice-docker-test.XXXXXX")"
chmod 755 "$work"   # the container's uid 10001 reads the models below it
containers=()
dockerd_pid=""
containerd_pid=""
failures=0
passes=0

# ---- clean-up: our containers, our temp folder, our dockerd (by PID) -----------
stop_pid() { # pid name timeout_s
  local pid="$1" name="$2" t="$3" i
  kill -0 "$pid" 2>/dev/null || return 0
  log "stopping the $name this script started (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || return 0
  for ((i = 0; i < t * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  log "$name (pid $pid) did not stop in ${t} s: SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
}

cleanup() {
  local rc=$?
  set +e
  trap - EXIT INT TERM
  if (( keep )); then
    ((${#containers[@]})) && log "kept containers: ${containers[*]}"
    log "kept temp folder: $work"
    [[ -n "$dockerd_pid" ]] && log "kept the dockerd this script started: stop it with 'kill $dockerd_pid'"
    exit "$rc"
  fi
  local c
  for c in "${containers[@]}"; do docker rm -f "$c" >/dev/null 2>&1; done
  if [[ -n "$dockerd_pid" ]]; then
    stop_pid "$dockerd_pid" dockerd 60
    # dockerd stops the containerd it spawned; make sure, by that PID only.
    [[ -n "$containerd_pid" ]] && stop_pid "$containerd_pid" containerd 20
  fi
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

need_root() { [[ "$(id -u)" == 0 ]] || die "$1 needs root (run as root or with sudo)"; }

apt_install() { # packages...: without starting any service they ship
  need_root "installing $*"
  command -v apt-get >/dev/null || die "$* missing and no apt-get: install them yourself"
  local policy=/usr/sbin/policy-rc.d made_policy=0
  if [[ ! -e "$policy" ]]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod 755 "$policy"; made_policy=1
  fi
  log "apt-get install $*"
  local ok=0
  DEBIAN_FRONTEND=noninteractive apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null \
    || ok=1
  (( made_policy )) && rm -f "$policy"
  (( ok == 0 )) || die "apt-get install $* failed"
}

# ---- 1. a Docker engine ---------------------------------------------------------
engine_up() { docker info >/dev/null 2>&1; }

ensure_engine() {
  if command -v docker >/dev/null && engine_up; then
    log "using the running Docker engine ($(docker version -f '{{.Server.Version}}' 2>/dev/null))"
    return
  fi
  command -v dockerd >/dev/null && command -v docker >/dev/null || apt_install docker.io
  need_root "starting dockerd"
  if [[ -f /var/run/docker.pid ]] && kill -0 "$(cat /var/run/docker.pid)" 2>/dev/null; then
    die "a dockerd (pid $(cat /var/run/docker.pid)) runs but 'docker info' fails: fix that engine first"
  fi
  # The default socket: a DOCKER_HOST pointing elsewhere did not answer.
  export DOCKER_HOST="unix:///var/run/docker.sock"
  log "no Docker engine answers: starting dockerd (log: $work/dockerd.log)"
  setsid dockerd --pidfile "$work/dockerd.pid" > "$work/dockerd.log" 2>&1 < /dev/null &
  dockerd_pid=$!
  local i
  for ((i = 0; i < 120; i++)); do
    engine_up && break
    if ! kill -0 "$dockerd_pid" 2>/dev/null; then
      tail -n 30 "$work/dockerd.log" >&2
      dockerd_pid=""
      die "dockerd exited at start (its log is above)"
    fi
    sleep 0.5
  done
  engine_up || { tail -n 30 "$work/dockerd.log" >&2; die "dockerd did not answer within 60 s"; }
  # The containerd it spawned (a child of our dockerd; dockerd stops it too).
  local cpid pidfile=/var/run/docker/containerd/containerd.pid
  if [[ -f "$pidfile" ]]; then
    cpid="$(cat "$pidfile")"
    if [[ "$(ps -o ppid= -p "$cpid" 2>/dev/null | tr -d ' ')" == "$dockerd_pid" ]]; then
      containerd_pid="$cpid"
    fi
  fi
  log "dockerd $(docker version -f '{{.Server.Version}}') started (pid $dockerd_pid${containerd_pid:+, its containerd pid $containerd_pid})"
}

# Builds without BuildKit when the CLI has no buildx (a Debian docker.io
# client, or a bare static one), instead of failing on "buildx missing".
choose_builder() {
  if [[ -z "${DOCKER_BUILDKIT:-}" ]] && ! docker buildx version >/dev/null 2>&1; then
    export DOCKER_BUILDKIT=0
    log "no buildx plugin: the classic builder (DOCKER_BUILDKIT=0)"
  else
    log "builder: BuildKit (DOCKER_BUILDKIT=${DOCKER_BUILDKIT:-default})"
  fi
}

# ---- 2. base images ---------------------------------------------------------------
have_image() { docker image inspect "$1" >/dev/null 2>&1; }

try_pull() {
  log "pulling $1"
  timeout 300 docker pull -q "$1" >/dev/null 2>"$work/pull.err" && return 0
  log "cannot pull $1: $(head -c 300 "$work/pull.err")"
  return 1
}

make_base() {
  if have_image "$LOCAL_BASE"; then log "reusing $LOCAL_BASE"; return; fi
  command -v debootstrap >/dev/null || apt_install debootstrap
  need_root "debootstrap"
  local rootfs="$work/rootfs" t=$SECONDS
  log "making $LOCAL_BASE: debootstrap --variant=minbase bookworm ($DEBIAN_MIRROR)"
  debootstrap --variant=minbase bookworm "$rootfs" "$DEBIAN_MIRROR" > "$work/debootstrap.log" 2>&1 \
    || { tail -n 30 "$work/debootstrap.log" >&2; die "debootstrap failed (log above)"; }
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" --numeric-owner -c . \
    | docker import -c 'CMD ["/bin/bash"]' -m "debootstrap --variant=minbase bookworm" - "$LOCAL_BASE" >/dev/null
  rm -rf "$rootfs"
  log "made $LOCAL_BASE in $((SECONDS - t)) s"
}

# The host's Rust toolchain (rustc >= 1.92 with cargo), as a sysroot folder.
host_rust_sysroot() {
  command -v rustc >/dev/null || return 1
  local s
  s="$(rustc "+$RUSTUP_TOOLCHAIN_VERSION" --print sysroot 2>/dev/null || rustc --print sysroot 2>/dev/null)" || return 1
  [[ -x "$s/bin/rustc" && -x "$s/bin/cargo" ]] || return 1
  "$s/bin/rustc" --version | grep -Eq '^rustc 1\.(9[2-9]|[1-9][0-9][0-9])\.' || return 1
  echo "$s"
}

make_builder() {
  if have_image "$LOCAL_BUILDER"; then log "reusing $LOCAL_BUILDER"; return; fi
  make_base
  local ctx="$work/builder-context" t=$SECONDS sysroot d
  mkdir -p "$ctx/rust"
  {
    echo "FROM $LOCAL_BASE"
    echo 'RUN apt-get update \'
    echo ' && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \'
    echo '      gcc libc6-dev binutils python3 python3-pip ca-certificates \'
    echo ' && rm -rf /var/lib/apt/lists/*'
    echo 'ENV CARGO_HOME=/usr/local/cargo \'
    echo '    PATH=/usr/local/cargo/bin:/usr/local/rust/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
  } > "$ctx/Dockerfile"
  # Certificate authorities the host added (a TLS-intercepting egress proxy,
  # as on the machine this was written on): without them pip and cargo in
  # `docker build` cannot reach PyPI and crates.io.
  if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
    mkdir -p "$ctx/ca"
    cp /usr/local/share/ca-certificates/*.crt "$ctx/ca/"
    log "adding the host's extra CA certificates to $LOCAL_BUILDER: $(cd "$ctx/ca" && echo *.crt)"
    {
      echo 'COPY ca/ /usr/local/share/ca-certificates/'
      echo 'RUN update-ca-certificates'
      echo 'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \'
      echo '    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \'
      echo '    CARGO_HTTP_CAINFO=/etc/ssl/certs/ca-certificates.crt'
    } >> "$ctx/Dockerfile"
  fi
  if sysroot="$(host_rust_sysroot)"; then
    log "making $LOCAL_BUILDER: $LOCAL_BASE + gcc, python3-pip + the host's $("$sysroot/bin/rustc" --version) ($sysroot)"
    for d in bin lib libexec etc; do
      [[ -e "$sysroot/$d" ]] || continue
      cp -al "$sysroot/$d" "$ctx/rust/" 2>/dev/null || cp -a "$sysroot/$d" "$ctx/rust/"
    done
    echo 'COPY rust/ /usr/local/rust/' >> "$ctx/Dockerfile"
  else
    log "making $LOCAL_BUILDER: $LOCAL_BASE + gcc, python3-pip + Rust $RUSTUP_TOOLCHAIN_VERSION from rustup-init (no Rust >= 1.92 on the host)"
    cat >> "$ctx/Dockerfile" <<EOF
ENV RUSTUP_HOME=/usr/local/rustup
RUN set -eux; u=https://static.rust-lang.org/rustup/dist/x86_64-unknown-linux-gnu/rustup-init; \\
    python3 -c "import sys, urllib.request as r; r.urlretrieve(sys.argv[1], '/tmp/rustup-init'); r.urlretrieve(sys.argv[1] + '.sha256', '/tmp/rustup-init.sha256')" "\$u"; \\
    echo "\$(cut -d' ' -f1 /tmp/rustup-init.sha256)  /tmp/rustup-init" | sha256sum -c -; \\
    chmod +x /tmp/rustup-init; \\
    /tmp/rustup-init -y --no-modify-path --profile minimal --default-toolchain $RUSTUP_TOOLCHAIN_VERSION; \\
    rm /tmp/rustup-init /tmp/rustup-init.sha256
EOF
  fi
  echo 'RUN rustc --version && cargo --version && python3 -m pip --version && gcc --version | head -n 1' >> "$ctx/Dockerfile"
  run_build "$LOCAL_BUILDER" "$work/builder.log" "$ctx" -f "$ctx/Dockerfile"
  rm -rf "$ctx"
  log "made $LOCAL_BUILDER in $((SECONDS - t)) s"
}

resolve_base_images() {
  if [[ "$BUILDER_IMAGE" == "$DEFAULT_BUILDER_IMAGE" ]] && ! have_image "$BUILDER_IMAGE"; then
    if have_image "$LOCAL_BUILDER" || ! try_pull "$BUILDER_IMAGE"; then
      make_builder
      BUILDER_IMAGE="$LOCAL_BUILDER"
    fi
  elif ! have_image "$BUILDER_IMAGE"; then
    try_pull "$BUILDER_IMAGE" || die "BUILDER_IMAGE $BUILDER_IMAGE is neither present nor pullable"
  fi
  if [[ "$RUNTIME_IMAGE" == "$DEFAULT_RUNTIME_IMAGE" ]] && ! have_image "$RUNTIME_IMAGE"; then
    if have_image "$LOCAL_BASE" || ! try_pull "$RUNTIME_IMAGE"; then
      make_base
      RUNTIME_IMAGE="$LOCAL_BASE"
    fi
  elif ! have_image "$RUNTIME_IMAGE"; then
    try_pull "$RUNTIME_IMAGE" || die "RUNTIME_IMAGE $RUNTIME_IMAGE is neither present nor pullable"
  fi
  log "base images: BUILDER_IMAGE=$BUILDER_IMAGE RUNTIME_IMAGE=$RUNTIME_IMAGE"
}

# ---- 3. build and check -------------------------------------------------------------
# run_build TAG LOG CONTEXT [docker build args...]: the step lines on the
# console (everything with --verbose), the whole output in LOG.
run_build() {
  local tag="$1" logf="$2" ctx="$3"
  shift 3
  local t=$SECONDS
  local filter='^(Step [0-9]+/[0-9]+ : |#[0-9]+ \[|Successfully tagged|ERROR|error)'
  (( verbose )) && filter='.'
  set +e
  docker build "$@" -t "$tag" "$ctx" 2>&1 | tee "$logf" | { grep -E --line-buffered "$filter" | sed -u 's/^\(.\{160\}\).*/\1/'; true; }
  local rc=${PIPESTATUS[0]}
  set -e
  if (( rc != 0 )); then
    echo "---- last lines of the build output ($logf) ----"
    tail -n 40 "$logf"
    die "docker build of $tag failed"
  fi
  log "built $tag in $((SECONDS - t)) s"
}

build_args() {
  printf -- '--build-arg\nBUILDER_IMAGE=%s\n--build-arg\nRUNTIME_IMAGE=%s\n' "$BUILDER_IMAGE" "$RUNTIME_IMAGE"
}

record() { # the output of docker_checks.py, counted
  local line
  while IFS= read -r line; do
    echo "$line"
    case "$line" in
      PASS:*) passes=$((passes + 1)) ;;
      FAIL:*) failures=$((failures + 1)) ;;
    esac
  done
}

pass() { echo "PASS: $*"; passes=$((passes + 1)); }
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# start_container NAME IMAGE: publishes 8080/8081 on free host ports.
start_container() {
  local name="$1" image="$2" models="$3"
  docker rm -f "$name" >/dev/null 2>&1 || true
  containers+=("$name")
  # As deploy/k8s runs it: read-only root filesystem (a tmpfs /tmp), no
  # capabilities, no privilege escalation.
  docker run -d --name "$name" -v "$models:/models" \
    --read-only --tmpfs /tmp --cap-drop ALL --security-opt no-new-privileges \
    -p 127.0.0.1::8080 -p 127.0.0.1::8081 "$image" >/dev/null
  http_port="$(docker port "$name" 8080/tcp | head -n 1 | sed 's/.*://')"
  grpc_port="$(docker port "$name" 8081/tcp | head -n 1 | sed 's/.*://')"
  log "started $name from $image (--read-only --tmpfs /tmp --cap-drop ALL --security-opt no-new-privileges): HTTP 127.0.0.1:$http_port, gRPC 127.0.0.1:$grpc_port, $models -> /models"
}

fresh_models() { # a copy of model-repository/ that uid 10001 can read
  local dir="$work/$1"
  rm -rf "$dir"
  cp -a "$ROOT/model-repository" "$dir"
  chmod -R a+rX "$dir"
  echo "$dir"
}

show_logs() {
  echo "---- docker logs $1 (last ${2:-12} lines) ----"
  docker logs "$1" 2>&1 | tail -n "${2:-12}" | cut -c1-240
  echo "----"
}

command -v python3 >/dev/null || die "python3 is needed for the checks"
ensure_engine
choose_builder
resolve_base_images

mapfile -t BUILD_ARGS < <(build_args)
# The classic builder leaves the container of a failed step behind without this.
[[ "${DOCKER_BUILDKIT:-}" == 0 ]] && BUILD_ARGS+=(--force-rm)

# One snapshot of the working tree for every build: the images test the same
# sources even while someone edits src/ (.dockerignore still applies in it).
ctx="$work/context"
mkdir -p "$ctx"
tar -C "$ROOT" --exclude=./target --exclude=./.git --exclude='./.venv*' --exclude=./.cache \
  --exclude=./.ort --exclude=./model-repository --exclude=./tests -c . | tar -C "$ctx" -x

log "building $IMAGE (Dockerfile)"
t_build=$SECONDS
run_build "$IMAGE" "$work/build-cpu.log" "$ctx" -f "$ctx/Dockerfile" "${BUILD_ARGS[@]}"
cpu_build_s=$((SECONDS - t_build))
run_build "$DEBUG_IMAGE" "$work/build-debian.log" "$ctx" -f "$ctx/Dockerfile" --target debian "${BUILD_ARGS[@]}"

# -- the image itself
if out="$(docker run --rm "$IMAGE" --version 2>&1)"; then
  pass "docker run $IMAGE --version: $out"
else
  fail "docker run $IMAGE --version: $out"
fi
if out="$(docker run --rm --entrypoint /bin/sh "$DEBUG_IMAGE" -c 'id -u; /usr/local/bin/sluice --version' 2>&1)" \
   && [[ "$(head -n 1 <<<"$out")" == 10001 ]]; then
  pass "debug target (--target debian): a shell, uid $(head -n 1 <<<"$out"), $(tail -n 1 <<<"$out")"
else
  fail "debug target (--target debian): $out"
fi

# -- serve model-repository/ and check it from the host
models="$(fresh_models models)"
start_container "sluice-docker-test-$$" "$IMAGE" "$models"
set +e
python3 "$ROOT/scripts/docker_checks.py" --container "sluice-docker-test-$$" \
  --url "http://127.0.0.1:$http_port" --grpc-port "$grpc_port" --models "$models" \
  --expected "$ROOT/tests/fixtures/digits_expected.json" --ready-timeout "$READY_TIMEOUT" | record
checks_rc=${PIPESTATUS[0]}
set -e
(( checks_rc == 0 )) || (( failures > 0 )) || fail "docker_checks.py exited with $checks_rc"
show_logs "sluice-docker-test-$$" 14

# -- CUDA image
if (( cuda )); then
  log "building $CUDA_IMAGE (Dockerfile.cuda)"
  t_build=$SECONDS
  run_build "$CUDA_IMAGE" "$work/build-cuda.log" "$ctx" -f "$ctx/Dockerfile.cuda" "${BUILD_ARGS[@]}"
  cuda_build_s=$((SECONDS - t_build))
  # Every library the CUDA provider links resolves inside the image, but the
  # driver's libcuda.so.1 (the NVIDIA container toolkit mounts it); the ones
  # it dlopens are there too.
  out="$(docker run --rm --entrypoint /bin/sh "$CUDA_IMAGE" -c '
    ldd /opt/onnxruntime/lib/libonnxruntime_providers_cuda.so | grep "not found" | grep -v "libcuda\.so\.1" && exit 1
    for l in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcurand.so.10 libcufft.so.12 libcudnn.so.9 libnvrtc.so.13; do
      p=$(ldconfig -p | grep -m1 "^[[:space:]]*$l " | sed "s/.*=> //"); [ -n "$p" ] || { echo "missing $l"; exit 1; }
      printf "%s " "$p"
    done
    nf=$(ldd /opt/nvidia/lib/libcudnn*.so.9 /opt/nvidia/lib/libcufft.so.12 | grep "not found" | grep -v "libcuda\.so\.1" | sort -u)
    [ -z "$nf" ] || { echo "$nf"; exit 1; }
    exit 0' 2>&1)" && pass "CUDA image: the CUDA provider's libraries resolve (all but the driver's libcuda.so.1): $out" \
    || fail "CUDA image libraries: $out"
  cuda_models="$(fresh_models models-cuda)"
  start_container "sluice-docker-test-cuda-$$" "$CUDA_IMAGE" "$cuda_models"
  set +e
  python3 "$ROOT/scripts/docker_checks.py" --container "sluice-docker-test-cuda-$$" --basic \
    --url "http://127.0.0.1:$http_port" --grpc-port "$grpc_port" --models "$cuda_models" \
    --expected "$ROOT/tests/fixtures/digits_expected.json" --ready-timeout "$READY_TIMEOUT" | sed 's/^\(PASS\|FAIL\): /\1: CUDA image on the CPU: /' | record
  checks_rc=${PIPESTATUS[0]}
  set -e
  (( checks_rc == 0 )) || (( failures > 0 )) || fail "docker_checks.py (CUDA image) exited with $checks_rc"
  # Without a GPU the CUDA provider library loads up to the driver's
  # libcuda.so.1 and no further: every other library it needs is in the image.
  line="$(docker logs "sluice-docker-test-cuda-$$" 2>&1 | grep -m1 'model ready model=digits' || true)"
  echo "  .. ${line:0:200} ..."
  echo "  .. ... ${line: -200}"
  missing="$(grep -o '[A-Za-z0-9_.+-]*\.so[.0-9]*: cannot open shared object file' <<<"$line" | sort -u || true)"
  if grep -q 'provider=cpu' <<<"$line" && [[ "$missing" == "libcuda.so.1: cannot open shared object file" ]]; then
    pass "CUDA image without a GPU: falls back to the CPU provider, and the CUDA provider misses only the driver's libcuda.so.1"
  else
    fail "CUDA image without a GPU: unexpected provider log line (missing: ${missing:-none})"
  fi
fi

# -- sizes
echo
log "images"
docker image ls --format '{{.Repository}}:{{.Tag}}\t{{.Size}}' \
  | grep -E "^(${IMAGE%%:*}|$LOCAL_BASE|$LOCAL_BUILDER)" | sort || true
size_of() { docker image inspect -f '{{.Size}}' "$1" | awk '{ printf "%.1f MB (%.0f bytes)", $1 / 1e6, $1 }'; }
echo "CPU image $IMAGE: $(size_of "$IMAGE"), built in ${cpu_build_s} s"
(( cuda )) && echo "CUDA image $CUDA_IMAGE: $(size_of "$CUDA_IMAGE"), built in ${cuda_build_s} s"
echo "docker-test: $passes passed, $failures failed, $((SECONDS - T0)) s in all"
(( failures == 0 ))

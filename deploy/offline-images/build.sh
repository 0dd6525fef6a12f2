#!/usr/bin/env bash
# Build every image docker-compose.yml names, from Debian packages, for sites that cannot reach
# an image registry (`make images-offline`). Only the Debian archive and PyPI are contacted, and
# only from this machine: a build never needs a route out of its container.
#
#   deploy/offline-images/build.sh            # needs root, debootstrap and a Docker daemon
#
# Each image is tagged with the name the compose file (or the project's Dockerfile) uses and
# labelled with a hash of its inputs: an image whose label matches is kept, so a second run
# builds nothing. What each stand-in differs in is listed in docs/OPERATING.md.
#
# Last, the renderer's image (crawl-pipeline-renderer:local, compose's `render` profile) is built
# from the project's own Dockerfile with WITH_RENDERER=1. Its `apt-get install chromium` works
# without a route out because the python stand-in carries chromium and its dependencies as a
# local apt archive (/opt/debs, its only apt source); Docker's layer cache makes a second run cheap.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
suite=bookworm
cache=${OFFLINE_IMAGES_CACHE:-/var/cache/crawl-pipeline/offline-images}
base_tag=crawl-pipeline/debian-base:$suite
label=org.crawl-pipeline.inputs

# Image tag -> the Debian packages it installs. The tags must match docker-compose.yml and the
# Dockerfile's FROM; tests/unit/test_deploy_files.py checks that they do.
declare -A packages=(
  [python]="python3 python3-pip python-is-python3 ca-certificates"
  [rabbitmq]="rabbitmq-server"
  [redis]="redis-server redis-tools"
  [postgres]="postgresql-15 postgresql-client-15"
  [prometheus]="prometheus wget"
)
declare -A tags=(
  [python]="python:3.11-slim-bookworm"
  [rabbitmq]="rabbitmq:3.13-management"
  [redis]="redis:7.2"
  [postgres]="postgres:16"
  [prometheus]="prom/prometheus:v2.54.1"
)
order=(python rabbitmq redis postgres prometheus)
# Packages an image carries as a local apt archive, not installed: what a Dockerfile built FROM
# it may `apt-get install` with no route out (the project's Dockerfile, for the renderer).
declare -A archives=(
  [python]="chromium libatomic1"
)
renderer_tag=crawl-pipeline-renderer:local  # docker-compose.yml's renderer service

say() { echo "images-offline: $*"; }
die() { echo "images-offline: error: $*" >&2; exit 2; }

[ "$(id -u)" = 0 ] || die "run as root (debootstrap and chroot need it)"
command -v debootstrap >/dev/null || die "debootstrap is missing: apt-get install debootstrap"
docker version --format '{{.Server.Version}}' >/dev/null 2>&1 \
  || die "no Docker daemon answers at ${DOCKER_HOST:-the default socket}"

# The archive this machine's apt uses, so the images get the same package versions it would.
mirror=${DEBIAN_MIRROR:-$(
  { grep -hoE '^deb +(\[[^]]*\] +)?[a-z]+://[^ ]+' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
      | awk '{print $NF}'
    grep -hoE '^URIs: +[^ ]+' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}'
  } | grep -v security | head -n1
)}
[ -n "$mirror" ] || die "no Debian mirror found in /etc/apt; set DEBIAN_MIRROR"

# Inputs of one image: its folder, its package list, the suite and mirror; for python also the
# project's dependencies, which go into its wheelhouse.
inputs_hash() {
  local name=$1
  {
    echo "$suite $mirror ${packages[$name]} archive: ${archives[$name]:-}"
    (cd "$here" && find "$name" -type f -print0 | sort -z | xargs -0 sha256sum)
    if [ "$name" = python ]; then python_requirements; fi
  } | sha256sum | cut -c1-16
}

python_requirements() {
  python3 - "$repo/pyproject.toml" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    project = tomllib.load(f)
for spec in project["project"]["dependencies"]:
    print(spec)
# The image installs the dashboard's extra too (the Dockerfile's `pip install '.[dashboard]'`),
# and the renderer's image the render extra (Playwright).
for extra in ("dashboard", "render"):
    for spec in project["project"]["optional-dependencies"][extra]:
        print(spec)
for spec in project["build-system"]["requires"]:
    print(spec)
# The build backend's own wheel, and async-timeout, which redis-py needs on Python < 3.11.3
# (Debian bookworm has 3.11.2).
print("wheel")
print("async-timeout>=4.0.3")
PY
}

up_to_date() {  # tag, hash
  [ "$(docker image inspect --format "{{index .Config.Labels \"$label\"}}" "$1" 2>/dev/null)" = "$2" ]
}

declare -A wanted=()
for name in "${order[@]}"; do
  hash=$(inputs_hash "$name")
  if up_to_date "${tags[$name]}" "$hash"; then
    say "${tags[$name]} is up to date ($hash)"
  else
    wanted[$name]=$hash
  fi
done
build_renderer() {
  say "building $renderer_tag (the project's Dockerfile, WITH_RENDERER=1)"
  local log
  log=$(mktemp /var/tmp/crawl-renderer-build.XXXXXX)
  docker build --build-arg WITH_RENDERER=1 -t "$renderer_tag" "$repo" >"$log" 2>&1 \
    || { tail -n 30 "$log" >&2; die "building $renderer_tag failed (log above, $log)"; }
  docker run --rm --entrypoint chromium "$renderer_tag" --version >>"$log" 2>&1 \
    || { tail -n 5 "$log" >&2; die "$renderer_tag has no chromium that runs (log $log)"; }
  say "$renderer_tag: $(tail -n 1 "$log")"
  rm -f "$log"
}

if [ ${#wanted[@]} -eq 0 ]; then
  say "every stand-in is up to date"
  build_renderer
  exit 0
fi

mkdir -p "$cache"
work=$(mktemp -d /var/tmp/crawl-images.XXXXXX)
cleanup() {
  # A chroot with the host's /proc or /dev mounted must never be removed recursively.
  mountpoint -q "$work/chroot/proc" 2>/dev/null && umount "$work/chroot/proc"
  rm -rf "$work"
}
trap cleanup EXIT

# 1. A minimal Debian as the base of every image, kept between runs (keyed by suite and mirror).
rootfs_tar="$cache/rootfs-$suite-$(echo "$mirror" | sha256sum | cut -c1-12).tar"
if [ ! -s "$rootfs_tar" ]; then
  say "debootstrap $suite from $mirror (a few minutes)"
  debootstrap --variant=minbase "$suite" "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 \
    || { tail -n 20 "$work/debootstrap.log" >&2; die "debootstrap failed (log above)"; }
  rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/lib/apt/lists/"*
  tar -C "$work/rootfs" -cf "$rootfs_tar.partial" . && mv "$rootfs_tar.partial" "$rootfs_tar"
  rm -rf "$work/rootfs"
fi
if ! up_to_date "$base_tag" "$(sha256sum <"$rootfs_tar" | cut -c1-16)"; then
  docker import -c 'CMD ["bash"]' -c "LABEL $label=$(sha256sum <"$rootfs_tar" | cut -c1-16)" \
    "$rootfs_tar" "$base_tag" >/dev/null
fi

# 2. The .debs of each image, resolved against that base in a chroot that uses this machine's
#    network (a container of the private daemon has none).
mkdir -p "$work/chroot"
tar -C "$work/chroot" -xf "$rootfs_tar"
cp /etc/resolv.conf "$work/chroot/etc/resolv.conf"
echo "deb $mirror $suite main" >"$work/chroot/etc/apt/sources.list"
mount -t proc proc "$work/chroot/proc"
chroot "$work/chroot" apt-get -q update >"$work/apt.log" 2>&1 \
  || { tail -n 20 "$work/apt.log" >&2; die "apt-get update in the chroot failed (log above)"; }
for name in "${!wanted[@]}"; do
  mkdir -p "$work/chroot/debs/$name/partial"
  # shellcheck disable=SC2086  # the package list is meant to split into words
  chroot "$work/chroot" apt-get -q install -y --no-install-recommends --download-only \
    -o Dir::Cache::archives="/debs/$name" ${packages[$name]} >>"$work/apt.log" 2>&1 \
    || { tail -n 20 "$work/apt.log" >&2; die "downloading the packages of ${tags[$name]} failed"; }
  if [ -n "${archives[$name]:-}" ]; then
    # Resolved against the bare base, so the archive holds every dependency an image built
    # FROM this one could lack.
    mkdir -p "$work/chroot/archive/$name/partial"
    # shellcheck disable=SC2086
    chroot "$work/chroot" apt-get -q install -y --no-install-recommends --download-only \
      -o Dir::Cache::archives="/archive/$name" ${archives[$name]} >>"$work/apt.log" 2>&1 \
      || { tail -n 20 "$work/apt.log" >&2; die "downloading the archive of ${tags[$name]} failed"; }
  fi
done
if [ -d "$work/chroot/archive" ]; then
  # apt-ftparchive (apt-utils) writes the archives' indexes; installed in the chroot only, after
  # the downloads, so that nothing it brings is missing from them.
  chroot "$work/chroot" apt-get -q install -y --no-install-recommends apt-utils >>"$work/apt.log" 2>&1 \
    || { tail -n 20 "$work/apt.log" >&2; die "installing apt-utils in the chroot failed"; }
  for archive in "$work/chroot/archive/"*/; do
    name=$(basename "$archive")
    rm -rf "$archive/partial" "$archive/lock"
    chroot "$work/chroot" sh -c "cd /archive/$name && apt-ftparchive packages . > Packages" \
      || die "indexing the archive of ${tags[$name]} failed"
  done
fi

# 3. Build each image from a context of its folder plus its .debs (and, for python, wheels).
for name in "${order[@]}"; do
  [ -n "${wanted[$name]:-}" ] || continue
  context="$work/context-$name"
  cp -a "$here/$name" "$context"
  mkdir -p "$context/debs" "$context/archive"
  cp "$work/chroot/debs/$name/"*.deb "$context/debs/"
  if [ -n "${archives[$name]:-}" ]; then
    cp "$work/chroot/archive/$name/"*.deb "$work/chroot/archive/$name/Packages" "$context/archive/"
  fi
  if [ "$name" = python ]; then
    say "downloading the wheels of the project's dependencies"
    mkdir -p "$context/wheels"
    python_requirements >"$work/requirements.txt"
    python3 -m pip download --disable-pip-version-check --only-binary=:all: \
      --python-version 3.11 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
      -d "$context/wheels" -r "$work/requirements.txt" >"$work/pip.log" 2>&1 \
      || { tail -n 20 "$work/pip.log" >&2; die "downloading the wheels failed (log above)"; }
  fi
  say "building ${tags[$name]}"
  docker build --build-arg "BASE=$base_tag" --label "$label=${wanted[$name]}" \
    -t "${tags[$name]}" "$context" >"$work/build-$name.log" 2>&1 \
    || { tail -n 30 "$work/build-$name.log" >&2; die "building ${tags[$name]} failed (log above)"; }
done
build_renderer
docker image ls --format '{{.Repository}}:{{.Tag}}  {{.Size}}' \
  | grep -E "$(IFS='|'; echo "${tags[*]}|$renderer_tag")" || true
say "done"

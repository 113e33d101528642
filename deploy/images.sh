#!/usr/bin/env bash
# `make images`: every image the stack runs, built with nothing but the package registries.
#
#   memworker-base:bookworm, memworker-base:trixie   Debian made with debootstrap (minbase,
#        no docs, man pages or locales) and `docker import`, only when no image of that name
#        exists (set MEMWORKER_BASE_BOOKWORM / MEMWORKER_BASE_TRIXIE to debian:bookworm-slim /
#        debian:trixie-slim to use Docker Hub's instead: the Dockerfiles take BASE as an ARG)
#   memworker:local           deploy/Dockerfile: the app (run, consolidate, index, migrate,
#        serve), the int8 ONNX embedding model built inside
#   memworker-redis:local     deploy/redis/Dockerfile: Redis 8 from trixie (users.acl needs ≥ 7.2)
#   memworker-postgres:local  deploy/postgres/Dockerfile: PostgreSQL 17 and pgvector from trixie
#
# pip inside a container cannot verify the package registry's certificate on every machine, so
# the Python packages come from a wheelhouse (build/wheels) the host's pip fills first. Needs a
# Docker engine (DOCKER_HOST, or the default socket) and, for the base images, root and
# debootstrap. The names are overridable: MEMWORKER_IMAGE, MEMWORKER_REDIS_IMAGE,
# MEMWORKER_POSTGRES_IMAGE (the same variables docker-compose.yml reads).
set -euo pipefail
cd "$(dirname "$0")/.."
. deploy/dotenv.sh

PYTHON="${PYTHON:-python3}"
APP_IMAGE="${MEMWORKER_IMAGE:-memworker:local}"
REDIS_IMAGE="${MEMWORKER_REDIS_IMAGE:-memworker-redis:local}"
POSTGRES_IMAGE="${MEMWORKER_POSTGRES_IMAGE:-memworker-postgres:local}"
BASE_BOOKWORM="${MEMWORKER_BASE_BOOKWORM:-memworker-base:bookworm}"
BASE_TRIXIE="${MEMWORKER_BASE_TRIXIE:-memworker-base:trixie}"
BUILD_CACHE_IMAGE="${MEMWORKER_BUILD_CACHE_IMAGE:-memworker-build:cache}"
WHEELS=build/wheels

die() { echo "images.sh: $*" >&2; exit 1; }
step() { printf '== %s\n' "$*"; }

docker info > /dev/null 2>&1 \
    || die "no Docker engine answers${DOCKER_HOST:+ at $DOCKER_HOST} (start one, or run make stack-test, which starts its own)"

# The apt mirror this machine uses (deb822 sources, else sources.list), for debootstrap.
mirror() {
    local found
    found="$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2> /dev/null || true)"
    [ -n "$found" ] || found="$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list 2> /dev/null || true)"
    echo "${DEBIAN_MIRROR:-${found:-http://deb.debian.org/debian}}"
}

# A Debian base image from Debian's packages: debootstrap --variant=minbase, slimmed like the
# official -slim images (no docs, man pages or translations, apt caches emptied after each
# install, no service started by a package's postinst), then `docker import`.
base_image() {
    local suite="$1" name="$2"
    if docker image inspect "$name" > /dev/null 2>&1; then
        echo "$name: present"
        return 0
    fi
    [ "$(id -u)" -eq 0 ] || die "$name is missing and building it needs root (debootstrap)"
    command -v debootstrap > /dev/null || die "$name is missing and building it needs debootstrap (apt-get install debootstrap)"
    local root mirror_url
    root="$(mktemp -d /tmp/memworker-base-XXXXXX)"
    mirror_url="$(mirror)"
    echo "$name: debootstrap $suite from $mirror_url"
    debootstrap --variant=minbase "$suite" "$root" "$mirror_url" > "$root.log" 2>&1 \
        || { tail -20 "$root.log" >&2; rm -rf "$root" "$root.log"; die "debootstrap $suite failed"; }
    cat > "$root/etc/dpkg/dpkg.cfg.d/memworker-slim" << 'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
EOF
    cat > "$root/etc/apt/apt.conf.d/memworker-slim" << 'EOF'
APT::Install-Recommends "false";
APT::Install-Suggests "false";
Acquire::Languages "none";
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true"; };
EOF
    printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"
    chmod 755 "$root/usr/sbin/policy-rc.d"
    echo "deb $mirror_url $suite main" > "$root/etc/apt/sources.list"
    echo "deb $mirror_url $suite-updates main" >> "$root/etc/apt/sources.list"
    find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
    rm -rf "$root"/usr/share/{man,info,locale,lintian}/* "$root"/var/cache/apt/* \
        "$root"/var/lib/apt/lists/* "$root"/var/log/* "$root"/tmp/*
    tar -C "$root" -c . | docker import --change 'CMD ["bash"]' - "$name" > /dev/null
    rm -rf "$root" "$root.log"
}

step "base images"
base_image bookworm "$BASE_BOOKWORM"
base_image trixie "$BASE_TRIXIE"

step "wheelhouse ($WHEELS, the host's pip)"
mkdir -p "$WHEELS"
# the image runs Debian bookworm's Python 3.11: wheels of another Python would not install there
"$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
    || die "the wheelhouse is built with $PYTHON ($("$PYTHON" -V 2>&1)), and the image runs Python 3.11: set PYTHON to a Python 3.11 (PYTHON=python3.11 make images)"
# async-timeout by name: redis-py needs it below Python 3.11.3 (Debian bookworm has 3.11.2),
# a host on a later 3.11 does not resolve it. setuptools and wheel build the app inside.
# SOURCE_DATE_EPOCH: wheels built from sdists come out byte for byte the same in every checkout,
# so `COPY build/wheels` hits the engine's cache and a fresh clone rebuilds nothing.
SOURCE_DATE_EPOCH=315532800 "$PYTHON" -m pip wheel --quiet --disable-pip-version-check --find-links "$WHEELS" -w "$WHEELS" \
    ".[embeddings,access]" async-timeout "setuptools>=77" wheel 2>&1 \
    | { grep -v -e "is ignored: it is neither" -e "Running pip as the 'root' user" || true; } >&2
rm -f "$WHEELS"/memworker-*.whl  # the image builds the app from its sources

BUILT_BY=org.memworker.built-by=make-images

build() {
    local name="$1" context="$2" base="$3" dockerfile="${4:-$2/Dockerfile}" target="${5:-}"
    local started=$SECONDS
    local log="build/$(echo "$name" | tr '/:' '__').log"
    if ! DOCKER_BUILDKIT=0 docker build --network host ${target:+--target "$target"} --build-arg "BASE=$base" \
            --label "$BUILT_BY" \
            -f "$dockerfile" -t "$name" "$context" > "$log" 2>&1; then
        tail -30 "$log" >&2
        die "docker build of $name failed (whole log: $log)"
    fi
    echo "$name: built in $((SECONDS - started)) s"
}

step "images"
build "$REDIS_IMAGE" deploy/redis "$BASE_TRIXIE"
build "$POSTGRES_IMAGE" deploy/postgres "$BASE_TRIXIE"
# The app's build stage (torch, transformers, onnx: ~2 GB) is tagged, so the engine keeps it as
# the cache of the next build: a rebuild after a source change takes seconds, not minutes. Its
# previous version, and any other untagged image, is pruned: one build stage on disk, never more.
build "$BUILD_CACHE_IMAGE" . "$BASE_BOOKWORM" deploy/Dockerfile build
build "$APP_IMAGE" . "$BASE_BOOKWORM" deploy/Dockerfile
# only what these builds left untagged (their label): never another project's images
docker image prune --force --filter "dangling=true" --filter "label=$BUILT_BY" > /dev/null
docker image ls --format '{{.Repository}}:{{.Tag}}  {{.Size}}' \
    | grep -E "^($APP_IMAGE|$REDIS_IMAGE|$POSTGRES_IMAGE|$BASE_BOOKWORM|$BASE_TRIXIE|$BUILD_CACHE_IMAGE) " || true

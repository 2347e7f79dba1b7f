#!/usr/bin/env bash
# Installs the Debian packages ppserve builds, tests and benchmarks with. Idempotent: packages that
# are already present are left alone, and a second run only refreshes the package lists.
set -euo pipefail

packages=(
    build-essential cmake pkg-config git
    libgrpc-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler
    libconfig-dev libjansson-dev libpcre2-dev libcmocka-dev libopenblas-dev libmicrohttpd-dev
    python3 python3-numpy python3-pytest python3-regex python3-grpcio python3-protobuf
    iproute2 valgrind
)

if [ "$(id -u)" -ne 0 ]; then
    sudo=sudo
else
    sudo=
fi

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' \
        || missing+=("$p")
done

if [ "${#missing[@]}" -eq 0 ]; then
    echo "install-deps: all ${#packages[@]} packages present"
    exit 0
fi

echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
echo "install-deps: done"

#!/usr/bin/env bash
# Installs every Debian package and Python module the project, its tests and
# its benchmarks need. Idempotent and quick when everything is present.
set -euo pipefail

DEB_PKGS=(build-essential cmake pkg-config iproute2 ethtool procps psmisc
          iperf3 redis-server redis-tools nginx-light memcached libmemcached-tools
          curl wrk sockperf netcat-openbsd python3 valgrind postgresql
          openssh-server openssh-client libseccomp2
          moosefs-master moosefs-chunkserver moosefs-client moosefs-cli fuse3
          clang libclang-rt-14-dev llvm    # fuzzers (libFuzzer), symbolized reports
          libfabric1 libfabric-dev libfabric-bin)   # the ofi provider (between hosts)
PY_MODS=(pytest matplotlib)

missing=()
for p in "${DEB_PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "install-deps: installing ${missing[*]}"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    # Services must not start on their own: the tests start their own instances.
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod +x /usr/sbin/policy-rc.d
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    $SUDO rm -f /usr/sbin/policy-rc.d
fi

# Python's standard-library tests (tests/apps/test_pystdlib.py) for
# Debian's own interpreter, whichever version it is.
if [ -x /usr/bin/python3 ]; then
    v=$(/usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if ! dpkg-query -W -f='${Status}' "libpython$v-testsuite" 2>/dev/null | grep -q "install ok installed"; then
        echo "install-deps: installing libpython$v-testsuite"
        SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
        export DEBIAN_FRONTEND=noninteractive
        $SUDO apt-get install -y -qq --no-install-recommends "libpython$v-testsuite" >/dev/null ||
            { $SUDO apt-get update -qq &&
              $SUDO apt-get install -y -qq --no-install-recommends "libpython$v-testsuite" >/dev/null; }
    fi
fi

PY=${PYTHON:-python3}
for m in "${PY_MODS[@]}"; do
    "$PY" -c "import $m" 2>/dev/null && continue
    if [ "$(command -v "$PY")" = /usr/bin/python3 ]; then
        # Debian's own Python: its packages come from apt (pip is refused).
        SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "python3-$m" >/dev/null
    else
        "$PY" -m pip install -q "$m"
    fi
done
exit 0

#!/usr/bin/env bash
# The oldest Python vmdisktouch claims, 3.9 (RHEL 9's), for `make test`'s second tier:
# Debian 11's python3.9 beside Debian 12's 3.11 (a bullseye source pinned low, so
# nothing else comes from it), then .venv39 with the project and what its tests need.
# Debian 11's python3-distutils (which pip and uv need on 3.9) shares its package name
# with Debian 12's, so its files are unpacked into /usr/lib/python3.9 by hand.
# Idempotent. Needs root for apt; run after scripts/install-deps.sh (.venv's uv).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v python3.9 >/dev/null || ! python3.9 -c "import distutils.cmd" 2>/dev/null; then
  if [[ $(id -u) -ne 0 ]]; then
    echo "install-py39: python3.9 is missing; run as root or install it" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  cat > /etc/apt/sources.list.d/vmdisktouch-bullseye.sources <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bullseye
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  cat > /etc/apt/preferences.d/vmdisktouch-bullseye <<'PIN'
Package: *
Pin: release n=bullseye
Pin-Priority: 100
PIN
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends -t bullseye python3.9-minimal python3.9 >/dev/null
  tmp=$(mktemp -d)
  (cd "$tmp" && apt-get download -qq python3-distutils=3.9.2-1 2>/dev/null)
  dpkg-deb -x "$tmp"/python3-distutils_3.9.2-1_all.deb "$tmp/x"
  cp -r "$tmp/x/usr/lib/python3.9/distutils/." /usr/lib/python3.9/distutils/
  rm -rf "$tmp"
fi

# prometheus_client: the oldest version the metrics support, Debian 12's 0.16.0
# (python3-prometheus-client), so its tests run against it; .venv has the newest.
stamp=.venv39/.installed
if [[ ! -x .venv39/bin/python ]]; then
  python3.9 -m venv --without-pip .venv39
fi
if [[ ! -f $stamp || pyproject.toml -nt $stamp || scripts/install-py39.sh -nt $stamp ]]; then
  [[ -x .venv/bin/uv ]] || .venv/bin/pip install -q uv
  .venv/bin/uv pip install -q --python .venv39/bin/python -e . scipy pytest pytest-timeout \
    "prometheus_client==0.16.0" "qemu.qmp>=0.0.3"
  touch "$stamp"
fi

#!/usr/bin/env bash
# Install what the tests and the demo need on a fresh Debian 12 machine (as root),
# then create .venv and install the project with its test extras.
# Idempotent: packages already present are not reinstalled; the venv is reused.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  python3 python3-venv python3-dev
  qemu-system-x86 qemu-utils fio vmtouch util-linux stress-ng
  time  # /usr/bin/time -v: peak RSS in benchmarks/bench_scan.py
  python3-libnbd libnbd-bin
  python3-seccomp  # seccomp filters that emulate the unit's sandbox (tests/e2e/test_sandbox.py)
  systemd
  libxml2-utils  # xmllint, which virt-xml-validate runs (tests/e2e/test_unit.py)
  man-db  # man: systemd-analyze verify resolves Documentation=man:vmdisktouch(1)
  # libvirt: the daemons (the tests start libvirtd and virtlogd themselves, see
  # tests/support/libvirt_env.py; no default network, so no dnsmasq).
  libvirt-daemon-system libvirt-clients gcc
  # The libraries the package runs with, in Debian 12's versions (its Depends and
  # Recommends): the tests run these, not pip's newer ones, so what passes here is what
  # an operator's apt installs (numpy 1.24 refuses uint64 & int where numpy 2 does not).
  python3-numpy python3-pil python3-xxhash python3-libvirt python3-prometheus-client
  python3-scipy  # the tests' cross-checks (scipy.ndimage)
  bindfs fuse3  # two page caches over one image, one per "host" (tests/e2e/test_arrive_safely.py)
  python3-systemd  # the journal handler with fields (docs/logging.md); systemd-journald for its test
  prometheus-node-exporter  # its textfile collector, scraped for real (docs/metrics.md)
  # The Debian package: built (make deb), checked by lintian, installed into a clean
  # Debian 12 root made by mmdebstrap, and purged (tests/package, docs/packaging.md).
  debhelper dh-python pybuild-plugin-pyproject python3-all python3-setuptools
  lintian mmdebstrap piuparts fakeroot
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "install-deps: missing Debian packages (${missing[*]}); run as root or install them" >&2
    exit 1
  fi
  echo "install-deps: apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Debian's python3 (not a pyenv shim): python3-libnbd is built for it. The venv sees
# Debian's packages (--system-site-packages) and pip adds only the test tools and the
# project itself, without dependencies: no pip copy may shadow a Debian library.
PY=/usr/bin/python3
STAMP_KEY="debian-libraries-1"   # a venv made by an older rule is made anew
stamp=.venv/.installed
if [[ -x .venv/bin/python && "$(cat "$stamp" 2>/dev/null)" != "$STAMP_KEY" ]]; then
  echo "install-deps: making .venv anew (Debian's libraries, pip's test tools)"
  rm -rf .venv
fi
if [[ ! -x .venv/bin/python ]]; then
  "$PY" -m venv --system-site-packages .venv
fi
if [[ ! -f $stamp || pyproject.toml -nt $stamp ]]; then
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q --no-deps -e .
  # The test tools (pyproject's test extra without the libraries Debian provides);
  # uv: the 3.9 venv (scripts/install-py39.sh).
  .venv/bin/pip install -q argparse-manpage shtab pytest pytest-timeout qemu.qmp uv
  echo "$STAMP_KEY" > "$stamp"
fi

#!/usr/bin/env bash
# Build the Debian package from the tree git knows, then check it with lintian.
#
#   bash scripts/build-deb.sh OUTDIR
#
# The files git knows (tracked, and new ones not ignored; their current contents, not
# the last commit's) are copied to a temporary directory and built there with
# `dpkg-buildpackage -us -uc -b`, so nothing ignored (.venv, *.egg-info, build/) leaks
# into the package and a clean checkout builds the same. The .deb, .buildinfo and
# .changes, the build log (.build) and lintian's report (.lintian) go to OUTDIR
# (made if missing, relative to the current directory); nothing else is written in
# the tree. lintian runs on the .changes and fails the build on an error or a warning;
# its info and pedantic tags are shown (docs/packaging.md says which remain, and why).
# Exit: 0 built and clean, 1 failed (one line says where), 2 bad usage.
set -euo pipefail

die() { echo "build-deb: $*" >&2; exit 1; }

if [[ $# -ne 1 || -z $1 || $1 == -* ]]; then
  echo "usage: bash scripts/build-deb.sh OUTDIR" >&2
  exit 2
fi
if [[ -e $1 && ! -d $1 ]]; then die "$1 exists and is not a directory"; fi
mkdir -p -- "$1" || die "cannot create the output directory $1"
outdir=$(cd -- "$1" && pwd)

for tool in git dpkg-buildpackage dpkg-parsechangelog lintian; do
  command -v "$tool" >/dev/null || die "$tool is missing (scripts/install-deps.sh installs it)"
done

repo=$(cd -- "$(dirname -- "$0")/.." && pwd)
git -C "$repo" rev-parse --is-inside-work-tree >/dev/null 2>&1 \
  || die "$repo is not a git checkout: the package is built from the files git knows"

version=$(dpkg-parsechangelog -l "$repo/debian/changelog" -S Version) \
  || die "cannot read the version from debian/changelog"
base="vmdisktouch_${version}"

work=$(mktemp -d "${TMPDIR:-/tmp}/build-deb.XXXXXX")
trap 'rm -rf -- "$work"' EXIT
src="$work/vmdisktouch-$version"
mkdir "$src"

# Tracked and untracked-but-not-ignored files that exist now (a tracked file deleted in
# the work tree is left out), NUL-separated: some test data names hold backslashes.
git -C "$repo" ls-files -z --cached --others --exclude-standard \
  | (cd "$repo" && while IFS= read -r -d '' f; do
       if [[ -e $f || -L $f ]]; then printf '%s\0' "$f"; fi
     done) \
  | sort -zu \
  | tar -C "$repo" --null --no-recursion -T - -cf - \
  | tar -C "$src" -xf - \
  || die "cannot copy the tree git knows into $src"
[[ -f $src/debian/rules ]] || die "debian/rules is not in the tree git knows (git add debian/?)"

# Debian's own tools only: a pyenv shim or a venv first on PATH would otherwise be the
# python3.11 that pybuild runs (without Debian's build module), and its site-packages
# could leak into the build. HOME is empty, so no per-user pip or git settings apply.
mkdir "$work/home"
clean_env=(env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME="$work/home" LC_ALL=C.UTF-8
           TMPDIR="$work" DEB_BUILD_OPTIONS="${DEB_BUILD_OPTIONS-}")

log="$outdir/${base}_all.build"
if ! (cd "$src" && "${clean_env[@]}" dpkg-buildpackage -us -uc -b) >"$log" 2>&1; then
  unmet=$(grep -m1 -o 'Unmet build dependencies: .*' "$log" || true)
  die "dpkg-buildpackage failed${unmet:+ (${unmet}; scripts/install-deps.sh installs them)}; its log: $log"
fi

shopt -s nullglob
built=("$work/${base}_all.deb" "$work/${base}"_*.buildinfo "$work/${base}"_*.changes)
shopt -u nullglob
[[ -f $work/${base}_all.deb ]] || die "dpkg-buildpackage made no ${base}_all.deb; its log: $log"
changes=("$work/${base}"_*.changes)
[[ -f ${changes[0]} ]] || die "dpkg-buildpackage made no .changes; its log: $log"
cp -- "${built[@]}" "$outdir/"

report="$outdir/${base}_all.lintian"
status=0
"${clean_env[@]}" lintian --fail-on error,warning --display-info --pedantic \
  "$outdir/$(basename -- "${changes[0]}")" >"$report" 2>&1 || status=$?
cat -- "$report"
((status == 0)) || die "lintian reports errors or warnings (above; also in $report)"
echo "build-deb: $outdir/${base}_all.deb"

"""The Debian package as an operator installs it: built by scripts/build-deb.sh (lintian
clean), installed with apt into a clean Debian 12 root, run there, purged (docs/packaging.md)."""

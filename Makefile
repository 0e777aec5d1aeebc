# The two set-up commands (see README): `make demo` and `make test`.
# Both install what they need on a fresh Debian 12 machine (as root).

VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: deps deps39 test test-unit test-system test-e2e test-package test-vm test39 demo deb bench clean

deps:
	@bash scripts/install-deps.sh

# The tiers (docs/architecture.md#tests), each on its own and all of them by `make test`;
# each prints its own time.
TIERS := test-unit test-system test-e2e test-package test-vm

test: deps deps39
	@for t in $(TIERS) test39; do $(MAKE) --no-print-directory $$t || exit $$?; done

test-unit: deps
	$(call timed,unit,$(PY) -m pytest $(PYTEST_ARGS) tests/unit)

test-system: deps
	$(call timed,system,$(PY) -m pytest $(PYTEST_ARGS) tests/system)

test-e2e: deps
	$(call timed,e2e,$(PY) -m pytest $(PYTEST_ARGS) tests/e2e)

test-package: deps
	$(call timed,package,$(PY) -m pytest $(PYTEST_ARGS) tests/package)

# A Debian 12 booted under QEMU (KVM, or TCG where nested KVM runs no guest code) with the
# package under its own systemd: the operator's path (tests/vm, docs/unit.md). The
# guest's image is cached in /var/cache/vmdisktouch-tests/vm, keyed by its package list.
test-vm: deps
	$(call timed,vm,$(PY) -m pytest $(PYTEST_ARGS) tests/vm)

# $(call timed,NAME,COMMAND): the command, then the tier's wall time on one line.
timed = @s=$$(date +%s); $(2); rc=$$?; echo "tier $(1): $$(( $$(date +%s) - s )) s (exit $$rc)"; exit $$rc

deps39: deps
	@bash scripts/install-py39.sh

# The oldest Python claimed (3.9): the pure code, the OS layer and the commands that
# need neither libvirt-python nor QEMU (those run under the main venv above). Not the
# checks of the repository's own files and tools (marker `repo`): the interpreter cannot
# change them.
test39: deps39
	$(call timed,python3.9,.venv39/bin/python -m pytest -p no:cacheprovider -m "not repo" \
	  --ignore tests/unit/test_libvirt_memo.py \
	  tests/unit tests/system \
	  tests/e2e/test_snapshot_cli.py tests/e2e/test_status_cmd.py tests/e2e/test_metrics.py \
	  tests/e2e/test_node_exporter.py tests/e2e/test_run_notify.py)

demo: deps
	$(PY) -m tools.demo

# The Debian package, from the tree git knows (tracked and new files, not ignored), into dist/
# (docs/packaging.md).
deb: deps
	bash scripts/build-deb.sh dist

clean:
	rm -rf $(VENV) .venv39 demo-out *.egg-info build dist

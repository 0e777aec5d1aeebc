# The two set-up commands (see README): `make demo` and `make test`.
# Both install what they need on a fresh Debian 12 machine (as root).

VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: deps deps39 test test39 demo deb bench clean

deps:
	@bash scripts/install-deps.sh

test: deps deps39
	$(PY) -m pytest $(PYTEST_ARGS)
	$(MAKE) test39

deps39: deps
	@bash scripts/install-py39.sh

# The oldest Python claimed (3.9): the pure code, the OS layer and the commands that
# need neither libvirt-python nor QEMU (those run under the main venv above). The man
# page is generated with the main venv's argparse (3.9's words its headings otherwise).
test39: deps39
	.venv39/bin/python -m pytest -p no:cacheprovider \
	  --deselect tests/unit/test_cli_docs.py::test_both_are_generated_from_the_current_parser \
	  --ignore tests/unit/test_libvirt_memo.py \
	  tests/unit tests/system \
	  tests/e2e/test_snapshot_cli.py tests/e2e/test_status_cmd.py tests/e2e/test_metrics.py \
	  tests/e2e/test_node_exporter.py tests/e2e/test_run_notify.py

demo: deps
	$(PY) -m tools.demo

# The Debian package, from the tree git knows (tracked and new files, not ignored), into dist/
# (docs/packaging.md).
deb: deps
	bash scripts/build-deb.sh dist

clean:
	rm -rf $(VENV) .venv39 demo-out *.egg-info build dist

# The two set-up commands (see README): `make demo` and `make test`.
# Both install what they need on a fresh Debian 12 machine (as root).

VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: deps test demo bench clean

deps:
	@bash scripts/install-deps.sh

test: deps
	$(PY) -m pytest $(PYTEST_ARGS)

demo: deps
	$(PY) -m tools.demo

clean:
	rm -rf $(VENV) demo-out *.egg-info build

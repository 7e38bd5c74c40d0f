# GpuGeek: `make run` serves the console with demo data; `make test` runs the suite.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
VENDOR := static/vendor

.PHONY: setup host-sandbox run test lint bench clean

setup: $(VENV)/.installed $(VENDOR)/.installed host-sandbox

# bubblewrap and slirp4netns for host jobs' sandbox (installed where missing, as root).
host-sandbox:
	@bash deploy/host-sandbox-setup.sh

$(VENV)/.installed: requirements.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.lock
	touch $@

# htmx and plotly.js from npm (package-lock.json). Plotly's basic bundle (scatter, bar, pie:
# every trace type our figures use) at the version the plotly wheel ships: 1.2 MB, not 4.8 MB.
# axe-core (a devDependency) is for the browser tests only: they read it from node_modules/,
# which `npm ci` fills, so it gets no copy in static/ and is never served to users.
$(VENDOR)/.installed: package-lock.json $(VENV)/.installed
	npm ci --no-audit --no-fund --loglevel=error
	mkdir -p $(VENDOR)
	cp node_modules/htmx.org/dist/htmx.min.js $(VENDOR)/htmx.min.js
	cp node_modules/plotly.js-basic-dist-min/plotly-basic.min.js $(VENDOR)/plotly.min.js
	test -f node_modules/axe-core/axe.min.js
	touch $@

# exec: make does not forward SIGTERM, so the launcher must replace it.
run: setup
	exec $(PY) manage.py runconsole

# One pytest-xdist worker per core, each with its own database, data dir, queue and cache
# prefix (tests/plugin.py). `--dist load` hands each worker tests in collection order, so
# pytest-django's order holds on each: transactional tests (which empty the tables) last.
TEST_WORKERS ?= $(shell nproc 2>/dev/null || echo 2)
test: setup
	$(PY) -m pytest -n $(TEST_WORKERS) --dist load $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# Every benchmark on PostgreSQL + Redis, then one table (SIZE=smoke: a few minutes).
bench: setup
	GPUGEEK_BENCH_SIZE=$(or $(SIZE),full) $(PY) -m tests.bench.run

clean:
	rm -rf $(VENV) node_modules $(VENDOR)

# Quick start: `make demo` and `make test` each set up .venv by themselves.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint redis clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# The pinned torch is the CPU build here; an unpinned spec would pull GBs of CUDA packages.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,redis]'
	touch $@

# The redis lock tests need a real redis-server; install it where we may (CI runs as root).
redis:
	@command -v redis-server >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server) >/dev/null \
	      || echo "redis-server could not be installed: the redis lock tests will be skipped"; \
	  else echo "redis-server missing and not root: the redis lock tests will be skipped"; fi; }

demo: $(STAMP)
	$(PY) -m warmup.demo

test: $(STAMP) redis
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy registry warmup kernels

clean:
	rm -rf $(VENV) demo-volume demo-work

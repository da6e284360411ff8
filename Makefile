# The two commands of the README: `make run` and `make test`. Everything a test needs is
# installed here, into .venv, so a fresh clone with Python 3.11 and Java 17 is enough; the admin
# page's browser test needs Debian's chromium and chromium-driver, installed by `browser` when missing.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 22133
DATA_DIR ?= ./data

.PHONY: run test bench install clean memcached-tools thrift-compiler browser

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)

$(STAMP): $(BIN)/python setup.cfg pyproject.toml
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,spark,load,plot]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	mkdir -p $(DATA_DIR)
	$(BIN)/kestrel-actors serve --host $(HOST) --port $(PORT) --data-dir $(DATA_DIR)

# libmemcached's memcstat/memcping, which the client tests run against the server: Debian's
# libmemcached-tools, installed only when memcstat is missing (apt-get, through sudo unless root).
memcached-tools:
	@command -v memcstat >/dev/null 2>&1 || { \
		echo "installing libmemcached-tools (memcstat, memcping)"; \
		sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$sudo apt-get update -qq >/dev/null && \
		DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq libmemcached-tools >/dev/null; }

# Apache Thrift's compiler, which a test runs to generate an independent client from
# kestrel.thrift: Debian's thrift-compiler, installed only when `thrift` is missing.
thrift-compiler:
	@command -v thrift >/dev/null 2>&1 || { \
		echo "installing thrift-compiler"; \
		sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$sudo apt-get update -qq >/dev/null && \
		DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq thrift-compiler >/dev/null; }

browser:
	@if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then \
		sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$sudo apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -q chromium chromium-driver; \
	fi

test: $(STAMP) memcached-tools thrift-compiler browser
	$(BIN)/python -m pytest -q -rfE

bench: $(STAMP)
	PEER=$(PEER) $(BIN)/python -m kestrel_actors.loadtests.bench --write docs/benchmarks.md

clean:
	rm -rf $(VENV) build *.egg-info

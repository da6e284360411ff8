# The two commands of the README: `make run` and `make test`. `make run` installs only what serving
# needs (`pip install -e '.[build]'`: the server, the client, the CLI and mypyc to compile them) and
# the compiled build; `make test` installs every extra (spark, load, test) and the Debian packages
# the tests drive (chromium and chromium-driver, thrift-compiler, libmemcached-tools, netcat-openbsd,
# systemd, redis-server, valgrind) when they are
# missing, so a fresh clone with Python 3.11 and Java 17 is enough.
# The interpreter of .venv (ADR 0017): the distribution's CPython 3.11 when it can make a venv and
# has its headers (mypyc compiles against them), else python3.11 on PATH. Debian builds its own
# with PGO and LTO and links libpython into the executable: the request path cost 8-34% less CPU
# in process on it than on a default source build such as pyenv's (which python3.11 on PATH may
# be); under load, where half of a request's CPU is the kernel's, the difference is smaller.
# PYTHON=... picks another; an existing .venv keeps its own (`make clean` to change).
SYSTEM_PYTHON := /usr/bin/python3.11
ifeq ($(origin PYTHON),undefined)
PYTHON := $(shell $(SYSTEM_PYTHON) -c 'import ensurepip, os, sys, sysconfig; \
	sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
	>/dev/null 2>&1 && echo $(SYSTEM_PYTHON) || echo python3.11)
endif
VENV := .venv
BIN := $(VENV)/bin
SERVE_STAMP := $(VENV)/.installed-serve
STAMP := $(VENV)/.installed

# `make run` passes on only what was given, so a CONFIG file's settings are not overridden by
# defaults: DATA_DIR (./data, created if missing), HOST, PORT, TEXT_PORT, THRIFT_PORT, ADMIN_PORT, ADMIN_HOST, CONFIG, and ARGS for any
# other flag of `kestrel-actors serve` (e.g. ARGS="--sync-journal always").
RUN_FLAGS = $(if $(CONFIG),--config $(CONFIG)) $(if $(HOST),--host $(HOST)) \
	$(if $(PORT),--port $(PORT)) $(if $(TEXT_PORT),--text-port $(TEXT_PORT)) \
	$(if $(THRIFT_PORT),--thrift-port $(THRIFT_PORT)) $(if $(ADMIN_PORT),--admin-port $(ADMIN_PORT)) \
	$(if $(ADMIN_HOST),--admin-host $(ADMIN_HOST)) $(if $(DATA_DIR),--data-dir $(DATA_DIR)) $(ARGS)

# How every target below installs a Debian package (through sudo unless root): `apt-get update`,
# then `apt-get install`. Both wait for another apt-get or dpkg (an unattended upgrade, a second
# make, a helper installing a tool) to let go of apt's locks, where they would otherwise fail at
# once with "Could not get lock": install through dpkg's own timeout, update (which that option
# does not cover) by trying again every 10 s for up to 10 minutes; any other failure stops.
APT_WAIT := -o DPkg::Lock::Timeout=600
APT_RETRY_SECONDS ?= 10
APT_INSTALL = sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	for attempt in $$(seq 60); do \
		out=$$($$sudo apt-get $(APT_WAIT) update -qq 2>&1) && break; \
		echo "$$out" | grep -q 'Could not get lock' || { echo "$$out" >&2; exit 1; }; \
		echo "apt-get update: another apt-get holds apt's lock; trying again in $(APT_RETRY_SECONDS) s"; sleep $(APT_RETRY_SECONDS); \
	done; \
	DEBIAN_FRONTEND=noninteractive $$sudo apt-get $(APT_WAIT) install -y -qq

.PHONY: run test test-pure compiled pgo lint bench install clean memcached-tools netcat thrift-compiler browser \
	node-clients zookeeper systemd-analyze redis valgrind

# The compiled build (ADR 0015; its switches and the fall-back to pure Python: docs/build.md): the
# request path's modules compiled with mypyc in place (`.so` beside each `.py`). `make run` compiles
# it plainly (about a minute on 2 cores), so that a first start is quick; the profile-guided build
# (gcc compiles it instrumented, `kestrel_actors.loadtests.training` runs it, gcc compiles it again:
# about twice as long) is what `make pgo`, `make test`, `make bench` and `make install` build, and
# `make run PGO=1`. `make test PGO=0` tests the plain one. Either is rebuilt whenever one of its
# sources is newer, so no target runs a stale build (the package would fall back to pure Python);
# a plain rebuild removes the profile-guided stamp. MYPYC=1, which every target but `make run`
# sets, makes a missing C compiler an error, not a silent pure run; `make run` leaves it unset:
# compiled when possible, else pure Python.
COMPILED_SOURCES := $(shell sed -n 's/^    "\(kestrel_actors\.[a-z_.]*\)",$$/\1/p' kestrel_actors/_compiled.py \
	| tr . / | sed 's/$$/.py/')
COMPILED_STAMP := $(VENV)/.compiled
PGO_STAMP := $(VENV)/.compiled-pgo
PGO ?=
RUN_BUILD = $(if $(filter 1,$(PGO)),$(PGO_STAMP),$(COMPILED_STAMP))
FULL_BUILD = $(if $(filter 0,$(PGO)),$(COMPILED_STAMP),$(PGO_STAMP))
# What `test-pure` runs against the pure-Python source: the rooms whose modules are compiled and the
# server tests (the whole suite is too long to run twice in CI).
PURE_TESTS := tests/protocol tests/queue tests/journal tests/session tests/actors tests/runtime tests/messages tests/stats \
	tests/test_compiled_build.py

# pip installs the package pure (KESTREL_ACTORS_MYPYC=0); $(COMPILED_STAMP) then compiles it in
# place, which the profile-guided build needs (it trains the server). Each step says what it does;
# `step` adds a line every 10 s while pip runs (pip -q prints nothing for tens of seconds), and
# setup.py says how far its compile is every 10 s.
step = @echo "make: $(1)"; started=$$(date +%s); \
	( while sleep 10; do echo "make: ... $(1): $$(( $$(date +%s) - started )) s"; done ) & ticker=$$!; \
	$(2); status=$$?; kill $$ticker; echo "make: done in $$(( $$(date +%s) - started )) s: $(1)"; exit $$status

comma := ,

$(BIN)/python:
	$(call step,creating $(VENV) with $(PYTHON),$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV))

$(SERVE_STAMP): $(BIN)/python setup.cfg pyproject.toml
	$(call step,installing what serving needs into $(VENV) (pip install -e '.[build]'),KESTREL_ACTORS_MYPYC=0 $(BIN)/python -m pip install -q -e '.[build]')
	@touch $(SERVE_STAMP)

$(STAMP): $(BIN)/python setup.cfg pyproject.toml
	$(call step,installing every extra into $(VENV) (pip install -e '.[build$(comma)test$(comma)spark$(comma)load]'),KESTREL_ACTORS_MYPYC=0 $(BIN)/python -m pip install -q -e '.[build$(comma)test$(comma)spark$(comma)load]')
	@touch $(STAMP) $(SERVE_STAMP)

install: $(STAMP) $(FULL_BUILD)

run: $(SERVE_STAMP) $(RUN_BUILD)
	$(BIN)/kestrel-actors serve $(RUN_FLAGS)

# libmemcached's memcstat/memcping, which the client tests run against the server: Debian's
# libmemcached-tools, installed only when memcstat is missing (apt-get, through sudo unless root).
memcached-tools:
	@command -v memcstat >/dev/null 2>&1 || { \
		echo "installing libmemcached-tools (memcstat, memcping)"; \
		$(APT_INSTALL) libmemcached-tools >/dev/null; }

# OpenBSD netcat, whose `nc -N` (half-close after sending) a test pipes requests through, as a
# newcomer's first try does: Debian's netcat-openbsd, installed only when `nc` is missing.
netcat:
	@nc -h 2>&1 | grep -q OpenBSD || { \
		echo "installing netcat-openbsd (nc)"; \
		$(APT_INSTALL) netcat-openbsd >/dev/null; }

# Apache Thrift's compiler, which a test runs to generate an independent client from
# kestrel.thrift: Debian's thrift-compiler, installed only when `thrift` is missing.
thrift-compiler:
	@command -v thrift >/dev/null 2>&1 || { \
		echo "installing thrift-compiler"; \
		$(APT_INSTALL) thrift-compiler >/dev/null; }

# Redis, the peer of `make bench`'s Redis rows and of the load tests' --resp tests: Debian's
# redis-server (and redis-tools), installed only when redis-server is missing. The bench and the
# tests run the binary themselves, on a free loopback port with a fresh data directory; they never
# use the package's own service (which Debian starts on 6379 where systemd runs).
redis:
	@command -v redis-server >/dev/null 2>&1 || { \
		echo "installing redis-server"; \
		$(APT_INSTALL) redis-server >/dev/null; }

# valgrind, under which kestrel_actors.loadtests.durable_callgrind counts a durable SET's
# instructions (ADR 0018) and its smoke test runs: Debian's package, installed only when missing.
valgrind:
	@command -v valgrind >/dev/null 2>&1 && command -v callgrind_control >/dev/null 2>&1 || { \
		echo "installing valgrind"; \
		$(APT_INSTALL) valgrind >/dev/null; }

# node's memcached 2.2.2, whose behaviour docs/protocols.md's clients table states: Debian's nodejs and npm
# when node is missing, then the package into .venv/node_modules.
node-clients:
	@command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || { \
		$(APT_INSTALL) nodejs npm >/dev/null; }
	@[ -d $(VENV)/node_modules/memcached ] || npm install --silent --no-audit --no-fund --prefix $(VENV) memcached@2.2.2 >/dev/null

# Apache ZooKeeper, which the cluster tests run for real (tests/cluster: a standalone server on a
# free loopback port, started from Debian's jars with Java 17): Debian's zookeeper package,
# installed only when its jar is missing.
zookeeper:
	@test -f /usr/share/java/zookeeper.jar || { \
		echo "installing zookeeper"; \
		$(APT_INSTALL) zookeeper >/dev/null; }

# systemd-analyze, with which a test verifies contrib/kestrel-actors.service: Debian's systemd
# package, installed only when the command is missing (a container may lack it).
systemd-analyze:
	@command -v systemd-analyze >/dev/null 2>&1 || { \
		echo "installing systemd (systemd-analyze)"; \
		$(APT_INSTALL) systemd >/dev/null; }

browser:
	@if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then \
		echo "installing chromium and chromium-driver (about 100 MB; silent for a minute or two)"; \
		$(APT_INSTALL) chromium chromium-driver >/dev/null; \
	fi

# ruff's settings are in pyproject.toml, mypy's (what it checks, and how strictly) in setup.cfg.
lint: $(STAMP)
	$(BIN)/python -m ruff check kestrel_actors tests
	$(BIN)/python -m mypy

MYPYC ?=
test bench install compiled pgo: MYPYC := 1

$(COMPILED_STAMP): $(SERVE_STAMP) setup.py $(COMPILED_SOURCES)
	@echo "make: compiling the request path with mypyc, plainly (make pgo: profile-guided); it says how far every 10 s"
	KESTREL_ACTORS_MYPYC=$(MYPYC) KESTREL_ACTORS_PGO=0 $(BIN)/python setup.py -q build_ext --inplace
	@rm -f $(PGO_STAMP); touch $(COMPILED_STAMP)

$(PGO_STAMP): $(SERVE_STAMP) setup.py $(COMPILED_SOURCES)
	@echo "make: compiling the request path with mypyc, profile-guided; it says how far every 10 s"
	KESTREL_ACTORS_MYPYC=$(MYPYC) KESTREL_ACTORS_PGO=1 $(BIN)/python setup.py -q build_ext --inplace
	@touch $(COMPILED_STAMP) $(PGO_STAMP)

compiled: $(RUN_BUILD)
pgo: $(PGO_STAMP)

# Two pytest-xdist workers, one per core: most tests wait on servers, JVMs and sockets, so two
# at a time take the suite from ~33 to ~19 minutes on 2 cores. A module stays on one worker
# (--dist loadfile), and so do the Spark tests and the browser tests, each as one group
# (tests/conftest.py); TEST_WORKERS=0 runs everything in this one process. --durations=15:
# the slowest 15 tests, printed at the end.
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q -rfE -n $(TEST_WORKERS) --dist loadfile --durations=15

test: $(STAMP) $(FULL_BUILD) memcached-tools netcat thrift-compiler browser node-clients zookeeper systemd-analyze \
	redis valgrind
	KESTREL_ACTORS_EXPECT_COMPILED=1 KESTREL_ACTORS_EXPECT_PROFILE=$(if $(filter 0,$(PGO)),0,1) KESTREL_ACTORS_EXPECT_PYTHON=$(PYTHON) $(PYTEST)

# the same tests on the pure-Python source, the compiled build left in place (KESTREL_ACTORS_PURE)
test-pure: $(STAMP) memcached-tools netcat thrift-compiler
	KESTREL_ACTORS_PURE=1 $(PYTEST) $(PURE_TESTS)

# PEER=path/to/darner adds darner's columns; REDIS=path/to/redis-server picks the Redis of the
# Redis rows (default: redis-server on PATH), REDIS=none leaves them out.
bench: $(STAMP) $(FULL_BUILD) $(if $(filter none,$(REDIS)),,redis)
	PEER=$(PEER) REDIS=$(REDIS) $(BIN)/python -m kestrel_actors.loadtests.bench --write docs/benchmarks.md

clean:
	rm -rf $(VENV) build *.egg-info *__mypyc*.so
	find kestrel_actors -name '*.so' -delete
	rm -f kestrel_actors/_profile_guided.txt

# The targets CI runs are the ones a newcomer runs: `make demo` and `make test` set up what is missing first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PACKAGES := wire msgbusd client twin_resolver spark bench testing router

.PHONY: setup system-packages venv tools compile spark-classes lint format test test-fast faults bench demo mine-demo clean

setup: system-packages venv tools

system-packages:
	@sh scripts/ensure-system-packages.sh

venv: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "msgbus needs Python >= 3.11; set PYTHON=python3.11 (or newer)")'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --no-compile -e ".[dev]"
	@touch $(STAMP)

# promtool, for the tests of the alert rules (monitoring/).
tools: venv
	@sh scripts/ensure-promtool.sh $(BIN)

# The project's modules compiled once: where Python is told not to write bytecode (PYTHONDONTWRITEBYTECODE),
# each of the hundreds of processes the tests start would compile every one it imports (a third of a
# daemon's start). Only what changed since is compiled again. The test modules too, as pytest rewrites
# their asserts (half of each test worker's collection), by a collection that may write its cache.
# The installed packages too: pip installs them uncompiled (one core for 15 s), compiled here on both (a
# module that does not compile on this Python, as some packages ship, is left as pip leaves it).
compile: venv
	@$(BIN)/python -m compileall -q -j 0 $$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') > /dev/null 2>&1 || true
	@$(BIN)/python -m compileall -q $(PACKAGES) tests
	@PYTHONDONTWRITEBYTECODE= $(BIN)/pytest --collect-only -q -p no:cacheprovider > /dev/null

# Spark's classes archived once per virtual environment (testing/spark_classes.py), which every JVM of the
# tests maps in rather than loading each class again: a quarter of the Spark tests' CPU. Without it (no
# Java yet, or a run that failed) the tests run as they would without it.
SPARK_CLASSES := $(VENV)/spark-classes.jsa
WITH_SPARK_CLASSES = if test -f $(SPARK_CLASSES); then \
	export JAVA_TOOL_OPTIONS="-XX:SharedArchiveFile=$(abspath $(SPARK_CLASSES)) -Xlog:cds=off -Xlog:cds+dynamic=off"; fi;

spark-classes: $(SPARK_CLASSES)

$(SPARK_CLASSES): $(STAMP)
	@$(BIN)/python -m testing.spark_classes $@ > $(VENV)/spark-classes.log 2>&1 \
		|| { echo "no archive of Spark's classes (the tests' JVMs load them as usual):"; tail -20 $(VENV)/spark-classes.log; }

lint: venv
	$(BIN)/ruff check $(PACKAGES) tests
	$(BIN)/ruff format --check $(PACKAGES) tests
	$(BIN)/mypy

format: venv
	$(BIN)/ruff format $(PACKAGES) tests
	$(BIN)/ruff check --fix $(PACKAGES) tests

# Tests run module by module on TEST_WORKERS workers, the longest first (tests/scheduling.py).
# The fault scenarios run after the rest, on FAULT_WORKERS: they measure how soon the bus recovers, which
# the Spark tests' JVMs, sharing the same cores, would measure instead.
TEST_WORKERS ?= 4
FAULT_WORKERS ?= 4
# Where the fault scenarios (marked `faults`) are: the fault phase collects only these.
FAULT_TESTS := tests/faults tests/netbed tests/router/test_faults.py
# The scenarios keep a third of the cores idle, waiting out their outages. Tests that keep a core busy for
# a minute but bound no time (marked `background`, all in BACKGROUND_TESTS) run beside them, on
# BACKGROUND_WORKERS at the lowest priority, so that they take only what the scenarios leave; their
# report follows the fault phase's. (tests/test_phases.py checks that each marked test is where its phase looks.)
BACKGROUND_WORKERS ?= 2
BACKGROUND_TESTS := tests/site/test_big_backlog.py tests/door/test_fuzz_door.py

# Lint, compile and the archive of Spark's classes side by side: together about 40 s of both cores.
test: setup
	@$(MAKE) --no-print-directory -j3 lint compile spark-classes
	$(WITH_SPARK_CLASSES) $(BIN)/pytest -n $(TEST_WORKERS) --dist loadscope -m "not faults and not background" --durations 10
	@$(WITH_SPARK_CLASSES) log=$$(mktemp); \
	nice -n 19 $(BIN)/pytest -n $(BACKGROUND_WORKERS) --dist loadscope -m background -p no:cacheprovider \
		$(BACKGROUND_TESTS) > $$log 2>&1 & background=$$!; \
	$(BIN)/pytest -n $(FAULT_WORKERS) --dist loadscope -m faults --durations 5 $(FAULT_TESTS); faults=$$?; \
	wait $$background; beside=$$?; \
	echo "--- beside the fault phase, at the lowest priority: $(BACKGROUND_TESTS)"; cat $$log; rm -f $$log; \
	test $$faults = 0 && test $$beside = 0

# The unit tier: nothing but the shared redis-server is started (under 30 s).
test-fast: setup compile
	$(BIN)/pytest -n 2 --dist loadscope -m "not slow and not processes"

# The fault scenarios alone, with their figures as a table (for docs/reliability.md).
faults: setup compile
	rm -f .fault-report.jsonl
	MSGBUS_FAULT_REPORT=.fault-report.jsonl $(BIN)/pytest -m faults -p no:cacheprovider $(FAULT_TESTS)
	$(BIN)/python -m tests.faults.report .fault-report.jsonl

# The benchmark sweep (two sites on this machine, msgbus against a no-logic floor); see docs/benchmarks.md.
# PEER_BIN=path/to/a-go-rmb-build adds go-rmb's rows, measured side by side in the same sweep.
# bench.wan and bench.thin_link run in the network test bed (root; without it they say why and skip).
bench: setup
	$(BIN)/python -m bench.suite $(if $(PEER_BIN),--peer-bin $(PEER_BIN))
	$(BIN)/python -m bench.router
	$(BIN)/python -m bench.waiting
	$(BIN)/python -m bench.many_edges
	$(BIN)/python -m bench.many_edges --two-processes --edges 10000
	$(BIN)/python -m bench.real_edges
	$(BIN)/python -m bench.wan $(if $(PEER_BIN),--peer-bin $(PEER_BIN))
	$(BIN)/python -m bench.thin_link $(if $(PEER_BIN),--peer-bin $(PEER_BIN))
	$(BIN)/python -m bench.thin_link --echo --both-ways --big-mib 1 --small-every-ms 20 $(if $(PEER_BIN),--peer-bin $(PEER_BIN))
	$(BIN)/python -m bench.thin_link --echo --kbit 512 --big-mib 1 --small-every-ms 200 $(if $(PEER_BIN),--peer-bin $(PEER_BIN))

demo: setup
	$(BIN)/msgbus demo

# The demo with both sites writing event logs, then the Spark job over them: build/report/report.html.
mine-demo: setup
	rm -rf build/events build/report
	$(BIN)/msgbus demo --event-log build/events
	$(BIN)/msgbus mine --events 'build/events/*.jsonl' --out build/report

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache *.egg-info build

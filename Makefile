GO ?= go
BIN ?= bin/beatd

.PHONY: build test bench fuzz vectors demo

build:
	$(GO) build -o $(BIN) ./cmd/beatd

# Every test, with the race detector. Needs redis-server, etcd and Debian's
# python3-celery on PATH (.ci/run installs them).
test:
	$(GO) vet ./...
	$(GO) test -race -count=1 -p 1 -timeout 20m ./...

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

fuzz:
	for f in FuzzParseCrontabField FuzzCrontabNext FuzzParseConfig; do \
		$(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime 30s ./schedule || exit 1; done

# Regenerate the crontab and solar vectors from the installed Celery (and
# python3-ephem).
vectors:
	cd schedule/testdata && /usr/bin/python3 gen_celery_vectors.py > celery_vectors.jsonl
	cd schedule/testdata && /usr/bin/python3 gen_solar_vectors.py > solar_vectors.jsonl

# The main job: Redis, a real Celery worker and beatd on schedules.yaml for
# about 30 seconds (installs redis-server and python3-celery if missing).
demo:
	deploy/demo/demo.sh

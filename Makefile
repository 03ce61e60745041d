GO ?= go
BIN ?= bin/beatd
IMAGE ?= beatd:latest

.PHONY: build test bench fuzz vectors demo image

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

# Regenerate the crontab vectors from the installed Celery.
vectors:
	cd schedule/testdata && /usr/bin/python3 gen_celery_vectors.py > celery_vectors.jsonl

# The main job: Redis, a real Celery worker and beatd on schedules.yaml for
# about 30 seconds (installs redis-server and python3-celery if missing).
demo:
	deploy/demo/demo.sh

# The FROM scratch image, built offline (podman; BUILDER=docker for docker).
image:
	deploy/image.sh $(IMAGE)

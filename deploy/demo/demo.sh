#!/usr/bin/env bash
# make demo: Redis, a real Celery worker and beatd (embedded etcd) on the
# example schedules.yaml, for about 30 seconds, then a clean stop.
set -euo pipefail
cd "$(dirname "$0")/../.."
DURATION=${DEMO_SECONDS:-30}

.ci/deps demo

export PATH="/usr/local/go/bin:$PATH"
go build -o bin/beatd ./cmd/beatd

work=$(mktemp -d /tmp/beatd-demo.XXXXXX)
freeport() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
REDIS_PORT=$(freeport); ETCD_CLIENT=$(freeport); ETCD_PEER=$(freeport); HTTP_PORT=$(freeport)
BROKER="redis://127.0.0.1:$REDIS_PORT/0"

pids=()
cleanup() {
  trap - EXIT INT TERM
  echo
  echo "demo: stopping beatd (SIGTERM: persist, resign, exit), the worker and Redis ..."
  [ -n "${BEATD_PID:-}" ] && kill -TERM "$BEATD_PID" 2>/dev/null && wait "$BEATD_PID" 2>/dev/null || true
  [ -n "${WORKER_PID:-}" ] && kill -TERM "$WORKER_PID" 2>/dev/null && wait "$WORKER_PID" 2>/dev/null || true
  [ -n "${REDIS_PID:-}" ] && kill -TERM "$REDIS_PID" 2>/dev/null && wait "$REDIS_PID" 2>/dev/null || true
  /usr/bin/python3 deploy/demo/view.py count "$work/beatd.log" "$work/worker.log" || true
  echo "demo: logs are in $work"
}
trap cleanup EXIT INT TERM

redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly yes --dir "$work" >"$work/redis.log" 2>&1 &
REDIS_PID=$!
for _ in $(seq 50); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done

(cd deploy/demo && DEMO_BROKER="$BROKER" exec /usr/bin/python3 -m celery -A celery_app worker -P solo \
  -Q celery,reports,emails --loglevel=INFO --without-heartbeat --without-mingle --without-gossip -n demo@%h) \
  >"$work/worker.log" 2>&1 &
WORKER_PID=$!

bin/beatd run --config schedules.yaml --broker "$BROKER" --data-dir "$work/beatd-data" \
  --etcd-client-port "$ETCD_CLIENT" --etcd-peer-port "$ETCD_PEER" --http "127.0.0.1:$HTTP_PORT" \
  --id demo >"$work/beatd.log" 2>&1 &
BEATD_PID=$!

echo "demo: Redis :$REDIS_PORT, Celery worker, beatd with embedded etcd :$ETCD_CLIENT, HTTP :$HTTP_PORT"
echo "demo: watching for ${DURATION}s: beatd publishes ('fired') and the worker runs ('succeeded')"
echo

# Show both streams as they happen, one line each (view.py also makes
# the final counts, so the live view and the counts read the logs alike).
tail -n +1 -F "$work/beatd.log" "$work/worker.log" 2>/dev/null | /usr/bin/python3 -u deploy/demo/view.py follow &
TAIL_PID=$!

sleep 8
echo "demo: \$ beatd trigger nightly-report   (a manual run, through etcd)"
bin/beatd trigger nightly-report --etcd-endpoints "http://127.0.0.1:$ETCD_CLIENT" || true
sleep 2
echo "demo: \$ curl -s 127.0.0.1:$HTTP_PORT/metrics | grep beatd_fires_total"
curl -s "127.0.0.1:$HTTP_PORT/metrics" | grep '^beatd_fires_total' || true
sleep $((DURATION - 10))
kill "$TAIL_PID" 2>/dev/null || true
wait "$TAIL_PID" 2>/dev/null || true

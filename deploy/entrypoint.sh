#!/bin/sh
# The console image's commands. Production settings come from the environment
# (GPUGEEK_ENV=production, DATABASE_URL, REDIS_URL, SECRET_KEY, ALLOWED_HOSTS; see
# deploy/kubernetes/config.yaml).
#   web      ASGI server (HTTP + WebSockets) on $PORT (8000): uvicorn, $WEB_WORKERS processes
#   worker   Celery worker on the console's queue
#   beat     Celery beat (run exactly one)
#   watcher  follows the compute backends (manage.py run_watcher; one per installation)
#   ssh-gateway  the SSH gateway to dev environments on $SSH_GATEWAY_PORT (2222)
#   migrate  applies database migrations, then exits
#   manage   any manage.py command: `manage createsuperuser`
set -eu
cd /app

# Counters of several processes meet in PROMETHEUS_MULTIPROC_DIR (console/metrics.py);
# a fresh container starts with an empty one, as prometheus-client requires.
if [ -n "${PROMETHEUS_MULTIPROC_DIR:-}" ]; then
  mkdir -p "$PROMETHEUS_MULTIPROC_DIR"
  find "$PROMETHEUS_MULTIPROC_DIR" -mindepth 1 -maxdepth 1 -name '*.db' -delete
fi

command="${1:-web}"
[ $# -gt 0 ] && shift
case "$command" in
  web)
    exec python -m uvicorn console.asgi:application --host 0.0.0.0 --port "${PORT:-8000}" \
      --workers "${WEB_WORKERS:-2}" --proxy-headers --forwarded-allow-ips '*' \
      --no-server-header --ws websockets-sansio --timeout-graceful-shutdown 3 "$@"
    ;;
  worker)
    exec python -m celery -A console worker -l INFO -n "worker.$(hostname)@%h" \
      --concurrency "${WORKER_CONCURRENCY:-4}" --without-gossip --without-mingle "$@"
    ;;
  beat)
    exec python -m celery -A console beat -l INFO --pidfile= "$@"
    ;;
  watcher)
    exec python manage.py run_watcher "$@"
    ;;
  ssh-gateway)
    exec python manage.py ssh_gateway --host 0.0.0.0 --port "${SSH_GATEWAY_PORT:-2222}" "$@"
    ;;
  migrate)
    exec python manage.py migrate --noinput "$@"
    ;;
  manage)
    exec python manage.py "$@"
    ;;
  *)
    exec "$command" "$@"
    ;;
esac

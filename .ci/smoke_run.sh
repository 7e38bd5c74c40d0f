#!/usr/bin/env bash
# Start the README's run command on a fresh data dir, wait for the sign-in page, sign in
# as a demo user over HTTP, check /healthz, stop it with SIGTERM, and check nothing is left.
set -euo pipefail
cd "$(dirname "$0")/.."
data_dir=$(mktemp -d)
port=$(.venv/bin/python -c "from console.launcher import free_loopback_port as p; print(p())")
jar=$(mktemp)
log_file="$data_dir/run.log"
url="http://127.0.0.1:$port"
healthz_token=$(.venv/bin/python -c "import secrets; print(secrets.token_hex(16))")
env -u DATABASE_URL -u REDIS_URL GPUGEEK_DATA_DIR="$data_dir" PORT="$port" HEALTHZ_TOKEN="$healthz_token" \
  setsid make run >"$log_file" 2>&1 &
run_pid=$!
cleanup() { kill -TERM -- "-$run_pid" 2>/dev/null || true; rm -f "$jar"; }
trap cleanup EXIT

for i in $(seq 1 120); do
  code=$(curl -s -o /dev/null -w '%{http_code}' "$url/accounts/login/" || true)
  [ "$code" = 200 ] && break
  if ! kill -0 "$run_pid" 2>/dev/null; then cat "$log_file"; echo "make run exited"; exit 1; fi
  sleep 1
done
[ "$code" = 200 ] || { cat "$log_file"; echo "sign-in page never answered 200"; exit 1; }
echo "sign-in page: 200 after ${i}s"

curl -s -c "$jar" -b "$jar" -o /dev/null "$url/accounts/login/"
csrf=$(awk '$6 == "csrftoken" {print $7}' "$jar")
code=$(curl -s -c "$jar" -b "$jar" -o /dev/null -w '%{http_code} %{redirect_url}' \
  -H "Referer: $url/accounts/login/" \
  --data-urlencode "csrfmiddlewaretoken=$csrf" --data-urlencode "username=alice@acme.example" \
  --data-urlencode "password=${DEMO_PASSWORD:-gpugeek-demo}" "$url/accounts/login/")
echo "sign-in POST: $code"
[[ "$code" == 302* ]] || { echo "sign-in failed"; exit 1; }
page=$(curl -s -b "$jar" "$url/")
grep -q "Acme" <<<"$page" || { echo "dashboard does not show Acme"; exit 1; }
echo "signed in: dashboard shows Acme"

for _ in $(seq 1 60); do
  health=$(curl -s -H "Authorization: Bearer $healthz_token" "$url/healthz" || true)
  if .venv/bin/python -c "import json,sys; c=json.loads(sys.argv[1])['components']; sys.exit(0 if all(c[k]['status']=='ok' for k in ('database','redis','worker','beat','watcher')) else 1)" "$health" 2>/dev/null; then
    break
  fi
  sleep 1
done
echo "healthz: $health"
.venv/bin/python -c "import json,sys; c=json.loads(sys.argv[1])['components']; assert c['host_sandbox']['status'] == 'ok', c['host_sandbox']" "$health"
.venv/bin/python -c "import json,sys; c=json.loads(sys.argv[1])['components']; assert all(c[k]['status']=='ok' for k in ('database','redis','worker','beat','watcher')), c" "$health"

# The sandbox cluster: an 8×A100 spot job launches, runs, logs and reports GPU readings.
token=$(curl -s -X POST "$url/api/v1/auth/token" -H 'Content-Type: application/json' \
  -d "{\"email\": \"alice@acme.example\", \"password\": \"${DEMO_PASSWORD:-gpugeek-demo}\", \"tenant\": \"acme\", \"name\": \"smoke\"}" \
  | .venv/bin/python -c "import json,sys; print(json.load(sys.stdin)['token'])")
job=$(curl -s -X POST "$url/api/v1/jobs" -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
  -d '{"name": "smoke-a100-spot", "image": "pytorch-2-5-cuda12-4", "command": ["torchrun", "train.py"], "gpu_type": "a100-80gb", "gpus_per_node": 8, "region": "us-west", "spot_ratio": "1", "env": {"SANDBOX_DURATION_SECONDS": "60"}}' \
  | .venv/bin/python -c "import json,sys; body=json.load(sys.stdin); print(body.get('id') or sys.exit(f'launch refused: {body}'))")
for _ in $(seq 1 60); do
  status=$(curl -s -H "Authorization: Bearer $token" "$url/api/v1/jobs/$job" | .venv/bin/python -c "import json,sys; print(json.load(sys.stdin)['status'])")
  [ "$status" = running ] && break
  sleep 1
done
echo "sandbox job $job: $status"
[ "$status" = running ] || { tail -50 "$log_file"; echo "the sandbox job never ran"; exit 1; }
for _ in $(seq 1 60); do
  log=$(curl -s -H "Authorization: Bearer $token" "$url/api/v1/jobs/$job/log.txt")
  samples=$(curl -s -H "Authorization: Bearer $token" "$url/api/v1/jobs/$job/metrics" | .venv/bin/python -c "import json,sys; print(len(json.load(sys.stdin).get('samples', [])))")
  grep -q "^epoch " <<<"$log" && [ "$samples" -gt 0 ] && break
  sleep 1
done
grep -q "Simulated workload" <<<"$log" && grep -q "^epoch " <<<"$log" \
  || { echo "no simulated training log: $log"; exit 1; }
[ "$samples" -gt 0 ] || { echo "no GPU readings for the sandbox job"; exit 1; }
echo "sandbox job logs $(wc -l <<<"$log") lines and $samples GPU samples"

# Issue 26's audit, replayed: staff grant Globex host access too, and a Globex host job
# tries to read the console's secret key, database and Redis password and to reach the
# console's web port; it must read and reach nothing and still end as it says.
staff_token=$(curl -s -X POST "$url/api/v1/auth/token" -H 'Content-Type: application/json' \
  -d "{\"email\": \"admin@example.com\", \"password\": \"${DEMO_PASSWORD:-gpugeek-demo}\", \"name\": \"smoke-staff\"}" \
  | .venv/bin/python -c "import json,sys; print(json.load(sys.stdin)['token'])")
code=$(curl -s -o /dev/null -w '%{http_code}' -X PATCH "$url/api/v1/staff/tenants/globex" \
  -H "Authorization: Bearer $staff_token" -H 'Content-Type: application/json' -d '{"may_run_on_host": true}')
[ "$code" = 200 ] || { echo "staff could not grant Globex host access: $code"; exit 1; }
bob=$(curl -s -X POST "$url/api/v1/auth/token" -H 'Content-Type: application/json' \
  -d "{\"email\": \"bob@globex.example\", \"password\": \"${DEMO_PASSWORD:-gpugeek-demo}\", \"tenant\": \"globex\", \"name\": \"smoke\"}" \
  | .venv/bin/python -c "import json,sys; print(json.load(sys.stdin)['token'])")
probe=$(.venv/bin/python -c '
import json, sys
data_dir, port = sys.argv[1], int(sys.argv[2])
program = f"""import socket
for path in ("{data_dir}/secret_key", "{data_dir}/gpugeek.sqlite3", "{data_dir}/redis/redis-password"):
    try:
        open(path, "rb").read(1); print("READ", path)
    except OSError as error:
        print("DENIED", type(error).__name__)
s = socket.socket(); s.settimeout(3)
print("REACHED web" if s.connect_ex(("127.0.0.1", {port})) == 0 else "NO ROUTE to web")
raise SystemExit(7)
"""
print(json.dumps({"name": "audit", "image": "python-3.11", "command": ["python", "-c", program], "cpus": 1, "region": "local"}))
' "$data_dir" "$port")
attack=$(curl -s -X POST "$url/api/v1/jobs" -H "Authorization: Bearer $bob" -H 'Content-Type: application/json' -d "$probe" \
  | .venv/bin/python -c "import json,sys; body=json.load(sys.stdin); print(body.get('id') or sys.exit(f'launch refused: {body}'))")
for _ in $(seq 1 60); do
  status=$(curl -s -H "Authorization: Bearer $bob" "$url/api/v1/jobs/$attack" | .venv/bin/python -c "import json,sys; b=json.load(sys.stdin); print(b['status'], b.get('exit_code'))")
  [[ "$status" == failed* || "$status" == succeeded* ]] && break
  sleep 1
done
out=$(curl -s -H "Authorization: Bearer $bob" "$url/api/v1/jobs/$attack/log.txt")
echo "Globex host job: $status; $(tr '\n' ';' <<<"$out")"
[ "$status" = "failed 7" ] || { echo "the host job did not end with its own exit code"; exit 1; }
grep -q "^READ\|REACHED" <<<"$out" && { echo "a host job read the console's secrets"; exit 1; }
[ "$(grep -c '^DENIED' <<<"$out")" = 3 ] || { echo "the probe did not run: $out"; exit 1; }
echo "host sandbox: the Globex job read and reached nothing of the console"

# Like Ctrl-C in a terminal: the signal goes to the whole foreground group (make and the
# launcher); the launcher then stops its children and the embedded Redis.
kill -TERM -- "-$run_pid"
for _ in $(seq 1 60); do pgrep -g "$run_pid" >/dev/null || break; sleep 0.5; done
if pgrep -g "$run_pid" >/dev/null; then echo "make run did not stop on SIGTERM"; pgrep -ag "$run_pid"; exit 1; fi
.venv/bin/python - "$data_dir" <<'PY'
import sys, time, psutil
data_dir = sys.argv[1]
def leftovers():
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if proc.pid == psutil.Process().pid:
            continue
        try:
            if proc.environ().get("GPUGEEK_DATA_DIR") == data_dir or data_dir in " ".join(proc.info["cmdline"] or []):
                found.append((proc.pid, " ".join(proc.info["cmdline"] or [])))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found
for _ in range(20):
    if not leftovers():
        break
    time.sleep(0.5)
assert not leftovers(), f"processes left behind: {leftovers()}"
PY
[ ! -e "$data_dir/redis/redis.url" ] || { echo "redis.url left behind"; exit 1; }
echo "stopped cleanly"
rm -rf "$data_dir"

# Sourced by the load scripts (batching_ab.sh, batching_profile.sh, served_backends.sh).

# load_dirs: sets $out (OUT, or a new temporary folder) for what a script leaves behind and
# $work (a temporary folder), and on exit kills the script's background jobs (its servers)
# and removes $work.
load_dirs() {
  out=${OUT:-$(mktemp -d)}
  mkdir -p "$out"
  work=$(mktemp -d)
  trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
}

# synth_requests BIN RANKER DOCS LOG: 64 production-like /v1/rank requests of DOCS hit
# documents for RANKER, as MessagePack, into LOG.
synth_requests() {
  "$1" requests synth --ranker "$2" --docs "$3" --count 64 --out "$4" >/dev/null
}

# start_server BIN PORT LOG DATA_DIR [SERVE FLAGS...] starts `BIN serve` on 127.0.0.1:PORT in
# the background (its output to LOG, its data in DATA_DIR), sets SERVER_PID, and returns once
# /readyz answers (a minute at most; then it fails).
start_server() {
  "$1" serve --addr "127.0.0.1:$2" --data-dir "$4" "${@:5}" >"$3" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$2/readyz" >/dev/null && return 0
    sleep 0.1
  done
  echo "the server on port $2 never became ready (log: $3)" >&2
  return 1
}

# replay_json BIN PORT LOG CLIENTS SECONDS OUT: `BIN replay` of LOG against 127.0.0.1:PORT from
# CLIENTS closed-loop clients for SECONDS; its JSON report into OUT.
replay_json() {
  "$1" replay --url "http://127.0.0.1:$2" --log "$3" --concurrency "$4" --duration "$5" \
    --json >"$6"
}

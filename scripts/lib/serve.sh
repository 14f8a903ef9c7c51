# Sourced by the load scripts. start_server BIN PORT LOG DATA_DIR [SERVE FLAGS...] starts
# `BIN serve` on 127.0.0.1:PORT in the background (its output to LOG, its data in DATA_DIR),
# sets SERVER_PID, and returns once /readyz answers (a minute at most; then it fails).
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

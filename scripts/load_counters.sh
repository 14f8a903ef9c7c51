# Counters sourced by the load benchmarks (multi_gpu_bench.sh, search_load_ab.sh) to tell a
# host-bound point from a device-bound one.

# The host's idle and total CPU ticks so far (every core).
cpu_ticks() {
  awk '/^cpu /{t = 0; for (i = 2; i <= NF; i++) t += $i; print $5 + $6, t}' /proc/stat
}

# Microseconds the devices of the server on port $1 have spent in turns so far, summed.
turn_us() {
  curl -s "http://127.0.0.1:$1/metrics" |
    awk '/^rankserve_gpu_device_busy_microseconds_total/{s += $2} END{printf "%d\n", s}'
}

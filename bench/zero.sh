#!/usr/bin/env bash
# bench/zero.sh BUILD - sharded state (rk-train --zero, RK_SHARDED) on 4 workers: measured
# memory per rank against ZeRO-1's figure, and the rebuild of a lost rank's shard (512 MiB) from
# the survivors' memory against re-reading it from disk (bench/zero.py; needs
# build/bench/bench_zero: make build-tests).
set -euo pipefail
exec /usr/bin/python3 "$(dirname "$0")/zero.py" "${1:-build}"

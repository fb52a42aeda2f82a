#!/usr/bin/env bash
# bench/recover.sh BUILD - kill -> peer_dead / ring_rebuilt / resumed and steps lost for a
# 4-worker job, in-memory vs disk rollback vs a full relaunch (bench/recover.py).
set -euo pipefail
exec /usr/bin/python3 "$(dirname "$0")/recover.py" "${1:-build}"

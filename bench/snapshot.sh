#!/usr/bin/env bash
# bench/snapshot.sh BUILD - snapshots at every step against none (bench/snapshot.py): rk-train
# at 64 MiB of state a rank on 4 ranks (the quick size for make bench; --sizes 64,512 and
# more by hand), and examples/torch_train.py --hidden 1024 when torch is there.
set -u
build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
/usr/bin/python3 "$here/snapshot.py" "$build" --sizes 64 --steps 10 --pairs 3 || exit 1
if /usr/bin/python3 -c 'import torch, sklearn' 2>/dev/null; then
  /usr/bin/python3 "$here/snapshot.py" "$build" --torch 1024 --steps 20 --pairs 3 || exit 1
else
  echo "snapshot: torch_train.py skipped: /usr/bin/python3 cannot import torch and sklearn"
fi

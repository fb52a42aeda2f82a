"""bench/resumed.py LOG T0 [WORLD] - the `resumed` events in the event logs LOG.* after T0
(ns since the epoch; of world WORLD when given): prints "T STEP N", the newest event's t_ns
and step, and how many there are ("0 -1 0" with none). Used by bench/grow.sh and
bench/grow_join.sh."""
import glob
import json
import sys

t0 = int(sys.argv[2])
world = int(sys.argv[3]) if len(sys.argv) > 3 else None
got = []
for path in glob.glob(sys.argv[1] + ".*"):
    with open(path) as f:
        for line in f:
            e = json.loads(line)
            if e.get("event") == "resumed" and e["t_ns"] > t0 and (world is None or e.get("world") == world):
                got.append((e["t_ns"], e["step"]))
print("%d %d %d" % (max(got) + (len(got),)) if got else "0 -1 0")

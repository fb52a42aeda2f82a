# bench/grow_hosts.sh - what bench/grow.sh and bench/grow_join.sh share, sourced by both
# after they set `build`, `here`, `name` (their name in messages) and RK_HOSTS_PREFIX /
# RK_HOSTS_NET (each its own, so that they never meet): skips (exit 0, with the reason)
# where namespaces cannot be made; else 3 hosts of scripts/hosts with one slot each and
# their hostfile in $work (removed, with the hosts, on exit), the MPI settings for them,
# bin, runs (RK_BENCH_GROW_RUNS, default 3), every (RK_BENCH_GROW_CKPT, default 100), py,
# and the helpers resumed_after and now_ns.
why=$("$here/scripts/hosts" check) || { echo "$name: not measured: $why"; exit 0; }
work=$(mktemp -d "${TMPDIR:-/tmp}/rekindle-bench-$name.XXXXXX") ||
  { echo "$name: cannot make a scratch directory under ${TMPDIR:-/tmp}" >&2; exit 2; }
trap '"$here/scripts/hosts" down; rm -rf "$work"' EXIT
"$here/scripts/hosts" up 3 "$work/hostfile" 1 > /dev/null
eval "$("$here/scripts/hosts" env)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
bin=$(cd "$build" && pwd)/bin
runs=${RK_BENCH_GROW_RUNS:-3} every=${RK_BENCH_GROW_CKPT:-100}
py=/usr/bin/python3
[[ -x $py ]] || py=python3

# "newest_t_ns step count" of the `resumed` events after $2 (ns) in the logs $1.* [of world $3].
resumed_after() { "$py" "$here/bench/resumed.py" "$@"; }
now_ns() { date +%s%N; }

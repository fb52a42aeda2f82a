#!/usr/bin/env bash
# bench/slurm.sh BUILD - a Rekindle job under a real Slurm (scripts/slurm: 3 network-namespace
# nodes, examples/slurm/train.sbatch, 6 workers): kill of a node -> training again (the
# last survivor's first "resumed" after the kill; RK_BENCH_SLURM_RUNS runs, default 10), and
# every node killed -> requeued by Slurm -> resumed from disk (RK_BENCH_SLURM_REQUEUES runs,
# default 3). Every run is judged against a replay as in make check (chaos/slurm). Root
# only; skipped (exit 0, with the reason) where the cluster cannot be made.
set -u
build=${1:-build}
here=$(cd "$(dirname "$0")/.." && pwd)
export RK_HOSTS_PREFIX=rkw RK_HOSTS_NET=10.83.0
why=$("$here/scripts/slurm" check) || { echo "slurm: not measured: $why"; exit 0; }
work=$(mktemp -d "${TMPDIR:-/tmp}/rekindle-bench-slurm.XXXXXX") || { echo "slurm: cannot make a work directory under ${TMPDIR:-/tmp}" >&2; exit 2; }
status=0
# The runs' outputs (job output, event logs, checkpoints) are kept when one failed.
trap '"$here/scripts/slurm" down; if [[ $status == 0 ]]; then rm -rf "$work"; else echo "slurm: outputs kept in $work"; fi' EXIT
echo "== node loss under Slurm: 3 nodes x 2 workers, node 3 killed (slurmd and every process on it)"
"$here/chaos/slurm" --build "$build" --out "$work/loss" --case node_loss --steps 1200 \
    --runs "${RK_BENCH_SLURM_RUNS:-10}" || status=1
echo "== every node killed: requeued by Slurm (--requeue), the nodes started again at once"
"$here/chaos/slurm" --build "$build" --out "$work/requeue" --case requeue --runs "${RK_BENCH_SLURM_REQUEUES:-3}" ||
    status=1
exit $status

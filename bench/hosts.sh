#!/usr/bin/env bash
# bench/hosts.sh BUILD - across hosts (scripts/hosts: network namespaces on a bridge, Open
# MPI over TCP): the ring's allreduce against MPI_Allreduce on the same 3 hosts (one rank
# per host, same job, bench_ring), then detection and kill -> training again after a host
# loss (chaos/run --hosts 3, host_loss, the latencies it prints). Root only; skipped
# (exit 0, with the reason) where namespaces cannot be made. RK_BENCH_RING_MAX bounds the
# sizes (default 67108864); RK_BENCH_HOST_RUNS the host-loss runs (default 4).
set -u
build=${1:-build}
here=$(cd "$(dirname "$0")/.." && pwd)
export RK_HOSTS_PREFIX=rkb RK_HOSTS_NET=10.80.0
why=$("$here/scripts/hosts" check) || { echo "hosts: not measured: $why"; exit 0; }
work=$(mktemp -d "${TMPDIR:-/tmp}/rekindle-bench-hosts.XXXXXX") || { echo "hosts: cannot make a work directory under ${TMPDIR:-/tmp}" >&2; exit 2; }
trap '"$here/scripts/hosts" down; rm -rf "$work"' EXIT
"$here/scripts/hosts" up 3 "$work/hostfile" 1
eval "$("$here/scripts/hosts" env)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
status=0
echo "== ring vs MPI_Allreduce, 3 hosts x 1 rank, TCP over a software bridge ($(nproc) cores shared)"
mpirun --hostfile "$work/hostfile" -n 3 "$(cd "$build" && pwd)/bench/bench_ring" "${RK_BENCH_RING_MAX:-67108864}" || status=1
"$here/scripts/hosts" down
echo "== host loss: 6 workers on 3 hosts, one host SIGKILLed whole (chaos/run)"
"$here/chaos/run" --build "$build" --out "$work/chaos" --workers 6 --hosts 3 --steps 200 --hidden 128 \
    --ckpt-every 20 --run-timeout 60 --no-install --runs "${RK_BENCH_HOST_RUNS:-4}" --seed 11 --faults host_loss |
    grep -E '^run |^chaos: (detect|recover|steps|[0-9]+ runs)' || status=1
exit $status

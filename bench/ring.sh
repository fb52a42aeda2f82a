#!/usr/bin/env bash
# bench/ring.sh BUILD - the allreduce ring against MPI_Allreduce (same job) and Gloo
# (torch.distributed, same sizes, run just after) on 2, 3 and 4 ranks, then the time
# from a member's death to the first exact allreduce on the rebuilt ring.
# RK_BENCH_RING_MAX (bytes, default 268435456) bounds the sizes; RK_BENCH_RING_RANKS (default
# "2 3 4") names the job sizes; RK_BENCH_PYTHON (default Debian's /usr/bin/python3, torch 1.13)
# the interpreter whose torch's Gloo is the peer (bench/peers/run: PyTorch 2.x).
set -u
build=${1:-build}
max=${RK_BENCH_RING_MAX:-268435456}
py=${RK_BENCH_PYTHON:-/usr/bin/python3}
here=$(cd "$(dirname "$0")" && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
mpi=(mpirun --oversubscribe --mca btl self,vader,tcp)
echo "machine: $(nproc) cores; every rank of a job shares them (bandwidth is memory-copy bound)"
"$py" -c 'import torch' 2>/dev/null && echo "gloo peer: torch $("$py" -c 'import torch; print(torch.__version__)') ($py)"
status=0
for n in ${RK_BENCH_RING_RANKS:-2 3 4}; do
  out=$("${mpi[@]}" -n "$n" "$build/bench/bench_ring" "$max" 2>&1) || status=1
  echo "$out"
  if "$py" -c 'import torch.distributed' 2>/dev/null; then
    gloo=$("$py" "$here/ring_gloo.py" "$n" "$max" 2>/dev/null | grep '^gloo') || status=1
    echo "$gloo"
    # ring vs gloo, by size
    join -1 1 -2 1 <(awk '$3 ~ /^[0-9]+$/ {print $3, $6}' <<<"$out" | sort) \
                   <(awk '{print $5, $9}' <<<"$gloo" | sort) | sort -n |
      awk -v n="$n" '{printf "ranks %d  %10d bytes  ring %.3f GB/s  gloo %.3f GB/s  ring/gloo %.2f\n", n, $1, $2, $3, $2/$3}'
  else
    echo "gloo: $py cannot import torch.distributed (apt-get install -y python3-torch): no Gloo comparison"
  fi
done
echo "== death to rebuilt ring (4 ranks, one SIGKILLed mid-call, detection by a /proc oracle polled every 2 ms)"
if [[ -x "$build/tests/prog_ring" ]]; then
  "${mpi[@]}" -n 4 --enable-recovery --mca orte_abort_on_non_zero_status 0 \
    "$build/tests/prog_ring" kill 1 0 1 2>/dev/null | grep '^ok' || status=1
else
  echo "not measured: $build/tests/prog_ring is not built (make build-tests)"
fi
exit $status

#!/usr/bin/env bash
# bench/ring_nccl.sh BUILD - the NCCL ring on GPU ranks (docs/GPU.md), 4 ranks sharing
# device 0 under mpirun:
#  1. bench/bench_ring_nccl: rk_allreduce of a device buffer against a bare ncclAllReduce
#     on a communicator of the same ranks, same run, 1-256 MiB f32 (rekindle/bare time per
#     size; sizes past its budget are reported not run);
#  2. a rank killed inside an allreduce (tests/prog_ring_nccl inside 2): the survivors'
#     call returns, the communicator is revoked and shrunk (NCCL >= 2.28), and the next
#     allreduce is exact; the same with RK_NCCL_REVOKE=0 (aborted, a fresh one made: the
#     way before ncclCommRevoke); and a rank killed between calls (between 1): the
#     communicator shrunk. The slowest survivor's times in ms from the death: returned,
#     stop (detection to return: the revoke or the abort), rebuild (MPI ring + agreement
#     + NCCL), first exact allreduce.
# The last line sums it all up. Without a GPU, or in a build without CUDA + NCCL, it says
# `ring_nccl: skipped: <why>` and exits 0. Bounded (at most ~90 s, inside the 100 s
# scripts/gpu-check gives a benchmark): the bandwidth part by RK_BENCH_NCCL_BUDGET_S
# (default 25 s, then killed 15 s later), each kill run by 20 s; stopped from outside
# (SIGTERM) it still prints its last line with what it has.
# RK_BENCH_NCCL_RANKS (default 4) and RK_BENCH_NCCL_MAX (bytes, default 268435456).
set -uo pipefail
build=${1:-build}
bin="$build/bench/bench_ring_nccl"
prog="$build/tests/prog_ring_nccl"
n=${RK_BENCH_NCCL_RANKS:-4}
max=${RK_BENCH_NCCL_MAX:-268435456}
budget=${RK_BENCH_NCCL_BUDGET_S:-25}
if [[ ! -x $bin ]]; then
  echo "ring_nccl: skipped: $bin is not built (a build without CUDA + NCCL)"
  exit 0
fi
probe=$("$bin" --probe 2>&1)
if [[ $? -ne 0 ]]; then
  echo "ring_nccl: skipped: ${probe:-the probe failed}"
  exit 0
fi
echo "$probe"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
mpi=(mpirun -n "$n" --oversubscribe --allow-run-as-root --mca btl self,vader,tcp
     --mca btl_vader_single_copy_mechanism none)
status=0
bw="bandwidth not measured" kills="kills not run"
trap 'echo "ring_nccl: stopped from outside: $bw; $kills"; exit 1' TERM INT

echo "== rk_allreduce (NCCL ring) against a bare ncclAllReduce, $n ranks"
out=$(timeout --kill-after=5 $((budget + 15)) "${mpi[@]}" "$bin" "$max" "$budget" 2>&1)
rc=$?
echo "$out"
last=$(grep '^ring_nccl: [0-9]* ranks, rekindle/bare time:' <<<"$out" | tail -n 1)
if [[ $rc -ne 0 || -z $last ]]; then
  status=1
  bw="bandwidth FAILED (exit $rc: $(grep -m1 -E 'FAILED|rror' <<<"$out" | cut -c1-160))"
else
  bw=${last#ring_nccl: }
fi
if grep -q 'pinned host staging' <<<"$out"; then
  status=1
  bw="$bw, but rekindle went through host staging, not NCCL ($(grep -m1 'pinned host staging' <<<"$out" | sed 's/.*(//; s/)$//'))"
fi

# kill MODE VICTIM [LABEL MPIRUN-ARGS...]: the prog's ok/FAIL lines, then one line of the
# slowest survivor's times.
kill_run() {
  local res rc mode=$1 victim=$2 label=${3:-}
  shift 2
  [[ $# -gt 0 ]] && shift
  echo "== prog_ring_nccl $mode $victim ($n ranks${label:+, $label})"
  res=$(timeout --kill-after=5 20 "${mpi[@]}" --enable-recovery --mca orte_abort_on_non_zero_status 0 "$@" \
        "$prog" "$mode" "$victim" 2>&1)
  rc=$?
  grep -E '^(ok|FAIL)' <<<"$res"
  awk -v mode="$mode" -v rc="$rc" -v label="${label:+ ($label)}" '
    /^ok (fresh|shrunk) / {
      k++; how = $2
      for (i = 1; i <= NF; i++)
        if (split($i, kv, "=") == 2 && (!(kv[1] in m) || kv[2] + 0 > m[kv[1]] + 0)) m[kv[1]] = kv[2]
    }
    /^FAIL/ { bad = 1 }
    END {
      if (bad || k == 0) { printf "kill %s%s: FAILED (exit %d)\n", mode, label, rc; exit 1 }
      if (mode == "inside")
        printf "kill inside a call%s: %d survivors returned in %.1f ms (stop %.1f), %s ring in %.1f ms, exact again in %.1f ms\n",
               label, k, m["returned_ms"], m["abort_ms"], how, m["rebuild_ms"], m["first_ms"]
      else
        printf "kill between calls: detected in %.1f ms, %s ring in %.1f ms (NCCL %.1f), exact again in %.1f ms\n",
               m["detect_ms"], how, m["rebuild_ms"], m["nccl_ms"], m["first_ms"]
    }' <<<"$res"
}
if [[ -x $prog ]]; then
  inside=$(kill_run inside 2 revoke) || status=1
  echo "$inside"
  kills=$(tail -n 1 <<<"$inside")
  aborted=$(kill_run inside 2 "RK_NCCL_REVOKE=0" -x RK_NCCL_REVOKE=0) || status=1
  echo "$aborted"
  kills="$kills; $(tail -n 1 <<<"$aborted")"
  between=$(kill_run between 1) || status=1
  echo "$between"
  kills="$kills; $(tail -n 1 <<<"$between")"
else
  kills="kill runs not run: $prog is not built (make build-tests)"
  status=1
fi
echo "ring_nccl: $bw; $kills"
exit $status

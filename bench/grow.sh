#!/usr/bin/env bash
# bench/grow.sh BUILD - a job growing when a host becomes available, on 3 hosts made by
# scripts/hosts (network namespaces, Open MPI over TCP; one slot each): rk-train on 2 hosts
# under `rekindle run --host-discovery-script`, checkpoints every RK_BENCH_GROW_CKPT (100)
# steps; once checkpoint 200 is committed the script lists the third host (and
# RK_RUN_DIR/grow is touched): the time from then until every worker of the grown job has
# resumed (their `resumed` events), against the relaunch it is made of: the same job stopped
# at the same point and launched again by hand on 3 hosts from its checkpoint (stop ->
# every worker resumed). Growth = the wait for the next checkpoint + that relaunch.
# RK_BENCH_GROW_RUNS runs of each (default 3). Root only; skipped (exit 0, with the reason)
# where namespaces cannot be made.
set -u
build=${1:-build}
here=$(cd "$(dirname "$0")/.." && pwd)
export RK_HOSTS_PREFIX=rkg RK_HOSTS_NET=10.81.0
name=grow
source "$here/bench/grow_hosts.sh"
head -n 2 "$work/hostfile" > "$work/hostfile2"
args=(--steps 3000 --hidden 64)
wait_ckpt() { for _ in $(seq 1200); do [[ -d $1/step-000000000200 ]] && return 0; sleep 0.02; done; return 1; }

grow=() relaunch=() status=0
for i in $(seq "$runs"); do
  d=$work/g$i
  mkdir -p "$d"
  printf 'rkg1:1\nrkg2:1\n' > "$d/hosts"
  RK_RUN_DIR=$d/run RK_CKPT_DIR=$d/c RK_CKPT_EVERY=$every RK_EVENT_LOG=$d/ev RK_KEEP=100 \
    "$bin/rekindle" run --host-discovery-script "cat $d/hosts" --discovery-interval 0.5 --max-np 3 -- \
    "$bin/rk-train" "${args[@]}" --seed "$i" > "$d/out" 2> "$d/err" &
  job=$!
  wait_ckpt "$d/c" || { echo "grow: run $i: no checkpoint 200"; status=1; kill $job; wait $job; continue; }
  t0=$(now_ns)
  printf 'rkg1:1\nrkg2:1\nrkg3:1\n' > "$d/hosts"
  touch "$d/run/grow"
  wait $job
  read -r t1 step n <<<"$(resumed_after "$d/ev" "$t0")"
  if [[ $n -ne 3 ]] || ! grep -q 'world=3' "$d/out"; then
    echo "grow: run $i: the job did not grow to 3 (resumed events: $n)"; tail -5 "$d/err"; status=1; continue
  fi
  ms=$(( (t1 - t0) / 1000000 ))
  grow+=("$ms")
  echo "grow: run $i: host listed -> 3 workers training in $ms ms (resumed at step $step; checkpoints every $every steps)"

  # The same job, stopped by hand where the growth began and launched again on 3 hosts.
  r=$work/r$i
  mkdir -p "$r"
  RK_RUN_DIR=$r/run RK_CKPT_DIR=$r/c RK_CKPT_EVERY=$every RK_EVENT_LOG=$r/ev RK_KEEP=100 \
    "$bin/rekindle" run -n 2 --hostfile "$work/hostfile2" -- "$bin/rk-train" "${args[@]}" --seed "$i" \
    > "$r/out" 2> "$r/err" &
  job=$!
  wait_ckpt "$r/c" || { echo "grow: run $i: the relaunch's first job made no checkpoint 200"; status=1; kill $job; wait $job; continue; }
  t0=$(now_ns)
  kill -TERM $job
  wait $job
  RK_RUN_DIR=$r/run2 RK_CKPT_DIR=$r/c RK_CKPT_EVERY=$every RK_EVENT_LOG=$r/ev RK_KEEP=100 \
    "$bin/rekindle" run -n 3 --hostfile "$work/hostfile" -- "$bin/rk-train" "${args[@]}" --seed "$i" > "$r/out2" 2>&1
  read -r t1 step n <<<"$(resumed_after "$r/ev" "$t0")"
  [[ $n -eq 3 ]] || { echo "grow: run $i: the relaunch did not resume 3 workers"; status=1; continue; }
  ms=$(( (t1 - t0) / 1000000 ))
  relaunch+=("$ms")
  echo "grow: run $i: stop -> relaunch on 3 hosts -> 3 workers training in $ms ms (resumed at step $step)"
done
p50() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]; else print "-"}'; }
echo "grow: 3 hosts, one slot each, $(nproc) cores: host listed -> training on 3, p50 $(p50 "${grow[@]}") ms" \
     "(${#grow[@]} runs); stop + relaunch from disk on 3 by hand, p50 $(p50 "${relaunch[@]}") ms (${#relaunch[@]} runs)"
exit $status

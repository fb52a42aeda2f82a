#!/usr/bin/env bash
# bench/grow_join.sh BUILD - a job growing back onto a host listed again, in place against
# by a relaunch, on 3 hosts made by scripts/hosts (network namespaces, Open MPI over TCP,
# one slot each): rk-train on 3 under `rekindle run --host-discovery-script`; once
# checkpoint 200 is committed the trainer on the third host is SIGKILLed and the host taken
# off the list (its scheduler found it unhealthy); once the two survivors resumed, the host
# is listed again (and RK_RUN_DIR/grow touched): the time from then until every worker of
# the grown job has resumed (their `resumed` events), with `--grow inplace` (a worker
# started on the host joins the two while they train, from their memory) and with `--grow
# relaunch` (the job stopped at its next checkpoint and launched again on 3), alternating,
# RK_BENCH_GROW_RUNS runs of each (default 3); and whether the survivors kept their
# processes. Root only; skipped (exit 0, with the reason) where namespaces cannot be made.
# RK_BENCH_GROW_PROG=torch runs the PyTorch example instead (examples/horovod_style.py,
# rekindle.elastic over this build's library; every newcomer imports torch before it joins).
set -u
build=${1:-build}
here=$(cd "$(dirname "$0")/.." && pwd)
export RK_HOSTS_PREFIX=rkj RK_HOSTS_NET=10.84.0
name=grow_join
source "$here/bench/grow_hosts.sh"
prog=${RK_BENCH_GROW_PROG:-rk-train}
case $prog in
  rk-train) cmd=("$bin/rk-train" --steps 8000 --hidden 64) comm=rk-train ;;
  torch)
    "$py" -c 'import torch' 2>/dev/null || { echo "$name: not measured: no torch for $py"; exit 0; }
    export PYTHONPATH=$here/python${PYTHONPATH:+:$PYTHONPATH} REKINDLE_LIB=$(cd "$build" && pwd)/lib/librekindle.so.1
    cmd=("$py" "$here/examples/horovod_style.py" --steps 20000 --epochs 100000) comm=python3 ;;
  *) echo "$name: RK_BENCH_GROW_PROG is rk-train or torch, not '$prog'" >&2; exit 2 ;;
esac
wait_for() { for _ in $(seq 1500); do eval "$1" && return 0; sleep 0.02; done; return 1; }
# The pids of the trainer in host $1's namespace.
trainers() { for p in $(ip netns pids "$1" 2>/dev/null); do [[ $(cat /proc/$p/comm 2>/dev/null) == "$comm" ]] && echo "$p"; done; }

inplace=() relaunch=() kept=() status=0
for i in $(seq "$runs"); do
  for how in inplace relaunch; do
    d=$work/$how$i
    mkdir -p "$d"
    printf 'rkj1:1\nrkj2:1\nrkj3:1\n' > "$d/hosts"
    RK_RUN_DIR=$d/run RK_CKPT_DIR=$d/c RK_CKPT_EVERY=$every RK_EVENT_LOG=$d/ev RK_KEEP=100 \
      "$bin/rekindle" run --host-discovery-script "cat $d/hosts" --discovery-interval 0.5 --blacklist-cooldown 0.2 \
      --grow "$how" -- "${cmd[@]}" --seed "$i" > "$d/out" 2> "$d/err" &
    job=$!
    if ! wait_for "[[ -d $d/c/step-000000000200 ]]"; then
      echo "grow_join: $how run $i: no checkpoint 200"; status=1; kill $job; wait $job; continue
    fi
    survivors="$(trainers rkj1) $(trainers rkj2)"
    printf 'rkj1:1\nrkj2:1\n' > "$d/hosts"
    tk=$(now_ns)
    kill -9 $(trainers rkj3)
    if ! wait_for "[[ \$(resumed_after $d/ev $tk 2 | cut -d' ' -f3) -ge 2 ]]"; then
      echo "grow_join: $how run $i: the two did not go on"; status=1; kill $job; wait $job; continue
    fi
    t0=$(now_ns)
    printf 'rkj1:1\nrkj2:1\nrkj3:1\n' > "$d/hosts"
    touch "$d/run/grow"
    wait_for "[[ \$(resumed_after $d/ev $t0 3 | cut -d' ' -f3) -ge 3 ]]"
    read -r t1 step n <<<"$(resumed_after "$d/ev" "$t0" 3)"
    alive=0
    for p in $survivors; do kill -0 "$p" 2>/dev/null && alive=$((alive + 1)); done
    wait $job
    if [[ $n -lt 3 ]]; then
      echo "grow_join: $how run $i: the job did not grow back to 3 (resumed events: $n)"; tail -5 "$d/err"; status=1
      continue
    fi
    ms=$(( (t1 - t0) / 1000000 ))
    if [[ $how == inplace ]]; then inplace+=("$ms"); kept+=("$alive"); else relaunch+=("$ms"); fi
    echo "grow_join: $how run $i: host listed -> 3 workers training in $ms ms (resumed at step $step;" \
         "survivors' processes kept: $alive of 2)"
    grep -h 'rekindle: run: \(grow\|grown\|checkpoint\|launching again\)' "$d/err" | sed 's/^/    /'
  done
done
p50() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]; else print "-"}'; }
ip50=$(p50 "${inplace[@]}") rp50=$(p50 "${relaunch[@]}")
ratio=$(awk -v a="$ip50" -v b="$rp50" 'BEGIN { if (a > 0 && b > 0) printf "%.1fx", b / a; else print "-" }')
echo "grow_join: $prog, 3 hosts, one slot each, $(nproc) cores: host listed again -> training on 3: in place p50 $ip50 ms" \
     "(${#inplace[@]} runs, $(printf '%s ' "${inplace[@]}")ms), by a relaunch p50 $rp50 ms (${#relaunch[@]} runs," \
     "$(printf '%s ' "${relaunch[@]}")ms): in place $ratio faster"
exit $status

#!/bin/sh
# chaos/worker.sh PROGRAM [ARGS...] - what `rekindle run` starts on each worker in a chaos
# run: keeps a scheduled checkpoint I/O fault (RK_FAULT, RK_FAULT_PATH) only on the rank
# and launch attempt the schedule chose, then becomes PROGRAM (exec: same pid, so the
# harness sees and signals the trainer itself).
#   CHAOS_FAULT_RANK     rank at start (or slot) that keeps RK_FAULT (unset: every rank)
#   CHAOS_FAULT_ATTEMPT  launch attempt (RK_RUN_ATTEMPT) that keeps it (unset: every one)
# A "%r" in RK_FAULT_HOLD becomes the rank at start: each rank's hang is released apart.
# Rank 0 first prints 'chaos-attempt N' (N = RK_RUN_ATTEMPT): the harness counts only the
# final lines of the last attempt, since workers killed after their final line (while
# shutting down) make `rekindle run` relaunch a job that had finished.
# A worker started while the job runs (a growth in place) is rank 0 of its own world: its
# rank in the job is its slot, RK_RUN_SLOT.
rank=${RK_RUN_SLOT:-${OMPI_COMM_WORLD_RANK:-}}
if [ -n "${CHAOS_FAULT_RANK:-}" ] && [ "$rank" != "$CHAOS_FAULT_RANK" ]; then
    unset RK_FAULT RK_FAULT_PATH
fi
if [ -n "${CHAOS_FAULT_ATTEMPT:-}" ] && [ "${RK_RUN_ATTEMPT:-0}" != "$CHAOS_FAULT_ATTEMPT" ]; then
    unset RK_FAULT RK_FAULT_PATH
fi
case "${RK_FAULT_HOLD:-}" in
*%r*) RK_FAULT_HOLD=$(printf '%s' "$RK_FAULT_HOLD" | sed "s/%r/${rank:-0}/g"); export RK_FAULT_HOLD ;;
esac
if [ "${rank:-0}" = 0 ]; then
    echo "chaos-attempt ${RK_RUN_ATTEMPT:-0}"
fi
exec "$@"

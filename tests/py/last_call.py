"""tests/py/last_call.py - examples/torch_train.py (its arguments follow) in which rank 1
of a world of 4 SIGKILLs itself as the final hash starts, so that the others lose a
member in the job's last collective (the gather of the sharded moments, --zero). Run by
tests/py/job_check.py (mode last): the survivors must go back to their loop at the step
the recovery names and end normally, as after a loss anywhere else.
"""
import os
import runpy
import signal
import sys

import rekindle

TRAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "torch_train.py")
state_hash = rekindle.Context.state_hash


def dying_state_hash(self):
    if self.world == 4 and self.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return state_hash(self)


rekindle.Context.state_hash = dying_state_hash
sys.argv = [TRAIN] + sys.argv[1:]
runpy.run_path(TRAIN, run_name="__main__")

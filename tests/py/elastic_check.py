"""tests/py/elastic_check.py - rekindle.elastic (Horovod Elastic's API) on a real job: run
by tests/py/job_check.py (mode elastic) under `rekindle run -n 3` with RK_CKPT_DIR set.

Every rank starts from other weights and other scalars (its own seed, values from its
launch rank). The worker of launch rank 2 SIGKILLs itself right after its 5th commit. The
two survivors check, and print "elastic_check rank R: ok: ..." only if all hold:
  - before run(): bad scalars and replaced objects are refused, commit() outside run() and
    restore() raise the documented errors, scalars read back with their type;
  - the first call of the run() function sees rank 0's state on every rank (sync);
  - after the loss, the function is called again once, after the reset callbacks ran
    once (with the new size), with the scalars, the weights and SGD's momentum bitwise as
    they were at the commit the job rolled back to; a scalar changed after that commit
    (`dirty`) is back at its committed value;
  - both survivors end with the same state; an explicit sync() makes a changed state rank
    0's again; an error raised inside a run() function propagates at once (no retry, no
    reset).
"""
import os
import signal
import sys

import torch
import torch.nn as nn

import rekindle
import rekindle.elastic as elastic

LAUNCH = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
KILLER, KILL_AFTER, STEPS = 2, 5, 12


def check(cond, what):
    if not cond:
        sys.stdout.write("elastic_check rank %d: FAILED: %s\n" % (LAUNCH, what))
        sys.stdout.flush()
        os._exit(1)


def raises(kind, fn, name=None):
    try:
        fn()
    except kind as e:
        return name is None or e.name == name
    return False


check(raises(rekindle.Error, elastic.rank, "RK_E_STATE"), "rank() before init() is not RK_E_STATE")
ctx = elastic.init()
check(elastic.context() is ctx and elastic.init() is ctx, "init() twice made another context")
torch.manual_seed(LAUNCH)  # other initial weights on every rank: sync() must make them rank 0's
torch.set_num_threads(1)
model = nn.Linear(4, 3)
opt = elastic.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))

registered = len(ctx._reg)
check(raises(TypeError, lambda: elastic.TorchState(model, opt, img_secs=[])), "a list scalar was accepted")
check(raises(TypeError, lambda: elastic.TorchState(model, opt, commit=1)), "a scalar named like a method")
check(len(ctx._reg) == registered, "a refused TorchState registered tensors")
state = elastic.TorchState(model, opt, epoch=10 * LAUNCH, scale=0.5 * LAUNCH, warm=LAUNCH > 0, dirty=0)
check((state.epoch, state.scale, state.warm) == (10 * LAUNCH, 0.5 * LAUNCH, LAUNCH > 0) and
      type(state.epoch) is int and type(state.scale) is float and type(state.warm) is bool,
      "scalars read back as %r" % ((state.epoch, state.scale, state.warm),))
check(raises(TypeError, lambda: setattr(state, "epoch", "x")), "a str into an int scalar")
check(raises(TypeError, lambda: setattr(state, "warm", 1)), "an int into a bool scalar")
check(raises(AttributeError, lambda: setattr(state, "model", nn.Linear(4, 3))), "the model was replaced")
check(raises(rekindle.Error, state.commit, "RK_E_STATE"), "commit() before run() is not RK_E_STATE")
check(raises(rekindle.Error, state.restore, "RK_E_NOTAVAIL"), "restore() is not RK_E_NOTAVAIL")

resets, calls, committed = [], [], {}
state.register_reset_callbacks([lambda: resets.append(elastic.size())])


def params_now():
    out = [p.detach().clone() for p in model.parameters()]
    out += [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    return out


def same_everywhere():
    """Every rank's whole registered state hashes the same (max and min over the ring)."""
    h = int(ctx.state_hash(), 16)
    h -= (h >> 63) << 64  # as a signed int64
    hi, lo = torch.tensor([h]), torch.tensor([h])
    ctx.allreduce(hi, "max")
    ctx.allreduce(lo, "min")
    return hi.item() == lo.item()


@elastic.run
def train(state):
    calls.append(ctx.next_step)
    if len(calls) == 1:
        check((state.epoch, state.scale, state.warm) == (0, 0.0, False),
              "the first call sees %r, not rank 0's scalars" % ((state.epoch, state.scale, state.warm),))
        check(same_everywhere(), "the ranks' states differ at the first call (sync)")
    else:
        r = ctx.next_step
        check(resets == [2] * (len(calls) - 1), "reset callbacks ran %r before call %d" % (resets, len(calls)))
        check(r in committed, "rolled back to step %d, never committed" % r)
        epoch, saved = committed[r]
        check(state.epoch == epoch and state.dirty == 0,
              "after the rollback to step %d: epoch %d dirty %d, committed %d and 0" % (
                  r, state.epoch, state.dirty, epoch))
        check(all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(params_now(), saved)),
              "weights or momentum differ from their commit at step %d" % r)
    while state.epoch < STEPS:
        x = torch.full((2, 4), float(state.epoch + LAUNCH))  # each rank its own batch
        state.optimizer.zero_grad()
        state.model(x).pow(2).sum().backward()
        state.optimizer.step()  # the gradients averaged first (DistributedOptimizer)
        state.epoch += 1
        state.dirty = 0
        # Noted before the call: a loss declared while commit() runs may be seen after its
        # snapshot was taken, and commit() then raises with the job rolled back to this
        # very commit (rk_step_done: the snapshot kept, the recovery after it).
        committed[ctx.next_step + 1] = (state.epoch, params_now())
        state.commit()
        if LAUNCH == KILLER and state.epoch == KILL_AFTER:
            os.kill(os.getpid(), signal.SIGKILL)
        state.dirty = 1  # uncommitted: a rollback must undo it
    return state.epoch


check(train(state) == STEPS, "train() did not return its value")
check(len(calls) == 2 and resets == [2], "calls at steps %r, resets %r: want 2 calls, one reset" % (calls, resets))
check(same_everywhere(), "the survivors' states differ at the end")
rolled_back_to = calls[1]

state.scale = 1.0 + 3 * elastic.rank()
with torch.no_grad():
    model.weight.add_(elastic.rank())
state.sync()
check(state.scale == 1.0 and same_everywhere(), "sync() did not give every rank rank 0's state")

tries = []


@elastic.run
def failing(state, exc):
    tries.append(1)
    raise exc


check(raises(rekindle.Error, lambda: failing(state, rekindle.Error(rekindle.RK_E_MIN_WORLD, "stop")),
             "RK_E_MIN_WORLD") and raises(ValueError, lambda: failing(state, ValueError())),
      "an error inside a run() function did not propagate")
check(tries == [1, 1] and resets == [2], "an error was retried (%d calls) or reset" % len(tries))
sys.stdout.write("elastic_check rank %d: ok: rolled back to step %d, one reset, the same state on %d ranks\n" % (
    LAUNCH, rolled_back_to, elastic.size()))
sys.stdout.flush()
elastic.shutdown()

#!/usr/bin/env python3
"""bench/walk/count.py TRACE... - the walk of a recovery through the code, from bench/walk/trace.c's
records: on the thread that ran it, every move of control (a call or a return) from a
function of one source file to a function of another, between entering ROOT (default
rec_recover) and leaving it, counted per pair of files and per pair of parts (ckpt/,
recover/, ring/ ...). Prints the walk of the first trace holding ROOT, then the counts."""
import collections, os, subprocess, sys

ROOT = os.environ.get("RK_WALK_ROOT", "rec_recover")


def resolve(mod, offs):
    """offset -> (function, source file relative to the tree) with addr2line."""
    offs = sorted(offs)
    out = subprocess.run(["addr2line", "-f", "-e", mod] + [hex(o) for o in offs],
                         capture_output=True, text=True, check=True).stdout.split("\n")
    res = {}
    top = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    for i, o in enumerate(offs):
        fn, loc = out[2 * i], out[2 * i + 1].split(":")[0]
        loc = os.path.relpath(os.path.abspath(loc), top) if loc.startswith("/") else loc
        res[o] = (fn, loc)
    return res


def main(paths):
    for path in paths:
        threads, cur = [], None
        for line in open(path):
            if line.startswith("thread"):
                cur = []
                threads.append(cur)
            elif line.startswith("<"):
                cur.append(None)
            else:
                _, mod, off = line.split()
                cur.append((mod, int(off, 16)))
        want = collections.defaultdict(set)
        for t in threads:
            for e in t:
                if e:
                    want[e[0]].add(e[1])
        names = {}
        for mod, offs in want.items():
            if mod != "?":
                for o, v in resolve(mod, offs).items():
                    names[(mod, o)] = v
        for t in threads:
            stack, walk, on = [], [], False
            for e in t:
                if e is not None:
                    fn, src = names.get(e, ("?", "?"))
                    if not on and fn == ROOT:
                        on, depth = True, len(stack)
                    stack.append((fn, src))
                    if on:
                        walk.append(stack[-1])
                else:
                    if stack:
                        stack.pop()
                    if on:
                        if len(stack) == depth:
                            break
                        walk.append(stack[-1])
            if not on:
                continue
            # A move: control passing between functions of two files (a call or its
            # return). An edge: one caller -> callee pair, counted once however often the
            # loops around it take it (what a reader follows: the call graph's walk).
            moves, parts, seq = collections.Counter(), collections.Counter(), []
            edges, pedges, seen = collections.Counter(), collections.Counter(), set()
            for a, b in zip(walk, walk[1:]):
                if a[1] != b[1]:
                    k = tuple(sorted((a[1], b[1])))
                    moves[k] += 1
                    seq.append(f"{a[1]}:{a[0]} -> {b[1]}:{b[0]}")
                    pa, pb = a[1].split("/")[0], b[1].split("/")[0]
                    pk = tuple(sorted((pa, pb)))
                    if pa != pb:
                        parts[pk] += 1
                    e = tuple(sorted((a, b)))
                    if e not in seen:
                        seen.add(e)
                        edges[k] += 1
                        if pa != pb:
                            pedges[pk] += 1
            print(f"# {path}: {ROOT}, {len(walk)} steps of control, {sum(moves.values())} moves between files "
                  f"over {sum(edges.values())} distinct call edges")
            if os.environ.get("RK_WALK_SEQ"):
                print("\n".join(seq))
            for title, counts in (("call edges between parts (each once)", pedges),
                                  ("call edges between files (each once)", edges),
                                  ("moves between parts (every call and return)", parts),
                                  ("moves between files (every call and return)", moves)):
                print(title + ":")
                for k, v in counts.most_common():
                    print(f"  {v:4d}  {k[0]} <-> {k[1]}")
            return 0
    print(f"no trace holds {ROOT}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""fuzz/mkseeds.py STEPDIR... OUT_CKPT OUT_TEXT - the seed corpora of fuzz_ckpt and
fuzz_text from real committed checkpoints (written by tests/prog_ckpt and
fuzz/ckpt_seeds in `make fuzz`).

fuzz_ckpt: each step directory packed as the target reads it (fuzz/fuzz_ckpt.c: ops
[file id | 8 for zeros][u32 length][bytes]; runs of 256 or more zero bytes as a zeros op),
as is and in the harness's fix-up mode, and once turned into a format-1 checkpoint (no
commit.ok, "rekindle-manifest 1" without its `file` line; fix-up mode closes it).
fuzz_text: every manifest and commit record, raw (mode 0) and without its end line
(mode 1: the harness closes it)."""
import os
import re
import struct
import sys

NAMES = ["index.h5", "commit.ok", "shard-0.ok", "shard-0.h5", "shard-1.ok", "shard-1.h5",
         "shard-2.ok", "shard-2.h5"]


def pack_file(fid, data):
    out, at = bytearray(struct.pack("<BI", fid, 0)), 0
    for run in re.finditer(b"\x00{256,}", data):
        out += struct.pack("<BI", fid, run.start() - at) + data[at:run.start()]
        out += struct.pack("<BI", fid | 8, run.end() - run.start())
        at = run.end()
    out += struct.pack("<BI", fid, len(data) - at) + data[at:]
    return bytes(out)


def strip_end(text):
    lines = text.split(b"\n")
    if len(lines) >= 2 and lines[-2].startswith(b"end "):
        return b"\n".join(lines[:-2]) + b"\n"
    return text


def main():
    *steps, out_ckpt, out_text = sys.argv[1:]
    os.makedirs(out_ckpt, exist_ok=True)
    os.makedirs(out_text, exist_ok=True)
    for s, step in enumerate(steps):
        files = {}
        for fid, name in enumerate(NAMES):
            p = os.path.join(step, name)
            if os.path.exists(p):
                files[fid] = open(p, "rb").read()
        body = b"".join(pack_file(fid, d) for fid, d in sorted(files.items()))
        for mode in (0, 1):
            open(os.path.join(out_ckpt, "seed-%d-%d" % (s, mode)), "wb").write(bytes([mode]) + body)
        legacy = dict(files)
        legacy.pop(1, None)
        for fid in (2, 4, 6):
            if fid in legacy:
                t = legacy[fid].replace(b"rekindle-manifest 2\n", b"rekindle-manifest 1\n", 1)
                t = b"\n".join(l for l in t.split(b"\n") if not l.startswith(b"file "))
                legacy[fid] = t
        body = b"".join(pack_file(fid, d) for fid, d in sorted(legacy.items()))
        open(os.path.join(out_ckpt, "seed-%d-legacy" % s), "wb").write(b"\x01" + body)
        for fid in (1, 2, 4, 6):
            if fid in files:
                open(os.path.join(out_text, "seed-%d-%d-0" % (s, fid)), "wb").write(b"\x00" + files[fid])
                open(os.path.join(out_text, "seed-%d-%d-1" % (s, fid)), "wb").write(b"\x01" + strip_end(files[fid]))


if __name__ == "__main__":
    main()

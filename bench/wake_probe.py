"""bench/wake_probe.py [SECONDS] [ADDR] - how late a sleeping process wakes on this machine,
apart from Rekindle (bench/det_load.sh runs it beside its load, at normal priority and under
`chrt -r 1`): a child sends a UDP datagram every 20 ms to its parent, which waits for them
in select(); prints the sender's worst lateness against its schedule and the receiver's
worst gap between arrivals (20 ms when nothing is late) as one line:
  wake_probe: worst wake 176.4 ms, worst gap 217.0 ms (30 s, 1500 datagrams)"""
import os
import select
import socket
import struct
import sys
import time

SECONDS = float(sys.argv[1]) if len(sys.argv) > 1 else 20.0
ADDR = sys.argv[2] if len(sys.argv) > 2 else "127.0.0.1"
PERIOD = 0.02

rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
rx.bind((ADDR, 0))
port = rx.getsockname()[1]
r_fd, w_fd = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r_fd)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    worst, due, end = 0.0, time.monotonic(), time.monotonic() + SECONDS
    while due < end:
        now = time.monotonic()
        worst = max(worst, now - due)
        tx.sendto(struct.pack("d", now), (ADDR, port))
        due += PERIOD
        left = due - time.monotonic()
        if left > 0:
            time.sleep(left)
    os.write(w_fd, struct.pack("d", worst))
    os._exit(0)
os.close(w_fd)
gap, n, last, end = 0.0, 0, time.monotonic(), time.monotonic() + SECONDS + 0.5
while time.monotonic() < end:
    ready, _, _ = select.select([rx], [], [], 0.05)
    if ready:
        rx.recv(64)
        now = time.monotonic()
        gap, n, last = max(gap, now - last), n + 1, now
os.waitpid(pid, 0)
data = os.read(r_fd, 8)
wake = struct.unpack("d", data)[0] if len(data) == 8 else float("nan")
print("wake_probe: worst wake %.1f ms, worst gap %.1f ms (%.0f s, %d datagrams)" % (wake * 1e3, gap * 1e3, SECONDS, n))

"""The raw loopback TCP copy the activation hops are compared with: a sender and a receiver process,
each pinned to one core (as the two stages are), move `size` bytes `reps` times; a repetition is
timed by the sender from its first byte to the receiver's 1-byte ack after the last byte, and the
best repetition gives the rate. With busy=True a spinning process is pinned to each of the two cores
for the duration, the way a stage's compute thread shares its core with its network threads."""
import multiprocessing as mp
import os
import socket
import subprocess
import time


def _receiver(port_q, cpu, size, reps):
    os.sched_setaffinity(0, {cpu})
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port_q.put(srv.getsockname()[1])
    conn, _ = srv.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = memoryview(bytearray(size))
    for _ in range(reps):
        got = 0
        while got < size:
            n = conn.recv_into(buf[got:], size - got)
            if n == 0:
                return
            got += n
        conn.sendall(b"k")
    conn.close()
    srv.close()


def _sender(port, cpu, size, reps, res_q):
    os.sched_setaffinity(0, {cpu})
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload = os.urandom(size)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        s.sendall(payload)
        if s.recv(1) != b"k":
            break
        times.append(time.perf_counter() - t0)
    s.close()
    res_q.put(times)


def copy_rate(size, reps, cpus, busy=False):
    """{"best_bytes_per_s", "median_bytes_per_s", "best_s", "reps"} of copying size bytes from a
    process on cpus[0] to one on cpus[-1]."""
    spinners = []
    if busy:
        for c in sorted(set(cpus)):
            spinners.append(subprocess.Popen(["taskset", "-c", str(c), "/usr/bin/python3", "-c",
                                              "while True: pass"]))
    try:
        ctx = mp.get_context("fork")
        port_q, res_q = ctx.Queue(), ctx.Queue()
        rx = ctx.Process(target=_receiver, args=(port_q, cpus[-1], size, reps))
        rx.start()
        port = port_q.get(timeout=30)
        tx = ctx.Process(target=_sender, args=(port, cpus[0], size, reps, res_q))
        tx.start()
        times = res_q.get(timeout=600)
        tx.join(30)
        rx.join(30)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    times.sort()
    if not times:
        raise RuntimeError("the TCP copy measured nothing")
    return {"best_bytes_per_s": size / times[0],
            "median_bytes_per_s": size / times[len(times) // 2], "best_s": times[0],
            "reps": len(times), "bytes": size, "busy": busy}

"""A pipeline for one benchmark configuration: a ppserve-coordinator and its ppserve-stage processes
on loopback, each pinned with `taskset -c`, logs in files; and a client of ppserve.v1.Ppserve
(Generate, Status, Trace) through grpcio's generic calls, messages compiled from proto/ with protoc
(there is no grpc_tools). Everything started here is stopped by `stop()`, on failure too."""
import importlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc

CHANNEL_OPTIONS = [("grpc.enable_http_proxy", 0),
                   ("grpc.max_receive_message_length", 64 << 20),
                   ("grpc.max_send_message_length", 64 << 20)]
CLEAN_ENV = {k: v for k, v in os.environ.items()
             if k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "grpc_proxy")}


def compile_protos(repo, out):
    """client_pb2 compiled from repo/proto into out; returns the module."""
    subprocess.run(["protoc", f"--python_out={out}", "-I", str(repo / "proto"),
                    str(repo / "proto/ppserve/v1/client.proto")], check=True)
    sys.path.insert(0, str(out))
    return importlib.import_module("ppserve.v1.client_pb2")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_list(cpus):
    return ",".join(str(c) for c in cpus)


CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu_seconds(pid):
    """utime + stime of a process (all its threads), 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class Client:
    def __init__(self, pb, addr):
        self.pb = pb
        self.channel = grpc.insecure_channel(addr, options=CHANNEL_OPTIONS)
        self._generate = self.channel.unary_stream(
            "/ppserve.v1.Ppserve/Generate", request_serializer=pb.GenerateRequest.SerializeToString,
            response_deserializer=pb.GenerateResponse.FromString)
        self._status = self.channel.unary_unary(
            "/ppserve.v1.Ppserve/Status", request_serializer=pb.StatusRequest.SerializeToString,
            response_deserializer=pb.StatusResponse.FromString)
        self._trace = self.channel.unary_unary(
            "/ppserve.v1.Ppserve/Trace", request_serializer=pb.TraceRequest.SerializeToString,
            response_deserializer=pb.TraceResponse.FromString)

    def close(self):
        self.channel.close()

    def status(self):
        return self._status(self.pb.StatusRequest(), timeout=10)

    def trace(self):
        return self._trace(self.pb.TraceRequest(max_microbatches=0), timeout=30)

    def run_requests(self, prompts, max_tokens, timeout):
        """Submits every prompt (token ids) at once (threads released by one barrier), greedy,
        ignore_eos, and waits for all. Returns (t_submit, [per request: {"times": [(t, n_ids)],
        "usage": Usage, "error": str|None}]); times are time.time()."""
        n = len(prompts)
        out = [{"times": [], "usage": None, "error": None} for _ in range(n)]
        barrier = threading.Barrier(n + 1)

        def one(i):
            req = self.pb.GenerateRequest(max_tokens=max_tokens, ignore_eos=True)
            req.prompt_ids.extend(prompts[i])
            barrier.wait()
            try:
                for r in self._generate(req, timeout=timeout):
                    out[i]["times"].append((time.time(), len(r.ids)))
                    if r.HasField("usage"):
                        out[i]["usage"] = r.usage
            except grpc.RpcError as e:
                out[i]["error"] = f"{e.code().name}: {e.details()}"

        threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        t_submit = time.time()
        barrier.wait()
        for t in threads:
            t.join()
        return t_submit, out


class Pipeline:
    """One coordinator and len(stage_cpus) stages; stage i's process is pinned to stage_cpus[i] (a
    list of cores) and runs `threads` compute threads. layers: explicit partition or None (the
    coordinator's planner). microbatches: 0 = the coordinator's default (one per stage)."""

    def __init__(self, bins, pb, workdir, model_root, model_name, stage_cpus, threads, other_cpus,
                 layers=None, microbatches=0, max_batch_tokens=512, kv_mb=256, tag="p"):
        self.bins = bins
        self.pb = pb
        self.workdir = Path(workdir)
        self.model_root = Path(model_root)
        self.model_name = model_name
        self.stage_cpus = stage_cpus
        self.threads = threads
        self.other_cpus = other_cpus
        self.layers = layers
        self.microbatches = microbatches
        self.max_batch_tokens = max_batch_tokens
        self.kv_mb = kv_mb
        self.tag = tag
        self.procs = []
        self.addr = f"127.0.0.1:{free_port()}"
        self.client = None

    def _spawn(self, name, cpus, args):
        log = self.workdir / f"{self.tag}-{name}.log"
        with open(log, "wb") as f:
            p = subprocess.Popen(["taskset", "-c", cpu_list(cpus), *map(str, args)], stdout=f,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=CLEAN_ENV)
        self.procs.append((name, p, log))
        return p

    def start(self, wait_s=180):
        args = [self.bins["coordinator"], "--listen", self.addr, "--model", self.model_name,
                "--model_root", self.model_root, "--stages", len(self.stage_cpus),
                "--max_batch_tokens", self.max_batch_tokens, "--microbatches", self.microbatches,
                "--log_level", "warn"]
        if self.layers:
            args += ["--layers", ",".join(map(str, self.layers))]
        self._spawn("coordinator", self.other_cpus, args)
        for i, cpus in enumerate(self.stage_cpus):
            self._spawn(f"stage{i}", cpus, [
                self.bins["stage"], "--coordinator", self.addr, "--listen", "127.0.0.1:0",
                "--model_root", self.model_root, "--threads", self.threads, "--kv_mb", self.kv_mb,
                "--max_batch_tokens", self.max_batch_tokens, "--log_level", "warn"])
        p = subprocess.run([str(self.bins["ppserve"]), "status", "--addr", self.addr, "--wait",
                            str(wait_s)], capture_output=True, text=True, env=CLEAN_ENV)
        if p.returncode != 0:
            raise RuntimeError(f"`ppserve status --addr {self.addr} --wait {wait_s}` exited with "
                               f"{p.returncode}: {p.stdout.strip()} {p.stderr.strip()}\n"
                               + self.logs_tail())
        self.client = Client(self.pb, self.addr)
        st = self.client.status()
        if st.state != "serving":
            raise RuntimeError(f"status --wait returned 0 but the state is {st.state!r}\n"
                               + self.logs_tail())
        return self

    def cpu_seconds_each(self):
        """User + system CPU seconds used so far by each process started here (all threads), by
        name (coordinator, stage0, ...)."""
        return {n: proc_cpu_seconds(p.pid) for n, p, _ in self.procs if p.poll() is None}

    def check_alive(self):
        dead = [(n, p.returncode) for n, p, _ in self.procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"daemons exited: {dead}\n" + self.logs_tail())

    def partition(self):
        """[(first_layer, last_layer)] per stage index, from Status."""
        st = self.client.status()
        return [(s.first_layer, s.last_layer) for s in sorted(st.stages, key=lambda s: s.index)]

    def logs_tail(self, n=15):
        out = []
        for name, _, log in self.procs:
            try:
                lines = log.read_text(errors="replace").splitlines()[-n:]
            except OSError:
                lines = []
            out.append(f"--- {name} ({log})\n" + "\n".join(lines))
        return "\n".join(out)

    def stop(self, grace=15.0):
        """SIGTERM to every process started here, SIGKILL to those still alive after grace s.
        Returns the names of those that needed SIGKILL."""
        if self.client:
            self.client.close()
            self.client = None
        for _, p, _ in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        killed = []
        for name, p, _ in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                killed.append(name)
                p.kill()
                p.wait(10)
        self.procs = []
        return killed

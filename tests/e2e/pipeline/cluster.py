"""Real pipelines for the end-to-end tests: a ppserve-coordinator and N ppserve-stage processes on
free loopback ports (or each in its own network namespace on one bridge), their logs in files that
are printed when a test fails, the client protos compiled from proto/ with protoc (no grpc_tools),
and small gRPC helpers built on grpcio's generic `unary_stream`/`stream_stream` calls.

Every wait has a deadline scaled by TIME_SCALE (sanitizer builds run several times slower), and
every process and namespace started here is stopped in teardown, on failure too.

Test modules import these helpers and load the fixtures (`protos`, `cluster_factory`,
`module_clusters`) and the hook that adds daemon logs to a failure's report through
`pytest_plugins = ["pipeline_fixtures"]`. Not a conftest.py: a second module named `conftest`
would shadow tests/e2e/conftest.py, which the other test modules import by that name."""
import ctypes
import importlib
import importlib.util
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import PPSERVE, run

grpc = pytest.importorskip("grpc", reason="grpcio is missing (Debian's python3-grpcio)")

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
BIN_DIR = Path(PPSERVE).resolve().parent
COORDINATOR = BIN_DIR / "ppserve-coordinator"
STAGE = BIN_DIR / "ppserve-stage"
NETCLIENT = HERE / "netclient.py"
PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable


def _sanitized(binary):
    """True when binary is an ASan/UBSan/TSan build (its path says so, or it links the runtime)."""
    if any(s in str(binary) for s in ("asan", "tsan", "ubsan")):
        return True
    try:
        with open(binary, "rb") as f:
            return b"__asan_init" in f.read()
    except OSError:
        return False


TIME_SCALE = float(os.environ.get("PP_TIME_SCALE") or (4.0 if _sanitized(PPSERVE) else 1.0))

# The model every pipeline test uses unless it says otherwise: 6 layers so that 1..4 stages and
# uneven partitions are possible, f32 so that a token's logits are bit-exact anywhere.
MODEL_FLAGS = ("--dim", "64", "--layers", "6", "--heads", "4", "--kv-heads", "2", "--ffn", "128",
               "--vocab", "512", "--ctx", "256", "--dtype", "f32", "--seed", "11")
MODEL_DIM, MODEL_VOCAB, MODEL_CTX = 64, 512, 256
# The same shapes with a long context, for generations that must still run when a test acts.
LONG_FLAGS = ("--dim", "64", "--layers", "6", "--heads", "4", "--kv-heads", "2", "--ffn", "128",
              "--vocab", "512", "--ctx", "4096", "--dtype", "f32", "--seed", "12")

CLEAN_ENV = {k: v for k, v in os.environ.items()
             if k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "grpc_proxy")}
# sanitizer reports must fail the test that caused them, not hide in a log
CLEAN_ENV.setdefault("ASAN_OPTIONS", "abort_on_error=0:detect_leaks=1")
CLEAN_ENV.setdefault("UBSAN_OPTIONS", "print_stacktrace=1")
SANITIZER_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                   "WARNING: ThreadSanitizer")

# short reconnect backoff: a daemon that starts or restarts is reached within a poll, not after
# gRPC's default 1 s..120 s backoff
CHANNEL_OPTIONS = [("grpc.enable_http_proxy", 0),
                   ("grpc.initial_reconnect_backoff_ms", 100),
                   ("grpc.min_reconnect_backoff_ms", 100),
                   ("grpc.max_reconnect_backoff_ms", 500),
                   ("grpc.max_receive_message_length", 64 << 20),
                   ("grpc.max_send_message_length", 64 << 20)]


def scaled(seconds):
    return seconds * TIME_SCALE


def terminate(proc, seconds=30):
    """SIGTERM, then SIGKILL after seconds (scaled), unless the process has ended."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(scaled(seconds))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def need_daemons():
    missing = [str(p) for p in (COORDINATOR, STAGE) if not p.exists()]
    if missing:
        pytest.skip(f"daemons not built next to {PPSERVE}: {', '.join(missing)}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(pred, timeout, what, interval=0.05):
    """Polls pred() until it returns a true value (returned) or timeout seconds pass (AssertionError
    naming what was awaited and the last value seen)."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = pred()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.1f} s waiting for {what}; "
                                 f"last: {last!r}")
        time.sleep(interval)


# ---- protos ------------------------------------------------------------------------------------

class Protos:
    """client_pb2, stage_pb2 and health_pb2 compiled from the repository's .proto files."""

    def __init__(self, out):
        run(["protoc", f"--python_out={out}", "-I", str(ROOT / "proto"),
             *(str(ROOT / "proto" / f) for f in ("ppserve/v1/client.proto",
                                                 "ppserve/v1/stage.proto",
                                                 "grpc/health/v1/health.proto"))])
        self.dir = out
        sys.path.insert(0, str(out))
        self.client = importlib.import_module("ppserve.v1.client_pb2")
        self.stage = importlib.import_module("ppserve.v1.stage_pb2")
        self.health = self._health(out)

    @staticmethod
    def _health(out):
        # `grpc` is grpcio's package name too, so load health_pb2 by file path
        spec = importlib.util.spec_from_file_location(
            "pp_health_pb2", out / "grpc/health/v1/health_pb2.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod


@pytest.fixture(scope="session")
def protos(tmp_path_factory):
    if not shutil.which("protoc"):
        pytest.skip("protoc is missing (Debian's protobuf-compiler)")
    return Protos(tmp_path_factory.mktemp("protos"))


# ---- a client of the coordinator's Ppserve service, in this process ---------------------------

class Client:
    """ppserve.v1.Ppserve through grpcio's generic calls, messages from the compiled protos."""

    def __init__(self, protos, addr):
        self.pb = protos.client
        self.addr = addr
        self.channel = grpc.insecure_channel(addr, options=CHANNEL_OPTIONS)
        pb = self.pb
        self._generate = self.channel.unary_stream(
            "/ppserve.v1.Ppserve/Generate", request_serializer=pb.GenerateRequest.SerializeToString,
            response_deserializer=pb.GenerateResponse.FromString)
        self.generate_raw = self.channel.unary_stream(
            "/ppserve.v1.Ppserve/Generate", request_serializer=lambda b: b,
            response_deserializer=pb.GenerateResponse.FromString)
        self.tokenize = self.channel.unary_unary(
            "/ppserve.v1.Ppserve/Tokenize", request_serializer=pb.TokenizeRequest.SerializeToString,
            response_deserializer=pb.TokenizeResponse.FromString)
        self._status = self.channel.unary_unary(
            "/ppserve.v1.Ppserve/Status", request_serializer=pb.StatusRequest.SerializeToString,
            response_deserializer=pb.StatusResponse.FromString)

    def close(self):
        self.channel.close()

    def status(self, timeout=5.0):
        return self._status(self.pb.StatusRequest(), timeout=scaled(timeout))

    def request(self, prompt_ids=None, prompt=None, max_tokens=16, ignore_eos=True,
                return_logits=False, stop=(), **sampling):
        r = self.pb.GenerateRequest(max_tokens=max_tokens, ignore_eos=ignore_eos,
                                    return_logits=return_logits, stop=list(stop),
                                    sampling=self.pb.Sampling(**sampling))
        if prompt_ids is not None:
            r.prompt_ids.extend(prompt_ids)
        if prompt is not None:
            r.prompt = prompt
        return r

    def stream(self, req, timeout=60.0):
        return self._generate(req, timeout=scaled(timeout))

    def generate(self, req, timeout=60.0):
        """Runs one request to its end; returns a Result (never raises on a gRPC error)."""
        return collect(self.stream(req, timeout), self.pb)


class Result:
    def __init__(self):
        self.responses = []
        self.prompt_ids = None
        self.ids = []
        self.text = ""
        self.finish = 0
        self.usage = None
        self.logits = []  # one f32 array per response that carried logits
        self.code = grpc.StatusCode.OK
        self.details = ""

    def __repr__(self):
        return (f"Result(code={self.code}, details={self.details!r}, prompt_ids={self.prompt_ids}, "
                f"ids={self.ids}, finish={self.finish})")


def collect(call, pb):
    res = Result()
    try:
        for r in call:
            res.responses.append(r)
            if res.prompt_ids is None:
                res.prompt_ids = list(r.prompt_ids)
            res.ids.extend(r.ids)
            res.text += r.text
            if r.logits:
                res.logits.append(np.frombuffer(r.logits, dtype="<f4").copy())
            if r.finish_reason:
                res.finish = r.finish_reason
            if r.HasField("usage"):
                res.usage = r.usage
    except grpc.RpcError as e:
        res.code, res.details = e.code(), e.details() or ""
    return res


class BackgroundGeneration:
    """One generation read by a thread while a test acts: ids so far, and end (code, details, and
    the monotonic time it ended at) once it is over."""

    def __init__(self, client, n, prompt_ids, timeout=120.0, **sampling):
        self.ids, self.end = [], {}
        self.call = client.stream(client.request(prompt_ids=prompt_ids, max_tokens=n, **sampling),
                                  timeout=timeout)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        try:
            for r in self.call:
                self.ids.extend(r.ids)
            self.end.update(code="OK", details="", at=time.monotonic())
        except grpc.RpcError as e:
            self.end.update(code=e.code().name, details=e.details(), at=time.monotonic())

    def join(self, timeout):
        """Waits for the end (seconds, scaled); returns it."""
        self.thread.join(scaled(timeout))
        assert self.end, f"the generation did not end within {scaled(timeout):.0f} s"
        return self.end


def status_dict(msg):
    """A StatusResponse as a dict with proto field names and every default present."""
    from google.protobuf import json_format
    return json_format.MessageToDict(msg, preserving_proto_field_name=True,
                                     including_default_value_fields=True)


# `ppserve run` flags for a Sampling message's fields
SAMPLING_FLAGS = {"temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p",
                  "min_p": "--min-p", "repeat_penalty": "--repeat-penalty", "seed": "--seed"}


def sampling_flags(sampling):
    out = []
    for k, v in sampling.items():
        out += [SAMPLING_FLAGS[k], str(v)]
    return out


def json_line(stdout):
    """The one JSON line a --json command prints. Split on "\\n" only: str.splitlines() also
    splits at U+0085 and U+2028, which JSON strings (the generated text) may hold unescaped."""
    lines = [x for x in stdout.split("\n") if x.strip()]
    assert len(lines) == 1, f"--json must print exactly one line, got {stdout!r}"
    return lines[0]


def single_process(model, prompt_ids, max_tokens, sampling=None, ignore_eos=True, tmp_path=None,
                   tag="ref", prompt=None):
    """`ppserve run --json` (and its --dump-logits rows when tmp_path is given) on one request."""
    args = [PPSERVE, "run", "--model", str(model), "--max-tokens", str(max_tokens), "--json",
            "--threads", "1", *sampling_flags(sampling or {})]
    args += ["--prompt", prompt] if prompt is not None else \
        ["--prompt-ids", ",".join(map(str, prompt_ids))]
    if ignore_eos:
        args.append("--ignore-eos")
    dump = None
    if tmp_path is not None:
        dump = tmp_path / f"{tag}.logits"
        args += ["--dump-logits", str(dump)]
    p = run(args, timeout=scaled(120))
    out = json.loads(json_line(p.stdout))
    logits = np.fromfile(dump, dtype="<f4") if dump else None
    return out, logits


# ---- daemons -----------------------------------------------------------------------------------

def _die_with_parent():
    """In the child before exec: SIGKILL when the test process dies (a ctest timeout kills pytest
    with SIGKILL, and orphaned daemons would hold their ports and namespaces)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Daemon:
    def __init__(self, name, args, log, prefix=()):
        self.name = name
        self.log = log
        self.args = [str(a) for a in args]
        self.expect_death = False
        with open(log, "wb") as f:
            self.proc = subprocess.Popen([*prefix, *self.args], stdout=f, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=CLEAN_ENV,
                                         preexec_fn=_die_with_parent)

    @property
    def pid(self):
        return self.proc.pid

    def alive(self):
        return self.proc.poll() is None

    def signal(self, sig):
        if self.alive():
            os.kill(self.proc.pid, sig)

    def text(self):
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""


def stop_all(daemons, grace):
    """SIGTERM (and SIGCONT, for stopped ones) to all, then SIGKILL what is left after grace
    seconds. Returns the names of those that needed SIGKILL."""
    for d in daemons:
        d.signal(signal.SIGTERM)
        d.signal(signal.SIGCONT)
    deadline = time.monotonic() + grace
    killed = []
    for d in daemons:
        try:
            d.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            killed.append(d.name)
            d.signal(signal.SIGKILL)
            d.proc.wait(10)
    return killed


class Cluster:
    """One coordinator and `stages` stages serving the model at model_root/model_name.

    Loopback by default; with a Lab, the coordinator runs in the lab's host 0 and stage i in host
    i + 1, and Status/Generate go through netclient.py inside the coordinator's namespace."""

    def __init__(self, protos, workdir, model_root, model_name="model.gguf", stages=2, layers=None,
                 coord_flags=(), stage_flags=(), lab=None, tag="c"):
        need_daemons()
        self.protos = protos
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.model_root = Path(model_root)
        self.model_name = model_name
        self.n_stages = stages
        self.layers = layers
        self.coord_flags = [str(f) for f in coord_flags]
        self.stage_flags = [str(f) for f in stage_flags]
        self.lab = lab
        self.tag = tag
        self.daemons = []
        self.coordinator = None
        self.stages = []
        self._client = None
        if lab:
            self.host = lab.addr(0)
            self.port = 7000
        else:
            self.host = "127.0.0.1"
            self.port = free_port()
        self.addr = f"{self.host}:{self.port}"

    @property
    def model(self):
        return self.model_root / self.model_name

    def _prefix(self, host):
        return self.lab.exec_prefix(host) if self.lab else ()

    def start(self, timeout=60.0, wait=True):
        """Starts the daemons; with wait, returns once the coordinator says serving."""
        args = [COORDINATOR, "--listen", self.addr, "--model", self.model_name,
                "--model_root", self.model_root, "--stages", self.n_stages, "--grace_ms", "1000",
                "--log_level", "info"]
        if self.layers:
            args += ["--layers", ",".join(map(str, self.layers))]
        self.coordinator = Daemon("coordinator", [*args, *self.coord_flags],
                                  self.workdir / f"{self.tag}-coordinator.log", self._prefix(0))
        self.daemons.append(self.coordinator)
        for i in range(self.n_stages):
            host = self.lab.addr(i + 1) if self.lab else "127.0.0.1"
            d = Daemon(f"stage{i}", self.stage_args(f"{host}:0"),
                       self.workdir / f"{self.tag}-stage{i}.log", self._prefix(i + 1))
            self.stages.append(d)
            self.daemons.append(d)
        if wait:
            self.wait_serving(timeout)
        return self

    def stage_args(self, listen, coordinator=None):
        """A stage's command line: this cluster's flags, listening on listen, registering with
        coordinator (default: this cluster's)."""
        return [STAGE, "--coordinator", coordinator or self.addr, "--listen", listen,
                "--model_root", self.model_root, "--threads", "1", "--kv_mb", "64",
                "--heartbeat_ms", "200", "--grace_ms", "1000", "--log_level", "info",
                *self.stage_flags]

    def client(self):
        assert not self.lab, "in a lab, talk to the cluster through netclient (Lab.generate)"
        if self._client is None:
            self._client = Client(self.protos, self.addr)
        return self._client

    def status(self, timeout=5.0):
        """The Status response as a dict (proto field names, defaults included)."""
        if self.lab:
            return self.lab.status(self.addr, timeout)
        return status_dict(self.client().status(timeout))

    def check_alive(self):
        for d in self.daemons:
            if not d.alive() and not d.expect_death:
                raise AssertionError(f"{d.name} exited with {d.proc.returncode}:\n"
                                     f"{tail(d.text())}")

    def wait_serving(self, timeout=60.0):
        last = {}

        def serving():
            self.check_alive()
            try:
                if self.lab:
                    s = self.lab.status(self.addr, timeout=2.0)
                else:  # a fresh channel each time: no reconnect backoff from a refused connect
                    c = Client(self.protos, self.addr)
                    try:
                        s = status_dict(c.status(2.0))
                    finally:
                        c.close()
                last["status"] = s
            except (grpc.RpcError, AssertionError, RuntimeError) as e:
                last["status"] = f"{type(e).__name__}: {e}"
                return False
            return s if s.get("state") == "serving" else False

        try:
            return wait_until(serving, scaled(timeout), f"{self.addr} to serve", interval=0.2)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.logs()}") from None

    def stage_status(self):
        return sorted(self.status()["stages"], key=lambda s: s["index"])

    def stage_daemon(self, index):
        """The stage process at pipeline position index (registration order decides positions):
        in a lab by its host's address, on loopback by the address its log says it listens on."""
        addr = next(x for x in self.stage_status() if x["index"] == index)["address"]
        for i, d in enumerate(self.stages):
            if (self.lab and addr.rsplit(":", 1)[0] == self.lab.addr(i + 1)) or \
                    (not self.lab and f"listening on {addr} " in d.text()):
                return d
        raise AssertionError(f"no stage process serves {addr}:\n{self.logs()}")

    def logs(self):
        return "\n".join(f"----- {d.name} ({d.log}) -----\n{tail(d.text())}" for d in self.daemons)

    def sanitizer_reports(self):
        return [f"{d.name}: {mark}" for d in self.daemons for mark in SANITIZER_MARKS
                if mark in d.text()]

    def stop(self):
        if self._client:
            self._client.close()
            self._client = None
        killed = stop_all(self.daemons, scaled(15))
        return killed


def tail(text, lines=200):
    parts = text.split("\n")
    return "\n".join(parts[-lines:])


class ClusterFactory:
    """Starts clusters for one test (or module) and stops them at its end; fails on sanitizer
    reports, daemons that died unasked or ignored SIGTERM (with their logs in the message)."""

    def __init__(self, protos, workdir):
        self.protos = protos
        self.workdir = workdir
        self.clusters = []

    def __call__(self, model_root, wait=True, **kw):
        kw.setdefault("tag", f"c{len(self.clusters)}")
        c = Cluster(self.protos, self.workdir, model_root, **kw)
        self.clusters.append(c)
        return c.start(wait=wait)

    def logs(self):
        return "\n".join(c.logs() for c in self.clusters)

    def finish(self):
        problems = []
        for c in self.clusters:
            died = [f"{d.name} exited with {d.proc.returncode} before teardown"
                    for d in c.daemons if not d.alive() and not d.expect_death]
            killed = c.stop()
            problems += died
            problems += [f"{n} ignored SIGTERM for {scaled(15):.0f} s" for n in killed]
            problems += c.sanitizer_reports()
        assert not problems, "; ".join(problems) + "\n" + self.logs()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report carries the logs of the daemons it used (printed with the failure)."""
    outcome = yield
    rep = outcome.get_result()
    if not rep.failed or call.when == "teardown":
        return
    logs = []
    for v in getattr(item, "funcargs", {}).values():
        if isinstance(v, (ClusterFactory, Cluster)):
            logs.append(v.logs())
        elif hasattr(v, "log") and isinstance(getattr(v, "log"), Path):
            logs.append(f"----- {v.log} -----\n{tail(v.log.read_text(errors='replace'))}")
    if logs:
        rep.sections.append(("daemon logs", "\n".join(logs)))


@pytest.fixture
def cluster_factory(protos, tmp_path):
    f = ClusterFactory(protos, tmp_path)
    yield f
    f.finish()


@pytest.fixture(scope="module")
def module_clusters(protos, tmp_path_factory):
    f = ClusterFactory(protos, tmp_path_factory.mktemp("clusters"))
    yield f
    f.finish()


# ---- the data plane, spoken directly to a stage ----------------------------------------------

class HopStream:
    """A Stage/Forward stream fed from a queue (raw bytes, so malformed messages can be sent) and
    read by a thread: recv() gives the next HopAck, or the stream's end as
    ("end", code, details)."""

    def __init__(self, protos, addr, timeout=30.0):
        self.pb = protos.stage
        self.channel = grpc.insecure_channel(addr, options=CHANNEL_OPTIONS)
        call = self.channel.stream_stream("/ppserve.v1.Stage/Forward",
                                          request_serializer=lambda b: b,
                                          response_deserializer=self.pb.HopAck.FromString)
        self.out = queue.Queue()
        self.events = queue.Queue()
        self.responses = call(iter(self.out.get, None), timeout=scaled(timeout))
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        try:
            for ack in self.responses:
                self.events.put(ack)
            self.events.put(("end", grpc.StatusCode.OK, ""))
        except grpc.RpcError as e:
            self.events.put(("end", e.code(), e.details() or ""))

    def send(self, msg):
        self.out.put(msg if isinstance(msg, bytes) else msg.SerializeToString())

    def handshake(self, model_id, next_layer, version=None):
        if version is None:
            version = self.pb.PROTOCOL_VERSION_CURRENT
        self.send(self.pb.HopMessage(handshake=self.pb.Handshake(
            protocol_version=version, model_id=model_id, next_layer=next_layer)))

    def microbatch(self, mb_id, parts, dtype, shape, payload):
        """One microbatch as a single chunk (payloads here stay far below 1 MiB)."""
        hdr = self.pb.MicrobatchHeader(microbatch_id=mb_id, parts=parts, dtype=dtype, shape=shape,
                                       total_bytes=len(payload))
        self.send(self.pb.HopMessage(chunk=self.pb.Chunk(header=hdr, microbatch_id=mb_id, index=0,
                                                        data=payload)))

    def recv(self, timeout=10.0):
        try:
            return self.events.get(timeout=scaled(timeout))
        except queue.Empty:
            raise AssertionError(f"no HopAck and no end of the stream within {scaled(timeout)} s")

    def close(self):
        self.out.put(None)  # half-close

    def cancel(self):
        self.responses.cancel()
        self.channel.close()


# ---- stages as separate hosts: network namespaces on one bridge -------------------------------

_lab_seq = [0]


class Lab:
    """n hosts, each its own network namespace with eth0 = 10.77.0.(i+1)/24, joined by a bridge in
    a hub namespace (nothing is added to this machine's own namespace). Names carry this process's
    pid, so parallel or leftover runs never collide; teardown deletes them all."""

    SUBNET = "10.77.0"

    def __init__(self, n, protos):
        _lab_seq[0] += 1
        self.protos = protos
        self.base = f"ppt{os.getpid()}-{_lab_seq[0]}"
        self.hub = f"{self.base}-hub"
        self.hosts = [f"{self.base}-h{i}" for i in range(n)]
        self.created = []

    def addr(self, i):
        return f"{self.SUBNET}.{i + 1}"

    def exec_prefix(self, i):
        return ("ip", "netns", "exec", self.hosts[i])

    def _ip(self, *args):
        p = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
        if p.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)}: {p.stderr.strip()}")

    def setup(self):
        try:
            self._ip("netns", "add", self.hub)
        except RuntimeError as e:
            if "Permission denied" in str(e) or "Operation not permitted" in str(e):
                pytest.skip(f"cannot create network namespaces: {e}")
            raise
        self.created.append(self.hub)
        self._ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        self._ip("-n", self.hub, "link", "set", "br0", "up")
        self._ip("-n", self.hub, "link", "set", "lo", "up")
        for i, ns in enumerate(self.hosts):
            self._ip("netns", "add", ns)
            self.created.append(ns)
            self._ip("-n", self.hub, "link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0",
                     "netns", ns)
            self._ip("-n", self.hub, "link", "set", f"v{i}", "master", "br0")
            self._ip("-n", self.hub, "link", "set", f"v{i}", "up")
            self._ip("-n", ns, "addr", "add", f"{self.addr(i)}/24", "dev", "eth0")
            self._ip("-n", ns, "link", "set", "eth0", "up")
            self._ip("-n", ns, "link", "set", "lo", "up")
        return self

    def teardown(self):
        errors = []
        for ns in reversed(self.created):
            # processes still inside would keep the namespace alive after its name is gone
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
            for pid in pids.stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            p = subprocess.run(["ip", "netns", "del", ns], capture_output=True, text=True)
            if p.returncode != 0:
                errors.append(f"ip netns del {ns}: {p.stderr.strip()}")
        self.created = []
        return errors

    @staticmethod
    def remove_stale():
        """Deletes namespaces of earlier runs whose test process is gone."""
        p = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
        for line in p.stdout.splitlines():
            name = line.split()[0] if line.split() else ""
            if not name.startswith("ppt") or "-" not in name:
                continue
            try:
                pid = int(name[3:name.index("-")])
            except ValueError:
                continue
            if pid != os.getpid() and not Path(f"/proc/{pid}").exists():
                subprocess.run(["ip", "netns", "del", name], capture_output=True)

    # clients inside host 0 (the coordinator's namespace)
    def netclient(self, *args, host=0):
        return [*self.exec_prefix(host), PYTHON, str(NETCLIENT), "--protos", str(self.protos.dir),
                *map(str, args)]

    def status(self, addr, timeout=5.0):
        p = subprocess.run(self.netclient("status", addr, "--timeout", scaled(timeout)),
                           capture_output=True, text=True, timeout=scaled(timeout) + 30,
                           env=CLEAN_ENV)
        if p.returncode != 0:
            raise RuntimeError(f"netclient status: {p.stderr.strip()[-500:]}")
        return json.loads(p.stdout)

    def generate(self, addr, request, timeout=60.0):
        """Starts netclient generate; it prints one JSON line per response, then an end line."""
        return subprocess.Popen(self.netclient("generate", addr, json.dumps(request),
                                               "--timeout", scaled(timeout)),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=CLEAN_ENV)

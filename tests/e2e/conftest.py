"""Shared fixtures for the end-to-end tests: the ppserve binary, synthetic models made with
`ppserve synth`, and helpers that run `ppserve run` and the numpy reference."""
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
PPSERVE = os.environ.get("PPSERVE", str(ROOT / "build" / "ppserve"))
PYTHON = os.environ.get("PP_PYTHON", sys.executable)
REFERENCE = ROOT / "tests" / "reference" / "llama_ref.py"


def run(args, check=True, timeout=600):
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} exited {p.returncode}:\n{p.stderr}")
    return p


class Models:
    """Synthesises each named model once per session."""

    def __init__(self, root):
        self.root = root
        self.cache = {}

    def get(self, name, *flags):
        key = (name, flags)
        if key not in self.cache:
            out = self.root / name
            run([PPSERVE, "synth", "--out", str(out), "--format", "both", *flags])
            self.cache[key] = out
        return self.cache[key]


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    return Models(tmp_path_factory.mktemp("models"))


def ppserve_run(model, prompt_ids, max_tokens, tmp_path, extra=(), tag="c"):
    """Runs `ppserve run --json --dump-logits` and returns (json, logits[n, vocab])."""
    dump = tmp_path / f"{tag}.logits"
    p = run([PPSERVE, "run", "--model", str(model), "--prompt-ids", ",".join(map(str, prompt_ids)),
             "--max-tokens", str(max_tokens), "--dump-logits", str(dump), "--json", *extra])
    lines = p.stdout.strip().split("\n")
    assert len(lines) == 1, f"--json must print exactly one line, got {p.stdout!r}"
    out = json.loads(lines[0])
    logits = np.fromfile(dump, dtype="<f4")
    return out, logits.reshape(len(out["ids"]), -1) if out["ids"] else logits


def reference(model, prompt_ids, force_ids, tmp_path, tag="ref"):
    """The numpy reference, teacher-forced on force_ids; returns (argmax ids, logits[n, vocab])."""
    dump = tmp_path / f"{tag}.logits"
    p = run([PYTHON, str(REFERENCE), "--model", str(model),
             "--prompt-ids", ",".join(map(str, prompt_ids)), "--max-tokens", str(len(force_ids)),
             "--force-ids", ",".join(map(str, force_ids)), "--dump-logits", str(dump), "--json",
             "--q8-activations"])
    ids = json.loads(p.stdout.strip().split("\n")[-1])["ids"]
    return ids, np.fromfile(dump, dtype="<f4").reshape(len(force_ids), -1)


def rel_err(a, b):
    """max|a-b| / max|b| for each row; the issue's measure of agreement."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return np.max(np.abs(a - b), axis=-1) / np.max(np.abs(b), axis=-1)


_CGROUPS = itertools.count()


def v1_cgroup(controller, settings):
    """A fresh folder in the writable cgroup v1 hierarchy of controller, with settings written
    into its files; removed at the end (its processes have exited). Skips where there is none."""
    top = Path("/sys/fs/cgroup") / controller
    if os.geteuid() != 0 or not top.is_dir() or not os.access(top, os.W_OK):
        pytest.skip(f"no writable cgroup v1 {controller} hierarchy at {top}")
    d = top / f"ppserve-test-{os.getpid()}-{next(_CGROUPS)}"
    d.mkdir()
    try:
        for name, value in settings:
            (d / name).write_text(value)
        yield d
    finally:
        d.rmdir()
